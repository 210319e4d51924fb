"""Move-sampler state from given trees: the caches of :class:`~torchtree.steps.moves.TreeState`
filled for trees grown elsewhere (e.g. top-down SMC draws used as MCMC starting points).

The trees keep their rules; everything the moves cache is recomputed from the data, level by
level from the root (one :meth:`~torchtree.model.target.TreeModel.split_bits` per internal
node): the node bitsets, statistics and threshold ranks, the heap codes, and the per-node
log-posterior terms (leaf: ``log(1 - p_split) + log l(Y)``; split: ``log p_split - log nv -
log range``). A tree whose rules the move samplers' model gives zero density (a split of a
node whose data do not vary in the split's dimension) is refused.

Memory: one depth level's distinct node bitsets at a time, ``O(distinct nodes at a depth x W)``
words; batches whose widest level would pass ``_LEVEL_BYTES`` are filled in groups of trees
(on a million rows, 1024 grown trees' widest levels passed the 4 GB that the whole fit may use).
"""
from __future__ import annotations

import torch

from torchtree.model.feature_groups import choice_count
from torchtree.model.target import TreeModel
from torchtree.model.trees import INTERNAL, LEAF, UNUSED, HardTrees
from torchtree.steps.moves import TreeState

__all__ = ["state_from_trees"]

_LEVEL_BYTES = 1 << 28  # one level's bitsets of a group of trees (its temporaries take a few times this)


def _distinct_levels(trees: HardTrees):
    """The nodes of every depth as (tree [n], distinct-node id [n], number of ids), a node's id
    keyed by its parent's id and rule as :func:`_filled_state` keys them (by the threshold's
    value here, which can only count more distinct nodes than its rank does)."""
    P = trees.n_trees
    po = torch.arange(P, device=trees.device)
    co = torch.zeros_like(po)
    inv, n_ids, levels = torch.zeros_like(po), 1, []
    while po.numel():
        levels.append((po, inv, n_ids))
        sp = (trees.feature[po, co] >= 0).nonzero().squeeze(1)
        if sp.numel() == 0:
            break
        ps, cs = po[sp], co[sp]
        thr = trees.threshold[ps, cs].double().view(torch.long)
        rules, ir = torch.unique(torch.stack([inv[sp], trees.feature[ps, cs].long(), thr], 1), dim=0, return_inverse=True)
        po = torch.cat([ps, ps])
        co = torch.cat([trees.left[ps, cs], trees.right[ps, cs]]).long()
        inv, n_ids = torch.cat([ir, ir + rules.shape[0]]), 2 * rules.shape[0]
    return levels


