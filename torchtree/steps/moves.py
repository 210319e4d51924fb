"""Grow / prune / change / swap moves over complete trees (Chipman et al. 1998).

A *move* is one Markov transition proposal applied to a whole batch of trees at
once (the chains of an MCMC run or the particles of an SMC sampler); every tree
may draw a different move type. There is no Python loop over trees or points:
the loops that remain run over tree depth levels or binary-search steps.

State. A :class:`TreeState` is a :class:`~torchtree.model.trees.HardTrees` (every leaf
``LEAF``) with three per-node fields in ``trees.extra``:

* ``term [P, C]`` float64: the node's additive share of the log posterior (split
  or stop probability, rule density, leaf log marginal likelihood), so that
  ``log pi(t) = sum(term) + global`` (``global``: the Poisson prior's leaf-count
  term, zero for the Chipman prior);
* ``heap [P, C]`` int64: heap code of the node (root 1, children ``2h``,
  ``2h + 1``): "is c below j" is one shift and compare, and the path from the root;
* ``thr_rank [P, C]`` int64: rank of the threshold among the distinct values of
  its feature (what routing compares with).

A move needs the training points of one node ``j`` per tree as a bitset (``W =
ceil(N / 64)`` int64 words): :meth:`TreeModel.node_bits` routes them down the path from the root
(one :meth:`~torchtree.model.target.TreeModel.split_bits` per level: the bucket table's
``W`` words plus the points of the cut's bucket), and the rewritten subtree's bitsets
follow top-down from ``j``'s. Only when ``P x W`` is small
(:meth:`~torchtree.model.target.TreeModel.keeps_bits`: a few chains, or small data) do the
trees keep every node's bitset in ``extra["bits"] [P, C, W]``, which saves the routing.

Data extents and per-node log posterior terms come from
:class:`~torchtree.model.target.TreeModel`; cut draws and densities from
:mod:`torchtree.steps.cut_proposals`.

Proposal ratios (``log q(t | t') - log q(t' | t)``, exact; ``b`` = number of
candidates, ``p_m`` = move-type probabilities, ``nv(f)`` = ``1 / P(column f)`` in the
node (its varying columns; :func:`~torchtree.model.feature_groups.choice_count` for a coded
table), ``r`` = its extent in the split dimension):

* grow leaf ``l``: ``log p_prune - log p_grow + log b_leaves(t) - log b_prunable(t')
  + log nv_l(f) - log q_cut(c)`` (the dimension is drawn as the prior draws it; with
  ``cut_proposal="prior"`` so is the cut, ``q_cut = 1 / r_l(f)``);
* prune node ``j``: the inverse expression with ``t`` and ``t'`` exchanged (``q_cut``
  of the removed cut);
* change node ``j``: ``log q_cut(c_old) - log q_cut(c_new) + log nv_j(f_new) - log nv_j(f_old)``
  (the last two cancel for a numeric table; ``log r_j(f_new) - log
  r_j(f_old)`` for the prior proposal; the ``"data"`` and ``"informed"`` proposals'
  densities depend only on node ``j``'s data, which the move does not change, so the
  same density serves the forward and the reverse move);
* swap parent / child rules: ``0`` (the set of parent-child pairs is unchanged;
  two internal children never carry identical rules with continuous cuts, so
  Chipman's "swap with both children" case has probability zero).

A proposal whose result is impossible under the prior (an empty node, a leaf with
no varying dimension to grow, no candidate node) is flagged invalid: an MH kernel
rejects it with probability one, an SMC sampler keeps the particle with an
incremental weight of one (the kernel's atom at the current tree).

Memory: the model's ``O(N D)`` tables, the trees' ``O(P C)`` fields, and ``O(P W)``
words of bitsets per move (the nodes ``j`` and the rewritten subtrees).
"""
from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Optional, Sequence

import torch

from torchtree.kernels.segments import rank_within
from torchtree.model.priors import ChipmanPrior
from torchtree.model.routing import routed_node_bits, subtree_bits
from torchtree.core.random import keyed_uniform
from torchtree.model.target import TreeModel, bit_of
from torchtree.steps import cut_proposals as cp
from torchtree.model.feature_groups import choice_count, choose_column
from torchtree.steps.cut_proposals import CUT_PROPOSALS, choose as _choose, prior_cut as _cut
from torchtree.model.trees import INTERNAL, LEAF, OPEN, UNUSED, HardTrees
from torchtree.core.validate import check_choice, check_probabilities

