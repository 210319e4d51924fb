"""One tree of a BART sum-of-trees, redrawn on its partial residual, batched over chains.

:func:`tree_update` is Bayesian backfitting's step for tree ``t`` (Chipman et al. 2010): a
grow / prune / change Metropolis-Hastings move with the leaf values integrated out, then a
Gibbs draw of every leaf value; all chains at once, no loop over chains or points.
:func:`draw_sigma` and :func:`draw_latent` are the noise-variance and probit-latent Gibbs
steps. Trees are heap arrays (:mod:`torchtree.model.bart`).

The move proposal: with probabilities ``p_grow, p_prune, p_change`` the move type; grow picks
a leaf uniformly and a rule from the prior at that leaf, prune and change pick a node whose
two children are leaves uniformly (change: a new rule from the prior). A move that cannot be
made (a leaf at ``max_depth`` or without cuts left, no such node) leaves the tree as it is.
With the rule drawn from its prior, the rule's probability cancels from every ratio.
"""
from __future__ import annotations

import math
from typing import Optional, Tuple

import torch

from torchtree.kernels import native
from torchtree.model.bart import ABSENT, LEAF, BartPrior, heap_depth
from torchtree.model.feature_groups import choose_column

__all__ = ["MOVE_PROBS", "SUM_LANES", "log_marginal", "tree_update", "warm_tables", "tree_update_native", "sweep_native", "gfr_sweep_native", "prior_tables", "draw_sigma", "draw_latent", "truncated_normal", "draw_utilities", "gamma_from_uniforms",
           "leaf_ranges", "pick_nth"]

#: probabilities of grow, prune and change
MOVE_PROBS = (0.25, 0.25, 0.5)
GROW, PRUNE, CHANGE = 0, 1, 2
#: a (leaf, side) cell's residual sum is this many partial sums over interleaved points, added in order
#: (the compiled sweep's ``LANES``): one summation order for the reference and the kernels
SUM_LANES = 4


def log_marginal(n: torch.Tensor, s: torch.Tensor, sigma2: torch.Tensor, tau2: float) -> torch.Tensor:
    """Log marginal likelihood of a leaf's residuals with its value ~ N(0, tau2) integrated out,
    up to terms that are the same for every partition of the points:
    ``-0.5 log(1 + n tau2 / sigma2) + tau2 s^2 / (2 sigma2 (sigma2 + n tau2))``.

    Parameters
    ----------
    n, s : Tensor [...] count and sum of the residuals
    sigma2 : Tensor broadcastable
    """
    v = sigma2 + n * tau2
    return -0.5 * torch.log(v / sigma2) + 0.5 * tau2 * s * s / (sigma2 * v)


def pick_nth(mask: torch.Tensor, u: torch.Tensor) -> torch.Tensor:
    """Per row of ``mask`` [C, K] the index of its ``floor(u * count)``-th True entry
    (uniform among the True entries for ``u`` uniform on (0, 1)); ``K - 1`` where a row has none."""
    cnt = mask.sum(1)
    nth = (u * cnt).long().clamp(max=(cnt - 1).clamp(min=0))  # truncation is floor here: u * cnt >= 0
    before = mask.cumsum(1, dtype=torch.long) <= nth[:, None]
    return before.sum(1).clamp(max=mask.shape[1] - 1)


def pick_column(mask: torch.Tensor, u: torch.Tensor, groups: Optional[torch.Tensor] = None) -> torch.Tensor:
    """A rule's feature among the True entries of ``mask [M, D]`` (features with a cut left): uniform
    (:func:`pick_nth`), or input column then split column for a coded table
    (:func:`~torchtree.model.feature_groups.choose_column`, ``groups [D]``)."""
    if groups is None:
        return pick_nth(mask, u)
    return choose_column(mask, u, groups)[0]


