"""Ragged-segment primitives: the building blocks of per-node data work.

A batch of variable-length segments is described by ``starts [G]`` and
``counts [G]`` into a flat buffer. Everything here is vectorised over segments
(no Python loop over segments or elements).
"""
from __future__ import annotations

from typing import Optional

import torch

__all__ = ["ragged_arange", "segmented_searchsorted", "grouped_searchsorted", "sorted_slice_searchsorted",
           "sortable_bits", "rows_searchsorted",
           "segment_minmax", "exclusive_cumsum", "rank_within"]

_ROW_SEARCH = 1 << 20  # queries x row length up to which rows_searchsorted copies the rows (4-8 MB)


def exclusive_cumsum(x: torch.Tensor) -> torch.Tensor:
    """``[0, x0, x0+x1, ...]`` without the total: ``[G] -> [G]``."""
    out = torch.zeros_like(x)
    if x.numel() > 1:
        torch.cumsum(x[:-1], 0, out=out[1:])
    return out


def ragged_arange(counts: torch.Tensor):
    """Expand segments into elements.

    Parameters
    ----------
    counts : LongTensor [G]

    Returns
    -------
    seg : LongTensor [T]  segment id of each element (T = counts.sum())
    pos : LongTensor [T]  position of each element within its segment
    """
    counts = counts.long()
    G = counts.numel()
    start = exclusive_cumsum(counts)
    total = int(start[-1] + counts[-1]) if G else 0
    seg = torch.repeat_interleave(torch.arange(G, device=counts.device), counts, output_size=total)
    pos = torch.arange(total, device=counts.device) - start.index_select(0, seg)
    return seg, pos


def rank_within(group: torch.Tensor) -> torch.Tensor:
    """Index of each element among the elements with the same (sorted) group id.

    Parameters
    ----------
    group : LongTensor [T], non-decreasing

    Returns
    -------
    LongTensor [T]
    """
    T = group.numel()
    if T == 0:
        return group
    ar = torch.arange(T, device=group.device)
    first = torch.searchsorted(group, group, right=False)
    return ar - first


def segmented_searchsorted(values: torch.Tensor, starts: torch.Tensor, ends: torch.Tensor, queries: torch.Tensor,
                           right: bool = True, max_len: Optional[int] = None) -> torch.Tensor:
    """Binary search of ``queries[i]`` in the sorted slice ``values[starts[i]:ends[i]]``.

    Parameters
    ----------
    values : Tensor [T], sorted within each slice
    starts, ends : LongTensor [Q]
    queries : Tensor [Q]
    right : bool
        Like ``torch.searchsorted``: count elements ``<= q`` (True) or ``< q``.
    max_len : int, optional
        A bound on every slice's length, known to the caller: the search then runs its
        ``max_len.bit_length() + 1`` halvings without reading a value back to the host (without
        it, the longest slice is read, and the loop stops once every search has ended).

    Returns
    -------
    LongTensor [Q]: number of elements of the slice that are ``<= q`` (or ``< q``).
    """
    lo, hi = starts.clone(), ends.clone()
    if max_len is None:
        n_iter = int((ends - starts).max().item()).bit_length() if starts.numel() else 0
    else:
        n_iter = int(max_len).bit_length()
    q = queries.to(values.dtype)
    for _ in range(n_iter + 1):
        active = lo < hi
        if max_len is None and not bool(active.any()):
            break
        mid = (lo + hi) // 2
        v = values[mid.clamp(max=values.numel() - 1)]
        go_right = (v <= q) if right else (v < q)
        go_right = go_right & active
        lo = torch.where(go_right, mid + 1, lo)
        hi = torch.where(active & ~go_right, mid, hi)
    return lo - starts


def sortable_bits(v: torch.Tensor) -> Optional[torch.Tensor]:
    """An order-preserving map of a tensor of at most 32 bits into int64 ``[0, 2^32)``.

    ``a <= b`` exactly when ``key(a) <= key(b)``, for floats (``-0.0`` and ``+0.0`` map alike; no NaN)
    and integers of at most 32 bits. A float's bits read as a signed integer ``b`` order the
    non-negative floats; the negative ones run backwards, so they map to ``~b``, below
    ``2^31``, and the others to ``b + 2^31``.

    Returns
    -------
    LongTensor of ``v``'s shape, or None for 64-bit and boolean dtypes (no room for a segment above
    the value in an int64 key, see :func:`grouped_searchsorted`).
    """
    if v.dtype == torch.bool or v.element_size() > 4:
        return None
    if not v.dtype.is_floating_point:
        return v.long() + (1 << 31)
    bits = (v + 0.0).view({4: torch.int32, 2: torch.int16}[v.element_size()]).long()  # + 0.0: -0.0 to +0.0
    return torch.where(bits < 0, ~bits, bits + (1 << 31))


