"""``TreePosterior``: a weighted set of trees and everything a user asks of it."""
from __future__ import annotations

from typing import Any, Dict, Optional, Sequence

import numpy as np
import torch

from torchtree.model.encoding import TableEncoder, needs_encoding, rule_text
from torchtree.model.inputs import ArrayLike, as_feature_matrix, in_training_order
from torchtree.kernels.forest import forest_plan, mixture_with_plan, node_region_keys, plan_width, rule_hash, threshold_bits
from torchtree.core.budget import memory_budget, release_freed_memory, rows_per_chunk
from torchtree.model.likelihood_protocol import LIKELIHOODS, likelihood_from_config
from torchtree.model.trees import INTERNAL, HardTrees
from torchtree.model.tree_storage import compact_trees, expand_trees, is_compact
from torchtree.model.interval import INTERVAL_BLOCK, check_interval, equal_tailed, polar_pairs, polar_student_t
from torchtree.model.posterior_base import Posterior, StrPath, dot_text
from torchtree.model.summary import PosteriorSummary

__all__ = ["TreePosterior", "PosteriorSummary", "dedupe_trees", "attach_feature_names"]


def dedupe_trees(trees: HardTrees, log_weights: torch.Tensor):
    """Merge identical trees, adding their weights.

    Resampling leaves many exact copies; predicting once per distinct tree is
    the same mixture at a fraction of the cost.

    Parameters
    ----------
    trees : HardTrees [P]
    log_weights : Tensor [P] (normalised or not)

    Returns
    -------
    (HardTrees [Q], log_weights [Q] float64, inverse [P])
    """
    used = torch.arange(trees.capacity, device=trees.device)[None] < trees.n_nodes[:, None]
    if trees.threshold.dtype == torch.float64:
        thr_bits = trees.threshold.view(torch.int64)
    else:
        thr_bits = trees.threshold.float().view(torch.int32).long()
    key = torch.cat(
        [
            torch.where(used, trees.feature.long(), -2),
            torch.where(used, thr_bits, 0),
            torch.where(used, trees.left.long(), -2),
            torch.where(used, trees.right.long(), -2),
            trees.n_nodes[:, None],
        ],
        1,
    )
    _, inv = torch.unique(key, dim=0, return_inverse=True)
    Q = int(inv.max()) + 1
    first = torch.full((Q,), trees.n_trees, dtype=torch.long, device=trees.device)
    first.scatter_reduce_(0, inv, torch.arange(trees.n_trees, device=trees.device), "amin")
    lw = log_weights.double()
    mx = lw.max()
    agg = torch.zeros(Q, dtype=torch.float64, device=lw.device).index_add_(0, inv, torch.exp(lw - mx))
    return trees.take(first), agg.log() + mx, inv


# bytes per (point, node) pair of a routing level, per (draw, point) of an interval: over the peaks measured
_PAIR_BYTES = 200
POSTERIOR_FORMAT = "torchtree.TreePosterior/2"  # /2: trees stored compactly (torchtree.model.tree_storage)
#: the format tags :meth:`TreePosterior.load` reads (files of version 1 load too)
READ_FORMATS = (POSTERIOR_FORMAT, "torchtree.TreePosterior/1")
_DRAW_BYTES = 120  # both checked by tests/test_predict_memory.py
def _names_of(X) -> Optional[list]:
    """Column names of a table (pandas DataFrame or anything with string ``columns``)."""
    cols = getattr(X, "columns", None)
    if cols is None:
        return None
    names = list(cols)
    return [str(c) for c in names] if names and all(isinstance(c, str) for c in names) else None


def attach_feature_names(posterior, X, names=None) -> None:
    """Give ``posterior`` the feature names of the training table ``X`` (its string
    column names), or ``names``; used by :meth:`TreePosterior.summary` and saved with it.

    Parameters
    ----------
    posterior : TreePosterior or SoftTreePosterior
    X : array-like, the training features as passed to ``fit``
    names : sequence of str, optional, names to use instead of ``X``'s columns
    """
    names = list(names) if names is not None else _names_of(X)
    enc = getattr(posterior, "encoder", None)
    n = enc.n_inputs if enc is not None else getattr(posterior, "n_features", None)
    if names is not None and (n is None or len(names) == int(n)):
        posterior.feature_names = [str(v) for v in names]