def _tree_groups(trees: HardTrees, W: int):
    """Consecutive groups of trees whose distinct nodes at any one depth take at most
    ``_LEVEL_BYTES`` as bitsets (a tree wider than that is a group of its own): list of
    LongTensor indices. Copies of a tree (resampled particles) sit side by side and cost
    one tree."""
    P = trees.n_trees
    levels = _distinct_levels(trees)
    limit = max(1, _LEVEL_BYTES // (8 * W))
    groups, start = [], 0
    while start < P:
        end = P
        for po, inv, n_ids in levels:
            m = po >= start
            first = torch.full((n_ids,), P, dtype=torch.long, device=po.device)
            first.scatter_reduce_(0, inv[m], po[m], "amin")
            # distinct ids among trees start .. start + k, for every k
            seen = torch.bincount(first[first < P] - start, minlength=P - start).cumsum(0)
            over = (seen > limit).nonzero()
            if over.numel():
                end = min(end, start + int(over[0]))
        end = max(end, start + 1)
        groups.append(torch.arange(start, end, device=trees.device))
        start = end
    return groups


def state_from_trees(model: TreeModel, trees: HardTrees) -> TreeState:
    """A :class:`TreeState` holding ``trees`` with every cache computed from ``model``'s data.

    Parameters
    ----------
    model : TreeModel
    trees : HardTrees [P] complete trees on ``model``'s data (no OPEN nodes; any slot order)

    Returns
    -------
    TreeState [P]
    """
    dev = model.X.device
    src = trees.to(dev)
    capacity = max(16, src.capacity)
    groups = _tree_groups(src, model.W)
    if len(groups) <= 1:
        return _filled_state(model, src, capacity, src.n_trees)
    parts = [_filled_state(model, src.take(g), capacity, src.n_trees).trees for g in groups]
    return TreeState(HardTrees.cat(parts))


def _filled_state(model: TreeModel, src: HardTrees, capacity: int, n_batch: int) -> TreeState:
    """:func:`state_from_trees` of one group of trees (``n_batch``: the whole batch's size, which
    decides whether the trees keep per-node bitsets)."""
    dev = model.X.device
    P = src.n_trees
    state = TreeState.roots(model, P, capacity=capacity)
    t = state.trees
    C = t.capacity
    if "bits" in t.extra and not model.keeps_bits(n_batch, C):
        # grown trees can hold hundreds of nodes: their bitsets would not fit the budget that
        # a start from the root was sized for, so the moves route from the root instead
        del t.extra["bits"]
    n = int(src.n_nodes.max()) if P else 0
    for name in ("feature", "left", "right", "parent", "depth"):
        getattr(t, name)[:, :n] = getattr(src, name)[:, :n].to(getattr(t, name).dtype)
    t.threshold[:, :n] = src.threshold[:, :n].to(t.threshold.dtype)
    used = torch.arange(C, device=dev)[None, :] < src.n_nodes[:, None]
    internal = used & (t.feature >= 0)
    t.status.copy_(torch.where(internal, INTERNAL, torch.where(used, LEAF, UNUSED)).to(t.status.dtype))
    t.n_nodes.copy_(src.n_nodes.to(t.n_nodes.dtype))
    heap, term, thr_rank = t.extra["heap"], t.extra["term"], t.extra["thr_rank"]
    heap.zero_()
    term.zero_()
    thr_rank.zero_()
    heap[:, 0] = 1
    # The nodes of the current level (p-major) as indices ``inv`` into their distinct bitsets
    # ``Bu``. Trees drawn from one SMC run share their upper levels: a child is the same node
    # wherever its parent is the same node cut by the same rule, so what depends on a node's
    # points alone is computed once per distinct node (keyed by rules: no hashing of bitsets).
    po = torch.arange(P, device=dev)
    co = torch.zeros(P, dtype=torch.long, device=dev)
    Bu = model.all_bits[None]
    inv = torch.zeros(P, dtype=torch.long, device=dev)
    while po.numel():
        depth = t.depth[po, co].long()
        stats = model.node_stats(Bu)[:, : model.S].index_select(0, inv)
        t.stats[po, co] = stats.to(t.stats.dtype)
        if "bits" in t.extra:
            t.extra["bits"][po, co] = Bu.index_select(0, inv)
        is_int = internal[po, co]
        lf = (~is_int).nonzero().squeeze(1)
        if lf.numel():
            ul, il = torch.unique(inv[lf], return_inverse=True)
            nonconst = model.nonconst(Bu.index_select(0, ul)).index_select(0, il)
            term[po[lf], co[lf]] = model.leaf_term(depth[lf], nonconst, stats[lf])
        sp = is_int.nonzero().squeeze(1)
        if sp.numel() == 0:
            break
        ps, cs = po[sp], co[sp]
        f = t.feature[ps, cs].long()
        r = model.threshold_rank(f, t.threshold[ps, cs])
        thr_rank[ps, cs] = r
        ui, ii = torch.unique(inv[sp], return_inverse=True)
        vary = model.varying(Bu.index_select(0, ui)).index_select(0, ii)
        if not bool(vary.gather(1, f[:, None]).all()):
            raise ValueError("a tree splits a node in a dimension where the node's data do not vary: "
                             "it has zero density under the move samplers' prior")
        # distinct (node, rule) pairs: one extent and one pair of children each
        rules, ir = torch.unique(torch.stack([inv[sp], f, r], 1), dim=0, return_inverse=True)
        Br, fr, rr = Bu.index_select(0, rules[:, 0]), rules[:, 1], rules[:, 2]
        lo, hi = model.extent(Br, fr)
        term[ps, cs] = model.internal_term(depth[sp], choice_count(vary, f, model.groups), (hi.double() - lo.double()).index_select(0, ir))
        left = model.split_bits(Br, fr, rr, torch.zeros_like(fr, dtype=torch.bool))
        lc, rc = t.left[ps, cs].long(), t.right[ps, cs].long()
        h = heap[ps, cs]
        heap[ps, lc], heap[ps, rc] = 2 * h, 2 * h + 1
        po, co = torch.cat([ps, ps]), torch.cat([lc, rc])
        Bu = torch.cat([left, Br & ~left])
        inv = torch.cat([ir, ir + rules.shape[0]])
        order = torch.argsort(po * (C + 1) + co)
        po, co, inv = po.index_select(0, order), co.index_select(0, order), inv.index_select(0, order)
    return state
