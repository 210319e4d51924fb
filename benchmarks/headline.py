"""Headline figures, compared with the recorded ones: a performance regression is a bug.

Each figure is the CPU seconds (and wall seconds) of one fit or one prediction, run in this
process with torch's intra-op threads set to 1 and to 2, side by side. The recorded figures
live in ``benchmarks/results/headline.json`` (under version control); a run prints, per figure,
its CPU seconds at each thread count next to the recorded ones and their ratio, and flags a
ratio above ``--tolerance`` (default 1.3). The exit status is 1 when a 1-thread figure is
flagged, so ``make bench`` fails on a regression.

Noise: each figure is the minimum over ``--repeats`` runs (default 3) of its CPU seconds, the
figure least disturbed by other jobs on a shared machine (the BART figure, ~30 CPU s, runs once). Results (accuracy, RMSE) are printed
too: a speed-up that changes them is not a speed-up.

Usage::

    python benchmarks/headline.py                    # compare with the recorded figures
    python benchmarks/headline.py --only paper001    # figures whose name starts so
    python benchmarks/headline.py --record           # run, then write them as the new record
    python benchmarks/headline.py --smoke            # tiny sizes, no comparison (the test suite)
"""
from __future__ import annotations

import argparse
import json
import os
import platform
import sys
import time
from pathlib import Path
from typing import Callable, Dict, List, Tuple

import numpy as np
import torch

HERE = Path(__file__).resolve().parent
RECORD = HERE / "results" / "headline.json"

# smoke-expect: ^figure\s+threads
# smoke-expect: ^paper001/magic04/smc-prior-2000/fit\s+1\s
# smoke-expect: ^bart/abalone/defaults/predict\s+1\s
# smoke-expect: ^headline: done


def _magic04():
    from torchtree.datasets import load_table

    t = load_table("magic04")
    perm = np.random.default_rng(0).permutation(len(t.y))
    n_tr = int(0.7 * len(t.y))
    return t.X[perm[:n_tr]], t.y[perm[:n_tr]], t.X[perm[n_tr:]], t.y[perm[n_tr:]]


def _table_split(name: str, seed: int = 0):
    from torchtree.datasets import load_table

    t = load_table(name)
    perm = np.random.default_rng(seed).permutation(len(t.y))
    n_tr = int(round(0.7 * len(t.y)))
    return t.X[perm[:n_tr]], t.y[perm[:n_tr]], t.X[perm[n_tr:]], t.y[perm[n_tr:]]


class Case:
    """A fit, then a prediction; each timed. ``fit(threads) -> model``, ``predict(model) -> quality``."""

    def __init__(self, name: str, data: Callable, fit: Callable, predict: Callable, quality: str,
                 max_repeats: int = 3):
        self.name, self.data, self.fit, self.predict, self.quality = name, data, fit, predict, quality
        self.max_repeats = max_repeats  # a long figure (tens of seconds) is less noisy and run fewer times


def _paper001(M: int, proposal: str):
    def fit(d, threads):
        from torchtree import ChipmanPrior, Data, DirichletMultinomial, TopDownSMC

        Xtr, ytr, _, _ = d
        return TopDownSMC(ChipmanPrior(0.95, 0.5), DirichletMultinomial(5.0), n_particles=M, n_islands=5,
                          proposal=proposal, expansion="node", resampling="multinomial", ess_threshold=0.1,
                          n_threads=threads).run(Data(Xtr, ytr), seed=0)

    def predict(post, d):
        _, _, Xte, yte = d
        return float((post.predict_proba(Xte).argmax(1) == yte).mean())

    return fit, predict


def _topdown(M: int, proposal: str):
    """One top-down filter (the starts of MCMC and SMC with moves on large tables use the empirical proposal)."""
    def fit(d, threads):
        from torchtree import Data, DirichletMultinomial, TopDownSMC

        Xtr, ytr, _, _ = d
        return TopDownSMC(None, DirichletMultinomial(1.0), n_particles=M, n_islands=1, proposal=proposal,
                          n_threads=threads).run(Data(Xtr, ytr), seed=0)

    def predict(post, d):
        _, _, Xte, yte = d
        return float((post.predict_proba(Xte).argmax(1) == yte).mean())

    return fit, predict


