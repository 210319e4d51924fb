"""Distributed redistribution by rotational nearly-sort and rotational split (paper 002, Alg. 6).

Model
-----
Think of the ``N = n P`` global *positions* as slots: rank ``r`` owns positions
``[r n, (r + 1) n)``, slot ``l`` being position ``r n + l``. Each slot holds at most one *run*:
a packed particle row plus ``(a, c)``, meaning "this particle fills output slots
``[a, a + c)``" (``c == 0``: empty slot). Initially particle ``i`` sits at position ``i`` with
``a = sum(ncopies[:i])``, ``c = ncopies[i]``. Messages are always the full ``n`` slots of a rank
(padded, as in the paper, so every rank sends and receives the same amount every round); the
receiver keeps the slots whose incoming ``c > 0``.

Step 3, rotational nearly-sort (moves left). Runs with ``c > 0`` must end at positions
``0, 1, 2, ...`` in their original order. Each rank first compacts its own runs (a stable local
partition), after which every run of rank ``r`` must still move left by the same
``s_r = #zero-copy particles on ranks < r`` = ``q_r n + rem_r``. The ``rem_r`` part is a local
roll plus one exchange with rank ``r - 1``; then the bits of ``q`` are applied from the least
significant, moving runs ``2^k`` ranks left in round ``k`` (``ceil(log2 P)`` rounds). Applying a
shift ``s`` in pieces ``s mod (n 2^k)`` never puts two runs in one slot: for runs at positions
``y < y'`` the remaining shifts satisfy ``s' - s <= y' - y - 1`` and
``(s + d) mod M <= (s mod M) + d``.

Step 4, rotational split (moves right). After the nearly-sort, the run at position ``p`` has
``a >= p`` (each earlier run has at least one copy). Output slot ``j`` of the run must travel
``j - p`` positions; with the bits of that distance taken from the most significant, in round
``k`` (distance ``M = n 2^k``, ``k = ceil(log2 P) - 1 .. 0``) the copies ``j >= p + M`` of the
run at ``p`` split off and move to ``p + M`` -- ``2^k`` ranks to the right, same slot. After
those rounds every copy is less than ``n`` positions short, so a last exchange with rank
``r + 1`` hands over the copies whose output slot lies on the next rank. Copies of different
runs never share a position: positions ``j - ((j - x) mod M)`` are non-decreasing in ``j`` and
strictly increase across runs; two pieces of one run at one position would need two positions
congruent modulo ``2M`` that differ by ``M``.

Step 5, S-R. Each rank now holds runs that cover exactly its ``n`` output slots, in order, and
expands them locally (``local="gather"`` or ``"sequential"``).

Cost per rank: ``2 ceil(log2 P) + 2`` paired exchanges of ``n`` packed rows each, plus the one
set-up ``all_gather`` of :func:`~torchtree.distributed.plan.make_plan`. Works for any ``P``
(not only powers of two): partners outside ``[0, P)`` are skipped, and no run ever needs one.
"""

from __future__ import annotations

from typing import Mapping

import torch

from .backend import Backend
from .blocks import Block, Workspace
from .plan import ancestors_from_ncopies, expand_runs, local_redistribute, make_plan

__all__ = ["rotational_redistribute"]

# Per-slot metadata travelling after the packed row: first output slot, copies, rank shift.
_A, _C, _Q = 0, 1, 2
_META = 3


def _internal(msg: str) -> RuntimeError:
    return RuntimeError(f"rotational redistribution internal error: {msg} (please report)")


