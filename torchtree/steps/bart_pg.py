"""Particle Gibbs for one BART tree (Lakshminarayanan, Roy & Teh 2015), batched over chains.

:func:`pg_tree_update` redraws tree ``t`` of every chain by a conditional SMC over the
top-down growth of paper 001: ``P`` particles per chain grow level by level from a root leaf;
at level ``d`` every leaf of depth ``d`` splits with the prior's probability (when a cut is
left in its range) on a rule drawn from the prior, so the incremental weight of a particle is
the ratio of the marginal likelihoods of the split nodes' children to the nodes'. Particle 0
is the chain's current tree: its decisions at every level are the tree's own, and it survives
every (multinomial) resampling; the other particles descend from any particle. After the last
level a particle is drawn in proportion to its weight and its leaf values are drawn from their
conjugate conditional. With the prior as proposal the tree prior cancels from the weights.

Every chain runs its own levels: a chain with no leaf left to consider neither resamples nor
changes, so chains split over ranks draw what one process draws.
"""
from __future__ import annotations

import torch

from torchtree.core.random import keyed_uniform
from torchtree.core.smc import conditional_ancestors
from torchtree.model.bart import ABSENT, LEAF, BartPrior
from torchtree.steps.bart_moves import log_marginal, pick_column

__all__ = ["pg_tree_update"]

_SLOTS_PER_LEVEL = 4  # keyed-uniform slots per level: split, feature, cut, resampling


def _stats(cp_node: torch.Tensor, R: torch.Tensor, size: int):
    """Residual sums (float64) and counts per (chain-particle, node) cell, flat ``[size]``."""
    idx = cp_node.reshape(-1)
    s = torch.zeros(size, dtype=torch.float64, device=R.device).index_add_(0, idx, R.reshape(-1).double())
    # counts by index_add, not bincount (whose output size depends on the data: a graph break)
    n = torch.zeros(size, dtype=torch.float64, device=R.device).index_add_(
        0, idx, torch.ones(1, dtype=torch.float64, device=R.device).expand(idx.shape[0]))
    return s, n


