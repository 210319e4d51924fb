"""A synthetic table with missing values (MCAR, MAR or MNAR) and a many-level categorical.

:func:`missing_table` draws a pandas DataFrame like the real tables of
:mod:`torchtree.datasets.raw_tables` (numeric columns with ``NaN``, a string column with
``NaN``), where the truth is known: how the label depends on the features, and why a
value is missing. It is the benchmark's check that a method's handling of missing values
(missing values sent to one side of a split) and of categories (splits on subsets of
levels) pays off where it should:

* MCAR: a missing value carries no information, and imputation costs little;
* MAR: missingness depends on an observed column;
* MNAR: missingness depends on the hidden value itself, so that *being missing* is
  informative about the label, which imputation destroys and a missing-aware split keeps;
* the categorical column's effect is a random effect per level, with no order among the
  levels: a one-hot tree needs one split per level, a subset split one split in all.

pandas is needed (it is not a dependency of torchtree); it is imported when the function
is called.
"""
from __future__ import annotations

from typing import Tuple

import numpy as np

__all__ = ["missing_table", "MISSING_MECHANISMS"]

MISSING_MECHANISMS = ("mcar", "mar", "mnar")
# strength of the dependence of missingness on the driving value (a standardised value
# moves the log-odds of being missing by this much per standard deviation)
_STRENGTH = 2.0


def _pandas():
    try:
        import pandas
    except ImportError as exc:  # pragma: no cover - pandas is in the development environment
        raise ImportError("missing_table needs pandas, which torchtree does not install: pip install pandas") from exc
    return pandas


def _standardise(v: np.ndarray) -> np.ndarray:
    sd = v.std()
    return (v - v.mean()) / (sd if sd > 0 else 1.0)


def _intercept(drive: np.ndarray, rate: float) -> float:
    """The ``a`` for which ``mean(sigmoid(a + drive)) == rate`` (bisection; drive finite)."""
    lo, hi = -60.0, 60.0
    for _ in range(100):
        mid = 0.5 * (lo + hi)
        if np.mean(1.0 / (1.0 + np.exp(-(mid + drive)))) < rate:
            lo = mid
        else:
            hi = mid
    return 0.5 * (lo + hi)


def _mask(rng: np.random.Generator, drive: np.ndarray, rate: float) -> np.ndarray:
    """Missing with probability ``sigmoid(a + drive)``, ``a`` set so that the mean
    probability is ``rate``; ``drive`` all zero is MCAR."""
    if rate <= 0.0:
        return np.zeros(drive.shape, dtype=bool)
    p = 1.0 / (1.0 + np.exp(-(_intercept(drive, rate) + drive)))
    return rng.random(drive.shape) < p