def _estimator(method: str, **kw):
    def fit(d, threads):
        from torchtree import BayesianTreeClassifier, BayesianTreeRegressor

        Xtr, ytr, _, _ = d
        cls = BayesianTreeRegressor if ytr.dtype.kind == "f" else BayesianTreeClassifier
        return cls(method=method, random_state=0, n_threads=threads, **kw).fit(Xtr, ytr)

    def predict(est, d):
        _, _, Xte, yte = d
        p = est.predict(Xte)
        if yte.dtype.kind == "f":
            return float(np.sqrt(np.mean((p - yte) ** 2)))
        return float((p == yte).mean())

    return fit, predict


def _interactions(n: int, d: int = 10):
    def data():
        from torchtree.datasets.scale import interactions

        X, y = interactions(int(round(n / 0.7)), d, seed=0)
        X, y = X.numpy(), y.numpy()
        return X[:n], y[:n], X[n:], y[n:]

    return data


def _abalone_regression():
    Xtr, ytr, Xte, yte = _table_split("abalone")
    return Xtr, ytr.astype(np.float64), Xte, yte.astype(np.float64)


def _head(data: Callable, n: int) -> Callable:
    """``data`` with at most ``n`` training and ``n`` test rows (the smoke's sizes), read once."""
    kept: list = []

    def head():
        if not kept:
            Xtr, ytr, Xte, yte = data()
            kept.append((Xtr[:n], ytr[:n], Xte[:n], yte[:n]))
        return kept[0]

    return head


def cases(smoke: bool) -> List[Case]:
    small = smoke
    # --smoke: the estimator's smc at 50 particles; the evidence search (the same code for every method) runs in the
    # pima and abalone smc figures only (classification, regression); magic04 and abalone cut to 2000 / 1000 rows
    smc_small = {"n_particles": 50} if small else {}
    no_search = {"hyper": "fixed"} if small else {}
    magic04 = _head(_magic04, 2000) if small else _magic04
    abalone = _head(_abalone_regression, 1000) if small else _abalone_regression
    out = [
        Case("paper001/magic04/smc-prior-2000", magic04, *_paper001(50 if small else 2000, "prior"), "accuracy"),
        Case("paper001/magic04/smc-optimal-10", magic04, *_paper001(5 if small else 10, "optimal"), "accuracy"),
        Case("estimator/pima/smc", lambda: _table_split("pima_diabetes"), *_estimator("smc", **smc_small), "accuracy"),
        Case("estimator/pima/mcmc", lambda: _table_split("pima_diabetes"),
             *_estimator("mcmc", **({"n_samples": 20, "n_warmup": 20, **no_search} if small else {})), "accuracy"),
        Case("estimator/pima/smc-moves", lambda: _table_split("pima_diabetes"),
             *_estimator("smc-moves", **({"n_particles": 20, "n_iterations": 2, **no_search} if small else {})),
             "accuracy"),
        Case("estimator/abalone/smc", abalone, *_estimator("smc", **smc_small), "rmse"),
        Case("scale/interactions-1e5/smc", _interactions(2000 if small else 100_000),
             *_estimator("smc", **smc_small, **no_search), "accuracy"),
        Case("scale/interactions-1e5/topdown-empirical-1000", _interactions(2000 if small else 100_000),
             *_topdown(50 if small else 1000, "empirical"), "accuracy"),
        Case("bart/abalone/200-trees-200+200-sweeps", abalone,
             *_estimator("bart", **({"n_trees": 10, "n_warmup": 5, "n_samples": 5} if small
                                    else {"n_trees": 200, "n_warmup": 200, "n_samples": 200, "n_gfr": 0})), "rmse",
             max_repeats=1),
        Case("bart/abalone/defaults", abalone,
             *_estimator("bart", **({"n_trees": 10, "n_warmup": 5, "n_samples": 5} if small else {})), "rmse",
             max_repeats=1),
    ]
    return out


def _timed(fn: Callable) -> Tuple[float, float, object]:
    c0, t0 = time.process_time(), time.perf_counter()
    out = fn()
    return time.process_time() - c0, time.perf_counter() - t0, out


