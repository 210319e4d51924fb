"""Calibration where it is known to fail: predictive intervals and class probabilities, on generated data.

The data chose no default (the project's tables chose them); the four situations are those a QA pass found.

* ``extrapolation``: ``y = 2 x0 + N(0, 0.3^2)``, training rows with ``x0 < 0.5``, test rows anywhere in
  ``[-1, 1]^3``: 90% coverage and mean width inside the training range, beyond it, and at ``x0 > 0.75``.
* ``heteroscedastic``: ``y = x0 + x1^2 + sd(x0) e``, ``sd = 0.05`` for ``x0 < 0`` rising to 1 at ``x0 = 1``:
  90% coverage by region (``x0 < 0``, ``0..0.5``, ``> 0.5``), single trees (a noise variance per leaf) against
  BART (one noise sd).
* ``islands``: 90% coverage of the regression defaults (5 islands) against one filter (``n_islands=1``) on an
  interaction (``3 x0 x1 + x2``), Friedman #1 with 45 irrelevant features, Friedman #2 (noise sd 60) and the
  heteroscedastic data at 2,000 rows.
* ``missing``: Friedman #1 (noise sd 1) with ``x0`` missing at random in 20% of the training and test rows,
  1,000 training and 2,000 test rows: 90% coverage of the predictive interval on the complete and on the
  incomplete rows, and of the credible interval of ``f`` (``predict_interval(kind="mean")``) on the complete rows.
* ``confidence``: mean top-label probability minus accuracy (negative: under-confident) of BART's classifier
  at ``k=2`` (the default) and ``k=1``, and of ``smc`` with 1 and 5 islands, on a noisy xor (10% labels flipped)
  and five Gaussian classes.

Each fit takes the estimator's defaults, except the setting compared; ``--seeds`` seeds of data and fit;
400 training and 1,000 test rows unless said. Reported: pooled figures and the standard error over seeds.

Usage::

    python benchmarks/bench_calibration.py --out benchmarks/results/calibration.txt
    python benchmarks/bench_calibration.py --smoke
"""
# smoke-expect: extrapolation
# smoke-expect: heteroscedastic
# smoke-expect: islands
# smoke-expect: missing
# smoke-expect: confidence
from __future__ import annotations

import argparse
import sys
import time
import warnings
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from torchtree import BayesianTreeClassifier, BayesianTreeRegressor  # noqa: E402


def extrapolation(seed, ntr=400, nte=1000):
    r = np.random.default_rng(seed)
    X = r.uniform(-1, 1, (4 * (ntr + nte), 3))
    y = 2 * X[:, 0] + 0.3 * r.standard_normal(len(X))
    tr = np.flatnonzero(X[:, 0] < 0.5)[:ntr]
    te = np.setdiff1d(np.arange(len(X)), tr)[:nte]
    x0 = X[te, 0]
    return X[tr], y[tr], X[te], y[te], {"inside": x0 < 0.5, "beyond 0.5": x0 >= 0.5, "beyond 0.75": x0 >= 0.75}


def heteroscedastic(seed, ntr=400, nte=1000):
    r = np.random.default_rng(seed)
    X = r.uniform(-1, 1, (ntr + nte, 3))
    sd = 0.05 + 0.95 * np.clip(X[:, 0], 0, None)
    y = X[:, 0] + X[:, 1] ** 2 + sd * r.standard_normal(ntr + nte)
    x0 = X[ntr:, 0]
    return X[:ntr], y[:ntr], X[ntr:], y[ntr:], {"x0<0 (sd .05)": x0 < 0, "0..0.5": (x0 >= 0) & (x0 < 0.5),
                                                  ">0.5 (sd .5-1)": x0 >= 0.5}


def interaction(seed, ntr=400, nte=1000):
    r = np.random.default_rng(seed)
    X = r.uniform(-1, 1, (ntr + nte, 4))
    y = 3 * X[:, 0] * X[:, 1] + X[:, 2] + 0.3 * r.standard_normal(ntr + nte)
    return X[:ntr], y[:ntr], X[ntr:], y[ntr:], {}


def irrelevant(seed, ntr=400, nte=1000):
    r = np.random.default_rng(seed)
    X = r.uniform(0, 1, (ntr + nte, 50))
    y = (10 * np.sin(np.pi * X[:, 0] * X[:, 1]) + 20 * (X[:, 2] - 0.5) ** 2 + 10 * X[:, 3] + 5 * X[:, 4]
         + r.standard_normal(ntr + nte))
    return X[:ntr], y[:ntr], X[ntr:], y[ntr:], {}