class _Slots:
    """A rank's ``n`` slots: packed rows + metadata, and the exchange primitive."""

    def __init__(self, wire: torch.Tensor, meta: torch.Tensor, words: int, backend: Backend, recv: torch.Tensor):
        self.wire = wire  # int64 [n, words + _META]; the meta columns are only filled to send
        self.meta = meta  # int64 [n, _META], authoritative
        self.words = words
        self.backend = backend
        self.recv = recv  # receive buffer, reused every round

    def exchange(self, out_meta: torch.Tensor, dest: int | None, source: int | None, merge: bool = True):
        """Send the slots described by ``out_meta`` (``c > 0``) to ``dest``; take ``source``'s.

        The caller has already removed the outgoing copies from ``self.meta``. With ``merge``
        the incoming runs are written into this rank's (necessarily empty) slots; without it the
        received buffer is returned for the caller to read.
        """
        P = self.backend.world_size
        if dest is not None and not 0 <= dest < P:
            dest = None
        if source is not None and not 0 <= source < P:
            source = None
        if dest is None and bool((out_meta[:, _C] > 0).any()):
            raise _internal("a run must move past the last rank")
        if dest is None and source is None:
            return None
        self.wire[:, self.words :] = out_meta
        recv = self.backend.sendrecv(self.wire, dest, source, out=self.recv)
        if recv is None or not merge:
            return recv
        in_meta = recv[:, self.words :]
        idx = torch.nonzero(in_meta[:, _C] > 0).flatten()
        if idx.numel():
            if bool((self.meta.index_select(0, idx)[:, _C] > 0).any()):
                raise _internal("two runs in one slot")
            self.wire.index_copy_(0, idx, recv.index_select(0, idx))
            self.meta.index_copy_(0, idx, in_meta.index_select(0, idx))
        return recv


def _nearly_sort(slots: _Slots, rem: int, rank: int, rounds: int) -> None:
    """Step 3 after the local compaction-and-roll: the ``rem`` exchange, then rank bits LSB first."""
    meta, n = slots.meta, slots.meta.shape[0]
    slot = torch.arange(n, device=meta.device)
    moving = (slot >= n - rem) & (meta[:, _C] > 0)
    out_meta = meta.clone()
    out_meta[~moving, _C] = 0
    meta[moving, _C] = 0
    slots.exchange(out_meta, rank - 1, rank + 1)
    for k in range(rounds):
        moving = (meta[:, _C] > 0) & (((meta[:, _Q] >> k) & 1) == 1)
        out_meta = meta.clone()
        out_meta[~moving, _C] = 0
        meta[moving, _C] = 0
        slots.exchange(out_meta, rank - (1 << k), rank + (1 << k))
    filled = meta[:, _C] > 0
    if bool((filled[1:] & ~filled[:-1]).any()):
        raise _internal("runs not compacted after the nearly-sort")


def _split(slots: _Slots, rank: int, rounds: int) -> torch.Tensor | None:
    """Step 4: rank rounds MSB first, then the hand-over of the last partial run to ``rank + 1``.

    Returns the buffer received from ``rank - 1`` in the last exchange (its runs come first in
    this rank's output) or None on rank 0.
    """
    meta, n = slots.meta, slots.meta.shape[0]
    pos = rank * n + torch.arange(n, device=meta.device)

    def peel(threshold: torch.Tensor) -> torch.Tensor:
        # Copies with output slot >= threshold leave; the rest stay in place.
        a, c = meta[:, _A], meta[:, _C]
        start = torch.maximum(a, threshold)
        moving = (a + c - start).clamp(min=0)
        out_meta = torch.zeros_like(meta)
        out_meta[:, _A] = start
        out_meta[:, _C] = moving
        meta[:, _C] = c - moving
        return out_meta

    for k in reversed(range(rounds)):
        out_meta = peel(pos + n * (1 << k))
        slots.exchange(out_meta, rank + (1 << k), rank - (1 << k))
    out_meta = peel(torch.full_like(pos, (rank + 1) * n))
    return slots.exchange(out_meta, rank + 1, rank - 1, merge=False)


