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

Two exact forms of the same covariance. ``Sigma_j = (1 - s) S_j + s diag(S_j)`` (plus a
1e-9 jitter) is a diagonal plus a rank ``T - 1`` term, since ``S_j`` is the covariance of
``T`` draws. For a few hundred parameters the dense ``P x P`` matrices and their Cholesky
factors are cheap, and that is what runs (the recorded golden outputs use it). For more
(``P >`` :data:`LOWRANK_MIN_PARAMS`, e.g. a wide table: 50 x 10,000 asked for 78 GB),
:func:`lais_log_weights` uses the diagonal-plus-low-rank form instead: pseudo-samples are
``nu + D^(1/2) e1 + U e2`` and the Gaussian densities come from the Woodbury identity with
one ``T x T`` Cholesky factor per chain, on each topology's active coordinates only, in
chunks of chains; memory is then linear in ``P`` (:func:`lais_memory_bytes`). Same
proposals and weights in distribution; other random draws.
"""
from __future__ import annotations

import math
from typing import Callable, Optional

import torch

from torchtree.core.memory import check_memory, lais_bytes
from torchtree.core.validate import check_choice

__all__ = ["lais_log_weights", "chain_covariance", "EvidenceAccumulator", "lais_memory_bytes", "LOWRANK_MIN_PARAMS",
           "COVARIANCE_FORMS"]

#: Above this many parameters (padded, per topology) LAIS uses the diagonal-plus-low-rank
#: covariance form (module docstring); at or below it, the dense form.
LOWRANK_MIN_PARAMS = 512
COVARIANCE_FORMS = ("auto", "dense", "lowrank")


def _use_lowrank(covariance: str, n_params: int) -> bool:
    return covariance == "lowrank" or (covariance == "auto" and n_params > LOWRANK_MIN_PARAMS)


def lais_memory_bytes(n_groups: int, n_chains: int, n_draws: int, n_proposals: int, n_params: int,
                      covariance: str = "auto", itemsize: int = 4, max_elements: int = 2**24) -> int:
    """Bytes one LAIS update needs (a lower bound of its large arrays).

    Parameters
    ----------
    n_groups, n_chains, n_draws, n_proposals, n_params : int
        ``G, C, T, N_M, P`` of :func:`lais_log_weights`.
    covariance : {"auto", "dense", "lowrank"}, the form that runs (see the module docstring)
    itemsize : int, bytes per number of the draws' dtype (the pseudo-samples it returns)
    max_elements : int, the chunk cap of :func:`lais_log_weights`

    Returns
    -------
    int. Dense: three ``P x P`` float64 matrices per chain plus the pseudo-samples, noise
    and whitened copies (``3 T N_M P`` float64 per chain). Low-rank: the pseudo-samples
    in ``itemsize`` bytes plus, per chunk of at most ``max_elements`` numbers, five float64
    work arrays.
    """
    G, C, T, NM, P = (int(v) for v in (n_groups, n_chains, n_draws, n_proposals, n_params))
    if not _use_lowrank(covariance, P):
        return lais_bytes(G, C, T, NM, P)
    per_chain = T * NM * P
    chunk = max(1, min(C, max_elements // max(per_chain, 1))) * per_chain
    return G * C * per_chain * int(itemsize) + 5 * 8 * chunk


def chain_covariance(draws: torch.Tensor, mask: torch.Tensor, shrinkage: Optional[float] = None) -> torch.Tensor:
    """Regularised within-chain covariance of the active coordinates: LAIS's proposal covariance.

    ``Sigma_j = (1 - s) S_j + s diag(S_j) + 1e-9 diag(S_j)`` with ``S_j`` the sample
    covariance of chain ``j``'s ``T`` draws (paper 004, Sec. 3.3).

    Parameters
    ----------
    draws : Tensor [G, C, T, P]
        ``T`` draws of each of ``C`` chains of ``G`` groups (topologies), float64.
    mask : BoolTensor [G, P]
        Active coordinates of each group.
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
    covariance: str = "auto",
):
    """Log importance weights of LAIS pseudo-samples, batched over groups and chains.

    Layered adaptive importance sampling (Martino, Elvira, Luengo & Corander 2017,
    "Layered adaptive importance sampling", Statistics and Computing) on MCMC draws, as
    DCC-Tree uses it (paper 004, Sec. 3.3, eq. 11-13): each draw ``nu`` of chain ``j``
    proposes ``n_proposals`` pseudo-samples ``xi ~ N(nu, Sigma_j)`` (``Sigma_j`` from
    :func:`chain_covariance`) weighted by ``w = p~(xi) / Phi(xi)``; ``log mean w``
    estimates the log evidence of each group.

    Parameters
    ----------
    draws : Tensor [G, C, T, P]
        MCMC draws in the unconstrained space (``T`` per chain).
    mask : BoolTensor [G, P]
        Active coordinates per group.
    log_target : callable
        ``xi [G, K, P] -> log p~(xi) [G, K]`` (unnormalised posterior, float), with
        ``K = C * T * n_proposals`` ordered chain-major, then draw, then proposal.
    n_proposals : int, default 10
        ``N_M``, pseudo-samples per draw.
    generator : torch.Generator, optional
        Source of the pseudo-samples.
    form : {"spatial", "basic"}, default "spatial"
        Denominator ``Phi`` of eq. 12 (mixture over the chain's draws) or eq. 60
        (the draw's own proposal).
    shrinkage : float, optional
        Diagonal weight of the covariance, see :func:`chain_covariance`.
    max_elements : int, default 2**24
        Cap on the size of the pairwise-distance blocks (spatial form) and of the chunks of
        chains (low-rank form).
    return_samples : bool, default False
        Also return the pseudo-samples.
    covariance : {"auto", "dense", "lowrank"}, default "auto"
        The covariance form (module docstring); "auto": dense up to
        :data:`LOWRANK_MIN_PARAMS` parameters, low-rank above.

    Returns
    -------
    Tensor [G, C, T, n_proposals]
        float64 ``log w`` (NaN targets count as ``-inf``). With ``return_samples``, the
        tuple ``(log_w, xi)`` with the pseudo-samples ``xi [G, C, T, n_proposals, P]`` in
        ``draws.dtype``; with the normalised weights they are the weighted local posterior of
        eq. 14.

    Raises
    ------
    ValueError
        ``form`` or ``covariance`` is not one of its choices, or the update would need more
        memory than is available (:func:`lais_memory_bytes`).
    """
    check_choice("form", form, ("spatial", "basic"))
    check_choice("covariance", covariance, COVARIANCE_FORMS)
    G, C, T, P = draws.shape
    check_memory(f"LAIS evidence of {G} topologies x {C} chains with {P} parameters",
                 lais_memory_bytes(G, C, T, n_proposals, P, covariance, draws.element_size(), max_elements),
                 "n_chains, n_samples or n_proposals (or use fewer features or a smaller max_depth)", device=draws.device)
    if _use_lowrank(covariance, P):
        log_phi, xi = _lowrank_proposals(draws, mask, n_proposals, generator, form, shrinkage, max_elements)
        lp = log_target(xi.reshape(G, C * T * n_proposals, P)).to(torch.float64)
        lp = torch.nan_to_num(lp.reshape(G, C, T, n_proposals), nan=-float("inf"))
        return (lp - log_phi, xi) if return_samples else lp - log_phi
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