def friedman2(seed, ntr=400, nte=1000):
    r = np.random.default_rng(seed)
    n = ntr + nte
    X = np.c_[r.uniform(0, 100, n), r.uniform(40 * np.pi, 560 * np.pi, n), r.uniform(0, 1, n), r.uniform(1, 11, n)]
    y = np.sqrt(X[:, 0] ** 2 + (X[:, 1] * X[:, 2] - 1 / (X[:, 1] * X[:, 3])) ** 2) + 60 * r.standard_normal(n)
    return X[:ntr], y[:ntr], X[ntr:], y[ntr:], {}


def missing_x0(seed, ntr=1000, nte=2000, rate=0.2):
    r = np.random.default_rng(seed)
    X = r.uniform(0, 1, (ntr + nte, 10))
    f = 10 * np.sin(np.pi * X[:, 0] * X[:, 1]) + 20 * (X[:, 2] - 0.5) ** 2 + 10 * X[:, 3] + 5 * X[:, 4]
    y = f + r.standard_normal(ntr + nte)
    X[r.random(ntr + nte) < rate, 0] = np.nan
    return X[:ntr], y[:ntr], X[ntr:], y[ntr:], f[ntr:]


def heteroscedastic2000(seed, ntr=2000, nte=1000):
    return heteroscedastic(seed, ntr=ntr, nte=nte)


def xor(seed, ntr=600, nte=1000):
    r = np.random.default_rng(seed)
    X = r.uniform(-1, 1, (ntr + nte, 10))
    y = (X[:, 0] > 0) ^ (X[:, 1] > 0)
    y = np.where(r.random(ntr + nte) < 0.1, ~y, y).astype(int)
    return X[:ntr], y[:ntr], X[ntr:], y[ntr:]


def five_classes(seed, ntr=800, nte=1000):
    r = np.random.default_rng(seed)
    centres = r.normal(0, 1.5, (5, 6))
    y = r.integers(0, 5, ntr + nte)
    X = np.c_[centres[y] + r.standard_normal((ntr + nte, 6)), r.standard_normal((ntr + nte, 4))]
    return X[:ntr], y[:ntr], X[ntr:], y[ntr:]


SECTIONS = ("extrapolation", "heteroscedastic", "islands", "missing", "confidence")


def _coverage(reg, Xte, yte, level=0.9):
    iv = reg.predict_interval(Xte, level)
    return (iv[:, 0] <= yte) & (yte <= iv[:, 1]), iv[:, 1] - iv[:, 0]


def _fmt(values):
    v = np.asarray(values, dtype=float)
    se = v.std(ddof=1) / np.sqrt(len(v)) if len(v) > 1 else float("nan")
    return f"{v.mean():.3f} +- {se:.3f}"


def _quiet(fn):
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        return fn()


