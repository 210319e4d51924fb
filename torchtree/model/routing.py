"""Node bitsets of the move samplers: one node per tree routed from the root (shared paths once), and rewritten subtrees.

The move samplers' trees do not keep a bitset per node when the data are large
(:meth:`~torchtree.model.target.TreeModel.keeps_bits`); a move routes the points of its node
down the path from the root instead, one :meth:`~torchtree.model.target.TreeModel.split_bits`
per level. Particles resampled from one ancestor, and trees grown from one top-down SMC run,
share the upper levels of those paths: a node is the same node wherever its parent is the same
node cut by the same rule on the same side. So each level keys its rows by (parent's distinct
node, feature, threshold rank, side) and splits each distinct key once. The result is the same
as routing every row on its own; the work is that of the distinct paths.

:func:`subtree_bits` builds the bitsets of a proposal's rewritten subtree from its root's the
same way, level by level, and drops a tree at its first empty node.

Layer: model.
"""
from __future__ import annotations

from typing import Tuple

import torch

from torchtree.model.trees import HardTrees

__all__ = ["routed_node_bits", "subtree_bits"]

_SUBTREE_BYTES = 1 << 28  # a proposal batch's subtree bitsets kept from the first pass (else rebuilt for survivors)


def _distinct_keys(parent: torch.Tensor, f: torch.Tensor, r: torch.Tensor, right: torch.Tensor, D: int, umax: int):
    """Distinct (parent, f, r, right) rows: ``(first row of each [u], inverse [k])``."""
    if parent.numel() == 0:
        return parent, parent
    span = (int(parent.max()) + 1) * D * (umax + 2) * 2
    if span < (1 << 62):
        key = ((parent * D + f) * (umax + 2) + (r + 1)) * 2 + right.long()
        uk, inv = torch.unique(key, return_inverse=True)
        n_u = uk.numel()
    else:  # keys that do not pack into int64
        uk, inv = torch.unique(torch.stack([parent, f, r, right.long()], 1), dim=0, return_inverse=True)
        n_u = uk.shape[0]
    first = torch.full((n_u,), parent.numel(), dtype=torch.long, device=parent.device)
    first.scatter_reduce_(0, inv, torch.arange(parent.numel(), device=parent.device), "amin")
    return first, inv


def routed_node_bits(model, trees: HardTrees, node: torch.Tensor) -> Tuple[torch.Tensor, torch.Tensor]:
    """Bitsets of the training points in ``node[p]`` of every tree, as distinct bitsets and an index.

    Parameters
    ----------
    model : TreeModel (its data tables and :meth:`split_bits`)
    trees : HardTrees [P] with ``extra["heap"]`` and ``extra["thr_rank"]``
    node : LongTensor [P] (>= 0)

    Returns
    -------
    (bits [U, W], index [P]): node ``node[p]`` of tree ``p`` holds the points ``bits[index[p]]``
    (``U <= P``; two rows of ``bits`` may still be equal when different paths reach the same points).
    """
    P, dev = trees.n_trees, node.device
    out_rows = torch.zeros(P, dtype=torch.long, device=dev)
    parts = []
    n_out = 0
    Bu = model.all_bits[None]
    inv = torch.zeros(P, dtype=torch.long, device=dev)
    dt = trees.depth.long().gather(1, node[:, None]).squeeze(1)
    ht = trees.extra["heap"].gather(1, node[:, None]).squeeze(1)
    cur = torch.zeros_like(node)
    for level in range(int(dt.max()) + 1 if P else 0):
        done = (dt == level).nonzero().squeeze(1)
        if done.numel():
            # the rows that end here keep this level's distinct bitsets they use
            used, k = torch.unique(inv.index_select(0, done), return_inverse=True)
            parts.append(Bu.index_select(0, used))
            out_rows[done] = k + n_out
            n_out += used.numel()
        rows = (dt > level).nonzero().squeeze(1)
        if rows.numel() == 0:
            break
        c = cur.index_select(0, rows)
        go_right = ((ht.index_select(0, rows) >> (dt.index_select(0, rows) - level - 1)) & 1) == 1
        f = trees.feature[rows, c].long()
        r = trees.extra["thr_rank"][rows, c]
        first, ik = _distinct_keys(inv.index_select(0, rows), f, r, go_right, model.D, model.umax)
        Bu = model.split_bits(Bu, f.index_select(0, first), r.index_select(0, first), go_right.index_select(0, first),
                              src=inv.index_select(0, rows).index_select(0, first))
        inv[rows] = ik
        cur[rows] = torch.where(go_right, trees.right[rows, c], trees.left[rows, c]).long()
    if not parts:  # no trees
        return model.all_bits[None][:0], out_rows
    return (torch.cat(parts) if len(parts) > 1 else parts[0]), out_rows


