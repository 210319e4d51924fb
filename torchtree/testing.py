"""Exact answers on tiny data, by enumeration, for statistical tests.

For the Chipman prior with a conjugate leaf likelihood, the evidence of a node
with data set ``A`` at depth ``q`` obeys::

    Z(A, q) = (1 - p_q) l(Y_A) + p_q / |D_A| * sum_{d in D_A} sum_j (gap_j / range_d) Z(L_j, q+1) Z(R_j, q+1)

where ``j`` runs over the intervals between consecutive distinct values of
``x_d`` in ``A`` (any cut inside interval ``j`` gives the same children
``L_j``, ``R_j``), and ``Z(A, q) = l(Y_A)`` when no dimension varies. The
recursion is memoised on (subset, depth); it is exponential in general, so
keep N <= ~12.
"""
from __future__ import annotations

import math
from functools import lru_cache
from typing import Dict, Tuple

import numpy as np
import torch

__all__ = ["exact_log_evidence", "exact_predictive", "exact_prior_leaves", "exact_prior_depth", "exact_bart_tree"]


def _logaddexp(a: float, b: float) -> float:
    if a == -math.inf:
        return b
    if b == -math.inf:
        return a
    m = max(a, b)
    return m + math.log(math.exp(a - m) + math.exp(b - m))


class _Enumerator:
    def __init__(self, data, prior, likelihood):
        X = data.X.double().cpu().numpy()
        if X.shape[0] > 16:
            raise ValueError("exact enumeration is meant for tiny data (N <= 16)")
        self.X = X
        self.N, self.D = X.shape
        self.prior = prior
        self.lik = likelihood
        ps = likelihood.point_stats(data.y.cpu(), data.n_classes).double()
        self.pstats = ps.numpy()

    def split_p(self, q: int) -> float:
        return float(self.prior.split_prob(torch.tensor([q]))[0])

    def members(self, mask: int) -> np.ndarray:
        return np.array([i for i in range(self.N) if mask >> i & 1], dtype=np.int64)

    @lru_cache(maxsize=None)
    def loglik(self, mask: int) -> float:
        s = torch.as_tensor(self.pstats[self.members(mask)].sum(0))
        return float(self.lik.log_marginal(s))

    @lru_cache(maxsize=None)
    def splits(self, mask: int) -> Tuple[Tuple[int, float, float, float, int, int], ...]:
        """(dim, lo_value, hi_value, weight = gap / range / |D|, left mask, right mask) per interval."""
        idx = self.members(mask)
        xs = self.X[idx]
        varying = [d for d in range(self.D) if xs[:, d].max() > xs[:, d].min()]
        out = []
        for d in varying:
            vals = np.unique(xs[:, d])
            rng = vals[-1] - vals[0]
            for j in range(len(vals) - 1):
                lmask = sum(1 << int(i) for i in idx if self.X[i, d] <= vals[j])
                out.append((d, float(vals[j]), float(vals[j + 1]), (vals[j + 1] - vals[j]) / rng / len(varying), lmask, mask & ~lmask))
        return tuple(out)

    @lru_cache(maxsize=None)
    def logz(self, mask: int, q: int) -> float:
        sp = self.splits(mask)
        if not sp:
            return self.loglik(mask)
        p = self.split_p(q)
        acc = math.log1p(-p) + self.loglik(mask)
        for _, _, _, w, lm, rm in sp:
            acc = _logaddexp(acc, math.log(p) + math.log(w) + self.logz(lm, q + 1) + self.logz(rm, q + 1))
        return acc

    def log_pred_weighted(self, mask: int, q: int, x: np.ndarray, cache: Dict) -> np.ndarray:
        """Sum over subtrees T of p(T) l(Y|T) f(leaf of x in T), where f is the leaf's
        predictive probability vector (classification, returned in log space) or its
        predictive mean (regression, returned in linear space: it can be negative)."""
        key = (mask, q)
        if key in cache:
            return cache[key]
        reg = self.lik.task == "regression"
        s = torch.as_tensor(self.pstats[self.members(mask)].sum(0))
        row = self.lik.predictive_table(s[None])[0].double().numpy()
        leaf_f = row[1:2] if reg else np.log(row)
        sp = self.splits(mask)
        p = self.split_p(q) if sp else 0.0
        stop_l = (math.log1p(-p) if sp else 0.0) + self.loglik(mask)
        res = math.exp(stop_l) * leaf_f if reg else stop_l + leaf_f
        for d, v0, v1, w, lm, rm in sp:
            # Cuts tau in (v0, v1): x goes left when x_d <= tau.
            xd = float(x[d])
            frac_left = min(max((v1 - xd) / (v1 - v0), 0.0), 1.0)
            for frac, go, other in ((frac_left, lm, rm), (1.0 - frac_left, rm, lm)):
                if frac <= 0:
                    continue
                lt = math.log(p) + math.log(w * frac) + self.logz(other, q + 1)
                sub = self.log_pred_weighted(go, q + 1, x, cache)
                res = res + math.exp(lt) * sub if reg else np.logaddexp(res, lt + sub)
        cache[key] = res
        return res


def exact_log_evidence(data, prior, likelihood) -> float:
    """Exact ``log p(Y | X)`` under the Chipman prior and a conjugate likelihood.

    Parameters
    ----------
    data : Data (N <= 16; exponential cost)
    prior : ChipmanPrior
    likelihood : DirichletMultinomial or NormalInverseGamma

    Returns
    -------
    float
    """
    e = _Enumerator(data, prior, likelihood)
    return e.logz((1 << e.N) - 1, 0)


