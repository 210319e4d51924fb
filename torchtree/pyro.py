"""Soft decision trees as Pyro models (``PyroModule`` with ``PyroSample`` priors).

Three modules, all built on the batched routing kernel of
:mod:`torchtree.kernels.soft_routing` and on the same priors as
:class:`~torchtree.model.soft_trees.SoftTrees` (paper 004, eq. 7-9):

* :class:`SoftTreeFunction` -- a random function ``f(x) = sum_k phi_k(x) mu_k`` with
  Dirichlet split weights, Beta thresholds and Normal leaf values. It draws nothing
  but its own parameters, so it can sit inside a larger model, e.g. as the mean
  function of a hierarchical regression;
* :class:`SoftTreeRegressor` -- ``y ~ Normal(f(x), sigma2)``, ``sigma2 ~ InvGamma``
  (eq. 9);
* :class:`SoftTreeClassifier` -- the soft-count Dirichlet-multinomial likelihood of
  eq. 8 as a ``pyro.factor`` (leaf class probabilities integrated out).

They work with ``pyro.infer.MCMC(pyro.infer.NUTS(model), ...)``, SVI, ``Predictive``
(leading sample dimensions are supported by flattening them into the batch of
trees), and ``pyro.poutine`` handlers. Inputs are scaled to [0, 1] with the ranges
given at construction (``feature_min`` / ``feature_max``), or passed pre-scaled.

``signed_splits=True`` (not in the paper) is the option of the same name in
:class:`~torchtree.soft.SoftTreeHyper`: the split weights lie on the simplex over the
scaled inputs and their mirror images ``1 - x`` (``split_weights`` has ``2 D``
columns), so a split can weigh features with either sign.
"""
from __future__ import annotations

import math
from typing import Optional

import torch
import pyro
import pyro.distributions as dist
from pyro.nn import PyroModule, PyroSample
from pyro.nn.module import pyro_method

from torchtree.kernels.soft_routing import dirichlet_multinomial_loglik, soft_class_counts, soft_routing
from torchtree.core.validate import check_bool, check_int, check_real
from torchtree.core.warn import warn

from torchtree.model.soft_data import mirror_columns
from torchtree.model.topology import Topology

__all__ = ["SoftTreeFunction", "SoftTreeRegressor", "SoftTreeClassifier"]


def _as_float(values) -> torch.Tensor:
    t = torch.as_tensor(values)
    return t if t.is_floating_point() else t.to(torch.get_default_dtype())


def _check_y(X: torch.Tensor, y: Optional[torch.Tensor]) -> None:
    if y is not None and (y.dim() != 1 or y.shape[0] != X.shape[0]):
        raise ValueError(f"y must be 1-D with {X.shape[0]} entries (one per row of X), got shape {tuple(y.shape)}")


