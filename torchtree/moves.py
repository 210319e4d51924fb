"""Grow / prune / change / swap moves over complete trees (Chipman et al. 1998).

A *move* is one Markov transition proposal, applied to a whole batch of trees at
once (chains of an MCMC run or particles of an SMC sampler); every particle may
draw a different move type. There is no Python loop over particles or points:
the loops that remain run over tree depth levels.

State. A :class:`TreeState` holds the trees (:class:`~torchtree.trees.HardTrees`
with every leaf ``LEAF``), the leaf of every training point in every tree
(``assign [P, N]``) and two per-node caches in ``trees.extra``:

* ``term [P, C]`` float64: the node's additive share of the log posterior
  (split or stop probability, rule density, leaf log marginal likelihood);
  ``log pi(t) = sum(term) + global`` where ``global`` is the leaf-count term of
  the Poisson prior (zero for the Chipman prior);
* ``heap [P, C]`` int64: heap code of the node (root 1, children ``2h``, ``2h+1``)
  so "is node c below node j" is one shift and compare instead of a loop.

A move touches the subtree of one node ``j`` per particle: the points of that
subtree (found with one gather through ``assign``) are routed down the proposed
subtree, the new nodes' statistics, counts and data extents are recomputed from
those points only, and the log-posterior change is the sum of the new terms minus
the cached old ones. Work per move is proportional to the data under ``j``, not to
the data set.

Proposal ratios (``log q(t | t') - log q(t' | t)``, exact; ``b`` = number of
candidates, ``p_m`` = move-type probabilities, ``nv`` = varying dimensions of
the node's data, ``r`` = its extent in the split dimension):

* grow leaf ``l``: ``log p_prune - log p_grow + log b_leaves(t) - log b_prunable(t')
  + log nv_l + log r_l(f)`` (the rule is drawn as the prior draws it);
* prune node ``j``: the inverse expression with ``t`` and ``t'`` exchanged;
* change node ``j``: ``log r_j(f_new) - log r_j(f_old)`` (same node count, same
  ``nv``);
* swap parent/child rules: ``0`` (the set of parent-child pairs is unchanged).

A proposal whose result is impossible under the prior (an empty node, a leaf
with no varying dimension to grow, no candidate node) is flagged invalid: an MH
kernel rejects it with probability one, an SMC sampler keeps the particle with an
incremental weight of one (the kernel's atom at the current tree).
"""
from __future__ import annotations

import math
import warnings
from dataclasses import dataclass
from typing import Optional, Sequence

import torch

from .kernels.segments import rank_within
from .priors import ChipmanPrior
from .random import keyed_uniform
from .trees import INTERNAL, LEAF, OPEN, UNUSED, HardTrees

__all__ = [
    "MOVES", "GROW", "PRUNE", "CHANGE", "SWAP", "TreeModel", "TreeState", "Proposal",
    "propose", "draw_moves", "sample_prior_state", "subtree_mask",
]

# index_reduce (segment min / max) is a beta API in torch but stable in behaviour; it is
# several times faster than scatter_reduce on CPU for our [pairs, D] reductions.
warnings.filterwarnings("ignore", message=r"index_reduce\(\) is in beta")

MOVES = ("grow", "prune", "change", "swap")
GROW, PRUNE, CHANGE, SWAP = 0, 1, 2, 3
N_SLOTS = 5  # uniforms per particle and move: kind, node, dimension, cut, accept
_MAX_DEPTH = 60  # heap codes live in int64


