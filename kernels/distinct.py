"""Exact de-duplication of batched rows (node bitsets and the like).

After resampling, many particles hold copies of the same nodes, and a batch of per-node
queries repeats the same (bitset, feature) pairs; computing each distinct pair once and
gathering the answers back saves the work of the copies. Rows are keyed by a cheap hash,
and every row is then compared word for word with the representative of its key: a row
whose hash collides with a different row becomes its own representative, so the result is
exact whatever the hash does.
"""
from __future__ import annotations

from typing import Optional, Tuple

import torch

from torchtree.kernels.hashing import GOLDEN, mix

__all__ = ["distinct_rows", "MIN_ROWS"]

#: batches of fewer rows are not worth hashing (callers compare ``n >= MIN_ROWS``)
MIN_ROWS = 64
_SALT_SEED = 0x5EED


def _row_hash(rows: torch.Tensor) -> torch.Tensor:
    """int64 [n] hash of int64 rows [n, W]: word-position multipliers over a shift-xor of each word."""
    W = rows.shape[1]
    salt = mix(torch.arange(W, dtype=torch.int64, device=rows.device) * GOLDEN + _SALT_SEED) | 1
    return ((rows ^ (rows >> 29)) * salt).sum(1)


def distinct_rows(rows: torch.Tensor, extra: Optional[torch.Tensor] = None) -> Tuple[torch.Tensor, torch.Tensor]:
    """Representatives of the distinct rows of ``rows`` (with ``extra`` as part of the key).

    Parameters
    ----------
    rows : LongTensor [n, W]
    extra : LongTensor [n], optional
        A further key column (e.g. the feature a node is queried in).

    Returns
    -------
    first : LongTensor [u]
        Row indices, one per distinct key (plus one per row whose hash collided).
    inverse : LongTensor [n]
        ``rows[first[inverse]]`` equals ``rows`` (and ``extra`` likewise), exactly.
    """
    n = rows.shape[0]
    dev = rows.device
    if n == 0:
        empty = torch.zeros(0, dtype=torch.long, device=dev)
        return empty, empty
    h = _row_hash(rows)
    if extra is not None:
        h = mix(h + extra.to(torch.int64) * GOLDEN)
    keys, inv = torch.unique(h, return_inverse=True)
    first = torch.full((keys.numel(),), n, dtype=torch.long, device=dev).scatter_reduce(
        0, inv, torch.arange(n, device=dev), "amin")
    rep = first.index_select(0, inv)
    same = (rows == rows.index_select(0, rep)).all(1)
    if extra is not None:
        same &= extra == extra.index_select(0, rep)
    bad = (~same).nonzero().squeeze(1)
    if bad.numel():  # a collision: those rows stand for themselves
        inv = inv.clone()
        inv[bad] = keys.numel() + torch.arange(bad.numel(), device=dev)
        first = torch.cat([first, bad])
    return first, inv
