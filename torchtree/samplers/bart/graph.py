"""A backfitting sweep's tree updates replayed as one CUDA graph (``BARTConfig.compile="graph"``).

Off the CPU a sweep is ``n_trees`` tree updates of a few hundred small kernels each, so its cost is
the launches, not the arithmetic. The sweep reads nothing back to the host (``tests/test_bart_sync.py``)
and its shapes do not change between sweeps, so it can be recorded once as a CUDA graph
(``torch.cuda.CUDAGraph``) and replayed: one launch per sweep.

A graph reads and writes fixed addresses. :class:`SweepGraph` therefore owns static copies of
everything the sweep touches: the trees ``feature, cut, value, leaf_of [T, C, ...]``, the residuals
``[C, N]``, the noise variance ``[C]`` and the sweep's uniforms ``U [T, C, 5]`` and leaf normals
``Z [T, C, K]``. A sweep copies its inputs in, replays, and copies the trees back into the caller's
tensors: the same kernels on the same numbers as the eager loop, so the same draws (to the order of
the device's atomic sums, as between two eager runs).

Capture runs the loop ``WARMUPS`` times on a side stream first, then records it: CUDA's lazy
initialisations, and torch.compile's compilations of the update, must not happen while recording. The
compiled update compiles on its first call (the sampler fills its tables and hands it offset-free
tensors so that one graph serves every tree); the warm-up goes on (up to ``MAX_WARMUPS``) while a call
still compiles, should a guard fail anyway. A failed capture warns once and the run goes on eagerly.
"""
from __future__ import annotations

from typing import Callable, Optional, Tuple

import torch
from torchtree.core.warn import warn

__all__ = ["CudaGraph", "SweepGraph", "warm_up"]


#: calls of the loop before it is recorded, and more while one compiles, up to MAX_WARMUPS (see the module doc)
WARMUPS = 2
MAX_WARMUPS = 5


def _graphs_compiled() -> int:
    """Graphs torch.compile has made in this process (Dynamo's counter; 0 where it is unavailable)."""
    try:
        return int(torch._dynamo.utils.counters["stats"]["unique_graphs"])
    except Exception:  # pragma: no cover - torch builds without dynamo
        return 0


def warm_up(fn: Callable[[], None]) -> None:
    """Call ``fn`` ``WARMUPS`` times, and more while a call compiles something (``MAX_WARMUPS`` at most)."""
    for k in range(MAX_WARMUPS):
        before = _graphs_compiled()
        fn()
        if k + 1 >= WARMUPS and _graphs_compiled() == before:
            break


class CudaGraph:
    """``capture(fn)`` records ``fn``'s kernels (after ``WARMUPS`` calls on a side stream); ``replay()``
    launches them again."""

    def __init__(self) -> None:
        self.graph = torch.cuda.CUDAGraph()

    def capture(self, fn: Callable[[], None]) -> None:
        side = torch.cuda.Stream()
        side.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(side):  # lazy initialisations, compilations and the allocator's first blocks
            warm_up(fn)
        torch.cuda.current_stream().wait_stream(side)
        with torch.cuda.graph(self.graph):
            fn()

    def replay(self) -> None:
        self.graph.replay()


#: what records a sweep (a test swaps in one that calls the function again at each replay)
GRAPH: Callable[[], CudaGraph] = CudaGraph


class SweepGraph:
    """The tree loop of one backfitting sweep, recorded on first use and replayed at every later sweep
    (one per run: it holds the run's buffers)."""

    def __init__(self) -> None:
        self.key: Optional[Tuple] = None
        self.graph = None
        self.failed = False

    def _record(self, loop: Callable, args) -> None:
        self.static = [a.clone() for a in args]

        def body() -> None:
            self.out = loop(*self.static)

        graph = GRAPH()
        graph.capture(body)
        self.graph = graph

    def __call__(self, loop: Callable, feature, cut, value, leaf_of, resid, sigma2, U, Z):
        """One sweep of ``loop(feature, cut, value, leaf_of, resid, sigma2, U, Z) -> (resid, moves)`` (the
        sweep's tree updates, trees in place, no read back to the host; recorded at the first call, the
        same loop replayed after): the trees updated in place; returns ``(resid [C, N], moves [2, 3])``,
        or None where the graph could not be recorded (the caller then runs the loop eagerly)."""
        if self.failed:
            return None
        args = (feature, cut, value, leaf_of, resid, sigma2, U, Z)
        key = tuple((a.shape, a.dtype, a.device) for a in args)
        if key != self.key:
            try:
                self._record(loop, args)
            except Exception as exc:  # an op that cannot be recorded, or no CUDA
                warn(f"BART: the sweep could not be recorded as a CUDA graph ({type(exc).__name__}: {exc}); "
                     "running it eagerly", RuntimeWarning)
                self.failed, self.graph = True, None
                return None
            self.key = key
        for s, a in zip(self.static, args):
            s.copy_(a)
        self.graph.replay()
        for s, a in zip(self.static[:4], args[:4]):
            a.copy_(s)
        resid_out, moves = self.out
        return resid_out.clone(), moves.clone()