# ----------------------------------------------------------------------------- model
class TreeModel:
    """The target of the samplers: prior x leaf likelihood on one data set.

    Parameters
    ----------
    prior : ChipmanPrior or PoissonPrior
    likelihood : DirichletMultinomial or NormalInverseGamma
    data : Data
    use_likelihood : bool
        False makes the target the prior (labels ignored).

    Attributes
    ----------
    pstats : Tensor [N, S] per-point sufficient statistics
    row_id : LongTensor [N] id of each distinct feature row (a node whose points
        share one row id has no varying dimension)
    split_prior : ChipmanPrior used for split/stop terms and initial draws
    """

    def __init__(self, prior, likelihood, data, use_likelihood: bool = True) -> None:
        if likelihood.task != data.task:
            raise ValueError(f"likelihood {likelihood!r} is for {likelihood.task} but the data is {data.task}")
        self.prior, self.likelihood, self.data = prior, likelihood, data
        self.use_likelihood = bool(use_likelihood)
        self.chipman = getattr(prior, "name", "chipman") == "chipman"
        self.split_prior = prior if self.chipman else ChipmanPrior()
        self.pstats = likelihood.point_stats(data.y, data.n_classes).to(likelihood.stats_dtype)
        _, self.row_id = torch.unique(data.X, dim=0, return_inverse=True)
        self.X = data.X

    @property
    def n_stats(self) -> int:
        """S."""
        return self.pstats.shape[1]

    def loglik(self, stats: torch.Tensor) -> torch.Tensor:
        """Leaf log marginal likelihood ``[..., S] -> [...]`` float64 (0 without likelihood)."""
        if not self.use_likelihood:
            return torch.zeros(stats.shape[:-1], dtype=torch.float64, device=stats.device)
        return self.likelihood.log_marginal(stats)

    def leaf_term(self, depth: torch.Tensor, nonconst: torch.Tensor, stats: torch.Tensor) -> torch.Tensor:
        """Per-leaf term: ``log(1 - p_split(depth))`` if the leaf could split, plus log l(Y)."""
        ll = self.loglik(stats)
        if not self.chipman:
            return ll
        _, lpn = self.split_prior.log_split_probs(depth)
        return ll + torch.where(nonconst, lpn, torch.zeros_like(lpn))

    def internal_term(self, depth: torch.Tensor, nvary: torch.Tensor, rng: torch.Tensor) -> torch.Tensor:
        """Per-split term: ``log p_split(depth) - log nv - log range`` (rule density, eq. 4-5)."""
        rule = -torch.log(nvary.clamp(min=1).double()) - torch.log(rng.double().clamp(min=1e-300))
        if not self.chipman:
            return rule
        lps, _ = self.split_prior.log_split_probs(depth)
        return lps + rule

    def global_term(self, n_leaves: torch.Tensor) -> torch.Tensor:
        """Whole-tree term: the Poisson prior's ``log p(m)`` (0 for the Chipman prior), [P] float64."""
        if self.chipman:
            return torch.zeros(n_leaves.shape, dtype=torch.float64, device=n_leaves.device)
        return self.prior.log_prob_leaves(n_leaves)


# ----------------------------------------------------------------------------- state
class TreeState:
    """Trees plus the per-point leaf assignment and per-node caches (see module doc).

    Parameters
    ----------
    trees : HardTrees [P] with ``extra["term"]`` and ``extra["heap"]``
    assign : LongTensor [P, N] leaf of each training point in each tree
    """

    def __init__(self, trees: HardTrees, assign: torch.Tensor) -> None:
        self.trees, self.assign = trees, assign

    @classmethod
    def roots(cls, model: TreeModel, n_trees: int, capacity: int = 16) -> "TreeState":
        """P root-only trees (the usual MCMC start)."""
        root = model.pstats.sum(0)
        trees = HardTrees.roots(n_trees, root, capacity=capacity, threshold_dtype=model.X.dtype, status=LEAF)
        dev = trees.device
        nonconst = torch.tensor(bool((model.row_id != model.row_id[0]).any()), device=dev)
        term = torch.zeros(n_trees, trees.capacity, dtype=torch.float64, device=dev)
        term[:, 0] = model.leaf_term(torch.zeros((), dtype=torch.int32, device=dev), nonconst, root)
        heap = torch.zeros(n_trees, trees.capacity, dtype=torch.long, device=dev)
        heap[:, 0] = 1
        trees.extra.update(term=term, heap=heap)
        return cls(trees, torch.zeros(n_trees, model.X.shape[0], dtype=torch.long, device=dev))

    @property
    def n_trees(self) -> int:
        """P."""
        return self.trees.n_trees

    def log_posterior(self, model: TreeModel) -> torch.Tensor:
        """Unnormalised log target of every tree, [P] float64 (from the caches)."""
        return self.trees.extra["term"].sum(1) + model.global_term(self.trees.n_leaves())

    def take_(self, index: torch.Tensor) -> None:
        """In-place gather of particles (resampling), ``self[i] = self[index[i]]``."""
        index = index.to(self.trees.device)
        moved = index != torch.arange(self.n_trees, device=index.device)
        self.trees.take_(index, moved)
        dst = moved.nonzero().squeeze(1)
        if dst.numel():
            self.assign[dst] = self.assign[index[dst]]

    def clone(self) -> "TreeState":
        """Deep copy."""
        return TreeState(self.trees.clone(), self.assign.clone())

    def accept_(self, prop: "Proposal", mask: torch.Tensor) -> None:
        """Move the particles in ``mask [P]`` to their proposed trees (in place)."""
        rows = mask.nonzero().squeeze(1)
        if rows.numel() == 0:
            return
        t, n = self.trees, prop.trees
        t.reserve(n.capacity)
        for name, old in t.node_fields().items():
            new = n.node_fields()[name]
            old[rows] = new[rows]
        t.n_nodes[rows] = n.n_nodes[rows]
        sel = mask[prop.pp]
        self.assign[prop.pp[sel], prop.nn[sel]] = prop.new_leaf[sel]
        pr = rows[prop.kind[rows] == PRUNE]
        if pr.numel():
            _compact_rows_(self, pr)


