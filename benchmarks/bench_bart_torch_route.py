"""BART's torch route on the CPU: the tree update that runs off the CPU (``compile="off"``), timed here.

On a GPU the route's cost is its kernel launches (counted by ``bench_syncs.py``); on the CPU each of those
operations is a dispatch of a few microseconds, so the CPU seconds of a short run follow the same count and
show a change to it without a GPU. Friedman #1 data, 50 trees, 4 chains, 10 + 10 sweeps; the minimum CPU
and wall seconds of ``--repeats`` runs, at each of ``--threads``; the mean sigma draw shows that the draws
did not change.

``--cold-compile`` times instead the first ``compile="on"`` run of a fresh process with an empty Inductor cache
(10 trees, 4 chains, 6 sweeps, 500 rows, one thread) and counts the graphs torch.compile made.

Command (from the repository root; run it in two checkouts, alternating, to compare)::

    .venv/bin/python benchmarks/bench_bart_torch_route.py --threads 1 2
    .venv/bin/python benchmarks/bench_bart_torch_route.py --cold-compile
"""
from __future__ import annotations

import argparse
import time
import warnings

import numpy as np

# smoke-expect: ^torch route, .* threads=1: cpu \d+\.\d+ s wall \d+\.\d+ s; sigma mean \d


def cold_compile() -> None:
    """The first compiled run, in a child process with an empty Inductor cache."""
    import os
    import subprocess
    import sys
    import tempfile

    child = """
import time, warnings, numpy as np, torch
warnings.simplefilter("ignore")
torch.set_num_threads(1)
from torchtree import BART, Data
rng = np.random.default_rng(0)
X = rng.uniform(size=(500, 5)); y = 10 * X[:, 0] + rng.normal(size=500)
d = Data(X, y, task="regression")
t0, c0 = time.time(), time.process_time()
p = BART(n_trees=10, n_chains=4, n_warmup=3, n_samples=3, compile="on").run(d, seed=0)
print(f"first compiled run: wall {time.time() - t0:.1f} s cpu {time.process_time() - c0:.1f} s; graphs "
      f"{torch._dynamo.utils.counters['stats']['unique_graphs']}; sigma mean {float(p.sigma.mean()):.6f}")
"""
    with tempfile.TemporaryDirectory() as cache:
        out = subprocess.run([sys.executable, "-c", child], env={**os.environ, "TORCHINDUCTOR_CACHE_DIR": cache},
                             capture_output=True, text=True)
    print(out.stdout.strip() or out.stderr[-2000:], flush=True)


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--rows", type=int, default=2000)
    p.add_argument("--threads", type=int, nargs="+", default=[1])
    p.add_argument("--repeats", type=int, default=3)
    p.add_argument("--cold-compile", action="store_true", help="time the first compiled run instead")
    p.add_argument("--smoke", action="store_true", help="a tiny run (tests)")
    a = p.parse_args()
    if a.cold_compile:
        return cold_compile()
    import torch

    from torchtree import BART, Data

    n, trees, repeats = (200, 5, 1) if a.smoke else (a.rows, 50, a.repeats)
    rng = np.random.default_rng(0)
    X = rng.uniform(size=(n, 10))
    y = 10 * np.sin(np.pi * X[:, 0] * X[:, 1]) + 20 * (X[:, 2] - .5) ** 2 + 10 * X[:, 3] + rng.normal(size=n)
    data = Data(X, y, task="regression")
    for threads in a.threads:
        torch.set_num_threads(threads)
        best = None
        for _ in range(repeats):
            c0, w0 = time.process_time(), time.time()
            with warnings.catch_warnings():
                warnings.simplefilter("ignore")  # the short chains' convergence warning
                post = BART(n_trees=trees, n_chains=4, n_warmup=10, n_samples=10, compile="off").run(data, seed=0)
            took = (time.process_time() - c0, time.time() - w0)
            best = took if best is None or took[0] < best[0] else best
        print(f"torch route, {trees} trees x 4 chains x 20 sweeps, n={n}, threads={threads}: cpu {best[0]:.3f} s "
              f"wall {best[1]:.3f} s; sigma mean {float(post.sigma.mean()):.6f}", flush=True)


if __name__ == "__main__":
    main()
