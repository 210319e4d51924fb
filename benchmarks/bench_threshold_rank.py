"""Ranking thresholds among a feature's sorted values: the search in place against a search of copied rows.

``TreeModel.threshold_rank`` (the move samplers' rule proposals) ranks ``Q`` thresholds, each among the sorted
distinct values of its own feature (rows of a ``[D, umax]`` table padded with ``+inf``). In place, a segmented
binary search runs ``log2(umax) + 1`` halvings of about a dozen small operations each
(``torchtree.kernels.segments.segmented_searchsorted``, no read back to the host); copied, the ``Q`` rows are
gathered (``Q x umax`` values) and searched by one ``torch.searchsorted``; in two levels, every ``B``-th value
of the ``Q`` rows, then one block of ``B`` values each (``B`` about ``sqrt(umax)``). This times the three at one
thread on random tables, microseconds per call (the minimum of 5 repeats of 20 calls), and checks that they
agree; ``threshold_rank`` (``torchtree.kernels.segments.rows_searchsorted``) copies when ``Q x umax <= 2^20``,
else searches in two levels.
``--fits`` times the fits that rank most thresholds per second instead (CPU and wall seconds, the minimum of
3, at each of ``--threads``): the batched MCMC engine (4 chains x 200 + 200 iterations, abalone's first 3,000
rows) and SMC with moves (pima, 256 particles, 50 iterations); run it in two checkouts, alternating, to
compare.

Command (from the repository root)::

    .venv/bin/python benchmarks/bench_threshold_rank.py --out benchmarks/results/threshold_rank.txt
    .venv/bin/python benchmarks/bench_threshold_rank.py --fits --threads 1 2
"""
from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
# smoke-expect: ^\| 8 \| 1000 \| 16 \| \d+ \| \d+ \| \d+ \|
# smoke-expect: ^bench_threshold_rank: done

CASES = [(8, 1000, 16), (8, 4000, 64), (10, 4000, 256), (50, 1000, 256), (300, 50, 256), (300, 1000, 256),
         (10, 100_000, 16), (100, 4000, 1024), (10, 1_000_000, 16)]


def fits(threads) -> None:
    import warnings

    import torch

    from torchtree import MCMC, Data, SMCSampler
    from torchtree.datasets import load_table

    abalone, pima = load_table("abalone"), load_table("pima_diabetes")
    cases = [("MCMC batched, abalone 3000 rows", lambda: MCMC(n_chains=4, n_warmup=200, n_samples=200, engine="batched"),
              Data(abalone.X[:3000], abalone.y[:3000], task="regression")),
             ("SMC with moves, pima", lambda: SMCSampler(n_particles=256, n_iterations=50),
              Data(pima.X, pima.y, task="classification"))]
    for name, make, data in cases:
        for t in threads:
            torch.set_num_threads(t)
            best = None
            for _ in range(3):
                c0, w0 = time.process_time(), time.time()
                with warnings.catch_warnings():
                    warnings.simplefilter("ignore")
                    post = make().run(data, seed=0)
                took = (time.process_time() - c0, time.time() - w0)
                best = took if best is None or took[0] < best[0] else best
            print(f"{name}, threads={t}: cpu {best[0]:.3f} s wall {best[1]:.3f} s; mean leaves "
                  f"{float(post.trees.n_leaves().double().mean()):.4f}", flush=True)


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--out", default=None)
    p.add_argument("--fits", action="store_true", help="time the fits that rank thresholds instead")
    p.add_argument("--threads", type=int, nargs="+", default=[1])
    p.add_argument("--smoke", action="store_true", help="one small case (tests)")
    a = p.parse_args()
    if a.fits:
        return fits(a.threads)
    import torch

    import torchtree.kernels.segments as segments
    from torchtree.kernels.segments import rows_searchsorted, segmented_searchsorted

    torch.set_num_threads(1)
    g = torch.Generator().manual_seed(0)
    lines = [f"# {' '.join(sys.argv)}; torch {torch.__version__}, 1 thread, microseconds per call", "",
             "| D | umax | Q | in place | copied rows | two levels | Q x umax |", "|---|---|---|---|---|---|---|"]
    print("\n".join(lines), flush=True)
    for D, umax, Q in CASES[:1] if a.smoke else CASES:
        table = torch.sort(torch.rand(D, umax, generator=g), 1).values
        flat = table.reshape(-1)
        f = torch.randint(0, D, (Q,), generator=g)
        q = torch.rand(Q, generator=g)
        starts = f * umax

        def in_place():
            return segmented_searchsorted(flat, starts, starts + umax, q, right=True, max_len=umax)

        def copied():
            return torch.searchsorted(table.index_select(0, f), q[:, None], right=True)[:, 0]

        def two_levels():
            return rows_searchsorted(table, f, q, right=True)

        segments._ROW_SEARCH = 0  # rows_searchsorted's route for many queries on long rows
        assert torch.equal(in_place(), copied()) and torch.equal(two_levels(), copied())
        times = []
        for fn in (in_place, copied, two_levels):
            best = float("inf")
            for _ in range(5):
                t0 = time.perf_counter()
                for _ in range(20):
                    fn()
                best = min(best, (time.perf_counter() - t0) / 20)
            times.append(best * 1e6)
        row = f"| {D} | {umax} | {Q} | {times[0]:.0f} | {times[1]:.0f} | {times[2]:.0f} | {Q * umax} |"
        lines.append(row)
        print(row, flush=True)
    if a.out:
        Path(a.out).write_text("\n".join(lines) + "\n")
    print("bench_threshold_rank: done")


if __name__ == "__main__":
    main()
