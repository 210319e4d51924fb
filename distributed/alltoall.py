"""Distributed redistribution with one personalised all-to-all.

The global prefix sum of ``ncopies`` already says where every copy goes: particle ``i`` fills
output slots ``[a_i, a_i + c_i)`` with ``a_i = sum(ncopies[:i])``, and slot ``j`` belongs to rank
``j // n``. So each rank sends particle ``i`` once to every rank whose slot range meets
``[a_i, a_i + c_i)`` -- for a given destination these particles are a contiguous run of the
sender's particles with ``c > 0``, found by two ``searchsorted`` calls -- and the receiver expands
what it got (rows arrive ordered by ``a``: by source rank, then by row).

Compared with the rotational scheme (:mod:`.rotational`) this moves every needed row exactly
once (at most ``n + P - 1`` rows leave a rank; rows that stay local are "sent" to self by the
backend as a copy) in one collective, instead of ``2 ceil(log2 P) + 2`` full ``n``-row
exchanges; the price is that message sizes vary (the sizes are exchanged first) and that the
worst case is no longer balanced per round.
"""

from __future__ import annotations

from typing import Mapping

import torch

from ._buffers import as_one_buffer
from .backend import Backend
from .blocks import Block, Workspace
from .plan import expand_runs, local_redistribute, make_plan

__all__ = ["alltoall_redistribute", "destination_ranges"]


def destination_ranges(first: torch.Tensor, last: torch.Tensor, n: int, world_size: int):
    """Which of a rank's runs each destination rank needs.

    Parameters
    ----------
    first, last : int64 Tensor ``[m]``
        Output-slot ranges ``[first, last)`` of this rank's particles with at least one copy,
        increasing and disjoint.
    n : int, output slots per rank
    world_size : int

    Returns
    -------
    lo, hi : int64 Tensor ``[world_size]``
        Destination ``d`` needs runs ``lo[d]:hi[d]`` (empty when ``hi <= lo``).
    """
    starts = torch.arange(world_size, dtype=torch.int64, device=first.device) * n
    lo = torch.searchsorted(last, starts, right=True)  # first run ending after d n
    hi = torch.searchsorted(first, starts + n, right=False)  # first run starting at/after (d+1) n
    return lo, torch.maximum(hi, lo)


def alltoall_redistribute(
    block: Mapping[str, torch.Tensor],
    ncopies: torch.Tensor,
    backend: Backend,
    *,
    local: str = "gather",
    out: Mapping[str, torch.Tensor] | None = None,
    workspace: Workspace | None = None,
) -> Block:
    """Redistribution with one ``all_to_all`` of exactly the rows each rank needs.

    Parameters
    ----------
    block : mapping str -> Tensor ``[n, ...]``
        This rank's particles (global rows ``[rank n, (rank + 1) n)``), the same layout on
        every rank (pad capacities first).
    ncopies : Tensor [n]
        Non-negative integers, summing to ``N = n P`` over ranks.
    backend : Backend
    local : {"gather", "sequential"}, default "gather"
        How the received rows are expanded.
    out : mapping str -> Tensor ``[n, ...]``, optional
        Preallocated output buffers (see :func:`~torchtree.distributed.redistribute`).
    workspace : Workspace, optional
        Reused send buffer (at most ``n + P - 1`` packed rows).

    Returns
    -------
    dict str -> Tensor ``[n, ...]``: rows ``[rank n, (rank + 1) n)`` of
    ``sequential_redistribute(global block, global ncopies)``, exactly.

    Raises
    ------
    ValueError
        On every rank alike: malformed block or ``ncopies``, unequal particle counts or block
        layouts across ranks, ``sum(ncopies) != N``, or a bad ``out``.
    CollectiveError, CollectiveTimeout
        A peer died, raised, or did not answer within the backend's timeout.

    Notes
    -----
    The global prefix sum of ``ncopies`` says which output slots ``[a_i, a_i + c_i)`` each
    particle fills, so every rank sends each needed row once, to every rank whose slots it
    meets (at most ``n + P - 1`` rows leave a rank), in one ``all_to_all`` after one set-up
    ``all_gather``; the receiver expands the runs it got. With one rank this is the local
    redistribution.
    """
    plan = make_plan(block, ncopies, backend, out)
    P, rank, n = backend.world_size, backend.rank, plan.n
    if P == 1 or n == 0:
        return local_redistribute(block, plan.counts, local, out)
    counts = plan.counts
    device = counts.device
    words = plan.layout.words

    nz = torch.nonzero(counts > 0).flatten()
    first = (plan.offset + torch.cumsum(counts, 0) - counts).index_select(0, nz)
    last = first + counts.index_select(0, nz)
    lo, hi = destination_ranges(first, last, n, P)
    sizes = hi - lo
    # Rows for destination d are nz[lo[d]:hi[d]]; build all of them with one gather.
    total = int(sizes.sum())
    starts = torch.cumsum(sizes, 0) - sizes
    within = torch.arange(total, device=device) - torch.repeat_interleave(starts, sizes)
    pick = torch.repeat_interleave(lo, sizes) + within
    send_rows = nz.index_select(0, pick)

    ws = Workspace() if workspace is None else workspace
    send_buf = ws.buffer("alltoall.send", (total, words + 2), torch.int64, device)
    wire = plan.layout.pack(block, index=send_rows, extra_words=2, out=send_buf)
    wire[:, words] = first.index_select(0, pick)
    wire[:, words + 1] = last.index_select(0, pick)
    received = backend.all_to_all(list(wire.split(sizes.tolist())))
    rows, _, _ = as_one_buffer(received)

    lo_slot, hi_slot = rank * n, (rank + 1) * n
    run_counts = (rows[:, words + 1].clamp(max=hi_slot) - rows[:, words].clamp(min=lo_slot)).clamp(min=0)
    if int(run_counts.sum()) != n:
        raise RuntimeError(
            f"all-to-all redistribution internal error: rank {rank} received {int(run_counts.sum())} "
            f"copies for {n} slots (please report)"
        )
    return expand_runs(plan.layout, rows, run_counts, local, out)