def missing_table(n: int = 2000, missing: str = "mcar", rate: float = 0.2, n_levels: int = 100,
                  task: str = "classification", seed: int = 0) -> Tuple["object", np.ndarray]:
    """Draw a table with missing values by a chosen mechanism and a many-level categorical.

    The model (all draws from ``numpy.random.default_rng``, children of ``seed``):

    * features ``x1, x2, x3, x4, noise1, noise2`` independent N(0, 1); ``cat`` uniform over
      ``n_levels`` levels named ``'L000'``, ``'L001'``, ... (three digits at least), each
      level with an effect ``b[level] ~ N(0, 1)``;
    * latent ``f = x1 + 1[x2 > 0] - 0.5 - 0.8 x3 + 0.5 x4 + b[cat]`` (``noise1``,
      ``noise2`` do not enter);
    * classification: ``y ~ Bernoulli(sigmoid(1.5 f))``, int64 labels 0 / 1;
      regression: ``y = f + N(0, 0.5^2)``, float64;
    * missingness, drawn after ``y`` from the complete values, in ``x1``, ``x2``, ``x3``
      and ``cat`` (each column independently; ``x4``, ``noise1``, ``noise2`` and ``y`` are
      always observed): a cell is missing with probability ``sigmoid(a + 2 z)``, where
      ``a`` is solved for per column so that the mean probability over the rows is
      ``rate``, and ``z`` is

      - ``"mcar"``: 0 (missing completely at random: a coin of probability ``rate``);
      - ``"mar"``: the standardised ``x4``, an observed column (missing at random);
      - ``"mnar"``: the standardised hidden value itself (``x1``, ``x2``, ``x3``) or, for
        ``cat``, the standardised effect ``b`` of the hidden level (missing not at random:
        large values go missing, so a missing cell says "probably large", and the missing
        rows' labels differ from the rest).

    With the same ``n``, ``n_levels``, ``task`` and ``seed``, the complete values and ``y``
    do not depend on ``missing`` or ``rate``: ``rate=0`` gives the complete table.

    Parameters
    ----------
    n : int
        Rows (>= 1).
    missing : {"mcar", "mar", "mnar"}
        The missingness mechanism.
    rate : float
        Expected share of missing cells in each of ``x1``, ``x2``, ``x3``, ``cat``, in
        [0, 1); the realised share is binomial around it (for n=2000, within 0.03 of it
        with overwhelming probability).
    n_levels : int
        Levels of ``cat`` (>= 2).
    task : {"classification", "regression"}
    seed : int

    Returns
    -------
    frame : pandas.DataFrame
        Columns ``x1, x2, x3, x4, cat, noise1, noise2``: float64 with ``NaN``, and ``cat``
        an ``object`` column of ``str`` with ``NaN``.
    y : numpy.ndarray [n]
        int64 labels (classification) or float64 target (regression).

    Examples
    --------
    >>> from torchtree.datasets import missing_table
    >>> X, y = missing_table(2000, "mnar", seed=0)            # doctest: +SKIP
    >>> float(X["x1"].isna().mean().round(2)), X["cat"].nunique()  # doctest: +SKIP
    (0.18, 100)
    """
    if missing not in MISSING_MECHANISMS:
        raise ValueError(f"missing must be one of {MISSING_MECHANISMS}, not {missing!r}")
    if task not in ("classification", "regression"):
        raise ValueError(f"task must be 'classification' or 'regression', not {task!r}")
    if not 0.0 <= float(rate) < 1.0:
        raise ValueError(f"rate must be in [0, 1), not {rate!r}")
    n, n_levels = int(n), int(n_levels)
    if n < 1 or n_levels < 2:
        raise ValueError(f"need n >= 1 and n_levels >= 2, not n={n}, n_levels={n_levels}")
    pd = _pandas()
    values_ss, label_ss, mask_ss = np.random.SeedSequence(seed).spawn(3)
    rng = np.random.default_rng(values_ss)
    x = rng.standard_normal((n, 6))  # x1, x2, x3, x4, noise1, noise2
    effect = rng.standard_normal(n_levels)
    level = rng.integers(0, n_levels, size=n)
    f = x[:, 0] + (x[:, 1] > 0) - 0.5 - 0.8 * x[:, 2] + 0.5 * x[:, 3] + effect[level]
    lrng = np.random.default_rng(label_ss)
    if task == "classification":
        y = (lrng.random(n) < 1.0 / (1.0 + np.exp(-1.5 * f))).astype(np.int64)
    else:
        y = f + 0.5 * lrng.standard_normal(n)

    width = max(3, len(str(n_levels - 1)))
    names = np.array([f"L{i:0{width}d}" for i in range(n_levels)], dtype=object)
    cat = names[level].copy()
    mrng = np.random.default_rng(mask_ss)
    drivers = {"x1": x[:, 0], "x2": x[:, 1], "x3": x[:, 2], "cat": effect[level]}
    out = {"x1": x[:, 0].copy(), "x2": x[:, 1].copy(), "x3": x[:, 2].copy()}
    for col, hidden in drivers.items():
        if missing == "mcar":
            z = np.zeros(n)
        elif missing == "mar":
            z = _STRENGTH * _standardise(x[:, 3])
        else:
            z = _STRENGTH * _standardise(hidden)
        m = _mask(mrng, z, float(rate))
        if col == "cat":
            cat[m] = np.nan
        else:
            out[col][m] = np.nan
    frame = pd.DataFrame({"x1": out["x1"], "x2": out["x2"], "x3": out["x3"], "x4": x[:, 3],
                          "cat": pd.Series(cat, dtype=object), "noise1": x[:, 4], "noise2": x[:, 5]})
    return frame, y
