"""Node bitsets: a node's points as a row of ``W`` int64 words (point ``i`` is bit ``i % 64`` of word
``i // 64``), the layout of :class:`torchtree.model.target.TreeModel`.

:func:`count_bits` and :func:`split_bits` run the compiled C++ kernels (``kernels/csrc/bitsets.cpp``,
see :mod:`torchtree.kernels.native`) when ``use_native`` is true; :func:`count_bits` has its
plain-torch reference here, :func:`split_bits` in ``TreeModel.split_bits``. Bit operations and
integer counts: the two routes give equal results (tests/test_native_bitsets.py).

Layer: base (kernels only).
"""
from __future__ import annotations

from typing import Optional

import torch

from torchtree.kernels import native

__all__ = ["popcount", "bit_of", "count_bits", "split_bits", "extent_ranks"]

_CHUNK = 1 << 18  # elements per temporary of the plain-torch popcount (cache-sized)


def popcount(x: torch.Tensor) -> torch.Tensor:
    """Set bits per int64 element (SWAR). The masks clear the sign bits that an
    arithmetic shift drags in, so signed int64 is safe."""
    x = x - ((x >> 1) & 0x5555555555555555)
    x = (x & 0x3333333333333333) + ((x >> 2) & 0x3333333333333333)
    x = (x + (x >> 4)) & 0x0F0F0F0F0F0F0F0F
    return (x * 0x0101010101010101) >> 56


def bit_of(idx: torch.Tensor):
    """(word, bit value) of point indices: the bitset of point i is ``1 << (i % 64)`` in word ``i // 64``."""
    return idx // 64, torch.ones_like(idx) << (idx % 64)


def count_bits(B: torch.Tensor, masks: Optional[torch.Tensor] = None, use_native: bool = False) -> torch.Tensor:
    """Points of each bitset ``B [n, W] -> [n]``, or of ``B & masks[k]`` for masks ``[S, W] -> [n, S]``
    (int64)."""
    if use_native:
        return native.op("bitset_counts")(B, masks if masks is not None else B.new_zeros(0))
    n, W = B.shape
    if masks is None:
        step = max(1, _CHUNK // max(W, 1))
        return torch.cat([popcount(B[s:s + step]).sum(1) for s in range(0, n, step)]) if n else B.new_zeros(0)
    S = masks.shape[0]
    step = max(1, _CHUNK // max(S * W, 1))
    parts = [popcount(B[s:s + step, None, :] & masks[None]).sum(-1) for s in range(0, n, step)]
    return torch.cat(parts) if parts else B.new_zeros(0, S)


def split_bits(B: torch.Tensor, src: Optional[torch.Tensor], table: torch.Tensor, whole: torch.Tensor,
               start: torch.Tensor, end: torch.Tensor, pts: torch.Tensor, right: torch.Tensor) -> torch.Tensor:
    """Child bitsets (compiled kernel only): row ``i``'s parent is ``B[src[i]]`` (``src`` None: ``B[i]``);
    its left child is ``parent & table[whole[i]]`` plus the points ``pts[start[i]:end[i]]`` that are in
    the parent; where ``right[i]`` the row is the parent's other points, ``parent ^ left``.
    Returns LongTensor [n, W]."""
    return native.op("split_bits")(B, src if src is not None else B.new_zeros(0), table, whole, start, end, pts, right)


def extent_ranks(B: torch.Tensor, f: torch.Tensor, model) -> tuple:
    """Smallest and largest rank in column ``f [n]`` of each bitset's points (compiled kernel only):
    ``(rank_lo, rank_hi)``, LongTensors [n], ``(0, 0)`` for an empty bitset. ``model`` holds the bucket
    tables (:class:`torchtree.model.target.TreeModel`); the torch route is its ``_extent_ranks_all``."""
    return tuple(native.op("extent_ranks")(B, f, model.table, model.boff, model.n_buckets, model.bucket_first,
                                           model.bucket_last, model.run_start, model.run_end, model.pts_by_rank,
                                           model.rank_flat, model.D))