def exact_predictive(data, prior, likelihood, X_query) -> np.ndarray:
    """Exact posterior predictive at query points.

    Parameters
    ----------
    X_query : array [M, D]

    Returns
    -------
    numpy.ndarray [M, K]: class probabilities (classification), or for regression
    [M, 1] the posterior predictive mean.
    """
    e = _Enumerator(data, prior, likelihood)
    full = (1 << e.N) - 1
    logz = e.logz(full, 0)
    Xq = np.asarray(X_query, dtype=np.float64)
    out = []
    for x in Xq:
        val = e.log_pred_weighted(full, 0, x, {})
        out.append(val / math.exp(logz) if likelihood.task == "regression" else np.exp(val - logz))
    return np.array(out)


def _prior_dist(data, prior, what: str) -> np.ndarray:
    X = data.X.double().cpu().numpy()
    N, D = X.shape

    class _E(_Enumerator):
        def __init__(self):
            self.X, self.N, self.D, self.prior = X, N, D, prior

    en = _E()

    @lru_cache(maxsize=None)
    def dist(mask: int, q: int) -> Tuple[float, ...]:
        sp = en.splits(mask)
        size = N + 1 if what == "leaves" else N + 2
        stop = np.zeros(size)
        if what == "leaves":
            stop[1] = 1.0
        else:
            stop[q] = 1.0
        if not sp:
            return tuple(stop)
        p = en.split_p(q)
        acc = (1 - p) * stop
        for _, _, _, w, lm, rm in sp:
            a, b = np.array(dist(lm, q + 1)), np.array(dist(rm, q + 1))
            if what == "leaves":
                comb = np.convolve(a, b)[:size]
            else:  # depth of the tree = max of the children's
                ca, cb = np.cumsum(a), np.cumsum(b)
                cm = ca * cb
                comb = np.diff(np.concatenate([[0.0], cm]))
            acc = acc + p * w * comb
        return tuple(acc)

    return np.array(dist((1 << N) - 1, 0))


def exact_prior_leaves(data, prior) -> np.ndarray:
    """Exact prior distribution of the number of leaves on ``data.X``.

    Returns
    -------
    numpy.ndarray [N + 1]: entry ``m`` is P(tree has m leaves).
    """
    return _prior_dist(data, prior, "leaves")


def exact_prior_depth(data, prior) -> np.ndarray:
    """Exact prior distribution of the tree depth (deepest leaf) on ``data.X``.

    Returns
    -------
    numpy.ndarray [N + 2]: entry ``q`` is P(depth == q).
    """
    return _prior_dist(data, prior, "depth")


def exact_bart_tree(bins: np.ndarray, n_cuts, prior, resid=None, sigma2: float = 1.0):
    """Exact posterior (or prior) of ONE BART tree on a cut grid, by enumeration.

    The tree prior is BART's (:class:`torchtree.model.bart.BartPrior`): a node splits with
    ``prior.split_prob(depth)`` when a cut is left in its range, on a feature drawn uniformly
    among those with a cut left, at a cut drawn uniformly among those left. With ``resid``
    the leaves' values ``N(0, prior.tau^2)`` are integrated out against ``N(resid, sigma2)``.
    The recursion runs over (per-feature cut ranges, depth); keep the grid tiny.

    Parameters
    ----------
    bins : int array [N, D] the points' bins (``CutGrid.bins(X).T``)
    n_cuts : sequence [D] cuts per feature
    prior : BartPrior (``tau``, ``split_prob``, ``max_depth``)
    resid : float array [N] or None (None: the prior)
    sigma2 : float, the noise variance

    Returns
    -------
    leaves : numpy.ndarray [L], entry ``m`` is P(tree has m leaves)
    mean : numpy.ndarray [N], the posterior mean of the tree's value at each point
    """
    from torchtree.steps.bart_moves import log_marginal

    bins = np.asarray(bins, dtype=np.int64)
    N, D = bins.shape
    r = np.zeros(N) if resid is None else np.asarray(resid, dtype=np.float64)
    tau2 = prior.tau ** 2
    size = max(N, int(np.prod([c + 1 for c in n_cuts]))) + 2

    @lru_cache(maxsize=None)
    def node(ranges: Tuple[Tuple[int, int], ...], q: int):
        inside = np.all([(bins[:, d] >= lo) & (bins[:, d] <= hi) for d, (lo, hi) in enumerate(ranges)], axis=0)
        n, s = float(inside.sum()), float(r[inside].sum())
        w = 1.0 if resid is None else math.exp(float(log_marginal(torch.tensor(n, dtype=torch.float64),
                                                                     torch.tensor(s, dtype=torch.float64),
                                                                     torch.tensor(sigma2, dtype=torch.float64), tau2)))
        m = tau2 * s / (sigma2 + n * tau2)
        avail = [d for d, (lo, hi) in enumerate(ranges) if hi > lo]
        p = float(prior.split_prob(torch.tensor(q))) if avail else 0.0
        dist = np.zeros(size)
        dist[1] = (1.0 - p) * w
        mean = (1.0 - p) * w * m * inside
        for d in avail:
            lo, hi = ranges[d]
            c = p / len(avail) / (hi - lo)
            for k in range(lo, hi):
                left = ranges[:d] + ((lo, k),) + ranges[d + 1:]
                right = ranges[:d] + ((k + 1, hi),) + ranges[d + 1:]
                dl, ml = node(left, q + 1)
                dr, mr = node(right, q + 1)
                dist = dist + c * np.convolve(dl, dr)[:size]
                mean = mean + c * (ml * dr.sum() + dl.sum() * mr)
        return dist, mean

    dist, mean = node(tuple((0, int(c)) for c in n_cuts), 0)
    z = dist.sum()
    return dist / z, mean / z