def subtree_bits(model, new: HardTrees, in_new: torch.Tensor, valid: torch.Tensor, jc: torch.Tensor, Bj: torch.Tensor):
    """Bitsets of the nodes of the proposed subtrees ``in_new [P, C]`` (rooted at ``jc``, whose
    points ``Bj [P, W]`` are unchanged), level by level from the root.

    Parameters
    ----------
    model : TreeModel (its :meth:`split_bits`)
    new : HardTrees [P] the proposed trees (``extra["thr_rank"]`` set for their rules)
    in_new : BoolTensor [P, C] the nodes of each proposal's rewritten subtree
    valid : BoolTensor [P] the proposals still possible
    jc : LongTensor [P] each subtree's root
    Bj : LongTensor [P, W] the root's points

    A proposal with an empty node is invalid whatever its other nodes hold, so a tree leaves the
    loop at its first empty node and its nodes are dropped: a change or swap near the root of a
    grown tree mostly empties a node within a few levels, and the deeper levels, their
    statistics and extents are never computed (most of a proposal's work on large trees).

    Returns
    -------
    (sub_tree [M], sub_node [M], bits [M, W], alive [P]): the nodes of the trees still valid
    (``alive``: ``valid`` and no empty node), tree-major as ``in_new.nonzero()`` orders them.
    """
    P, C2 = new.n_trees, new.capacity
    dev = Bj.device
    sp, sc = in_new.nonzero(as_tuple=True)
    sflat = sp * C2 + sc
    M = sp.numel()
    rel = new.depth.view(-1).index_select(0, sflat).long() - new.depth.long().gather(1, jc[:, None]).squeeze(1).index_select(0, sp)
    height = int(rel.max()) if M else 0
    cmap = torch.full((P * C2,), -1, dtype=torch.long, device=dev)
    cmap[sflat] = torch.arange(M, device=dev)
    par_fl, f_fl = new.parent.view(-1).long(), new.feature.view(-1).long()
    r_fl, right_fl = new.extra["thr_rank"].view(-1), new.right.view(-1).long()
    split = lambda parent_bits, src, g_par, sel: model.split_bits(  # noqa: E731
        parent_bits, f_fl.index_select(0, g_par), r_fl.index_select(0, g_par),
        right_fl.index_select(0, g_par) == sc.index_select(0, sel), src=src)
    parent_of = lambda sel: sp.index_select(0, sel) * C2 + par_fl.index_select(0, sflat.index_select(0, sel))  # noqa: E731
    # Pass 1: which trees empty a node. Levels are kept while they fit _SUBTREE_BYTES (then
    # they are the result); past it only the previous level is, and pass 2 rebuilds the
    # surviving trees' nodes, a fraction of the work, in memory bounded by what survives.
    alive = valid.clone()
    row = torch.full((M,), -1, dtype=torch.long, device=dev)  # row of a node in its level's bitsets
    sel = (rel == 0).nonzero().squeeze(1)
    row[sel] = torch.arange(sel.numel(), device=dev)
    prev = Bj.index_select(0, sp.index_select(0, sel))
    levels = [(sel, prev)]
    stored = prev.numel() * 8
    for lev in range(1, height + 1):
        sel = ((rel == lev) & alive.index_select(0, sp)).nonzero().squeeze(1)
        if sel.numel() == 0:
            break
        g_par = parent_of(sel)
        B = split(prev, row.index_select(0, cmap.index_select(0, g_par)), g_par, sel)
        alive[sp.index_select(0, sel)[~(B != 0).any(1)]] = False
        row[sel] = torch.arange(sel.numel(), device=dev)
        prev, stored = B, stored + B.numel() * 8
        if levels is not None:
            levels = levels + [(sel, B)] if stored <= _SUBTREE_BYTES else None
    keep = alive.index_select(0, sp).nonzero().squeeze(1)
    pos = torch.full((M,), -1, dtype=torch.long, device=dev)
    if levels is not None:
        idx = torch.cat([s for s, _ in levels])
        pos[idx] = torch.arange(idx.numel(), device=dev)
        bits = torch.cat([b for _, b in levels]) if len(levels) > 1 else levels[0][1]
        return sp.index_select(0, keep), sc.index_select(0, keep), bits.index_select(0, pos.index_select(0, keep)), alive
    del prev, B
    # Pass 2: the surviving trees' nodes, parents before children, into one tensor.
    pos[keep] = torch.arange(keep.numel(), device=dev)
    bits = torch.empty(keep.numel(), model.W, dtype=torch.long, device=dev)
    rk = rel.index_select(0, keep)
    top = keep[rk == 0]
    bits[pos.index_select(0, top)] = Bj.index_select(0, sp.index_select(0, top))
    for lev in range(1, int(rk.max()) + 1 if keep.numel() else 0):
        sel = keep[rk == lev]
        g_par = parent_of(sel)
        bits[pos.index_select(0, sel)] = split(bits, pos.index_select(0, cmap.index_select(0, g_par)), g_par, sel)
    return sp.index_select(0, keep), sc.index_select(0, keep), bits, alive
