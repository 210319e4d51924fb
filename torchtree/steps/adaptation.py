"""Per-chain warm-up adaptation: dual averaging, diagonal mass matrix, Stan windows.

* Step size: Nesterov dual averaging (Hoffman & Gelman 2014, Alg. 5) run for every
  chain separately (state tensors of shape [B]) toward ``target_accept``.
* Inverse mass matrix: the per-chain variance of the positions collected in each
  slow window (Welford), shrunk toward ``1e-3`` as Stan does.
* Windows: Stan's schedule, an initial fast buffer, slow windows doubling in length
  (the last one stretched to the terminal buffer), a terminal fast buffer; at the end
  of each slow window the mass matrix is updated, the step size re-initialised by
  the doubling/halving heuristic and dual averaging restarted.
* Sharpness annealing: a geometric schedule from ``h_init`` to ``h_final`` that
  ends where the terminal buffer starts, so the final step size is tuned at
  ``h_final`` (paper 004, Table 5).
"""
from __future__ import annotations

import math
from typing import List, NamedTuple, Optional, Tuple

import torch

from torchtree.steps.hmc import HMCState, PotentialAndGrad, kinetic_energy, leapfrog, sample_momentum

_LOG_TARGET = math.log(0.8)

__all__ = [
    "DualAveragingState",
    "dual_averaging_init",
    "dual_averaging_update",
    "WelfordState",
    "welford_init",
    "welford_update",
    "welford_variance",
    "warmup_windows",
    "sharpness_schedule",
    "find_reasonable_step_size",
]


class DualAveragingState(NamedTuple):
    """Dual-averaging state of every chain (Hoffman & Gelman 2014, Alg. 5); every field is ``Tensor [B]``.

    Made by :func:`dual_averaging_init`, advanced by :func:`dual_averaging_update`.

    Attributes
    ----------
    log_step : Tensor [B]
        Current log step size ``log eps_t``, the one to use while adapting.
    log_step_avg : Tensor [B]
        Iterate average ``log eps_bar_t``, the step size to keep once adaptation ends.
    h_bar : Tensor [B]
        Running average of ``target - accept_prob``.
    mu : Tensor [B]
        Shrinkage point ``log(10 * eps_0)``.
    count : Tensor [B]
        Iterations since the last (re)start, as a float.
    """

    log_step: torch.Tensor
    log_step_avg: torch.Tensor
    h_bar: torch.Tensor
    mu: torch.Tensor
    count: torch.Tensor


def dual_averaging_init(step_size: torch.Tensor) -> DualAveragingState:
    """Start (or restart) dual averaging at the step sizes ``eps_0``.

    Parameters
    ----------
    step_size : Tensor [B]
        Positive initial step size of every chain, e.g. from :func:`find_reasonable_step_size`.

    Returns
    -------
    DualAveragingState
        ``log_step = log eps_0``, ``mu = log(10 eps_0)``, the other fields zero.
    """
    log_eps = torch.log(step_size)
    z = torch.zeros_like(log_eps)
    return DualAveragingState(log_eps, z.clone(), z.clone(), math.log(10.0) + log_eps, z.clone())


def dual_averaging_update(
    state: DualAveragingState,
    accept_prob: torch.Tensor,
    target: float = 0.8,
    gamma: float = 0.05,
    t0: float = 10.0,
    kappa: float = 0.75,
) -> DualAveragingState:
    """One dual-averaging update of every chain's step size (Hoffman & Gelman 2014, Alg. 5).

    With ``t = count + 1`` and ``a`` the acceptance statistic:

        h_bar_t      = (1 - 1/(t + t0)) h_bar_{t-1} + (target - a) / (t + t0)
        log eps_t    = mu - sqrt(t) / gamma * h_bar_t
        log eps_bar_t = t^-kappa log eps_t + (1 - t^-kappa) log eps_bar_{t-1}

    Parameters
    ----------
    state : DualAveragingState
    accept_prob : Tensor [B]
        This iteration's acceptance statistic of every chain (``HMCInfo.accept_prob`` or
        ``NUTSInfo.accept_prob``); NaN counts as 0 and values are clipped to [0, 1].
    target : float, default 0.8
        Acceptance rate aimed at (``target_accept``).
    gamma : float, default 0.05
        Adaptation regularisation scale.
    t0 : float, default 10.0
        Offset that damps the first iterations.
    kappa : float, default 0.75
        Decay exponent of the iterate average.

    Returns
    -------
    DualAveragingState
        The next state (a new tuple; ``state`` is not modified).
    """
    a = torch.nan_to_num(accept_prob, nan=0.0).clamp(0.0, 1.0)
    t = state.count + 1
    eta = 1.0 / (t + t0)
    h_bar = (1 - eta) * state.h_bar + eta * (target - a)
    log_step = state.mu - torch.sqrt(t) / gamma * h_bar
    w = t.pow(-kappa)
    log_avg = w * log_step + (1 - w) * state.log_step_avg
    return DualAveragingState(log_step, log_avg, h_bar, state.mu, t)