def measure(case: Case, threads: int, repeats: int) -> Dict[str, float]:
    """min CPU / wall seconds over ``repeats`` of the fit and of the prediction, and the quality."""
    torch.set_num_threads(threads)
    d = case.data()
    best = {"fit_cpu": np.inf, "fit_wall": np.inf, "predict_cpu": np.inf, "predict_wall": np.inf}
    quality = None
    for _ in range(min(repeats, case.max_repeats)):
        fc, fw, model = _timed(lambda: case.fit(d, threads))
        pc, pw, quality = _timed(lambda: case.predict(model, d))
        for k, v in (("fit_cpu", fc), ("fit_wall", fw), ("predict_cpu", pc), ("predict_wall", pw)):
            best[k] = min(best[k], v)
    best[case.quality] = quality
    return best


def compare(rows: Dict[str, Dict[str, Dict[str, float]]], record: Dict, tolerance: float) -> List[str]:
    """Print the figures beside the record; return the flagged 1-thread figures."""
    flagged = []
    print(f"{'figure':58s} {'threads':>7s} {'CPU s':>8s} {'recorded':>9s} {'ratio':>6s} {'wall s':>8s}  quality")
    for name, by_threads in rows.items():
        for threads, r in by_threads.items():
            for part in ("fit", "predict"):
                rec = record.get(name, {}).get(threads, {}).get(f"{part}_cpu")
                ratio = r[f"{part}_cpu"] / rec if rec else float("nan")
                flag = ratio > tolerance
                q = {k: round(v, 4) for k, v in r.items() if k in ("accuracy", "rmse")}
                rec_s = f"{rec:9.3f}" if rec else f"{'-':>9s}"
                print(f"{name + '/' + part:58s} {threads:>7s} {r[f'{part}_cpu']:8.3f} {rec_s} {ratio:6.2f} "
                      f"{r[f'{part}_wall']:8.3f}  {q}{'  <-- SLOWER' if flag else ''}", flush=True)
                if flag and threads == "1":
                    flagged.append(f"{name}/{part}: {ratio:.2f}x the recorded {rec:.3f} CPU s")
    return flagged


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--only", nargs="*", default=None, help="figures whose name starts with one of these")
    ap.add_argument("--threads", nargs="+", type=int, default=[1, 2])
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--tolerance", type=float, default=1.3, help="flag a CPU-seconds ratio above this")
    ap.add_argument("--record", action="store_true", help="write the figures as the new record")
    ap.add_argument("--out", default=None, help="also write this run's figures to this JSON file")
    ap.add_argument("--smoke", action="store_true", help="tiny sizes, one repeat, no comparison (the test suite)")
    args = ap.parse_args(argv)
    if args.smoke:
        args.repeats, args.threads = 1, [1]
    chosen = [c for c in cases(args.smoke) if not args.only or any(c.name.startswith(o) for o in args.only)]
    rows: Dict[str, Dict[str, Dict[str, float]]] = {}
    for case in chosen:
        for threads in args.threads:
            rows.setdefault(case.name, {})[str(threads)] = measure(case, threads, args.repeats)
    record = json.loads(RECORD.read_text())["figures"] if RECORD.exists() and not args.smoke else {}
    flagged = compare(rows, record, args.tolerance)
    meta = {"torch": torch.__version__, "python": platform.python_version(), "platform": platform.platform(),
            "cpu_count": os.cpu_count(), "load_average": os.getloadavg(), "repeats": args.repeats,
            "date": time.strftime("%Y-%m-%d")}
    if args.out:
        Path(args.out).write_text(json.dumps({"meta": meta, "figures": rows}, indent=1))
    if args.record:
        merged = dict(record)
        merged.update(rows)
        RECORD.parent.mkdir(parents=True, exist_ok=True)
        RECORD.write_text(json.dumps({"meta": meta, "figures": merged}, indent=1) + "\n")
        print(f"recorded {len(rows)} figures in {RECORD}")
    elif flagged:
        print("REGRESSION (1 thread, CPU seconds above the tolerance):\n  " + "\n  ".join(flagged))
    print("headline: done")
    return 1 if flagged and not args.record else 0


if __name__ == "__main__":
    sys.exit(main())