def rotational_redistribute(
    block: Mapping[str, torch.Tensor],
    ncopies: torch.Tensor,
    backend: Backend,
    *,
    local: str = "gather",
    out: Mapping[str, torch.Tensor] | None = None,
    workspace: Workspace | None = None,
) -> Block:
    """Alg. 6: rotational nearly-sort, rotational split, then a local S-R on every rank.

    Parameters
    ----------
    block : mapping str -> Tensor ``[n, ...]``
        This rank's particles (global rows ``[rank n, (rank + 1) n)``), the same layout on
        every rank (pad capacities first).
    ncopies : Tensor [n]
        Non-negative integers, summing to ``N = n P`` over ranks.
    backend : Backend
    local : {"gather", "sequential"}, default "gather"
        Step 5: expand the balanced runs with a gather or with Alg. 3's loop.
    out : mapping str -> Tensor ``[n, ...]``, optional
        Preallocated output buffers (see :func:`~torchtree.distributed.redistribute`).
    workspace : Workspace, optional
        Reused send/receive buffers (two ``[n, row]`` packed buffers).

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
    With one rank this is the local S-R (the paper's ``if P > 1``). Cost per rank:
    ``2 ceil(log2 P) + 2`` paired exchanges of ``n`` packed rows plus one set-up
    ``all_gather``; works for any ``P``, not only powers of two. The docstring of the module
    ``torchtree.distributed.rotational`` gives the algorithm and why two runs never collide.
    """
    plan = make_plan(block, ncopies, backend, out)
    P, rank, n = backend.world_size, backend.rank, plan.n
    if P == 1 or n == 0:
        return local_redistribute(block, plan.counts, local, out)
    counts = plan.counts
    device = counts.device
    first = plan.offset + torch.cumsum(counts, 0) - counts
    rounds = (P - 1).bit_length()  # ceil(log2 P)

    # Local part of step 3: stable compaction of the runs with copies, rolled left by rem so
    # that the runs bound for rank - 1 sit in the slots they will occupy there.
    rem, q = plan.zeros_before % n, plan.zeros_before // n
    order = torch.cat([torch.nonzero(counts > 0).flatten(), torch.nonzero(counts == 0).flatten()])
    src = order[(torch.arange(n, device=device) + rem) % n]
    ws = Workspace() if workspace is None else workspace
    shape = (n, plan.layout.words + _META)
    wire = plan.layout.pack(block, index=src, extra_words=_META,
                            out=ws.buffer("rotational.wire", shape, torch.int64, device))
    meta = torch.stack([first[src], counts[src], torch.full_like(src, q)], 1)
    recv_buf = ws.buffer("rotational.recv", shape, torch.int64, device)
    slots = _Slots(wire, meta, plan.layout.words, backend, recv_buf)

    _nearly_sort(slots, rem, rank, rounds)
    recv = _split(slots, rank, rounds)

    # Step 5: the runs received from rank - 1 cover this rank's first output slots, its own
    # runs the rest; expand each source straight into its part of the output.
    words = plan.layout.words
    sources = []
    if recv is not None:
        ridx = torch.nonzero(recv[:, words + _C] > 0).flatten()
        sources.append((recv, ridx, recv[:, words:].index_select(0, ridx)))
    sidx = torch.nonzero(slots.meta[:, _C] > 0).flatten()
    sources.append((slots.wire, sidx, slots.meta.index_select(0, sidx)))
    run_meta = torch.cat([m for _, _, m in sources])
    run_counts = run_meta[:, _C]
    expected_first = rank * n + torch.cumsum(run_counts, 0) - run_counts
    if int(run_counts.sum()) != n or not torch.equal(run_meta[:, _A], expected_first):
        raise _internal("runs do not tile this rank's output slots")
    if local == "sequential":
        rows = torch.cat([buf.index_select(0, idx) for buf, idx, _ in sources])
        return expand_runs(plan.layout, rows, run_counts, local, out)
    result = plan.layout.empty(n, device) if out is None else dict(out)
    start = 0
    for buf, idx, m in sources:
        k = int(m[:, _C].sum())
        if k:
            part = {key: t[start : start + k] for key, t in result.items()}
            plan.layout.unpack(buf, index=idx.index_select(0, ancestors_from_ncopies(m[:, _C])), out=part)
        start += k
    return result
