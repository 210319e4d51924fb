"""DCC-Tree utility for choosing the topology to refine next (paper 004, eq. 10, App. B.2-B.3).

    U_m = 1/S_m * ( (1 - delta) tau_m / max tau + delta rho_m / max rho
                    + beta log(sum S) / sqrt(S_m) )

* exploitation ``tau_m = sqrt(Z_m^2 + (1 + kappa) Var(w_m))`` (Rainforth et al. 2018),
  computed from ``log Z`` and ``log Var(w)`` only: ``log tau`` is a log-sum-exp, and
  the ratio to the maximum is ``exp(log tau_m - max log tau)``, which is the
  numerically stable form of eq. 66-70;
* exploration ``rho_m = 1 - Psi_m(log w_th)^T_a``: the chance that one of ``T_a``
  further weights beats the best weight seen so far, with ``Psi_m`` the normal CDF
  fitted to topology ``m``'s ``log w`` (eq. 71), computed as ``-expm1(T_a log Psi)``;
* optimism boost ``beta log(sum_m S_m) / sqrt(S_m)``.
"""
from __future__ import annotations

import math

import torch

__all__ = ["exploitation_term", "exploration_term", "dcc_utility"]


def exploitation_term(log_z: torch.Tensor, log_var_w: torch.Tensor, kappa: float = 0.0) -> torch.Tensor:
    """Exploitation term of the DCC utility: ``tau_m / max_m tau_m`` in [0, 1].

    ``tau_m = sqrt(Z_m^2 + (1 + kappa) Var(w_m))`` (Rainforth et al. 2018, "Inference trees:
    adaptive inference with exploration"; paper 004, App. B.2), computed in log space.

    Parameters
    ----------
    log_z : Tensor [M]
        Log evidence estimate of each topology (float64).
    log_var_w : Tensor [M]
        Log variance of its importance weights.
    kappa : float, default 0.0
        Weight of the variance.

    Returns
    -------
    Tensor [M]
        ``exp(log tau_m - max log tau)``; all ones when no ``tau`` is finite.
    """
    log_tau = 0.5 * torch.logaddexp(2 * log_z, math.log1p(kappa) + log_var_w)
    log_tau = torch.nan_to_num(log_tau, nan=-float("inf"))
    top = log_tau.max()
    if not torch.isfinite(top):
        return torch.ones_like(log_tau)
    return torch.exp(log_tau - top)


def exploration_term(
    logw_mean: torch.Tensor, logw_std: torch.Tensor, log_w_threshold: float, look_ahead: float = 1000.0
) -> torch.Tensor:
    """Exploration term of the DCC utility: ``rho_m = 1 - Phi((log w_th - mean_m) / std_m)^T_a``.

    The chance that one of ``T_a`` further weights of topology ``m`` beats the best weight
    seen so far, with ``log w`` of each topology fitted by a normal (paper 004, eq. 71);
    computed as ``-expm1(T_a log Phi)`` so that small values keep their digits.

    Parameters
    ----------
    logw_mean, logw_std : Tensor [M]
        Normal fit to each topology's log weights (``std`` floored at ``1e-12``).
    log_w_threshold : float
        The largest log weight seen over all active topologies.
    look_ahead : float, default 1000.0
        ``T_a`` (1000 as in Rainforth et al. 2018).

    Returns
    -------
    Tensor [M]
        ``rho_m`` in [0, 1].
    """
    z = (log_w_threshold - logw_mean) / logw_std.clamp_min(1e-12)
    log_cdf = torch.special.log_ndtr(z)
    return -torch.expm1(look_ahead * log_cdf)


def dcc_utility(
    log_z: torch.Tensor,
    log_var_w: torch.Tensor,
    logw_mean: torch.Tensor,
    logw_std: torch.Tensor,
    max_logw: float,
    n_selected: torch.Tensor,
    delta: float = 0.5,
    beta: float = 1.0,
    kappa: float = 0.0,
    look_ahead: float = 1000.0,
) -> torch.Tensor:
    """Utility ``U_m`` of every active topology (paper 004, eq. 10): DCC refines the largest.

        U_m = 1/S_m * ( (1 - delta) tau_m / max tau + delta rho_m / max rho
                        + beta log(sum S) / sqrt(S_m) )

    with ``tau`` from :func:`exploitation_term`, ``rho`` from :func:`exploration_term`
    (``rho / max rho`` taken as 0 when every ``rho`` is 0).

    Parameters
    ----------
    log_z : Tensor [M]
        LAIS log evidence of each topology (:attr:`EvidenceAccumulator.log_evidence`).
    log_var_w : Tensor [M]
        Log variance of its weights (:attr:`EvidenceAccumulator.log_var_w`).
    logw_mean, logw_std : Tensor [M]
        Mean and standard deviation of its finite log weights.
    max_logw : float
        Largest log weight over all active topologies.
    n_selected : Tensor [M]
        ``S_m``, times local inference ran on each topology (values below 1 count as 1).
    delta : float in [0, 1], default 0.5
        Exploitation / exploration trade-off.
    beta : float > 0, default 1.0
        Weight of the optimism boost.
    kappa : float, default 0.0
        Variance weight in the exploitation term.
    look_ahead : float, default 1000.0
        ``T_a`` of the exploration term.

    Returns
    -------
    Tensor [M]
        ``U_m`` in float64.
    """
    S = n_selected.to(torch.float64).clamp_min(1.0)
    tau = exploitation_term(log_z, log_var_w, kappa)
    rho = exploration_term(logw_mean, logw_std, max_logw, look_ahead)
    rho_max = rho.max()
    rho_ratio = rho / rho_max if rho_max > 0 else torch.zeros_like(rho)
    boost = beta * math.log(max(float(S.sum()), 1.0)) / S.sqrt()
    return ((1 - delta) * tau + delta * rho_ratio + boost) / S
