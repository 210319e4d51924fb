"""``SoftTrees``: a batch of soft decision trees (chains x topologies) as one nn.Module.

Model (paper 004, Sec. 2.3, HMC-DFI parameterisation):

* each internal node ``j`` has split weights ``w_j`` on the simplex over the ``D``
  features, prior ``Dirichlet(split_concentration)`` (eq. 7), and a threshold
  ``tau_j in (0, 1)`` with a ``Beta(a, b)`` prior (``Beta(1, 1)`` in the paper);
* a point goes right at node ``j`` with probability ``logistic((x . w_j - tau_j) / h)``
  on inputs min-max scaled to [0, 1] (eq. 4), and reaches a leaf with the product of
  the branch probabilities along the path (eq. 5);
* classification leaves are marginalised with the soft-count Dirichlet-multinomial
  (eq. 8); regression leaves have means ``mu_k ~ N(mu_mean, mu_var)`` and a shared
  noise variance ``sigma2 ~ InvGamma(sigma_shape, sigma_scale)`` (eq. 7, 9).

Batching: ``B = M * n_chains`` trees, topology-major (row ``b`` belongs to topology
``b // n_chains``). Every topology is padded to a common depth ``d`` (the deepest one
in the batch): ``I = 2**d - 1`` internal slots and ``L = 2**d`` leaf slots. Padded
internal slots route everything left (see :mod:`torchtree.kernels.soft_routing`) and
their parameters are *inactive*: they enter neither prior nor likelihood, and the
samplers keep them fixed (zero inverse mass), so each row samples exactly the
posterior of its own topology.

Unconstrained parameter vector ``theta [B, P]`` (one row per tree)::

    [ z : I*(D-1) | u : I | mu : L (regression) | s : 1 (regression) ]

with ``w = softmax([z, 0])`` (log-Jacobian ``sum_i log w_i``), ``tau = logistic(u)``
(log-Jacobian ``log tau + log(1 - tau)``) and ``sigma2 = exp(s)`` (log-Jacobian
``s``). ``log_prior`` is the prior density of ``theta`` itself (Jacobians included),
so ``potential = -(log_likelihood + log_prior)`` is what HMC needs and what the
evidence estimator integrates.
"""
from __future__ import annotations

import math
from typing import Any, List, Optional, Sequence, Union

import torch
from torch import nn

from torchtree.kernels.soft_gradient import compiled_core, disable_compiled, potential_and_grad_core
from torchtree.kernels.soft_routing import (
    dirichlet_multinomial_loglik,
    gaussian_soft_loglik,
    soft_class_counts,
    soft_routing,
)
from torchtree.core.validate import check_int
from torchtree.core.work import add_work

from torchtree.model.soft_data import as_soft_data
from torchtree.model.soft_params import ParamLayout, SoftTreeHyper
from torchtree.model.topology import Topology
from torchtree.core.warn import warn

__all__ = ["SoftTreeHyper", "ParamLayout", "SoftTrees", "evaluation_cost"]

#: Cost model of one evaluation on one thread of the reference CPU (the project's 2-core AMD EPYC
#: box, torch 2.13): ``a + R N I (b + c D)`` seconds for ``R`` trees of ``I`` internal slots on ``N``
#: rows of ``D`` features (``c``: the routing's projection of every row on every split's weights).
#: The gradient's terms are fitted to whole DCC runs, so that its per-call term holds a NUTS leapfrog
#: step's own bookkeeping too (``benchmarks/bench_work_clock.py``, which prints how close the model
#: comes to CPU seconds on each table); the log density is the forward half of the gradient, with its
#: per-call term fitted to timed evaluations.
GRAD_CALL_S, GRAD_ELEMENT_S, GRAD_FEATURE_S = 6.8e-4, 8.0e-9, 8.5e-11
DENSITY_CALL_S, DENSITY_ELEMENT_S, DENSITY_FEATURE_S = 2.6e-4, 5.2e-9, GRAD_FEATURE_S / 2


def evaluation_cost(n_trees: int, n_rows: int, n_internal: int, n_features: int, gradient: bool) -> float:
    """Reference seconds of one evaluation of ``n_trees`` soft trees with ``n_internal`` internal
    slots (padded) on ``n_rows`` rows of ``n_features`` inputs: the potential and its gradient
    (``gradient``) or the log density alone. What :mod:`torchtree.core.work`'s clock counts for
    each evaluation."""
    a, b, c = ((GRAD_CALL_S, GRAD_ELEMENT_S, GRAD_FEATURE_S) if gradient else
               (DENSITY_CALL_S, DENSITY_ELEMENT_S, DENSITY_FEATURE_S))
    return a + float(n_trees) * float(n_rows) * float(n_internal) * (b + c * float(n_features))