def grouped_searchsorted(values: torch.Tensor, seg: torch.Tensor, starts: torch.Tensor, ends: torch.Tensor,
                         qseg: torch.Tensor, queries: torch.Tensor, right: bool = True,
                         max_len: Optional[int] = None) -> torch.Tensor:
    """:func:`segmented_searchsorted` of ``queries[i]`` in segment ``qseg[i]``, for segments that lie
    one after the other in segment order.

    Parameters
    ----------
    values : Tensor [T], sorted within each segment
    seg : LongTensor [T], each value's segment, non-decreasing
    starts, ends : LongTensor [G], segment ``g``'s slice ``values[starts[g]:ends[g]]``, so ``starts[g]``
        is the number of values of the segments before ``g``
    qseg, queries : [Q], each query's segment and value
    right, max_len : as :func:`segmented_searchsorted`

    Values of at most 32 bits are searched at once: the keys ``seg * 2^32 + sortable_bits(value)``
    order the (segment, value) pairs, so one ``torch.searchsorted`` over them counts the values of
    the segments before ``g`` (``starts[g]``) and those of ``g`` up to the query. That is about twenty
    operations whatever the slices' lengths, against a dozen per halving in place, and it reads
    nothing back. 64-bit values (no room for the segment in the key) take
    :func:`segmented_searchsorted`.

    Returns
    -------
    LongTensor [Q]: number of the segment's values ``<= q`` (or ``< q``), equal to
    :func:`segmented_searchsorted`'s.
    """
    q = queries.to(values.dtype)
    vbits, qbits = sortable_bits(values), sortable_bits(q)
    s = starts.index_select(0, qseg)
    if vbits is None:
        return segmented_searchsorted(values, s, ends.index_select(0, qseg), q, right=right, max_len=max_len)
    keys = seg * (1 << 32) + vbits
    return torch.searchsorted(keys, qseg * (1 << 32) + qbits, right=right) - s


def sorted_slice_searchsorted(values: torch.Tensor, starts: torch.Tensor, ends: torch.Tensor, queries: torch.Tensor,
                              right: bool = True) -> torch.Tensor:
    """:func:`segmented_searchsorted` for ``values`` sorted as a whole (non-decreasing over the whole
    buffer, not only within each slice), in one ``torch.searchsorted``: the values ``<= q`` (or
    ``< q``) form a prefix of the buffer, so a slice holds ``clamp(prefix - start, 0, end - start)``
    of them. Equal to :func:`segmented_searchsorted`'s result, with any float dtype."""
    c = torch.searchsorted(values, queries.to(values.dtype), right=right)
    return torch.minimum((c - starts).clamp(min=0), ends - starts)


def rows_searchsorted(table: torch.Tensor, rows: torch.Tensor, queries: torch.Tensor, right: bool = True) -> torch.Tensor:
    """Binary search of ``queries[i]`` in row ``rows[i]`` of ``table [R, L]`` (sorted rows, padded with
    ``+inf`` past their values; finite queries, so the padding never counts).

    Few queries (``Q x L`` at most ``_ROW_SEARCH``): their rows are copied and searched by one
    ``torch.searchsorted``. More: in two levels, each a copy and one search of ``Q x sqrt(L)`` values.
    The first searches every ``B``-th value of the rows (``B`` the power of two nearest ``sqrt(L)``, at least
    64): the last block whose first value counts (is ``<= q``, or ``< q``) holds the row's last counted
    value, the blocks before it count whole and the ones after it not at all. The second counts within
    that block. About ten operations whatever ``L``, against a dozen per halving of
    :func:`segmented_searchsorted` in place. Neither reads a value back to the host.

    Returns
    -------
    LongTensor [Q]: number of the row's values that are ``<= q`` (or ``< q``).
    """
    L = table.shape[1]
    q = queries.to(table.dtype)[:, None]
    if rows.numel() * L <= _ROW_SEARCH:
        return torch.searchsorted(table.index_select(0, rows), q, right=right)[:, 0]
    B = 1 << max(6, (L.bit_length() + 1) // 2)
    first = torch.searchsorted(table[:, ::B].index_select(0, rows), q, right=right)[:, 0]
    block = (first - 1).clamp(min=0) * B
    pos = block[:, None] + torch.arange(B, device=table.device)
    vals = table.reshape(-1).index_select(0, (rows[:, None] * L + pos.clamp(max=L - 1)).reshape(-1)).view(-1, B)
    vals = torch.where(pos < L, vals, torch.full_like(vals, float("inf")))  # past the row: beyond every query
    return block + torch.searchsorted(vals, q, right=right)[:, 0]


def segment_minmax(x: torch.Tensor, seg: torch.Tensor, n_seg: int):
    """Per-segment column-wise min and max.

    Parameters
    ----------
    x : Tensor [T, D]
    seg : LongTensor [T] segment ids in ``[0, n_seg)``
    n_seg : int

    Returns
    -------
    lo, hi : Tensor [n_seg, D] (``+inf``/``-inf`` for empty segments)
    """
    D = x.shape[1]
    lo = torch.full((n_seg, D), float("inf"), dtype=x.dtype, device=x.device)
    hi = torch.full((n_seg, D), float("-inf"), dtype=x.dtype, device=x.device)
    index = seg[:, None].expand(-1, D)
    lo.scatter_reduce_(0, index, x, "amin")
    hi.scatter_reduce_(0, index, x, "amax")
    return lo, hi