def leaf_ranges(feature: torch.Tensor, cut: torch.Tensor, node: torch.Tensor, depth: torch.Tensor,
                n_cuts: torch.Tensor, max_depth: int) -> Tuple[torch.Tensor, torch.Tensor]:
    """Cuts left to node ``node`` by its ancestors' rules: indices ``[lo, hi)`` per feature.

    The ancestors of heap node ``j`` at depth ``d`` are ``((j + 1) >> (d - l)) - 1`` for
    ``l < d``, so all of them are gathered at once (no walk up the tree).

    Parameters
    ----------
    feature, cut : LongTensor [C, K] one heap tree per chain
    node, depth : LongTensor [C]
    n_cuts : LongTensor [D]

    Returns
    -------
    lo, hi : LongTensor [C, D]
    """
    C = node.shape[0]
    D = n_cuts.shape[0]
    levels = torch.arange(max_depth, device=node.device)
    shift = (depth[:, None] - levels[None, :]).clamp(min=1)
    anc = (((node[:, None] + 1) >> shift) - 1).clamp(min=0)  # [C, max_depth]; off the path: masked below
    below = ((node[:, None] + 1) >> (shift - 1)) - 1  # the path's node one level down
    on_path = levels[None, :] < depth[:, None]
    f = feature.gather(1, anc).clamp(min=0)
    k = cut.gather(1, anc)
    left = (below % 2) == 1
    big = torch.iinfo(torch.int64).max
    hi = n_cuts[None, :].expand(C, D).clone().scatter_reduce_(
        1, f, torch.where(on_path & left, k, big), "amin", include_self=True)
    lo = torch.zeros(C, D, dtype=torch.long, device=node.device).scatter_reduce_(
        1, f, torch.where(on_path & ~left, k + 1, 0), "amax", include_self=True)
    return lo, hi


def _children_term(log1m_ps: torch.Tensor, lo, hi, nav, f, k, depth) -> torch.Tensor:
    """``log (1 - p_split(left)) + log (1 - p_split(right))`` of the children of a node whose
    rule is (``f``, ``k``): a child can split only with a cut left and below ``max_depth``.
    ``f, k [C, R]``: R rules per chain at once (``lo, hi [C, D]``, ``nav, depth [C]``); returns ``[C, R]``."""
    lo_f = lo.gather(1, f)
    hi_f = hi.gather(1, f)
    left_avail = (nav[:, None] - 1 + (k > lo_f).long()) > 0
    right_avail = (nav[:, None] - 1 + (hi_f > k + 1).long()) > 0
    lc = log1m_ps[depth + 1][:, None]
    return torch.where(left_avail, lc, 0.0) + torch.where(right_avail, lc, 0.0)


_TABLES: dict = {}


