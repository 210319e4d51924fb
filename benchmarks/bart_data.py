"""Datasets, splits and metrics for the BART benchmark.

Standalone (numpy only) so that it can be imported both from torchtree's
environment and from the throw-away competitor venv
(see ``benchmarks/bart_competitors.py``).

Example
-------
>>> from bart_data import load, metrics
>>> X_tr, y_tr, X_te, y_te, task = load("abalone", 0)
>>> # draws: [S, n_test] posterior draws of f(x_test), sigma_draws: [S]
>>> # metrics(task, y_te, draws, sigma_draws)
"""

from __future__ import annotations

import math
from pathlib import Path

import numpy as np

NAMES_REGRESSION = ["abalone", "friedman1_1000", "friedman1_10000", "friedman1_100000"]
NAMES_CLASSIFICATION = ["pima", "bcw", "heart", "students"]

_CSV = {
    "abalone": "abalone.csv",
    "pima": "pima_diabetes.csv",
    "bcw": "breast_cancer_wisconsin_original.csv",
    "heart": "heart_statlog.csv",
    "students": "students_dropout.csv",
}


def _tables():
    """``torchtree/datasets/tables.py`` loaded by path: it needs only numpy, so this works in the
    competitor venv too, where torchtree (and torch) are not installed."""
    import importlib.util

    path = Path(__file__).resolve().parents[1] / "torchtree" / "datasets" / "tables.py"
    spec = importlib.util.spec_from_file_location("_torchtree_tables", path)
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def friedman1(n: int, rng: np.random.Generator) -> tuple[np.ndarray, np.ndarray]:
    """Draw ``n`` rows of Friedman #1 (10 uniform features, 5 relevant, unit noise).

    Parameters
    ----------
    n : int
        Number of rows.
    rng : numpy.random.Generator
        Source of randomness.

    Returns
    -------
    X : ndarray, shape (n, 10)
    y : ndarray, shape (n,)
    """
    X = rng.uniform(0.0, 1.0, size=(n, 10))
    f = (10.0 * np.sin(np.pi * X[:, 0] * X[:, 1]) + 20.0 * (X[:, 2] - 0.5) ** 2
         + 10.0 * X[:, 3] + 5.0 * X[:, 4])
    return X, f + rng.standard_normal(n)


def load(name: str, split: int):
    """Load one train/test split of a benchmark dataset.

    Parameters
    ----------
    name : str
        One of ``NAMES_REGRESSION + NAMES_CLASSIFICATION``.
    split : int
        Split index. CSV sets: random 80/20 split with
        ``default_rng(split).permutation(n)``. Friedman sets: fresh data drawn
        with ``default_rng(1000 + split)`` (n train rows, then min(n, 10000) test
        rows, from a single call to :func:`friedman1`).

    Returns
    -------
    X_train, y_train, X_test, y_test : ndarray (float64)
    task : str
        ``"regression"`` or ``"classification"`` (binary labels 0./1.).
    """
    if name.startswith("friedman1_"):
        n = int(name.split("_", 1)[1])
        n_test = min(n, 10000)
        X, y = friedman1(n + n_test, np.random.default_rng(1000 + split))
        return X[:n], y[:n], X[n:], y[n:], "regression"
    if name not in _CSV:
        raise ValueError(f"unknown dataset {name!r}; known: "
                         f"{NAMES_REGRESSION + NAMES_CLASSIFICATION}")
    table = _tables().load_table(_CSV[name])
    X, y = table.X, table.y.astype(np.float64)
    if name == "abalone":
        task = "regression"
    else:
        task = "classification"
        if name == "students":  # 0 = Dropout -> positive class
            y = (y == 0).astype(np.float64)
        if not np.all((y == 0) | (y == 1)):
            raise ValueError(f"{name}: labels are not binary")
    n = len(y)
    perm = np.random.default_rng(split).permutation(n)
    n_train = int(math.floor(0.8 * n))
    tr, te = perm[:n_train], perm[n_train:]
    return (np.ascontiguousarray(X[tr]), y[tr].copy(),
            np.ascontiguousarray(X[te]), y[te].copy(), task)


_erfc = np.frompyfunc(math.erfc, 1, 1)


def normal_cdf(x) -> np.ndarray:
    """Standard normal CDF, elementwise, accurate in both tails (via math.erfc)."""
    x = np.asarray(x, dtype=np.float64)
    return 0.5 * _erfc(-x / math.sqrt(2.0)).astype(np.float64)


def _logsumexp(a: np.ndarray, axis: int) -> np.ndarray:
    m = np.max(a, axis=axis, keepdims=True)
    m = np.where(np.isfinite(m), m, 0.0)
    return np.squeeze(m, axis=axis) + np.log(np.sum(np.exp(a - m), axis=axis))


def metrics(task: str, y_test, draws, sigma_draws=None) -> dict:
    """Test-set metrics from posterior draws.

    Parameters
    ----------
    task : str
        ``"regression"`` or ``"classification"``.
    y_test : array, shape (n,)
        Observed test targets (0/1 for classification).
    draws : array, shape (S, n)
        Posterior draws of the latent function at the test points: the mean
        f(x) for regression, the probit latent for classification
        (P(y=1) = Phi(f)).
    sigma_draws : array, shape (S,), optional
        Noise standard deviation draws (regression only, original y scale).

    Returns
    -------
    dict
        Regression: ``rmse`` (posterior mean vs y), ``lpd`` (mean log
        posterior predictive density), ``coverage90`` (equal-tailed 90%
        predictive interval, predictive draws f + sigma z, z from
        ``default_rng(0)``). Classification: ``accuracy``, ``lpd``, ``brier``.
    """
    y = np.asarray(y_test, dtype=np.float64).ravel()
    f = np.asarray(draws, dtype=np.float64)
    if f.ndim != 2 or f.shape[1] != y.shape[0]:
        raise ValueError(f"draws must be [S, {y.shape[0]}], got {f.shape}")
    S = f.shape[0]
    if task == "regression":
        if sigma_draws is None:
            raise ValueError("regression metrics need sigma_draws")
        sig = np.asarray(sigma_draws, dtype=np.float64).reshape(S, 1)
        rmse = float(np.sqrt(np.mean((f.mean(axis=0) - y) ** 2)))
        logpdf = -0.5 * ((y - f) / sig) ** 2 - np.log(sig) - 0.5 * math.log(2 * math.pi)
        lpd = float(np.mean(_logsumexp(logpdf, axis=0) - math.log(S)))
        z = np.random.default_rng(0).standard_normal(f.shape)
        pred = f + sig * z
        lo, hi = np.quantile(pred, [0.05, 0.95], axis=0)
        cov = float(np.mean((y >= lo) & (y <= hi)))
        return {"rmse": rmse, "lpd": lpd, "coverage90": cov}
    if task == "classification":
        p = normal_cdf(f).mean(axis=0)
        acc = float(np.mean((p > 0.5) == (y == 1)))
        p_obs = np.where(y == 1, p, 1.0 - p)
        lpd = float(np.mean(np.log(np.clip(p_obs, 1e-12, None))))
        brier = float(np.mean((p - y) ** 2))
        return {"accuracy": acc, "lpd": lpd, "brier": brier}
    raise ValueError(f"unknown task {task!r}")