def _compact_rows_(state: TreeState, rows: torch.Tensor) -> None:
    """Close the holes a prune leaves, keeping node order (children stay after parents)."""
    t = state.trees
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
    state.assign[rows] = newidx.gather(1, state.assign[rows])


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


def _kth_true(mask: torch.Tensor, k: torch.Tensor) -> torch.Tensor:
    """Column of the k-th True of each row of ``mask [P, C]`` (k < count)."""
    return (mask.long().cumsum(1) > k[:, None]).long().argmax(1)


def _choose(mask: torch.Tensor, u: torch.Tensor):
    """Uniform choice of a True column per row; returns (column, count)."""
    cnt = mask.sum(1)
    k = torch.minimum((u * cnt.double()).long(), (cnt - 1).clamp(min=0))
    return _kth_true(mask, k), cnt


def _draw_rule(lo: torch.Tensor, hi: torch.Tensor, u_dim: torch.Tensor, u_cut: torch.Tensor):
    """Prior draw of a rule on a node with data extent ``lo, hi [P, D]``.

    Returns (feature [P], threshold [P] in the data dtype, n varying [P], range [P] float64).
    """
    vary = hi > lo
    f, nv = _choose(vary, u_dim)
    lo_f = lo.gather(1, f[:, None]).squeeze(1)
    hi_f = hi.gather(1, f[:, None]).squeeze(1)
    rng = hi_f.double() - lo_f.double()
    thr = (lo_f.double() + u_cut * rng).to(lo.dtype)
    # Rounding to the data dtype may land on the maximum: keep the right child non-empty.
    thr = torch.where(thr < hi_f, thr, torch.nextafter(hi_f, torch.full_like(hi_f, -math.inf)))
    return f, torch.maximum(thr, lo_f), nv, rng


# ------------------------------------------------------------------------- proposal
@dataclass
class Proposal:
    """Proposed trees for a batch and everything needed to accept or weight them.

    Attributes
    ----------
    trees : HardTrees [P] proposed trees (rows with ``valid == False`` are not meaningful)
    kind : LongTensor [P] move type (``GROW``, ``PRUNE``, ``CHANGE``, ``SWAP``)
    node : LongTensor [P] node whose subtree the move rewrote (grow: the leaf)
    valid : BoolTensor [P] the proposed tree has positive prior density
    log_target_ratio : Tensor [P] float64 ``log pi(t') - log pi(t)`` (0 where invalid)
    log_q_ratio : Tensor [P] float64 ``log q(t | t') - log q(t' | t)`` (0 where invalid)
    pp, nn, new_leaf : LongTensor [T] the affected (particle, point) pairs and their new leaves
    """

    trees: HardTrees
    kind: torch.Tensor
    node: torch.Tensor
    valid: torch.Tensor
    log_target_ratio: torch.Tensor
    log_q_ratio: torch.Tensor
    pp: torch.Tensor
    nn: torch.Tensor
    new_leaf: torch.Tensor

    @property
    def log_accept_ratio(self) -> torch.Tensor:
        """MH log acceptance ratio ``[P]`` (``-inf`` where invalid)."""
        r = self.log_target_ratio + self.log_q_ratio
        return torch.where(self.valid, r, torch.full_like(r, -math.inf))


