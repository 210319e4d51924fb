"""Batched traversal of padded pointer trees: which leaf each point falls in.

On the CPU with the compiled kernels, :func:`leaf_index` is one pass of the ``tree_leaves`` kernel
(``csrc/traversal.cpp``), each (tree, point) pair walking its tree; elsewhere it runs the torch code
below. The reference loops over depth levels (not over trees or points); each level is
a handful of gathers over the pairs (tree, point) that have not reached a leaf
yet. Pairs that arrive at a leaf are dropped from the working set, so the cost
is the sum over pairs of their path lengths, not ``P * M * max_depth``.
"""
from __future__ import annotations

import torch

from . import native as _native

__all__ = ["leaf_index", "leaf_index_reference"]


def leaf_index_reference(
    feature: torch.Tensor,
    threshold: torch.Tensor,
    left: torch.Tensor,
    right: torch.Tensor,
    X: torch.Tensor,
) -> torch.Tensor:
    """Plain per-level traversal (the reference the fast path is tested against).

    Parameters
    ----------
    feature : IntTensor [P, C]
        Split dimension of each node, ``-1`` for leaves and unused slots.
    threshold : Tensor [P, C]
        Cut location; ``x[feature] <= threshold`` goes left.
    left, right : IntTensor [P, C]
        Child indices.
    X : Tensor [M, D]

    Returns
    -------
    LongTensor [P, M]: node index of the leaf reached by each point in each tree.
    """
    P, C = feature.shape
    M, D = X.shape
    node = torch.zeros(P, M, dtype=torch.long, device=X.device)
    off = (torch.arange(P, device=X.device) * C)[:, None]
    f_flat, t_flat = feature.reshape(-1).long(), threshold.reshape(-1)
    l_flat, r_flat = left.reshape(-1).long(), right.reshape(-1).long()
    xi = torch.arange(M, device=X.device)[None, :] * D
    Xf = X.reshape(-1)
    for _ in range(C):
        g = node + off
        f = f_flat[g]
        active = f >= 0
        if not bool(active.any()):
            break
        xv = Xf[xi + f.clamp(min=0)]
        go_left = xv <= t_flat[g].to(X.dtype)
        child = torch.where(go_left, l_flat[g], r_flat[g])
        node = torch.where(active, child, node)
    return node


def leaf_index(
    feature: torch.Tensor,
    threshold: torch.Tensor,
    left: torch.Tensor,
    right: torch.Tensor,
    X: torch.Tensor,
) -> torch.Tensor:
    """Leaf reached by every point in every tree, with a shrinking working set.

    Parameters
    ----------
    feature, threshold, left, right : [P, C]
        Padded pointer arrays (see :func:`leaf_index_reference`).
    X : Tensor [M, D]

    Returns
    -------
    LongTensor [P, M]
    """
    P, C = feature.shape
    M, D = X.shape
    dev = X.device
    if X.dtype in (torch.float32, torch.float64) and _native.usable(dev):
        i32 = lambda a: a.to(device=dev, dtype=torch.int32)  # noqa: E731
        return _native.op("tree_leaves")(i32(feature), threshold.to(device=dev, dtype=X.dtype), i32(left), i32(right), X)
    # Pack (feature, left, right) per node so each level needs two gathers:
    # one int64 row for the pointers and one for the threshold.
    f_flat = feature.reshape(-1).long()
    t_flat = threshold.reshape(-1).to(X.dtype)
    lr = torch.stack([left.reshape(-1).long(), right.reshape(-1).long()], 1)  # [P*C, 2]
    Xf = X.reshape(-1)
    out = torch.zeros(P * M, dtype=torch.long, device=dev)
    # Working set: flat pair ids, their current global node id and the point's row offset.
    pair = torch.arange(P * M, device=dev)
    gnode = (pair // M) * C
    xrow = (pair % M) * D
    base = gnode.clone()
    for _ in range(C):
        f = f_flat[gnode]
        active = f >= 0
        if not bool(active.all()):
            done = ~active
            out[pair[done]] = gnode[done] - base[done]
            pair, gnode, xrow, base, f = pair[active], gnode[active], xrow[active], base[active], f[active]
            if pair.numel() == 0:
                break
        go_right = (Xf[xrow + f] > t_flat[gnode]).long()
        gnode = base + lr[gnode, go_right]
    return out.view(P, M)
