"""Per-stage tables of the top-down growth: sorted split candidates, and node batches.

:class:`SortedCandidates` sorts the points of (node, dimension) groups by value and keeps the
cumulative statistics, so every boundary between two distinct values is a candidate split
whose left / right statistics are one subtraction away (the empirical and optimal
proposals score them). :func:`node_batches` cuts a stage's distinct nodes into batches whose
temporaries fit :data:`STAGE_CHUNK_BYTES`.

Layer: a step's helpers; imports kernels only.
"""
from __future__ import annotations

import torch

from torchtree.kernels.segments import exclusive_cumsum

__all__ = ["SortedCandidates", "node_batches", "STAGE_CHUNK_BYTES"]

#: Bytes of temporaries one stage may hold per batch of distinct nodes: the data extents and the
#: optimal proposal's sorted candidate tables are built for a batch of nodes at a time, so a
#: stage with many large distinct nodes (a million rows, weights spread over many particles)
#: does not need ``sum of node sizes x D`` entries at once. Small data fits in one batch and
#: is computed exactly as without batching.
STAGE_CHUNK_BYTES = 256 << 20


def node_batches(cost: torch.Tensor, budget: float):
    """Contiguous ranges ``(start, end)`` of nodes, each holding the nodes whose cumulative
    ``cost [U]`` starts in one multiple of ``budget``: a batch costs at most ``budget`` plus its
    last node."""
    U = cost.numel()
    if U == 0 or float(cost.sum()) <= budget:
        return [(0, U)]
    start_cost = torch.cumsum(cost.double(), 0) - cost.double()
    batch = torch.div(start_cost, float(budget), rounding_mode="floor").long()
    counts = torch.unique_consecutive(batch, return_counts=True)[1]
    ends = torch.cumsum(counts, 0).tolist()
    return list(zip([0] + ends[:-1], ends))


#: torch sorts 1-D integer tensors of at least this many elements with a stable radix sort
#: (smaller ones with an unstable comparison sort); see :func:`_sort_by_group_and_rank`
_RADIX_MIN = 32768


def _sort_by_group_and_rank(seg: torch.Tensor, ranks: torch.Tensor, G: int, R: int):
    """Sort points by (group, rank), ties in input order: returns ``(seg, rank, order)``, all [T].

    Large inputs sort int32 keys (2-3x faster than int64) in runs of groups whose keys fit
    in 31 bits; small ones sort int64 keys at once. Every sort is stable, so the permutation is
    defined by the inputs alone: the order in which the cumulative statistics are summed (floating
    point for regression), which the compiled kernels reproduce.
    """
    T = seg.numel()
    if T < _RADIX_MIN or R >= 2**31:
        keys, order = torch.sort(seg * R + ranks, stable=True)
        seg_s = keys // R
        return seg_s, keys - seg_s * R, order
    per_run = max(1, (2**31 - 1) // R)  # groups whose keys g * R + rank fit in int32
    starts = exclusive_cumsum(torch.bincount(seg, minlength=G)) if G > per_run else None
    segs, rks, orders = [], [], []
    for g0 in range(0, G, per_run):
        g1 = min(G, g0 + per_run)
        if starts is None:
            s0, s1 = 0, T
        else:  # the points arrive grouped by seg, in group order
            s0 = int(starts[g0])
            s1 = int(starts[g1]) if g1 < G else T
        keys = (seg[s0:s1] - g0).to(torch.int32) * R + ranks[s0:s1].to(torch.int32)
        keys, order = torch.sort(keys, stable=True)
        seg_s = keys // R
        rks.append((keys - seg_s * R).long())
        segs.append(seg_s.long() + g0)
        orders.append(order + s0)
    if len(segs) == 1:
        return segs[0], rks[0], orders[0]
    return torch.cat(segs), torch.cat(rks), torch.cat(orders)


_CANDIDATE_FIELDS = ("cand", "cand_seg", "cand_start", "n_cand")


class SortedCandidates:
    """Points of distinct (node, dim) groups sorted by value, with cumulative statistics.

    Attributes
    ----------
    seg, rank, idx : LongTensor [T]  group, value rank and point index, sorted by (group, value)
    start, end : LongTensor [G]      slice of each group
    cum : Tensor [T + 1, S]          cum[t] = statistics of the first t sorted points
    cand, cand_seg : LongTensor [E]  interval candidates: positions e with vals[e] < vals[e + 1]
                                     in the same group, and their groups (computed on first use)
    cand_start, n_cand : LongTensor [G]  each group's first candidate in ``cand``, and its count
    """

    def __init__(self, pool, g_uid: torch.Tensor, g_dim: torch.Tensor, data, pstats: torch.Tensor):
        seg, idx = pool.gather(g_uid)
        R = int(data.n_unique.max()) + 1
        D = data.X_rank.shape[1]
        # Flat 1-D gathers: torch's 2-D advanced indexing is several times slower.
        ranks = data.X_rank.view(-1).index_select(0, idx * D + g_dim.index_select(0, seg))
        self.seg, self.rank, order = _sort_by_group_and_rank(seg, ranks, g_uid.numel(), R)
        self.idx = idx.index_select(0, order)
        self.g_dim = g_dim
        self.data = data
        self.n_groups = g_uid.numel()
        cnt = pool.cnt[g_uid]
        self.start = exclusive_cumsum(cnt)
        self.end = self.start + cnt
        T = self.idx.numel()
        self.cum = torch.zeros(T + 1, pstats.shape[1], dtype=pstats.dtype, device=pstats.device)
        if T:
            torch.cumsum(pstats.index_select(0, self.idx), 0, out=self.cum[1:])
        self._vals = None

    def __getattr__(self, name: str):
        # the interval candidates are built on first use (the prior proposal never needs them);
        # once set as attributes, this is not called again
        if name not in _CANDIDATE_FIELDS:
            raise AttributeError(name)
        # Boundary candidates: last element of a run of equal values, not last of its group.
        T = self.idx.numel()
        nxt = torch.zeros(T, dtype=torch.bool, device=self.idx.device)
        if T > 1:
            nxt[:-1] = (self.seg[1:] == self.seg[:-1]) & (self.rank[1:] != self.rank[:-1])
        self.cand = nxt.nonzero().squeeze(1)
        self.cand_seg = self.seg[self.cand]
        self.n_cand = torch.bincount(self.cand_seg, minlength=self.n_groups)
        self.cand_start = exclusive_cumsum(self.n_cand)
        return getattr(self, name)

    def val_at(self, pos: torch.Tensor) -> torch.Tensor:
        """Feature values at sorted positions ``pos`` (from the rank table, no point gather)."""
        if self._vals is not None:
            return self._vals[pos]
        sv = self.data.sorted_values
        return sv.view(-1)[self.g_dim[self.seg[pos]] * sv.shape[1] + self.rank[pos]]

    @property
    def vals(self) -> torch.Tensor:
        """All sorted values ``[T]`` (computed on first use)."""
        if self._vals is None:
            sv = self.data.sorted_values
            self._vals = sv.view(-1).index_select(0, self.g_dim.index_select(0, self.seg) * sv.shape[1] + self.rank)
        return self._vals

    def left_stats_at(self, g: torch.Tensor, n_left: torch.Tensor) -> torch.Tensor:
        """Statistics of the first ``n_left`` sorted points of group ``g``: ``[Q, S]``."""
        s = self.start[g]
        return self.cum[s + n_left] - self.cum[s]
