"""``BARTPosterior``: the kept sweeps of a BART run, as draws of a sum of trees.

Draw ``s`` is a forest of ``T`` heap trees (:mod:`torchtree.model.bart`) and a noise sd; its
function is ``f_s(x) = offset + scale * sum_t value[s, t, leaf_t(x)]``. Regression predicts
with ``y ~ N(f_s(x), sigma_s^2)`` mixed over the draws; classification with
``P(y = 1 | x) = mean_s Phi(f_s(x))`` (probit).

Storage holds what the trees use. A heap tree of depth ``d`` needs ``2^(d+1) - 1`` slots, and
one deep tree would set the width of all ``S x T`` trees of a dense array, whose trees hold a
few nodes on average. The trees are kept as a *main* block
``[S, T, K_main]`` and the deeper trees apart as ``[n_deep, K_deep]`` with their draw and tree
indices (their places in the main block hold a single leaf of value 0); ``K_main`` is the heap
width of the depth that makes the two together smallest. Prediction sums both
(:func:`~torchtree.model.bart.forest_sum`), so its work follows the split nodes the trees hold.
"""
from __future__ import annotations

from typing import Any, Dict, Optional, Sequence

import numpy as np
import torch

from torchtree.core.random import keyed_uniform
from torchtree.model.encoding import TableEncoder, needs_encoding, rule_text
from torchtree.model.bart import ABSENT, LEAF, BartPrior, CutGrid, forest_sum, heap_depth, mnp_probabilities, GL_NODES
from torchtree.model.data import as_feature_matrix
from torchtree.model.inputs import ArrayLike, in_training_order
from torchtree.core.budget import rows_per_chunk
from torchtree.core.validate import check_int
from torchtree.model.interval import INTERVAL_BLOCK, check_interval, equal_tailed
from torchtree.model.posterior import PosteriorSummary, to_plain
from torchtree.model.posterior_base import Posterior, StrPath, dot_text

__all__ = ["BARTPosterior"]

_ROWS = 4096  # test points per block of draws x trees
_DRAW_CHUNK = 32  # draws per quadrature batch of multinomial probit probabilities

def _depths(feature: torch.Tensor) -> torch.Tensor:
    """Depth of each heap tree ``[...]`` (of its deepest used slot) from ``feature [..., K]``."""
    K = feature.shape[-1]
    slot = torch.arange(K, device=feature.device)
    last = torch.where(feature != ABSENT, slot, torch.zeros_like(slot)).amax(-1)
    return heap_depth(last)


def _width(depth: int) -> int:
    return (1 << (int(depth) + 1)) - 1


def split_deep(feature, cut, value):
    """Dense ``[S, T, K]`` trees as a main block and the deep trees apart (module notes).

    Returns
    -------
    (main feature, cut, value ``[S, T, K_main]``; deep feature, cut, value ``[n_deep, K_deep]``;
    deep draw and tree indices ``[n_deep]``)
    """
    S, T, K = feature.shape
    d = _depths(feature)
    keep = 0
    if d.numel():
        # the main block's depth that stores all trees in the fewest slots: S T W(keep) for the block,
        # plus W(deepest) for each deeper tree (and its two indices)
        counts = torch.bincount(d.reshape(-1).cpu(), minlength=int(d.max()) + 1).double()
        deeper = counts.sum() - torch.cumsum(counts, 0)
        slots = [d.numel() * _width(k) + float(deeper[k]) * (_width(int(d.max())) + 4) for k in range(counts.numel())]
        keep = int(np.argmin(slots))
    k_main = min(K, _width(keep))
    deep = d > keep
    ds, dt = deep.nonzero(as_tuple=True)
    k_deep = min(K, _width(int(d.max()))) if ds.numel() else 1
    df, dc, dv = feature[ds, dt, :k_deep].clone(), cut[ds, dt, :k_deep].clone(), value[ds, dt, :k_deep].clone()
    mf, mc, mv = feature[..., :k_main].clone(), cut[..., :k_main].clone(), value[..., :k_main].clone()
    mf[ds, dt] = ABSENT
    mf[ds, dt, 0] = LEAF
    mc[ds, dt] = 0
    mv[ds, dt] = 0
    return mf, mc, mv, df, dc, dv, ds, dt


