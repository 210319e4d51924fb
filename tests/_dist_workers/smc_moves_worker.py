"""One rank of the multi-rank SMCSampler test job (gloo via torchrun-style env vars, or MPI).

Usage::

    RANK=r WORLD_SIZE=4 MASTER_ADDR=... MASTER_PORT=... python smc_moves_worker.py gloo OUT [SIZES] [CKPT_DIR]
    mpiexec -n 2 python smc_moves_worker.py mpi OUT [SIZES] [CKPT_DIR]

For every sub-world of the given sizes (default 2,4; ranks 0..s-1, a real sub-group /
sub-communicator) run every case of ``smc_moves_cases`` and the estimator, and save the
results to ``OUT/rank{r}.pt`` for the test to compare with the one-process run. With
``CKPT_DIR``, also on the largest sub-world: a checkpointed run stopped after iteration 2
(test hook), then resumed from its per-rank checkpoint files. Finally, on the whole world,
``examples/bench_paper002.py --smoke --backend KIND`` (its ``main``, in this process); rank 0
writes what it printed to ``OUT/example.txt``.
"""

from __future__ import annotations

import os
import sys
import time
import traceback

import torch

import smc_moves_cases as sc
from worker_common import finish, make_world, run_example, sub_backend
from torchtree.smc_moves import SMCSampler


def main() -> int:
    kind, out_dir = sys.argv[1], sys.argv[2]
    sizes = [int(s) for s in sys.argv[3].split(",")] if len(sys.argv) > 3 else list(sc.WORLD_SIZES)
    ckpt_dir = sys.argv[4] if len(sys.argv) > 4 else None
    timeout = float(os.environ.get("TT_TEST_TIMEOUT", "60"))
    torch.set_num_threads(1)
    world = make_world(kind, timeout)
    results = {"rank": world.rank, "seconds": {}}
    try:
        for size in sizes:
            b = sub_backend(kind, world, size, timeout)
            if b is None:
                continue
            for name in sc.CASES:
                t0 = time.perf_counter()
                results[(size, name)] = sc.run_case(name, b)
                results["seconds"][(size, name)] = time.perf_counter() - t0
            results[(size, "estimator")] = sc.run_estimator(b)
            if ckpt_dir is not None and size == max(sizes):
                path = os.path.join(ckpt_dir, f"{kind}_run.ckpt")
                SMCSampler._stop_after = 2
                try:
                    sc.run_case("tempering_residual", b, checkpoint=path)
                except RuntimeError as exc:
                    if "test hook" not in str(exc):
                        raise
                finally:
                    SMCSampler._stop_after = None
                results[(size, "resumed")] = sc.run_case("tempering_residual", b, checkpoint=path)
        run_example("bench_paper002.py", ["--smoke", "--backend", kind, "--threads", "1",
                                          "--out", os.path.join(out_dir, f"bench{world.rank}.json")], world, out_dir)
    except Exception:  # report, then make the others fail fast instead of waiting
        traceback.print_exc()
        sys.stdout.flush()
        os._exit(1)
    return finish(kind, world, results, out_dir)


if __name__ == "__main__":
    sys.exit(main())
