"""The BART model (Chipman, George & McCulloch 2010): a sum of trees plus Gaussian noise.

``y = f_1(x) + ... + f_m(x) + e`` with ``e ~ N(0, sigma^2)`` (regression), or
``P(y = 1 | x) = Phi(f_1(x) + ... + f_m(x))`` (binary classification, probit link with the
latent ``z ~ N(sum f, 1)`` of Albert & Chib), or, for ``K >= 3`` classes, multinomial probit:
a sum of trees per class but the reference class 0, each the mean of a unit-variance latent
utility, the class the largest utility (:func:`mnp_probabilities`). Each tree has the Chipman split prior
``alpha_split (1 + depth)^-beta_split`` (BART's defaults 0.95 and 2), and a node's rule is a
feature drawn uniformly among those with a cut left in the node's range (the ranges left by
its ancestors' rules), then a cut uniformly among those left: the prior of a tree does not
look at the data, only at the fixed cut grid (:class:`CutGrid`). A leaf's value is
``N(0, tau^2)`` with ``tau = half_range / (k sqrt(m))`` on the scaled response.

Trees live in heap layout: node ``j`` has children ``2j + 1`` and ``2j + 2`` and depth
``floor(log2(j + 1))``; a tree of depth at most ``max_depth`` has ``K = 2^(max_depth+1) - 1``
slots. ``feature[..., j]`` is -2 for an absent node, -1 for a leaf, else the split feature;
``cut[..., j]`` is the index of the cut in the feature's grid (a point goes left when its
bin ``<= cut``); ``value[..., j]`` is a leaf's value.
"""
from __future__ import annotations

import math
from dataclasses import asdict, dataclass
from typing import Optional

import numpy as np
import torch

from torchtree.core.warn import warn
from torchtree.kernels import native

__all__ = ["BartPrior", "CutGrid", "chi2_quantile", "heap_depth", "forest_sum", "ABSENT", "LEAF", "mnp_offsets",
           "mnp_probabilities", "GL_NODES"]

#: scaled noise sd below which a linear fit counts as exact (``BartPrior.from_data``), and the floor of ``sigma_hat``
_EXACT_FIT = 1e-6

ABSENT, LEAF = -2, -1


def heap_depth(j: torch.Tensor) -> torch.Tensor:
    """Depth of heap node ``j`` (LongTensor, any shape): ``floor(log2(j + 1))``, exactly."""
    return (64 - _clz64(j + 1)) - 1


def _clz64(x: torch.Tensor) -> torch.Tensor:
    # leading zeros by binary search (exact for every positive int64; float log2 rounds)
    n = torch.zeros_like(x)
    for s in (32, 16, 8, 4, 2, 1):
        zero_top = (x >> (64 - s)) == 0
        n = n + torch.where(zero_top, s, 0)
        x = torch.where(zero_top, x << s, x)
    return n


def chi2_quantile(p: float, df: float) -> float:
    """Quantile ``p`` of the chi-squared distribution with ``df`` degrees of freedom
    (bisection on the regularised incomplete gamma function, to 1e-12 relative)."""
    if not 0.0 < p < 1.0 or df <= 0:
        raise ValueError(f"chi2_quantile needs 0 < p < 1 and df > 0, got p={p}, df={df}")
    a = torch.tensor(df / 2.0, dtype=torch.float64)
    lo, hi = 0.0, max(1.0, df)
    while float(torch.special.gammainc(a, torch.tensor(hi / 2.0, dtype=torch.float64))) < p:
        hi *= 2.0
    for _ in range(200):
        mid = 0.5 * (lo + hi)
        if float(torch.special.gammainc(a, torch.tensor(mid / 2.0, dtype=torch.float64))) < p:
            lo = mid
        else:
            hi = mid
        if hi - lo <= 1e-12 * hi:
            break
    return 0.5 * (lo + hi)