__all__ = [
    "MOVES", "GROW", "PRUNE", "CHANGE", "SWAP", "N_SLOTS", "TreeModel", "TreeState", "Proposal",
    "propose", "draw_moves", "sample_prior_state", "subtree_mask", "check_state", "CUT_PROPOSALS", "check_cut_proposal",
    "check_move_probs", "snapshot_trees",
]

MOVES = ("grow", "prune", "change", "swap")
GROW, PRUNE, CHANGE, SWAP = 0, 1, 2, 3
N_SLOTS = 5  # uniforms per tree and move: kind, node, dimension, cut, accept
MAX_DEPTH = 60  # heap codes live in int64


# ----------------------------------------------------------------------------- state
class TreeState:
    """A batch of complete trees with their per-node caches (see the module doc).

    Parameters
    ----------
    trees : HardTrees [P] with ``extra`` ``term``, ``heap``, ``thr_rank``
    """

    def __init__(self, trees: HardTrees) -> None:
        self.trees = trees

    @classmethod
    def roots(cls, model: TreeModel, n_trees: int, capacity: int = 16) -> "TreeState":
        """P root-only trees (the usual MCMC start)."""
        root = model.pstats[:, : model.S].sum(0)
        trees = HardTrees.roots(n_trees, root, capacity=capacity, threshold_dtype=model.X.dtype, status=LEAF)
        dev, C = trees.device, trees.capacity
        nonconst = model.nonconst(model.all_bits[None])[0]
        term = torch.zeros(n_trees, C, dtype=torch.float64, device=dev)
        term[:, 0] = model.leaf_term(torch.zeros((), dtype=torch.int32, device=dev), nonconst, root)
        heap = torch.zeros(n_trees, C, dtype=torch.long, device=dev)
        heap[:, 0] = 1
        trees.extra.update(term=term, heap=heap, thr_rank=torch.zeros(n_trees, C, dtype=torch.long, device=dev))
        if model.keeps_bits(n_trees, C):  # few or small trees: keep every node's bitset (no routing from the root)
            trees.extra["bits"] = torch.zeros(n_trees, C, model.W, dtype=torch.long, device=dev)
            trees.extra["bits"][:, 0] = model.all_bits
        return cls(trees)

    @property
    def n_trees(self) -> int:
        """P."""
        return self.trees.n_trees

    def log_posterior(self, model: TreeModel) -> torch.Tensor:
        """Unnormalised log target of every tree, [P] float64 (from the caches)."""
        return self.trees.extra["term"].sum(1) + model.global_term(self.trees.n_leaves())

    def log_likelihood(self, model: TreeModel) -> torch.Tensor:
        """Sum of the leaf log marginal likelihoods of every tree, [P] float64."""
        t = self.trees
        return torch.where(t.is_leaf(), model.loglik(t.stats), torch.zeros((), dtype=torch.float64, device=t.device)).sum(1)

    def node_bitsets(self, model: TreeModel) -> torch.Tensor:
        """Bitsets of the training points in every node slot, ``[P, C, W]`` (unused slots:
        the root's points). For tests and debugging: the moves route on demand
        (:meth:`TreeModel.node_bits`) rather than keep them."""
        t, P = self.trees, self.trees.n_trees
        slots = [model.node_bits(t, torch.full((P,), c, dtype=torch.long, device=t.device)) for c in range(t.capacity)]
        return torch.stack(slots, 1)

    def take_(self, index: torch.Tensor) -> None:
        """In-place gather of particles (resampling), ``self[i] = self[index[i]]``."""
        self.trees.take_(index)

    def clone(self) -> "TreeState":
        """Deep copy."""
        return TreeState(self.trees.clone())

    def accept_(self, prop: "Proposal", mask: torch.Tensor) -> None:
        """Move the trees in ``mask [P]`` to their proposed trees (in place)."""
        rows = mask.nonzero().squeeze(1)
        if rows.numel() == 0:
            return
        t, n = self.trees, prop.trees
        t.reserve(n.capacity)
        nf = n.node_fields()
        for name, old in t.node_fields().items():
            if name in nf:
                old[rows] = nf[name].index_select(0, rows)
        t.n_nodes[rows] = n.n_nodes.index_select(0, rows)
        if "bits" in t.extra:
            sel = mask.index_select(0, prop.sub_tree)
            t.extra["bits"][prop.sub_tree[sel], prop.sub_node[sel]] = prop.sub_bits[sel]
        pr = rows[prop.kind.index_select(0, rows) == PRUNE]
        if pr.numel():
            _compact_rows_(t, pr)


