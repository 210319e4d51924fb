"""CPU and wall time of top-down SMC fits at n_threads = 1, 2 and "auto", on an idle and a busy machine.

Issue #21 item 2: torch's default intra-op threads (one per core) make the small-op-heavy
samplers many times slower in CPU time when the cores are shared. This script fits
pendigits and magic04 (paper 001's splits, ``bench_paper001.load_dataset``) with
``TopDownSMC(n_particles=M)`` at ``n_threads`` 1, 2 and "auto", first as the machine is
("idle": whatever else runs on it, the load average is printed), then with ``--busy``
processes spinning ``while True: pass`` beside it ("busy"; they are killed afterwards).
It reports CPU seconds (``time.process_time``) and wall seconds of each fit, the thread
count "auto" chose, and the ratio of "auto"'s CPU time to one thread's (the target on the
busy machine: at most 1.3).

Usage::

    python benchmarks/bench_threads.py | tee benchmarks/results/bench_threads.txt
    python benchmarks/bench_threads.py --datasets magic04 --particles 2000 --repeats 3 --busy 2
    python benchmarks/bench_threads.py --smoke     # seconds, for the test suite (no busy processes)
    python benchmarks/bench_threads.py --sweep | tee benchmarks/results/bench_threads_sweep.txt
    python benchmarks/bench_threads.py --estimators --repeats 3   # the estimators' defaults, heart and abalone

``--sweep`` instead fits synthetic data (8 features, a noisy interaction) of growing rows x
particles at 1 and 2 threads as the machine is: where a second thread starts to pay, which
``torchtree.core.threads.WORK_PER_THREAD`` is chosen from.
"""
from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time

import numpy as np
import torch

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)

from bench_paper001 import load_dataset  # noqa: E402

from torchtree import ChipmanPrior, Data, DirichletMultinomial, TopDownSMC  # noqa: E402
from torchtree.cli.options import parse_threads  # noqa: E402
from torchtree.monitor import CallbackMonitor  # noqa: E402

# smoke-expect: ^magic04\s+idle\s+auto\s+\d+\s+[0-9.]+\s+[0-9.]+
# smoke-expect: ^bench_threads: done


def fit(data: Data, M: int, threads, seed: int = 0) -> dict:
    """One top-down SMC fit (paper 001's settings): CPU and wall seconds, the threads used, log Z."""
    smc = TopDownSMC(ChipmanPrior(0.95, 0.5), DirichletMultinomial(5.0), n_particles=M, n_islands=5,
                     ess_threshold=0.1, n_threads=threads)
    start = {}
    t0, c0 = time.perf_counter(), time.process_time()
    post = smc.run(data, seed=seed, monitor=CallbackMonitor(on_start=start.update))
    return {"wall_s": time.perf_counter() - t0, "cpu_s": time.process_time() - c0, "threads": start["n_threads"],
            "log_evidence": post.log_evidence}


SWEEP = ((50_000, 100), (50_000, 500), (200_000, 100), (200_000, 500), (1_000_000, 100))


def synthetic(n: int, seed: int = 0) -> Data:
    """``n`` rows, 8 uniform-normal features, label = sign of x0 + x1 x2 + noise."""
    rng = np.random.default_rng(seed)
    X = rng.normal(size=(n, 8))
    y = (X[:, 0] + X[:, 1] * X[:, 2] + rng.normal(size=n) > 0).astype(np.int64)
    return Data(X, y)


def sweep(sizes, settings, repeats: int) -> list:
    """Fits of synthetic data at each (rows, particles) in ``sizes`` and each thread setting."""
    rows = []
    print(f"{'rows':>8s} {'M':>5s} {'work':>8s} {'n_thr':>5s} {'cpu s':>8s} {'wall s':>8s} {'load':>6s}")
    for n, M in sizes:
        data = synthetic(n)
        for threads in settings:
            runs = [fit(data, M, threads) for _ in range(repeats)]
            cpu = float(np.median([r["cpu_s"] for r in runs]))
            wall = float(np.median([r["wall_s"] for r in runs]))
            rows.append({"rows": n, "M": M, "n_threads": str(threads), "threads_used": runs[0]["threads"],
                         "cpu_s": cpu, "wall_s": wall, "load_average": os.getloadavg()[0]})
            print(f"{n:8d} {M:5d} {n * M:8.1e} {str(threads):>5s} {cpu:8.2f} {wall:8.2f} {os.getloadavg()[0]:6.2f}",
                  flush=True)
    return rows