@dataclass(frozen=True)
class BartPrior:
    """BART's hyperparameters, on the scaled response the sampler works with.

    Attributes
    ----------
    task : "regression" or "classification"
    n_trees : int, m
    alpha_split, beta_split : float, the split prior ``alpha (1 + depth)^-beta``
    max_depth : int, deepest allowed leaf (the heap's size; the split probability is 0 there)
    tau : float, prior sd of a leaf value (scaled response)
    nu, lam : float, ``sigma^2 ~ nu lam / chi2_nu`` (regression; lam = 0 for classification)
    scale, offset : float, ``y_scaled = (y - offset) / scale`` (regression); classification:
        scale 1 and ``offset = Phi^{-1}(mean y)`` added to the sum of trees
    sigma_hat : float, the rough noise sd (scaled) that calibrated ``lam``
    """

    task: str
    n_trees: int
    alpha_split: float
    beta_split: float
    max_depth: int
    tau: float
    nu: float
    lam: float
    scale: float
    offset: float
    sigma_hat: float

    @classmethod
    def from_data(cls, X: torch.Tensor, y: torch.Tensor, task: str, n_trees: int = 200, alpha_split: float = 0.95,
                  beta_split: float = 2.0, k: float = 2.0, nu: float = 3.0, q: float = 0.9,
                  sigma_hat: Optional[float] = None, max_depth: int = 8) -> "BartPrior":
        """Chipman et al.'s data-calibrated defaults.

        Regression: ``y`` is scaled to ``[-0.5, 0.5]`` by its range; ``tau = 0.5 / (k sqrt(m))``;
        ``sigma_hat`` (scaled) is the residual sd of a least-squares linear fit (the sd of ``y``
        when ``N <= D + 1``, or, with a warning, when that fit is exact: residual sd under ``1e-6``)
        and ``lam`` puts the ``q`` quantile of the prior of ``sigma`` at it.
        Targets with no spread (one row, or all equal) calibrate nothing: their magnitude ``max|y|``
        (1 for targets all 0) is the scale and ``sigma_hat`` half of it, so that rescaling ``y`` rescales
        the fit.
        Classification (labels 0/1): ``tau = 3 / (k sqrt(m))``, ``offset = Phi^{-1}(mean y)``.

        Parameters
        ----------
        X : Tensor [N, D]
        y : Tensor [N] (float targets, or 0/1 labels)
        """
        m = int(n_trees)
        if task == "classification":
            p = float(y.double().mean().clamp(1e-6, 1 - 1e-6))
            off = float(torch.special.ndtri(torch.tensor(p, dtype=torch.float64)))
            return cls(task, m, float(alpha_split), float(beta_split), int(max_depth), 3.0 / (k * math.sqrt(m)),
                       float(nu), 0.0, 1.0, off, 1.0)
        yd = y.double().cpu()
        lo, hi = float(yd.min()), float(yd.max())
        offset = 0.5 * (hi + lo)
        # one row or a constant target calibrates nothing: the targets' magnitude stands for their
        # range (1 for zeros), and the noise prior's sd for half of it
        scale = hi - lo if hi > lo else (max(abs(lo), abs(hi)) or 1.0)
        ys = (yd - offset) / scale
        if sigma_hat is None and not hi > lo:
            sigma_hat = 0.5
        elif sigma_hat is None:
            N, D = X.shape
            if N > D + 1:
                # columns standardised first: the residuals are the same in exact arithmetic, but a column far
                # from 0 next to its spread (seconds since 1970 within a month) is nearly collinear with the
                # intercept, and gelsd's rank cut dropped it (sigma_hat twice the linear fit's residual sd)
                Z = X.double().cpu()
                sd = Z.std(0) if N > 1 else torch.ones(D, dtype=torch.float64)
                Z = (Z - Z.mean(0)) / torch.where((sd > 0) & torch.isfinite(sd), sd, torch.ones_like(sd))
                A = torch.cat([Z, torch.ones(N, 1, dtype=torch.float64)], 1)
                coef = torch.linalg.lstsq(A, ys[:, None], driver="gelsd").solution
                res = ys - (A @ coef)[:, 0]
                sigma_hat = float(torch.sqrt((res ** 2).sum() / (N - D - 1)))
                if sigma_hat < _EXACT_FIT:
                    # y is (to rounding) linear in X: the residuals say nothing of the noise, and a noise prior
                    # at the floor let the trees interpolate the training points with intervals of no width
                    warn(f"BART: y is a linear function of X to {sigma_hat:.1e} of its range (no noise the linear fit "
                         f"can see), so the noise prior is calibrated on the sd of y instead; pass sigma_hat= to "
                         "choose it")
                    sigma_hat = float(ys.std())
            else:
                sigma_hat = float(ys.std()) if N > 1 else 1.0
        else:
            sigma_hat = float(sigma_hat) / scale
        sigma_hat = max(sigma_hat, _EXACT_FIT)
        lam = sigma_hat ** 2 * chi2_quantile(1.0 - q, nu) / nu
        return cls(task, m, float(alpha_split), float(beta_split), int(max_depth), 0.5 / (k * math.sqrt(m)),
                   float(nu), float(lam), float(scale), float(offset), float(sigma_hat))

    @property
    def n_slots(self) -> int:
        """Heap slots per tree, ``2^(max_depth + 1) - 1``."""
        return (1 << (self.max_depth + 1)) - 1

    def split_prob(self, depth: torch.Tensor) -> torch.Tensor:
        """``alpha (1 + depth)^-beta`` below ``max_depth``, 0 at it (float64, the shape of ``depth``)."""
        d = depth.to(torch.float64)
        p = self.alpha_split * (1.0 + d).pow(-self.beta_split)
        return torch.where(depth < self.max_depth, p, torch.zeros_like(p))

    def to_dict(self) -> dict:
        """Plain values (checkpoints, posterior files)."""
        return asdict(self)


