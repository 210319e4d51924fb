"""Posterior draws behind the plots: each draw's prediction at given rows, each draw's splits per
feature, and the posterior predictive CDF at observed targets (for the PIT), for hard trees, BART
and soft trees alike.

A *draw* is one member of the posterior with its weight: a distinct tree of a hard-tree
posterior (weights from the sampler), one kept sweep of BART (equal weights), or one stored
draw of a soft-tree topology (the topology's weight shared equally by its draws).
"""
from __future__ import annotations

import math
from typing import Any, Optional, Tuple

import numpy as np
import torch

from torchtree.core.validate import check_int
from torchtree.model.bart import mnp_probabilities
from torchtree.model.posterior_base import Posterior
from torchtree.model.trees import INTERNAL
from torchtree.plot.common import as_numpy, class_index, kind_of

__all__ = ["prediction_draws", "split_counts", "tree_inclusion", "predictive_cdf", "student_t_cdf", "tree_inputs", "thin_by_weight"]

#: Gauss-Legendre nodes of the Student-t CDF quadrature (exact to about 1e-12 for df >= 2)
T_NODES = 48
#: soft-tree topologies lighter than this share of the heaviest are left out, as their predict does
MIN_TOPOLOGY_WEIGHT = 1e-8


def tree_inputs(post, X) -> torch.Tensor:
    """``X`` as the hard-tree posterior routes it (:meth:`~torchtree.TreePosterior.inputs`: a frame's columns
    by name, coded when the training table was, the trees' dtype and device)."""
    return post.inputs(X)


def thin_by_weight(weights: torch.Tensor, max_draws: Optional[int]) -> Tuple[torch.Tensor, torch.Tensor]:
    """Indices and weights of at most ``max_draws`` members: all of them when they are few enough,
    else a systematic resample by weight (deterministic; repeated picks merged, their weights added)."""
    w = weights.double().cpu()
    w = w / w.sum()
    if max_draws is None or w.numel() <= int(max_draws):
        return torch.arange(w.numel()), w
    n = int(max_draws)
    u = (torch.arange(n, dtype=torch.float64) + 0.5) / n
    idx = torch.searchsorted(torch.cumsum(w, 0), u).clamp(max=w.numel() - 1)
    uniq, counts = torch.unique(idx, return_counts=True)
    return uniq, counts.double() / n


def _n_classes(post) -> int:
    classes = getattr(post, "classes_", None)
    if classes is not None:
        return len(classes)
    if kind_of(post) == "hard":
        return int(post.trees.stats.shape[-1])
    if kind_of(post) == "bart":
        return post.n_utilities + 1
    return int(post.data.n_classes)


def prediction_draws(post: Posterior, X: Any, target_class: Any = None,
                     max_draws: Optional[int] = 500) -> Tuple[np.ndarray, np.ndarray]:
    """Each draw's prediction at the rows of ``X``, and the draws' weights.

    Parameters
    ----------
    post : TreePosterior, BARTPosterior or SoftTreePosterior
    X : array-like [M, D]
    target_class : label, optional
        Classification: the class whose probability is returned (default: the last class, the
        positive class of a binary task).
    max_draws : int >= 1 or None
        At most this many draws: a systematic resample by weight of a hard-tree posterior's trees,
        evenly spaced BART sweeps, at most this many draws per soft-tree topology (evenly thinned,
        as the soft posterior's ``predict`` does). None: every draw.

    Returns
    -------
    values : numpy.ndarray [S, M] float64
        Regression: the draw's mean of ``y`` (a tree's leaf predictive mean, BART's ``f_s(x)``, a soft
        tree's output). Classification: the draw's probability of ``target_class``.
    weights : numpy.ndarray [S] float64, summing to 1
        Their weighted sum over draws is the posterior predictive mean (``predict`` for regression,
        a column of ``predict_proba`` for classification).
    """
    if max_draws is not None:
        max_draws = check_int("max_draws", max_draws, 1)
    kind, task = kind_of(post), post.task
    k = class_index(post, target_class, _n_classes(post)) if task == "classification" else None
    if kind == "hard":
        idx, w = thin_by_weight(post.weights, max_draws)
        rows = post.trees.take(idx.to(post.trees.device)).predict(tree_inputs(post, X), post.likelihood)
        vals = rows[..., k] if task == "classification" else rows[..., 1]
        return vals.double().cpu().numpy(), w.numpy()
    if kind == "bart":
        vals = post.latent_draws(X)  # [S, M], or [S, K - 1, M]: each utility's mean (K >= 3 classes)
        S = vals.shape[0]
        if max_draws is not None and S > int(max_draws):  # thinned before the costly class probabilities
            vals = vals[torch.linspace(0, S - 1, int(max_draws)).round().long().to(vals.device)]
        if task == "classification":
            vals = (mnp_probabilities(vals) if vals.dim() == 3 else
                    torch.stack([torch.special.ndtr(-vals), torch.special.ndtr(vals)], 1))[:, k, :]
        vals = vals.double().cpu()
        return vals.numpy(), np.full(vals.shape[0], 1.0 / vals.shape[0])
    parts, weights = [], []
    w = post.weights
    for m in range(len(post.topologies)):
        if post.draws[m].shape[0] == 0 or w[m] < MIN_TOPOLOGY_WEIGHT * w.max():
            continue
        d = post.predict_draws(X, m, max_draws).double().cpu()
        d = d[..., k] if task == "classification" else d
        parts.append(d)
        weights.append(torch.full((d.shape[0],), float(w[m]) / d.shape[0], dtype=torch.float64))
    wt = torch.cat(weights)
    return torch.cat(parts).numpy(), (wt / wt.sum()).numpy()