def pg_level(d: int, last: bool, use_likelihood: bool, ref_feature, ref_cut, feat, cuts, node, lo, hi, lw, Rp,
             Xflat, s2, tau2, ps_d, u3, u_r, groups=None):
    """One level of the conditional SMC: the leaves of depth ``d`` split (or not), the points move to
    the new children, the weights take the likelihood ratios, then conditional multinomial
    resampling where a chain has leaves left to consider. Shapes as in :func:`pg_tree_update`:
    ``feat, cuts`` [C, P, K], ``node`` [C, P, N], ``lo, hi`` [C, P, 2^d, D], ``lw`` [C, P],
    ``u3`` [C, P, 2^d, 3] uniforms (split, feature, cut), ``u_r`` [C, P]; ``ps_d`` [C] the
    split probability at depth ``d``; ``groups`` [D] the input column of each feature of a coded
    table, or None. Tensors in, tensors out, so it compiles as one graph."""
    C, P, K = feat.shape
    N = node.shape[-1]
    D = lo.shape[-1]
    dev = feat.device
    W = 1 << d
    j0 = W - 1
    pidx = torch.arange(P, device=dev)
    front = feat[:, :, j0:j0 + W] == LEAF  # [C, P, W]
    avail = (hi - lo).clamp(min=0)  # [C, P, W, D]
    has_cut = (avail > 0).any(-1)
    f_draw = pick_column((avail > 0).reshape(-1, D), u3[..., 1].reshape(-1), groups).view(C, P, W)
    av_f = avail.gather(3, f_draw[..., None])[..., 0]
    k_draw = lo.gather(3, f_draw[..., None])[..., 0] + (u3[..., 2] * av_f).floor().long()
    split = front & has_cut & (u3[..., 0] < ps_d.view(C, 1, 1))
    # particle 0 repeats the current tree's decisions at this level
    ref_f = ref_feature[:, j0:j0 + W]
    is_ref = pidx.view(1, P, 1) == 0
    split = torch.where(is_ref, (ref_f >= 0)[:, None, :], split)
    f_new = torch.where(is_ref, ref_f.clamp(min=0)[:, None], f_draw)
    k_new = torch.where(is_ref, ref_cut[:, j0:j0 + W][:, None], k_draw)

    # route the points of the split nodes
    at = (node >= j0) & (node < j0 + W)
    w_of = (node - j0).clamp(0, W - 1)
    sp_pt = at & split.gather(2, w_of)
    f_pt = f_new.gather(2, w_of)
    k_pt = k_new.gather(2, w_of)
    pts = torch.arange(N, device=dev)
    right = (Xflat[f_pt * N + pts].long() > k_pt).long()
    node = torch.where(sp_pt, 2 * node + 1 + right, node)

    if use_likelihood:
        s_c, n_c = _stats(node + (torch.arange(C * P, device=dev) * K).view(C, P, 1), Rp, C * P * K)
        s_c, n_c = s_c.view(C, P, K), n_c.view(C, P, K)
        kids = slice(2 * j0 + 1, 2 * j0 + 1 + 2 * W)
        sl, sr = s_c[..., kids][..., 0::2], s_c[..., kids][..., 1::2]
        nl, nr = n_c[..., kids][..., 0::2], n_c[..., kids][..., 1::2]
        s3 = s2[:, :, None]
        gain = (log_marginal(nl, sl, s3, tau2) + log_marginal(nr, sr, s3, tau2)
                - log_marginal(nl + nr, sl + sr, s3, tau2))
        lw = lw + torch.where(split, gain, torch.zeros_like(gain)).sum(2)

    # the trees and the next level's cut ranges
    feat = feat.clone()
    cuts = cuts.clone()
    feat[:, :, j0:j0 + W] = torch.where(split, f_new, feat[:, :, j0:j0 + W])
    cuts[:, :, j0:j0 + W] = torch.where(split, k_new, cuts[:, :, j0:j0 + W])
    kid_state = torch.where(split, LEAF, ABSENT).repeat_interleave(2, dim=2)
    feat[:, :, 2 * j0 + 1:2 * j0 + 1 + 2 * W] = kid_state
    lo = lo.repeat_interleave(2, dim=2)
    hi = hi.repeat_interleave(2, dim=2)
    fk = f_new.repeat_interleave(2, dim=2)[..., None]
    kk = k_new.repeat_interleave(2, dim=2)[..., None]
    is_left = (torch.arange(2 * W, device=dev) % 2 == 0).view(1, 1, 2 * W, 1)
    hi = torch.where(is_left, hi.scatter(3, fk, torch.minimum(hi.gather(3, fk), kk)), hi)
    lo = torch.where(~is_left, lo.scatter(3, fk, torch.maximum(lo.gather(3, fk), kk + 1)), lo)

    # conditional multinomial resampling where a chain has leaves left to consider
    if not last:
        go_on = (feat[:, :, 2 * j0 + 1:2 * j0 + 1 + 2 * W] == LEAF).flatten(1).any(1)
        anc = conditional_ancestors(lw, u_r, go_on)
        feat = feat.gather(1, anc[..., None].expand(C, P, K))
        cuts = cuts.gather(1, anc[..., None].expand(C, P, K))
        node = node.gather(1, anc[..., None].expand(C, P, N))
        lo = lo.gather(1, anc[..., None, None].expand_as(lo))
        hi = hi.gather(1, anc[..., None, None].expand_as(hi))
        lw = torch.where(go_on[:, None], torch.zeros_like(lw), lw)
    return feat, cuts, node, lo, hi, lw