class CutGrid:
    """Per-feature cut points: a point's bin in feature ``d`` is the number of cuts below its value.

    A feature with at most ``max_cuts + 1`` distinct values gets a cut midway between each pair
    of neighbours; otherwise ``max_cuts`` cuts at the points' quantiles (midway between the
    distinct values on either side). Constant features get no cut and are never split. A column
    with missing values (:class:`~torchtree.model.encoding.TableEncoder`) always keeps the cut between
    its observed values and the missing values' stand-in (the rule "is missing").

    Attributes
    ----------
    cuts : Tensor [D, max_cuts] float64, padded with +inf
    n_cuts : LongTensor [D]
    """

    def __init__(self, cuts: torch.Tensor, n_cuts: torch.Tensor) -> None:
        self.cuts, self.n_cuts = cuts, n_cuts

    @classmethod
    def from_data(cls, data, max_cuts: int = 100) -> "CutGrid":
        """The grid of a :class:`~torchtree.model.data.Data` (its sorted distinct values)."""
        D = data.d
        nu = data.n_unique.cpu().tolist()
        sv = data.sorted_values.double().cpu()
        rank = data.X_rank.cpu()
        enc = getattr(data, "encoder", None)
        side = enc.missing_sides() if enc is not None else [0] * D
        rows = []
        for d in range(D):
            u = nu[d]
            vals = sv[d, :u]
            if u - 1 <= max_cuts:
                idx = torch.arange(u - 1)
            else:
                cum = torch.bincount(rank[:, d].long(), minlength=u).cumsum(0)
                targets = torch.arange(1, max_cuts + 1, dtype=torch.float64) * data.n / (max_cuts + 1)
                idx = torch.unique(torch.searchsorted(cum.double(), targets).clamp(max=u - 2))
                if side[d]:  # the "is missing" cut, between the observed values and the missing stand-in
                    idx = torch.unique(torch.cat([idx, torch.tensor([u - 2 if side[d] > 0 else 0])]))
            rows.append(0.5 * (vals[idx] + vals[idx + 1]))
        width = max(1, max(r.numel() for r in rows))
        cuts = torch.full((D, width), float("inf"), dtype=torch.float64)
        for d, r in enumerate(rows):
            cuts[d, : r.numel()] = r
        return cls(cuts, torch.tensor([r.numel() for r in rows], dtype=torch.long))

    def bins(self, X: torch.Tensor) -> torch.Tensor:
        """Bins of the points, feature-major: ``[D, N]`` int16 (``#cuts < x``)."""
        Xd = X.to(torch.float64).T.contiguous()
        cuts = self.cuts.to(Xd.device)
        return torch.searchsorted(cuts, Xd, side="left").to(torch.int16)

    def to(self, device) -> "CutGrid":
        """The grid on ``device``."""
        return CutGrid(self.cuts.to(device), self.n_cuts.to(device))


_BLOCK = 1 << 19  # (split node, point) pairs per working block: a few MiB, cache-sized
_COLS = 1024      # points per block at most


