"""One rank of the multi-rank TopDownSMC test job (gloo via torchrun-style env vars, or MPI).

Usage::

    RANK=r WORLD_SIZE=4 MASTER_ADDR=... MASTER_PORT=... python topdown_worker.py gloo OUT
    mpiexec -n 4 python topdown_worker.py mpi OUT [SIZES, e.g. 2,4]

For every sub-world of sizes 2 and 4 (or those given) (ranks 0..s-1, a real sub-group / sub-communicator)
run every case of ``topdown_cases`` and the estimator, and save the results to
``OUT/rank{r}.pt`` for the test to compare with the one-process run. Then, on all 4 ranks,
``examples/distributed_smc.py --smoke`` (its ``main``, in this process: no extra interpreter
start-up); rank 0 writes what it printed to ``OUT/example.txt``.
"""

from __future__ import annotations

import sys

import topdown_cases as tc
from worker_common import worker_main


def main() -> int:
    return worker_main(tc, tc.WORLD_SIZES, "examples/distributed_smc.py",
                       lambda kind, world: ["--smoke", "--backend", kind, "--threads", "1"])


if __name__ == "__main__":
    sys.exit(main())
