"""Multiclass BART (multinomial probit) against scikit-learn's HistGradientBoosting and torchtree's top-down SMC.

On the project's multiclass tables (``torchtree.datasets``: iris, wine, heart_cleveland (5 classes),
students_dropout (3 classes, 36 features)), ``--splits`` random 70/30 splits each; every method at its
defaults (BART: 200 trees, 4 chains of 250 + 250 sweeps), one torch thread. Prints test accuracy, test
log loss (mean negative log predictive probability, clipped at 1e-15 as scikit-learn does) and CPU
seconds of fit + predict per method, the means over splits, and the BART / HGB ratios. scikit-learn
is needed (a test extra), as it is for the sklearn-convention tests.

Usage::

    python benchmarks/bench_bart_multiclass.py                    # the four tables, 3 splits
    python benchmarks/bench_bart_multiclass.py --tables iris --splits 1 --smoke
"""
from __future__ import annotations

import argparse
import time

import numpy as np
import torch

# smoke-expect: ^iris\s+hgb\s
# smoke-expect: ^iris\s+smc\s
# smoke-expect: ^iris\s+bart\s
# smoke-expect: ^bench_bart_multiclass: done

TABLES = ("iris", "wine", "heart_cleveland", "students_dropout")


def _split(X, y, seed):
    perm = np.random.default_rng(seed).permutation(len(y))
    n_tr = int(round(0.7 * len(y)))
    return X[perm[:n_tr]], y[perm[:n_tr]], X[perm[n_tr:]], y[perm[n_tr:]]


def _log_loss(p: np.ndarray, y: np.ndarray, classes: np.ndarray) -> float:
    col = np.searchsorted(classes, y)
    return float(-np.mean(np.log(np.clip(p[np.arange(len(y)), col], 1e-15, 1.0))))


def _fit(method: str, Xtr, ytr, Xte, smoke: bool):
    from torchtree import BayesianTreeClassifier

    t0 = time.process_time()
    if method == "hgb":
        from sklearn.ensemble import HistGradientBoostingClassifier

        est = HistGradientBoostingClassifier(random_state=0).fit(Xtr, ytr)
    elif method == "bart":
        kw = dict(n_trees=20, n_warmup=20, n_samples=20) if smoke else {}
        est = BayesianTreeClassifier(method="bart", random_state=0, n_threads=1, **kw).fit(Xtr, ytr)
    else:
        kw = dict(n_particles=100) if smoke else {}
        est = BayesianTreeClassifier(method="smc", random_state=0, n_threads=1, **kw).fit(Xtr, ytr)
    p = est.predict_proba(Xte)
    return p, np.asarray(est.classes_), time.process_time() - t0


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--tables", nargs="+", default=None, help=f"default: {' '.join(TABLES)} (iris with --smoke)")
    ap.add_argument("--splits", type=int, default=None, help="default: 3 (1 with --smoke)")
    ap.add_argument("--smoke", action="store_true", help="tiny runs on one split of iris (the test suite)")
    args = ap.parse_args(argv)
    if args.tables is None:
        args.tables = ["iris"] if args.smoke else list(TABLES)
    if args.splits is None:
        args.splits = 1 if args.smoke else 3
    from torchtree.datasets import load_table

    torch.set_num_threads(1)
    print(f"{'table':<18}{'method':<7}{'classes':>8}{'accuracy':>10}{'log loss':>10}{'CPU s':>9}")
    for name in args.tables:
        t = load_table(name)
        X, y = np.asarray(t.X, dtype=np.float64), np.asarray(t.y)
        res = {}
        for s in range(args.splits):
            Xtr, ytr, Xte, yte = _split(X, y, s)
            for m in ("hgb", "smc", "bart"):
                p, classes, cpu = _fit(m, Xtr, ytr, Xte, args.smoke)
                acc = float((classes[p.argmax(1)] == yte).mean())
                res.setdefault(m, []).append((acc, _log_loss(p, yte, classes), cpu))
        for m, rows in res.items():
            a, ll, c = np.mean(rows, 0)
            print(f"{name:<18}{m:<7}{len(np.unique(y)):>8}{a:>10.4f}{ll:>10.4f}{c:>9.1f}")
        a_b, ll_b, c_b = np.mean(res["bart"], 0)
        a_h, ll_h, c_h = np.mean(res["hgb"], 0)
        print(f"{name:<18}{'ratio':<7}{'':>8}{a_b / a_h:>10.3f}{ll_b - ll_h:>+10.4f}{c_b / max(c_h, 1e-9):>9.1f}"
              "   (bart / hgb accuracy, bart - hgb log loss, CPU ratio)")
    print("bench_bart_multiclass: done")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
