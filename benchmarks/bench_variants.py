"""Estimator settings side by side: paired differences from the first, over splits and seeds.

How the estimators' defaults were chosen (README "Defaults"): every variant (a dict of
``BayesianTreeClassifier`` / ``BayesianTreeRegressor`` keyword arguments) is fitted on the
same random 70/30 splits of ``benchmarks/bench_quality.py`` with ``random_state = split + 1000 r``
for ``r < seeds``; a row gives the variant's mean test accuracy (RMSE for regression) and log
predictive density, each with its mean difference from the first variant and the standard error
of that difference over the (split, seed) pairs, the mean fit CPU seconds and, for regression,
the 90% interval's coverage. One torch thread.

Usage::

    python benchmarks/bench_variants.py '{"smc": {}, "smc_opt": {"proposal": "optimal"}}' \\
        --datasets heart_statlog wu --splits 5 --seeds 4
"""
from __future__ import annotations

import argparse
import json
import math
import sys
import time
import warnings
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))
sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

# smoke-expect: ^iris\s+smc\s
# smoke-expect: ^bench_variants: done


def fit_one(kw, task, Xtr, ytr, Xte, yte, seed):
    """(score, log density, CPU s, coverage) of one fit."""
    from torchtree import BayesianTreeClassifier, BayesianTreeRegressor

    est = (BayesianTreeClassifier if task == "classification" else BayesianTreeRegressor)(random_state=seed, **kw)
    c0 = time.process_time()
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        est.fit(Xtr, ytr)
    cpu = time.process_time() - c0
    p = est.predict(Xte)
    if task == "classification":
        return float(np.mean(p == yte)), float(est.log_predictive(Xte, yte)), cpu, float("nan")
    iv = np.asarray(est.predict_interval(Xte, 0.9))
    return (float(np.sqrt(np.mean((p - yte) ** 2))), float(est.log_predictive(Xte, yte)), cpu,
            float(np.mean((yte >= iv[:, 0]) & (yte <= iv[:, 1]))))


def main(argv=None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("variants", nargs="?", default="{}", help='JSON {"name": {estimator keyword arguments}, ...}; the first is the reference')
    ap.add_argument("--datasets", nargs="+", default=["heart_statlog"])
    ap.add_argument("--splits", type=int, default=5)
    ap.add_argument("--seeds", type=int, default=4)
    ap.add_argument("--smoke", action="store_true", help="tiny run for the test suite")
    a = ap.parse_args(argv)
    import torch

    from bench_quality import load

    torch.set_num_threads(1)
    variants = json.loads(a.variants)
    if a.smoke:
        a.datasets, a.splits, a.seeds = ["iris"], 1, 2
        variants = {"smc": {"n_particles": 50}, "smc_prior": {"n_particles": 50, "proposal": "prior"}}
    if not variants:
        ap.error("give at least one variant")
    print(f"# bench_variants: {a.splits} splits x {a.seeds} seeds; score (diff +- se) log density (diff +- se) "
          "cpu s coverage90")
    for name in a.datasets:
        X, y, task = load(name)
        res = {v: [] for v in variants}
        for s in range(a.splits):
            perm = np.random.default_rng(1000 + s).permutation(len(y))
            n_tr = int(0.7 * len(y))
            tr, te = perm[:n_tr], perm[n_tr:]
            for r in range(a.seeds):
                for v, kw in variants.items():
                    res[v].append(fit_one(kw, task, X[tr], y[tr], X[te], y[te], s + 1000 * r))
        base = np.array(res[next(iter(variants))])
        for v, rows in res.items():
            r = np.array(rows)
            d, dl = r[:, 0] - base[:, 0], r[:, 1] - base[:, 1]
            n = len(d)
            se, sel = (d.std(ddof=1) / math.sqrt(n), dl.std(ddof=1) / math.sqrt(n)) if n > 1 else (math.nan, math.nan)
            m = r.mean(0)
            print(f"{name:<34}{v:<14}{m[0]:8.4f} ({d.mean():+.4f} +- {se:.4f}){m[1]:9.4f} ({dl.mean():+.4f} +- "
                  f"{sel:.4f}){m[2]:7.2f}{m[3]:7.3f}", flush=True)
    print("bench_variants: done")


if __name__ == "__main__":
    main()