def split_counts(post: Posterior) -> Tuple[np.ndarray, np.ndarray]:
    """Each draw's splits per input column, and the draws' weights.

    Returns
    -------
    counts : numpy.ndarray [S, D_in] float64
        Hard trees: the tree's split nodes on each input column; BART: the split nodes on each
        column over all trees of the draw (every class utility's forest, multinomial probit);
        soft trees: the mean gate weight per column over the internal nodes and draws of each
        topology (one row per topology, a weight of use, not a count).
    weights : numpy.ndarray [S] float64, summing to 1
    """
    kind = kind_of(post)
    if kind == "soft":
        usage = torch.stack([post.feature_usage(m).double() for m in range(len(post.topologies))])
        return usage.cpu().numpy(), post.weights.double().cpu().numpy()
    if kind == "hard":
        t = post.trees
        D = post.n_features
        f = torch.where(t.status == INTERNAL, t.feature.long(), torch.full_like(t.feature.long(), D))
        w = post.weights.double().cpu().numpy()
    else:
        D = post.n_features
        feat = post.feature.long().reshape(post.n_particles, -1)  # a draw's forests are consecutive
        f = torch.where(feat >= 0, feat, torch.full_like(feat, D))
        w = np.full(post.n_particles, 1.0 / post.n_particles)
    counts = torch.zeros(f.shape[0], D + 1, dtype=torch.float64, device=f.device)
    counts.scatter_add_(1, f, torch.ones_like(f, dtype=torch.float64))
    out = counts[:, :D].cpu().numpy()
    enc = getattr(post, "encoder", None)
    return (enc.group_sums(out) if enc is not None else out), w