def run(seeds, small, only=None):
    lines = []
    out = lambda s="": (print(s, flush=True), lines.append(s))  # noqa: E731
    kw = dict(n_particles=40, hyper="fixed") if small else {}
    bkw = dict(n_samples=5, n_warmup=5, n_trees=10, n_chains=2) if small else {}
    # small: every table at 200 training and 300 test rows (the intervals' cost grows with the test rows)
    size = dict(ntr=200, nte=300) if small else {}

    if only in (None, "extrapolation"):
        out("## extrapolation: 90% coverage | mean width, by region of x0 (training rows have x0 < 0.5)")
        for name, est in [("smc", lambda s: BayesianTreeRegressor(random_state=s, **kw)),
                          ("bart", lambda s: BayesianTreeRegressor(method="bart", random_state=s, **bkw))]:
            cov, wid = {}, {}
            for s in seeds:
                Xtr, ytr, Xte, yte, regions = extrapolation(s, **size)
                inside, width = _coverage(_quiet(lambda: est(s).fit(Xtr, ytr)), Xte, yte)
                for k, m in regions.items():
                    cov.setdefault(k, []).append(inside[m].mean())
                    wid.setdefault(k, []).append(width[m].mean())
            out(f"{name:5s} " + "; ".join(f"{k}: {_fmt(cov[k])} | {np.mean(wid[k]):.2f}" for k in cov))

    if only in (None, "heteroscedastic"):
        out("\n## heteroscedastic: 90% coverage by region")
        for name, est in [("smc", lambda s: BayesianTreeRegressor(random_state=s, **kw)),
                          ("bart", lambda s: BayesianTreeRegressor(method="bart", random_state=s, **bkw))]:
            cov, lpd = {}, []
            for s in seeds:
                Xtr, ytr, Xte, yte, regions = heteroscedastic(s, **size)
                reg = _quiet(lambda: est(s).fit(Xtr, ytr))
                inside, _ = _coverage(reg, Xte, yte)
                lpd.append(reg.log_predictive(Xte, yte))
                for k, m in {"all": np.ones(len(yte), bool), **regions}.items():
                    cov.setdefault(k, []).append(inside[m].mean())
            out(f"{name:5s} " + "; ".join(f"{k}: {_fmt(v)}" for k, v in cov.items()) + f"; lpd {np.mean(lpd):.3f}")

    if only in (None, "islands"):
        out("\n## islands: 90% coverage of the regression defaults (5 islands) and of one filter")
        for gen in (interaction, irrelevant, friedman2, heteroscedastic2000):
            row = []
            for label, extra in [("5 islands (default)", {}), ("n_islands=1", {"n_islands": 1})]:
                cov = []
                for s in seeds:
                    Xtr, ytr, Xte, yte, _ = gen(s, **size)
                    cov.append(_coverage(_quiet(lambda: BayesianTreeRegressor(random_state=s, **kw, **extra).fit(Xtr, ytr)),
                                         Xte, yte)[0].mean())
                row.append(f"{label}: {_fmt(cov)}")
            out(f"{gen.__name__:20s} " + "; ".join(row))

    if only in (None, "missing"):
        out("\n## missing: 90% coverage of y on complete | incomplete rows (x0 missing in 20%); of f on complete rows")
        for name, est in [("smc", lambda s: BayesianTreeRegressor(random_state=s, **kw)),
                          ("bart", lambda s: BayesianTreeRegressor(method="bart", random_state=s, **bkw))]:
            cov = {"y complete": [], "y incomplete": [], "f complete": [], "rmse complete": [], "rmse incomplete": []}
            for s in seeds:
                Xtr, ytr, Xte, yte, fte = missing_x0(s, **size)
                reg = _quiet(lambda: est(s).fit(Xtr, ytr))
                inside, _ = _coverage(reg, Xte, yte)
                band = reg.predict_interval(Xte, 0.9, kind="mean")
                gone, err = np.isnan(Xte[:, 0]), reg.predict(Xte) - yte
                cov["y complete"].append(inside[~gone].mean())
                cov["y incomplete"].append(inside[gone].mean())
                cov["f complete"].append(((band[:, 0] <= fte) & (fte <= band[:, 1]))[~gone].mean())
                cov["rmse complete"].append(np.sqrt(np.mean(err[~gone] ** 2)))
                cov["rmse incomplete"].append(np.sqrt(np.mean(err[gone] ** 2)))
            out(f"{name:5s} " + "; ".join(f"{k}: {_fmt(v)}" for k, v in cov.items()))

    if only in (None, "confidence"):
        out("\n## confidence: mean top-label probability minus accuracy (negative: under-confident) | log loss")
        settings = [("bart k=2 (default)", dict(method="bart", **bkw)), ("bart k=1", dict(method="bart", k=1.0, **bkw)),
                    ("smc (default)", dict(kw)), ("smc n_islands=5", dict(n_islands=5, **kw))]
        for gen in (xor, five_classes):
            row = []
            for label, extra in settings:
                gap, loss = [], []
                for s in seeds:
                    Xtr, ytr, Xte, yte = gen(s, **size)
                    P = _quiet(lambda: BayesianTreeClassifier(random_state=s, **extra).fit(Xtr, ytr)).predict_proba(Xte)
                    gap.append(P.max(1).mean() - (P.argmax(1) == yte).mean())
                    loss.append(-np.mean(np.log(P[np.arange(len(yte)), yte])))
                row.append(f"{label}: {_fmt(gap)} | {np.mean(loss):.3f}")
            out(f"{gen.__name__:13s} " + "; ".join(row))
    return lines


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--seeds", type=int, default=4, help="seeds of data and fit (default 4)")
    ap.add_argument("--smoke", action="store_true", help="one seed, small fits: checks the script runs")
    ap.add_argument("--out", help="also write the report to this file")
    ap.add_argument("--only", choices=SECTIONS, help="run this section only")
    args = ap.parse_args(argv)
    t0 = time.process_time()
    seeds = [0] if args.smoke else list(range(args.seeds))
    lines = run(seeds, small=args.smoke, only=args.only)
    lines.append(f"\n# {len(seeds)} seed(s); {time.process_time() - t0:.0f} CPU s; "
                 f"python benchmarks/bench_calibration.py --seeds {args.seeds}" + (f" --only {args.only}" if args.only else ""))
    print(lines[-1])
    if args.out:
        Path(args.out).write_text("\n".join(lines) + "\n")


if __name__ == "__main__":
    main()
