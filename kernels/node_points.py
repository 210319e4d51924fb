"""Passes over nodes' point lists in a flat buffer: compiled on the CPU, plain torch elsewhere.

A node's points are ``buf[off : off + cnt]`` (int32 indices into the data), the layout of
:class:`torchtree.steps.node_table.NodeTable`. Each function runs the compiled C++ kernel
(``kernels/csrc/node_points.cpp``, see :mod:`torchtree.kernels.native`) when ``use_native`` is
true, else its plain-torch reference below; the results are equal (every output is a minimum, a
maximum, a comparison or an integer sum, or a float sum in the reference's order; tests/test_native.py).

Layer: base (kernels only).
"""
from __future__ import annotations

from typing import Tuple

import torch

from torchtree.kernels import native
from torchtree.kernels.segments import ragged_arange, segment_minmax

__all__ = ["gather_lists", "node_extents", "split_counts", "split_intervals", "split_sums", "split_sum_intervals",
           "all_intervals", "partition_points", "native_usable"]


def native_usable(device: torch.device) -> bool:
    """Whether the compiled kernels serve tensors on ``device`` (:func:`torchtree.kernels.native.usable`)."""
    return native.usable(device)


def gather_lists(buf: torch.Tensor, off: torch.Tensor, cnt: torch.Tensor) -> Tuple[torch.Tensor, torch.Tensor]:
    """Flatten the lists: ``(seg [T], idx [T])``, list number and point index (int64) of every entry."""
    seg, pos = ragged_arange(cnt)
    return seg, buf[off[seg] + pos].long()


def node_extents(buf, off, cnt, X: torch.Tensor, use_native: bool = False):
    """Column-wise extent of each list: ``lo, hi [L, D]`` in X's dtype, the min and max of
    ``X[list]`` (``+inf`` / ``-inf`` for an empty list)."""
    if use_native:
        lo, hi = native.op("node_extents")(buf, off, cnt, X)
        return lo, hi
    seg, idx = gather_lists(buf, off, cnt)
    return segment_minmax(X[idx], seg, off.numel())


def split_counts(buf, off, cnt, X: torch.Tensor, dim: torch.Tensor, group: torch.Tensor, thr: torch.Tensor,
                 stats: torch.Tensor):
    """Counts and statistics left of a cut, for queries on lists (compiled kernel only).

    Parameters
    ----------
    buf, off, cnt : the lists (``off``, ``cnt``: LongTensor [L])
    X : Tensor [n, D]
    dim : LongTensor [L]          the column each list is cut on
    group, thr : [Q]              each query's list, and its cut in X's dtype
    stats : IntTensor [n, S]      per-point statistics (class counts)

    Returns
    -------
    n_left : LongTensor [Q]   points of the list with ``X[:, dim] <= thr``
    left : IntTensor [Q, S]   the sum of their ``stats`` rows

    The plain-torch route to the same numbers sorts each list by value
    (:class:`torchtree.steps.split_candidates.SortedCandidates`); this kernel buckets the points
    by the list's sorted cuts instead, ``(points) x log2(queries)`` comparisons per list.
    """
    n_left, left = native.op("split_counts")(buf, off, cnt, X, dim, group, thr, stats)
    return n_left, left


def split_intervals(buf, off, cnt, rank: torch.Tensor, dim: torch.Tensor, group: torch.Tensor, u: torch.Tensor,
                    stats: torch.Tensor, n_ranks: int):
    """The empirical proposal's interval for queries on lists (compiled kernel only).

    Parameters
    ----------
    buf, off, cnt : the lists (``off``, ``cnt``: LongTensor [L])
    rank : LongTensor [n, D]      each point's rank among its column's distinct values
    dim : LongTensor [L]          the column each list is cut on
    group, u : [Q]                each query's list, and its uniform (float64)
    stats : IntTensor [n, S]      per-point statistics (class counts)
    n_ranks : int                 ranks lie in ``[0, n_ranks)``

    Returns
    -------
    n_left : LongTensor [Q]    points of rank ``<= rank0``
    left : IntTensor [Q, S]    the sum of their ``stats`` rows
    n_int : LongTensor [Q]     intervals between the list's distinct values, ``m - 1``
    rank0, rank1 : LongTensor [Q]
        the interval ``j = min(floor(u (m - 1)), m - 2)``: the ``j``-th and ``j + 1``-th distinct ranks

    The plain-torch route to the same numbers is the sorted candidates'
    (:class:`torchtree.steps.split_candidates.SortedCandidates`).
    """
    return tuple(native.op("split_intervals")(buf, off, cnt, rank, dim, group, u, stats, int(n_ranks)))