class WelfordState(NamedTuple):
    """Running mean and sum of squared deviations of positions, per chain and coordinate (Welford).

    Made by :func:`welford_init`, advanced by :func:`welford_update`, read by :func:`welford_variance`.

    Attributes
    ----------
    count : int
        Draws added so far (the same for every chain).
    mean : Tensor [B, P]
        Running mean of the draws.
    m2 : Tensor [B, P]
        Running sum of squared deviations from the mean.
    """

    count: int
    mean: torch.Tensor
    m2: torch.Tensor


def welford_init(like: torch.Tensor) -> WelfordState:
    """An empty Welford accumulator.

    Parameters
    ----------
    like : Tensor [B, P]
        Gives the shape, dtype and device (its values are not used).

    Returns
    -------
    WelfordState
        ``count = 0`` and zero ``mean`` and ``m2``.
    """
    return WelfordState(0, torch.zeros_like(like), torch.zeros_like(like))


def welford_update(state: WelfordState, x: torch.Tensor) -> WelfordState:
    """Add one draw of every chain (Welford's numerically stable update).

    Parameters
    ----------
    state : WelfordState
    x : Tensor [B, P]
        One position per chain.

    Returns
    -------
    WelfordState
        The next state (a new tuple; ``state`` is not modified).
    """
    n = state.count + 1
    delta = x - state.mean
    mean = state.mean + delta / n
    m2 = state.m2 + delta * (x - mean)
    return WelfordState(n, mean, m2)


def welford_variance(state: WelfordState, regularize: bool = True) -> torch.Tensor:
    """Per-chain sample variance of the draws added so far: the diagonal inverse mass matrix.

    Parameters
    ----------
    state : WelfordState
    regularize : bool, default True
        Shrink toward ``1e-3`` as Stan does: ``n/(n+5) var + 1e-3 * 5/(n+5)``.

    Returns
    -------
    Tensor [B, P]
        ``m2 / (n - 1)`` (``m2`` itself for ``n <= 1``), shrunk when ``regularize``.
    """
    n = state.count
    var = state.m2 / max(n - 1, 1)
    if regularize:
        var = (n / (n + 5.0)) * var + 1e-3 * (5.0 / (n + 5.0))
    return var


def warmup_windows(
    n_warmup: int, init_buffer: int = 75, term_buffer: int = 50, base_window: int = 25
) -> List[Tuple[int, int]]:
    """Stan's slow adaptation windows as ``[(start, end), ...]`` (end exclusive).

    An initial fast buffer of ``init_buffer`` iterations, then slow windows starting at
    ``base_window`` iterations and doubling (the last one stretched to the terminal
    buffer), then a terminal fast buffer of ``term_buffer`` iterations. If the three do not
    fit, they are rescaled to 15% / 75% / 10% of ``n_warmup``; under 20 warm-up iterations
    there is no slow window (step size only).

    Parameters
    ----------
    n_warmup : int
        Warm-up iterations.
    init_buffer : int, default 75
        Initial fast buffer (step size only), Stan's default.
    term_buffer : int, default 50
        Terminal fast buffer (step size only, at the final mass matrix), Stan's default.
    base_window : int, default 25
        Length of the first slow window, Stan's default.

    Returns
    -------
    list of (int, int)
        Consecutive, non-overlapping iteration ranges; the mass matrix is re-estimated at
        the end of each.
    """
    if n_warmup < 20:
        return []
    if init_buffer + base_window + term_buffer > n_warmup:
        init_buffer = int(0.15 * n_warmup)
        term_buffer = int(0.1 * n_warmup)
        base_window = n_warmup - init_buffer - term_buffer
    windows = []
    start, size = init_buffer, base_window
    end_slow = n_warmup - term_buffer
    while start < end_slow:
        end = start + size
        # stretch the last window if the next one would not fit
        if end + 2 * size > end_slow:
            end = end_slow
        windows.append((start, end))
        start, size = end, 2 * size
    return windows


