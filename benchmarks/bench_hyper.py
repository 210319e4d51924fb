"""hyper="evidence" against hyper="fixed": top-down SMC with the estimator's defaults otherwise.

For each data set and ``--splits`` random 70/30 splits, fits the estimator twice (fixed
hyperparameters, and the ones chosen by the evidence of pilot runs) and prints the mean test
score (accuracy or RMSE), log predictive density and CPU seconds of the fit (the pilots
included), with the values chosen per split.

Usage::

    python benchmarks/bench_hyper.py abalone cgm wu interactions heart_statlog pima_diabetes wine
    python benchmarks/bench_hyper.py --smoke
"""
from __future__ import annotations

import argparse
import sys
import time
import warnings
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))
from bench_quality import load  # noqa: E402

# smoke-expect: ^iris\s+evidence
# smoke-expect: ^bench_hyper: done


def main(argv=None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("datasets", nargs="*", default=["abalone", "cgm", "wu", "interactions", "heart_statlog",
                                                     "pima_diabetes", "breast_cancer_wisconsin_original", "raisin",
                                                     "wine"])
    ap.add_argument("--splits", type=int, default=2)
    ap.add_argument("--smoke", action="store_true", help="tiny run for the test suite")
    a = ap.parse_args(argv)
    import torch

    from torchtree import BayesianTreeClassifier, BayesianTreeRegressor

    torch.set_num_threads(1)
    if a.smoke:
        a.datasets, a.splits = ["iris"], 1
    warnings.simplefilter("ignore")
    for name in a.datasets:
        X, y, task = load(name)
        res = {"fixed": [], "evidence": []}
        for s in range(a.splits):
            perm = np.random.default_rng(1000 + s).permutation(len(y))
            n_tr = int(0.7 * len(y))
            tr, te = perm[:n_tr], perm[n_tr:]
            Est = BayesianTreeClassifier if task == "classification" else BayesianTreeRegressor
            for mode in res:
                c0 = time.process_time()
                e = Est(random_state=s, hyper=mode).fit(X[tr], y[tr])
                cpu = time.process_time() - c0
                pred = e.predict(X[te])
                score = np.mean(pred == y[te]) if task == "classification" else np.sqrt(np.mean((pred - y[te]) ** 2))
                res[mode].append((score, e.log_predictive(X[te], y[te]), cpu))
                if mode == "evidence":
                    print(f"# {name} split {s}: chosen {e.hyper_search_.chosen}")
        for mode, r in res.items():
            r = np.array(r)
            print(f"{name:<34}{mode:<10} score {r[:, 0].mean():.4f}  log dens {r[:, 1].mean():.4f}  "
                  f"cpu s {r[:, 2].mean():.2f}", flush=True)
    print("bench_hyper: done")


if __name__ == "__main__":
    main()