def _compact_rows_(t: HardTrees, rows: torch.Tensor) -> None:
    """Close the holes a prune leaves, keeping node order (children stay after parents)."""
    used = t.status[rows] != UNUSED  # [R, C]
    newidx = used.long().cumsum(1) - 1
    src = torch.argsort((~used).to(torch.int8), dim=1, stable=True)  # used slots first, in order
    n_used = used.sum(1)
    keep = torch.arange(t.capacity, device=t.device)[None, :] < n_used[:, None]
    fill = {"feature": -1, "left": -1, "right": -1, "parent": -1}
    for name, field in t.node_fields().items():
        sub = field[rows]
        idx = src.view(src.shape + (1,) * (sub.dim() - 2)).expand_as(sub)
        g = sub.gather(1, idx)
        if name in ("left", "right", "parent"):
            g = torch.where(g >= 0, newidx.gather(1, g.long().clamp(min=0)).to(g.dtype), g)
        k = keep.view(keep.shape + (1,) * (sub.dim() - 2))
        field[rows] = torch.where(k, g, torch.full_like(g, fill.get(name, 0)))
    t.n_nodes[rows] = n_used


def subtree_mask(trees: HardTrees, node: torch.Tensor) -> torch.Tensor:
    """Nodes in the subtree rooted at ``node[p]`` (``-1``: none), via heap codes.

    Parameters
    ----------
    trees : HardTrees [P] with ``extra["heap"]``
    node : LongTensor [P]

    Returns
    -------
    BoolTensor [P, C]
    """
    heap, depth = trees.extra["heap"], trees.depth.long()
    j = node.clamp(min=0)[:, None]
    hj, dj = heap.gather(1, j), depth.gather(1, j)
    shift = (depth - dj).clamp(min=0)
    return (node[:, None] >= 0) & (trees.status != UNUSED) & (depth >= dj) & ((heap >> shift) == hj)


def check_state(state: TreeState, model: TreeModel, atol: float = 1e-6) -> None:
    """Assert that the caches agree with the trees (tests and debugging).

    Checks ``HardTrees.validate`` with the data, that every leaf's bitset
    (:meth:`TreeModel.node_bits`) is the set of training points routed to it, and that the
    cached log posterior equals the prior's ``log_prob`` plus the leaf log likelihoods.
    """
    t = state.trees
    t.validate(model.data, model.likelihood)
    leaves = t.leaf_index(model.X)  # [P, N]
    word, val = bit_of(torch.arange(model.N, device=t.device))
    P, C = t.n_trees, t.capacity
    rec = torch.zeros(P, C, model.W, dtype=torch.long, device=t.device)
    rec.view(P * C, model.W).index_put_(((torch.arange(P, device=t.device)[:, None] * C + leaves).reshape(-1), word.repeat(P)), val.repeat(P), accumulate=True)
    leaf = t.is_leaf()
    assert bool((rec[leaf] == state.node_bitsets(model)[leaf]).all()), "leaf bitsets differ from the routed points"
    internal = t.status == INTERNAL
    pi, ni = internal.nonzero(as_tuple=True)
    if pi.numel():
        r = model.threshold_rank(t.feature[pi, ni].long(), t.threshold[pi, ni])
        assert bool((r == t.extra["thr_rank"][pi, ni]).all()), "threshold ranks out of date"
    ll = torch.where(leaf, model.loglik(t.stats), torch.zeros((), dtype=torch.float64, device=t.device)).sum(1)
    full = model.prior.log_prob(t, model.data) + (ll if model.use_likelihood else 0.0)
    assert torch.allclose(state.log_posterior(model), full, atol=atol, rtol=1e-9), "cached log posterior differs from a full recomputation"