def tree_inclusion(post: Posterior) -> Tuple[np.ndarray, np.ndarray]:
    """Each draw's share of its trees that split on each input column at least once, and the draws' weights.

    Hard trees: 1 where the draw's tree splits on the column, else 0. BART: the share of the draw's
    ``T`` trees (``U T`` with ``U`` class utilities) that use the column: a forest of many trees uses
    nearly every column somewhere, so whether the draw uses it says little. A column split into several
    split columns (a categorical or one with missing values) counts once per tree.

    Returns
    -------
    shares : numpy.ndarray [S, D_in] float64 in [0, 1]
    weights : numpy.ndarray [S] float64, summing to 1
    """
    kind = kind_of(post)
    if kind == "soft":
        raise ValueError("tree inclusion applies to hard trees and BART (a soft tree's gates use every feature)")
    enc = getattr(post, "encoder", None)
    if kind == "hard":
        t = post.trees
        f = torch.where(t.status == INTERNAL, t.feature.long(), torch.full_like(t.feature.long(), -1))[:, None, :]
        w = post.weights.double().cpu().numpy()
    else:
        f = post.feature.long().reshape(post.n_particles, -1, post.feature.shape[-1])  # [S, U T, K]
        w = np.full(post.n_particles, 1.0 / post.n_particles)
    S, T, _ = f.shape
    n_in = enc.n_inputs if enc is not None else post.n_features
    if enc is not None:  # split column -> its input column
        groups = torch.as_tensor(np.asarray(enc.groups), dtype=torch.long, device=f.device)
        f = torch.where(f >= 0, groups[f.clamp(min=0)], f)
    tree = torch.arange(S * T, device=f.device).view(S, T, 1).expand_as(f)
    key = (tree * n_in + f)[f >= 0].unique()  # one key per (draw, tree, input column) used
    counts = torch.zeros(S * n_in, dtype=torch.float64, device=f.device)
    counts.index_add_(0, (key // n_in // T) * n_in + key % n_in, torch.ones_like(key, dtype=torch.float64))
    return (counts.view(S, n_in) / T).cpu().numpy(), w


def student_t_cdf(x: torch.Tensor, df: torch.Tensor) -> torch.Tensor:
    """The Student-t CDF at ``x`` with ``df`` degrees of freedom (broadcast; float64).

    With ``x = sqrt(df) tan(u)`` the CDF is ``1/2 + c(df) int_0^atan(x / sqrt(df)) cos(u)^(df - 1) du``,
    ``c(df) = Gamma((df + 1) / 2) / (sqrt(pi) Gamma(df / 2))``, a smooth integrand for ``df >= 1``
    taken by Gauss-Legendre quadrature with :data:`T_NODES` nodes.
    """
    x, df = torch.broadcast_tensors(x.double(), df.double())
    nodes, wts = np.polynomial.legendre.leggauss(T_NODES)
    nodes = torch.as_tensor(nodes, dtype=torch.float64, device=x.device)
    wts = torch.as_tensor(wts, dtype=torch.float64, device=x.device)
    theta = torch.atan(x / df.sqrt())  # in (-pi/2, pi/2)
    u = theta[..., None] * (nodes + 1) / 2  # [..., nodes] on [0, theta]
    integral = (theta / 2) * (torch.cos(u).clamp_min(0).pow(df[..., None] - 1) * wts).sum(-1)
    c = torch.exp(torch.lgamma((df + 1) / 2) - torch.lgamma(df / 2)) / math.sqrt(math.pi)
    return (0.5 + c * integral).clamp(0.0, 1.0)


def predictive_cdf(posterior: Any, X: Any, y: Any, max_draws: Optional[int] = None) -> np.ndarray:
    """The posterior predictive CDF at the observed targets, ``P(Y <= y_i | x_i, data)`` (regression):
    the probability integral transform (PIT) of a calibration check, uniform on (0, 1) when the
    predictive distribution is calibrated.

    Hard trees: the weighted mixture over trees of the leaf Student-t predictives; BART: the mean
    over draws of ``Phi((y - f_s(x)) / sigma_s)``; soft trees: the weighted mixture over topologies
    of the mean over draws of the Gaussian ``N(f(x), exp(log variance))`` of each draw.

    Parameters
    ----------
    posterior : a regression posterior, or a fitted regressor
    X : array-like [M, D]
    y : array-like [M]
    max_draws : int or None
        Hard trees: at most this many trees (systematic resample by weight); None: all.

    Returns
    -------
    numpy.ndarray [M] float64 in [0, 1]
    """
    from torchtree.plot.common import posterior_of

    post = posterior_of(posterior)
    if post.task != "regression":
        raise ValueError("the predictive CDF (PIT) applies to regression; for classification use "
                         "plot_calibration's reliability diagram")
    yt = torch.as_tensor(np.asarray(as_numpy(y), dtype=np.float64).reshape(-1))
    kind = kind_of(post)
    if kind == "bart":
        f = post.latent_draws(X).double().cpu()
        if f.shape[1] != yt.shape[0]:
            raise ValueError(f"X has {f.shape[1]} rows but y has {yt.shape[0]}")
        sd = (post.sigma.double().cpu() * post.prior.scale)[:, None]
        return torch.special.ndtr((yt[None, :] - f) / sd).mean(0).numpy()
    if kind == "hard":
        Xt = tree_inputs(post, X)
        if Xt.shape[0] != yt.shape[0]:
            raise ValueError(f"X has {Xt.shape[0]} rows but y has {yt.shape[0]}")
        idx, w = thin_by_weight(post.weights, max_draws)
        trees = post.trees.take(idx.to(post.trees.device))
        out = torch.zeros(yt.shape[0], dtype=torch.float64)
        step = max(1, (1 << 20) // max(1, T_NODES * yt.shape[0]))  # trees per block: the quadrature's memory
        for s in range(0, trees.n_trees, step):
            part = trees.take(torch.arange(s, min(s + step, trees.n_trees), device=trees.device))
            rows = part.predict(Xt, post.likelihood).double().cpu()  # [q, M, 3]: df, loc, scale
            z = (yt[None, :] - rows[..., 1]) / rows[..., 2]
            out += (w[s:s + part.n_trees, None] * student_t_cdf(z, rows[..., 0])).sum(0)
        return out.clamp(0.0, 1.0).numpy()
    w = post.weights
    total, out = 0.0, torch.zeros(yt.shape[0], dtype=torch.float64)
    for m in range(len(post.topologies)):
        if post.draws[m].shape[0] == 0 or w[m] < MIN_TOPOLOGY_WEIGHT * w.max():
            continue
        mean = post.predict_draws(X, m, None).double().cpu()  # [S, M]
        if mean.shape[1] != yt.shape[0]:
            raise ValueError(f"X has {mean.shape[1]} rows but y has {yt.shape[0]}")
        sd = post.draws[m][:, -1].double().cpu().exp().sqrt()[:, None]  # the draw's log variance is last
        out += float(w[m]) * torch.special.ndtr((yt[None, :] - mean) / sd).mean(0)
        total += float(w[m])
    return (out / total).numpy()