def pg_tree_update(prior: BartPrior, feature: torch.Tensor, cut: torch.Tensor, value: torch.Tensor,
                   leaf_of: torch.Tensor, resid: torch.Tensor, Xb: torch.Tensor, n_cuts: torch.Tensor,
                   sigma2: torch.Tensor, z_leaf: torch.Tensor, n_particles: int, seed: int, stream: int,
                   keys: torch.Tensor, use_likelihood: bool = True, level_fn=None, groups=None):
    """Redraw one tree in every chain by conditional SMC, then its leaf values.

    Parameters
    ----------
    prior : BartPrior
    feature, cut : LongTensor [C, K]   the current tree per chain (heap)
    value : Tensor [C, K]   its leaf values
    leaf_of : LongTensor [C, N]   each point's leaf in it
    resid : Tensor [C, N]   response minus the whole sum of trees
    Xb : Int16Tensor [D, N] bins
    n_cuts : LongTensor [D]
    sigma2 : Tensor [C] float64
    z_leaf : Tensor [C, K] standard normals for the leaf values
    n_particles : int, P >= 2 (the current tree included)
    seed, stream : the keyed random stream of this sweep
    keys : LongTensor [C] global
        (tree, chain) keys, so each chain's numbers do not depend on the others
    use_likelihood : bool, False samples the prior
    level_fn : callable ``d -> `` a compiled :func:`pg_level` for level ``d``, or None (eager)
    groups : LongTensor [D], optional, the input column of each feature of a coded table
        (:func:`~torchtree.steps.bart_moves.pick_column`)

    Returns
    -------
    (feature, cut, value, leaf_of, resid) of the drawn trees, shapes as given.
    """
    C, K = feature.shape
    D, N = Xb.shape
    P = int(n_particles)
    dev = resid.device
    tau2 = prior.tau ** 2
    s2 = sigma2.to(torch.float64)[:, None]  # [C, 1]
    R = resid + value.gather(1, leaf_of.long())  # partial residual [C, N]
    pidx = torch.arange(P, device=dev)
    pkey = keys[:, None] * P + pidx[None, :]  # [C, P]
    ps_lut = prior.split_prob(torch.arange(prior.max_depth + 1, device=dev))

    feat = torch.full((C, P, K), ABSENT, dtype=torch.long, device=dev)
    feat[:, :, 0] = LEAF
    cuts = torch.zeros(C, P, K, dtype=torch.long, device=dev)
    node = torch.zeros(C, P, N, dtype=torch.long, device=dev)
    lo = torch.zeros(C, P, 1, D, dtype=torch.long, device=dev)
    hi = n_cuts.view(1, 1, 1, D).expand(C, P, 1, D).clone()
    lw = torch.zeros(C, P, dtype=torch.float64, device=dev)
    Rp = R[:, None, :].expand(C, P, N).contiguous()
    Xflat = Xb.reshape(-1)
    tau2_t = torch.full((), float(tau2), dtype=torch.float64, device=dev)  # a fill: no copy from the host

    last = prior.max_depth - 1
    for d in range(prior.max_depth):
        W = 1 << d
        j0 = W - 1
        if not bool((feat[:, :, j0:j0 + W] == LEAF).any()):
            break
        nkey = pkey[..., None] * K + torch.arange(j0, j0 + W, device=dev)  # [C, P, W]
        slot = d * _SLOTS_PER_LEVEL
        u3 = keyed_uniform(seed, stream, nkey[..., None], slot + torch.arange(3, device=dev))  # [C, P, W, 3]
        u_r = keyed_uniform(seed, stream, pkey, slot + 3)  # [C, P]
        ps_d = ps_lut[d:d + 1].expand(C).contiguous()
        fn = level_fn(d) if level_fn is not None else pg_level
        if fn is not pg_level:
            for t in (node, Rp, Xflat):
                torch._dynamo.maybe_mark_dynamic(t, t.dim() - 1)
        feat, cuts, node, lo, hi, lw = fn(d, d == last, use_likelihood, feature, cut, feat, cuts, node, lo, hi, lw,
                                          Rp, Xflat, s2, tau2_t, ps_d, u3, u_r, groups)

    # one particle per chain, in proportion to its weight
    u_pick = keyed_uniform(seed, stream, keys, _SLOTS_PER_LEVEL * (prior.max_depth + 1))
    cdf = torch.softmax(lw, 1).cumsum(1)
    pick = torch.searchsorted(cdf, (u_pick[:, None] * cdf[:, -1:]).contiguous())[:, 0].clamp(max=P - 1)
    f_out = feat[torch.arange(C, device=dev), pick]
    k_out = cuts[torch.arange(C, device=dev), pick]
    L = node[torch.arange(C, device=dev), pick]  # [C, N]

    flat = L + (torch.arange(C, device=dev) * K)[:, None]
    s_leaf, n_leaf = _stats(flat, R, C * K)
    if not use_likelihood:
        s_leaf, n_leaf = torch.zeros_like(s_leaf), torch.zeros_like(n_leaf)
    s_leaf, n_leaf = s_leaf.view(C, K), n_leaf.view(C, K)
    v = s2 + n_leaf * tau2
    val = torch.where(f_out == LEAF, tau2 * s_leaf / v + torch.sqrt(tau2 * s2 / v) * z_leaf.double(),
                      torch.zeros_like(v)).to(value.dtype)
    new_resid = R - val.gather(1, L)
    return f_out, k_out, val, L.to(leaf_of.dtype), new_resid
