"""Redistribution: turn ``ncopies`` into a new particle population (paper 002, Algs. 3, 5, 6).

Contract shared by every variant
--------------------------------
Global particle ``i`` is copied ``ncopies[i]`` times; output particle ``j`` is a copy of the
ancestor ``repeat_interleave(arange(N), ncopies)[j]`` and rank ``r`` ends up holding output rows
``[r N/P, (r + 1) N/P)``. All variants return exactly that, bit for bit (they only move rows).

Variants
--------
``"sequential"``  Alg. 3 (S-R): a Python loop over particles; the reference, one rank.
``"gather"``      Alg. 5 in tensor form: prefix sum of ``ncopies``, ``searchsorted`` of the
                  output slots (the binary search of the pivots, done for every slot at once),
                  one ``index_select`` per field. ``O(log N)`` depth, no Python loop; the
                  shared-memory / single-device path.
``"rotational"``  Alg. 6: rotational nearly-sort + rotational split over ``ceil(log2 P)``
                  rounds of ``sendrecv`` each, then a local S-R (see :mod:`.rotational`).
``"alltoall"``    destinations from the global prefix sum of ``ncopies``, one ``all_to_all`` of
                  exactly the rows each rank needs (see :mod:`.alltoall`).
``"auto"``        ``"gather"`` on one rank, ``"alltoall"`` on several (faster in
                  ``benchmarks/bench_redistribution.py``: it moves each needed row once, the
                  rotational scheme moves full ``N/P``-row messages ``2 ceil(log2 P) + 2`` times).

Tree capacities must agree across ranks before a distributed call: use
:func:`~torchtree.distributed.blocks.harmonize_capacity` (Alg. 6 steps 1-2, Max and Pad); the
caller trims afterwards if it wants (Restore).
"""

from __future__ import annotations

from typing import Mapping

import torch

from .alltoall import alltoall_redistribute
from .backend import Backend, LocalBackend
from .blocks import Block, block_rows
from .plan import (LOCAL_METHODS, METHODS, ancestors_from_ncopies, check_ncopies, check_out, gather_redistribute,
                   local_redistribute, sequential_redistribute)
from .rotational import rotational_redistribute

__all__ = [
    "ancestors_from_ncopies",
    "sequential_redistribute",
    "gather_redistribute",
    "redistribute",
    "check_out",
    "METHODS",
]


def redistribute(
    block: Mapping[str, torch.Tensor],
    ncopies: torch.Tensor,
    backend: Backend | None = None,
    *,
    method: str = "auto",
    local: str = "gather",
    out: Mapping[str, torch.Tensor] | None = None,
    workspace=None,
) -> Block:
    """Resampling's redistribution step on one rank or many.

    Parameters
    ----------
    block : mapping str -> Tensor ``[n, ...]``
        This rank's particles, global rows ``[rank n, (rank + 1) n)``; same keys, dtypes and
        trailing shapes on every rank (see :func:`~torchtree.distributed.harmonize_capacity`).
    ncopies : integer Tensor ``[n]``
        Copies of each local particle; non-negative, summing to ``N = n P`` over all ranks
        (e.g. from :func:`~torchtree.distributed.ncopies_from_log_weights`).
    backend : Backend, optional (default: one rank)
    method : {"auto", "sequential", "gather", "rotational", "alltoall"}
        See the module notes; "sequential" and "gather" need a world of one rank.
    local : {"gather", "sequential"}
        How the distributed variants expand their rows once balanced (Alg. 6 step 5).
    out : mapping str -> Tensor ``[n, ...]``, optional
        Preallocated output buffers (same keys, dtypes and shapes as ``block``, not sharing its
        memory), e.g. the previous step's population: saves allocating ``n`` trees per step.
    workspace : Workspace, optional
        Scratch buffers reused by the distributed variants across calls (keep one per
        population); ignored on one rank.

    Returns
    -------
    dict str -> Tensor ``[n, ...]``: this rank's rows ``[rank n, (rank + 1) n)`` of the new
    population.

    Raises
    ------
    ValueError
        On every rank alike: malformed block or ncopies, unequal particle counts or block
        layouts across ranks, ``sum(ncopies) != N``, or an unknown method.
    CollectiveError, CollectiveTimeout
        A peer died, raised, or did not answer within the backend's timeout.
    """
    backend = LocalBackend() if backend is None else backend
    if method not in METHODS:
        raise ValueError(f"method must be one of {METHODS}, got {method!r}")
    if local not in LOCAL_METHODS:
        raise ValueError(f"local must be one of {LOCAL_METHODS}, got {local!r}")
    if method == "auto":
        method = "gather" if backend.world_size == 1 else "alltoall"
    if method in LOCAL_METHODS:
        if backend.world_size != 1:
            raise ValueError(f"method {method!r} runs on one rank; use 'rotational' or 'alltoall'")
        rows = block_rows(block)
        check_out(out, block, rows)
        problem = check_ncopies(ncopies, rows)
        if problem:
            raise ValueError(problem)
        if int(ncopies.sum()) != rows:
            raise ValueError(f"sum(ncopies) is {int(ncopies.sum())}; it must equal N = {rows}")
        return local_redistribute(block, ncopies, method, out)
    if method == "rotational":
        return rotational_redistribute(block, ncopies, backend, local=local, out=out, workspace=workspace)
    return alltoall_redistribute(block, ncopies, backend, local=local, out=out, workspace=workspace)
