"""Batched, iterative multinomial NUTS (Hoffman & Gelman 2014; Betancourt 2017).

All chains double their trajectories in lockstep. At doubling ``j`` every chain picks
a direction and extends its trajectory by a new subtree of ``2**j`` leapfrog steps;
the steps of that subtree are taken *iteratively* (no recursion), one batched
potential-and-gradient call per step for the whole batch. A chain whose subtree has
terminated (U-turn inside it, divergence) or whose trajectory has stopped is frozen
by a mask; the loop ends when every chain is frozen or ``max_tree_depth`` is reached.

Within a subtree the proposal is drawn by progressive multinomial sampling (each
new point replaces the subtree's candidate with probability ``w_new / W_subtree``,
i.e. the candidate is drawn with probability proportional to ``exp(-H)``); the
subtree's candidate replaces the trajectory's with the *biased* probability
``min(1, W_subtree / W_trajectory)`` (Betancourt 2017, App. A.3.2).

Termination uses the generalised no-U-turn criterion (Betancourt 2017): a span of
points with momentum sum ``rho`` and end points ``a``, ``b`` turns when
``rho . M^{-1} p_a <= 0`` or ``rho . M^{-1} p_b <= 0``. It is checked on every
sub-subtree of the binary tree (blocks of ``2**k`` consecutive steps, tracked with
O(depth) running sums rather than stored trajectories), on the merged trajectory,
and, as Stan does since 2.26, on the two "straddling" spans made of one half plus
the first point of the other half.
"""
from __future__ import annotations

from typing import Any, Callable, NamedTuple, Optional, Tuple

import torch

from torchtree.steps.hmc import HMCState, PotentialAndGrad, kinetic_energy, leapfrog, sample_momentum
from torchtree.core.warn import warn

__all__ = ["NUTSInfo", "nuts_init", "nuts_step"]


class NUTSInfo(NamedTuple):
    """Diagnostics of one NUTS transition (:func:`nuts_step`), per chain.

    Attributes
    ----------
    accept_prob : Tensor [B]
        Mean Metropolis probability ``min(1, exp(H0 - H))`` over all leapfrog points
        built (the statistic dual averaging adapts to).
    is_divergent : BoolTensor [B]
        The energy error ``H - H0`` exceeded ``max_energy_error`` on the trajectory.
    tree_depth : LongTensor [B]
        Number of doublings performed.
    n_steps : LongTensor [B]
        Leapfrog steps taken.
    energy : Tensor [B]
        Hamiltonian at the start of the transition.
    is_turning : BoolTensor [B]
        Stopped by a U-turn (rather than by the depth limit or a divergence).
    """

    accept_prob: torch.Tensor
    is_divergent: torch.Tensor
    tree_depth: torch.Tensor
    n_steps: torch.Tensor
    energy: torch.Tensor
    is_turning: torch.Tensor


def nuts_init(position: torch.Tensor, potential_and_grad: PotentialAndGrad) -> HMCState:
    """The starting state of NUTS chains: the same :class:`HMCState` as :func:`hmc_init` builds.

    Parameters
    ----------
    position : Tensor [B, P]
        Unconstrained parameters of the ``B`` chains.
    potential_and_grad : callable
        ``Tensor [B, P] -> (U [B], dU/dtheta [B, P])``.

    Returns
    -------
    HMCState
        ``position`` with its potential (NaN stored as ``+inf``) and gradient.
    """
    from torchtree.steps.hmc import hmc_init

    return hmc_init(position, potential_and_grad)


def _turning(rho: torch.Tensor, psharp_a: torch.Tensor, psharp_b: torch.Tensor) -> torch.Tensor:
    """Generalised no-U-turn criterion, [B] bool (True = the span turns)."""
    return ((rho * psharp_a).sum(-1) <= 0) | ((rho * psharp_b).sum(-1) <= 0)


