"""Batched Hamiltonian Monte Carlo: leapfrog, momenta, one HMC step for many chains.

Every chain has its own position, step size and diagonal inverse mass matrix; all
chains advance in lockstep (one batched potential-and-gradient call per leapfrog),
never through a Python loop over chains. Functions are pure-ish in the BlackJAX
style: ``init`` builds an :class:`HMCState`, ``step`` maps ``(state, ...) -> (state,
info)`` and consumes randomness only from the ``generator`` it is given.

A coordinate whose inverse mass is zero gets zero momentum and never moves; the
soft-tree samplers use this to keep the padded (inactive) parameters of small
topologies fixed inside a batch padded to a deeper tree.

Shapes: ``B`` chains, ``P`` parameters. ``potential_and_grad`` maps ``[B, P]`` to
``(U [B], dU/dtheta [B, P])``.
"""
from __future__ import annotations

from typing import Callable, NamedTuple, Optional, Tuple

import torch

__all__ = [
    "HMCState",
    "HMCInfo",
    "PotentialAndGrad",
    "hmc_init",
    "hmc_step",
    "sample_momentum",
    "kinetic_energy",
    "leapfrog",
]

#: ``potential_and_grad(theta) -> (U, dU/dtheta)``; NUTS with row compaction (``compact > 0``) also calls it as
#: ``potential_and_grad(theta_rows, rows)`` (``rows``: LongTensor [R] of batch rows, as
#: :meth:`~torchtree.model.soft_trees.SoftTrees.potential_and_grad` takes), hence the open argument list
PotentialAndGrad = Callable[..., Tuple[torch.Tensor, torch.Tensor]]


class HMCState(NamedTuple):
    """Position of every chain with its cached potential and gradient.

    The state HMC and NUTS transitions take and return (:func:`hmc_init`,
    :func:`hmc_step`, :func:`~torchtree.steps.nuts.nuts_step`). The cache must match the
    target: after changing it (e.g. the split sharpness) rebuild the state with :func:`hmc_init`.

    Attributes
    ----------
    position : Tensor [B, P]
        Unconstrained parameters ``theta`` of the ``B`` chains.
    potential : Tensor [B]
        ``U(theta) = -log p~(theta)``; NaN is stored as ``+inf``.
    grad : Tensor [B, P]
        ``dU/dtheta``.
    """

    position: torch.Tensor
    potential: torch.Tensor
    grad: torch.Tensor


class HMCInfo(NamedTuple):
    """Diagnostics of one HMC transition (:func:`hmc_step`), per chain.

    Attributes
    ----------
    accept_prob : Tensor [B]
        Metropolis acceptance probability ``min(1, exp(H0 - H1))`` (0 for a divergent path).
    is_accepted : BoolTensor [B]
        Whether the end point of the trajectory was accepted.
    is_divergent : BoolTensor [B]
        The energy error ``H - H0`` exceeded ``max_energy_error`` (or ``H`` was not finite)
        somewhere on the path.
    energy : Tensor [B]
        Hamiltonian ``H = U + K`` of the returned state.
    n_steps : LongTensor [B]
        Leapfrog steps taken (``n_leapfrog`` for every chain).
    tree_depth : LongTensor [B]
        Zeros, kept so that HMC and NUTS share the chain loops.
    """

    accept_prob: torch.Tensor
    is_accepted: torch.Tensor
    is_divergent: torch.Tensor
    energy: torch.Tensor
    n_steps: torch.Tensor
    tree_depth: torch.Tensor


def _finite_or_inf(U: torch.Tensor) -> torch.Tensor:
    # NaN potentials (e.g. overflow far in a tail) are treated as +inf: the point is
    # rejected / counted divergent rather than poisoning the batch.
    return torch.where(torch.isnan(U), torch.full_like(U, float("inf")), U)


def hmc_init(position: torch.Tensor, potential_and_grad: PotentialAndGrad) -> HMCState:
    """The starting state of a batch of chains: evaluate potential and gradient at ``position``.

    Parameters
    ----------
    position : Tensor [B, P]
        Unconstrained parameters of the ``B`` chains.
    potential_and_grad : callable
        ``Tensor [B, P] -> (U [B], dU/dtheta [B, P])``, e.g. :meth:`SoftTrees.potential_and_grad`.

    Returns
    -------
    HMCState
        ``position`` (not copied) with its potential (NaN stored as ``+inf``) and gradient.
    """
    U, g = potential_and_grad(position)
    return HMCState(position, _finite_or_inf(U), g)


def sample_momentum(inv_mass: torch.Tensor, generator: Optional[torch.Generator] = None) -> torch.Tensor:
    """Momenta ``p ~ N(0, M)`` with ``M = diag(1 / inv_mass)``; zero where ``inv_mass == 0``.

    Parameters
    ----------
    inv_mass : Tensor [B, P]
        Diagonal inverse mass matrix of every chain, non-negative.
    generator : torch.Generator, optional
        Source of the normal draws (default: torch's global generator).

    Returns
    -------
    Tensor [B, P]
        ``z / sqrt(inv_mass)`` with ``z ~ N(0, I)``, in the dtype and on the device of ``inv_mass``.
    """
    z = torch.randn(inv_mass.shape, generator=generator, dtype=inv_mass.dtype, device=inv_mass.device)
    safe = torch.where(inv_mass > 0, inv_mass, torch.ones_like(inv_mass))
    return torch.where(inv_mass > 0, z * torch.rsqrt(safe), torch.zeros_like(z))