def draw_moves(u_kind: torch.Tensor, move_probs: Sequence[float]) -> torch.Tensor:
    """Move type per particle from uniforms ``[P]`` and probabilities (grow, prune, change, swap)."""
    cp = torch.tensor(list(move_probs), dtype=torch.float64, device=u_kind.device).cumsum(0)
    cp = cp / cp[-1]
    return torch.searchsorted(cp, u_kind.double().contiguous(), right=True).clamp(max=3)


def propose(state: TreeState, model: TreeModel, kind: torch.Tensor, u: torch.Tensor,
            move_probs: Sequence[float] = (0.25, 0.25, 0.25, 0.25)) -> Proposal:
    """Propose one move per tree.

    Parameters
    ----------
    state : TreeState [P]
    model : TreeModel
    kind : LongTensor [P] move type per tree (see :func:`draw_moves`)
    u : Tensor [P, >=4] float64 uniforms: node choice, dimension, cut (columns 1-3)
    move_probs : 4 floats, the mixture probabilities (they enter the grow/prune ratio)

    Returns
    -------
    Proposal
    """
    trees = state.trees
    P, C = trees.n_trees, trees.capacity
    dev = trees.device
    X = model.X
    pg, pp_, _, _ = (float(x) for x in move_probs)
    st = trees.status
    leaf = (st == LEAF) | (st == OPEN)
    internal = st == INTERNAL
    lch, rch = trees.left.long(), trees.right.long()
    prunable = internal & leaf.gather(1, lch.clamp(min=0)) & leaf.gather(1, rch.clamp(min=0))
    swappable = internal & (trees.parent >= 0)
    kk = kind[:, None]
    cand = torch.where(kk == GROW, leaf, torch.where(kk == PRUNE, prunable, torch.where(kk == CHANGE, internal, swappable)))
    c, n_cand = _choose(cand, u[:, 1])
    has = n_cand > 0
    j = torch.where(kind == SWAP, trees.parent.long().gather(1, c[:, None]).squeeze(1), c)
    j = torch.where(has, j, torch.full_like(j, -1))
    jj = j.clamp(min=0)[:, None]
    in_old = subtree_mask(trees, j)

    # Affected points: those in the old subtree of j.
    base = torch.arange(P, device=dev)[:, None] * C
    pp, nn = in_old.view(-1)[base + state.assign].nonzero(as_tuple=True)

    # Phase 1: data extent of node j (its data are those points in any case).
    is_g, is_p, is_c, is_s = kind == GROW, kind == PRUNE, kind == CHANGE, kind == SWAP
    need1 = ~is_s.index_select(0, pp)
    p1, x1 = pp[need1], X.index_select(0, nn[need1])
    D = X.shape[1]
    lo1 = torch.full((P, D), math.inf, dtype=X.dtype, device=dev).index_reduce_(0, p1, x1, "amin")
    hi1 = torch.full((P, D), -math.inf, dtype=X.dtype, device=dev).index_reduce_(0, p1, x1, "amax")
    f_new, thr_new, nv1, rng_new = _draw_rule(lo1, hi1, u[:, 2], u[:, 3])
    fo = trees.feature.long().gather(1, jj).clamp(min=0)
    rng_old = (hi1.gather(1, fo).double() - lo1.gather(1, fo).double()).squeeze(1)
    valid = has & ~(is_g & (nv1 == 0))

    # Build the proposed trees.
    new = trees.clone()
    g_rows = (is_g & valid).nonzero().squeeze(1)
    if g_rows.numel():
        new.reserve(int(new.n_nodes[g_rows].max()) + 2)
        _apply_grow(new, g_rows, j[g_rows], f_new[g_rows], thr_new[g_rows])
    p_rows = (is_p & valid).nonzero().squeeze(1)
    if p_rows.numel():
        _apply_prune(new, p_rows, j[p_rows])
    c_rows = (is_c & valid).nonzero().squeeze(1)
    if c_rows.numel():
        new.feature[c_rows, j[c_rows]] = f_new[c_rows].to(new.feature.dtype)
        new.threshold[c_rows, j[c_rows]] = thr_new[c_rows]
    s_rows = (is_s & valid).nonzero().squeeze(1)
    if s_rows.numel():
        a, b = j[s_rows], c[s_rows]
        for fld in (new.feature, new.threshold):
            va, vb = fld[s_rows, a].clone(), fld[s_rows, b].clone()
            fld[s_rows, a], fld[s_rows, b] = vb, va
    C2 = new.capacity
    in_new = subtree_mask(new, torch.where(valid, j, torch.full_like(j, -1)))

    # Phase 2: route the affected points down the proposed subtree.
    keep = valid.index_select(0, pp)
    pp, nn = pp[keep], nn[keep]
    node = j.index_select(0, pp)
    depth_new = new.depth.long()
    dj = depth_new.gather(1, jj).squeeze(1)
    sp, sc = in_new.nonzero(as_tuple=True)  # nodes of the proposed subtrees, compact ids 0..M-1
    M = sp.numel()
    height = int((depth_new[sp, sc] - dj.index_select(0, sp)).max()) if M else 0
    f_fl, t_fl = new.feature.view(-1).long(), new.threshold.view(-1)
    lr = torch.stack([new.left.view(-1).long(), new.right.view(-1).long()], 1).view(-1)
    Xf = X.reshape(-1)
    for _ in range(height):
        g = pp * C2 + node
        f = f_fl.index_select(0, g)
        act = f >= 0
        right = (Xf.index_select(0, nn * D + f.clamp(min=0)) > t_fl.index_select(0, g)).long()
        node = torch.where(act, lr.index_select(0, 2 * g + right), node)
    new_leaf = node

    # Aggregates of the proposed subtree nodes: leaves from the points, then pushed up.
    S = model.n_stats
    cmap = torch.full((P * C2,), -1, dtype=torch.long, device=dev)
    sflat = sp * C2 + sc
    cmap[sflat] = torch.arange(M, device=dev)
    cid = cmap.index_select(0, pp * C2 + node)
    cnt = torch.zeros(M, dtype=torch.long, device=dev).index_add_(0, cid, torch.ones_like(cid))
    stats = torch.zeros(M, S, dtype=new.stats.dtype, device=dev).index_add_(0, cid, model.pstats.index_select(0, nn))
    rid = model.row_id.index_select(0, nn)
    rlo = torch.full((M,), X.shape[0], dtype=torch.long, device=dev).index_reduce_(0, cid, rid, "amin")
    rhi = torch.full((M,), -1, dtype=torch.long, device=dev).index_reduce_(0, cid, rid, "amax")
    lo = torch.full((M, D), math.inf, dtype=X.dtype, device=dev)
    hi = torch.full((M, D), -math.inf, dtype=X.dtype, device=dev)
    need2 = (is_c | is_s).index_select(0, pp)
    if bool(need2.any()):
        c2, x2 = cid[need2], X.index_select(0, nn[need2])
        lo.index_reduce_(0, c2, x2, "amin")
        hi.index_reduce_(0, c2, x2, "amax")
    st_s = new.status[sp, sc]
    is_leaf_s = (st_s == LEAF) | (st_s == OPEN)
    j_s = j.index_select(0, sp)
    if height > 0:
        lsel = is_leaf_s.nonzero().squeeze(1)
        lp_, lc_ = sp[lsel], sc[lsel]
        jl = j_s[lsel]
        src, dst = [], []
        anc, alive = lc_, lc_ != jl
        par_fl = new.parent.view(-1).long()
        for _ in range(height):
            # Climb from every leaf of the subtree up to j (inclusive), once per ancestor.
            anc = par_fl.index_select(0, lp_ * C2 + anc).clamp(min=0)
            src.append(lsel[alive])
            dst.append(cmap.index_select(0, lp_ * C2 + anc)[alive])
            alive = alive & (anc != jl)
        src, dst = torch.cat(src), torch.cat(dst)
        # Leaf aggregates are final before any accumulation (dst nodes are internal).
        cnt.index_add_(0, dst, cnt.index_select(0, src))
        stats.index_add_(0, dst, stats.index_select(0, src))
        lo.index_reduce_(0, dst, lo.index_select(0, src), "amin")
        hi.index_reduce_(0, dst, hi.index_select(0, src), "amax")
    # Node j of grow/change: its extent is phase 1's (its points were not in phase 2's D-work).
    gc = (is_g | is_c) & valid
    gc_s = gc.index_select(0, sp) & (sc == j_s)
    lo[gc_s] = lo1.index_select(0, sp[gc_s])
    hi[gc_s] = hi1.index_select(0, sp[gc_s])

    # New terms on the proposed subtree nodes.
    depth_s = new.depth[sp, sc]
    f_s = new.feature[sp, sc].long().clamp(min=0)[:, None]
    rng_s = hi.gather(1, f_s).squeeze(1).double() - lo.gather(1, f_s).squeeze(1).double()
    term_s = torch.where(is_leaf_s, model.leaf_term(depth_s, rlo < rhi, stats),
                         model.internal_term(depth_s, (hi > lo).sum(1), rng_s))
    empty = torch.zeros(P, dtype=torch.long, device=dev).index_add_(0, sp, (cnt == 0).long()) > 0
    valid = valid & ~empty
    old_term = trees.extra["term"]
    delta = torch.zeros(P, dtype=torch.float64, device=dev).index_add_(0, sp, term_s)
    delta = delta - torch.where(in_old, old_term, torch.zeros_like(old_term)).sum(1)
    leaf_new = (new.status == LEAF) | (new.status == OPEN)
    n_leaves_old, n_leaves_new = leaf.sum(1), leaf_new.sum(1)
    if not model.chipman:
        delta = delta + model.global_term(n_leaves_new) - model.global_term(n_leaves_old)
    new.extra["term"].view(-1)[sflat] = term_s
    new.stats.view(P * C2, S)[sflat] = stats

    # Proposal ratios.
    leaf_n = leaf_new
    prunable_new = (new.status == INTERNAL) & leaf_n.gather(1, new.left.long().clamp(min=0)) & leaf_n.gather(1, new.right.long().clamp(min=0))
    lg = lambda x: torch.log(x.double().clamp(min=1e-300))  # noqa: E731
    rule_j = lg(nv1) + lg(rng_new)
    log_q = torch.zeros(P, dtype=torch.float64, device=dev)
    log_q = torch.where(is_g, math.log(max(pp_, 1e-300) / max(pg, 1e-300)) + lg(n_leaves_old) - lg(prunable_new.sum(1)) + rule_j, log_q)
    log_q = torch.where(is_p, math.log(max(pg, 1e-300) / max(pp_, 1e-300)) + lg(prunable.sum(1)) - lg(n_leaves_new) - lg(nv1) - lg(rng_old), log_q)
    log_q = torch.where(is_c, lg(rng_new) - lg(rng_old), log_q)
    zero = torch.zeros_like(log_q)
    return Proposal(new, kind, j, valid, torch.where(valid, delta, zero), torch.where(valid, log_q, zero), pp, nn, new_leaf)