# ------------------------------------------------------------------------- proposal
@dataclass
class Proposal:
    """Proposed trees for a batch and what is needed to accept or weight them.

    Attributes
    ----------
    trees : HardTrees [P] proposed trees (rows with ``valid == False`` are not meaningful)
    kind : LongTensor [P] move type (``GROW``, ``PRUNE``, ``CHANGE``, ``SWAP``)
    node : LongTensor [P] root of the rewritten subtree (grow: the leaf; swap: the parent)
    valid : BoolTensor [P] the proposed tree has positive prior density
    log_target_ratio : Tensor [P] float64 ``log pi(t') - log pi(t)`` (0 where invalid)
    log_q_ratio : Tensor [P] float64 ``log q(t | t') - log q(t' | t)`` (0 where invalid)
    log_lik_ratio : Tensor [P] float64 the likelihood part of ``log_target_ratio`` (for tempering)
    sub_tree, sub_node : LongTensor [M] the nodes of the rewritten subtrees
    sub_bits : LongTensor [M, W] their bitsets
    """

    trees: HardTrees
    kind: torch.Tensor
    node: torch.Tensor
    valid: torch.Tensor
    log_target_ratio: torch.Tensor
    log_q_ratio: torch.Tensor
    log_lik_ratio: torch.Tensor
    sub_tree: torch.Tensor
    sub_node: torch.Tensor
    sub_bits: torch.Tensor

    @property
    def log_accept_ratio(self) -> torch.Tensor:
        """MH log acceptance ratio ``[P]`` (``-inf`` where invalid)."""
        r = self.log_target_ratio + self.log_q_ratio
        return torch.where(self.valid, r, torch.full_like(r, -math.inf))


def draw_moves(u_kind: torch.Tensor, move_probs: Sequence[float]) -> torch.Tensor:
    """Move type per tree from uniforms ``[P]`` and probabilities (grow, prune, change, swap)."""
    return torch.searchsorted(_cumulative(move_probs, u_kind.device), u_kind.double().contiguous(), right=True).clamp(max=3)


_CUMULATIVE: dict = {}  # (probabilities, device) -> normalised cumulative sums, made once (a host copy syncs a GPU)


def _cumulative(move_probs: Sequence[float], device) -> torch.Tensor:
    key = (tuple(move_probs), device)
    if key not in _CUMULATIVE:
        c = [sum(float(p) for p in move_probs[:i + 1]) for i in range(len(move_probs))]
        _CUMULATIVE[key] = torch.tensor([v / c[-1] for v in c], dtype=torch.float64, device=device)
    return _CUMULATIVE[key]


def check_move_probs(move_probs: Sequence[float]) -> tuple:
    """Validate mixture probabilities (grow, prune, change, swap); returns them normalised (4 floats)."""
    mp = check_probabilities("move_probs (grow, prune, change, swap)", move_probs, 4)
    if (mp[0] > 0) != (mp[1] > 0):
        raise ValueError("grow and prune must both have positive probability (each is the other's reverse move)")
    return mp


def snapshot_trees(trees: HardTrees) -> HardTrees:
    """Copy of ``trees`` [P] without the moves' per-node caches (``extra``): what a posterior keeps."""
    return HardTrees(trees.feature.clone(), trees.threshold.clone(), trees.left.clone(), trees.right.clone(),
                     trees.parent.clone(), trees.depth.clone(), trees.status.clone(), trees.stats.clone(),
                     trees.n_nodes.clone())


def check_cut_proposal(cut_proposal: str) -> str:
    """Validate a ``cut_proposal`` option (see :func:`propose`)."""
    return check_choice("cut_proposal", cut_proposal, CUT_PROPOSALS)


