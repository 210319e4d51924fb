"""Layered adaptive importance sampling (LAIS) evidence from MCMC draws (paper 004, Sec. 3.3).

Every MCMC draw ``nu_{i,j}`` (draw ``i`` of chain ``j``) becomes the centre of a
Gaussian proposal ``q_{i,j} = N(nu_{i,j}, Sigma_j)`` in the unconstrained space, with
``Sigma_j`` the covariance of chain ``j``'s draws (within-chain only, because
different chains may sit in different modes). ``N_M`` pseudo-samples ``xi`` are drawn
from each proposal and weighted by

    w = p~(xi) / Phi(xi),   Phi_spatial(xi) = 1/N_T sum_n q_{n,j}(xi)     (eq. 11-13)

(``Phi_basic(xi) = q_{i,j}(xi)`` is available too). ``Z ~= mean(w)`` (eq. 11), kept in
log space (eq. 61-64) and updated incrementally across visits (eq. 65) by
:class:`EvidenceAccumulator`, which also tracks the moments of ``w`` and ``log w``
needed by the DCC utility (App. B.2-B.3).

Everything is batched over groups ``G`` (topologies) and chains ``C``: draws come as
``[G, C, T, P]`` with a coordinate mask ``[G, P]``; inactive (padded) coordinates are
neither perturbed nor counted in the Gaussian densities, so each group's evidence is
that of its own topology.
"""
from __future__ import annotations

import math
from typing import Callable, Optional

import torch

from torchtree.core.memory import check_memory, lais_bytes
from torchtree.core.validate import check_choice

__all__ = ["lais_log_weights", "chain_covariance", "EvidenceAccumulator"]


def chain_covariance(draws: torch.Tensor, mask: torch.Tensor, shrinkage: Optional[float] = None) -> torch.Tensor:
    """Regularised within-chain covariance of the active coordinates.

    Parameters
    ----------
    draws : Tensor [G, C, T, P] (float64)
    mask : BoolTensor [G, P], active coordinates
    shrinkage : float, optional
        Weight ``s`` of the diagonal in ``(1 - s) S + s diag(S)``; default
        ``P_active / (P_active + T)`` (more shrinkage when there are few draws, which
        keeps ``Sigma`` positive definite when ``T <= P``).

    Returns
    -------
    Tensor [G, C, P, P]; identity on inactive coordinates. Variances are floored at
    ``1e-10`` so that a chain that did not move still gives a valid proposal.
    """
    G, C, T, P = draws.shape
    xc = draws - draws.mean(2, keepdim=True)
    S = torch.matmul(xc.transpose(-1, -2), xc) / max(T - 1, 1)
    diag = torch.diagonal(S, dim1=-2, dim2=-1).clamp_min(1e-10)
    n_act = mask.sum(-1).to(draws.dtype).reshape(G, 1, 1, 1)
    s = n_act / (n_act + T) if shrinkage is None else torch.full_like(n_act, float(shrinkage))
    S = (1 - s) * S + s * torch.diag_embed(diag)
    S = S + torch.diag_embed(1e-9 * diag)
    S = S.clone()
    S.diagonal(dim1=-2, dim2=-1).copy_(torch.diagonal(S, dim1=-2, dim2=-1).clamp_min(1e-10))
    m2 = (mask.unsqueeze(-1) & mask.unsqueeze(-2)).unsqueeze(1)  # [G, 1, P, P]
    eye = torch.eye(P, dtype=draws.dtype, device=draws.device)
    return torch.where(m2, S, eye)