def spin(n: int) -> list:
    """``n`` background processes that keep a core busy each (kill them with :func:`stop`)."""
    return [subprocess.Popen([sys.executable, "-c", "while True: pass"]) for _ in range(n)]


def stop(procs: list) -> None:
    for p in procs:
        p.kill()
    for p in procs:
        p.wait()


def measure(datasets, M: int, settings, repeats: int, condition: str, smoke: bool) -> list:
    rows = []
    for ds in datasets:
        Xtr, ytr, _, _ = load_dataset(ds)
        if smoke:
            Xtr, ytr = Xtr[:800], ytr[:800]
        data = Data(Xtr, ytr)
        fit(data, min(M, 20), 1)  # warm-up: imports, allocator, kernels
        for threads in settings:
            runs = [fit(data, M, threads) for _ in range(repeats)]
            cpu = float(np.median([r["cpu_s"] for r in runs]))
            wall = float(np.median([r["wall_s"] for r in runs]))
            row = {"dataset": ds, "rows": len(ytr), "M": M, "condition": condition, "n_threads": str(threads),
                   "threads_used": runs[0]["threads"], "cpu_s": cpu, "wall_s": wall,
                   "cpu_runs": [r["cpu_s"] for r in runs], "wall_runs": [r["wall_s"] for r in runs],
                   "load_average": os.getloadavg()[0], "log_evidence": runs[0]["log_evidence"]}
            rows.append(row)
            print(f"{ds:10s} {condition:5s} {str(threads):>5s} {row['threads_used']:4d} {cpu:8.2f} {wall:8.2f} "
                  f"{row['load_average']:6.2f} {row['log_evidence']:12.4f}", flush=True)
    return rows