def sharpness_schedule(n_warmup: int, h_init: float, h_final: float, end: Optional[int] = None) -> List[float]:
    """Per-iteration split sharpness for warm-up: geometric ``h_init -> h_final``.

    Iteration ``i`` gets ``h_i = exp((1 - f) log h_init + f log h_final)`` with
    ``f = min(i / (end - 1), 1)`` (paper 004, Table 5).

    Parameters
    ----------
    n_warmup : int
        Warm-up iterations.
    h_init, h_final : float
        Positive sharpness at the first iteration and from ``end`` on.
    end : int, optional
        Iteration from which ``h = h_final``; default: the start of the terminal
        buffer of :func:`warmup_windows` (or ``n_warmup`` without windows).

    Returns
    -------
    list of float, length ``n_warmup``
    """
    if end is None:
        w = warmup_windows(n_warmup)
        end = w[-1][1] if w else n_warmup
    end = max(int(end), 1)
    out = []
    for i in range(n_warmup):
        f = min(i / max(end - 1, 1), 1.0)
        out.append(math.exp((1 - f) * math.log(h_init) + f * math.log(h_final)))
    return out


def find_reasonable_step_size(
    state: HMCState,
    potential_and_grad: PotentialAndGrad,
    inv_mass: torch.Tensor,
    step_size: torch.Tensor,
    generator: Optional[torch.Generator] = None,
    max_iter: int = 30,
) -> torch.Tensor:
    """Per-chain initial step size (Hoffman & Gelman 2014, Alg. 4), batched.

    Each chain doubles (or halves) its step size until the acceptance probability of
    one leapfrog step crosses 0.8 (Stan's choice); chains that have crossed are frozen by a mask.
    All chains share one momentum draw per call and take one batched leapfrog step per trial.

    Parameters
    ----------
    state : HMCState
        Current positions with their potential and gradient.
    potential_and_grad : callable
        ``Tensor [B, P] -> (U [B], dU/dtheta [B, P])``.
    inv_mass : Tensor [B, P]
        Diagonal inverse mass matrix (0 freezes a coordinate).
    step_size : Tensor [B]
        Starting step sizes.
    generator : torch.Generator, optional
        Source of the momentum draw.
    max_iter : int, default 30
        At most this many doublings or halvings.

    Returns
    -------
    Tensor [B]
        The step size of every chain, clipped to ``[1e-8, 1e3]``.
    """
    B = state.position.shape[0]
    eps = step_size.clone()
    p = sample_momentum(inv_mass, generator)
    H0 = state.potential + kinetic_energy(p, inv_mass)
    new, p1 = leapfrog(state, p, eps, inv_mass, potential_and_grad)
    dH = H0 - (new.potential + kinetic_energy(p1, inv_mass))
    dH = torch.nan_to_num(dH, nan=-float("inf"))
    direction = torch.where(dH > _LOG_TARGET, 1.0, -1.0).to(eps.dtype)
    done = torch.zeros(B, dtype=torch.bool, device=eps.device)
    for _ in range(max_iter):
        trial = eps * torch.pow(torch.tensor(2.0, dtype=eps.dtype, device=eps.device), direction)
        new, p1 = leapfrog(state, p, trial, inv_mass, potential_and_grad)
        dH = H0 - (new.potential + kinetic_energy(p1, inv_mass))
        dH = torch.nan_to_num(dH, nan=-float("inf"))
        crossed = torch.where(direction > 0, dH < _LOG_TARGET, dH > _LOG_TARGET)
        eps = torch.where(done, eps, trial)  # like Stan, keep the step that crossed
        done |= crossed
        if bool(done.all()):
            break
    return eps.clamp(1e-8, 1e3)
