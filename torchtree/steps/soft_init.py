"""Data-informed starting points for soft-tree chains.

Soft-tree posteriors are strongly multimodal: once the sharpness ``h`` is small, a
threshold has gradient only from the few points near it, so chains started from
prior draws settle in whatever partition they first fall into (on CGM's true
topology, 8 chains from the prior all stopped at train MSE 1.0-1.25 against a noise
variance of 0.04). This module draws starting points from a few sweeps of a
collapsed Gibbs-like sampler of the *hard* tree with the topology fixed: node by
node (top-down), the node's axis-aligned split is redrawn given all other splits,
with probability

    (1 - eps) * p_cond(feature, cut) + eps * uniform(valid cuts)

where ``p_cond`` is proportional to the marginal likelihood of the whole tree with
that split (Dirichlet-multinomial leaves for classification; for regression the
profile Gaussian likelihood ``-N/2 log(SSE / N)`` with leaf means at their
points' means). Cuts are the edges of an ``n_bins`` grid of the scaled inputs. A
greedy top-down builder is not enough: on CGM the best single split of the root by
its own score is not the root of the true tree, and a stump's best cut on a
feature is not where the deeper tree needs it; conditioning on the subtrees fixes
both within two or three sweeps.

Regression leaf means start at their points' mean and the noise variance at the
pooled residual variance. Only the starting point changes, never the target: warm-up
and draws run the same NUTS kernel on the same posterior. The ``eps`` mixture and
the per-chain draws keep the chains' starting points diverse.

Functions
---------
informed_start  theta [B, P] from the data (all nodes, or only flagged ones)
"""
from __future__ import annotations

from typing import Optional

import torch

__all__ = ["informed_start", "INIT_MODES"]

INIT_MODES = ("prior", "data")
# mass of the chosen feature in a starting split weight: close to an axis-aligned
# split, yet inside the simplex (the softmax parameterisation has no vertices)
_AXIS_MASS = 0.9999
# cap on the [B, D, G, L, S] statistics tensor of one node update (float64 entries)
_MAX_STATS = 2 ** 24


def _leaf_log_marginal(stats: torch.Tensor, regression: bool, alpha: float, n_total: int) -> torch.Tensor:
    """Log marginal likelihood of a tree from its leaves' sufficient statistics.

    Parameters
    ----------
    stats : Tensor [..., L, S]: per leaf (count, sum y, sum y^2) for regression,
        class counts [..., L, K] for classification
    regression : bool
    alpha : float, Dirichlet-multinomial total concentration (classification)
    n_total : int, number of training points (regression profile likelihood)

    Returns
    -------
    Tensor [...]
    """
    if regression:
        n, s1, s2 = stats[..., 0], stats[..., 1], stats[..., 2]
        sse = (s2 - s1 * s1 / n.clamp_min(1)).clamp_min(0).sum(-1)
        return -0.5 * n_total * torch.log(sse.clamp_min(1e-12) / n_total)
    K = stats.shape[-1]
    a = alpha / K
    n = stats.sum(-1)
    return ((torch.lgamma(stats + a) - torch.lgamma(torch.tensor(a, dtype=stats.dtype))).sum(-1)
            + torch.lgamma(torch.tensor(alpha, dtype=stats.dtype)) - torch.lgamma(n + alpha)).sum(-1)


def _route(Xd, w, tau, node_mask, depth: int, force_node: int = -1, force_right: bool = False) -> torch.Tensor:
    """Leaf slot [B, N] of every point under hard splits (``x . w > tau`` goes right).

    Padded nodes send points left; ``force_node`` (if >= 0) sends every point that
    reaches it to the side ``force_right``.
    """
    B, I, D = w.shape
    N = Xd.shape[0]
    node = torch.zeros(B, N, dtype=torch.long, device=Xd.device)
    for _ in range(depth):
        proj = torch.einsum("nd,bnd->bn", Xd, w.gather(1, node[..., None].expand(B, N, D)))
        right = (proj > tau.gather(1, node)) & node_mask.gather(1, node)
        if force_node >= 0:
            right = torch.where(node == force_node, torch.full_like(right, force_right), right)
        node = 2 * node + 1 + right.long()
    return node - I


