"""Exact answers on tiny data, by enumeration, for statistical tests.

For the Chipman prior with a conjugate leaf likelihood, the evidence of a node
with data set ``A`` at depth ``q`` obeys::

    Z(A, q) = (1 - p_q) l(Y_A) + p_q / |D_A| * sum_{d in D_A} sum_j (gap_j / range_d) Z(L_j, q+1) Z(R_j, q+1)

where ``j`` runs over the intervals between consecutive distinct values of
``x_d`` in ``A`` (any cut inside interval ``j`` gives the same children
``L_j``, ``R_j``), and ``Z(A, q) = l(Y_A)`` when no dimension varies. The
recursion is memoised on (subset, depth); it is exponential in general, so
keep N <= ~12.

:func:`check_likelihood` checks a leaf likelihood of one's own against its contract
(docs/writing_a_likelihood.md).
"""
from __future__ import annotations

import math
from functools import lru_cache
from typing import Dict, Tuple

import numpy as np
import torch

from torchtree.model.likelihood_checks import check_likelihood

__all__ = ["exact_log_evidence", "exact_predictive", "exact_prior_leaves", "exact_prior_depth", "exact_bart_tree",
           "exact_table", "check_likelihood"]


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

    @staticmethod
    def frac_left(split, x: np.ndarray) -> float:
        """Share of the split's cuts that send ``x`` left: cuts tau in (v0, v1), left when x_d <= tau."""
        d, v0, v1 = split[:3]
        return min(max((v1 - float(x[d])) / (v1 - v0), 0.0), 1.0)

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
        for split in sp:
            _, _, _, w, lm, rm = split
            frac_left = self.frac_left(split, x)
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
    """Exact posterior predictive at query points, by enumerating every tree on the data.

    Parameters
    ----------
    data : Data (N <= 16; exponential cost)
    prior : ChipmanPrior
    likelihood : DirichletMultinomial or NormalInverseGamma
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


def exact_bart_tree(bins: np.ndarray, n_cuts, prior, resid=None, sigma2: float = 1.0, groups=None,
                    evidence: bool = False):
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
    groups : int array [D], optional, the input column of each feature of a coded table: the
        feature is then an input column uniform among those with a cut left, then a feature of
        it uniform among its features with a cut left

    evidence : bool, also return ``log p(resid | sigma2)``, the tree and its leaves integrated out
        (``-N/2 log(2 pi sigma2) - sum(resid^2) / (2 sigma2)`` plus the log of the prior-weighted sum of
        :func:`~torchtree.steps.bart_moves.log_marginal` over the trees), for integrating ``sigma2`` out

    Returns
    -------
    leaves : numpy.ndarray [L], entry ``m`` is P(tree has m leaves)
    mean : numpy.ndarray [N], the posterior mean of the tree's value at each point
    log_evidence : float, with ``evidence=True``
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
        # with ``evidence`` each leaf's factor carries its points' exp(-r^2 / (2 sigma2)), which bounds it (so a
        # small sigma2 does not overflow) and makes the trees' sum the evidence up to the Gaussian's constant
        shift = float((r[inside] ** 2).sum()) / (2 * sigma2) if evidence else 0.0
        w = 1.0 if resid is None else math.exp(float(log_marginal(torch.tensor(n, dtype=torch.float64),
                                                                     torch.tensor(s, dtype=torch.float64),
                                                                     torch.tensor(sigma2, dtype=torch.float64),
                                                                     tau2)) - shift)
        m = tau2 * s / (sigma2 + n * tau2)
        avail = [d for d, (lo, hi) in enumerate(ranges) if hi > lo]
        p = float(prior.split_prob(torch.tensor(q))) if avail else 0.0
        dist = np.zeros(size)
        dist[1] = (1.0 - p) * w
        mean = (1.0 - p) * w * m * inside
        g_of = list(range(len(ranges))) if groups is None else [int(g) for g in groups]
        n_groups = len({g_of[d] for d in avail})
        for d in avail:
            lo, hi = ranges[d]
            c = p / n_groups / sum(g_of[e] == g_of[d] for e in avail) / (hi - lo)
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
    if not evidence:
        return dist / z, mean / z
    if z == 0.0:  # every tree's factor underflowed: the evidence is negligible at this sigma2
        return dist, mean, -math.inf
    log_ev = math.log(z) - 0.5 * N * math.log(2 * math.pi * sigma2)  # the leaves' shifts hold -sum(r^2) / (2 sigma2)
    return dist / z, mean / z, log_ev


class _TableEnumerator(_Enumerator):
    """The same recursion on a raw table, with the missing-value and categorical rules written from
    their definitions (:mod:`torchtree.model.encoding`), not through the encoder: an input column
    uniform among those that can split the node; then, for a numeric column with missing values in
    training, the missing side (1/2 each) and a cut uniform on the node's observed range extended
    to the stand-in ``max + delta`` (side right) or ``min - delta`` (side left) when the node holds
    missing values (the extension is the rule "is missing"); for a categorical column a non-trivial
    partition of the node's levels (missing is a level), uniform."""

    def __init__(self, X, y, prior, likelihood, categorical, n_classes):
        X = np.asarray(X, dtype=object)
        if X.shape[0] > 16:
            raise ValueError("exact enumeration is meant for tiny data (N <= 16)")
        self.N, self.D = X.shape
        self.prior, self.lik = prior, likelihood
        yt = torch.as_tensor(np.asarray(y))
        self.pstats = likelihood.point_stats(yt, n_classes).double().numpy()
        self.cols = []
        for d in range(self.D):
            cells = X[:, d].tolist()
            miss = np.array([v is None or v != v for v in cells])
            if d in categorical:
                labels = sorted({v for v, m in zip(cells, miss) if not m}, key=str)
                code = np.array([len(labels) if m else labels.index(v) for v, m in zip(cells, miss)])
                self.cols.append(("cat", code, labels, bool(miss.any()), int(np.bincount(code).argmax())))
            else:
                v = np.array([np.nan if m else float(c) for c, m in zip(cells, miss)])
                obs = np.unique(v[~miss])
                delta = (obs[-1] - obs[0]) / (len(obs) - 1) if len(obs) > 1 else 1.0
                self.cols.append(("num", v, float(obs[0]), float(obs[-1]), float(delta), bool(miss.any()),
                                  float(np.median(v[~miss]))))

    def _column_splits(self, d: int, idx: np.ndarray):
        col = self.cols[d]
        out = []  # (weight within the column, left rows, route)
        if col[0] == "cat":
            code = col[1][idx]
            lv = sorted(set(code.tolist()))
            k = len(lv)
            for m in range(2 ** (k - 1) - 1):
                S = {lv[0]} | {lv[i + 1] for i in range(k - 1) if m >> i & 1}
                out.append((1.0 / (2 ** (k - 1) - 1), idx[np.isin(code, list(S))], ("set", d, frozenset(S))))
            return out
        _, v, lo_d, hi_d, delta, has_missing, _ = col
        xs = v[idx]
        miss = np.isnan(xs)
        obs = np.unique(xs[~miss])
        sides = ("right", "left") if has_missing else (None,)
        for side in sides:
            top = obs[-1] if not miss.any() else (hi_d + delta if side == "right" else obs[-1])
            bot = obs[0] if not miss.any() else (lo_d - delta if side == "left" else obs[0])
            rng = top - bot
            for j in range(len(obs) - 1):
                left = idx[(~miss & (xs <= obs[j])) | (miss & (side == "left"))]
                out.append(((obs[j + 1] - obs[j]) / rng / len(sides), left, ("cut", d, obs[j], obs[j + 1], side)))
            if miss.any():
                gap = (top - obs[-1]) if side == "right" else (obs[0] - bot)
                left = idx[~miss] if side == "right" else idx[miss]
                out.append((gap / rng / len(sides), left, ("miss", d, side)))
        return out

    @lru_cache(maxsize=None)
    def splits(self, mask: int):
        idx = self.members(mask)
        per_col = []
        for d in range(self.D):
            col = self.cols[d]
            if col[0] == "cat":
                ok = len(set(col[1][idx].tolist())) > 1
            else:
                xs = col[1][idx]
                n_obs = len(np.unique(xs[~np.isnan(xs)]))
                ok = n_obs > 1 or (n_obs == 1 and bool(np.isnan(xs).any()))
            if ok:
                per_col.append(self._column_splits(d, idx))
        out = []
        for parts in per_col:
            for w, left, route in parts:
                lm = sum(1 << int(i) for i in left)
                out.append((route, None, None, w / len(per_col), lm, mask & ~lm))
        return tuple(out)

    def frac_left(self, split, x) -> float:
        route = split[0]
        d = route[1]
        xd = x[d]
        if route[0] == "set":
            return 1.0 if xd in route[2] else 0.0
        missing = xd != xd
        if route[0] == "miss":
            return float(missing == (route[2] == "left"))
        if missing:
            return 1.0 if route[4] == "left" else 0.0
        return min(max((route[3] - xd) / (route[3] - route[2]), 0.0), 1.0)

    def query(self, row) -> list:
        """A query row in the enumerator's terms: level codes; what training has no rule for replaced
        by the training median (numeric) or most frequent level (categorical)."""
        out = []
        for d, v in enumerate(row):
            col = self.cols[d]
            miss = v is None or v != v
            if col[0] == "cat":
                labels, has_missing, mode = col[2], col[3], col[4]
                if not miss and v in labels:
                    out.append(labels.index(v))
                else:
                    out.append(len(labels) if has_missing else mode)
            else:
                out.append(np.nan if miss and col[5] else (col[6] if miss else float(v)))
        return out


