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

import contextlib
import importlib.util
import io
import os
import sys
import time
import traceback
from pathlib import Path

import torch

import topdown_cases as tc
import torchtree.distributed as td


def make_world(kind: str, timeout: float):
    if kind == "gloo":
        return td.TorchDistBackend.from_env("gloo", timeout=timeout)
    return td.MPIBackend(timeout=timeout)


def sub_backend(kind: str, world, size: int, timeout: float):
    """Backend over ranks 0..size-1 (None on the other ranks). Collective over the world."""
    if kind == "gloo":
        import datetime

        import torch.distributed as dist

        group = dist.new_group(ranks=list(range(size)), timeout=datetime.timedelta(seconds=timeout))
        return td.TorchDistBackend(group=group, timeout=timeout) if world.rank < size else None
    from mpi4py import MPI

    color = 0 if world.rank < size else MPI.UNDEFINED
    comm = world.comm.Split(color, world.rank)
    return td.MPIBackend(comm, timeout=timeout) if comm != MPI.COMM_NULL else None


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
        example = Path(__file__).resolve().parents[2] / "examples" / "distributed_smc.py"
        spec = importlib.util.spec_from_file_location("distributed_smc", example)
        module = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(module)
        printed = io.StringIO()
        with contextlib.redirect_stdout(printed):
            module.main(["--smoke", "--backend", kind, "--threads", "1"])
        if world.rank == 0:
            Path(out_dir, "example.txt").write_text(printed.getvalue())
    except Exception:  # report, then make the others fail fast instead of waiting
        traceback.print_exc()
        sys.stdout.flush()
        os._exit(1)
    torch.save(results, os.path.join(out_dir, f"rank{world.rank}.pt"))
    world.barrier()
    if kind == "gloo":  # else gloo's threads can outlive the interpreter: SIGABRT at exit
        import torch.distributed as dist

        dist.destroy_process_group()
    return 0


if __name__ == "__main__":
    sys.exit(main())