def _w(mask: torch.Tensor, a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    """Row-wise select: ``a`` where ``mask [B]`` else ``b`` (any trailing shape)."""
    m = mask.reshape(mask.shape + (1,) * (a.dim() - 1))
    return torch.where(m, a, b)


def _sel_state(mask, a: HMCState, b: HMCState) -> HMCState:
    return HMCState(_w(mask, a.position, b.position), _w(mask, a.potential, b.potential), _w(mask, a.grad, b.grad))


FusedParts = Tuple[Callable, tuple, Any]
"""``(core, tensors, consts)`` with ``core(theta, *tensors, consts) -> (U [B], grad [B, P])``
equal to the potential and gradient (see :meth:`SoftTrees.fused_parts`)."""


def _leapfrog_and_weigh(pos, pot, grad, p, eps, inv_mass, H0, live, u, log_w, prop_pos, prop_pot, prop_grad,
                        sum_accept, n_steps, idx, core, tensors, consts, max_energy_error: float):
    """One leapfrog step of every chain and the per-step bookkeeping of
    :func:`_build_subtree` (energy error, acceptance sums, divergence, progressive
    multinomial choice of the subtree's candidate), as a pure function of tensors so
    that ``torch.compile`` can fuse it into one call.

    ``core(theta, *tensors, consts) -> (U, grad)`` is the potential. ``idx``
    (LongTensor [R], repeats allowed) integrates only these batch rows, the others keep
    their point (``core`` then sees those rows only); None = all rows. ``u [B]`` are the
    uniforms of the multinomial choice. The compiled caller always passes ``idx`` with
    R >= 2, so the whole batch and every subset share one graph.
    """
    def potential(theta):
        return core(theta, *tensors, consts)

    if idx is None:
        cur, p = leapfrog(HMCState(pos, pot, grad), p, eps, inv_mass, potential)
        q, cur_pot, g = cur
    else:
        sub, p_sub = leapfrog(HMCState(pos[idx], pot[idx], grad[idx]), p[idx], eps[idx], inv_mass[idx], potential)
        p = p.index_copy(0, idx, p_sub)
        q = pos.index_copy(0, idx, sub.position)
        g = grad.index_copy(0, idx, sub.grad)
        cur_pot = pot.index_copy(0, idx, sub.potential)
    ps = inv_mass * p
    dH = H0 - (cur_pot + 0.5 * (p * ps).sum(-1))
    dH = torch.nan_to_num(dH, nan=-float("inf"))
    n_steps = n_steps + live.long()
    sum_accept = sum_accept + torch.where(live, torch.exp(dH.clamp(max=0.0)), torch.zeros_like(dH))
    div = live & (dH < -max_energy_error)
    new_log_w = torch.logaddexp(log_w, dH)
    take = u < torch.exp(dH - new_log_w)
    t2 = take.unsqueeze(-1)
    prop_pos = torch.where(t2, q, prop_pos)
    prop_pot = torch.where(take, cur_pot, prop_pot)
    prop_grad = torch.where(t2, g, prop_grad)
    return q, cur_pot, g, p, ps, dH, n_steps, sum_accept, div, new_log_w, prop_pos, prop_pot, prop_grad


def _rows_potential(potential_and_grad: PotentialAndGrad, rows: Optional[torch.Tensor]) -> Callable:
    """``potential_and_grad`` in the ``core(theta, consts)`` form of
    :func:`_leapfrog_and_weigh`, restricted to batch ``rows`` (None = all)."""
    if rows is None:
        return lambda theta, consts: potential_and_grad(theta)
    return lambda theta, consts: potential_and_grad(theta, rows)


_FUSED: dict = {"fn": None, "failed": False}


def _no_duck_shapes():
    """Context in which the compiler keeps the batch size and the number of integrated
    rows as separate symbols even when they are equal (duck shaping would make the
    full-batch call a graph of its own)."""
    return torch.fx.experimental._config.patch(use_duck_shape=False)


def _fused_step_fn():
    """``torch.compile(_leapfrog_and_weigh, dynamic=True)``, built once per process
    (None if compilation is unavailable)."""
    if _FUSED["failed"]:
        return None
    if _FUSED["fn"] is None:
        try:
            _FUSED["fn"] = torch.compile(_leapfrog_and_weigh, dynamic=True)
        except Exception:  # pragma: no cover - no compiler toolchain
            _FUSED["failed"] = True
            return None
    return _FUSED["fn"]


class _Subtree(NamedTuple):
    valid: torch.Tensor  # [B] no inner U-turn, no divergence
    diverged: torch.Tensor  # [B]
    last: HMCState  # time-last point
    p_last: torch.Tensor
    p_first: torch.Tensor  # time-first point's momentum
    rho: torch.Tensor  # momentum sum
    log_w: torch.Tensor  # log sum of weights
    proposal: HMCState
    sum_accept: torch.Tensor
    n_steps: torch.Tensor


def _build_subtree(
    start: HMCState,
    p_start: torch.Tensor,
    depth: int,
    eps: torch.Tensor,
    inv_mass: torch.Tensor,
    H0: torch.Tensor,
    frozen: torch.Tensor,
    potential_and_grad: PotentialAndGrad,
    generator: Optional[torch.Generator],
    max_energy_error: float,
    compact: float = 0.0,
    fused: Optional[Callable[[Optional[torch.Tensor]], FusedParts]] = None,
) -> _Subtree:
    """Take ``2**depth`` leapfrog steps from ``start`` for every non-frozen chain.

    With ``compact > 0`` and fewer than ``compact * B`` chains still live, only the
    live chains are integrated (``potential_and_grad(theta, rows)`` must accept the
    batch rows of a subset), so late doublings of a few long trajectories do not
    pay for the whole batch. With ``fused`` (see :func:`nuts_step`) each step's
    leapfrog and bookkeeping run as one compiled call.
    """
    B, P = start.position.shape
    dev, dt = start.position.device, start.position.dtype
    n_total = 1 << depth
    # A chain whose subtree stopped (or that was frozen on entry) keeps integrating
    # with the batch, but nothing it computes is used: its subtree is invalid (or
    # ignored) and only masked accumulators (steps, acceptance) are per-chain stats.
    # That saves a masked select per state tensor and step.
    # Per-level block bookkeeping (level k = blocks of 2**k steps, k = 1..depth):
    # cumulative momentum before the block starts, the first point's p and p_sharp,
    # and the previous block's last point (for the straddling checks).
    K = depth + 1
    cum_before: list = [None] * K
    p_first_k: list = [None] * K
    ps_first_k: list = [None] * K
    p_end_k: list = [None] * K
    ps_end_k: list = [None] * K
    cum = torch.zeros(B, P, dtype=dt, device=dev)
    stopped = frozen.clone()
    valid = torch.ones(B, dtype=torch.bool, device=dev)
    diverged = torch.zeros(B, dtype=torch.bool, device=dev)
    log_w = torch.full((B,), -float("inf"), dtype=dt, device=dev)
    sum_accept = torch.zeros(B, dtype=dt, device=dev)
    n_steps = torch.zeros(B, dtype=torch.long, device=dev)
    cur, p = start, p_start
    proposal = start
    p_first = p_start
    step_fn = _fused_step_fn() if fused is not None else None
    if step_fn is not None:
        all_rows = torch.arange(B, device=dev)
        # inputs that alias each other would be compiled as a graph of their own
        proposal = HMCState(start.position.clone(), start.potential.clone(), start.grad.clone())
    for n in range(n_total):
        if n > 0 and bool(stopped.all()):
            break
        live = ~stopped
        n_live = int(live.sum()) if compact > 0 else B
        idx = live.nonzero().squeeze(1) if n_live < compact * B else None
        u = torch.rand(B, generator=generator, dtype=dt, device=dev)
        args = (cur.position, cur.potential, cur.grad, p, eps, inv_mass, H0, live, u, log_w, proposal.position,
                proposal.potential, proposal.grad, sum_accept, n_steps)
        out = None
        if step_fn is not None:
            rows = all_rows if idx is None else idx
            if rows.numel() == 1:  # a size-1 batch would be compiled as a graph of its own
                rows = rows.repeat(2)
            try:
                with _no_duck_shapes():
                    out = step_fn(*args, rows, *fused(rows), float(max_energy_error))
            except Exception as exc:  # pragma: no cover - compiler toolchain or backend missing
                _FUSED["failed"], step_fn = True, None
                warn(f"torch.compile of the NUTS step failed ({type(exc).__name__}: {exc}); "
                     "using the eager step", RuntimeWarning)
        if out is None:
            out = _leapfrog_and_weigh(*args, idx, _rows_potential(potential_and_grad, idx), (), None,
                                      float(max_energy_error))
        (pos, pot, grad, p, ps, dH, n_steps, sum_accept, div, log_w, prop_pos, prop_pot, prop_grad) = out
        cur, proposal = HMCState(pos, pot, grad), HMCState(prop_pos, prop_pot, prop_grad)
        if n == 0:
            p_first = p
        # Blocks starting at this step.
        for k in range(1, K):
            if n % (1 << k) == 0:
                cum_before[k], p_first_k[k], ps_first_k[k] = cum, p, ps
        cum = cum + p
        # Blocks ending at this step: check every completed sub-subtree.
        turn = torch.zeros(B, dtype=torch.bool, device=dev)
        for k in range(1, K):
            if (n + 1) % (1 << k) == 0:
                turn |= _turning(cum - cum_before[k], ps_first_k[k], ps)
                if k >= 2:
                    # halves: left = first 2**(k-1) steps, right = the current level-(k-1) block
                    rho_left = cum_before[k - 1] - cum_before[k]
                    rho_right = cum - cum_before[k - 1]
                    turn |= _turning(rho_left + p_first_k[k - 1], ps_first_k[k], ps_first_k[k - 1])
                    turn |= _turning(p_end_k[k - 1] + rho_right, ps_end_k[k - 1], ps)
        for k in range(1, K):
            if (n + 1) % (1 << k) == 0:
                p_end_k[k], ps_end_k[k] = p, ps
        bad = live & (div | turn)
        diverged |= div
        valid &= ~bad
        stopped |= bad
    return _Subtree(valid, diverged, cur, p, p_first, cum, log_w, proposal, sum_accept, n_steps)


def nuts_step(
    state: HMCState,
    potential_and_grad: PotentialAndGrad,
    step_size: torch.Tensor,
    inv_mass: torch.Tensor,
    generator: Optional[torch.Generator] = None,
    max_tree_depth: int = 10,
    max_energy_error: float = 1000.0,
    compact: float = 0.0,
    fused: Optional[Callable[[Optional[torch.Tensor]], FusedParts]] = None,
) -> Tuple[HMCState, NUTSInfo]:
    """One multinomial NUTS transition for all chains at once.

    The No-U-Turn sampler of Hoffman & Gelman (2014, "The No-U-Turn Sampler: adaptively
    setting path lengths in Hamiltonian Monte Carlo", JMLR 15) with multinomial sampling of
    the trajectory and the generalised U-turn criterion of Betancourt (2017, "A conceptual
    introduction to Hamiltonian Monte Carlo"), as Stan runs it. Every chain draws
    ``p0 ~ N(0, M)`` and doubles its trajectory in a random direction until it turns,
    diverges or reaches ``max_tree_depth``; the returned point is drawn from the trajectory
    with probability proportional to ``exp(-H)``, so the transition leaves ``exp(-U)``
    invariant. The docstring of the module ``torchtree.steps.nuts`` describes the batched,
    iterative tree building.

    Parameters
    ----------
    state : HMCState
    potential_and_grad : callable
        ``Tensor [B, P] -> (U [B], dU/dtheta [B, P])``.
    step_size : Tensor [B]
    inv_mass : Tensor [B, P]
        Diagonal inverse mass matrix; 0 freezes a coordinate.
    generator : torch.Generator, optional
        Source of the momenta, directions and multinomial choices.
    max_tree_depth : int, default 10
        At most ``2**max_tree_depth - 1`` leapfrog steps.
    max_energy_error : float, default 1000.0
        Divergence threshold on the energy error ``H - H0``.
    compact : float in [0, 1], default 0
        Integrate only the live chains once fewer than ``compact * B`` are live;
        requires ``potential_and_grad(theta, rows)`` (e.g. ``SoftTrees``). 0 = off.
    fused : callable, optional
        ``fused(rows) -> (core, tensors, consts)`` describing ``potential_and_grad``
        as a pure function (``rows``: LongTensor [R] or None; e.g.
        :meth:`SoftTrees.fused_parts`). Each leapfrog step and its bookkeeping then
        run as one ``torch.compile``-d call instead of ~100 small eager operations:
        same arithmetic and random numbers, so the same transition up to rounding.
        It is compiled once per process and tree depth.

    Returns
    -------
    state : HMCState
        The point drawn from each chain's trajectory (possibly its starting point).
    info : NUTSInfo
    """
    B, P = state.position.shape
    dev, dt = state.position.device, state.position.dtype
    p0 = sample_momentum(inv_mass, generator)
    H0 = state.potential + kinetic_energy(p0, inv_mass)
    minus, plus = state, state
    p_minus, p_plus = p0, p0
    sample = state
    log_w = torch.zeros(B, dtype=dt, device=dev)  # the initial point has weight exp(0)
    rho = p0.clone()
    done = ~torch.isfinite(H0)
    depth = torch.zeros(B, dtype=torch.long, device=dev)
    n_steps = torch.zeros(B, dtype=torch.long, device=dev)
    sum_accept = torch.zeros(B, dtype=dt, device=dev)
    diverged = torch.zeros(B, dtype=torch.bool, device=dev)
    turning = torch.zeros(B, dtype=torch.bool, device=dev)
    for j in range(int(max_tree_depth)):
        if bool(done.all()):
            break
        active = ~done
        fwd = torch.rand(B, generator=generator, dtype=dt, device=dev) < 0.5
        start = _sel_state(fwd, plus, minus)
        p_start = _w(fwd, p_plus, p_minus)
        eps = torch.where(fwd, step_size, -step_size)
        sub = _build_subtree(
            start, p_start, j, eps, inv_mass, H0, done, potential_and_grad, generator, max_energy_error, compact,
            fused,
        )
        depth += active.long()
        n_steps += sub.n_steps
        sum_accept += sub.sum_accept
        diverged |= active & sub.diverged
        ok = active & sub.valid
        # Biased progressive sampling between the old trajectory and the new subtree.
        take = ok & (torch.rand(B, generator=generator, dtype=dt, device=dev) < torch.exp(sub.log_w - log_w))
        sample = _sel_state(take, sub.proposal, sample)
        # Extend the trajectory in the chosen direction.
        ext_plus, ext_minus = ok & fwd, ok & ~fwd
        # U-turn checks of the merged trajectory (computed before ends move).
        far = _w(fwd, p_minus, p_plus)  # old end away from the new subtree
        adj = _w(fwd, p_plus, p_minus)  # old end touching the new subtree
        ps_far, ps_adj = inv_mass * far, inv_mass * adj
        ps_sub_first, ps_sub_last = inv_mass * sub.p_first, inv_mass * sub.p_last
        rho_new = rho + sub.rho
        turn = _turning(rho_new, ps_far, ps_sub_last)
        turn |= _turning(rho + sub.p_first, ps_far, ps_sub_first)
        turn |= _turning(adj + sub.rho, ps_adj, ps_sub_last)
        plus = _sel_state(ext_plus, sub.last, plus)
        p_plus = _w(ext_plus, sub.p_last, p_plus)
        minus = _sel_state(ext_minus, sub.last, minus)
        p_minus = _w(ext_minus, sub.p_last, p_minus)
        rho = _w(ok, rho_new, rho)
        log_w = torch.where(ok, torch.logaddexp(log_w, sub.log_w), log_w)
        turning |= ok & turn
        turning |= active & ~sub.valid & ~sub.diverged
        done |= active & (~sub.valid | turn)
    accept_prob = sum_accept / n_steps.clamp(min=1).to(dt)
    info = NUTSInfo(accept_prob, diverged, depth, n_steps, H0, turning)
    return sample, info
