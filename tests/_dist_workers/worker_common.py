"""What every multi-rank test worker does: join the world, carve sub-worlds, run an
example's ``main`` in-process, and save this rank's results before leaving cleanly."""
from __future__ import annotations

import contextlib
import datetime
import importlib.util
import io
import os
from pathlib import Path

import torch

import torchtree.distributed as td

EXAMPLES = Path(__file__).resolve().parents[2] / "examples"


def make_world(kind: str, timeout: float):
    """The whole world's backend: gloo from torchrun-style env vars, or MPI's COMM_WORLD."""
    if kind == "gloo":
        return td.TorchDistBackend.from_env("gloo", timeout=timeout)
    return td.MPIBackend(timeout=timeout)


def sub_backend(kind: str, world, size: int, timeout: float):
    """Backend over ranks 0..size-1 (None on the other ranks). Collective over the world."""
    if kind == "gloo":
        import torch.distributed as dist

        group = dist.new_group(ranks=list(range(size)), timeout=datetime.timedelta(seconds=timeout))
        return td.TorchDistBackend(group=group, timeout=timeout) if world.rank < size else None
    from mpi4py import MPI

    color = 0 if world.rank < size else MPI.UNDEFINED
    comm = world.comm.Split(color, world.rank)
    return td.MPIBackend(comm, timeout=timeout) if comm != MPI.COMM_NULL else None


def run_example(script: str, argv: list, world, out_dir: str) -> None:
    """Run ``examples/<script>``'s ``main(argv)`` in this process (no extra interpreter
    start-up); rank 0 writes what it printed to ``OUT/example.txt``."""
    spec = importlib.util.spec_from_file_location(Path(script).stem, EXAMPLES / script)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    printed = io.StringIO()
    with contextlib.redirect_stdout(printed):
        module.main(argv)
    if world.rank == 0:
        Path(out_dir, "example.txt").write_text(printed.getvalue())


def finish(kind: str, world, results: dict, out_dir: str) -> int:
    """Save this rank's results to ``OUT/rank{r}.pt``, wait for the others, leave cleanly."""
    torch.save(results, os.path.join(out_dir, f"rank{world.rank}.pt"))
    world.barrier()
    if kind == "gloo":  # else gloo's threads can outlive the interpreter: SIGABRT at exit
        import torch.distributed as dist

        dist.destroy_process_group()
    return 0