def propose(state: TreeState, model: TreeModel, kind: torch.Tensor, u: torch.Tensor,
            move_probs: Sequence[float] = (0.25, 0.25, 0.25, 0.25), cut_proposal: str = "prior") -> Proposal:
    """Propose one move per tree.

    Parameters
    ----------
    state : TreeState [P]
    model : TreeModel
    kind : LongTensor [P] move type per tree (see :func:`draw_moves`)
    u : Tensor [P, >= 4] float64 uniforms; columns 1-3 choose the node, the dimension, the cut
    move_probs : 4 floats, the mixture probabilities (they enter the grow / prune ratio)
    cut_proposal : {"prior", "data", "informed"}
        How grow and change draw the cut in the chosen dimension: ``"prior"`` uniform on
        the node's data range ``[lo, hi)`` (density ``1 / (hi - lo)``, which cancels the
        prior's rule density); ``"data"`` a gap between consecutive distinct values of
        the dimension uniform among those in the range, then uniform in the gap (density
        ``1 / (n_gaps * gap width)`` on the same support); ``"informed"`` one of
        ``cut_proposals.INFORMED_CELLS`` equal cells of the range drawn with probability
        ``(1 - eps) softmax(score) + eps / G``, the score being the log likelihood of the
        node split at the cell's midpoint into two leaves, then uniform in the cell
        (:func:`torchtree.steps.cut_proposals.informed_cell_logp`). The target is the same; the ratio then
        carries prior density / proposal density of the new cut and the inverse for the
        removed one.

    Returns
    -------
    Proposal
    """
    trees = state.trees
    P = trees.n_trees
    dev = trees.device
    pg, pq = float(move_probs[0]), float(move_probs[1])
    ar = torch.arange(P, device=dev)
    st = trees.status
    leaf = (st == LEAF) | (st == OPEN)
    internal = st == INTERNAL
    lch, rch = trees.left.long(), trees.right.long()
    prunable = internal & leaf.gather(1, lch.clamp(min=0)) & leaf.gather(1, rch.clamp(min=0))
    kk = kind[:, None]
    cand = torch.where(kk == GROW, leaf, torch.where(kk == PRUNE, prunable, torch.where(kk == CHANGE, internal, internal & (trees.parent >= 0))))
    c, n_cand = _choose(cand, u[:, 1])
    has = n_cand > 0
    is_g, is_p, is_c, is_s = kind == GROW, kind == PRUNE, kind == CHANGE, kind == SWAP
    j = torch.where(is_s, trees.parent.long().gather(1, c[:, None]).squeeze(1), c)
    j = torch.where(has, j, torch.full_like(j, -1))
    jc = j.clamp(min=0)
    in_old = subtree_mask(trees, j)

    # Phase 1: node j's data (unchanged by any move): varying dimensions, new rule, old rule's range.
    if "bits" in trees.extra:
        Bj = trees.extra["bits"][ar, jc]
        vary_j = model.varying(Bj)
    else:  # routed: trees that share node j's path share its bitset and varying dimensions
        Bu, iu = routed_node_bits(model, trees, jc)
        Bj, vary_j = Bu.index_select(0, iu), model.varying(Bu).index_select(0, iu)
    nv1 = vary_j.sum(1)
    f_new, n_new = choose_column(vary_j, u[:, 2], model.groups)
    feat = trees.feature.long()
    f_old = feat.gather(1, jc[:, None]).squeeze(1).clamp(min=0)
    f_swp = feat.gather(1, c[:, None]).squeeze(1).clamp(min=0)  # the rule j receives in a swap
    # 1 / P(column) of the new, the old and the swapped-in rule (nv1 each for a numeric table)
    n_old, n_swp = choice_count(vary_j, f_old, model.groups), choice_count(vary_j, f_swp, model.groups)
    # Extents of j in the dimensions of the new, the old and the swapped-in rule, each only
    # where the tree's move uses it (grow / change, prune / change, swap).
    need = torch.stack([is_g | is_c, is_p | is_c, is_s]) & has  # [3, P]
    lo3, hi3, rlo3, rhi3 = model.extent_ranks_where(Bj, torch.stack([f_new, f_old, f_swp]), need)
    rng3 = hi3.double() - lo3.double()
    rng_new, rng_old, rng_swp = rng3[:P], rng3[P:2 * P], rng3[2 * P:]
    if check_cut_proposal(cut_proposal) == "data":
        # log q of the new cut and of the removed one (prune / change) under the gap proposal.
        thr_new, r_new, lqc_new = cp.gap_cut(model, f_new, rlo3[:P], rhi3[:P], u[:, 3])
        r_old = trees.extra["thr_rank"].gather(1, jc[:, None]).squeeze(1)
        lqc_old = cp.log_gap_density(model, f_old, r_old, rlo3[P:2 * P], rhi3[P:2 * P])
    elif cut_proposal == "informed":
        # Both densities in one batched call: the new cut on (j, f_new), the old one on (j, f_old).
        lp = torch.full((2 * P, cp.INFORMED_CELLS), -math.log(cp.INFORMED_CELLS), dtype=torch.float64, device=dev)
        rows = need[:2].reshape(-1).nonzero().squeeze(1)
        lp[rows] = cp.informed_cell_logp(model, Bj.index_select(0, rows % P), torch.cat([f_new, f_old])[rows],
                                         lo3[rows], hi3[rows])
        thr_new, r_new, lqc_new = cp.informed_cut(model, lp[:P], f_new, lo3[:P], hi3[:P], u[:, 3])
        thr_old = trees.threshold.gather(1, jc[:, None]).squeeze(1)
        lqc_old = cp.informed_log_density(lp[P:], thr_old, lo3[P:2 * P], hi3[P:2 * P])
    else:
        thr_new, _ = _cut(lo3[:P], hi3[:P], u[:, 3])
        r_new = model.threshold_rank(f_new, thr_new)
        lqc_new, lqc_old = -torch.log(rng_new.clamp(min=1e-300)), -torch.log(rng_old.clamp(min=1e-300))
    valid = has & ~(is_g & (nv1 == 0))

    # The proposed trees (only the rewritten subtree's bitsets are built, below).
    new = HardTrees(trees.feature.clone(), trees.threshold.clone(), trees.left.clone(), trees.right.clone(),
                    trees.parent.clone(), trees.depth.clone(), trees.status.clone(), trees.stats.clone(),
                    trees.n_nodes.clone(), {k: v.clone() for k, v in trees.extra.items() if k != "bits"})
    rows = (is_g & valid).nonzero().squeeze(1)
    if rows.numel():
        new.reserve(int(new.n_nodes.index_select(0, rows).max()) + 2)
        _apply_grow(new, rows, j[rows], f_new[rows], thr_new[rows], r_new[rows])
    rows = (is_p & valid).nonzero().squeeze(1)
    if rows.numel():
        _apply_prune(new, rows, j[rows])
    rows = (is_c & valid).nonzero().squeeze(1)
    if rows.numel():
        new.feature[rows, j[rows]] = f_new[rows].to(new.feature.dtype)
        new.threshold[rows, j[rows]] = thr_new[rows]
        new.extra["thr_rank"][rows, j[rows]] = r_new[rows]
    rows = (is_s & valid).nonzero().squeeze(1)
    if rows.numel():
        a, b = j[rows], c[rows]
        for fld in (new.feature, new.threshold, new.extra["thr_rank"]):
            va, vb = fld[rows, a].clone(), fld[rows, b].clone()
            fld[rows, a], fld[rows, b] = vb, va
    C2 = new.capacity
    in_new = subtree_mask(new, torch.where(valid, j, torch.full_like(j, -1)))

    # Phase 2: bitsets of the proposed subtree, top-down from j (whose points are unchanged).
    sp, sc, Bs, alive = subtree_bits(model, new, in_new, valid, jc, Bj)
    valid = alive  # a proposal that empties a node has zero prior density
    sflat = sp * C2 + sc
    M = sp.numel()
    depth_s = new.depth.view(-1).index_select(0, sflat)
    rel = depth_s.long() - new.depth.long().gather(1, jc[:, None]).squeeze(1).index_select(0, sp)
    f_fl = new.feature.view(-1).long()
    ext = model.node_stats(Bs)
    stats = ext[:, : model.S]
    st_s = new.status.view(-1).index_select(0, sflat)
    is_leaf_s = (st_s == LEAF) | (st_s == OPEN)
    li, ii = is_leaf_s.nonzero().squeeze(1), (~is_leaf_s).nonzero().squeeze(1)
    term_s = torch.empty(M, dtype=torch.float64, device=dev)
    ll_s = model.loglik(stats[li])
    term_s[li] = model.leaf_term(depth_s[li], model.nonconst(Bs[li]), stats[li])
    # Internal node j keeps its data: its varying dimensions and range are phase 1's.
    jt = ii[rel.index_select(0, ii) == 0]
    pj = sp.index_select(0, jt)
    rng_j = torch.where(is_s, rng_swp, rng_new).index_select(0, pj)
    term_s[jt] = model.internal_term(depth_s.index_select(0, jt), torch.where(is_s, n_swp, n_new).index_select(0, pj), rng_j)
    ii = ii[rel.index_select(0, ii) > 0]
    if ii.numel():
        Bi, fi = Bs[ii], f_fl.index_select(0, sflat[ii])
        lo_i, hi_i = model.extent(Bi, fi)
        term_s[ii] = model.internal_term(depth_s[ii], choice_count(model.varying(Bi), fi, model.groups),
                                         hi_i.double() - lo_i.double())
    old_term = trees.extra["term"]
    delta = torch.zeros(P, dtype=torch.float64, device=dev).index_add_(0, sp, term_s)
    delta = delta - torch.where(in_old, old_term, torch.zeros_like(old_term)).sum(1)
    leaf_new = (new.status == LEAF) | (new.status == OPEN)
    n_leaves_old, n_leaves_new = leaf.sum(1), leaf_new.sum(1)
    if not model.chipman:
        delta = delta + model.global_term(n_leaves_new) - model.global_term(n_leaves_old)
    d_ll = torch.zeros(P, dtype=torch.float64, device=dev).index_add_(0, sp.index_select(0, li), ll_s)
    op, oc = (in_old & leaf).nonzero(as_tuple=True)
    d_ll = d_ll.index_add_(0, op, -model.loglik(trees.stats[op, oc]))
    new.extra["term"].view(-1)[sflat] = term_s
    new.stats.view(P * C2, model.S)[sflat] = stats.to(new.stats.dtype)

    # Proposal ratios.
    prunable_new = (new.status == INTERNAL) & leaf_new.gather(1, new.left.long().clamp(min=0)) & leaf_new.gather(1, new.right.long().clamp(min=0))
    lg = lambda x: torch.log(x.double().clamp(min=1e-300))  # noqa: E731
    lgp = math.log(max(pq, 1e-300) / max(pg, 1e-300))
    log_q = torch.zeros(P, dtype=torch.float64, device=dev)
    log_q = torch.where(is_g, lgp + lg(n_leaves_old) - lg(prunable_new.sum(1)) + lg(n_new) - lqc_new, log_q)
    log_q = torch.where(is_p, -lgp + lg(prunable.sum(1)) - lg(n_leaves_new) - lg(n_old) + lqc_old, log_q)
    log_q = torch.where(is_c, lqc_old - lqc_new + (lg(n_new) - lg(n_old)), log_q)
    zero = torch.zeros_like(log_q)
    return Proposal(new, kind, j, valid, torch.where(valid, delta, zero), torch.where(valid, log_q, zero),
                    torch.where(valid, d_ll, zero), sp, sc, Bs)