def estimator_fits(datasets, methods, settings, repeats: int) -> list:
    """The estimators' defaults (``BayesianTreeClassifier`` / ``Regressor(method=m, n_threads=t)``) on
    ``benchmarks/bench_quality.py`` tables (a 70% training split): CPU and wall seconds per thread setting."""
    import warnings

    from bench_quality import load

    from torchtree import BayesianTreeClassifier, BayesianTreeRegressor

    rows = []
    print(f"{'dataset':34s} {'method':10s} {'n_thr':>5s} {'cpu s':>8s} {'wall s':>8s} {'load':>6s}")
    for ds in datasets:
        X, y, task = load(ds)
        tr = np.random.default_rng(1000).permutation(len(y))[:int(0.7 * len(y))]
        make = BayesianTreeClassifier if task == "classification" else BayesianTreeRegressor
        for m in methods:
            with warnings.catch_warnings():
                warnings.simplefilter("ignore")
                make(method=m, n_threads=1, random_state=0).fit(X[tr][:50], y[tr][:50])  # warm-up
                for threads in settings:
                    cpu, wall = [], []
                    for _ in range(repeats):
                        t0, c0 = time.perf_counter(), time.process_time()
                        make(method=m, n_threads=threads, random_state=0).fit(X[tr], y[tr])
                        cpu.append(time.process_time() - c0)
                        wall.append(time.perf_counter() - t0)
                    row = {"dataset": ds, "method": m, "n_threads": str(threads), "cpu_s": float(np.median(cpu)),
                           "wall_s": float(np.median(wall)), "load_average": os.getloadavg()[0]}
                    rows.append(row)
                    print(f"{ds:34s} {m:10s} {str(threads):>5s} {row['cpu_s']:8.2f} {row['wall_s']:8.2f} "
                          f"{row['load_average']:6.2f}", flush=True)
    return rows


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--datasets", nargs="+", default=None,
                    help="default: pendigits magic04 (top-down SMC), heart_statlog abalone (--estimators)")
    ap.add_argument("--particles", type=int, default=500)
    ap.add_argument("--threads", nargs="+", type=parse_threads, default=[1, 2, "auto"])
    ap.add_argument("--repeats", type=int, default=1, help="fits per setting; the median is reported")
    ap.add_argument("--busy", type=int, default=2, help="busy-loop processes for the busy condition (0: skip it)")
    ap.add_argument("--json", default=None, help="also write the rows to this file")
    ap.add_argument("--sweep", action="store_true", help="synthetic rows x particles sweep at 1 and 2 threads")
    ap.add_argument("--estimators", nargs="*", default=None, metavar="METHOD",
                    help="instead: the estimators' defaults for these methods (none named: smc mcmc smc-moves) on "
                         "heart_statlog and abalone, or --datasets from benchmarks/bench_quality.py")
    ap.add_argument("--smoke", action="store_true", help="tiny run for the test suite (magic04, 800 rows, M=20, idle only)")
    args = ap.parse_args(argv)
    if args.estimators is not None:
        methods = args.estimators or ["smc", "mcmc", "smc-moves"]
        datasets = args.datasets or ["heart_statlog", "abalone"]
        print(f"torch {torch.__version__}, {os.cpu_count()} CPUs, estimator defaults, median of {args.repeats}")
        rows = estimator_fits(datasets, methods, args.threads, args.repeats)
        if args.json:
            with open(args.json, "w") as fh:
                json.dump({"torch": torch.__version__, "estimators": rows}, fh, indent=1)
        print("bench_threads: done")
        return 0
    if args.smoke:
        args.datasets, args.particles, args.repeats, args.busy = ["magic04"], 20, 1, 0
    args.datasets = args.datasets or ["pendigits", "magic04"]
    print(f"torch {torch.__version__}, {os.cpu_count()} CPUs (affinity {len(os.sched_getaffinity(0))}), "
          f"torch default threads {torch.get_num_threads()}, OMP_NUM_THREADS={os.environ.get('OMP_NUM_THREADS')}, "
          f"top-down SMC{'' if args.sweep else f' M={args.particles}'}, 5 islands, median of {args.repeats}")
    if args.sweep:
        rows = sweep(SWEEP, [t for t in args.threads if t != "auto"], args.repeats)
        if args.json:
            with open(args.json, "w") as fh:
                json.dump({"torch": torch.__version__, "sweep": rows}, fh, indent=1)
        print("bench_threads: done")
        return 0
    print(f"{'dataset':10s} {'box':5s} {'n_thr':>5s} {'used':>4s} {'cpu s':>8s} {'wall s':>8s} {'load':>6s} {'log Z':>12s}")
    rows = measure(args.datasets, args.particles, args.threads, args.repeats, "idle", args.smoke)
    if args.busy:
        procs = spin(args.busy)
        try:
            time.sleep(2.0)  # let the spinners take their cores
            rows += measure(args.datasets, args.particles, args.threads, args.repeats, "busy", args.smoke)
        finally:
            stop(procs)
    print("\nCPU time of n_threads=auto and =2 over n_threads=1 (target for auto on the busy box: <= 1.3)")
    for cond in ("idle", "busy"):
        for ds in args.datasets:
            by = {r["n_threads"]: r for r in rows if r["condition"] == cond and r["dataset"] == ds}
            if "1" in by:
                parts = [f"{k}: {by[k]['cpu_s'] / by['1']['cpu_s']:.2f}x" for k in ("auto", "2") if k in by]
                print(f"  {ds:10s} {cond:5s} " + ", ".join(parts))
    if args.json:
        with open(args.json, "w") as fh:
            json.dump({"torch": torch.__version__, "rows": rows}, fh, indent=1)
    print("bench_threads: done")
    return 0


if __name__ == "__main__":
    sys.exit(main())
