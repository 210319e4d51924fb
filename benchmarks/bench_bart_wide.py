"""BART's compiled sweep on wide tables: CPU milliseconds per sweep as the columns grow, rows fixed.

Each tree update draws its rule's column uniformly among the columns with a cut left to the proposed node.
The kernels count those from prefix tables built once per sweep and the node's few ancestors, so the
proposal costs ``O(max_depth log D)`` rather than passes over all ``D`` columns; what still grows with
``D`` is the memory the points' bins take. This times 200 trees x 4 chains x 50 MCMC sweeps (``n_gfr=0``,
``compile="native"``) on ``n`` uniform rows with ``D`` columns (Friedman #1's signal in the first five), at
each of ``--threads``, after a short warm-up run; run it in two checkouts, alternating, to compare.

Command (from the repository root)::

    .venv/bin/python benchmarks/bench_bart_wide.py --threads 1 2
"""
from __future__ import annotations

import argparse
import sys
import time
import warnings
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
# smoke-expect: ^\| 1 \| 200 \| 10 \| \d+\.\d+ \|
# smoke-expect: ^bench_bart_wide: done


def main(argv=None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--threads", type=int, nargs="*", default=[1])
    ap.add_argument("--rows", type=int, default=1000)
    ap.add_argument("--columns", type=int, nargs="*", default=[10, 100, 300, 1000])
    ap.add_argument("--sweeps", type=int, default=50)
    ap.add_argument("--smoke", action="store_true", help="a few seconds: 200 rows, 10 and 30 columns, 4 sweeps")
    args = ap.parse_args(argv)
    if args.smoke:
        args.rows, args.columns, args.sweeps, args.threads = 200, [10, 30], 4, [1]
    import numpy as np
    import torch

    from torchtree import BART, Data

    warnings.simplefilter("ignore")
    rng = np.random.default_rng(0)
    print("| threads | rows | columns | CPU ms per sweep | wall ms per sweep |")
    print("|---|---|---|---|---|")
    for threads in args.threads:
        torch.set_num_threads(threads)
        for D in args.columns:
            X = rng.uniform(size=(args.rows, D))
            y = (10 * np.sin(np.pi * X[:, 0] * X[:, 1]) + 20 * (X[:, 2] - .5) ** 2 + 10 * X[:, 3] + 5 * X[:, 4]
                 + rng.normal(size=args.rows))
            d = Data(X, y, task="regression")
            kw = dict(n_trees=200, n_chains=4, n_gfr=0, compile="native")
            BART(**kw, n_warmup=2, n_samples=2).run(d, seed=0)
            c0, w0 = time.process_time(), time.perf_counter()
            BART(**kw, n_warmup=args.sweeps // 2, n_samples=args.sweeps - args.sweeps // 2).run(d, seed=0)
            cpu, wall = time.process_time() - c0, time.perf_counter() - w0
            print(f"| {threads} | {args.rows} | {D} | {1000 * cpu / args.sweeps:.2f} | {1000 * wall / args.sweeps:.2f} |",
                  flush=True)
    print("bench_bart_wide: done")


if __name__ == "__main__":
    main()