def _apply_grow(t: HardTrees, rows, j, f, thr, r) -> None:
    n0 = t.n_nodes[rows]
    t.feature[rows, j] = f.to(t.feature.dtype)
    t.threshold[rows, j] = thr.to(t.threshold.dtype)
    t.extra["thr_rank"][rows, j] = r
    t.left[rows, j] = n0.to(t.left.dtype)
    t.right[rows, j] = (n0 + 1).to(t.right.dtype)
    t.status[rows, j] = INTERNAL
    d1 = t.depth[rows, j] + 1
    if int(d1.max()) > MAX_DEPTH:
        raise RuntimeError(f"tree depth above {MAX_DEPTH} is not supported (heap codes are int64)")
    h = t.extra["heap"][rows, j]
    for k in (0, 1):
        c = n0 + k
        t.status[rows, c] = LEAF
        t.depth[rows, c] = d1
        t.parent[rows, c] = j.to(t.parent.dtype)
        t.extra["heap"][rows, c] = 2 * h + k
    t.n_nodes[rows] = n0 + 2


def _apply_prune(t: HardTrees, rows, j) -> None:
    for ch in (t.left[rows, j].long(), t.right[rows, j].long()):
        t.status[rows, ch] = UNUSED
        t.parent[rows, ch] = -1
        t.depth[rows, ch] = 0
        t.stats[rows, ch] = 0
        for v in t.extra.values():
            v[rows, ch] = 0
    t.status[rows, j] = LEAF
    t.feature[rows, j] = -1
    t.threshold[rows, j] = 0
    t.left[rows, j] = -1
    t.right[rows, j] = -1