def _cut_probabilities(Xd, bins, per_point, w, tau, node_mask, i: int, depth: int, G: int,
                       regression: bool, alpha: float, eps: float):
    """Choice probabilities of node ``i``'s (feature, cut) given the other splits.

    Parameters
    ----------
    Xd : Tensor [N, D] scaled inputs
    bins : LongTensor [N, D] their grid cells
    per_point : Tensor [N, S] sufficient statistics of each point
    w : Tensor [R, I, D], tau : Tensor [R, I], node_mask : BoolTensor [R, I]
    i : int, the node
    depth : padded depth
    G : number of grid cells

    Returns
    -------
    prob : Tensor [R, D * (G - 1)], flattened (feature, cut) probabilities
    has : BoolTensor [R], whether node ``i`` has a cut with points on both sides
    """
    R, I, D = w.shape
    N, S = per_point.shape
    L = I + 1  # leaf slots of the padded tree
    dev = Xd.device
    rows = torch.arange(R, device=dev)
    leaf_l = _route(Xd, w, tau, node_mask, depth, i, False)         # [R, N]
    leaf_r = _route(Xd, w, tau, node_mask, depth, i, True)
    # a point passes through node i exactly when forcing the side there moves its leaf
    reach = leaf_l != leaf_r                                        # [R, N]
    pp = per_point[None].expand(R, N, S)
    # points that do not reach node i keep their leaf (leaf_l == leaf_r for them)
    base = torch.zeros(R * L, S, dtype=torch.float64, device=dev).index_add_(
        0, (rows[:, None] * L + leaf_l).reshape(-1), (pp * (~reach)[..., None]).reshape(-1, S)).view(R, L, S)
    # statistics of the points at node i by (row, feature, bin, leaf), for either side
    keyb = (rows[:, None, None] * D + torch.arange(D, device=dev)[None, None, :]) * G + bins[None]   # [R, N, D]
    vals = (pp * reach[..., None])[:, :, None, :].expand(R, N, D, S).reshape(-1, S)

    def side(leaf):
        key = (keyb * L + leaf[:, :, None]).reshape(-1)
        return torch.zeros(R * D * G * L, S, dtype=torch.float64, device=dev).index_add_(0, key, vals).view(R, D, G, L, S)

    left = side(leaf_l).cumsum(2)                                   # bins <= k go left
    right_all = side(leaf_r)
    right = right_all.sum(2, keepdim=True) - right_all.cumsum(2)    # bins > k go right
    tot = base[:, None, None] + left[:, :, :-1] + right[:, :, :-1]  # [R, D, G-1, L, S]
    score = _leaf_log_marginal(tot, regression, alpha, N)           # [R, D, G-1]
    count = (lambda st: st[..., 0]) if regression else (lambda st: st.sum(-1))
    valid = (count(left[:, :, :-1]).sum(-1) > 0) & (count(right[:, :, :-1]).sum(-1) > 0)
    flat = torch.where(valid, score, torch.full_like(score, -1e300)).reshape(R, -1)
    vflat = valid.reshape(R, -1)
    prob = (1 - eps) * torch.softmax(flat, -1) + eps * vflat.to(torch.float64) / vflat.sum(-1, keepdim=True).clamp_min(1)
    has = vflat.any(-1)
    return torch.where(has[:, None], prob, torch.ones_like(prob)), has