def prior_tables(prior: BartPrior, K: int, device) -> Tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Depth of every heap slot, split probability by depth and ``log(1 - p_split)`` (cached)."""
    key = (prior.alpha_split, prior.beta_split, prior.max_depth, K, str(device))
    if key not in _TABLES:
        ps = prior.split_prob(torch.arange(prior.max_depth + 2, device=device))
        _TABLES[key] = (heap_depth(torch.arange(K, device=device)), ps, torch.log1p(-ps))
    return _TABLES[key]


def warm_tables(prior: BartPrior, C: int, K: int, device) -> None:
    """Fill :func:`tree_update`'s cached tables for ``C`` chains of ``K``-slot trees before a compiled update
    first runs: a compiled function guards on the caches' contents, and would compile again once its
    first call had filled them."""
    prior_tables(prior, K, device)
    _cell_nodes(C, K, device)


def _cell_nodes(C: int, K: int, device) -> Tuple[torch.Tensor, torch.Tensor]:
    """``[C, 2K]``, the node of each (leaf, side) cell (``cell // 2``), and the sides ``0, 1`` three times
    (cached on the device: no copy from the host inside a sweep)."""
    key = ("cells", C, K, str(device))
    if key not in _TABLES:
        _TABLES[key] = (torch.arange(K, device=device).repeat_interleave(2)[None, :].repeat(C, 1),
                        torch.arange(6, device=device) % 2)  # [0, 1, 0, 1, 0, 1] (a fill, no host copy)
    return _TABLES[key]


def tree_update(prior: BartPrior, feature: torch.Tensor, cut: torch.Tensor, value: torch.Tensor,
                leaf_of: torch.Tensor, resid: torch.Tensor, Xb: torch.Tensor, n_cuts: torch.Tensor,
                sigma2: torch.Tensor, u: torch.Tensor, z_leaf: torch.Tensor, use_likelihood: bool = True,
                groups: Optional[torch.Tensor] = None):
    """Redraw one tree in every chain: an MH move on its partial residual, then its leaf values.

    Parameters
    ----------
    prior : BartPrior
    feature, cut : LongTensor [C, K]   the tree in each chain (heap)
    value : Tensor [C, K]   its leaf values
    leaf_of : LongTensor [C, N]   each point's leaf in this tree
    resid : Tensor [C, N]   response minus the whole sum of trees
    Xb : Int16Tensor [D, N] bins
    n_cuts : LongTensor [D]
    sigma2 : Tensor [C] float64 noise variance
    u : Tensor [C, 5] uniforms (move type, node, feature, cut, acceptance)
    z_leaf : Tensor [C, K] standard normals for the leaf values
    use_likelihood : bool, False samples the prior (residuals ignored)
    groups : LongTensor [D], optional, the input column of each feature of a coded table
        (:func:`pick_column`; the rule's prior is its proposal, so it cancels in the ratio)

    Returns
    -------
    (feature, cut, value, leaf_of, resid, info) with info = (move [C], accepted [C]).
    """
    C, K = feature.shape
    dev = resid.device
    tau2 = prior.tau ** 2
    s2 = sigma2.to(torch.float64)
    # int32 point indices: a quarter less memory traffic than int64 in the passes over the points
    offs = (torch.arange(C, device=dev, dtype=torch.int32) * K)[:, None]
    flat = leaf_of.int() + offs  # [C, N] each point's leaf, numbered across chains
    R = resid + value.reshape(-1)[flat]  # partial residual: the other trees' fit removed

    pg, pp, _ = MOVE_PROBS
    move = torch.where(u[:, 0] < pg, GROW, torch.where(u[:, 0] < pg + pp, PRUNE, CHANGE))
    is_leaf = feature == LEAF
    kint = (K - 1) // 2
    nog = (feature[:, :kint] >= 0) & (feature[:, 1:2 * kint + 1:2] == LEAF) & (feature[:, 2:2 * kint + 2:2] == LEAF)
    n_leaf, n_nog = is_leaf.sum(1), nog.sum(1)
    j = torch.where(move == GROW, pick_nth(is_leaf, u[:, 1]), pick_nth(nog, u[:, 1]))
    depth_of, ps_lut, log1m_ps = prior_tables(prior, K, dev)
    depth = depth_of[j]
    lo, hi = leaf_ranges(feature, cut, j, depth, n_cuts, prior.max_depth)
    avail = (hi - lo).clamp(min=0)
    nav = (avail > 0).sum(1)
    f_new = pick_column(avail > 0, u[:, 2], groups)
    k_new = lo.gather(1, f_new[:, None])[:, 0] + (u[:, 3] * avail.gather(1, f_new[:, None])[:, 0]).long()
    grow_ok = (move == GROW) & (nav > 0) & (depth < prior.max_depth)
    valid = grow_ok | ((move != GROW) & (n_nog > 0))
    cl, cr = (2 * j + 1).clamp(max=K - 1), (2 * j + 2).clamp(max=K - 1)
    f_old = feature.gather(1, j[:, None])[:, 0].clamp(min=0)
    k_old = cut.gather(1, j[:, None])[:, 0]

    # One pass over the points: residual sums and counts per (leaf, side of the proposed rule).
    # Every statistic of the move, and the leaves' statistics after it, are sums of these cells.
    go_left = Xb.index_select(0, f_new) <= k_new.to(Xb.dtype)[:, None]  # [C, N]
    cell = (2 * flat + go_left.int()).reshape(-1)
    # each cell's residual sum: SUM_LANES partial sums (point n in lane n % SUM_LANES), added lane by lane
    N = resid.shape[1]
    lane = (torch.arange(N, device=dev, dtype=torch.int32) % SUM_LANES) * (2 * C * K)
    s_lanes = torch.zeros(SUM_LANES, 2 * C * K, dtype=R.dtype, device=dev)
    s_lanes.view(-1).index_add_(0, (cell.view(C, N) + lane).reshape(-1), R.reshape(-1))
    s_cell = s_lanes[0]
    for k in range(1, SUM_LANES):
        s_cell = s_cell + s_lanes[k]
    # counts by index_add, not bincount: bincount's output size depends on the data (a graph break
    # under torch.compile)
    n_cell = torch.zeros(2 * C * K, dtype=torch.float64, device=dev).index_add_(
        0, cell, torch.ones(1, dtype=torch.float64, device=dev).expand(cell.shape[0]))
    if not use_likelihood:
        s_cell, n_cell = torch.zeros_like(s_cell), torch.zeros_like(n_cell)
    s_cell, n_cell = s_cell.view(C, K, 2).double(), n_cell.view(C, K, 2).double()

    # the (side, cell) statistics of j and its two children: [C, 3, 2] each, one gather
    jlr = torch.stack([j, cl, cr], 1)
    sn = torch.stack([s_cell, n_cell]).gather(2, jlr[None, :, :, None].expand(2, C, 3, 2))  # [2 (sum, count), C, 3, 2]
    j_side, l_side, r_side = sn[:, :, 0], sn[:, :, 1], sn[:, :, 2]  # [2, C, 2]
    all_ = (j_side + l_side + r_side).sum(2)  # j's points (a leaf's, or its two children's)
    nl_ = j_side[..., 1] + l_side[..., 1] + r_side[..., 1]  # ... left of the new rule
    # the five partitions' marginal likelihoods at once: j joined, the new rule's sides, the old children
    parts = torch.stack([all_, nl_, all_ - nl_, l_side.sum(2), r_side.sum(2)], 2)  # [2, C, 5]
    ll = log_marginal(parts[1], parts[0], s2[:, None], tau2)
    ll_joined, ll_new, ll_old = ll[:, 0], ll[:, 1] + ll[:, 2], ll[:, 3] + ll[:, 4]

    ps = ps_lut[depth]
    kids = _children_term(log1m_ps, lo, hi, nav, torch.stack([f_new, f_old], 1), torch.stack([k_new, k_old], 1), depth)
    kids_new, kids_old = kids[:, 0], kids[:, 1]
    sib = torch.where(j % 2 == 1, j + 1, j - 1).clamp(min=0, max=K - 1)
    parent_was_nog = (j > 0) & (feature.gather(1, sib[:, None])[:, 0] == LEAF)
    nog_after = n_nog + 1 - parent_was_nog.long()
    log_pg, log_pp = math.log(pg), math.log(pp)
    log_split = torch.log(ps) - torch.log1p(-ps)
    a_grow = log_split + kids_new + ll_new - ll_joined + log_pp - torch.log(nog_after.double()) - log_pg \
        + torch.log(n_leaf.double())
    a_prune = -log_split - kids_old + ll_joined - ll_old + log_pg - torch.log((n_leaf - 1).clamp(min=1).double()) \
        - log_pp + torch.log(n_nog.clamp(min=1).double())
    a_change = kids_new - kids_old + ll_new - ll_old
    log_a = torch.where(move == GROW, a_grow, torch.where(move == PRUNE, a_prune, a_change))
    accept = valid & (torch.log(u[:, 4].to(torch.float64)) < log_a)

    # the tree: node j's rule and its children's status
    acc_g, acc_p = accept & (move == GROW), accept & (move == PRUNE)
    acc_split = accept & (move != PRUNE)
    fj = torch.where(acc_p, LEAF, torch.where(acc_split, f_new, feature.gather(1, j[:, None])[:, 0]))
    kj = torch.where(acc_split, k_new, k_old)
    feature = feature.clone()
    cut = cut.clone()
    child = torch.where(acc_g, LEAF, torch.where(acc_p, ABSENT, feature.gather(1, cl[:, None])[:, 0]))
    child_r = torch.where(acc_g, LEAF, torch.where(acc_p, ABSENT, feature.gather(1, cr[:, None])[:, 0]))
    feature.scatter_(1, cl[:, None], child[:, None])
    feature.scatter_(1, cr[:, None], child_r[:, None])
    feature.scatter_(1, j[:, None], fj[:, None])
    cut.scatter_(1, j[:, None], kj[:, None])

    # where each (leaf, side) cell goes: identity, except the cells the accepted move re-routes
    cell_node, sides = _cell_nodes(C, K, dev)
    to = cell_node.clone()  # [C, 2K] -> node
    keep = jlr[:, :, None].expand(C, 3, 2).reshape(C, 6)  # j, j, cl, cl, cr, cr
    pos = 2 * keep + sides  # their (leaf, side) cells
    grown = torch.stack([cr, cl, cl, cl, cr, cr], 1)
    pruned = j[:, None].expand(C, 6)
    changed = torch.stack([j, j, cr, cl, cr, cl], 1)
    mv = move[:, None]
    new_of = torch.where(~accept[:, None], keep, torch.where(mv == GROW, grown, torch.where(mv == PRUNE, pruned, changed)))
    to.scatter_(1, pos, new_of)
    leaf_new = to.reshape(-1)[cell].view(C, -1)  # cell = 2 (c K + leaf) + side indexes the chains' maps
    node_flat = (to + offs).reshape(-1)
    s_leaf = torch.zeros(C * K, dtype=torch.float64, device=dev).index_add_(0, node_flat, s_cell.reshape(-1)).view(C, K)
    n_leaf_pts = torch.zeros(C * K, dtype=torch.float64, device=dev).index_add_(0, node_flat, n_cell.reshape(-1)).view(C, K)

    # leaf values: Gibbs from N(tau2 s / (sigma2 + n tau2), tau2 sigma2 / (sigma2 + n tau2))
    v = s2[:, None] + n_leaf_pts * tau2
    mean = tau2 * s_leaf / v
    sd = torch.sqrt(tau2 * s2[:, None] / v)
    value = torch.where(feature == LEAF, mean + sd * z_leaf, 0.0).to(value.dtype)
    resid = R - value.reshape(-1)[leaf_new + offs]
    leaf_of = leaf_new.to(leaf_of.dtype)
    return feature, cut, value, leaf_of, resid, (move, accept)


def tree_update_native(prior: BartPrior, feature: torch.Tensor, cut: torch.Tensor, value: torch.Tensor,
                       leaf_of: torch.Tensor, resid: torch.Tensor, Xb: torch.Tensor, n_cuts: torch.Tensor,
                       sigma2: torch.Tensor, u: torch.Tensor, z_leaf: torch.Tensor, use_likelihood: bool = True,
                       groups: Optional[torch.Tensor] = None):
    """:func:`tree_update` as one compiled C++ kernel per call (``torchtree.kernels.native``), on CPU
    tensors: the same arguments, the same results (the sums in the same order and dtypes), one pass
    over the points to score the move and one to write the leaves and residuals. Runs the reference
    :func:`tree_update` where the kernel is unavailable (it could not be built) or the data is on CUDA.
    """
    kernel = native.op("bart_tree_update") if resid.device.type == "cpu" else None
    if kernel is None:
        return tree_update(prior, feature, cut, value, leaf_of, resid, Xb, n_cuts, sigma2, u, z_leaf, use_likelihood,
                           groups)
    _, ps_lut, log1m_ps = prior_tables(prior, feature.shape[1], resid.device)
    pg, pp, _ = MOVE_PROBS
    empty = torch.empty(0, dtype=torch.long)
    f, k, v, L, r, move, acc = kernel(feature, cut, value, leaf_of, resid, Xb, n_cuts, sigma2, u, z_leaf,
                                      empty if groups is None else groups, ps_lut, log1m_ps, float(prior.tau ** 2),
                                      float(pg), float(pp), int(prior.max_depth), bool(use_likelihood))
    return f, k, v, L, r, (move, acc)


def sweep_native(prior: BartPrior, feature: torch.Tensor, cut: torch.Tensor, value: torch.Tensor, leaf_of: torch.Tensor,
                 resid: torch.Tensor, Xb: torch.Tensor, n_cuts: torch.Tensor, sigma2: torch.Tensor, U: torch.Tensor,
                 Z: Optional[torch.Tensor], use_likelihood: bool = True, groups: Optional[torch.Tensor] = None,
                 keyed_leaves: Optional[Tuple[int, torch.Tensor, int]] = None):
    """A whole backfitting sweep (every tree in turn, every chain) as one compiled C++ call, in place:
    :func:`tree_update` for ``t = 0 .. T-1`` with ``U[t]``, ``Z[t]``. ``feature, cut`` int16 ``[T, C, K]``,
    ``value [T, C, K]``, ``leaf_of`` int16 ``[T, C, N]``, ``resid [C, N]`` (contiguous, CPU); ``U [T, C, 5]``,
    ``Z [T, C, Kz]``, or None with ``keyed_leaves = (base, keys [T, C], Kz)``: each leaf's normal is then
    drawn in the kernel when a leaf needs it, ``ndtri(keyed_uniform)`` with stream seed ``base`` (the
    numbers ``Z`` would hold; most slots are no leaf). Returns the proposed / accepted counts per move
    type ``[2, 3]``, or None where the kernel is unavailable (nothing is changed then).

    On CUDA tensors the sweep is one kernel launch (``kernels/csrc/bart_cuda.cu``: one block of threads per
    chain, nothing read back to the host); its cell sums add in the threads' order and its normals come from
    CUDA's ``normcdfinv``, so leaf values and residuals equal the CPU kernel's to rounding, not bit for bit."""
    dev = resid.device.type
    kernel = native.op("bart_sweep") if dev == "cpu" else native.cuda_op("bart_sweep") if dev == "cuda" else None
    if kernel is None:
        return None
    _, ps_lut, log1m_ps = prior_tables(prior, feature.shape[-1], resid.device)
    pg, pp, _ = MOVE_PROBS
    empty = torch.empty(0, dtype=torch.long, device=resid.device)
    base, keys, kz = keyed_leaves if Z is None else (0, empty, 0)
    return kernel(feature, cut, value, leaf_of, resid, Xb, n_cuts, sigma2, U, empty.double() if Z is None else Z,
                  empty if groups is None else groups, ps_lut, log1m_ps, float(prior.tau ** 2), float(pg), float(pp),
                  int(prior.max_depth), bool(use_likelihood), _signed(base), keys, int(kz))


def _signed(v: int) -> int:
    """A 64-bit seed as the signed int64 an operator's ``int`` argument takes (same bits)."""
    v = int(v) & ((1 << 64) - 1)
    return v - (1 << 64) if v >= 1 << 63 else v


def gfr_sweep_native(prior: BartPrior, feature: torch.Tensor, cut: torch.Tensor, value: torch.Tensor,
                     leaf_of: torch.Tensor, resid: torch.Tensor, Xb: torch.Tensor, n_cuts: torch.Tensor,
                     sigma2: torch.Tensor, U: Optional[torch.Tensor], Z: Optional[torch.Tensor],
                     use_likelihood: bool = True, groups: Optional[torch.Tensor] = None,
                     keyed: Optional[Tuple[int, int, torch.Tensor]] = None, max_bins: Optional[int] = None) -> bool:
    """One grow-from-root sweep in place (XBART's warm start, He & Hahn 2021), as one compiled call: every
    tree in turn regrown from the root on its partial residual. A node of depth ``d`` holding ``n`` points
    with residual sum ``s`` stops with weight ``(1 - p_d) l(n, s)`` or splits on rule ``(f, k)`` with weight
    ``p_d P(f) / avail_f l(n_L, s_L) l(n_R, s_R)`` (``P(f)``, ``avail_f``: the prior's feature and cut
    draws, ``l``: :func:`log_marginal`'s likelihood), drawn with ``U[t, c, slot]``: paper 001's one-step
    optimal proposal applied to one tree. The leaves then take their Gibbs draws with ``Z[t, c, slot]``.
    Shapes as :func:`sweep_native` with ``U, Z [T, C, K]``; or ``U, Z`` None with ``keyed = (u_base,
    leaves_base, keys [T, C])``: the kernel then draws ``U[t, c, j] = keyed_uniform(u_base, keys[t, c], j)``
    and ``Z[t, c, j] = ndtri(keyed_uniform(leaves_base, keys[t, c], j))`` for the nodes and leaves that use
    them (the numbers those tensors would hold, the normals to the last bit of a float64; most slots hold
    no node). Not a Markov kernel of the
    posterior: a warm start for the MCMC sweeps.

    On CUDA one kernel launch runs the sweep, a block of threads per chain (``kernels/csrc/bart_gfr_block.h``:
    the same decisions, the sums over a node's points and candidates shared by the block, so the values to
    rounding); ``max_bins``, the most cuts of a column + 1 (default: read from ``n_cuts``, which on a GPU
    waits for it), sizes its histograms. Returns False (nothing changed) where the kernel is unavailable."""
    dev = resid.device.type
    kernel = native.op("bart_gfr_sweep") if dev == "cpu" else native.cuda_op("bart_gfr_blocks") if dev == "cuda" else None
    if kernel is None:
        return False
    _, ps_lut, _ = prior_tables(prior, feature.shape[-1], resid.device)
    empty = torch.empty(0, dtype=torch.long, device=resid.device)
    u_base, leaves_base, keys = keyed if U is None else (0, 0, empty)
    args = (feature, cut, value, leaf_of, resid, Xb, n_cuts, sigma2, empty.double() if U is None else U,
            empty.double() if Z is None else Z, empty if groups is None else groups, ps_lut, float(prior.tau ** 2),
            int(prior.max_depth), bool(use_likelihood), _signed(u_base), _signed(leaves_base), keys)
    if dev == "cpu":
        kernel(*args)
    else:  # the block size is the kernel's choice
        kernel(*args, int(n_cuts.max()) + 1 if max_bins is None else int(max_bins), 0)
    return True


def gamma_from_uniforms(shape: torch.Tensor, u: torch.Tensor) -> torch.Tensor:
    """Gamma(shape, 1) draws by Marsaglia & Tsang's squeeze-free method, from uniforms.

    Parameters
    ----------
    shape : Tensor [C] float64, > 0
    u : Tensor [C, J, 2] uniforms: J tries of (normal by inverse CDF, acceptance)

    Returns
    -------
    Tensor [C] float64: the first accepted try (for shape >= 1 a try is accepted with
    probability > 0.95, so J = 16 tries all fail with probability < 1e-20; then the mean).
    """
    # shape < 1 (a prior-only draw with nu < 2): Gamma(a) = Gamma(a + 1) U^(1/a), U the last
    # try's acceptance uniform (that try is reached with probability < 1e-19)
    small = shape < 1
    boost = torch.where(small, u[:, -1, 1].double().log() / shape, torch.zeros_like(shape)).exp()
    shape = torch.where(small, shape + 1.0, shape)
    d = shape - 1.0 / 3.0
    c = 1.0 / torch.sqrt(9.0 * d)
    x = torch.special.ndtri(u[..., 0])
    v = (1.0 + c[:, None] * x) ** 3
    ok = (v > 0) & (torch.log(u[..., 1]) < 0.5 * x * x + d[:, None] - d[:, None] * v
                    + d[:, None] * torch.log(v.clamp(min=1e-300)))
    first = torch.where(ok.any(1), ok.long().argmax(1), -1)
    draw = (d[:, None] * v).gather(1, first.clamp(min=0)[:, None])[:, 0]
    return torch.where(first >= 0, draw, shape) * boost


def draw_sigma(prior: BartPrior, resid: torch.Tensor, u: torch.Tensor) -> torch.Tensor:
    """Gibbs draw of the noise variance: ``sigma^2 ~ InvGamma((nu + N)/2, (nu lam + SSR)/2)``.

    Parameters
    ----------
    resid : Tensor [C, N]
    u : Tensor [C, J, 2] uniforms (:func:`gamma_from_uniforms`)

    Returns
    -------
    Tensor [C] float64 sigma^2.
    """
    N = resid.shape[1]
    ssr = (resid.double() ** 2).sum(1)
    shape = torch.full_like(ssr, 0.5 * (prior.nu + N))
    g = gamma_from_uniforms(shape, u)
    return 0.5 * (prior.nu * prior.lam + ssr) / g


def draw_latent(fit: torch.Tensor, y: torch.Tensor, u: torch.Tensor) -> torch.Tensor:
    """Albert & Chib's probit latent: ``z ~ N(fit, 1)`` truncated to ``z > 0`` where ``y = 1``
    and ``z < 0`` where ``y = 0`` (inverse CDF; float64 inside).

    Parameters
    ----------
    fit : Tensor [C, N] the sum of trees plus offset
    y : BoolTensor [N]
    u : Tensor [C, N] uniforms
    """
    f = fit.double()
    # y = 1: e = -Phi^{-1}(u Phi(f)) > -f;  y = 0: e = Phi^{-1}(u Phi(-f)) < -f
    sign = torch.where(y, 1.0, -1.0).to(f)
    e = -sign * torch.special.ndtri(u.double() * torch.special.ndtr(sign * f))
    return (f + e).to(fit.dtype)


def truncated_normal(mean: torch.Tensor, lo: torch.Tensor, hi: torch.Tensor, u: torch.Tensor) -> torch.Tensor:
    """``N(mean, 1)`` truncated to ``[lo, hi]`` by the inverse CDF at ``u`` (float64; bounds may be
    infinite). An interval above the mean is drawn through the survival function, so that its tail
    keeps its precision."""
    m = mean.double()
    a, b, u = lo.double() - m, hi.double() - m, u.double()
    pa, pb = torch.special.ndtr(a), torch.special.ndtr(b)
    qa, qb = torch.special.ndtr(-a), torch.special.ndtr(-b)
    t = torch.where(a > 0, -torch.special.ndtri(qa - u * (qa - qb)), torch.special.ndtri(pa + u * (pb - pa)))
    t = torch.where(torch.isfinite(t), t, torch.where(torch.isfinite(a), a, b))  # both bounds ~40 sd away
    return m + torch.minimum(torch.maximum(t, a), b)


def draw_utilities(fit: torch.Tensor, latent: torch.Tensor, y: torch.Tensor, u: torch.Tensor) -> torch.Tensor:
    """One Gibbs sweep over the latent utilities of multinomial probit (Albert & Chib's augmentation
    for ``K`` classes): class 0's utility is 0, class ``k >= 1``'s is ``W_k ~ N(fit_k, 1)``, and the
    observed class has the largest. In turn for ``k = 1 .. K-1``, ``W_k`` is drawn from its
    conditional: above ``max(0, W_j, j != k)`` where ``y = k``, below the observed class's utility
    elsewhere.

    Parameters
    ----------
    fit : Tensor [C, K-1, N], the utilities' means (offsets plus sums of trees)
    latent : Tensor [C, K-1, N], the current utilities
    y : LongTensor [N] class codes
    u : Tensor [C, K-1, N] uniforms

    Returns
    -------
    Tensor [C, K-1, N] (``latent``'s dtype)
    """
    W = latent.double().clone()
    U = W.shape[1]
    inf = torch.full_like(W[:, 0], float("inf"))
    own = (y[None, :] - 1).clamp(min=0).expand(W.shape[0], -1)[:, None, :]  # the observed class's utility
    for k in range(U):
        others = W.clone()
        others[:, k] = -inf
        top = others.amax(1).clamp(min=0.0)  # the largest other utility, class 0's included
        mine = y == k + 1
        beat = torch.where(y[None, :] == 0, torch.zeros_like(top), W.gather(1, own)[:, 0])
        W[:, k] = truncated_normal(fit[:, k], torch.where(mine, top, -inf), torch.where(mine, inf, beat), u[:, k])
    return W.to(latent.dtype)