# ------------------------------------------------------------------- prior draws
def sample_prior_state(model: TreeModel, n_trees: int, seed: int, index: Optional[torch.Tensor] = None,
                       stream: int = 0, capacity: int = 16, draw_prior: Optional[ChipmanPrior] = None):
    """Draw complete trees from the Chipman prior, level by level, with the caches filled.

    Every open leaf of the current depth decides at once whether to split
    (probability ``p_split(depth)`` if its data vary in some dimension), then draws
    the dimension uniformly among the varying ones and the cut uniformly on the data
    range: exactly the prior of :class:`~torchtree.model.priors.ChipmanPrior`.

    Parameters
    ----------
    model : TreeModel (its ``split_prior`` is sampled; its own prior gives the cached terms)
    n_trees : int
        P.
    seed : int
    index : LongTensor [P], optional
        Global particle indices that key the random draws (default ``arange(P)``).
    stream : int
        Offset of the random streams (use distinct values for distinct draws).
    capacity : int
        Initial node capacity.
    draw_prior : ChipmanPrior, optional
        Sample this prior instead of ``model.split_prior`` (e.g. one with larger trees,
        as an SMC initial proposal); the cached terms are still the model's.

    Returns
    -------
    (TreeState [P], log_q0 [P] float64): the trees and their log density under the
    prior they were drawn from (the SMC initial proposal density).
    """
    sampler = draw_prior if draw_prior is not None else model.split_prior
    state = TreeState.roots(model, n_trees, capacity)
    t = state.trees
    dev, P = t.device, n_trees
    gidx = torch.arange(P, device=dev) if index is None else index.to(dev)
    t.status[:, 0] = OPEN
    log_q0 = torch.zeros(P, dtype=torch.float64, device=dev)
    root_vary = model.varying(model.all_bits[None])
    # the open nodes (p-major, slots ascending, as a nonzero() of the status lists them) and their bitsets
    po, co, B = torch.arange(P, device=dev), torch.zeros(P, dtype=torch.long, device=dev), model.all_bits[None].expand(P, -1)
    for level in range(MAX_DEPTH + 1):
        C = t.capacity
        if po.numel() == 0:
            break
        g = po * C + co
        can = model.nonconst(B)
        depth = t.depth.view(-1).index_select(0, g)
        lps, lpn = sampler.log_split_probs(depth)
        key = gidx.index_select(0, po)
        u_stop = keyed_uniform(seed, stream + 4 * level, key, co)
        split = (u_stop < lps.exp()) & can
        stop = ~split
        st_q = torch.where(can, lpn, torch.zeros_like(lpn))
        log_q0.index_add_(0, po[stop], st_q[stop])
        t.extra["term"].view(-1)[g[stop]] = model.leaf_term(depth[stop], can[stop], t.stats.view(P * C, -1)[g[stop]])
        t.status.view(-1)[g] = torch.where(split, INTERNAL, LEAF).to(t.status.dtype)
        sp = split.nonzero().squeeze(1)
        if sp.numel() == 0:
            break
        if level + 1 > MAX_DEPTH:
            raise RuntimeError(f"tree depth above {MAX_DEPTH} is not supported")
        ps, cs, gs, Bsp = po[sp], co[sp], g[sp], B[sp]
        u_dim = keyed_uniform(seed, stream + 4 * level + 1, key[sp], cs)
        u_cut = keyed_uniform(seed, stream + 4 * level + 2, key[sp], cs)
        vary = root_vary.expand(sp.numel(), -1) if level == 0 else model.varying(Bsp)
        f, thr, r, nv, rng = cp.draw_rule(model, Bsp, vary, u_dim, u_cut)
        log_q0.index_add_(0, ps, lps[sp] - torch.log(nv.double()) - torch.log(rng.clamp(min=1e-300)))
        t.extra["term"].view(-1)[gs] = model.internal_term(depth[sp], nv, rng)
        per_tree = torch.bincount(ps, minlength=P)
        t.reserve(int((t.n_nodes + 2 * per_tree).max()))
        C = t.capacity
        n0 = t.n_nodes.index_select(0, ps) + 2 * rank_within(ps)
        t.feature[ps, cs] = f.to(t.feature.dtype)
        t.threshold[ps, cs] = thr
        t.extra["thr_rank"][ps, cs] = r
        t.left[ps, cs] = n0.to(t.left.dtype)
        t.right[ps, cs] = (n0 + 1).to(t.right.dtype)
        h = t.extra["heap"][ps, cs]
        left = model.split_bits(Bsp, f, r, torch.zeros_like(f, dtype=torch.bool))
        children = (left, Bsp & ~left)
        for k in (0, 1):
            t.status[ps, n0 + k] = OPEN
            t.depth[ps, n0 + k] = depth[sp] + 1
            t.parent[ps, n0 + k] = cs.to(t.parent.dtype)
            t.extra["heap"][ps, n0 + k] = 2 * h + k
            t.stats[ps, n0 + k] = model.node_stats(children[k])[:, : model.S].to(t.stats.dtype)
            if "bits" in t.extra:
                t.extra["bits"][ps, n0 + k] = children[k]
        t.n_nodes += 2 * per_tree
        po, co = torch.cat([ps, ps]), torch.cat([n0, n0 + 1])
        order = torch.argsort(po * (C + 1) + co)
        po, co, B = po.index_select(0, order), co.index_select(0, order), torch.cat(children).index_select(0, order)
    return state, log_q0
