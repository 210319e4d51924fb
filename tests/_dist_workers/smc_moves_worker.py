"""One rank of the multi-rank SMCSampler test job (gloo via torchrun-style env vars, or MPI).

Usage::

    RANK=r WORLD_SIZE=4 MASTER_ADDR=... MASTER_PORT=... python smc_moves_worker.py gloo OUT [SIZES] [CKPT_DIR]
    mpiexec -n 2 python smc_moves_worker.py mpi OUT [SIZES] [CKPT_DIR]

For every sub-world of the given sizes (default 2,4; ranks 0..s-1, a real sub-group /
sub-communicator) run every case of ``smc_moves_cases`` and the estimator, and save the
results to ``OUT/rank{r}.pt`` for the test to compare with the one-process run. With
``CKPT_DIR``, also on the largest sub-world: a checkpointed run stopped after iteration 2
(a monitor raising on every rank), then resumed from its per-rank checkpoint files. Finally, on the whole world,
``benchmarks/bench_paper002.py --smoke --backend KIND`` (its ``main``, in this process); rank 0
writes what it printed to ``OUT/example.txt``.
"""

from __future__ import annotations

import os
import sys

import smc_moves_cases as sc
from worker_common import worker_main



def main() -> int:
    ckpt_dir = sys.argv[4] if len(sys.argv) > 4 else None

    def resume_case(size, sizes, b, results):
        if ckpt_dir is None or size != max(sizes):
            return
        path = os.path.join(ckpt_dir, f"{sys.argv[1]}_run.ckpt")
        try:
            sc.run_case("tempering_residual", b, checkpoint=path, monitor=sc.stop_after(2))
        except sc.Stop:
            pass
        results[(size, "resumed")] = sc.run_case("tempering_residual", b, checkpoint=path)

    return worker_main(sc, sc.WORLD_SIZES, "benchmarks/bench_paper002.py",
                       lambda kind, world: ["--smoke", "--backend", kind, "--threads", "1",
                                            "--out", os.path.join(sys.argv[2], f"bench{world.rank}.json")],
                       after_size=resume_case)


if __name__ == "__main__":
    sys.exit(main())
