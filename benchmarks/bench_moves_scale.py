"""MCMC and SMC with moves on large synthetic data: CPU seconds, wall seconds, peak memory, accuracy.

Data: ``X ~ N(0, 1)^10``, ``y = 1[x0 x1 + x2 + 0.5 noise > 0]``, a 70/30 split, fixed seed.
For every size ``n`` (rows before the split) it fits, each in its own subprocess at one
torch thread:

* ``mcmc``: :class:`torchtree.samplers.mcmc.MCMC` with 4 chains x 1000 iterations
  (``n_samples=500``, the default warm-up of as many);
* ``smc-moves``: :class:`torchtree.samplers.smc_moves.SMCSampler` with 1024 particles x 10
  iterations (informed cuts, the default);
* ``sklearn-tree``: scikit-learn's ``DecisionTreeClassifier`` (default settings) for the
  accuracy, when scikit-learn is installed.

Reported per fit: CPU seconds and wall seconds of the fit alone (``time.process_time`` /
``time.perf_counter`` around ``run``), the process's peak resident memory after the fit
(``getrusage(RUSAGE_SELF).ru_maxrss`` in the child: data, model tables and sampler state),
and the accuracy of the posterior predictive on the test rows. The parent also prints
the children's peak (``RUSAGE_CHILDREN``, the largest so far).

Usage::

    python benchmarks/bench_moves_scale.py [--sizes 10000 100000 1000000] [--methods mcmc smc-moves]
        [--max-bins 256] [--threads 1]
    python benchmarks/bench_moves_scale.py --smoke          # tiny, for the test suite (one child: the first method)

Results: benchmarks/results/bench_moves_scale.txt.
"""
# smoke-expect: ^\s*2000\s+mcmc\s+
# smoke-expect: ^bench_moves_scale: done
from __future__ import annotations

import argparse
import json
import resource
import subprocess
import sys
import time

import numpy as np


def make_data(n: int, seed: int = 0):
    """The synthetic problem, split 70/30: (X_train, y_train, X_test, y_test)."""
    rng = np.random.default_rng(seed)
    X = rng.normal(size=(n, 10)).astype(np.float32)
    y = ((X[:, 0] * X[:, 1] + X[:, 2] + 0.5 * rng.normal(size=n)) > 0).astype(np.int64)
    perm = rng.permutation(n)
    ntr = int(round(0.7 * n))
    return X[perm[:ntr]], y[perm[:ntr]], X[perm[ntr:]], y[perm[ntr:]]


def child(method: str, n: int, threads: int, max_bins, smoke: bool) -> dict:
    """One fit in this process; returns its measurements."""
    import torch

    torch.set_num_threads(threads)
    Xtr, ytr, Xte, yte = make_data(n)
    if method == "sklearn-tree":
        from sklearn.tree import DecisionTreeClassifier

        c0, w0 = time.process_time(), time.perf_counter()
        clf = DecisionTreeClassifier(random_state=0).fit(Xtr, ytr)
        cpu, wall = time.process_time() - c0, time.perf_counter() - w0
        rss = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024
        return {"cpu": cpu, "wall": wall, "rss": rss, "acc": float((clf.predict(Xte) == yte).mean())}
    import torchtree as tt
    from torchtree.samplers.mcmc import MCMC
    from torchtree.samplers.smc_moves import SMCSampler

    data = tt.Data(Xtr, ytr)
    extra = {} if max_bins is None else {"max_bins": max_bins}  # (so that releases without it run too)
    if method == "mcmc":
        s = MCMC(n_chains=4, n_samples=50 if smoke else 500, **extra)
    else:
        s = SMCSampler(n_particles=64 if smoke else 1024, n_iterations=10, **extra)
    c0, w0 = time.process_time(), time.perf_counter()
    post = s.run(data, seed=0)
    cpu, wall = time.process_time() - c0, time.perf_counter() - w0
    rss = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024
    acc = float((post.predict(Xte) == yte).mean())
    return {"cpu": cpu, "wall": wall, "rss": rss, "acc": acc}


def main(argv=None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--sizes", type=int, nargs="+", default=[10_000, 100_000, 1_000_000])
    ap.add_argument("--methods", nargs="+", default=["mcmc", "smc-moves", "sklearn-tree"])
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--max-bins", type=int, default=None, help="the samplers' max_bins (default None: the data)")
    ap.add_argument("--smoke", action="store_true", help="tiny sizes, for the test suite")
    ap.add_argument("--child", nargs=2, metavar=("METHOD", "N"), help=argparse.SUPPRESS)
    args = ap.parse_args(argv)
    if args.child:
        print(json.dumps(child(args.child[0], int(args.child[1]), args.threads, args.max_bins, args.smoke)))
        return
    if args.smoke:
        args.sizes = [2000]
    try:
        import sklearn  # noqa: F401
    except ImportError:
        args.methods = [m for m in args.methods if m != "sklearn-tree"]
    print(f"threads={args.threads} max_bins={args.max_bins} python={sys.version.split()[0]}")
    print(f"{'n':>9} {'method':<13} {'fit cpu s':>10} {'fit wall s':>10} {'peak RSS MB':>12} {'acc %':>7}")
    for n in args.sizes:
        for i, method in enumerate(args.methods):
            if args.smoke and i > 0:
                # --smoke: the first method runs in a child as in the full run, the others here (their peak RSS is
                # then this process's, meaningless in a smoke run; a child each would only add torch's import)
                r = child(method, n, args.threads, args.max_bins, True)
                print(f"{n:>9} {method:<13} {r['cpu']:>10.1f} {r['wall']:>10.1f} {r['rss'] / 2**20:>12.0f} "
                      f"{100 * r['acc']:>7.2f}  (in the parent)", flush=True)
                continue
            cmd = [sys.executable, __file__, "--child", method, str(n), "--threads", str(args.threads)]
            if args.max_bins is not None:
                cmd += ["--max-bins", str(args.max_bins)]
            if args.smoke:
                cmd.append("--smoke")
            proc = subprocess.run(cmd, capture_output=True, text=True)
            if proc.returncode != 0:
                print(f"{n:>9} {method:<13} failed: {proc.stderr.strip().splitlines()[-1:]}")
                continue
            r = json.loads(proc.stdout.strip().splitlines()[-1])
            print(f"{n:>9} {method:<13} {r['cpu']:>10.1f} {r['wall']:>10.1f} {r['rss'] / 2**20:>12.0f} "
                  f"{100 * r['acc']:>7.2f}", flush=True)
    kids = resource.getrusage(resource.RUSAGE_CHILDREN)
    print(f"children: peak RSS {kids.ru_maxrss / 1024:.0f} MB, CPU {kids.ru_utime + kids.ru_stime:.1f} s in all")
    print("bench_moves_scale: done")


if __name__ == "__main__":
    main()
