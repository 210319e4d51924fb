"""Weighted mixtures over a forest, routing each point once per *distinct* node.

Posterior samples of trees share most of their structure (resampling copies
particles; MCMC samples differ by local moves). A node is identified by the
region of input space it covers: the hash of its path (the root, then each
ancestor's rule and the side taken). Points are routed level by level through
the distinct (region, rule) pairs of the whole forest, so the work is the sum
over distinct nodes of the points in them rather than trees x points x depth,
and each distinct leaf region adds its summed weight times its value once.

Exact up to 64-bit hash collisions of paths (probability about
``n_distinct_nodes^2 / 2^64``).
"""
from __future__ import annotations

from typing import Callable, Dict, List

import torch

from .hashing import GOLDEN, mix as _mix
from .segments import exclusive_cumsum, ragged_arange

__all__ = ["node_region_keys", "forest_plan", "plan_width", "mixture_with_plan", "mixture_over_leaves"]

_GOLD = GOLDEN


def threshold_bits(threshold: torch.Tensor) -> torch.Tensor:
    if threshold.dtype == torch.float64:
        return threshold.view(torch.int64)
    return threshold.float().view(torch.int32).long()


def rule_hash(key: torch.Tensor, feature: torch.Tensor, thr_bits: torch.Tensor) -> torch.Tensor:
    return _mix(_mix(key * _GOLD + feature.long()) + thr_bits * _GOLD)


def node_region_keys(feature, threshold, left, right, depth, used) -> torch.Tensor:
    """64-bit key of the region (path) of every node.

    Parameters
    ----------
    feature, threshold, left, right, depth : [P, C]
    used : BoolTensor [P, C]

    Returns
    -------
    LongTensor [P, C] (0 for unused slots; the root's key is a fixed constant).
    """
    P, C = feature.shape
    key = torch.zeros(P, C, dtype=torch.long, device=feature.device)
    key[:, 0] = 0x5DEECE66D
    bits = threshold_bits(threshold)
    internal = used & (feature >= 0)
    max_d = int(torch.where(used, depth, 0).max()) if used.any() else 0
    for q in range(max_d):
        p, c = (internal & (depth == q)).nonzero(as_tuple=True)
        if p.numel() == 0:
            continue
        h = rule_hash(key[p, c], feature[p, c], bits[p, c])
        key[p, left[p, c].long()] = _mix(h + 1)
        key[p, right[p, c].long()] = _mix(h + 2)
    return key


def forest_plan(
    feature: torch.Tensor,
    threshold: torch.Tensor,
    left: torch.Tensor,
    right: torch.Tensor,
    depth: torch.Tensor,
    used: torch.Tensor,
    weights: torch.Tensor,
    leaf_rows: torch.Tensor,
) -> List[Dict[str, torch.Tensor]]:
    """What routing through a forest needs that does not depend on the rows, level by level.

    Every distinct leaf region with its summed weight and its row of ``leaf_rows``, and every
    distinct (region, rule) of the internal nodes with its feature, threshold and the sorted keys of
    its children: built once per forest, it makes :func:`mixture_with_plan` cost only the rows'
    routing (a posterior caches it across prediction calls).

    Parameters
    ----------
    feature, threshold, left, right, depth : [P, C] padded pointer arrays
    used : BoolTensor [P, C] slots in use
    weights : Tensor [P] mixture weights
    leaf_rows : Tensor [P, C, S] per-node rows handed to ``leaf_fn``

    Returns
    -------
    list over depths ``0 .. max_depth`` of dicts: ``leaf_key`` [L] (sorted), ``leaf_w`` [L] float64,
    ``leaf_rows`` [L, S]; ``node_key`` [I] (each distinct rule's region), ``feature`` [I],
    ``threshold`` [I], ``child_key`` [2 I] (sorted) and ``child_order`` [2 I] (its argsort); the
    internal entries are absent at the deepest level or where a level has no internal node.
    """
    key = node_region_keys(feature, threshold, left, right, depth, used)
    bits = threshold_bits(threshold)
    is_leaf = used & (feature < 0)
    internal = used & (feature >= 0)
    max_d = int(torch.where(used, depth, 0).max())
    w64 = weights.double()
    dev = feature.device
    plan: List[Dict[str, torch.Tensor]] = []
    for q in range(max_d + 1):
        at_q = depth == q
        level: Dict[str, torch.Tensor] = {}
        # Leaves: one accumulation per distinct leaf region.
        lp, lc = (is_leaf & at_q).nonzero(as_tuple=True)
        if lp.numel():
            lk, linv = torch.unique(key[lp, lc], return_inverse=True)
            W = torch.zeros(lk.numel(), dtype=torch.float64, device=dev).index_add_(0, linv, w64[lp])
            first = torch.full((lk.numel(),), lp.numel(), dtype=torch.long, device=dev).scatter_reduce(
                0, linv, torch.arange(lp.numel(), device=dev), "amin"
            )
            level.update(leaf_key=lk, leaf_w=W, leaf_rows=leaf_rows[lp[first], lc[first]])
        plan.append(level)
        if q == max_d:
            break
        # Internal nodes: each distinct (region, rule) once.
        ip, ic = (internal & at_q).nonzero(as_tuple=True)
        if ip.numel() == 0:
            break
        h = rule_hash(key[ip, ic], feature[ip, ic], bits[ip, ic])
        hu, first_i = _unique_first(h)
        ip, ic = ip[first_i], ic[first_i]
        ckey = torch.stack([_mix(hu + 1), _mix(hu + 2)], 1).reshape(-1)
        korder = torch.argsort(ckey)
        level.update(node_key=key[ip, ic], feature=feature[ip, ic].long(), threshold=threshold[ip, ic],
                     child_key=ckey[korder], child_order=korder)
    return plan