def _apply_grow(t: HardTrees, rows, j, f, thr) -> None:
    n0 = t.n_nodes[rows]
    t.feature[rows, j] = f.to(t.feature.dtype)
    t.threshold[rows, j] = thr.to(t.threshold.dtype)
    t.left[rows, j] = n0.to(t.left.dtype)
    t.right[rows, j] = (n0 + 1).to(t.right.dtype)
    t.status[rows, j] = INTERNAL
    d1 = t.depth[rows, j] + 1
    if int(d1.max()) > _MAX_DEPTH:
        raise RuntimeError(f"tree depth above {_MAX_DEPTH} is not supported (heap codes are int64)")
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
        t.extra["term"][rows, ch] = 0
        t.extra["heap"][rows, ch] = 0
    t.status[rows, j] = LEAF
    t.feature[rows, j] = -1
    t.threshold[rows, j] = 0
    t.left[rows, j] = -1
    t.right[rows, j] = -1


# ------------------------------------------------------------------- prior draws
def sample_prior_state(model: TreeModel, n_trees: int, seed: int, index: Optional[torch.Tensor] = None,
                       stream: int = 0, capacity: int = 16):
    """Draw complete trees from the Chipman prior, level by level, with the caches filled.

    Every open leaf of the current depth decides at once whether to split
    (probability ``p_split(depth)`` if its data vary in some dimension), then draws
    the dimension uniformly among the varying ones and the cut uniformly on the
    data range: exactly the prior of :class:`~torchtree.priors.ChipmanPrior`.
    The root's extent is computed once for all trees.

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

    Returns
    -------
    (TreeState [P], log_q0 [P] float64): the trees and their log density under the
    Chipman prior (the SMC initial proposal density).
    """
    state = TreeState.roots(model, n_trees, capacity)
    t = state.trees
    dev = t.device
    P, N = n_trees, model.X.shape[0]
    X, D = model.X, model.X.shape[1]
    gidx = torch.arange(P, device=dev) if index is None else index.to(dev)
    t.status[:, 0] = OPEN
    log_q0 = torch.zeros(P, dtype=torch.float64, device=dev)
    root_lo, root_hi = X.min(0).values, X.max(0).values
    arP = torch.arange(P, device=dev)[:, None]
    for level in range(_MAX_DEPTH + 1):
        C = t.capacity
        open_ = t.status == OPEN
        po, co = open_.nonzero(as_tuple=True)
        if po.numel() == 0:
            break
        gflat = arP * C + state.assign
        pp, nn = open_.view(-1)[gflat].nonzero(as_tuple=True)
        if level == 0:
            lo, hi = root_lo.expand(P, D), root_hi.expand(P, D)
        else:
            cmap = torch.full((P * C,), -1, dtype=torch.long, device=dev)
            cmap[po * C + co] = torch.arange(po.numel(), device=dev)
            cid = cmap.index_select(0, gflat[pp, nn])
            xs = X.index_select(0, nn)
            lo = torch.full((po.numel(), D), math.inf, dtype=X.dtype, device=dev).index_reduce_(0, cid, xs, "amin")
            hi = torch.full((po.numel(), D), -math.inf, dtype=X.dtype, device=dev).index_reduce_(0, cid, xs, "amax")
        nvary = (hi > lo).sum(1)
        depth = t.depth[po, co]
        lps, lpn = model.split_prior.log_split_probs(depth)
        key = gidx[po]
        u_stop = keyed_uniform(seed, stream + 4 * level, key, co)
        u_dim = keyed_uniform(seed, stream + 4 * level + 1, key, co)
        u_cut = keyed_uniform(seed, stream + 4 * level + 2, key, co)
        split = (u_stop < lps.exp()) & (nvary > 0)
        f, thr, nv, rng = _draw_rule(lo, hi, u_dim, u_cut)
        stop_q = torch.where(nvary > 0, lpn, torch.zeros_like(lpn))
        split_q = lps - torch.log(nv.clamp(min=1).double()) - torch.log(rng.clamp(min=1e-300))
        log_q0.index_add_(0, po, torch.where(split, split_q, stop_q))
        t_stop = model.leaf_term(depth, nvary > 0, t.stats[po, co])
        t_split = model.internal_term(depth, nv, rng)
        t.extra["term"][po, co] = torch.where(split, t_split, t_stop)
        t.status[po, co] = torch.where(split, INTERNAL, LEAF).to(t.status.dtype)
        sp = split.nonzero().squeeze(1)
        if sp.numel() == 0:
            break
        ps, cs = po[sp], co[sp]
        if level + 1 > _MAX_DEPTH:
            raise RuntimeError(f"tree depth above {_MAX_DEPTH} is not supported")
        per_tree = torch.bincount(ps, minlength=P)
        t.reserve(int((t.n_nodes + 2 * per_tree).max()))
        C = t.capacity
        r = rank_within(ps)
        n0 = t.n_nodes[ps] + 2 * r
        t.feature[ps, cs] = f[sp].to(t.feature.dtype)
        t.threshold[ps, cs] = thr[sp]
        t.left[ps, cs] = n0.to(t.left.dtype)
        t.right[ps, cs] = (n0 + 1).to(t.right.dtype)
        h = t.extra["heap"][ps, cs]
        for k in (0, 1):
            t.status[ps, n0 + k] = OPEN
            t.depth[ps, n0 + k] = t.depth[ps, cs] + 1
            t.parent[ps, n0 + k] = cs.to(t.parent.dtype)
            t.extra["heap"][ps, n0 + k] = 2 * h + k
        t.n_nodes += 2 * per_tree
        # Route the points of the split nodes to the children and sum their statistics.
        cur = state.assign[pp, nn]
        moving = t.status[pp, cur] == INTERNAL
        pm, nm, cm = pp[moving], nn[moving], cur[moving]
        right = (X[nm, t.feature[pm, cm].long()] > t.threshold[pm, cm]).long()
        child = t.left[pm, cm].long() + right
        state.assign[pm, nm] = child
        gch = pm * C + child
        S = model.n_stats
        t.stats.view(P * C, S).index_add_(0, gch, model.pstats[nm].to(t.stats.dtype))
    return state, log_q0