def lais_log_weights(
    draws: torch.Tensor,
    mask: torch.Tensor,
    log_target: Callable[[torch.Tensor], torch.Tensor],
    n_proposals: int = 10,
    generator: Optional[torch.Generator] = None,
    form: str = "spatial",
    shrinkage: Optional[float] = None,
    max_elements: int = 2**24,
    return_samples: bool = False,
):
    """Log importance weights of LAIS pseudo-samples, batched over groups and chains.

    Parameters
    ----------
    draws : Tensor [G, C, T, P]
        MCMC draws in the unconstrained space (``T`` per chain).
    mask : BoolTensor [G, P]
        Active coordinates per group.
    log_target : callable
        ``xi [G, K, P] -> log p~(xi) [G, K]`` (unnormalised posterior, float), with
        ``K = C * T * n_proposals`` ordered chain-major, then draw, then proposal.
    n_proposals : int, ``N_M`` pseudo-samples per draw
    generator : torch.Generator, optional
    form : {"spatial", "basic"}
        Denominator ``Phi`` of eq. 12 (mixture over the chain's draws) or eq. 60
        (the draw's own proposal).
    shrinkage : float, optional, see :func:`chain_covariance`
    max_elements : int, cap on the size of the pairwise-distance blocks (spatial form)
    return_samples : bool, also return the pseudo-samples

    Returns
    -------
    Tensor [G, C, T, n_proposals] float64 of ``log w`` (and, with ``return_samples``,
    the pseudo-samples ``xi [G, C, T, n_proposals, P]`` in ``draws.dtype``; with the
    normalised weights they are the weighted local posterior of eq. 14).
    """
    check_choice("form", form, ("spatial", "basic"))
    G, C, T, P = draws.shape
    # P x P covariances per chain: with thousands of features they outgrow any machine
    check_memory(f"LAIS evidence of {G} topologies x {C} chains with {P} parameters", lais_bytes(G, C, T, n_proposals, P),
                 "n_chains, n_samples or n_proposals (or use fewer features or a smaller max_depth)", device=draws.device)
    nu = draws.to(torch.float64)
    Sigma = chain_covariance(nu, mask, shrinkage)
    L = torch.linalg.cholesky(Sigma)  # [G, C, P, P]
    fmask = mask.to(torch.float64).reshape(G, 1, 1, 1, P)
    eps = torch.randn(G, C, T, n_proposals, P, generator=generator, dtype=torch.float64, device=nu.device)
    eps = eps * fmask
    xi = nu.unsqueeze(3) + torch.matmul(eps, L.transpose(-1, -2).unsqueeze(2))  # [G, C, T, NM, P]
    n_act = mask.sum(-1).to(torch.float64).reshape(G, 1, 1, 1)
    log_det = torch.log(torch.diagonal(L, dim1=-2, dim2=-1)).sum(-1).reshape(G, C, 1, 1)  # inactive: log 1 = 0
    const = -0.5 * n_act * math.log(2 * math.pi) - log_det
    if form == "basic":
        log_phi = const - 0.5 * (eps * eps).sum(-1)
    else:
        # Whitened coordinates: ||L^-1 (xi - nu_n)||^2 for every draw n of the chain.
        Linv = torch.linalg.solve_triangular(L, torch.eye(P, dtype=torch.float64, device=nu.device), upper=False)
        # Sigma (hence Linv) is block diagonal between active and inactive
        # coordinates, so masking the whitened coordinates drops the inactive ones.
        wm = mask.to(torch.float64).reshape(G, 1, 1, P)
        w_xi = torch.matmul(xi.reshape(G, C, T * n_proposals, P), Linv.transpose(-1, -2)) * wm  # [G, C, K', P]
        w_nu = torch.matmul(nu, Linv.transpose(-1, -2)) * wm  # [G, C, T, P]
        # distances [G, C, K', T] in chunks of pseudo-samples to bound memory
        Kp = T * n_proposals
        chunk = max(1, max_elements // max(G * C * T, 1))
        parts = []
        for s in range(0, Kp, chunk):
            d2 = torch.cdist(w_xi[:, :, s : s + chunk], w_nu).pow(2)
            parts.append(torch.logsumexp(const.reshape(G, C, 1, 1) - 0.5 * d2, -1))
        log_phi = (torch.cat(parts, 2) - math.log(T)).reshape(G, C, T, n_proposals)
    lp = log_target(xi.reshape(G, C * T * n_proposals, P).to(draws.dtype)).to(torch.float64)
    lp = torch.nan_to_num(lp.reshape(G, C, T, n_proposals), nan=-float("inf"))
    if return_samples:
        return lp - log_phi, xi.to(draws.dtype)
    return lp - log_phi


class EvidenceAccumulator:
    """Running LAIS evidence and weight moments of several groups (topologies).

    Parameters
    ----------
    n_groups : int

    Attributes
    ----------
    count : Tensor [G] float64, number of weights seen
    log_sum_w, log_sum_w2 : Tensor [G], ``log sum w`` and ``log sum w^2``
    sum_logw, sum_logw2 : Tensor [G], moments of ``log w`` (exploration term)
    max_logw : Tensor [G]
    n_finite : Tensor [G], number of finite log weights
    """

    def __init__(self, n_groups: int = 1, device=None) -> None:
        z = torch.zeros(n_groups, dtype=torch.float64, device=device)
        self.count = z.clone()
        self.log_sum_w = torch.full_like(z, -float("inf"))
        self.log_sum_w2 = torch.full_like(z, -float("inf"))
        self.sum_logw = z.clone()
        self.sum_logw2 = z.clone()
        self.max_logw = torch.full_like(z, -float("inf"))
        self.n_finite = z.clone()

    _FIELDS = ("count", "log_sum_w", "log_sum_w2", "sum_logw", "sum_logw2", "max_logw", "n_finite")

    def update(self, log_w: torch.Tensor, groups: Optional[torch.Tensor] = None) -> None:
        """Fold new weights in (eq. 65's incremental update).

        Parameters
        ----------
        log_w : Tensor [g, K] of log weights for ``g`` groups
        groups : LongTensor [g], which groups (default: all, in order)
        """
        log_w = log_w.to(torch.float64).reshape(log_w.shape[0], -1)
        if groups is None:
            groups = torch.arange(log_w.shape[0], device=log_w.device)
        finite = torch.where(torch.isfinite(log_w), log_w, torch.zeros_like(log_w))
        isf = torch.isfinite(log_w).to(torch.float64)
        self.count[groups] += log_w.shape[1]
        self.log_sum_w[groups] = torch.logaddexp(self.log_sum_w[groups], torch.logsumexp(log_w, -1))
        self.log_sum_w2[groups] = torch.logaddexp(self.log_sum_w2[groups], torch.logsumexp(2 * log_w, -1))
        # moments of log w over the finite weights (a -inf weight has no log-moment)
        self.sum_logw[groups] += (finite * isf).sum(-1)
        self.sum_logw2[groups] += (finite * finite * isf).sum(-1)
        self.n_finite[groups] += isf.sum(-1)
        self.max_logw[groups] = torch.maximum(self.max_logw[groups], log_w.max(-1).values)

    def extend(self, n_new: int) -> None:
        """Append ``n_new`` empty groups."""
        other = EvidenceAccumulator(n_new, device=self.count.device)
        for name in self._FIELDS:
            setattr(self, name, torch.cat((getattr(self, name), getattr(other, name))))

    @property
    def log_evidence(self) -> torch.Tensor:
        """``log Z_hat = log mean w`` per group, [G] (-inf before any update)."""
        return self.log_sum_w - torch.log(self.count.clamp_min(1.0))

    @property
    def log_var_w(self) -> torch.Tensor:
        """``log Var(w)`` per group (population variance of the weights), [G]."""
        n = self.count.clamp_min(1.0)
        log_m2 = self.log_sum_w2 - torch.log(n)
        log_m1sq = 2 * self.log_evidence
        # log(E w^2 - (E w)^2) = log E w^2 + log1p(-exp(2 log E w - log E w^2))
        ratio = torch.clamp(log_m1sq - log_m2, max=0.0)
        return log_m2 + torch.log((-torch.expm1(ratio)).clamp_min(1e-300))

    @property
    def logw_mean(self) -> torch.Tensor:
        """Mean of finite ``log w`` per group, [G]."""
        n = self.n_finite.clamp_min(1.0)
        return self.sum_logw / n

    @property
    def logw_std(self) -> torch.Tensor:
        """Standard deviation of finite ``log w`` per group, [G]."""
        n = self.n_finite.clamp_min(1.0)
        var = (self.sum_logw2 / n - self.logw_mean**2).clamp_min(1e-12)
        return var.sqrt()