class TreePosterior(Posterior):
    """Weighted trees approximating a posterior over decision trees.

    Parameters
    ----------
    trees : HardTrees [P]
    log_weights : Tensor [P]
        Unnormalised log weights (normalised internally, float64).
    likelihood : DirichletMultinomial, NormalInverseGamma or another
        :class:`~torchtree.model.likelihood_protocol.LeafLikelihood`
        Gives the leaf posterior predictive from the stored leaf statistics.
    n_features : int
    classes : numpy array [K] or None
        Original class labels (classification).
    log_evidence : float, optional
        Estimate of ``log p(Y | X)``.
    info : dict, optional
        Sampler diagnostics (ESS, per-island evidence, acceptance rates, ...).
    dedupe : bool
        Merge identical trees (weights added) to speed up prediction.
    """

    FORMAT = POSTERIOR_FORMAT  # of the files :meth:`save` writes
    log_evidence: Optional[float]  # an attribute here (read-only in the Posterior protocol)

    def __init__(
        self,
        trees: HardTrees,
        log_weights: torch.Tensor,
        likelihood,
        n_features: int,
        classes: Optional[np.ndarray] = None,
        log_evidence: Optional[float] = None,
        info: Optional[Dict[str, Any]] = None,
        dedupe: bool = True,
    ) -> None:
        if log_weights.shape != (trees.n_trees,):
            raise ValueError(f"log_weights must have shape [{trees.n_trees}], got {tuple(log_weights.shape)}")
        lw = log_weights.double()
        if not bool(torch.isfinite(lw).any()):
            raise ValueError("all posterior weights are zero")
        self.n_particles = trees.n_trees
        lw_norm = lw - torch.logsumexp(lw, 0)
        self.ess = float(1.0 / torch.exp(2 * lw_norm).sum())
        if dedupe:
            trees, lw_norm, _ = dedupe_trees(trees, lw_norm)
        self.trees = trees
        self.log_weights = lw_norm - torch.logsumexp(lw_norm, 0)
        self.likelihood = likelihood
        self.n_features = int(n_features)
        self.classes_ = None if classes is None else np.asarray(classes)
        self.log_evidence = None if log_evidence is None else float(log_evidence)
        self.info: Dict[str, Any] = dict(info or {})
        self.feature_names: Optional[list] = None
        self.encoder: Optional[TableEncoder] = None  # the training table's coding (missing values, categories)
        self._table = None
        self._used = None

    # --------------------------------------------------------------- basics
    @property
    def task(self) -> str:
        """"classification" or "regression"."""
        return self.likelihood.task

    @property
    def weights(self) -> torch.Tensor:
        """Normalised weights ``[Q]`` float64 of the distinct trees."""
        return torch.exp(self.log_weights)

    def __len__(self) -> int:
        return self.trees.n_trees

    def inputs(self, X) -> torch.Tensor:
        """``X`` [M, D] as the trees route it: a frame's columns by name, coded as at fit, the trees' dtype."""
        dt, dev, X = self.trees.threshold.dtype, self.trees.device, in_training_order(X, getattr(self, "feature_names", None))
        if self.encoder is not None and (self.encoder.is_coded or needs_encoding(X)):
            return torch.as_tensor(self.encoder.transform(X), dtype=dt, device=dev)  # missing values, categories
        if isinstance(X, torch.Tensor) and X.dim() == 2 and X.shape[1] == self.n_features and bool(torch.isfinite(X).all()) and X.shape[0] > 0:
            return X.to(device=dev, dtype=dt)
        return torch.as_tensor(as_feature_matrix(X, self.n_features), dtype=dt, device=dev)

    def __getstate__(self) -> dict:
        """Pickles leave out the caches prediction rebuilds (the predictive table, the routing plan)."""
        return {**self.__dict__, "_table": None, "_used": None, "_plan": None, "_pairs": None}

    def _mixture_rows(self, X: torch.Tensor, chunk_pairs: int = 1 << 23):
        """Yield (tree slice, gathered predictive rows [q, M, S]) in chunks of trees."""
        M = X.shape[0]
        step = max(1, chunk_pairs // max(M, 1))
        for s in range(0, self.trees.n_trees, step):
            sub = self.trees.take(torch.arange(s, min(s + step, self.trees.n_trees), device=self.trees.device))
            yield slice(s, s + sub.n_trees), sub.predict(X, self.likelihood)

    def _pairs_per_row(self) -> int:
        """(point, distinct node) pairs one row is expected to make at the busiest level of
        the forest routing, for inputs distributed like the training data: the distinct
        (region, rule) nodes of a level weighted by the share of training points in their
        region (their statistics hold the counts), twice over for safety, and never more
        than the distinct nodes of the level (the most any row can make)."""
        if getattr(self, "_pairs", None) is None:
            t = self.trees
            used = t.status != 0
            key = node_region_keys(t.feature, t.threshold, t.left, t.right, t.depth, used)
            internal = used & (t.feature >= 0)
            rule = torch.where(internal, rule_hash(key, t.feature, threshold_bits(t.threshold)), key)
            depth = t.depth[used].long()
            # one int64 key per (depth, leaf or split, rule): a 1-D unique (sort-based) instead of
            # torch.unique(dim=0), 7x slower; a hash collision would only shift this estimate
            item = rule[used] ^ (depth << 56) ^ (internal[used].long() << 55)
            uniq_key, inv = torch.unique(item, return_inverse=True)
            first = torch.full((uniq_key.numel(),), inv.numel(), dtype=torch.long, device=inv.device)
            first.scatter_reduce_(0, inv, torch.arange(inv.numel(), device=inv.device), "amin")
            level = depth[first]
            stats = t.stats[used][first].double()
            count = stats.sum(-1) if self.task == "classification" else stats[:, 0]
            n_train = float(count[level == 0].max().clamp_min(1))
            levels = int(level.max()) + 1
            share = torch.zeros(levels, dtype=torch.float64, device=count.device).index_add_(0, level, count)
            bound = torch.bincount(level, minlength=levels)
            self._pairs = int(torch.minimum(2 * share / n_train + 1, bound.double()).max().ceil())
        return self._pairs

    def _mixture(self, X: torch.Tensor, leaf_fn, out_dim: int, chunk_points: Optional[int] = None) -> torch.Tensor:
        """``sum_q w_q leaf_fn(predictive row of q's leaf at x_m, m)``: ``[M, out_dim]`` float64.

        Routes each point once per distinct node of the whole forest (see
        ``torchtree.kernels.forest``), in chunks of points sized by the prediction memory
        budget (:func:`torchtree.set_memory_budget`); ``chunk_points`` overrides it. A
        point's sum is taken in the same order whatever the chunk, so chunking changes no bit.
        """
        t = self.trees
        if getattr(self, "_plan", None) is None:  # what prediction needs of the trees alone, built once
            self._table = self.likelihood.predictive_table(t.stats)
            self._used = t.status != 0
            self._plan = forest_plan(t.feature, t.threshold, t.left, t.right, t.depth, self._used, self.weights,
                                     self._table)
        if chunk_points is None and X.shape[0] * (_PAIR_BYTES * (plan_width(self._plan) + out_dim)
                                                  + 8 * (X.shape[1] + out_dim)) <= min(memory_budget(), 64 << 20):
            chunk_points = max(X.shape[0], 1)  # every row even at a pair per distinct node of a level fits: no estimate
        if chunk_points is None:
            # about 25 int64 / float64 temporaries per (point, node) pair of a level
            per_row = _PAIR_BYTES * (self._pairs_per_row() + out_dim) + 8 * (X.shape[1] + out_dim)
            chunk_points = rows_per_chunk(per_row, f"prediction with {t.n_trees} distinct trees", device=X.device)
        out = torch.empty(X.shape[0], out_dim, dtype=torch.float64, device=X.device)
        for s in range(0, X.shape[0], chunk_points):
            out[s : s + chunk_points] = mixture_with_plan(
                self._plan, X[s : s + chunk_points], lambda rows, pts, s=s: leaf_fn(rows, pts + s), out_dim)
            if chunk_points < X.shape[0]:
                release_freed_memory()
        return out

    # ------------------------------------------------------------ prediction
    def predict_proba(self, X: ArrayLike) -> np.ndarray:
        """Posterior predictive class probabilities.

        Parameters
        ----------
        X : array-like [M, D]

        Returns
        -------
        numpy.ndarray [M, K] float64, each row summing to 1 (the leaves' float32 rows drift by ~1e-8: renormalised)
        """
        if self.task != "classification":
            raise ValueError("predict_proba applies to classification; use predict / predict_interval")
        p = self._proba(self.inputs(X)).cpu().numpy()
        return p / p.sum(1, keepdims=True)

    def _proba(self, X: torch.Tensor) -> torch.Tensor:
        K = int(self.trees.stats.shape[-1])
        return self._mixture(X, lambda rows, pts: rows, K)

    def predict(self, X: ArrayLike) -> np.ndarray:
        """Predicted labels (classification: most probable class, in the original
        labels) or posterior predictive means (regression).

        Parameters
        ----------
        X : array-like [M, D]

        Returns
        -------
        numpy.ndarray [M]
        """
        Xt = self.inputs(X)
        if self.task == "classification":
            codes = self._proba(Xt).argmax(1).cpu().numpy()
            return self.classes_[codes] if self.classes_ is not None else codes
        return self._mean(Xt).cpu().numpy()

    def _mean(self, X: torch.Tensor) -> torch.Tensor:
        return self._mixture(X, lambda rows, pts: rows[:, 1:2], 1)[:, 0]

    def predict_interval(self, X: ArrayLike, level: float = 0.9, n_draws: int = 4000, seed: int = 0,
                         kind: str = "predictive") -> np.ndarray:
        """Equal-tailed posterior interval (regression) of a new ``y`` (``kind="predictive"``) or of the
        regression function ``f(x)`` (``kind="mean"``, :data:`~torchtree.model.interval.KINDS`).

        Monte Carlo over the mixture of the leaves' Student-t distributions: ``n_draws`` trees are drawn by
        weight, then for each drawn tree one value per row from the Student-t of the row's leaf, its
        predictive of ``y`` (:meth:`NormalInverseGamma.predictive_table`) or its posterior of the leaf mean
        (:meth:`NormalInverseGamma.mean_table`). Both the trees and the
        t-variates' random numbers (one polar pair per draw, :func:`~torchtree.model.interval.polar_student_t`)
        are shared by all rows, so a row's interval depends on the row, ``level``, ``n_draws`` and ``seed``
        only. Rows go in blocks of at most :data:`INTERVAL_BLOCK`, fewer where the memory budget asks, so peak
        memory is that of one block.

        Parameters
        ----------
        X : array-like [M, D]
        level : float in [0, 1), the probability between the bounds (default 0.9)
        n_draws : int >= 1, Monte Carlo draws per row (default 4000)
        seed : int, of the random numbers (default 0)
        kind : {"predictive", "mean"}, what the interval bounds (default "predictive")

        Returns
        -------
        numpy.ndarray [M, 2] lower and upper bounds.

        Raises
        ------
        ValueError
            A classification posterior, ``level``, ``n_draws`` or ``kind`` out of range, ``kind="mean"`` with a
            likelihood without ``mean_table``, or one block of ``n_draws`` draws that does not fit the memory budget.
        """
        level, n_draws = check_interval(self.task, level, n_draws, seed, kind)
        if kind == "mean" and not callable(getattr(self.likelihood, "mean_table", None)):
            raise ValueError(f"kind='mean' needs the likelihood's optional mean_table hook, which "
                             f"{type(self.likelihood).__qualname__} does not have; kind='predictive' works without it")
        Xt = self.inputs(X)
        M = Xt.shape[0]
        g = torch.Generator(device="cpu").manual_seed(seed)
        trees_idx = torch.multinomial(self.weights.cpu().float(), n_draws, replacement=True, generator=g).to(Xt.device)
        u, w = (v.to(Xt.device)[:, None] for v in polar_pairs(g, n_draws))
        # Route each distinct drawn tree once and gather: the same rows as routing all draws.
        uniq, inv = torch.unique(trees_idx, return_inverse=True)
        per_row = _DRAW_BYTES * n_draws + 64 * uniq.numel()
        block = min(M, INTERVAL_BLOCK, rows_per_chunk(per_row, f"predict_interval with n_draws={n_draws}",
                                                      device=Xt.device, also=", or lower n_draws"))
        sub = self.trees.take(uniq)
        lik = self.likelihood  # the table once: the blocks differ in their rows only
        table = lik.predictive_table(sub.stats) if kind == "predictive" else lik.mean_table(sub.stats)
        out = np.empty((M, 2))  # filled block by block (small arrays kept between large temporaries fragment the heap)
        for s in range(0, M, block):
            rows = sub.predict(Xt[s : s + block], lik, table)  # [distinct, m, 3]
            df, loc, scale = (rows[..., j].double()[inv] for j in range(3))  # [n_draws, m] each
            del rows
            y = polar_student_t(u, w, df).mul_(scale).add_(loc)
            del df, scale, loc
            out[s : s + block] = equal_tailed(y, level)
            del y
        release_freed_memory()  # once: between blocks the heap reuses the same pages
        return out

    def log_predictive(self, X: ArrayLike, y: ArrayLike) -> float:
        """Mean log posterior predictive density of test data, ``mean_n log p(y_n | x_n, D)``.

        Parameters
        ----------
        X : array-like [M, D]
        y : array-like [M] (original labels for classification)

        Returns
        -------
        float

        Raises
        ------
        ValueError
            A label not seen in training, a missing or infinite target, or ``y`` not 1-D of length ``M``.
        """
        Xt = self.inputs(X)
        yt = self._encode_y(y, Xt.shape[0]).to(Xt.device)
        lik = self.likelihood
        dens = self._mixture(Xt, lambda rows, pts: lik.log_prob_rows(rows, yt[pts]).exp()[:, None], 1)
        return float(dens[:, 0].log().mean())

    # -------------------------------------------------------------- summary
    def summary(self) -> "PosteriorSummary":
        """Weighted tree-size statistics, feature usage and sampler diagnostics.

        Returns
        -------
        PosteriorSummary (a dict; printing it shows a table) with ``n_particles``, ``n_distinct_trees``, ``ess``
        (SMC: Kish's ESS of the particle weights, resampled copies counted apart; MCMC: the chains'
        autocorrelation ESS), ``ess_distinct`` (Kish's ESS over the distinct trees: how many trees carry the
        posterior), ``log_evidence``, ``leaves_mean``, ``leaves_max``, ``depth_mean``, ``depth_max``,
        ``feature_usage`` (weighted mean number of splits per feature, an array), ``feature_names`` (its labels:
        the training table's column names, else ``x0, x1, ...``), ``map_tree`` (index of the heaviest tree) and
        the sampler's ``info``.
        """
        w = self.weights
        leaves = self.trees.n_leaves().double()
        depth = self.trees.max_depth().double()
        internal = self.trees.status == INTERNAL
        f = torch.where(internal, self.trees.feature.long(), torch.full_like(self.trees.feature.long(), self.n_features))
        usage = torch.zeros(self.trees.n_trees, self.n_features + 1, dtype=torch.float64, device=w.device)
        usage.scatter_add_(1, f, torch.ones_like(f, dtype=torch.float64))
        out = {
            "n_particles": self.n_particles,
            "n_distinct_trees": self.trees.n_trees,
            "ess": self.ess, "ess_distinct": float(1.0 / (w * w).sum()),
            "log_evidence": self.log_evidence,
            "leaves_mean": float((w * leaves).sum()),
            "leaves_max": int(leaves.max()),
            "depth_mean": float((w * depth).sum()),
            "depth_max": int(depth.max()),
            "feature_usage": self._per_input((w[:, None] * usage[:, : self.n_features]).sum(0).cpu().numpy()),
            "feature_names": self._input_names(),
            "map_tree": int(torch.argmax(w)),
        }
        out.update({k: v for k, v in self.info.items() if k not in out})
        return PosteriorSummary(out)

    def _input_names(self) -> list:
        """Names of the input columns: the training table's, else ``x0, x1, ...``."""
        if getattr(self, "feature_names", None):
            return list(self.feature_names)
        return list(self.encoder.names) if self.encoder is not None else [f"x{d}" for d in range(self.n_features)]

    def _per_input(self, per_column: np.ndarray) -> np.ndarray:
        return self.encoder.group_sums(per_column) if self.encoder is not None else per_column

    def to_dot(self, i: Optional[int] = None, feature_names: Optional[Sequence[str]] = None) -> str:
        """Graphviz DOT text of tree ``i`` (default: the heaviest tree); rules on a table with missing
        values or categories read as on the input (``x is missing``, ``c in {a, b}``)."""
        i = int(torch.argmax(self.weights)) if i is None else int(i)
        if not 0 <= i < self.trees.n_trees:
            raise IndexError(f"tree index {i} out of range [0, {self.trees.n_trees})")
        t = self.trees
        n = int(t.n_nodes[i])
        names = list(feature_names) if feature_names is not None else self._input_names()
        if len(names) != len(self._input_names()):
            raise ValueError(f"feature_names has {len(names)} names; the data has {len(self._input_names())} features")
        table = self.likelihood.predictive_table(t.stats[i, :n]).cpu()
        lines = ["digraph tree {", '  node [shape=box, fontname="Helvetica"];']
        for node in range(n):
            if int(t.status[i, node]) == INTERNAL:
                rule = rule_text(self.encoder, names, int(t.feature[i, node]), float(t.threshold[i, node]))
                lines.append(f'  n{node} [label="{dot_text(rule)}"];')
                lines.append(f'  n{node} -> n{int(t.left[i, node])} [label="yes"];')
                lines.append(f'  n{node} -> n{int(t.right[i, node])} [label="no"];')
            else:
                if self.task == "classification":
                    probs = ", ".join(f"{float(p):.2f}" for p in table[node])
                    cnt = int(t.stats[i, node].sum())
                    lines.append(f'  n{node} [label="n={cnt}\\np=[{probs}]", style=rounded];')
                else:
                    cnt = int(t.stats[i, node, 0])
                    lines.append(f'  n{node} [label="n={cnt}\\nmean={float(table[node, 1]):.4g}", style=rounded];')
        lines.append("}")
        return "\n".join(lines)

    # --------------------------------------------------------------- save
    def save(self, path: StrPath) -> None:
        """Write plain tensors and metadata (atomic: temporary file + rename).

        Raises
        ------
        ValueError
            The likelihood's ``config()`` does not name its class as registered
            (:func:`~torchtree.model.likelihood_protocol.register_likelihood`): loading could not rebuild it,
            so nothing is written.
        """
        payload = {
            "format": POSTERIOR_FORMAT,
            "trees": compact_trees(self.trees),
            "log_weights": self.log_weights.cpu(),
            "likelihood": LIKELIHOODS.check_saveable(self.likelihood),  # refused unless loading can rebuild it
            "n_features": self.n_features,
            "classes": None if self.classes_ is None else self.classes_.tolist(),
            "log_evidence": self.log_evidence,
            "n_particles": self.n_particles,
            "ess": self.ess,
            "info": to_plain(self.info),
        }
        if getattr(self, "feature_names", None) is not None:
            payload["feature_names"] = list(self.feature_names)
        if self.encoder is not None:
            payload["encoder"] = self.encoder.state()
        from torchtree.io.checkpoint import atomic_save, seal

        atomic_save(seal(payload), path)

    @classmethod
    def load(cls, path: StrPath, device: str | torch.device | None = None) -> "TreePosterior":
        """Read a posterior written by :meth:`save` (``torch.load(weights_only=True)``).

        The content checksum written by :meth:`save` is verified and the trees' structure is validated
        (a file without a checksum loads when its structure is valid).

        Raises
        ------
        FileNotFoundError
            No file at ``path``.
        ValueError
            (``torchtree.io.checkpoint.CheckpointError``) an empty, truncated or damaged
            file, a file of another kind, or one whose content was edited.
        """
        from torchtree.io.checkpoint import CheckpointError, read_payload

        payload = read_payload(path, "torchtree posterior file", device or "cpu")
        if not isinstance(payload, dict) or payload.get("format") not in READ_FORMATS:
            kind = str(payload.get("format")) if isinstance(payload, dict) else ""  # another kind: name its reader
            raise ValueError(f"{path} is not a torchtree posterior file of hard trees" + (
                f": it holds a {kind} (torchtree.load_posterior reads every kind)" if kind.startswith("torchtree.") else ""))
        obj = cls(_checked_trees(payload, path), payload["log_weights"], likelihood_from_config(payload["likelihood"]), payload["n_features"],
                  classes=None if payload["classes"] is None else np.asarray(payload["classes"]),
                  log_evidence=payload["log_evidence"], info=payload["info"], dedupe=False)
        obj.n_particles, obj.ess = payload["n_particles"], payload["ess"]
        obj.log_weights = torch.as_tensor(payload["log_weights"]).double()  # as saved: normalising again moved bits
        if payload.get("encoder") is not None:
            try:
                obj.encoder = TableEncoder.from_state(payload["encoder"], n_columns=obj.n_features)
            except ValueError as exc:
                raise CheckpointError(f"{path}: this posterior file is damaged or edited: {exc}") from None
        names = payload.get("feature_names")
        if isinstance(names, list) and len(names) == len(obj._input_names()):
            obj.feature_names = [str(v) for v in names]
        return obj

    def __repr__(self) -> str:
        ev = "None" if self.log_evidence is None else f"{self.log_evidence:.4f}"
        return f"TreePosterior(task={self.task!r}, n_particles={self.n_particles}, distinct={self.trees.n_trees}, ess={self.ess:.1f}, log_evidence={ev})"


def _checked_trees(payload: Dict[str, Any], path: StrPath) -> HardTrees:
    """The trees of a loaded posterior payload, refused unless well formed.

    The checksum catches damage and casual edits of files that have one; this catches
    the rest (files without a checksum, edits that recomputed the checksum) before a
    bad pointer or feature index routes points wrongly or out of bounds.
    """
    from torchtree.io.checkpoint import CheckpointError

    def bad(why: str) -> CheckpointError:
        return CheckpointError(f"{path}: this posterior file is damaged or edited: {why}")

    stored = payload.get("trees")
    if is_compact(stored):
        try:
            trees = expand_trees(stored)
        except ValueError as exc:
            raise bad(f"tree structure: {exc}") from None
    try:
        if not is_compact(stored):
            trees = HardTrees.from_dict(stored)
        n_features = int(payload["n_features"])
        lw = payload["log_weights"]
    except (KeyError, TypeError, ValueError, RuntimeError, AttributeError) as exc:
        raise bad(f"missing or malformed field ({type(exc).__name__}: {exc})") from None
    if not isinstance(lw, torch.Tensor) or lw.shape != (trees.n_trees,) or bool(torch.isnan(lw).any()):
        raise bad(f"log_weights must be {trees.n_trees} numbers")
    try:
        trees.validate()
    except (AssertionError, IndexError, RuntimeError) as exc:
        raise bad(f"tree structure: {exc}") from None
    internal = trees.status == INTERNAL
    if bool((internal & (trees.feature >= n_features)).any()):
        raise bad(f"a split uses a feature index >= n_features ({n_features})")
    if bool(torch.isnan(trees.threshold[internal]).any()):
        raise bad("a split threshold is NaN")
    if not bool(torch.isfinite(trees.stats).all()):
        raise bad("a node's statistics are NaN or infinite")
    return trees


def to_plain(obj):
    """Reduce diagnostics to what ``torch.load(weights_only=True)`` accepts."""
    if isinstance(obj, dict):
        return {str(k): to_plain(v) for k, v in obj.items()}
    if isinstance(obj, (list, tuple)):
        return [to_plain(v) for v in obj]
    if isinstance(obj, torch.Tensor):
        return obj.detach().cpu()
    if isinstance(obj, np.ndarray):
        return torch.as_tensor(obj)
    if isinstance(obj, (np.floating, np.integer)):
        return obj.item()
    if obj is None or isinstance(obj, (int, float, str, bool)):
        return obj
    return str(obj)