def exact_table(X, y, prior, likelihood, categorical=(), n_classes=None, X_query=None):
    """Exact log evidence (and posterior predictive) of a single tree on a tiny raw table with
    missing values and categorical columns, from the model's definitions (:class:`_TableEnumerator`).

    Parameters
    ----------
    X : array-like [N, D] (object): numbers, NaN / None for missing, any labels in ``categorical`` columns
    y : array-like [N]: class codes ``0..K-1`` (with ``n_classes``) or float targets
    prior : ChipmanPrior
    likelihood : DirichletMultinomial or NormalInverseGamma
    categorical : sequence of int, the column indices that are categorical (default none)
    n_classes : int, optional; the number of classes ``K`` of a classification ``y``
    X_query : array-like [M, D] (object), optional; the points of the predictive (None: evidence only)

    Returns
    -------
    (log evidence float, predictive numpy.ndarray [M, K] or [M, 1] (regression mean), or None)

    Raises
    ------
    ValueError
        More than 16 rows (the enumeration's cost is exponential in N).
    """
    e = _TableEnumerator(X, y, prior, likelihood, set(categorical), n_classes)
    full = (1 << e.N) - 1
    logz = e.logz(full, 0)
    if X_query is None:
        return logz, None
    out = []
    for row in np.asarray(X_query, dtype=object):
        val = e.log_pred_weighted(full, 0, e.query(list(row)), {})
        out.append(val / math.exp(logz) if likelihood.task == "regression" else np.exp(val - logz))
    return logz, np.array(out)