def forest_sum(feature: torch.Tensor, cut: torch.Tensor, value: torch.Tensor, Xb: torch.Tensor,
               max_elements: int = 1 << 24, use_native: Optional[bool] = None) -> torch.Tensor:
    """Sum over trees of each forest's value at each point.

    A tree's value is written as its leftmost leaf's value plus, for each split node ``n`` that a
    point reaches and leaves to the right, ``L(2n+2) - L(2n+1)`` (``L``: leftmost leaf of a
    subtree); so each split node costs one vectorised comparison per point, level by level,
    in cache-sized blocks of trees x points.

    Parameters
    ----------
    feature, cut : Int16/LongTensor [S, T, K] (heap trees, module notes)
    value : Tensor [S, T, K], their leaf values
    Xb : Int16Tensor [D, M] bins of the points (:meth:`CutGrid.bins`)
    max_elements : int, (split node, point) pairs per temporary (at least twice a tree's split nodes)
    use_native : bool or None, the compiled kernel (True), the plain-torch route (False), or the kernel
        where it serves (None: CPU tensors, int16 bins, the kernels built)

    Returns
    -------
    Tensor [S, M] float64: ``sum_t value[s, t, leaf_t(x)]``. On CPU with int16 bins the compiled
    kernel (``forest_sum`` of :mod:`torchtree.kernels.native`) walks every tree and adds the leaves in
    tree order; this plain-torch route sums in another order: the two are equal up to float64 rounding.
    """
    S, T, K = feature.shape
    D, M = Xb.shape
    dev = Xb.device
    if S == 0 or M == 0 or T == 0:
        return torch.zeros(S, M, dtype=torch.float64, device=dev)
    if use_native is None:
        use_native = dev.type == "cpu" and Xb.dtype == torch.int16 and native.usable(dev)
    if use_native:
        return native.op("forest_sum")(feature, cut, value, Xb)
    out = torch.zeros(S, M, dtype=torch.float64, device=dev)
    f = feature.reshape(-1)
    v = value.reshape(-1)
    roots = torch.arange(S * T, device=dev) * K
    out += v[_leftmost(f, roots, K)].to(torch.float64).reshape(S, T).sum(1)[:, None]
    # split nodes reachable from the root, with both children in the heap: (s, t, j), tree-major
    q = torch.nonzero(_split_nodes(feature), as_tuple=False)
    N = q.shape[0]
    if N == 0:
        return out
    s_n, t_n, j_n = q.unbind(1)
    tree_n = s_n * T + t_n
    flat = tree_n * K + j_n
    fn = f[flat].long()
    cn = cut.reshape(-1)[flat]
    if not Xb.dtype.is_floating_point:
        cn = cn.clamp(max=torch.iinfo(Xb.dtype).max)
    cn = cn.to(Xb.dtype)
    # going right at node n moves the leftmost leaf from L(2n+1) to L(2n+2)
    lo, hi = (v[_leftmost(f, flat + j_n + k, K)].to(torch.float64) for k in (1, 2))
    delta = hi - lo
    lvl = heap_depth(j_n)
    n_lvl = int(lvl.max()) + 1
    # blocks of whole trees (fewer than lim // Mc split nodes each); rows sorted by (block, level)
    per_tree = torch.bincount(tree_n, minlength=S * T)
    big = int(per_tree.max())
    lim = max(min(max_elements, _BLOCK), 2 * big)
    Mc = min(M, _COLS, lim // (2 * big))
    step = lim // Mc - big  # >= big; a block's rows: < step + big <= lim // Mc
    blk = ((torch.cumsum(per_tree, 0) - per_tree) // step)[tree_n]
    key = blk * n_lvl + lvl
    order = torch.argsort(key, stable=True)
    pos = torch.empty_like(order)
    pos[order] = torch.arange(N, device=dev)
    prow = pos[torch.searchsorted(flat, tree_n * K + (j_n - 1).clamp(min=0) // 2)][order]
    left = (j_n % 2 == 1)[order, None]
    fn, cn, delta, s_n, key = fn[order], cn[order, None], delta[order, None], s_n[order], key[order]
    n_blk = int(blk.max()) + 1
    bounds = torch.searchsorted(key, torch.arange(n_blk * n_lvl + 1, device=dev)).tolist()
    for m0 in range(0, M, Mc):
        Xc = Xb[:, m0:m0 + Mc].contiguous()
        oc = out[:, m0:m0 + Mc]
        for b in range(n_blk):
            a, z = bounds[b * n_lvl], bounds[(b + 1) * n_lvl]
            if a == z:
                continue
            R = torch.empty(z - a, Xc.shape[1], dtype=torch.bool, device=dev)  # point reaches node
            G = torch.empty_like(R)                                           # ... and goes right
            for l in range(n_lvl):
                l0, l1 = bounds[b * n_lvl + l], bounds[b * n_lvl + l + 1]
                if l0 == l1:
                    break
                right = Xc.index_select(0, fn[l0:l1]) > cn[l0:l1]
                if l == 0:
                    R[l0 - a:l1 - a] = True
                    G[l0 - a:l1 - a] = right
                else:
                    pr = prow[l0:l1] - a
                    Gp = G.index_select(0, pr)
                    Rn = Gp ^ (R.index_select(0, pr) & left[l0:l1])  # left child: reach & not right
                    R[l0 - a:l1 - a] = Rn
                    torch.logical_and(Rn, right, out=G[l0 - a:l1 - a])
            oc.index_add_(0, s_n[a:z], G.view(torch.uint8).to(torch.float64).mul_(delta[a:z]))
    return out


def _split_nodes(feature: torch.Tensor) -> torch.Tensor:
    """Bool [S, T, K]: split nodes whose ancestors all split and whose children fit in the heap."""
    K = feature.shape[-1]
    inner = (feature >= 0) & (2 * torch.arange(K, device=feature.device) + 2 < K)
    lo = 1
    while lo < K:  # level by level: a node splits only under a split parent
        hi = min(K, 2 * lo + 1)
        par = (torch.arange(lo, hi, device=feature.device) - 1) // 2
        inner[..., lo:hi] &= inner[..., par]
        lo = hi
    return inner


def _leftmost(f: torch.Tensor, idx: torch.Tensor, K: int) -> torch.Tensor:
    """Flat index of the leftmost leaf under flat heap slot ``idx`` (``f``: features, trees of ``K`` slots)."""
    j = idx % K
    t0 = idx - j
    while True:
        go = (f[t0 + j] >= 0) & (2 * j + 2 < K)
        if not bool(go.any()):
            return t0 + j
        j = torch.where(go, 2 * j + 1, j)


# ---------------------------------------------------------------- multinomial probit (K >= 3 classes)
#: Gauss-Legendre nodes of :func:`mnp_probabilities` on [0, 1]
GL_NODES = 64


def mnp_offsets(codes: torch.Tensor, n_classes: int) -> torch.Tensor:
    """The utilities' offsets of multinomial probit BART, ``[K - 1]`` float64:
    ``Phi^{-1}(n_u / (n_u + n_0))`` for class ``u = 1 .. K-1`` against the reference class 0 (clamped
    away from 0 and 1), the binary probit offset ``Phi^{-1}(mean y)`` when ``K = 2``.

    Parameters
    ----------
    codes : LongTensor [N] class codes ``0 .. K-1``
    n_classes : int K
    """
    n = torch.bincount(codes.long().cpu(), minlength=n_classes).double()
    p = (n[1:] / (n[1:] + n[0]).clamp(min=1.0)).clamp(1e-6, 1 - 1e-6)
    return torch.special.ndtri(p)


def mnp_probabilities(f: torch.Tensor) -> torch.Tensor:
    """Class probabilities of the multinomial probit with independent unit-variance utilities.

    Class 0 is the reference, of utility 0; class ``u >= 1`` has utility ``W_u = f_u + e_u``,
    ``e_u ~ N(0, 1)`` independent, and the class is the argmax (Kindo, Wang & Pena 2016, with the
    utilities' covariance fixed to the identity). So

    ``P(0) = prod_u Phi(-f_u)``,  ``P(u) = int_0^inf phi(z - f_u) prod_{v != u} Phi(z - f_v) dz``,

    the integrals by ``GL_NODES``-point Gauss-Legendre on ``[0, max(f) + 8]`` (the integrand is
    below ``phi(8)`` beyond), renormalised to sum to one. With one utility (``K = 2``), ``P(1) =
    Phi(f_1)`` exactly: binary probit. The model is not symmetric in the classes: which class is the
    reference (the first of the sorted labels) changes the fit.

    Parameters
    ----------
    f : Tensor [..., U, M], the utilities' means (offset plus sum of trees)

    Returns
    -------
    Tensor [..., U + 1, M] float64
    """
    f = f.double()
    p0 = torch.special.ndtr(-f).prod(-2)
    if f.shape[-2] == 1:
        return torch.stack([p0, torch.special.ndtr(f[..., 0, :])], -2)
    x, w = np.polynomial.legendre.leggauss(GL_NODES)
    x = torch.as_tensor((x + 1.0) / 2.0, dtype=torch.float64, device=f.device)
    w = torch.as_tensor(w / 2.0, dtype=torch.float64, device=f.device)
    span = f.amax(-2).clamp(min=0.0) + 8.0  # [..., M]
    z = span[..., None] * x  # [..., M, J]
    d = z[..., None, :, :] - f[..., None]  # [..., U, M, J]
    log_cdf = torch.special.log_ndtr(d)
    log_pdf = -0.5 * d * d - 0.5 * math.log(2.0 * math.pi)
    integrand = torch.exp(log_pdf + log_cdf.sum(-3, keepdim=True) - log_cdf)
    pu = (integrand * w).sum(-1) * span[..., None, :]  # [..., U, M]
    p = torch.cat([p0[..., None, :], pu], -2)
    return p / p.sum(-2, keepdim=True)