def split_sums(buf, off, cnt, rank: torch.Tensor, values: torch.Tensor, dim: torch.Tensor, group: torch.Tensor,
               thr: torch.Tensor, stats: torch.Tensor):
    """:func:`split_counts` for float statistics (regression; compiled kernel only).

    Parameters
    ----------
    buf, off, cnt : the lists (``off``, ``cnt``: LongTensor [L])
    rank : LongTensor [n, D]      each point's rank among its column's distinct values
    values : Tensor [D, nv]       each column's sorted distinct values (``values[d, rank]``)
    dim : LongTensor [L]          the column each list is cut on
    group, thr : [Q]              each query's list, and its cut in the values' dtype
    stats : float64 Tensor [n, S] per-point statistics

    Returns
    -------
    n_left : LongTensor [Q]       points of the list with value ``<= thr``
    left : float64 Tensor [Q, S]  the sum of their ``stats`` rows

    Float sums depend on their order, so this kernel adds in the plain-torch route's order
    (:class:`torchtree.steps.split_candidates.SortedCandidates`: each list's points by rank, ties in
    list order, one running sum over the lists, a difference of two of its values) and equals it bit
    for bit.
    """
    n_left, left = native.op("split_sums")(buf, off, cnt, rank, values, dim, group, thr, stats)
    return n_left, left


def split_sum_intervals(buf, off, cnt, rank: torch.Tensor, dim: torch.Tensor, group: torch.Tensor, u: torch.Tensor,
                        stats: torch.Tensor):
    """:func:`split_intervals` for float statistics (regression; compiled kernel only), summed in the
    order of :func:`split_sums`. Returns ``(n_left, left, n_int, rank0, rank1)`` as
    :func:`split_intervals` does, ``left`` in float64."""
    return tuple(native.op("split_sum_intervals")(buf, off, cnt, rank, dim, group, u, stats))


def all_intervals(buf, off, cnt, rank: torch.Tensor, dim: torch.Tensor, stats: torch.Tensor, n_ranks: int):
    """Every interval between adjacent distinct values of every list, for the optimal proposal
    (compiled kernel only; arguments as :func:`split_intervals`).

    Returns
    -------
    group : LongTensor [E]        the interval's list; lists in order, each list's intervals ascending
    rank0, rank1 : LongTensor [E] the distinct ranks on either side
    n_left : LongTensor [E]       the list's points of rank ``<= rank0``
    left : IntTensor [E, S]       the sum of their ``stats`` rows
    """
    return tuple(native.op("all_intervals")(buf, off, cnt, rank, dim, stats, int(n_ranks)))


def partition_points(buf, off, cnt, X: torch.Tensor, feat, thr, side, expected, use_native: bool = False):
    """The points of each list on one side of a rule, in list order.

    Parameters
    ----------
    buf, off, cnt : the parents' lists [K]
    feat : LongTensor [K], thr : float64 Tensor [K], side : BoolTensor [K]
        the rule: keep point ``i`` when ``(X[i, feat] > thr.to(X.dtype)) == side``
    expected : LongTensor [K]   the number of points each child should keep

    Returns
    -------
    kept : IntTensor [sum(expected)]   the children's lists, one after the other
    counts : LongTensor [K]            the numbers actually kept (the caller checks them)
    """
    if use_native:
        kept, counts = native.op("partition_points")(buf, off, cnt, X, feat, thr, side, expected)
        return kept, counts
    seg, idx = gather_lists(buf, off, cnt)
    go_right = X[idx, feat[seg]] > thr[seg].to(X.dtype)
    keep = go_right == side[seg]
    counts = torch.bincount(seg[keep], minlength=off.numel())
    kept = idx[keep].to(torch.int32)
    return kept, counts