def plan_width(plan: List[Dict[str, torch.Tensor]]) -> int:
    """The most (point, item) pairs one row can make at a level of a :func:`forest_plan`: the level's
    distinct leaf regions plus its distinct (region, rule) nodes (a row lies in at most all of them)."""
    return max((sum(int(level[k].numel()) for k in ("leaf_key", "node_key") if k in level) for level in plan), default=0)


def mixture_with_plan(
    plan: List[Dict[str, torch.Tensor]],
    X: torch.Tensor,
    leaf_fn: Callable[[torch.Tensor, torch.Tensor], torch.Tensor],
    out_dim: int,
) -> torch.Tensor:
    """``out[m] = sum_p weights[p] * leaf_fn(leaf_rows[p, leaf_p(x_m)], m)`` through a forest's
    :func:`forest_plan`: each row is routed once per distinct (region, rule) of a level.

    Parameters
    ----------
    plan : the forest's :func:`forest_plan`
    X : Tensor [M, D]
    leaf_fn : callable ``(rows [T, S], point_index [T]) -> values [T, out_dim]``
    out_dim : int

    Returns
    -------
    Tensor [M, out_dim] float64
    """
    dev = X.device
    M = X.shape[0]
    out = torch.zeros(M, out_dim, dtype=torch.float64, device=dev)
    # Regions of the current level: sorted keys, and their point lists in a flat buffer.
    reg_key = torch.full((1,), 0x5DEECE66D, dtype=torch.long, device=dev)
    reg_off = torch.zeros(1, dtype=torch.long, device=dev)
    reg_cnt = torch.full((1,), M, dtype=torch.long, device=dev)
    buf = torch.arange(M, device=dev)
    # index_select / take, not tensor[index]: the same elements, several times faster on the CPU
    flat_X, width = X.reshape(-1), X.shape[1]
    for level in plan:
        if "leaf_key" in level:
            r = torch.searchsorted(reg_key, level["leaf_key"])
            seg, pos = ragged_arange(reg_cnt[r])
            pts = buf.index_select(0, reg_off[r].index_select(0, seg) + pos)
            rows = level["leaf_rows"].index_select(0, seg)
            vals = leaf_fn(rows, pts).double() * level["leaf_w"].index_select(0, seg)[:, None]
            out.index_add_(0, pts, vals)
        if "node_key" not in level:
            break
        r = torch.searchsorted(reg_key, level["node_key"])
        seg, pos = ragged_arange(reg_cnt[r])
        pts = buf.index_select(0, reg_off[r].index_select(0, seg) + pos)
        x = flat_X.index_select(0, pts * width + level["feature"].index_select(0, seg))
        go = (x > level["threshold"].to(X.dtype).index_select(0, seg)).long()
        child = 2 * seg + go  # child region id among the 2 * n_items new regions
        cnt = torch.bincount(child, minlength=level["child_key"].numel())
        off = exclusive_cumsum(cnt)
        # the points in child order, in their order within a child (a stable sort by child, in linear time: the
        # points come grouped by item, whose two children are 2 seg and 2 seg + 1): a point's place is its
        # child's offset plus the points before it in its item that went the same way
        right_before = torch.cumsum(go, 0) - go
        right_in_item = right_before - right_before.index_select(0, torch.arange(go.numel(), device=dev) - pos)
        place = off.index_select(0, child) + torch.where(go.bool(), right_in_item, pos - right_in_item)
        buf = torch.empty_like(pts).index_copy_(0, place, pts)
        korder = level["child_order"]
        reg_key, reg_off, reg_cnt = level["child_key"], off[korder], cnt[korder]
    return out


def mixture_over_leaves(
    feature: torch.Tensor,
    threshold: torch.Tensor,
    left: torch.Tensor,
    right: torch.Tensor,
    depth: torch.Tensor,
    used: torch.Tensor,
    weights: torch.Tensor,
    leaf_rows: torch.Tensor,
    X: torch.Tensor,
    leaf_fn: Callable[[torch.Tensor, torch.Tensor], torch.Tensor],
    out_dim: int,
) -> torch.Tensor:
    """``out[m] = sum_p weights[p] * leaf_fn(leaf_rows[p, leaf_p(x_m)], m)``: :func:`forest_plan` of the
    first eight arguments, then :func:`mixture_with_plan` of the rest (build the plan once to predict
    several times). Returns Tensor [M, out_dim] float64.
    """
    plan = forest_plan(feature, threshold, left, right, depth, used, weights, leaf_rows)
    return mixture_with_plan(plan, X, leaf_fn, out_dim)


def _unique_first(h: torch.Tensor):
    """Distinct values of ``h`` and the index of one occurrence of each."""
    hu, inv = torch.unique(h, return_inverse=True)
    first = torch.full((hu.numel(),), h.numel(), dtype=torch.long, device=h.device).scatter_reduce(
        0, inv, torch.arange(h.numel(), device=h.device), "amin"
    )
    return hu, first
