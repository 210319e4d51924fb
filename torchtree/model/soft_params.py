"""The parameters of soft trees: their hyperparameters (:class:`SoftTreeHyper`) and the
layout of the unconstrained parameter vector ``theta`` (:class:`ParamLayout`); see
:mod:`torchtree.model.soft_trees` for the model."""
from __future__ import annotations

from dataclasses import dataclass, replace
from functools import cached_property
from typing import Any, List, Optional

import torch

from torchtree.core.validate import check_bool, check_real
from torchtree.model.soft_data import SoftData
from torchtree.model.topology import Topology

__all__ = ["SoftTreeHyper", "ParamLayout"]


@dataclass(frozen=True)
class SoftTreeHyper:
    """Prior and likelihood hyperparameters of soft trees.

    Parameters
    ----------
    split_concentration : float
        Symmetric Dirichlet concentration of split weights (1 = uniform simplex).
    threshold_a, threshold_b : float
        Beta prior of thresholds (paper: Beta(1, 1)).
    alpha : float or None
        Dirichlet-multinomial total concentration (``alpha / K`` per class);
        ``None`` means ``K`` (1 per class, as in the DCC-Tree code).
    mu_mean, mu_var : float or None
        Normal prior of regression leaf means; ``None`` means the training mean and
        variance of ``y`` (a data-dependent default).
    sigma_shape, sigma_scale : float or None
        Inverse-gamma prior of the regression noise *variance*; ``sigma_scale=None``
        means ``0.15 * var(y)`` (prior mean ``0.3 var(y)`` at shape 1.5).
    signed_splits : bool
        Not in the paper: split weights on the simplex over the scaled inputs and
        their mirror images ``1 - x`` (``2 D`` weights per node), so a split can weigh
        features with either sign (:mod:`torchtree.model.soft_data`). ``False`` is the
        paper's model.
    """

    split_concentration: float = 1.0
    threshold_a: float = 1.0
    threshold_b: float = 1.0
    alpha: Optional[float] = None
    mu_mean: Optional[float] = None
    mu_var: Optional[float] = None
    sigma_shape: float = 1.5
    sigma_scale: Optional[float] = None
    signed_splits: bool = False

    def __post_init__(self) -> None:
        # frozen: store the checked value as a plain bool (numpy booleans are accepted)
        object.__setattr__(self, "signed_splits", check_bool("signed_splits", self.signed_splits))
        for name in ("split_concentration", "threshold_a", "threshold_b", "sigma_shape"):
            check_real(name, getattr(self, name), 0.0)
        for name in ("alpha", "mu_var", "sigma_scale"):
            if getattr(self, name) is not None:
                check_real(name, getattr(self, name), 0.0)
        if self.mu_mean is not None:
            check_real("mu_mean", self.mu_mean)

    @classmethod
    def with_overrides(cls, hyper: Optional["SoftTreeHyper"] = None, **overrides: Any) -> "SoftTreeHyper":
        """``hyper`` (default: the defaults) with the non-``None`` keyword values replaced.

        The samplers' ``alpha=`` / ``split_concentration=`` / ``signed_splits=``
        shortcuts go through here.
        """
        given = {k: (v if k == "signed_splits" else float(v)) for k, v in overrides.items() if v is not None}
        return replace(hyper or cls(), **given)

    def in_target_units(self, data: SoftData) -> "SoftTreeHyper":
        """The regression prior given in the raw target's units, expressed in the units of
        ``data.y`` when ``data`` holds standardised targets (:attr:`SoftData.standardized`):
        ``mu_mean -> (mu_mean - y_offset) / y_scale``, ``mu_var -> mu_var / y_scale**2``,
        ``sigma_scale -> sigma_scale / y_scale**2``; ``None`` (data-dependent) values stay
        ``None``. Unchanged for classification or raw targets. Apply it once, before
        :meth:`resolve`."""
        if data.task != "regression" or not data.standardized:
            return self
        s2 = data.y_scale ** 2
        given = {}
        if self.mu_mean is not None:
            given["mu_mean"] = (self.mu_mean - data.y_offset) / data.y_scale
        if self.mu_var is not None:
            given["mu_var"] = self.mu_var / s2
        if self.sigma_scale is not None:
            given["sigma_scale"] = self.sigma_scale / s2
        return replace(self, **given)

    def resolve(self, data: SoftData) -> "SoftTreeHyper":
        """Fill the data-dependent defaults from ``data``."""
        h = self
        if data.task == "classification":
            if h.alpha is None:
                h = replace(h, alpha=float(data.n_classes))
        else:
            y = data.y.to(torch.float64)
            var = float(y.var()) if y.numel() > 1 else 1.0
            var = var if var > 0 else 1.0
            if h.mu_mean is None:
                h = replace(h, mu_mean=float(y.mean()))
            if h.mu_var is None:
                h = replace(h, mu_var=var)
            if h.sigma_scale is None:
                h = replace(h, sigma_scale=0.15 * var)
        return h


@dataclass(frozen=True)
class ParamLayout:
    """Where each parameter block lies in the unconstrained vector ``theta [B, P]``.

    For padded depth ``d`` (``I = 2**d - 1`` internal slots, ``L = 2**d`` leaf slots) and
    ``D`` split columns, one row of ``theta`` is:

        [ z : I*(D-1) | u : I | mu : L (regression) | s : 1 (regression) ]

    node-major split logits ``z`` (``w = softmax([z, 0])``), threshold logits ``u``
    (``tau = logistic(u)``), leaf means ``mu`` and the log noise variance ``s``
    (:mod:`torchtree.model.soft_trees` gives the model). :attr:`size` is ``P``; the offsets
    are cached properties.

    Parameters
    ----------
    depth : int
        Padded tree depth ``d``.
    n_features : int
        Split columns ``D`` (:attr:`SoftData.n_features`: twice the inputs with signed splits).
    regression : bool
        Whether the leaf-mean and noise blocks are present.
    """

    depth: int
    n_features: int
    regression: bool

    @cached_property
    def n_internal(self) -> int:
        """I = 2**depth - 1."""
        return (1 << self.depth) - 1

    @cached_property
    def n_leaves(self) -> int:
        """L = 2**depth."""
        return 1 << self.depth

    @cached_property
    def n_free_weights(self) -> int:
        """D - 1 free simplex coordinates per node."""
        return self.n_features - 1

    @cached_property
    def u_offset(self) -> int:
        """Start of the threshold block."""
        return self.n_internal * self.n_free_weights

    @cached_property
    def mu_offset(self) -> int:
        """Start of the leaf-mean block (regression)."""
        return self.u_offset + self.n_internal

    @cached_property
    def s_offset(self) -> int:
        """Position of the log-variance (regression)."""
        return self.mu_offset + self.n_leaves

    @cached_property
    def size(self) -> int:
        """P."""
        return self.s_offset + 1 if self.regression else self.mu_offset

    def compact_index(self, topology: Topology) -> torch.Tensor:
        """LongTensor [P_m]: padded coordinates that are active for ``topology``.

        The order (node-major weights, thresholds, leaf means in leaf order, log
        variance) does not depend on the padded depth, so a topology's compact vector
        is the same whichever batch it is sampled in.
        """
        Dw = self.n_free_weights
        idx: List[int] = []
        for i in topology.internal:
            idx += range(i * Dw, (i + 1) * Dw)
        idx += [self.u_offset + i for i in topology.internal]
        if self.regression:
            idx += [self.mu_offset + s for s in topology.leaf_slots(self.depth)]
            idx.append(self.s_offset)
        return torch.tensor(idx, dtype=torch.long)
