"""What every multi-rank test worker does: join the world, carve sub-worlds, run every
case of a cases module on each, run an example's ``main`` in-process, and save this
rank's results before leaving cleanly; plus the toy data the case modules share."""
from __future__ import annotations

import contextlib
import datetime
import importlib.util
import io
import os
import sys
import time
import traceback
from pathlib import Path
from typing import Callable, Optional

import numpy as np
import torch

import torchtree.distributed as td
from torchtree import Data

ROOT = Path(__file__).resolve().parents[2]


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


def toy_data(task: str):
    """(Data, query points [40, 3]) of 120 points with ties in one feature: a noisy XOR
    (classification) or a smooth function plus noise (regression)."""
    rng = np.random.default_rng(0)
    n = 120
    X = rng.normal(size=(n, 3))
    X[:, 2] = np.round(X[:, 2], 1)
    Xq = rng.normal(size=(40, 3))
    if task == "classification":
        y = ((X[:, 0] * X[:, 1] > 0) ^ (rng.random(n) < 0.1)).astype(int)
        return Data(X, y), Xq
    y = 2 * X[:, 0] + np.sin(3 * X[:, 1]) + 0.2 * rng.normal(size=n)
    return Data(X, y, task="regression"), Xq


def posterior_result(post, pred, info: dict) -> dict:
    """What the multi-rank tests compare of a fitted posterior (plain tensors, floats, lists)."""
    return {"log_evidence": post.log_evidence, "pred": np.asarray(pred), "trees": post.trees.as_dict(),
            "log_weights": post.log_weights, "info": info}


def estimator_result(backend, Xq, **params) -> dict:
    """Fit ``BayesianTreeClassifier(**params, backend=backend)`` on the classification toy
    data; its log evidence and class probabilities at ``Xq``."""
    from torchtree import BayesianTreeClassifier

    d, _ = toy_data("classification")
    est = BayesianTreeClassifier(backend=backend, **params).fit(d.X.double().numpy(), d.y.numpy())
    return {"log_evidence": est.log_evidence_, "pred": np.asarray(est.predict_proba(Xq))}


def worker_main(cases, default_sizes, example: str, example_argv: Callable[[str, object], list],
                after_size: Optional[Callable] = None) -> int:
    """The body of a multi-rank worker: ``argv = KIND OUT [SIZES] [...]``.

    For every sub-world size run every case of ``cases`` (``CASES``, ``run_case``,
    ``run_estimator``) and record ``results[(size, name)]``; ``after_size(size, sizes,
    backend, results)`` may add more. Then run ``<example>`` (a path from the repository root,
    ``examples/...`` or ``benchmarks/...``) on the whole world
    with ``example_argv(kind, world)`` and save this rank's results. Any error is
    printed and ends the process at once, so the other ranks fail fast instead of waiting.
    """
    kind, out_dir = sys.argv[1], sys.argv[2]
    sizes = [int(s) for s in sys.argv[3].split(",")] if len(sys.argv) > 3 else list(default_sizes)
    timeout = float(os.environ.get("TT_TEST_TIMEOUT", "60"))
    torch.set_num_threads(1)
    world = make_world(kind, timeout)
    results = {"rank": world.rank, "seconds": {}}
    try:
        for size in sizes:
            b = sub_backend(kind, world, size, timeout)
            if b is None:
                continue
            for name in cases.CASES:
                t0 = time.perf_counter()
                results[(size, name)] = cases.run_case(name, b)
                results["seconds"][(size, name)] = time.perf_counter() - t0
            results[(size, "estimator")] = cases.run_estimator(b)
            if after_size is not None:
                after_size(size, sizes, b, results)
        run_example(example, example_argv(kind, world), world, out_dir)
    except Exception:
        traceback.print_exc()
        sys.stdout.flush()
        os._exit(1)
    return finish(kind, world, results, out_dir)


def run_example(script: str, argv: list, world, out_dir: str) -> None:
    """Run ``<script>``'s ``main(argv)`` in this process (``script``: a path from the repository
    root; no extra interpreter start-up); rank 0 writes what it printed to ``OUT/example.txt``."""
    spec = importlib.util.spec_from_file_location(Path(script).stem, ROOT / script)
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
    world.close()
    return 0