class _SoftTreeBase(PyroModule):
    """Split priors, scaling and routing shared by the three modules."""

    def __init__(
        self,
        n_features: int,
        topology=2,
        sharpness: float = 0.05,
        split_concentration: float = 1.0,
        threshold_a: float = 1.0,
        threshold_b: float = 1.0,
        feature_min: Optional[torch.Tensor] = None,
        feature_max: Optional[torch.Tensor] = None,
        signed_splits: bool = False,
    ) -> None:
        super().__init__()
        self.topology = Topology.coerce(topology)
        if self.topology.n_internal == 0:
            raise ValueError("the topology needs at least one split")
        self.n_features = check_int("n_features", n_features, 1)
        self.sharpness = check_real("sharpness", sharpness, 0.0)
        check_real("split_concentration", split_concentration, 0.0)
        check_real("threshold_a", threshold_a, 0.0)
        check_real("threshold_b", threshold_b, 0.0)
        self.signed_splits = check_bool("signed_splits", signed_splits)
        self.depth = self.topology.depth
        I = self.topology.n_internal
        D = self.n_features
        # columns the split weights range over: the inputs, then their mirror images
        self.n_split_columns = 2 * D if signed_splits else D
        self.register_buffer("node_index", torch.tensor(self.topology.internal, dtype=torch.long))
        self.register_buffer("leaf_slots", torch.tensor(self.topology.leaf_slots(), dtype=torch.long))
        self.register_buffer("node_mask", self.topology.node_mask())
        # ranges keep a floating dtype they are given in (float64 data scales in float64)
        if (feature_min is None) != (feature_max is None):
            raise ValueError("give feature_min and feature_max together (the inputs' ranges), or neither (inputs "
                             "already scaled to [0, 1])")
        fmin = torch.zeros(D) if feature_min is None else _as_float(feature_min)
        fmax = torch.ones(D) if feature_max is None else _as_float(feature_max)
        if fmin.shape != (D,) or fmax.shape != (D,):
            raise ValueError(f"feature_min and feature_max must have shape ({D},), got {tuple(fmin.shape)} "
                             f"and {tuple(fmax.shape)}")
        if not bool(torch.isfinite(fmin).all() & torch.isfinite(fmax).all() & (fmax >= fmin).all()):
            raise ValueError("feature_min and feature_max must be finite with feature_max >= feature_min")
        self._default_ranges, self._warned_range = feature_min is None, False
        self.register_buffer("feature_min", fmin)
        self.register_buffer("feature_max", fmax)
        # scale() runs in every potential evaluation: its constants are computed once
        # (a feature with a single value maps to 0.5, as in torchtree.model.soft_data.scale_inputs)
        span = fmax - fmin
        self.register_buffer("_inv_span", torch.where(span > 0, 1.0 / torch.where(span > 0, span, 1.0), 0.0))
        self.register_buffer("_offset", torch.where(span > 0, 0.0, 0.5).to(fmin.dtype))
        if self.n_split_columns > 1:
            self.split_weights = PyroSample(
                dist.Dirichlet(torch.full((I, self.n_split_columns), float(split_concentration))).to_event(1)
            )
        self.thresholds = PyroSample(
            dist.Beta(torch.full((I,), float(threshold_a)), torch.full((I,), float(threshold_b))).to_event(1)
        )

    def scale(self, X: torch.Tensor) -> torch.Tensor:
        """Min-max scale raw inputs [N, D] with the ranges given at construction
        (a feature whose range is a single value maps to 0.5).

        Returns
        -------
        Tensor [N, D], or [N, 2 D] with ``signed_splits`` (columns ``x`` then ``1 - x``)
        """
        Xs = (X - self.feature_min.to(X)) * self._inv_span.to(X) + self._offset.to(X)
        return mirror_columns(Xs) if self.signed_splits else Xs

    @pyro_method
    def leaf_probabilities(self, X: torch.Tensor) -> torch.Tensor:
        """Leaf probabilities of the real leaves, [..., N, n_leaves] (samples the splits as the module's
        sample sites, as a call of the module does: recorded, conditioned and replayed by Pyro)."""
        X = _as_float(X)
        if X.dim() != 2 or X.shape[1] != self.n_features:
            raise ValueError(f"X must have shape [N, {self.n_features}], got {tuple(X.shape)}")
        if not bool(torch.isfinite(X).all()):
            raise ValueError("X holds NaN or infinite values; a soft tree needs finite inputs")
        if self._default_ranges and not self._warned_range and X.numel() and (X.min() < 0 or X.max() > 1):
            self._warned_range = True
            warn(f"X lies in [{float(X.min()):.3g}, {float(X.max()):.3g}] but no feature_min / feature_max were given: "
                 "the tree reads inputs as already scaled to [0, 1], so its splits cannot separate values outside it; "
                 "give the training inputs' ranges")
        tau = self.thresholds  # [..., I]
        batch = tau.shape[:-1]
        I, D = self.topology.n_internal, self.n_split_columns
        if D > 1:
            w = self.split_weights  # [..., I, D] (D = 2 n_features with signed splits)
        else:
            w = torch.ones(batch + (I, 1), dtype=tau.dtype, device=tau.device)
        B = int(torch.tensor(batch).prod()) if batch else 1
        slots = (1 << self.depth) - 1
        W = torch.zeros(B, slots, D, dtype=tau.dtype, device=tau.device)
        T = torch.full((B, slots), 0.5, dtype=tau.dtype, device=tau.device)
        W = W.index_copy(1, self.node_index, w.reshape(B, I, D))
        T = T.index_copy(1, self.node_index, tau.reshape(B, I))
        Xs = self.scale(X).to(tau.dtype)
        mask = self.node_mask.unsqueeze(0).expand(B, slots)
        phi = soft_routing(Xs, W, T, self.sharpness, mask)  # [B, N, L]
        phi = phi.index_select(-1, self.leaf_slots)
        return phi.reshape(batch + phi.shape[1:])


#: plates Pyro opens to vectorise samples (``Predictive(parallel=True)``, ``vectorize_particles``): not data plates
_VECTORIZING_PLATES = ("_num_predictive_samples", "num_particles_vectorized")


def _warn_inside_data_plate(n_rows: int) -> None:
    """Warn when the tree is called inside a plate at dim -1 of ``n_rows`` entries: the plate would give its
    sample sites a batch of ``n_rows``, a tree per row, and ``f`` would be ``[n_rows, n_rows]``."""
    from pyro.poutine.runtime import _PYRO_STACK

    for m in _PYRO_STACK:
        if getattr(m, "name", None) in _VECTORIZING_PLATES:  # Pyro's own sample dims (Predictive, ELBO particles)
            continue
        if type(m).__name__ == "plate" and getattr(m, "dim", None) == -1 and getattr(m, "size", None) == n_rows:
            warn(f"SoftTreeFunction called inside the plate {getattr(m, 'name', '')!r} of {n_rows} entries at dim "
                 "-1, as many as X's rows: every row gets a tree of its own and the output is [rows, rows]; call "
                 "the tree outside the data plate and use its output inside", UserWarning)
            return