def kinetic_energy(momentum: torch.Tensor, inv_mass: torch.Tensor) -> torch.Tensor:
    """Kinetic energy ``K(p) = p^T M^{-1} p / 2`` of every chain, for a diagonal ``M^{-1}``.

    Parameters
    ----------
    momentum : Tensor [B, P]
    inv_mass : Tensor [B, P]
        Diagonal of ``M^{-1}``.

    Returns
    -------
    Tensor [B]
        ``0.5 * sum_j inv_mass_j p_j^2``.
    """
    return 0.5 * (momentum * momentum * inv_mass).sum(-1)


def leapfrog(
    state: HMCState,
    momentum: torch.Tensor,
    step_size: torch.Tensor,
    inv_mass: torch.Tensor,
    potential_and_grad: PotentialAndGrad,
) -> Tuple[HMCState, torch.Tensor]:
    """One velocity-Verlet (leapfrog) step for every chain.

    With ``eps`` the chain's step size:

        p_half = p - eps/2 * grad U(q)
        q'     = q + eps * M^{-1} p_half
        p'     = p_half - eps/2 * grad U(q')

    One batched call of ``potential_and_grad`` per step (the gradient at ``q`` is the
    cached ``state.grad``).

    Parameters
    ----------
    state : HMCState
        Start point ``q`` with its cached potential and gradient.
    momentum : Tensor [B, P]
        Momentum ``p`` at ``q``.
    step_size : Tensor [B]
        May be negative: integrate backwards in time.
    inv_mass : Tensor [B, P]
        Diagonal inverse mass matrix.
    potential_and_grad : callable
        ``Tensor [B, P] -> (U [B], dU/dtheta [B, P])``.

    Returns
    -------
    state : HMCState
        The new point ``q'`` (a NaN potential becomes ``+inf``).
    momentum : Tensor [B, P]
        The new momentum ``p'``.
    """
    eps = step_size.unsqueeze(-1)
    p_half = momentum - 0.5 * eps * state.grad
    q = state.position + eps * inv_mass * p_half
    U, g = potential_and_grad(q)
    # A non-finite potential becomes +inf (divergent, never accepted); a non-finite
    # gradient then only affects that rejected point, so it is left as is.
    U = torch.nan_to_num(U, nan=float("inf"))
    p = p_half - 0.5 * eps * g
    return HMCState(q, U, g), p


def hmc_step(
    state: HMCState,
    potential_and_grad: PotentialAndGrad,
    step_size: torch.Tensor,
    inv_mass: torch.Tensor,
    n_leapfrog: int = 10,
    generator: Optional[torch.Generator] = None,
    max_energy_error: float = 1000.0,
    jitter: bool = False,
) -> Tuple[HMCState, HMCInfo]:
    """One Metropolis-adjusted HMC transition for all chains at once (Neal 2011, "MCMC using Hamiltonian
    dynamics", Handbook of Markov Chain Monte Carlo).

    Draws ``p0 ~ N(0, M)``, takes ``n_leapfrog`` leapfrog steps and accepts the end point
    with probability ``min(1, exp(H0 - H1))``, ``H = U + K``. A divergent path is rejected.

    Parameters
    ----------
    state : HMCState
    potential_and_grad : callable
        ``Tensor [B, P] -> (U [B], dU/dtheta [B, P])``.
    step_size : Tensor [B]
    inv_mass : Tensor [B, P]
        Diagonal inverse mass matrix; 0 freezes a coordinate.
    n_leapfrog : int, default 10
        Leapfrog steps (the same for every chain, so the batch stays in lockstep).
    generator : torch.Generator, optional
        Source of the momenta, the jitter and the acceptance uniforms.
    max_energy_error : float, default 1000.0
        A chain whose energy error ``H - H0`` exceeds this anywhere on the path is divergent.
    jitter : bool, default False
        Multiply each chain's step size by U(0.8, 1.2) (breaks periodicities).

    Returns
    -------
    state : HMCState
        The accepted point of each chain (the old one where rejected).
    info : HMCInfo
    """
    B = state.position.shape[0]
    dev, dt = state.position.device, state.position.dtype
    eps = step_size
    if jitter:
        eps = eps * (0.8 + 0.4 * torch.rand(B, generator=generator, dtype=dt, device=dev))
    p0 = sample_momentum(inv_mass, generator)
    H0 = state.potential + kinetic_energy(p0, inv_mass)
    cur, p = state, p0
    diverged = torch.zeros(B, dtype=torch.bool, device=dev)
    for _ in range(int(n_leapfrog)):
        cur, p = leapfrog(cur, p, eps, inv_mass, potential_and_grad)
        H = cur.potential + kinetic_energy(p, inv_mass)
        diverged |= ~torch.isfinite(H) | (H - H0 > max_energy_error)
    H1 = cur.potential + kinetic_energy(p, inv_mass)
    log_accept = torch.where(diverged | ~torch.isfinite(H1), torch.full_like(H0, -float("inf")), H0 - H1)
    accept_prob = torch.exp(log_accept.clamp(max=0.0))
    u = torch.rand(B, generator=generator, dtype=dt, device=dev)
    accepted = u < accept_prob
    a2 = accepted.unsqueeze(-1)
    new = HMCState(
        torch.where(a2, cur.position, state.position),
        torch.where(accepted, cur.potential, state.potential),
        torch.where(a2, cur.grad, state.grad),
    )
    energy = torch.where(accepted, H1, H0)
    n = torch.full((B,), int(n_leapfrog), dtype=torch.long, device=dev)
    info = HMCInfo(accept_prob, accepted, diverged, energy, n, torch.zeros_like(n))
    return new, info