def draw_mean(t: torch.Tensor) -> torch.Tensor:
    """``t.mean(0)`` summed within each point's own row of draws (``[S, ...]`` made ``[..., S]`` contiguous): a
    reduction over the leading dimension of ``[S, M]`` adds in an order that depends on ``M``, so a point's
    prediction moved in its last bit with the block of points around it (the memory budget, the rows
    predicted with it); the inner reduction's order depends on the point's draws alone."""
    return t.movedim(0, -1).contiguous().mean(-1)


class BARTPosterior(Posterior):
    """Draws of a BART model: the kept sweeps of a run, each a sum of trees and a noise sd.

    Draw ``s`` is a forest of ``T`` trees with function
    ``f_s(x) = offset + scale * sum_t value[s, t, leaf_t(x)]``. Regression predicts with
    ``y ~ N(f_s(x), sigma_s^2)`` mixed over the draws; binary classification with
    ``P(y = 1 | x) = mean_s Phi(f_s(x))`` (probit); ``K >= 3`` classes with a multinomial probit of
    ``K - 1`` forests per draw. Chipman, George & McCulloch (2010), "BART: Bayesian additive
    regression trees", Annals of Applied Statistics 4(1).

    Shapes: ``S`` draws of ``T`` trees in heaps of ``K`` slots, ``U = n_utilities`` forests per draw. The
    per-forest arrays (``feature``, ``cut``, ``value``, ``sigma``, ``chain_of``) have ``S * U`` rows: ``[S]``
    / ``[S, T, K]`` for regression and binary classification (``U = 1``), ``[S * U]`` / ``[S * U, T, K]``
    for three or more classes (``U`` = classes - 1; row ``s U + u`` is utility ``u + 1`` of draw ``s``).
    :attr:`weights` is ``[S]`` in both cases.

    Parameters
    ----------
    prior : BartPrior
        The prior and the target's scaling (``offset``, ``scale``).
    grid : CutGrid
        The cut points of each feature (``cut`` indexes them).
    feature : Int16Tensor [S * U, T, K]
        The trees' heap features, dense (they are stored compactly, module notes); or the main block
        when ``deep`` is given.
    cut : Int16Tensor [S * U, T, K]
        Cut indices into ``grid``, as ``feature``.
    value : Tensor [S * U, T, K]
        Leaf values (scaled response), as ``feature``.
    sigma : Tensor [S * U] float64
        Noise sd per forest on the scaled target ``(y - prior.offset) / prior.scale`` (midrange and
        range of the training ``y``; 1 for probit); :attr:`noise_sd` is it in ``y``'s units.
    chain_of : LongTensor [S * U]
        The global chain of each forest (the ``U`` forests of a draw share their chain).
    n_features : int
        Columns of ``X``.
    classes : array-like, optional
        The class labels, in code order (classification).
    info : dict, optional
        Run facts and diagnostics.
    deep : tuple, optional
        The deep trees ``(feature, cut, value, draw, tree)`` of a compact form.
    n_utilities : int
        ``U``, forests per draw: 1, or classes - 1 for three or more classes (multinomial probit: forest
        ``s U + u`` is utility ``u + 1`` of draw ``s``, see :func:`~torchtree.model.bart.mnp_probabilities`).
    offsets : Tensor [n_utilities] float64, optional
        The utilities' offsets (multinomial probit only).
    """

    FORMAT = "torchtree.BARTPosterior/2"
    READ_FORMATS = ("torchtree.BARTPosterior/1", FORMAT)  # /1: dense [S, T, K] trees
    log_evidence: Optional[float]  # None: BART estimates no evidence (read-only in the Posterior protocol)

    def __init__(self, prior: BartPrior, grid: CutGrid, feature, cut, value, sigma, chain_of, n_features: int,
                 classes=None, info: Optional[Dict[str, Any]] = None, deep=None, n_utilities: int = 1,
                 offsets=None) -> None:
        self.prior, self.grid = prior, grid
        if deep is None:  # dense trees: keep the main block and the deep trees apart
            feature, cut, value, *deep = split_deep(feature, cut, value)
        self._main = (feature, cut, value)
        self._deep = tuple(deep)  # feature, cut, value [n_deep, K_deep]; draw, tree [n_deep]
        self.sigma, self.chain_of = sigma.double(), chain_of
        self.n_features = int(n_features)
        self.classes_ = None if classes is None else np.asarray(classes)
        self.info: Dict[str, Any] = dict(info or {})
        self.n_forests = int(feature.shape[0])
        self.n_utilities = int(n_utilities)
        self.offsets = None if offsets is None else torch.as_tensor(offsets, dtype=torch.float64)
        self.n_particles = self.n_forests // self.n_utilities  # draws
        self.n_trees = int(feature.shape[1])
        self.log_evidence = None
        self.feature_names: Optional[list] = None
        self.encoder: Optional[TableEncoder] = None  # the training table's coding (missing values, categories)

    # ----------------------------------------------------------- the trees
    @property
    def device(self) -> torch.device:
        """The device the trees are on."""
        return self._main[0].device

    def _dense(self, i: int, fill) -> torch.Tensor:
        """Field ``i`` of every tree as one dense ``[S, T, K]`` array (the deep trees' width)."""
        main, deep = self._main[i], self._deep[i]
        K = max(main.shape[-1], deep.shape[-1] if deep.numel() else 1)
        out = torch.full((*main.shape[:2], K), fill, dtype=main.dtype, device=main.device)
        out[..., : main.shape[-1]] = main
        if deep.numel():
            ds, dt = self._deep[3], self._deep[4]
            out[ds, dt] = fill
            out[ds, dt, : deep.shape[-1]] = deep
        return out

    @property
    def feature(self) -> torch.Tensor:
        """Every tree's heap features as a dense ``[S, T, K]`` Int16Tensor (built on access, at the
        deepest tree's width: for inspection; the posterior itself keeps the compact form)."""
        return self._dense(0, ABSENT)

    @property
    def cut(self) -> torch.Tensor:
        """Cut indices, dense ``[S, T, K]`` (as :attr:`feature`)."""
        return self._dense(1, 0)

    @property
    def value(self) -> torch.Tensor:
        """Leaf values (scaled response), dense ``[S, T, K]`` (as :attr:`feature`)."""
        return self._dense(2, 0)

    def _tree(self, s: int, t: int):
        """``(feature, cut, value)`` lists of tree ``t`` of draw ``s``."""
        ds, dt = self._deep[3], self._deep[4]
        hit = ((ds == s) & (dt == t)).nonzero()
        if hit.numel():
            k = int(hit[0, 0])
            return tuple(self._deep[i][k].tolist() for i in range(3))
        return tuple(self._main[i][s, t].tolist() for i in range(3))

    def _leaves(self) -> torch.Tensor:
        """Leaves of every tree ``[S, T]``."""
        leaves = (self._main[0] == LEAF).sum(2)
        if self._deep[0].numel():
            leaves[self._deep[3], self._deep[4]] = (self._deep[0] == LEAF).sum(1)
        return leaves

    @property
    def task(self) -> str:
        """``"regression"`` or ``"classification"`` (the prior's task)."""
        return self.prior.task

    @property
    def noise_sd(self) -> torch.Tensor:
        """The noise sd of each draw in ``y``'s units, ``sigma * prior.scale``, [S] float64 (regression; the
        probit's fixed 1 for classifiers)."""
        return self.sigma * self.prior.scale if self.task == "regression" else self.sigma

    @property
    def weights(self) -> torch.Tensor:
        """Equal weights over the draws, [S] float64."""
        return torch.full((self.n_particles,), 1.0 / self.n_particles, dtype=torch.float64)

    # ----------------------------------------------------------- prediction
    def _bins(self, X) -> torch.Tensor:
        X = in_training_order(X, getattr(self, "feature_names", None))  # a frame's columns by name
        coded = self.encoder is not None and (self.encoder.is_coded or needs_encoding(X))
        arr = self.encoder.transform(X) if coded else as_feature_matrix(X, self.n_features)
        Xt = torch.as_tensor(arr, dtype=torch.float64)
        return self.grid.bins(Xt).to(self.device)

    def _blocks(self, Xb: torch.Tensor, per_row_extra: float = 0.0, what: str = "prediction", also: str = ""):
        """``(rows, f)`` per block of test points: ``f`` ``[S, b]`` float64 on the scaled
        response; the block size keeps ``b (8 S + per_row_extra)`` bytes within the memory
        budget (:func:`torchtree.core.budget.rows_per_chunk`), ``b (16 S + per_row_extra)`` where deep
        trees are kept apart (their sums, ``S`` trees at a time, are added to their draws)."""
        M = Xb.shape[1]
        df, dc, dv, ds, _ = self._deep
        S = max(1, self.n_forests)
        per_row = 8.0 * S * (2 if ds.numel() else 1) + per_row_extra
        rows = min(_ROWS, rows_per_chunk(per_row, what, device=self.device, also=also))
        for m0 in range(0, M, rows):
            sl = slice(m0, min(M, m0 + rows))
            f = forest_sum(*self._main, Xb[:, sl])
            for d0 in range(0, ds.numel(), S):  # the deep trees, each a forest of one, added to their draws
                d = slice(d0, d0 + S)
                f.index_add_(0, ds[d], forest_sum(df[d, None, :], dc[d, None, :], dv[d, None, :], Xb[:, sl]))
            yield sl, f

    def latent_draws(self, X: ArrayLike) -> torch.Tensor:
        """``f_s(x)`` per draw and point, ``[S, M]`` float64 on the original scale (the probit
        latent's mean for classification); with ``K >= 3`` classes ``[S, K - 1, M]``, each utility's
        mean. Holds all of them: ``predict``, ``predict_proba``, ``predict_interval`` and
        ``log_predictive`` stream over rows instead. Draws run sweep by sweep with the chains
        interleaved (draw ``s`` is of chain ``chain_of[s * U]``: ``0, 1, ..., C - 1, 0, 1, ...``), so
        ``reshape(-1, C, M)`` gives ``[sweeps, chains, M]``."""
        Xb = self._bins(X)
        rows_per_chunk(8.0 * self.n_particles, "latent_draws", rows_at_once=max(1, Xb.shape[1]),
                       device=self.device, also=" (or predict in smaller batches of rows)")
        out = [f for _, f in self._blocks(Xb)]
        f = torch.cat(out, 1) if out else torch.zeros(self.n_forests, 0, dtype=torch.float64)
        if self.n_utilities > 1:  # [S, U, M]: each utility's mean
            return f.view(self.n_particles, self.n_utilities, -1) + self.offsets.to(f.device)[:, None]
        return self.prior.offset + self.prior.scale * f

    def mixing(self, X) -> Dict[str, np.ndarray]:
        """How well the chains mixed for the function itself: split-R-hat and ESS
        (:func:`~torchtree.model.diagnostics.rhat`, :func:`~torchtree.model.diagnostics.chain_ess`) of the
        draws of ``f_s(x)`` (:meth:`latent_draws`) at each row of ``X``, over the chains. The run's own
        diagnostics (``info``: ``rhat_f``, ``ess_f``) summarise these at the training rows ``info["f_rows"]``
        (:mod:`torchtree.samplers.bart.mixing`).

        Parameters
        ----------
        X : array-like [M, D], e.g. a few training rows

        Returns
        -------
        ``{"rhat": [M], "ess": [M]}`` float64 numpy arrays (``[K - 1, M]`` each with ``K >= 3`` classes)
        """
        from torchtree.model.diagnostics import ess_columns, rhat_columns

        f = self.latent_draws(X).double().cpu().numpy()  # draw-major: draw s of chain c is row s C + c
        C = int(self.chain_of.max()) + 1
        per_chain = f.reshape(f.shape[0] // C, C, -1).transpose(1, 0, 2)  # [C, S, Q]
        return {"rhat": rhat_columns(per_chain).reshape(f.shape[1:]), "ess": ess_columns(per_chain).reshape(f.shape[1:])}

    def _class_probs(self, f: torch.Tensor) -> torch.Tensor:
        """Per-draw class probabilities ``[S, K, b]`` of a block's forest sums ``f`` ``[S U, b]``
        (multinomial probit; draws in chunks, the quadrature's memory stays ``O(chunk U b)``)."""
        U = self.n_utilities
        f = f.view(self.n_particles, U, -1) + self.offsets.to(f.device)[:, None]
        return torch.cat([mnp_probabilities(f[s:s + _DRAW_CHUNK]) for s in range(0, f.shape[0], _DRAW_CHUNK)])

    def _quadrature_bytes(self) -> float:
        """Bytes per test point of :meth:`_class_probs` beyond the forest sums."""
        return 8.0 * (self.n_particles * (self.n_utilities + 1) + 4 * _DRAW_CHUNK * self.n_utilities * GL_NODES)

    def _p1(self, Xb: torch.Tensor) -> torch.Tensor:
        out = torch.empty(Xb.shape[1], dtype=torch.float64, device=Xb.device)
        for sl, f in self._blocks(Xb):
            out[sl] = draw_mean(torch.special.ndtr(self.prior.offset + f))
        return out

    def class_probability_draws(self, X) -> torch.Tensor:
        """Each draw's class probabilities ``[S, K, M]`` float64 (classification; draws in the order
        of the kept sweeps, then the chains). Holds all ``S K M`` values."""
        if self.task != "classification":
            raise ValueError("class_probability_draws applies to classification")
        Xb = self._bins(X)
        out = []
        for _, f in self._blocks(Xb, self._quadrature_bytes() if self.n_utilities > 1 else 0.0):
            if self.n_utilities > 1:
                out.append(self._class_probs(f))
            else:
                p1 = torch.special.ndtr(self.prior.offset + f)
                out.append(torch.stack([1 - p1, p1], 1))
        return torch.cat(out, 2) if out else torch.zeros(self.n_particles, self.n_utilities + 1, 0)

    def predict_proba(self, X: ArrayLike) -> np.ndarray:
        """Posterior predictive class probabilities: ``mean_s (1 - Phi(f_s(x)), Phi(f_s(x)))`` for two
        classes, the draws' mean of :func:`~torchtree.model.bart.mnp_probabilities` for more.

        Parameters
        ----------
        X : array-like [M, D], the training columns (raw values: missing and categorical cells as in fit)

        Returns
        -------
        numpy.ndarray [M, K], columns in ``classes_`` order

        Raises
        ------
        ValueError
            A regression posterior, or ``X`` with another number of columns.
        """
        if self.task != "classification":
            raise ValueError("predict_proba applies to classification")
        if self.n_utilities > 1:
            Xb = self._bins(X)
            out = torch.empty(Xb.shape[1], self.n_utilities + 1, dtype=torch.float64, device=Xb.device)
            for sl, f in self._blocks(Xb, self._quadrature_bytes(), "predict_proba"):
                out[sl] = draw_mean(self._class_probs(f)).T
            return out.cpu().numpy()
        p1 = self._p1(self._bins(X))
        return torch.stack([1 - p1, p1], 1).cpu().numpy()

    def predict(self, X: ArrayLike) -> np.ndarray:
        """The most probable class (original labels), or the posterior mean ``mean_s f_s(x)``
        (regression).

        Parameters
        ----------
        X : array-like [M, D]

        Returns
        -------
        numpy.ndarray [M]
        """
        if self.task == "classification":
            proba = self.predict_proba(X)
            codes = (proba[:, 1] > 0.5).astype(np.int64) if proba.shape[1] == 2 else proba.argmax(1)
            return self.classes_[codes] if self.classes_ is not None else codes
        Xb = self._bins(X)
        out = torch.empty(Xb.shape[1], dtype=torch.float64, device=Xb.device)
        for sl, f in self._blocks(Xb):
            out[sl] = self.prior.offset + self.prior.scale * draw_mean(f)
        return out.cpu().numpy()

    def predict_interval(self, X: ArrayLike, level: float = 0.9, n_draws: int = 4000, seed: int = 0,
                         kind: str = "predictive") -> np.ndarray:
        """Equal-tailed posterior interval ``[M, 2]`` of a new ``y`` (``kind="predictive"``): ``n_draws``
        draws ``f_s(x) + sigma_s e`` with ``s`` uniform over the kept draws and ``e ~ N(0, 1)`` (``e``
        keyed by the draw only and shared by all rows, so a row's interval depends on the row,
        ``level``, ``n_draws`` and ``seed`` only); of the function (``kind="mean"``): draws ``f_s(x)``."""
        level, n_draws = check_interval(self.task, level, n_draws, seed, kind)
        Xb = self._bins(X)
        S, M = self.n_particles, Xb.shape[1]
        dev = self.device
        idx = torch.arange(n_draws, device=dev)
        pick = (keyed_uniform(seed, 0, idx) * S).long().clamp(max=S - 1)
        noise = (self.sigma.to(dev)[pick] * self.prior.scale * torch.special.ndtri(keyed_uniform(seed, 1, idx)))[:, None]
        noise = noise if kind == "predictive" else torch.zeros_like(noise)
        out = np.empty((M, 2))
        for sl, f in self._blocks(Xb, 24.0 * n_draws, f"predict_interval with n_draws={n_draws}",
                                  ", or lower n_draws"):
            for j in range(0, f.shape[1], INTERVAL_BLOCK):  # the draws' arrays stay small (see INTERVAL_BLOCK)
                draws = self.prior.offset + self.prior.scale * f[:, j : j + INTERVAL_BLOCK][pick] + noise
                out[sl.start + j : sl.start + j + draws.shape[1]] = equal_tailed(draws, level)
        return out

    def log_predictive(self, X: ArrayLike, y: ArrayLike) -> float:
        """Mean over points of ``log mean_s p(y | x, draw s)``: the Gaussian density
        ``N(y; f_s(x), sigma_s^2)`` (regression), ``Phi(+-f_s(x))`` (two classes) or the multinomial
        probit probability of ``y`` (more).

        Parameters
        ----------
        X : array-like [M, D]
        y : array-like [M], real targets or labels seen in training

        Returns
        -------
        float

        Raises
        ------
        ValueError
            A label not seen in training.
        """
        Xb = self._bins(X)
        S, M = self.n_particles, Xb.shape[1]
        total = 0.0
        for _, lp in self._log_lik_blocks(Xb, self._encode_y(y, M).to(Xb.device), "log_predictive"):
            total += float((torch.logsumexp(lp, 0) - np.log(S)).sum())
        return total / max(M, 1)

    def _log_lik_blocks(self, Xb: torch.Tensor, yt: torch.Tensor, what: str):
        """``(rows, lp)`` per block of points: ``lp [S, b]`` float64, ``log p(y | x, draw s)`` (see
        :meth:`log_predictive`)."""
        S = self.n_particles
        if self.n_utilities > 1:
            for sl, f in self._blocks(Xb, 16.0 * S + self._quadrature_bytes(), what):
                p = self._class_probs(f)  # [S, K, b]
                yield sl, torch.log(p.gather(1, yt[sl].to(p.device)[None, None, :].expand(S, 1, -1))[:, 0])
            return
        for sl, f in self._blocks(Xb, 16.0 * S, what):
            f = self.prior.offset + self.prior.scale * f
            if self.task == "classification":
                sign = torch.where(yt[sl] == 1, 1.0, -1.0).to(f)
                yield sl, torch.special.log_ndtr(sign * f)
            else:
                sd = (self.sigma.to(f.device) * self.prior.scale)[:, None]
                yield sl, -0.5 * ((yt[sl].double()[None, :] - f) / sd) ** 2 - torch.log(sd) - 0.5 * np.log(2 * np.pi)

    def log_likelihood_draws(self, X, y) -> torch.Tensor:
        """``log p(y_m | x_m, draw s)`` per draw and point, ``[S, M]`` float64 (the terms :meth:`log_predictive`
        averages; draws in the order of the kept sweeps, then the chains): what PSIS-LOO and WAIC read
        (``to_arviz(posterior, X, y)`` exports them as the ``log_likelihood`` group). Holds all ``S M`` values.

        Raises
        ------
        ValueError
            A label not seen in training, or ``S M`` values beyond the memory budget.
        """
        Xb = self._bins(X)
        M = Xb.shape[1]
        rows_per_chunk(8.0 * self.n_particles, "log_likelihood_draws", rows_at_once=max(1, M), device=self.device,
                       also=" (or pass fewer rows)")
        out = [lp for _, lp in self._log_lik_blocks(Xb, self._encode_y(y, M).to(Xb.device), "log_likelihood_draws")]
        return torch.cat(out, 1) if out else torch.zeros(self.n_particles, 0, dtype=torch.float64)

    def predictive_draws(self, X, seed: int = 0) -> np.ndarray:
        """One draw of ``y`` per posterior draw and point, ``[S, M]``: ``f_s(x) + sigma_s e`` in ``y``'s units
        (regression), or a label drawn from the draw's class probabilities (classification, the original
        labels). The random numbers are keyed by ``seed``, the draw and the point's position in ``X`` (independent
        between rows, as a replicate data set's noise is), so a row's draws depend on its position, not on the
        rows after it or their number. Holds all ``S M`` values."""
        Xb = self._bins(X)
        S, M = self.n_particles, Xb.shape[1]
        rows_per_chunk(8.0 * S, "predictive_draws", rows_at_once=max(1, M), device=self.device,
                       also=" (or pass fewer rows)")
        u = keyed_uniform(seed, 2, torch.arange(S, device=Xb.device)[:, None],
                          torch.arange(M, device=Xb.device)[None, :])  # [S, M]: index the draw, slot the row
        if self.task == "regression":
            f = self.latent_draws(X)
            return (f + self.noise_sd.to(f.device)[:, None] * torch.special.ndtri(u.to(f))).cpu().numpy()
        p = self.class_probability_draws(X)  # [S, K, M]
        codes = (p.cumsum(1) < u.to(p)[:, None, :]).sum(1).clamp(max=p.shape[1] - 1).cpu().numpy()
        return np.asarray(self.classes_)[codes] if self.classes_ is not None else codes

    # ----------------------------------------------------------- summaries
    def summary(self) -> PosteriorSummary:
        """Tree sizes, split counts and shares per feature, noise sd and the sampler's diagnostics:
        a :class:`~torchtree.model.posterior.PosteriorSummary` (a dict; printing it shows a table)."""
        leaves = self._leaves().double()  # [S, T]
        main, deep = self._main[0].long(), self._deep[0].long()
        inner = torch.cat([main[main >= 0], deep[deep >= 0]])
        counts = torch.bincount(inner.cpu(), minlength=self.n_features)[: self.n_features]
        if self.encoder is not None:  # per input column (its missing-value sides and level subsets together)
            counts = torch.as_tensor(self.encoder.group_sums(counts.numpy())).long()
        out = {"n_draws": self.n_particles, "n_trees": self.n_trees, "leaves_mean": float(leaves.mean()),
               "split_counts": counts.tolist(), "split_share": (counts.double() / max(1, int(counts.sum()))).tolist()}
        if self.task == "regression":
            s = self.sigma * self.prior.scale
            out["sigma_mean"] = float(s.mean())
        if self.n_utilities > 1:  # multinomial probit: a forest per class but the reference class
            labels = list(self.classes_) if self.classes_ is not None else list(range(self.n_utilities + 1))
            out["reference_class"], out["class_utilities"] = labels[0], labels[1:]
        if self.feature_names is not None:
            out["feature_names"] = list(self.feature_names)
        out.update({k: v for k, v in self.info.items() if k != "trace"})
        return PosteriorSummary(out)

    def variable_importance(self) -> np.ndarray:
        """Share of all splits, over draws and trees, that use each feature ``[D]``."""
        return np.asarray(self.summary()["split_share"])

    def to_dot(self, i: Optional[int] = None, feature_names: Optional[Sequence[str]] = None, tree: int = 0) -> str:
        """Graphviz DOT text of tree ``tree`` of forest ``i`` (default: the last draw's first forest, as
        :func:`torchtree.plot.plot_tree` draws; with ``K >= 3`` classes forest ``s U + u`` is utility
        ``u + 1`` of draw ``s``); edges ``yes`` (the rule holds) and ``no``, as a hard tree's."""
        s = (self.n_particles - 1) * self.n_utilities if i is None else check_int("i", i, 0, self.n_forests - 1)
        tree = check_int("tree", tree, 0, self.n_trees - 1)
        names = feature_names or self.feature_names
        f, c, v = self._tree(s, tree)
        lines = ["digraph tree {"]
        if self.n_utilities > 1:
            labels = list(self.classes_) if self.classes_ is not None else list(range(self.n_utilities + 1))
            lines.append(f'  label="tree {tree} of draw {s // self.n_utilities}: utility of class '
                         f'{dot_text(labels[1 + s % self.n_utilities])}";')
        for j, fj in enumerate(f):
            if fj >= 0:
                rule = rule_text(self.encoder, names, int(fj), float(self.grid.cuts[fj, c[j]]))
                lines.append(f'  n{j} [label="{dot_text(rule)}"];')
                lines.append(f'  n{j} -> n{2 * j + 1} [label="yes"];')
                lines.append(f'  n{j} -> n{2 * j + 2} [label="no"];')
            elif fj == LEAF:
                lines.append(f'  n{j} [label="{self.prior.scale * v[j]:.4g}", shape=box];')
        lines.append("}")
        return "\n".join(lines)

    # ----------------------------------------------------------- files
    def save(self, path: StrPath) -> None:
        """Write the posterior to ``path`` atomically, with a checksum (plain tensors, readable with
        ``torch.load(weights_only=True)``; the trees compact, as the class keeps them)."""
        from torchtree.io.checkpoint import atomic_save, seal

        payload = {"format": self.FORMAT, "prior": self.prior.to_dict(), "cuts": self.grid.cuts.cpu(),
                   "n_cuts": self.grid.n_cuts.cpu(), "feature": self._main[0].cpu(), "cut": self._main[1].cpu(),
                   "value": self._main[2].cpu(), "deep": [t.cpu() for t in self._deep],
                   "sigma": self.sigma.cpu(), "chain_of": self.chain_of.cpu(),
                   "n_features": self.n_features,
                   "classes": None if self.classes_ is None else self.classes_.tolist(), "info": to_plain(self.info),
                   "feature_names": self.feature_names, "n_utilities": self.n_utilities,
                   "offsets": None if self.offsets is None else self.offsets.cpu(),
                   "encoder": None if self.encoder is None else self.encoder.state()}
        atomic_save(seal(payload), path)

    @classmethod
    def load(cls, path: StrPath, device: str | torch.device | None = None) -> "BARTPosterior":
        """Read a posterior that :meth:`save` wrote (checksum verified), onto ``device`` (default the
        CPU).

        Raises
        ------
        FileNotFoundError, ValueError
            No such file; a file of another kind (its kind is named), damaged or edited.
        """
        from torchtree.io.checkpoint import read_payload

        p = read_payload(path, "torchtree posterior file", device or "cpu")
        if not isinstance(p, dict) or p.get("format") not in cls.READ_FORMATS:
            held = p.get("format") if isinstance(p, dict) else None
            raise ValueError(f"{path} is not a torchtree BART posterior file"
                             + (f" (it holds {held})" if isinstance(held, str) else ""))
        try:
            obj = cls(BartPrior(**p["prior"]), CutGrid(p["cuts"], p["n_cuts"]), p["feature"], p["cut"], p["value"],
                      p["sigma"], p["chain_of"], p["n_features"],
                      classes=None if p["classes"] is None else np.asarray(p["classes"]), info=p["info"],
                      deep=p.get("deep"), n_utilities=int(p.get("n_utilities", 1)), offsets=p.get("offsets"))
            obj.feature_names = p.get("feature_names")
            if p.get("encoder") is not None:
                obj.encoder = TableEncoder.from_state(p["encoder"], n_columns=obj.n_features)
            _check_loaded(obj)
        except (KeyError, TypeError, IndexError, RuntimeError, ValueError) as exc:
            raise ValueError(f"{path}: not a readable torchtree BART posterior file: its fields do not fit together "
                             f"(damaged or edited: {type(exc).__name__}: {str(exc)[:200]})") from None
        return obj

    def __repr__(self) -> str:
        return (f"BARTPosterior(task={self.task!r}, n_draws={self.n_particles}, n_trees={self.n_trees}, "
                f"leaves_mean={float(self._leaves().double().mean()):.2f})")


def _check_loaded(post: "BARTPosterior") -> None:
    """ValueError where a read posterior's trees point outside its grid (an edit that recomputed the checksum):
    the compiled kernels index the bins and cuts with them unchecked."""
    D, width = post.grid.cuts.shape
    if post.grid.n_cuts.shape != (D,) or int(post.n_features) < 1:
        raise ValueError(f"the cut grid is [{D}, {width}] with {tuple(post.grid.n_cuts.shape)} cut counts")
    if bool(((post.grid.n_cuts < 0) | (post.grid.n_cuts > width)).any()):
        raise ValueError(f"a column's cut count is outside [0, {width}], the grid's width")
    if not all(bool(torch.isfinite(v).all()) for v in (post._main[2], post._deep[2], post.sigma)):
        raise ValueError("a leaf value or noise draw is not finite")
    for feature, cut in ((post._main[0], post._main[1]), (post._deep[0], post._deep[1])):
        split = feature >= 0
        if bool((feature[split] >= D).any()) or bool((cut[split] < 0).any()) or \
                bool((cut[split] >= post.grid.n_cuts.to(cut.device)[feature[split].long()]).any()):
            raise ValueError(f"a tree splits on a column or cut outside the grid ({D} columns)")
    if post.sigma.numel() not in (0, post.n_particles) and post.task == "regression":
        raise ValueError(f"{post.sigma.numel()} noise draws for {post.n_particles} draws")