def informed_start(
    model,
    theta: Optional[torch.Tensor] = None,
    fresh: Optional[torch.Tensor] = None,
    generator: Optional[torch.Generator] = None,
    eps: float = 0.1,
    n_bins: int = 256,
    n_sweeps: int = 3,
    n_candidates: int = 8,
) -> torch.Tensor:
    """Starting positions from a few conditional sweeps over the hard tree's splits.

    Parameters
    ----------
    model : SoftTrees
        Its training data, topologies (node masks), layout and hyperparameters are used.
    theta : Tensor [B, P], optional
        Starting point of the sweeps; nodes not ``fresh`` keep their splits
        (default: the model's current theta, e.g. prior draws).
    fresh : BoolTensor [B, I], optional
        Internal nodes whose splits are redrawn (default: every active node).
    generator : torch.Generator, optional
    eps : float in [0, 1], weight of the uniform choice among valid cuts
    n_bins : int, grid of candidate cuts on the scaled inputs
    n_sweeps : int, top-down passes over the fresh nodes
    n_candidates : int
        Independent sweeps per row; each row keeps the candidate whose hard tree has
        the highest marginal likelihood (sweeps alone stay in the mode they enter:
        on CGM's true topology about a third of single sweeps reach the true
        partition).

    Returns
    -------
    Tensor [B, P]: ``theta`` with fresh nodes' weights and thresholds replaced and, for
    regression, every leaf mean set to the mean of its points (the prior mean for an
    empty leaf) and the noise variance to the pooled residual variance. Inactive
    coordinates stay zero.
    """
    lay = model.layout
    X, y = model.X, model.y
    dev = X.device
    B, I, D, L, depth = model.batch_size, lay.n_internal, lay.n_features, lay.n_leaves, lay.depth
    N = X.shape[0]
    theta = (model.theta.data if theta is None else theta).clone()
    B0, K = B, max(1, int(n_candidates))
    node_mask = model.node_mask.repeat_interleave(K, 0)
    fresh = model.node_mask.clone() if fresh is None else (fresh.to(dev) & model.node_mask)
    fresh = fresh.repeat_interleave(K, 0)
    regression = lay.regression
    c = model.constrain(theta)
    w = c["weights"].to(torch.float64).repeat_interleave(K, 0)          # [B K, I, D]
    tau = c["thresholds"].to(torch.float64).repeat_interleave(K, 0)     # [B K, I]
    B = B0 * K
    Xd = X.to(torch.float64)
    if regression:
        yd = y.to(torch.float64)
        per_point = torch.stack((torch.ones_like(yd), yd, yd * yd), -1)      # [N, 3]
    else:
        per_point = model.y_onehot.to(torch.float64)                          # [N, K]
    S = per_point.shape[1]
    G = int(n_bins)
    while G > 16 and D * G * L * S > _MAX_STATS:  # one row must fit; rows go in chunks
        G //= 2
    chunk = max(1, _MAX_STATS // (D * G * L * S))
    bins = (Xd * G).long().clamp_(0, G - 1)             # [N, D]
    edges = torch.arange(1, G, dtype=torch.float64, device=dev) / G           # cut k at edge (k+1)/G
    alpha = float(model.hyper.alpha) if not regression else 0.0
    rows = torch.arange(B, device=dev)
    active_nodes = [i for i in range(I) if bool(fresh[:, i].any())]
    for _ in range(int(n_sweeps) if active_nodes else 0):
        for i in active_nodes:
            need = fresh[:, i]                                              # [B]
            # rows in chunks, so the [R, D, G, L, S] statistics stay under _MAX_STATS
            probs = [_cut_probabilities(Xd, bins, per_point, w[r0:r0 + chunk], tau[r0:r0 + chunk],
                                        node_mask[r0:r0 + chunk], i, depth, G, regression, alpha, eps)
                     for r0 in range(0, B, chunk)]
            prob = torch.cat([p for p, _ in probs])
            has = torch.cat([h for _, h in probs])
            pick = torch.multinomial(prob, 1, generator=generator)[:, 0]
            feat, cut = pick // (G - 1), edges[pick % (G - 1)]
            onehot = torch.nn.functional.one_hot(feat, D).to(torch.float64)
            w_new = _AXIS_MASS * onehot + (1 - _AXIS_MASS) * (1 - onehot) / max(D - 1, 1) if D > 1 else torch.ones_like(onehot)
            # the other features sit at mid-range on average, so they shift the cut by their weight / 2
            t_new = w_new.gather(1, feat[:, None])[:, 0] * cut + (w_new * (1 - onehot)).sum(-1) * 0.5
            upd = need & has
            w[:, i] = torch.where(upd[:, None], w_new, w[:, i])
            tau[:, i] = torch.where(upd, t_new.clamp(1e-6, 1 - 1e-6), tau[:, i])
    # keep each row's best candidate
    leaf = _route(Xd, w, tau, node_mask, depth)                            # [B K, N]
    stats = torch.zeros(B * L, S, dtype=torch.float64, device=dev).index_add_(
        0, (rows[:, None] * L + leaf).reshape(-1), per_point[None].expand(B, N, S).reshape(-1, S)).view(B, L, S)
    best = _leaf_log_marginal(stats, regression, alpha, N).view(B0, K).argmax(1) + torch.arange(B0, device=dev) * K
    w, tau, leaf, stats = w[best], tau[best], leaf[best], stats[best]
    mu = sigma2 = None
    if regression:
        cnt_l, sm = stats[..., 0], stats[..., 1]                           # per leaf: count, sum y
        mu = torch.where(cnt_l > 0, sm / cnt_l.clamp_min(1), torch.full_like(sm, float(model.hyper.mu_mean)))
        resid = yd[None] - mu.gather(1, leaf)
        sigma2 = resid.pow(2).mean(1).clamp_min(1e-6 * float(model.hyper.mu_var))
    out = model.unconstrain(w, tau, mu, sigma2).to(theta.dtype)
    if not regression:
        return torch.where(model.coord_mask, out, theta)
    return out