class SoftTreeFunction(_SoftTreeBase):
    """A soft regression tree as a random function ``f(x) = sum_k phi_k(x) mu_k``.

    Parameters
    ----------
    n_features : int
    topology : Topology, int (full tree of that depth) or node ids
    sharpness : float, split sharpness ``h``
    split_concentration : float, Dirichlet prior of split weights
    threshold_a, threshold_b : float, Beta prior of thresholds
    leaf_loc, leaf_scale : float, Normal prior of leaf values (scale = std)
    feature_min, feature_max : Tensor [D], optional, input ranges for scaling
    signed_splits : bool, split weights over the inputs and their mirror images
        ``1 - x`` (``split_weights`` [I, 2 D]; see the module docstring)

    Examples
    --------
    Inside a larger model::

        tree = SoftTreeFunction(D, topology=2)
        def model(X, group, y=None):
            with pyro.plate("groups", G):  # [..., G]: a particle dim left of it when vectorised
                offset = pyro.sample("offset", dist.Normal(0., 1.))
            mean = tree(X) + offset[..., group]  # [..., N], as the tree's output
            with pyro.plate("data", len(X)):
                pyro.sample("y", dist.Normal(mean, 0.1), obs=y)

    A group term drawn as one site with an event dim (``.expand([G]).to_event(1)``) has shape
    ``[P, 1, G]`` under vectorised particles, and ``offset[..., group]`` is then ``[P, 1, N]``,
    which broadcasts against the tree's ``[P, N]`` to ``[P, P, N]``: draw such terms in a plate,
    as above.
    """

    def __init__(self, n_features: int, topology=2, sharpness: float = 0.05, split_concentration: float = 1.0,
                 threshold_a: float = 1.0, threshold_b: float = 1.0, leaf_loc: float = 0.0, leaf_scale: float = 1.0,
                 feature_min=None, feature_max=None, signed_splits: bool = False) -> None:
        super().__init__(n_features, topology, sharpness, split_concentration, threshold_a, threshold_b,
                         feature_min, feature_max, signed_splits)
        L = self.topology.n_leaves
        check_real("leaf_scale", leaf_scale, 0.0)
        self.leaf_values = PyroSample(dist.Normal(torch.full((L,), float(leaf_loc)), float(leaf_scale)).to_event(1))

    def forward(self, X: torch.Tensor) -> torch.Tensor:
        """``f(X)``: Tensor [..., N], the parameters' batch dims broadcast against the rows as Pyro
        lays them out: a parameter batch ``[P, 1]`` (vectorized particles, parallel ``Predictive``: a
        sample dim left of a data plate at dim -1) gives ``[P, N]``; ``[S]`` gives ``[S, N]``. Call it
        outside the data plate: inside, every row would get a tree of its own (a warning says so when a
        plate at dim -1 spans as many entries as ``X`` has rows)."""
        _warn_inside_data_plate(X.shape[-2] if X.dim() >= 2 else 0)
        phi = self.leaf_probabilities(X)
        mu = self.leaf_values
        f = (phi * mu.unsqueeze(-2)).sum(-1)  # batch + [N]
        if f.dim() >= 2 and f.shape[-2] == 1:  # the batch's slot of the data plate: the rows fill it
            f = f.squeeze(-2)
        return f


class SoftTreeRegressor(PyroModule):
    """``y ~ Normal(f(x), sigma2)`` with a soft tree ``f`` and ``sigma2 ~ InvGamma`` (eq. 9).

    Parameters
    ----------
    n_features, topology, sharpness, split_concentration, feature_min, feature_max, signed_splits :
        as in :class:`SoftTreeFunction`
    mu_mean, mu_var : float, Normal prior of leaf means (variance)
    sigma_shape, sigma_scale : float, inverse-gamma prior of the noise variance
    """

    def __init__(self, n_features: int, topology=2, sharpness: float = 0.05, split_concentration: float = 1.0,
                 mu_mean: float = 0.0, mu_var: float = 1.0, sigma_shape: float = 1.5, sigma_scale: float = 0.15,
                 feature_min=None, feature_max=None, signed_splits: bool = False) -> None:
        super().__init__()
        check_real("mu_var", mu_var, 0.0)
        check_real("sigma_shape", sigma_shape, 0.0)
        check_real("sigma_scale", sigma_scale, 0.0)
        self.tree = SoftTreeFunction(n_features, topology, sharpness, split_concentration, 1.0, 1.0,
                                     mu_mean, math.sqrt(mu_var), feature_min, feature_max, signed_splits)
        self.sigma2 = PyroSample(dist.InverseGamma(torch.tensor(float(sigma_shape)), torch.tensor(float(sigma_scale))))

    def forward(self, X: torch.Tensor, y: Optional[torch.Tensor] = None) -> torch.Tensor:
        """Sample ``y`` (observed if given); returns the tree's mean [..., N]."""
        X = _as_float(X)
        y = None if y is None else _as_float(y)
        _check_y(X, y)
        mean = self.tree(X)
        sigma2 = self.sigma2
        sd = torch.sqrt(sigma2)
        if sd.dim() and sd.shape[-1] != 1:  # sample dims without the data plate's slot ([S], conditioned)
            sd = sd.unsqueeze(-1)
        with pyro.plate(self._pyro_get_fullname("data"), X.shape[0], dim=-1):
            pyro.sample(self._pyro_get_fullname("y"), dist.Normal(mean, sd), obs=y)
        return mean


