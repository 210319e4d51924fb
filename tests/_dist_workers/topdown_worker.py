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

import os
import sys
import time
import traceback

import torch

import topdown_cases as tc
from worker_common import finish, make_world, run_example, sub_backend


def main() -> int:
    kind, out_dir = sys.argv[1], sys.argv[2]
    sizes = [int(s) for s in sys.argv[3].split(",")] if len(sys.argv) > 3 else list(tc.WORLD_SIZES)
    timeout = float(os.environ.get("TT_TEST_TIMEOUT", "60"))
    torch.set_num_threads(1)
    world = make_world(kind, timeout)
    results = {"rank": world.rank, "seconds": {}}
    try:
        for size in sizes:
            b = sub_backend(kind, world, size, timeout)
            if b is None:
                continue
            for name in tc.CASES:
                t0 = time.perf_counter()
                results[(size, name)] = tc.run_case(name, b)
                results["seconds"][(size, name)] = time.perf_counter() - t0
            results[(size, "estimator")] = tc.run_estimator(b)
        run_example("distributed_smc.py", ["--smoke", "--backend", kind, "--threads", "1"], world, out_dir)
    except Exception:  # report, then make the others fail fast instead of waiting
        traceback.print_exc()
        sys.stdout.flush()
        os._exit(1)
    return finish(kind, world, results, out_dir)


if __name__ == "__main__":
    sys.exit(main())