def _lowrank_proposals(draws, mask, n_proposals, generator, form, shrinkage, max_elements):
    """Pseudo-samples and ``log Phi`` with ``Sigma = D + U U^T`` (exactly
    :func:`chain_covariance`'s matrix on the active coordinates: ``U = sqrt((1 - s) / (T - 1))
    (draws - mean)^T``, ``D`` the rest of its diagonal), one topology and chunk of chains at
    a time, so that no ``P x P`` array exists.

    Returns
    -------
    (log_phi [G, C, T, N_M] float64, xi [G, C, T, N_M, P] in ``draws.dtype``; inactive
    coordinates of ``xi`` are the draws' own, as in the dense form)
    """
    G, C, T, P = draws.shape
    NM, dev = n_proposals, draws.device
    f64 = torch.float64
    xi_out = draws.unsqueeze(3).expand(G, C, T, NM, P).clone()
    log_phi = torch.empty(G, C, T, NM, dtype=f64, device=dev)
    cdist_rows = max(1, max_elements // max(T, 1))
    for g in range(G):  # topologies: a handful per call
        act = mask[g].nonzero().squeeze(1)
        Pa = int(act.numel())
        step = max(1, min(C, max_elements // max(T * NM * Pa, 1)))
        for c0 in range(0, C, step):
            nu = draws[g, c0 : c0 + step].index_select(-1, act).to(f64)  # [c, T, Pa]
            c = nu.shape[0]
            xc = nu - nu.mean(1, keepdim=True)
            s_ii = (xc * xc).sum(1) / max(T - 1, 1)  # [c, Pa], the diagonal of S
            s = Pa / (Pa + T) if shrinkage is None else float(shrinkage)
            floor = s_ii.clamp_min(1e-10)
            diag = ((1 - s) * s_ii + s * floor + 1e-9 * floor).clamp_min(1e-10)  # chain_covariance's diagonal
            d = diag - (1 - s) * s_ii  # [c, Pa] > 0: the part of the diagonal outside U U^T
            U = math.sqrt((1 - s) / max(T - 1, 1)) * xc.transpose(1, 2)  # [c, Pa, T]
            e1 = torch.randn(c, T, NM, Pa, generator=generator, dtype=f64, device=dev)
            e2 = torch.randn(c, T, NM, T, generator=generator, dtype=f64, device=dev)
            xi = nu.unsqueeze(2) + d.sqrt().view(c, 1, 1, Pa) * e1 + torch.matmul(e2, U.transpose(1, 2).unsqueeze(1))
            del e1, e2
            # Woodbury: Sigma^-1 = D^-1 - D^-1 U A^-1 U^T D^-1, A = I + U^T D^-1 U = La La^T
            dinv = 1.0 / d
            A = torch.eye(T, dtype=f64, device=dev) + torch.matmul(U.transpose(1, 2) * dinv.unsqueeze(1), U)
            La = torch.linalg.cholesky(A)
            M = torch.linalg.solve_triangular(La, U.transpose(1, 2) * dinv.unsqueeze(1), upper=False)  # [c, T, Pa]
            log_det = torch.log(d).sum(-1) + 2 * torch.log(torch.diagonal(La, dim1=-2, dim2=-1)).sum(-1)  # [c]
            const = (-0.5 * Pa * math.log(2 * math.pi) - 0.5 * log_det).view(c, 1, 1)
            w = dinv.sqrt()
            # centred on the chain's mean: distances do not change, and cdist's matmul form
            # loses no digits to a large common offset
            mean = nu.mean(1, keepdim=True)
            xf, nc = xi.reshape(c, T * NM, Pa) - mean, nu - mean
            if form == "basic":
                r = (xi - nu.unsqueeze(2)).reshape(c, T * NM, Pa)
                quad = ((r * w.unsqueeze(1)) ** 2).sum(-1) - (torch.matmul(r, M.transpose(1, 2)) ** 2).sum(-1)
                lphi = const.view(c, 1) - 0.5 * quad.clamp_min(0.0)
            else:
                a, b = xf * w.unsqueeze(1), nc * w.unsqueeze(1)
                pa, pb = torch.matmul(xf, M.transpose(1, 2)), torch.matmul(nc, M.transpose(1, 2))
                parts = []
                for k0 in range(0, T * NM, cdist_rows):
                    d2 = torch.cdist(a[:, k0 : k0 + cdist_rows], b).pow(2) - torch.cdist(
                        pa[:, k0 : k0 + cdist_rows], pb).pow(2)
                    parts.append(torch.logsumexp(const - 0.5 * d2.clamp_min(0.0), -1))
                lphi = torch.cat(parts, 1) - math.log(T)
            log_phi[g, c0 : c0 + c] = lphi.reshape(c, T, NM)
            xi_out[g, c0 : c0 + c].index_copy_(-1, act, xi.to(draws.dtype))
    return log_phi, xi_out


class EvidenceAccumulator:
    """Running LAIS evidence and weight moments of several groups (topologies).

    Folds the log weights of successive :func:`lais_log_weights` calls into ``log sum w``,
    ``log sum w^2`` and the moments of ``log w``, so that the evidence estimate
    ``Z_hat = mean w`` improves with every visit of a topology (paper 004, eq. 61-65) and the
    DCC utility (:func:`~torchtree.samplers.dcc.utility.dcc_utility`) can be evaluated from
    :attr:`log_evidence`, :attr:`log_var_w`, :attr:`logw_mean`, :attr:`logw_std` and
    ``max_logw``. Everything is float64, kept on ``device``.

    Parameters
    ----------
    n_groups : int, default 1
        Number of groups ``G`` (more can be appended with :meth:`extend`).
    device : torch.device or str, optional
        Where the statistics live (default: the CPU); weights from another device are moved.

    Attributes
    ----------
    count : Tensor [G]
        Number of weights seen.
    log_sum_w : Tensor [G]
        ``log sum w``.
    log_sum_w2 : Tensor [G]
        ``log sum w^2``.
    sum_logw : Tensor [G]
        ``sum log w`` over the finite log weights (exploration term).
    sum_logw2 : Tensor [G]
        ``sum (log w)^2`` over the finite log weights.
    max_logw : Tensor [G]
        Largest log weight seen (``-inf`` before any).
    n_finite : Tensor [G]
        Number of finite log weights.
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
        log_w : Tensor [g, K]
            ``K`` log weights of each of ``g`` groups (any trailing shape is flattened).
        groups : LongTensor [g], optional
            Which groups the rows are (default: all, in order).
        """
        # the accumulator stays where it was made (the CPU, small, checkpointed); the weights
        # may come from a CUDA run
        log_w = log_w.to(device=self.count.device, dtype=torch.float64).reshape(log_w.shape[0], -1)
        if groups is None:
            groups = torch.arange(log_w.shape[0], device=log_w.device)
        groups = groups.to(self.count.device)
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