class SoftTreeClassifier(_SoftTreeBase):
    """Soft classification tree with the soft-count Dirichlet-multinomial likelihood (eq. 8).

    Parameters
    ----------
    n_features : int
    n_classes : int
    topology, sharpness, split_concentration, feature_min, feature_max, signed_splits : as above
    alpha : float, optional, total Dirichlet concentration (default ``n_classes``)
    """

    def __init__(self, n_features: int, n_classes: int, topology=2, sharpness: float = 0.05,
                 split_concentration: float = 1.0, alpha: Optional[float] = None,
                 feature_min=None, feature_max=None, signed_splits: bool = False) -> None:
        super().__init__(n_features, topology, sharpness, split_concentration, 1.0, 1.0, feature_min, feature_max,
                         signed_splits)
        self.n_classes = check_int("n_classes", n_classes, 2)
        self.alpha = check_real("alpha", alpha, 0.0) if alpha is not None else float(n_classes)

    def forward(self, X: torch.Tensor, y: torch.Tensor, X_new: Optional[torch.Tensor] = None) -> torch.Tensor:
        """Add ``log l(Y | X, splits)`` as a factor; returns leaf probabilities [..., N, L].

        Parameters
        ----------
        X : Tensor [N, D], the training inputs
        y : Tensor [N], their class codes ``0 .. n_classes - 1``
        X_new : Tensor [M, D], optional, inputs to predict. Their class probabilities given the
            splits and the training labels are recorded as the deterministic site ``class_probs``
            [..., M, n_classes]:

            ``p(c | x, X, y, splits) = sum_k phi_k(x) (n_kc + alpha / C) / (n_k + alpha)``

            with the soft counts ``n_kc = sum_i phi_k(x_i) [y_i = c]`` and ``n_k = sum_c n_kc``: the
            leaves' Dirichlet posterior means weighted by the new row's leaf probabilities (with hard
            routing, the ratio ``l(Y, c | X, x) / l(Y | X)`` of eq. 8). Averaged over posterior draws,
            e.g. ``Predictive(model, posterior_samples=samples, return_sites=["class_probs"])(X, y,
            X_new)["class_probs"].mean(0)``, it is the posterior predictive.
        """
        if y is None:
            raise ValueError("SoftTreeClassifier needs the labels y: the leaves' class probabilities are "
                             "integrated out given them (eq. 8); to predict new rows pass them as X_new")
        X, y = _as_float(X), torch.as_tensor(y)
        _check_y(X, y)
        if (y.is_floating_point() and not bool((y == y.round()).all())) or y.is_complex():
            raise ValueError("y must hold integer class codes; got non-integer values")
        if y.min() < 0 or y.max() >= self.n_classes:
            raise ValueError(f"y must hold class codes 0..{self.n_classes - 1}")
        phi = self.leaf_probabilities(X)
        onehot = torch.nn.functional.one_hot(y.long(), self.n_classes).to(phi.dtype)
        batch = phi.shape[:-2]
        flat = phi.reshape((-1,) + phi.shape[-2:])
        counts = soft_class_counts(flat, onehot)  # [B, L, C]
        a = self.alpha / self.n_classes
        ll = dirichlet_multinomial_loglik(counts, a)
        pyro.factor(self._pyro_get_fullname("soft_dirichlet_multinomial"), ll.reshape(batch))
        if X_new is not None:
            phi_new = self.leaf_probabilities(X_new)  # the same draw of the splits: batch + [M, L]
            leaf_probs = (counts + a) / (counts.sum(-1, keepdim=True) + self.alpha)  # [B, L, C]
            probs = torch.matmul(phi_new.reshape((-1,) + phi_new.shape[-2:]), leaf_probs)  # [B, M, C]
            pyro.deterministic(self._pyro_get_fullname("class_probs"), probs.reshape(batch + probs.shape[-2:]))
        return phi
