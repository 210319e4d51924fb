"""Posterior over soft trees: draws per topology, weighted by evidence times topology prior.

The DCC-Tree output (paper 004, eq. 46-48) is a mixture over topologies ``m`` with
weights ``w_m ∝ Z_m p(m)`` of local posteriors ``p_m(theta_m)``, each represented by
MCMC draws. Predictions average the per-draw predictive over draws, then over
topologies with these weights (Theorem 8). A single-topology HMC / NUTS run is the
special case ``M = 1``.

It implements the :class:`~torchtree.model.posterior_base.Posterior` protocol with the methods
and return types of ``TreePosterior``, but holds soft trees: ``weights`` are per topology, and
draws replace hard trees.
"""
from __future__ import annotations

import math
import os
from dataclasses import asdict
from typing import Dict, List, Optional, Sequence

import numpy as np
import torch

from torchtree.model.posterior_base import Posterior, StrPath, dot_text
from torchtree.model.interval import INTERVAL_BLOCK, check_interval, equal_tailed
from torchtree.model.inputs import ArrayLike, in_training_order
from torchtree.core.budget import rows_per_chunk
from torchtree.core.validate import check_int

from torchtree.model.soft_data import SoftData
from torchtree.model.topology import Topology, leaf_slot, node_depth
from torchtree.model.soft_trees import SoftTreeHyper, SoftTrees

__all__ = ["SoftTreePosterior"]