class SoftTrees(nn.Module):
    """Batched soft decision trees over chains and topologies (paper 004, eq. 4-9).

    Parameters
    ----------
    data : torchtree.Data, (X, y), SoftData, or Tensor X [N, D]
        Training data (``y`` separately if ``data`` is a bare X).
    topologies : sequence of Topology / int / iterable of node ids
        One entry per topology (an int ``d`` means the full tree of depth ``d``).
    y : Tensor [N], optional
    n_chains : int
        Chains per topology; ``B = len(topologies) * n_chains``.
    depth : int, optional
        Padded depth; default the deepest topology.
    sharpness : float or Tensor [B]
        Split sharpness ``h`` (settable later with :meth:`set_sharpness`).
    hyper : SoftTreeHyper, optional
    include_likelihood : bool
        ``False`` samples the prior (for prior-only checks).
    task, n_classes, dtype, device : see :func:`torchtree.model.soft_data.as_soft_data`
    generator : torch.Generator, optional, for the initial prior draw
    compile : bool
        Run the potential through ``torch.compile`` (dynamic shapes): faster evaluations
        after a one-off compilation per tree depth.

    Attributes
    ----------
    theta : nn.Parameter [B, P], current unconstrained state (drawn from the prior)
    coord_mask : BoolTensor [B, P], active coordinates
    node_mask : BoolTensor [B, I]
    topology_index : LongTensor [B]
    """

    def __init__(
        self,
        data: Any,
        topologies: Sequence[Any] = (1,),
        *,
        y: Any = None,
        n_chains: int = 1,
        depth: Optional[int] = None,
        sharpness: Union[float, torch.Tensor] = 0.05,
        hyper: Optional[SoftTreeHyper] = None,
        include_likelihood: bool = True,
        task: Optional[str] = None,
        n_classes: Optional[int] = None,
        dtype: torch.dtype = torch.float32,
        device: Optional[Union[str, torch.device]] = None,
        generator: Optional[torch.Generator] = None,
        compile: bool = False,
    ) -> None:
        super().__init__()
        dev = torch.device(device) if device is not None else None
        hyper = hyper or SoftTreeHyper()
        self.data = as_soft_data(data, y, task=task, n_classes=n_classes, dtype=dtype, device=dev,
                                 signed=hyper.signed_splits)
        # the data's dtype rules: float64 when huge regression targets promoted it (run_dtype)
        dtype = self.data.X.dtype
        dev = self.data.X.device
        self.topologies: List[Topology] = [Topology.coerce(t) for t in topologies]
        if not self.topologies:
            raise ValueError("at least one topology is needed")
        if any(t.n_internal == 0 for t in self.topologies):
            raise ValueError("a soft tree needs at least one split (depth >= 1); the single leaf has no "
                             "parameters to sample")
        self.n_chains = check_int("n_chains", n_chains, 1)
        self.depth = max(t.depth for t in self.topologies) if depth is None else int(depth)
        if any(t.depth > self.depth for t in self.topologies):
            raise ValueError("a topology is deeper than the padded depth")
        self.task = self.data.task
        self.hyper = hyper.resolve(self.data)
        self.include_likelihood = bool(include_likelihood)
        self.layout = ParamLayout(self.depth, self.data.n_features, self.task == "regression")
        M, C, P = len(self.topologies), self.n_chains, self.layout.size
        self.register_buffer("X", self.data.X)
        self.register_buffer("y", self.data.y)
        if self.task == "classification":
            onehot = torch.nn.functional.one_hot(self.data.y, self.data.n_classes).to(dtype)
            self.register_buffer("y_onehot", onehot)
        node_mask = torch.stack([t.node_mask(self.depth) for t in self.topologies]).to(dev)
        self.register_buffer("node_mask", node_mask.repeat_interleave(C, 0))
        cmask = torch.zeros(M, P, dtype=torch.bool, device=dev)
        self._compact = [self.layout.compact_index(t).to(dev) for t in self.topologies]
        for m, idx in enumerate(self._compact):
            cmask[m, idx] = True
        self.register_buffer("coord_mask", cmask.repeat_interleave(C, 0))
        # float copies, so the hot path does not convert the masks on every call
        self.register_buffer("node_mask_f", self.node_mask.to(dtype))
        self.register_buffer("coord_mask_f", self.coord_mask.to(dtype))
        self.register_buffer(
            "topology_index", torch.arange(M, device=dev).repeat_interleave(C)
        )
        self.register_buffer("sharpness", torch.as_tensor(sharpness, dtype=dtype, device=dev).clone())
        self.compile = bool(compile)
        self._consts = (self.hyper, self.layout, self.task, self.data.n_classes, self.include_likelihood)
        self.theta = nn.Parameter(self.sample_prior(generator), requires_grad=False)

    # ----------------------------------------------------------------- shapes
    @property
    def batch_size(self) -> int:
        """B = n_topologies * n_chains."""
        return len(self.topologies) * self.n_chains

    @property
    def n_params(self) -> int:
        """P, length of the padded unconstrained vector."""
        return self.layout.size

    def compact_index(self, m: int) -> torch.Tensor:
        """LongTensor [P_m]: active coordinates of topology ``m``."""
        return self._compact[m]

    def set_sharpness(self, h: Union[float, torch.Tensor]) -> None:
        """Set the split sharpness ``h`` (scalar or per-tree [B])."""
        self.sharpness = torch.as_tensor(h, dtype=self.X.dtype, device=self.X.device).clone()

    # ----------------------------------------------------------------- transforms
    def constrain(self, theta: torch.Tensor) -> dict:
        """Constrained parameters of every tree.

        Parameters
        ----------
        theta : Tensor [B, P]

        Returns
        -------
        dict with ``weights [B, I, D]``, ``log_weights [B, I, D]``,
        ``thresholds [B, I]``, ``u [B, I]`` and, for regression, ``mu [B, L]``,
        ``sigma2 [B]``, ``s [B]``.
        """
        lay = self.layout
        B, I, D = theta.shape[0], lay.n_internal, lay.n_features
        z = theta[:, : lay.u_offset].reshape(B, I, D - 1)
        z = torch.cat((z, torch.zeros(B, I, 1, dtype=theta.dtype, device=theta.device)), dim=-1)
        log_w = torch.log_softmax(z, dim=-1)
        u = theta[:, lay.u_offset : lay.mu_offset]
        out = {"weights": log_w.exp(), "log_weights": log_w, "u": u, "thresholds": torch.sigmoid(u)}
        if lay.regression:
            out["mu"] = theta[:, lay.mu_offset : lay.s_offset]
            out["s"] = theta[:, lay.s_offset]
            out["sigma2"] = torch.exp(out["s"])
        return out

    def unconstrain(self, weights=None, thresholds=None, mu=None, sigma2=None) -> torch.Tensor:
        """Inverse of :meth:`constrain` (inactive slots set to zero).

        Parameters
        ----------
        weights : Tensor [B, I, D] on the simplex
        thresholds : Tensor [B, I] in (0, 1)
        mu : Tensor [B, L] (regression)
        sigma2 : Tensor [B] (regression)

        Returns
        -------
        Tensor [B, P]
        """
        lay = self.layout
        B = self.batch_size
        theta = torch.zeros(B, lay.size, dtype=self.X.dtype, device=self.X.device)
        if weights is not None:
            lw = torch.log(weights.to(theta.dtype))
            theta[:, : lay.u_offset] = (lw[..., :-1] - lw[..., -1:]).reshape(B, -1)
        if thresholds is not None:
            theta[:, lay.u_offset : lay.mu_offset] = torch.logit(thresholds.to(theta.dtype))
        if lay.regression and mu is not None:
            theta[:, lay.mu_offset : lay.s_offset] = mu
        if lay.regression and sigma2 is not None:
            theta[:, lay.s_offset] = torch.log(torch.as_tensor(sigma2, dtype=theta.dtype))
        return torch.where(self.coord_mask, theta, torch.zeros_like(theta))

    # ----------------------------------------------------------------- densities
    def _rows(self, rows: Optional[torch.Tensor]):
        """Per-row node mask, coordinate mask and sharpness (all rows if ``rows`` is None)."""
        h = self.sharpness
        if rows is None:
            return self.node_mask, self.coord_mask, h
        if h.dim() > 0:
            h = h[rows]
        return self.node_mask[rows], self.coord_mask[rows], h

    def _float_masks(self, rows: Optional[torch.Tensor], dtype: torch.dtype):
        nm, cm = self.node_mask_f, self.coord_mask_f
        if rows is not None:
            nm, cm = nm[rows], cm[rows]
        if nm.dtype != dtype:
            nm, cm = nm.to(dtype), cm.to(dtype)
        return nm, cm

    def log_prior(self, theta: torch.Tensor, rows: Optional[torch.Tensor] = None) -> torch.Tensor:
        """Prior log density of the unconstrained ``theta`` (Jacobians included).

        Parameters
        ----------
        theta : Tensor [B, P] (or [R, P] with ``rows``)
        rows : LongTensor [R], optional
            Batch rows (trees) that the rows of ``theta`` belong to; lets a caller
            score any number of points of chosen topologies (e.g. LAIS pseudo-samples)
            without building another module.

        Returns
        -------
        Tensor [B], or [R] with ``rows`` (one value per row of ``theta``); only active coordinates
        contribute. The topology prior ``log p(m)`` is *not* included (see :meth:`Topology.log_prior`).
        """
        hp, lay = self.hyper, self.layout
        node_mask, coord_mask, _ = self._rows(rows)
        c = self.constrain(theta)
        nm = node_mask.to(theta.dtype)
        D = lay.n_features
        a = hp.split_concentration
        lp = torch.zeros(theta.shape[0], dtype=theta.dtype, device=theta.device)
        if D > 1:  # Dirichlet density times the softmax Jacobian: alpha * sum log w
            per_node = math.lgamma(D * a) - D * math.lgamma(a) + a * c["log_weights"].sum(-1)
            lp = lp + (per_node * nm).sum(-1)
        ta, tb = hp.threshold_a, hp.threshold_b
        logbeta = math.lgamma(ta) + math.lgamma(tb) - math.lgamma(ta + tb)
        u = c["u"]
        per_node = ta * torch.nn.functional.logsigmoid(u) + tb * torch.nn.functional.logsigmoid(-u) - logbeta
        lp = lp + (per_node * nm).sum(-1)
        if lay.regression:
            lm = coord_mask[:, lay.mu_offset : lay.s_offset].to(theta.dtype)
            mu = c["mu"]
            per_leaf = -0.5 * math.log(2 * math.pi * hp.mu_var) - 0.5 * (mu - hp.mu_mean) ** 2 / hp.mu_var
            lp = lp + (per_leaf * lm).sum(-1)
            sa, sb = hp.sigma_shape, hp.sigma_scale
            s = c["s"]
            lp = lp + sa * math.log(sb) - math.lgamma(sa) - sa * s - sb * torch.exp(-s)
        return lp

    def routing(
        self,
        X: Optional[torch.Tensor] = None,
        theta: Optional[torch.Tensor] = None,
        scaled: bool = False,
        rows: Optional[torch.Tensor] = None,
    ) -> torch.Tensor:
        """Leaf-assignment probabilities of every point in every tree.

        Parameters
        ----------
        X : Tensor [N, D], optional
            Raw inputs (scaled here with the training ranges unless ``scaled``);
            default: the training inputs.
        theta : Tensor [B, P], optional
            Default: the module's current :attr:`theta`.
        scaled : bool
        rows : LongTensor [R], optional, see :meth:`log_prior`

        Returns
        -------
        Tensor [B, N, L]; rows sum to one over the ``L = 2**depth`` leaf slots.
        """
        theta = self.theta if theta is None else theta
        if X is None:
            Xs = self.X
        else:
            Xs = X if scaled else self.data.scale(torch.as_tensor(X, device=self.X.device))
            Xs = Xs.to(self.X.dtype)
        node_mask, _, h = self._rows(rows)
        c = self.constrain(theta)
        return soft_routing(Xs, c["weights"], c["thresholds"], h.to(theta.dtype), node_mask)

    def log_likelihood(self, theta: torch.Tensor, rows: Optional[torch.Tensor] = None) -> torch.Tensor:
        """Soft-tree log likelihood of the training data (eq. 8 or 9).

        Parameters
        ----------
        theta : Tensor [B, P] (or [R, P] with ``rows``)
        rows : LongTensor [R], optional, see :meth:`log_prior`

        Returns
        -------
        Tensor [B], or [R] with ``rows`` (zeros when ``include_likelihood`` is False)
        """
        if not self.include_likelihood:
            return torch.zeros(theta.shape[0], dtype=theta.dtype, device=theta.device)
        phi = self.routing(theta=theta, rows=rows)
        if self.task == "classification":
            counts = soft_class_counts(phi, self.y_onehot)
            return dirichlet_multinomial_loglik(counts, self.hyper.alpha / self.data.n_classes)
        c = self.constrain(theta)
        return gaussian_soft_loglik(phi, c["mu"], c["sigma2"], self.y)

    def log_density(self, theta: torch.Tensor, rows: Optional[torch.Tensor] = None) -> torch.Tensor:
        """Unnormalised log posterior of ``theta`` given its topology, [B] (one evaluation on the
        work clock, :mod:`torchtree.core.work`); with ``rows`` (see :meth:`log_prior`) ``theta`` is
        [R, P] and the result [R]."""
        self._count(rows, gradient=False)
        return self.log_likelihood(theta, rows) + self.log_prior(theta, rows)

    def _count(self, rows: Optional[torch.Tensor], gradient: bool) -> None:
        """Advance the work clock by one evaluation of ``len(rows)`` trees (all ``B`` without rows)."""
        n = self.batch_size if rows is None else int(rows.shape[0])
        add_work(evaluation_cost(n, int(self.X.shape[0]), self.layout.n_internal, int(self.X.shape[1]), gradient))

    def potential(self, theta: torch.Tensor, rows: Optional[torch.Tensor] = None) -> torch.Tensor:
        """HMC potential ``U(theta) = -log_density(theta)``, [B] ([R] with ``rows``)."""
        return -self.log_density(theta, rows)

    def potential_and_grad(self, theta: torch.Tensor, rows: Optional[torch.Tensor] = None):
        """Potential and its gradient for the whole batch in one call.

        Uses the closed-form gradient (:meth:`potential_and_grad_analytic`); the
        autograd version (:meth:`potential_and_grad_autograd`) is its reference.

        Parameters
        ----------
        theta : Tensor [B, P]
        rows : LongTensor [R], optional, see :meth:`log_prior`

        Returns
        -------
        (U [B], grad [B, P]), both detached.
        """
        with torch.no_grad():
            return self.potential_and_grad_analytic(theta, rows)

    def potential_and_grad_autograd(self, theta: torch.Tensor, rows: Optional[torch.Tensor] = None):
        """Reference potential and gradient by autograd (rows are independent, so the
        gradient of ``U.sum()`` is each row's gradient); same contract as
        :meth:`potential_and_grad`."""
        with torch.enable_grad():
            th = theta.detach().requires_grad_(True)
            U = self.potential(th, rows)
            (g,) = torch.autograd.grad(U.sum(), th)
        return U.detach(), g

    def potential_and_grad_analytic(self, theta: torch.Tensor, rows: Optional[torch.Tensor] = None):
        """Potential and gradient with hand-derived derivatives (no autograd graph).

        An autograd graph of the potential has ~150 small ops whose bookkeeping, not
        arithmetic, dominates on a CPU at NUTS batch sizes. The chain rule here is:
        likelihood -> ``dL/dphi`` (digamma differences for eq. 8, residuals for eq. 9)
        -> ``routing_backward`` -> ``dL/dw, dL/dtau`` -> through
        ``w = softmax([z, 0])`` (``dw_j/dz_i = w_j (delta_ij - w_i)``) and
        ``tau = logistic(u)``; prior terms are differentiated in closed form.
        The code is :func:`torchtree.kernels.soft_gradient.potential_and_grad_core`; with
        ``compile=True`` it runs through ``torch.compile`` (one fused kernel set per tree
        depth; falls back to eager if compilation fails).
        """
        core, tensors, consts = self.fused_parts(rows, theta.dtype)
        fn = compiled_core() if self.compile else None
        if fn is not None:
            try:
                return fn(theta, *tensors, consts)
            except Exception as exc:  # pragma: no cover - no compiler toolchain, unsupported backend
                disable_compiled()
                warn(f"torch.compile of the soft-tree potential failed ({type(exc).__name__}: {exc}); "
                     "using the eager implementation", RuntimeWarning)
        return core(theta, *tensors, consts)

    def fused_parts(self, rows: Optional[torch.Tensor] = None, dtype: Optional[torch.dtype] = None):
        """The potential as a pure function, for a fused (compiled) NUTS step.

        Parameters
        ----------
        rows : LongTensor [R], optional, see :meth:`log_prior`
        dtype : torch.dtype, optional, of the masks (default: the inputs' dtype)

        Returns
        -------
        (core, tensors, consts) such that ``core(theta, *tensors, consts)`` equals
        ``potential_and_grad(theta, rows)`` for ``theta [R, P]`` (``[B, P]`` without
        rows); ``core`` is the same module-level function for every ``SoftTrees``, so a
        compiled caller is not recompiled per model. See
        :func:`torchtree.steps.nuts.nuts_step` (``fused=``). Each call counts one evaluation
        of the potential and gradient on the work clock (:mod:`torchtree.core.work`): the
        caller evaluates what it gets once.
        """
        node_mask, _, h = self._rows(rows)
        nm, cmf = self._float_masks(rows, dtype or self.X.dtype)
        self._count(rows, gradient=True)
        target = self.y_onehot if self.task == "classification" else self.y
        return potential_and_grad_core, (self.X, target, nm, cmf, node_mask, h), self._consts

    @torch.no_grad()
    def log_density_chunked(
        self, theta: torch.Tensor, rows: torch.Tensor, max_elements: int = 2**24
    ) -> torch.Tensor:
        """``log_density`` of many points in chunks that bound memory (no gradient).

        Parameters
        ----------
        theta : Tensor [R, P]
        rows : LongTensor [R], batch row (hence topology) of each point
        max_elements : int, cap on ``chunk * N * L`` (the routing tensor's size)

        Returns
        -------
        Tensor [R]
        """
        per_row = self.X.shape[0] * self.layout.n_leaves
        chunk = max(1, max_elements // max(per_row, 1))
        out = [self.log_density(theta[i : i + chunk], rows[i : i + chunk]) for i in range(0, theta.shape[0], chunk)]
        return torch.cat(out) if out else theta.new_zeros(0)

    forward = potential

    # ----------------------------------------------------------------- prior draws
    def sample_prior(self, generator: Optional[torch.Generator] = None) -> torch.Tensor:
        """Draw ``theta [B, P]`` from the prior (inactive coordinates are zero)."""
        hp, lay = self.hyper, self.layout
        B, I, D, L = self.batch_size, lay.n_internal, lay.n_features, lay.n_leaves
        dev = self.X.device
        g = generator

        def gamma(shape, conc):
            return torch._standard_gamma(torch.full(shape, conc, dtype=torch.float64, device=dev), generator=g)

        w = gamma((B, I, D), hp.split_concentration)
        w = (w / w.sum(-1, keepdim=True)).clamp_min(1e-30)
        ga, gb = gamma((B, I), hp.threshold_a), gamma((B, I), hp.threshold_b)
        tau = (ga / (ga + gb)).clamp(1e-6, 1 - 1e-6)
        mu = sigma2 = None
        if lay.regression:
            mu = hp.mu_mean + math.sqrt(hp.mu_var) * torch.randn(B, L, generator=g, dtype=torch.float64, device=dev)
            sigma2 = hp.sigma_scale / gamma((B,), hp.sigma_shape)
        return self.unconstrain(w, tau, mu, sigma2)

    # ----------------------------------------------------------------- prediction
    def leaf_class_probs(self, theta: torch.Tensor) -> torch.Tensor:
        """Posterior-predictive class probabilities of each leaf slot.

        Given the splits, the Dirichlet-multinomial leaf's predictive is
        ``(soft count + alpha/K) / (total + alpha)``.

        Parameters
        ----------
        theta : Tensor [B, P]

        Returns
        -------
        Tensor [B, L, C]
        """
        phi = self.routing(theta=theta)
        counts = soft_class_counts(phi, self.y_onehot)
        a = self.hyper.alpha / self.data.n_classes
        return (counts + a) / (counts.sum(-1, keepdim=True) + self.hyper.alpha)

    def predict(self, X: torch.Tensor, theta: Optional[torch.Tensor] = None, scaled: bool = False) -> torch.Tensor:
        """Per-tree predictions at new inputs.

        Parameters
        ----------
        X : Tensor [N*, D] raw inputs
        theta : Tensor [B, P], optional
        scaled : bool, inputs already scaled

        Returns
        -------
        Tensor [B, N*, C] class probabilities (classification) or [B, N*] means.
        """
        theta = self.theta if theta is None else theta
        phi = self.routing(X, theta, scaled=scaled)
        if self.task == "classification":
            return torch.matmul(phi, self.leaf_class_probs(theta))
        return torch.matmul(phi, self.constrain(theta)["mu"].unsqueeze(-1)).squeeze(-1)