class SoftTreePosterior(Posterior):
    """Weighted set of soft-tree posterior draws over one or more topologies.

    Regression on standardised targets (``data.y_offset``, ``data.y_scale``, as DCC runs): the
    draws and ``hyper`` are in the units of ``data.y``; every output (predictions, intervals,
    ``log_predictive``, the evidence, leaf means and variances) is in the raw target's units.

    Parameters
    ----------
    data : SoftData
        Training data (classification leaves are integrated out, so the predictive
        needs the training soft counts).
    hyper : SoftTreeHyper (resolved)
    sharpness : float, split sharpness ``h`` used for prediction
    topologies : sequence of Topology, length M
    draws : sequence of Tensor [S_m, P_m]
        Compact unconstrained draws of each topology (see ``ParamLayout.compact_index``). A NUTS run's
        draws are draw-major over its chains: row ``s * C + c`` is chain ``c``'s ``s``-th kept draw, with
        ``C = info["n_chains"]`` (``draws[0].view(-1, C, P).transpose(0, 1)`` gives ``[chains, draws, P]``
        for R-hat and ESS).
    log_evidence_m : Tensor [M], optional
        ``log Z_m`` of ``data.y``; ``None`` gives equal weight to every topology.

    log_prior_m : Tensor [M], optional, ``log p(m)`` (zeros if omitted)
    info : dict, optional, run diagnostics kept for :meth:`summary`
    """

    def __init__(
        self,
        data: SoftData,
        hyper: SoftTreeHyper,
        sharpness: float,
        topologies: Sequence[Topology],
        draws: Sequence[torch.Tensor],
        log_evidence_m: Optional[torch.Tensor] = None,
        log_prior_m: Optional[torch.Tensor] = None,
        info: Optional[Dict] = None,
    ) -> None:
        if len(topologies) != len(draws):
            raise ValueError("one draw tensor per topology is required")
        self.data = data
        self.hyper = hyper
        self.sharpness = float(sharpness)
        self.topologies: List[Topology] = list(topologies)
        self.draws: List[torch.Tensor] = [d.detach() for d in draws]
        M = len(self.topologies)
        self._log_z = None if log_evidence_m is None else torch.as_tensor(log_evidence_m, dtype=torch.float64).cpu()
        self.log_prior_m = (
            torch.zeros(M, dtype=torch.float64)
            if log_prior_m is None
            else torch.as_tensor(log_prior_m, dtype=torch.float64).cpu()
        )
        self.info = dict(info or {})
        self.classes_ = None if data.classes is None else np.asarray(data.classes)
        self.n_features = data.n_input_features
        self.n_particles = int(sum(int(d.shape[0]) for d in self.draws))

    def __len__(self) -> int:
        return self.n_particles

    def __repr__(self) -> str:
        ev = "None" if self.log_evidence is None else f"{self.log_evidence:.4f}"
        return (
            f"SoftTreePosterior(task={self.task!r}, topologies={len(self.topologies)}, "
            f"draws={self.n_particles}, log_evidence={ev})"
        )

    # ----------------------------------------------------------------- weights
    @property
    def task(self) -> str:
        """"classification" or "regression"."""
        return self.data.task

    @property
    def topology_log_evidence(self) -> torch.Tensor:
        """``log Z_m`` per topology, Tensor [M] float64 (NaN when not estimated)."""
        if self._log_z is None:
            return torch.full((len(self.topologies),), float("nan"), dtype=torch.float64)
        return self._log_z + self.data.target_log_jacobian

    @property
    def log_weights(self) -> torch.Tensor:
        """Normalised log weights ``log w_m``, [M] float64."""
        if self._log_z is None:
            lw = torch.zeros(len(self.topologies), dtype=torch.float64)
        else:
            lw = torch.nan_to_num(self._log_z + self.log_prior_m, nan=-float("inf"))
        return lw - torch.logsumexp(lw, 0)

    @property
    def weights(self) -> torch.Tensor:
        """``w_m = Z_m p(m) / sum_m' Z_m' p(m')``, Tensor [M] float64."""
        return self.log_weights.exp()

    @property
    def log_evidence(self) -> Optional[float]:
        """``log sum_m Z_m p(m)`` over the topologies found (None without evidence)."""
        if self._log_z is None:
            return None
        lz = torch.logsumexp(torch.nan_to_num(self._log_z + self.log_prior_m, nan=-float("inf")), 0)
        return float(lz) + self.data.target_log_jacobian

    def _raw_units(self, t):
        """Regression values in ``data.y``'s units mapped to the raw target's, ``y_offset + y_scale t``
        (float64; ``t`` itself for raw targets). Tensor or numpy array."""
        d = self.data
        if not d.standardized:
            return t
        return d.y_offset + d.y_scale * (t.astype(np.float64) if isinstance(t, np.ndarray) else t.to(torch.float64))

    # ----------------------------------------------------------------- prediction
    def inputs(self, X) -> torch.Tensor:
        """Test inputs ``X`` [M, D] checked against the training features (a frame's columns by name), raw."""
        return self.data.check_X(in_training_order(X, getattr(self, "feature_names", None)))

    def _model(self, m: int, n: int) -> SoftTrees:
        # its starting draw from the prior is replaced by the stored draws: a private generator keeps the
        # user's global torch random stream untouched by prediction
        return SoftTrees(
            self.data, [self.topologies[m]], n_chains=n, sharpness=self.sharpness, hyper=self.hyper,
            dtype=self.data.X.dtype, generator=torch.Generator(device=self.data.X.device).manual_seed(0),
        )

    def _thinned_draws(self, m: int, max_draws: Optional[int]) -> torch.Tensor:
        """Stored draws of topology ``m``, evenly thinned to at most ``max_draws``, [S, P_m]."""
        d = self.draws[m]
        if max_draws is not None and d.shape[0] > check_int("max_draws", max_draws, 1):
            d = d[torch.linspace(0, d.shape[0] - 1, max_draws).round().long()]
        return d

    def _topology_prediction(self, m: int, X: torch.Tensor, max_draws: Optional[int]) -> torch.Tensor:
        if self.draws[m].shape[0] == 0:
            raise ValueError(f"topology {m} ({self.topologies[m].key()}) has no draws to predict with")
        d = self._thinned_draws(m, max_draws)
        model = self._model(m, d.shape[0])
        theta = torch.zeros(d.shape[0], model.n_params, dtype=model.X.dtype, device=model.X.device)
        theta[:, model.compact_index(0)] = d.to(theta)
        with torch.no_grad():
            return model.predict(X, theta)  # [S, N, C] or [S, N]

    def predict_draws(self, X, topology: int = 0, max_draws: Optional[int] = None) -> torch.Tensor:
        """Per-draw predictions of one topology.

        Parameters
        ----------
        X : Tensor [N, D] raw inputs
        topology : int, index into :attr:`topologies`
        max_draws : int, optional, evenly thinned subset

        Returns
        -------
        Tensor [S, N, C] class probabilities or [S, N] regression means (in the target's units).
        """
        return self._raw_units(self._topology_prediction(self._topology_index(topology), self.inputs(X), max_draws))

    def _row_bytes(self, max_draws: Optional[int], extra_per_draw: int = 0) -> float:
        """Bytes per input row of predicting with every topology's (thinned) draws: the
        routing probabilities and their intermediate products (about 4 copies of
        ``[S, L]``) and the outputs, for the largest topology."""
        item = self.data.X.element_size()
        C = max(int(self.data.n_classes or 1), 1)
        worst = 0
        for m, t in enumerate(self.topologies):
            S = self._thinned_draws(m, max_draws).shape[0]
            worst = max(worst, S * (4 * t.n_leaves + 2 * C + 2) * max(item, 8))
        return worst + extra_per_draw + 8 * (self.data.n_features + C)

    def _chunks(self, X, max_draws: Optional[int], what: str):
        """``X`` checked, and slices of rows whose predictions fit the memory budget."""
        X = self.inputs(X)
        step = rows_per_chunk(self._row_bytes(max_draws), what, device=X.device)
        return X, [slice(s, s + step) for s in range(0, X.shape[0], step)]

    def _mixture(self, X, max_draws: Optional[int], min_weight: float = 1e-8) -> torch.Tensor:
        X, parts = self._chunks(X, max_draws, "soft-tree prediction")
        return torch.cat([self._mixture_rows(X[part], max_draws, min_weight) for part in parts])

    def _mixture_rows(self, X, max_draws: Optional[int], min_weight: float = 1e-8) -> torch.Tensor:
        w = self.weights
        kept = [m for m in range(len(self.topologies)) if w[m] >= min_weight * w.max() and len(self.draws[m])]
        if not kept:
            raise ValueError("this posterior has no topology with draws to predict with")
        out = sum(self._topology_prediction(m, X, max_draws).to(torch.float64).mean(0) * w[m] for m in kept)
        return out / w[kept].sum()  # the weights of the topologies mixed, so a mixture of probabilities sums to 1

    def _proba_t(self, X, max_draws: Optional[int] = 200) -> torch.Tensor:
        if self.task != "classification":
            raise ValueError("predict_proba applies to classification; use predict / predict_interval")
        return self._mixture(X, max_draws)

    def predict_proba(self, X: ArrayLike, max_draws: Optional[int] = 200) -> np.ndarray:
        """Posterior predictive class probabilities (classification).

        Parameters
        ----------
        X : array-like [M, D] raw inputs
        max_draws : int, optional, draws used per topology (evenly thinned)

        Returns
        -------
        numpy.ndarray [M, K]
        """
        p = self._proba_t(X, max_draws)  # a draw's float32 softmax sums to 1 to 1e-7: rows made distributions here
        return (p / p.sum(-1, keepdim=True)).cpu().numpy()

    def predict(self, X: ArrayLike, max_draws: Optional[int] = 200) -> np.ndarray:
        """Most probable class (original labels when known) or posterior-mean output: the mixture
        over topologies (by weight) of their draws' mean predictions.

        Parameters
        ----------
        X : array-like [M, D] raw inputs
        max_draws : int, optional
            Draws used per topology, evenly thinned (default 200; None: all).

        Returns
        -------
        numpy.ndarray [M]
        """
        if self.task == "classification":
            codes = self._proba_t(X, max_draws).argmax(-1).cpu().numpy()
            return self.classes_[codes] if self.classes_ is not None else codes
        return self._raw_units(self._mixture(X, max_draws)).cpu().numpy()

    def _draw_set_weights(self):
        """(weight, topology index) of the topologies :meth:`_draw_sets` yields, in order."""
        w = self.weights
        return [(w[m], m) for m in range(len(self.topologies)) if self.draws[m].shape[0] and w[m] != 0]

    def _draw_sets(self, X, max_draws):
        """(weight, mean [S, M], variance [S, 1]) per topology (regression), in ``data.y``'s units."""
        X = self.inputs(X)
        w = self.weights
        for m in range(len(self.topologies)):
            if self.draws[m].shape[0] == 0 or w[m] == 0:
                continue
            mean = self._topology_prediction(m, X, max_draws).to(torch.float64)
            var = torch.exp(self._thinned_draws(m, max_draws)[:, -1].to(torch.float64)).unsqueeze(-1)  # log variance is last
            yield w[m], mean, var

    def predict_interval(self, X: ArrayLike, level: float = 0.9, n_draws: int = 4000, seed: int = 0,
                         kind: str = "predictive") -> np.ndarray:
        """Equal-tailed posterior interval (regression) of a new ``y`` (``kind="predictive"``) or of the
        regression function ``f(x)`` (``kind="mean"``), by Monte Carlo.

        Draws a topology by weight, one of its stored draws, then ``y`` from the Gaussian with that draw's
        soft-tree mean and variance (``kind="mean"``: the draw's mean). The draws and their normal variates
        are shared by all rows: a row's interval depends on the row, ``level``, ``n_draws`` and ``seed`` only.

        Parameters
        ----------
        X : array-like [M, D] raw inputs
        level : float in [0, 1), the probability between the bounds (default 0.9)
        n_draws : int >= 1, Monte Carlo draws per point (default 4000)
        seed : int, of the random numbers (default 0)
        kind : {"predictive", "mean"} (:data:`~torchtree.model.interval.KINDS`; default "predictive")

        Returns
        -------
        numpy.ndarray [M, 2] lower and upper bounds.

        Raises
        ------
        ValueError
            A classification posterior, or ``level``, ``n_draws`` or ``kind`` out of range.
        """
        level, n_draws = check_interval(self.task, level, n_draws, seed, kind)
        X = self.inputs(X)
        g = torch.Generator().manual_seed(int(seed))
        sets = self._draw_set_weights()
        w = torch.stack([wm for wm, _ in sets])
        pick = torch.multinomial(w.float(), n_draws, replacement=True, generator=g)
        # The draws of every topology and their normal variates, shared by all rows.
        shared = []
        for k, (_, m) in enumerate(sets):
            n_k = int((pick == k).sum())
            S = self._thinned_draws(m, None).shape[0]
            j = torch.randint(0, S, (n_k,), generator=g) if n_k else None
            shared.append((j, torch.randn(n_k, 1, generator=g, dtype=torch.float64) if n_k else None))
        block = min(X.shape[0], INTERVAL_BLOCK, rows_per_chunk(
            self._row_bytes(None, 24 * n_draws), f"predict_interval with n_draws={n_draws}", device=X.device,
            also=", or lower n_draws"))
        res = []
        for s0 in range(0, X.shape[0], block):
            out = []
            for (j, z), (_, mean, var) in zip(shared, self._draw_sets(X[s0 : s0 + block], None)):
                if j is not None:
                    out.append(mean[j] + var[j].sqrt() * z if kind == "predictive" else mean[j])
            res.append(equal_tailed(torch.cat(out), level))
        return self._raw_units(np.concatenate(res))

    def log_predictive(self, X: ArrayLike, y: ArrayLike, max_draws: Optional[int] = 200) -> float:
        """Mean over points of the log posterior predictive density of ``y`` at ``X``.

        Classification: ``log p(y | x)`` of the mixture's class probabilities (:meth:`predict_proba`);
        regression: the log density of the Gaussian mixture over topologies and draws (each draw's
        soft-tree mean and variance).

        Parameters
        ----------
        X : array-like [M, D] raw inputs
        y : array-like [M], labels seen in training or real targets
        max_draws : int, optional
            Draws used per topology, evenly thinned (default 200; None: all).

        Returns
        -------
        float

        Raises
        ------
        ValueError
            A label not seen in training.
        """
        X = self.inputs(X)
        # original label values (strings, {2, 4}, ...) are mapped through classes_,
        # exactly as TreePosterior does; unseen labels raise a ValueError
        yt = self._encode_y(y, X.shape[0])
        if self.task == "classification":
            p = self._proba_t(X, max_draws)
            return float(torch.log(p[torch.arange(len(yt)), yt.long()].clamp_min(1e-300)).mean())
        per_row = []
        # standardised targets: the density of y is that of (y - y_offset) / y_scale over y_scale
        yt = (yt.to(torch.float64) - self.data.y_offset) / self.data.y_scale if self.data.standardized else yt
        _, parts = self._chunks(X, max_draws, "soft-tree log_predictive")
        for part in parts:
            logs = []
            for wm, mean, var in self._draw_sets(X[part], max_draws):
                lp = -0.5 * torch.log(2 * math.pi * var) - 0.5 * (yt[part].to(torch.float64) - mean) ** 2 / var
                logs.append(torch.logsumexp(lp, 0) - math.log(lp.shape[0]) + torch.log(wm))
            per_row.append(torch.logsumexp(torch.stack(logs), 0))
        return float(torch.cat(per_row).mean()) - math.log(self.data.y_scale)

    # ----------------------------------------------------------------- reporting
    def summary(self) -> Dict:
        """Topologies with weights, evidence, leaves, depth and feature usage."""
        rows = []
        w = self.weights
        lz = self.topology_log_evidence
        for m, t in enumerate(self.topologies):
            rows.append(
                {
                    "topology": t.key(),
                    "weight": float(w[m]),
                    "log_evidence": float(lz[m]),
                    "log_prior": float(self.log_prior_m[m]),
                    "n_leaves": t.n_leaves,
                    "depth": t.depth,
                    "n_draws": int(self.draws[m].shape[0]),
                }
            )
        rows.sort(key=lambda r: -r["weight"])
        top = max(range(len(self.topologies)), key=lambda m: float(w[m]))
        usage = self.feature_usage(top) if self.data.n_features > 1 else torch.ones(1)
        from torchtree.model.posterior import PosteriorSummary

        names = getattr(self, "feature_names", None)
        mixing = {}
        chains = self.chain_draws()
        if chains is not None:  # every parameter's split-R-hat and ESS over the chains: the worst of each
            from torchtree.model.diagnostics import ess_columns, rhat_columns

            flat = np.concatenate([v.reshape(v.shape[0], v.shape[1], -1) for v in chains.values()], 2)
            r, e = rhat_columns(flat), ess_columns(flat)
            mixing = {"rhat_max": float(np.nanmax(r)) if (~np.isnan(r)).any() else float("nan"),
                      "ess_min": float(np.nanmin(e)) if np.isfinite(e).any() else float("nan")}
        return PosteriorSummary({
            "n_topologies": len(self.topologies),
            "log_evidence": self.log_evidence,
            "expected_leaves": float(sum(w[m] * t.n_leaves for m, t in enumerate(self.topologies))),
            "topologies": rows,
            "feature_usage_top": usage.tolist(),
            "feature_names": list(names) if names is not None and len(names) == len(usage) else [f"x{d}" for d in range(len(usage))],
            **{k: v for k, v in self.info.items() if isinstance(v, (int, float, str))},
            **mixing,
        })

    def chain_draws(self) -> Optional[Dict[str, np.ndarray]]:
        """Per-chain draws of a one-topology posterior sampled by several chains (NUTS), on the parameters'
        own scales, ``{name: float64 [chains, draws, ...]}``: ``thresholds [C, S, I]`` and ``split_weights
        [C, S, I, D']`` of the topology's internal nodes (in heap order), and of its leaves (heap order)
        ``leaf_means [C, S, L]`` and ``sigma2 [C, S]`` (regression) or the leaves' predictive class
        probabilities ``leaf_class_probs [C, S, L, K]``. None for a posterior over several topologies (DCC)
        or one whose ``info`` does not say its ``n_chains``. :func:`~torchtree.model.diagnostics.to_arviz`
        exports them, :meth:`summary` reports their worst R-hat and ESS."""
        C = self.info.get("n_chains")
        d = self.draws[0]
        if len(self.topologies) != 1 or not isinstance(C, int) or C < 1 or d.shape[0] < C or d.shape[0] % C:
            return None
        S = d.shape[0] // C
        model = self._model(0, d.shape[0])
        theta = torch.zeros(d.shape[0], model.n_params, dtype=model.X.dtype)
        theta[:, model.compact_index(0)] = d.to(theta)
        t = self.topologies[0]
        internal, leaves = list(t.internal), [leaf_slot(l, model.depth) for l in t.leaves]

        def per_chain(x: torch.Tensor) -> np.ndarray:  # draw-major rows -> [C, S, ...]
            return x.reshape(S, C, *x.shape[1:]).transpose(0, 1).double().cpu().numpy()

        with torch.no_grad():
            c = model.constrain(theta)
            out = {"thresholds": per_chain(c["thresholds"][:, internal]),
                   "split_weights": per_chain(c["weights"][:, internal])}
            if self.task == "regression":
                out["leaf_means"] = per_chain(self._raw_units(c["mu"][:, leaves]))
                out["sigma2"] = per_chain(c["sigma2"].to(torch.float64) * self.data.y_scale ** 2)
            else:
                out["leaf_class_probs"] = per_chain(model.leaf_class_probs(theta)[:, leaves])
        return out

    def _topology_index(self, i: int) -> int:
        """``i`` checked against the topologies (no wrap-around of negative indices)."""
        i = int(i)
        if not 0 <= i < len(self.topologies):
            raise IndexError(f"topology index {i} out of range [0, {len(self.topologies)})")
        return i

    def feature_usage(self, topology: int = 0) -> torch.Tensor:
        """Mean split weight per feature over the nodes and draws of a topology, [D].

        With signed splits a feature's usage is the sum of the weights on it and on
        its mirror image ``1 - x``.
        """
        topology = self._topology_index(topology)
        d = self.draws[topology]
        model = self._model(topology, max(d.shape[0], 1))
        theta = torch.zeros(d.shape[0], model.n_params, dtype=model.X.dtype)
        theta[:, model.compact_index(0)] = d.to(theta)
        w = model.constrain(theta)["weights"][:, list(self.topologies[topology].internal)]
        usage = w.mean((0, 1)) if w.numel() else torch.zeros(model.layout.n_features)
        return usage[: self.n_features] + usage[self.n_features:] if self.data.signed else usage

    def gates(self, i: Optional[int] = None, feature_names=None) -> Dict:
        """Posterior-mean gates and leaves of topology ``i`` (default: the heaviest).

        Returns
        -------
        dict with ``index`` (int), ``topology`` (Topology), ``names`` (the feature names, then
        ``1-name`` for mirrored columns of signed splits), ``weights`` (Tensor [I_pad, D'], node ``n``'s
        split weights on the [0, 1]-scaled inputs in row ``n``), ``thresholds`` (Tensor [I_pad]) and
        ``leaves`` ({leaf node id: Tensor [C] class probabilities, or a 0-d mean}); node ``n`` sends a
        point left (the rule ``w . x <= tau`` holds) with probability above 1/2.
        """
        i = int(torch.argmax(self.weights)) if i is None else self._topology_index(i)
        kept = getattr(self, "feature_names", None)
        names = (list(feature_names) if feature_names is not None else
                 list(kept) if kept is not None else [f"x{k}" for k in range(self.n_features)])
        if len(names) != self.n_features:
            raise ValueError(f"feature_names has {len(names)} names; the data has {self.n_features} features")
        if self.data.signed:
            names = names + [f"1-{n}" for n in names]
        t, d = self.topologies[i], self.draws[i]
        model = self._model(i, max(d.shape[0], 1))
        theta = torch.zeros(max(d.shape[0], 1), model.n_params, dtype=model.X.dtype)
        if d.shape[0]:
            theta[:, model.compact_index(0)] = d.to(theta)
        c = model.constrain(theta)
        with torch.no_grad():
            values = (model.leaf_class_probs(theta).mean(0) if self.task == "classification" else
                      self._raw_units(c["mu"].mean(0)))
        leaves = {l: values[leaf_slot(l, model.depth)] for l in t.leaves}
        return {"index": i, "topology": t, "names": names, "weights": c["weights"].mean(0),
                "thresholds": c["thresholds"].mean(0), "leaves": leaves}

    def to_dot(self, i: Optional[int] = None, feature_names: Optional[Sequence[str]] = None) -> str:
        """Graphviz DOT text of topology ``i`` (default: the heaviest) with posterior-mean
        thresholds (on the [0, 1]-scaled inputs) and each node's heaviest feature
        (``1-name`` for a mirrored column of signed splits), written as hard trees' rules are:
        ``feature <= threshold``, the left child "yes" (a soft gate sends a point left with
        probability above 1/2 below its threshold); :meth:`gates` has every weight."""
        g = self.gates(i, feature_names)
        t, names, w, tau = g["topology"], g["names"], g["weights"], g["thresholds"]
        lines = ["digraph soft_tree {", "  node [shape=box];"]
        for n in t.internal:
            f = int(w[n].argmax())
            # the gate leans right above the threshold: "yes" (the rule holds) is the left child, as for hard trees
            lines.append(f'  n{n} [label="{dot_text(names[f])} (w={float(w[n, f]):.2f}) <= {float(tau[n]):.3f}"];')
            lines += [f"  n{n} -> n{2 * n + 1} [label=yes];", f"  n{n} -> n{2 * n + 2} [label=no];"]
        for l in t.leaves:
            lines.append(f'  n{l} [label="leaf {l} (depth {node_depth(l)})", shape=ellipse];')
        lines.append("}")
        return "\n".join(lines)

    FORMAT = "torchtree.SoftTreePosterior/1"

    def save(self, path: StrPath) -> None:
        """Write the posterior to ``path`` atomically (plain tensors, numbers, strings,
        lists and dicts, tagged with :attr:`FORMAT`; readable with ``weights_only=True``)."""
        from torchtree.io.checkpoint import atomic_save, seal
        from torchtree.model.posterior import to_plain

        d = self.data
        atomic_save(seal(
            {
                "format": self.FORMAT,
                "data": {
                    "X": d.X.cpu(), "y": d.y.cpu(), "task": d.task, "n_classes": d.n_classes,
                    "feature_min": d.feature_min.cpu(), "feature_max": d.feature_max.cpu(),
                    "classes": None if d.classes is None else np.asarray(d.classes).tolist(),
                    "signed": d.signed, "y_offset": d.y_offset, "y_scale": d.y_scale,
                },
                "hyper": to_plain(asdict(self.hyper)),
                "sharpness": self.sharpness,
                "topologies": [list(t.internal) for t in self.topologies],
                "draws": [x.cpu() for x in self.draws],
                "log_evidence_m": self._log_z,
                "log_prior_m": self.log_prior_m,
                "info": {k: v for k, v in self.info.items() if isinstance(v, (int, float, str, bool))},
                "feature_names": None if getattr(self, "feature_names", None) is None else list(self.feature_names),
            }),
            path,
        )

    @classmethod
    def load(cls, path: StrPath, device: str | torch.device | None = None) -> "SoftTreePosterior":
        """Read a posterior written by :meth:`save` (``torch.load(weights_only=True)``).

        Raises
        ------
        FileNotFoundError
            No file at ``path``.
        ValueError
            The file is not a soft-tree posterior written by :meth:`save` (another
            format, e.g. a hard ``TreePosterior`` file, or an unreadable file).
        """
        from torchtree.io.checkpoint import CheckpointError, read_payload

        if not os.path.exists(path):
            raise FileNotFoundError(f"{path}: no such file")
        # empty, truncated or damaged files, and content that fails its checksum
        s = read_payload(path, "torchtree soft-tree posterior file", device or "cpu")
        if not isinstance(s, dict) or s.get("format") != cls.FORMAT:
            found = s.get("format") if isinstance(s, dict) else type(s).__name__
            hint = " (use torchtree.TreePosterior.load for hard-tree posteriors)" if found == "torchtree.TreePosterior/1" else ""
            raise ValueError(f"{path} is not a torchtree soft-tree posterior file: format {found!r}, "
                             f"expected {cls.FORMAT!r}{hint}")
        try:
            data = dict(s["data"])
            if data.get("classes") is not None:
                data["classes"] = np.asarray(data["classes"])
            topologies = [Topology(tuple(t)) for t in s["topologies"]]
            draws = s["draws"]
            if len(draws) != len(topologies):
                raise ValueError(f"{len(draws)} draw tensors for {len(topologies)} topologies")
            for m, x in enumerate(draws):
                if not isinstance(x, torch.Tensor) or x.dim() != 2 or not x.is_floating_point() or not bool(torch.isfinite(x).all()):
                    raise ValueError(f"the draws of topology {m} are not a finite 2-D float tensor")
            for key in ("log_evidence_m", "log_prior_m"):
                v = s[key]
                if v is not None and torch.as_tensor(v).numel() != len(topologies):
                    raise ValueError(f"{key} has {torch.as_tensor(v).numel()} entries for {len(topologies)} topologies")
            post = cls(
                SoftData(**data), SoftTreeHyper(**s["hyper"]), s["sharpness"],
                topologies, draws, s["log_evidence_m"], s["log_prior_m"], s["info"],
            )
            names = s.get("feature_names")  # files written before names were kept have none
            if names is not None:
                if len(names) != post.n_features:
                    raise ValueError(f"feature_names has {len(names)} names for {post.n_features} features")
                post.feature_names = [str(v) for v in names]
            return post
        except (KeyError, TypeError, ValueError, IndexError, RuntimeError) as exc:
            raise CheckpointError(f"{path}: this soft-tree posterior file is damaged or edited "
                                  f"({type(exc).__name__}: {exc})") from None
