"""Warm-up and sampling loops of batched HMC / NUTS chains, as plain functions (``NUTS`` and DCC call them
inside their ``step``; the run itself is the driver's).

``warmup`` adapts every chain's step size and diagonal inverse mass matrix with
Stan's windowed schedule (see :mod:`torchtree.steps.adaptation`), optionally annealing
the split sharpness of a soft-tree model; ``draw`` continues adapted chains and
records their positions. Both loop over iterations only: every iteration is one
batched kernel step for all chains.

The kernels (:func:`torchtree.steps.hmc.hmc_step`, :func:`torchtree.steps.nuts.nuts_step`)
are wrapped by :func:`make_kernel` into ``step(state, potential_and_grad, step_size,
inv_mass, generator) -> (state, info)``. With ``asynchronous=True`` and a NUTS kernel,
``draw`` instead runs :func:`torchtree.steps.nuts_async.nuts_draw_async`: every chain
makes its own sequence of transitions with no barrier between them (warm-up always
runs in lockstep, since adaptation updates every chain once per iteration).

Monitor hooks: ``monitor.on_step(step, dict)`` is called every ``monitor_every``
iterations with scalar summaries tagged ``hmc/...`` (step size, acceptance,
divergences, tree depth, leapfrog steps, sharpness, phase). ``monitor`` goes through
:func:`torchtree.monitor.as_monitor` like every sampler's (a bad object is a TypeError,
not silently ignored); with no monitor the summaries are not computed at all.
"""
from __future__ import annotations

from functools import partial
from typing import Any, Callable, Dict, NamedTuple, Optional, Sequence, Tuple

import torch

from torchtree.monitor import NullMonitor, as_monitor
from torchtree.steps.adaptation import (
    dual_averaging_init,
    dual_averaging_update,
    find_reasonable_step_size,
    warmup_windows,
    welford_init,
    welford_update,
    welford_variance,
)
from torchtree.steps.hmc import HMCState, PotentialAndGrad, hmc_init, hmc_step
from torchtree.steps.nuts import nuts_step
from torchtree.steps.nuts_async import nuts_draw_async

__all__ = ["ChainState", "SampleTrace", "make_kernel", "nuts_settings", "warmup", "draw", "BudgetSpent"]


class BudgetSpent(Exception):
    """Raised by a potential wrapped with :func:`_stoppable` once ``stop()`` is true: it
    abandons the transition in progress (the chains keep the state they had before it)."""


def _stoppable(potential_and_grad: PotentialAndGrad, stop: Optional[Callable[[], bool]]) -> PotentialAndGrad:
    """``potential_and_grad`` asking ``stop`` before every call (every leapfrog step), so that
    a budget holds inside a long transition too (one transition of 32 chains on 100k rows
    takes ~20 CPU s); unchanged when ``stop`` is None."""
    if stop is None:
        return potential_and_grad

    def checked(theta, *rows):
        if stop():
            raise BudgetSpent
        return potential_and_grad(theta, *rows)

    return checked


class ChainState(NamedTuple):
    """Adapted chains: HMC state plus the per-chain tuning.

    Returned by :func:`warmup` and :func:`draw`; :func:`draw` continues from it.

    Attributes
    ----------
    state : HMCState
        Position ``[B, P]``, potential ``[B]`` and gradient ``[B, P]`` of every chain.
    step_size : Tensor [B]
        Adapted step size of every chain.
    inv_mass : Tensor [B, P]
        Adapted diagonal inverse mass matrix (0 on frozen coordinates).
    """

    state: HMCState
    step_size: torch.Tensor
    inv_mass: torch.Tensor


class SampleTrace(NamedTuple):
    """What :func:`draw` records, per kept iteration ``S`` and chain ``B``.

    Attributes
    ----------
    positions : Tensor [S, B, P]
        Kept draws of the unconstrained parameters.
    potentials : Tensor [S, B]
        Their potentials ``U = -log p~``.
    accept_prob : Tensor [S, B]
        Acceptance statistic of the transition that produced each draw.
    is_divergent : BoolTensor [S, B]
        Whether that transition diverged.
    tree_depth : LongTensor [S, B]
        NUTS doublings (zeros for HMC).
    n_steps : LongTensor [S, B]
        Leapfrog steps of that transition.
    """

    positions: torch.Tensor
    potentials: torch.Tensor
    accept_prob: torch.Tensor
    is_divergent: torch.Tensor
    tree_depth: torch.Tensor
    n_steps: torch.Tensor


Kernel = Callable[..., Tuple[HMCState, Any]]


def make_kernel(
    kind: str = "nuts",
    *,
    max_tree_depth: int = 10,
    n_leapfrog: int = 10,
    max_energy_error: float = 1000.0,
    compact: float = 0.0,
    fused: Optional[Callable] = None,
) -> Kernel:
    """The transition kernel :func:`warmup` and :func:`draw` run, with its settings bound.

    Parameters
    ----------
    kind : {"nuts", "hmc"}, default "nuts"
        :func:`~torchtree.steps.nuts.nuts_step` or :func:`~torchtree.steps.hmc.hmc_step`
        (the latter with step-size jitter).
    max_tree_depth : int, default 10
        NUTS only: at most ``2**max_tree_depth - 1`` leapfrog steps per transition.
    n_leapfrog : int, default 10
        HMC only: leapfrog steps per transition.
    max_energy_error : float, default 1000.0
        Energy error that marks a divergent transition.
    compact : float, default 0.0
        NUTS only: integrate only the live chains below this live fraction (the potential
        must accept ``rows``, see :func:`torchtree.steps.nuts.nuts_step`); 0 = off.
    fused : callable, optional
        NUTS only: ``rows -> (core, tensors, consts)`` of the potential, to run each leapfrog
        step as one compiled call (see :func:`torchtree.steps.nuts.nuts_step`; e.g.
        :meth:`SoftTrees.fused_parts`).

    Returns
    -------
    callable
        ``kernel(state, potential_and_grad, step_size, inv_mass, generator=None) ->
        (HMCState, NUTSInfo | HMCInfo)``.

    Raises
    ------
    ValueError
        ``kind`` is neither ``"nuts"`` nor ``"hmc"``.
    """
    if kind == "nuts":
        return partial(nuts_step, max_tree_depth=max_tree_depth, max_energy_error=max_energy_error, compact=compact,
                       fused=fused)
    if kind == "hmc":
        return partial(hmc_step, n_leapfrog=n_leapfrog, max_energy_error=max_energy_error, jitter=True)
    raise ValueError(f"kind must be 'nuts' or 'hmc', got {kind!r}")


def nuts_settings(kernel: Kernel) -> Optional[Dict[str, Any]]:
    """The NUTS settings of a kernel from :func:`make_kernel` (``max_tree_depth``,
    ``max_energy_error``, ``compact``), or None if it is not a NUTS kernel."""
    if isinstance(kernel, partial) and kernel.func is nuts_step:
        return dict(kernel.keywords)
    return None


def _summary(info, step_size: torch.Tensor, prefix: str) -> Dict[str, float]:
    out = {
        f"{prefix}/step_size": float(step_size.mean()),
        f"{prefix}/accept": float(info.accept_prob.mean()),
        f"{prefix}/divergences": int(info.is_divergent.sum()),
        f"{prefix}/n_steps": float(info.n_steps.float().mean()),
    }
    if hasattr(info, "tree_depth"):
        out[f"{prefix}/tree_depth"] = float(info.tree_depth.float().mean())
    return out


def warmup(
    kernel: Kernel,
    potential_and_grad: PotentialAndGrad,
    position: torch.Tensor,
    n_warmup: int,
    *,
    generator: Optional[torch.Generator] = None,
    coord_mask: Optional[torch.Tensor] = None,
    step_size: Optional[torch.Tensor] = None,
    inv_mass: Optional[torch.Tensor] = None,
    target_accept: float = 0.8,
    adapt_mass: bool = True,
    sharpness: Optional[Sequence[float]] = None,
    set_sharpness: Optional[Callable[[float], None]] = None,
    monitor=None,
    monitor_every: int = 1,
    step_offset: int = 0,
    prefix: str = "hmc",
    stop: Optional[Callable[[], bool]] = None,
) -> Tuple[ChainState, Dict[str, Any]]:
    """Adapt step sizes and diagonal mass matrices of all chains (Stan windows).

    Every iteration is one batched kernel step for all chains followed by a dual-averaging
    update of each chain's step size (:func:`~torchtree.steps.adaptation.dual_averaging_update`);
    inside the slow windows of :func:`~torchtree.steps.adaptation.warmup_windows` the positions
    feed a Welford variance that becomes the inverse mass matrix at the end of each window,
    where the step size is re-initialised and dual averaging restarts. The returned step size
    is the dual-averaging iterate average.

    Parameters
    ----------
    kernel : callable
        Step function from :func:`make_kernel`.
    potential_and_grad : callable
        ``Tensor [B, P] -> (U [B], dU/dtheta [B, P])``.
    position : Tensor [B, P]
        Initial positions.
    n_warmup : int
        Warm-up iterations (0: no adaptation).
    generator : torch.Generator, optional
    coord_mask : BoolTensor [B, P], optional
        Inactive coordinates (False) get zero inverse mass and never move.
    step_size : Tensor [B], optional
        Initial step sizes; found by :func:`~torchtree.steps.adaptation.find_reasonable_step_size`
        if None.
    inv_mass : Tensor [B, P], optional
        Initial inverse mass matrix; the identity (on active coordinates) if None.
    target_accept : float, default 0.8
        Acceptance statistic dual averaging aims at.
    adapt_mass : bool, default True
        Estimate the mass matrix in Stan's windows (False: step size only).
    sharpness : sequence of float, optional
        Per-iteration split sharpness (see :func:`sharpness_schedule`); applied via
        ``set_sharpness`` before each iteration, and the cached potential and
        gradient are recomputed because the target changed.
    set_sharpness : callable, optional
        ``float -> None``, sets the model's split sharpness (needed with ``sharpness``).
    monitor : Monitor or list, optional
        Gets ``on_step(step, {"hmc/step_size": ..., ...})`` every ``monitor_every`` iterations.
    monitor_every : int, default 1
    step_offset : int, default 0
        Added to the step number given to the monitor.
    prefix : str, default "hmc"
        Tag prefix for the monitor.
    stop : callable () -> bool, optional
        Asked before every leapfrog step (and after every iteration); True ends the
        warm-up there, abandoning the transition in progress (a time budget). The chains
        are then not adapted: the caller decides what a cut warm-up is worth
        (``stats["completed"]`` says).

    Returns
    -------
    chains : ChainState
        The last state with the adapted step sizes and inverse mass matrices.
    stats : dict
        ``accept_prob`` (Tensor [B], mean over the terminal buffer), ``divergences``
        (LongTensor [B], count over the warm-up), ``iterations`` (int, iterations run) and
        ``completed`` (bool, all ``n_warmup`` ran).

    Raises
    ------
    TypeError
        ``monitor`` is not a monitor (see :func:`torchtree.monitor.as_monitor`).
    """
    B, P = position.shape
    dev, dt = position.device, position.dtype
    monitor = as_monitor(monitor)
    watch = not isinstance(monitor, NullMonitor)  # the summaries cost a sync per iteration
    mask = torch.ones(B, P, dtype=torch.bool, device=dev) if coord_mask is None else coord_mask
    fmask = mask.to(dt)
    inv_mass = fmask.clone() if inv_mass is None else inv_mass * fmask
    if sharpness is not None and set_sharpness is not None and n_warmup > 0:
        set_sharpness(float(sharpness[0]))
    state = hmc_init(position, potential_and_grad)
    if step_size is None:
        step_size = find_reasonable_step_size(
            state, potential_and_grad, inv_mass, torch.full((B,), 0.1, dtype=dt, device=dev), generator
        )
    da = dual_averaging_init(step_size)
    windows = warmup_windows(n_warmup) if adapt_mass else []
    ends = {e for _, e in windows}
    welford = welford_init(position)
    divergences = torch.zeros(B, dtype=torch.long, device=dev)
    term_start = windows[-1][1] if windows else 0
    acc_sum = torch.zeros(B, dtype=dt, device=dev)
    acc_n = done = 0
    step_pg = _stoppable(potential_and_grad, stop)
    for i in range(n_warmup):
        if sharpness is not None and set_sharpness is not None and i > 0 and sharpness[i] != sharpness[i - 1]:
            set_sharpness(float(sharpness[i]))
            state = hmc_init(state.position, potential_and_grad)
        eps = torch.exp(da.log_step)
        try:
            state, info = kernel(state, step_pg, eps, inv_mass, generator=generator)
        except BudgetSpent:
            break
        da = dual_averaging_update(da, info.accept_prob, target_accept)
        divergences += info.is_divergent.long()
        if i >= term_start:
            acc_sum += info.accept_prob
            acc_n += 1
        if any(s <= i < e for s, e in windows):
            welford = welford_update(welford, state.position)
        if (i + 1) in ends:
            inv_mass = welford_variance(welford) * fmask
            welford = welford_init(position)
            new_eps = find_reasonable_step_size(state, potential_and_grad, inv_mass, torch.exp(da.log_step), generator)
            da = dual_averaging_init(new_eps)
        if watch and (i % monitor_every == 0 or i == n_warmup - 1):
            d = _summary(info, eps, prefix)
            d[f"{prefix}/phase"] = "warmup"
            if sharpness is not None:
                d[f"{prefix}/sharpness"] = float(sharpness[i])
            monitor.on_step(step_offset + i, d)
        done = i + 1
        if stop is not None and done < n_warmup and stop():
            break
    final_eps = torch.exp(da.log_step_avg) if n_warmup > 0 else step_size
    final_eps = torch.where(torch.isfinite(final_eps), final_eps, step_size)
    stats = {"accept_prob": acc_sum / max(acc_n, 1), "divergences": divergences, "iterations": done,
             "completed": done == n_warmup}
    return ChainState(state, final_eps, inv_mass), stats


def draw(
    kernel: Kernel,
    potential_and_grad: PotentialAndGrad,
    chains: ChainState,
    n_samples: int,
    *,
    generator: Optional[torch.Generator] = None,
    thin: int = 1,
    monitor=None,
    monitor_every: int = 1,
    step_offset: int = 0,
    prefix: str = "hmc",
    refresh: bool = False,
    asynchronous: bool = False,
    stop: Optional[Callable[[], bool]] = None,
) -> Tuple[ChainState, SampleTrace]:
    """Run adapted chains for ``n_samples * thin`` iterations, keeping every ``thin``-th.

    Parameters
    ----------
    kernel, potential_and_grad : callable
        As in :func:`warmup`.
    chains : ChainState
        Adapted chains, e.g. from :func:`warmup`.
    n_samples : int
        Kept draws per chain.
    generator : torch.Generator, optional
    thin : int, default 1
        Keep every ``thin``-th iteration.
    monitor, monitor_every, step_offset, prefix
        As in :func:`warmup`.
    refresh : bool, default False
        Recompute the cached potential and gradient first (needed when the target
        changed since ``chains`` was produced, e.g. a different sharpness).
    asynchronous : bool, default False
        For a NUTS kernel: run the ``n_samples * thin`` transitions of each chain
        with :func:`torchtree.steps.nuts_async.nuts_draw_async` (no barrier between
        transitions; same kernel settings, including ``compact``). Ignored for
        other kernels. The monitor then gets iteration ``i`` once every chain has
        finished its transition ``i``.
    stop : callable () -> bool, optional
        Asked before every leapfrog step (asynchronously: after ticks that end a
        subtree); True ends the sampling there with the draws kept so far, abandoning
        the transition in progress (a time budget): ``S`` may then
        be less than ``n_samples``, down to 0. The chains are left where they are
        (asynchronously, at the last draw every chain kept: a chain stopped inside a
        transition has no valid state).

    Returns
    -------
    chains : ChainState
        Where the chains are after the last transition (step sizes and mass unchanged).
    trace : SampleTrace
        ``S = n_samples`` kept draws (fewer when ``stop`` ended it).

    Raises
    ------
    TypeError
        ``monitor`` is not a monitor (see :func:`torchtree.monitor.as_monitor`).
    """
    state, eps, inv_mass = chains
    monitor = as_monitor(monitor)
    watch = not isinstance(monitor, NullMonitor)
    if refresh:
        state = hmc_init(state.position, potential_and_grad)
    settings = nuts_settings(kernel) if asynchronous else None
    if settings is not None:
        return _draw_async(potential_and_grad, state, eps, inv_mass, n_samples, thin, generator, settings,
                           monitor if watch else None, monitor_every, step_offset, prefix, stop)
    pos, pot, acc, div, depth, nst = [], [], [], [], [], []
    step_pg = _stoppable(potential_and_grad, stop)
    for i in range(n_samples * thin):
        try:
            state, info = kernel(state, step_pg, eps, inv_mass, generator=generator)
        except BudgetSpent:
            break
        if (i + 1) % thin == 0:
            pos.append(state.position)
            pot.append(state.potential)
            acc.append(info.accept_prob)
            div.append(info.is_divergent)
            depth.append(getattr(info, "tree_depth", torch.zeros_like(info.n_steps)))
            nst.append(info.n_steps)
        if watch and (i % monitor_every == 0 or i == n_samples * thin - 1):
            d = _summary(info, eps, prefix)
            d[f"{prefix}/phase"] = "sample"
            monitor.on_step(step_offset + i, d)
        if stop is not None and i + 1 < n_samples * thin and stop():
            break
    B, P = state.position.shape
    dev, dt = state.position.device, state.position.dtype

    def stack(xs, shape, dtype):
        return torch.stack(xs) if xs else torch.zeros((0,) + shape, dtype=dtype, device=dev)

    trace = SampleTrace(
        stack(pos, (B, P), dt),
        stack(pot, (B,), dt),
        stack(acc, (B,), dt),
        stack(div, (B,), torch.bool),
        stack(depth, (B,), torch.long),
        stack(nst, (B,), torch.long),
    )
    return ChainState(state, eps, inv_mass), trace


def _draw_async(potential_and_grad, state, eps, inv_mass, n_samples, thin, generator, settings,
                monitor, monitor_every, step_offset, prefix, stop=None) -> Tuple[ChainState, SampleTrace]:
    """:func:`draw` with :func:`nuts_draw_async` (same outputs and monitor tags)."""
    n_total = n_samples * thin
    B = state.position.shape[0]
    step_mean = float(eps.mean())

    def report(i: int, stats: torch.Tensor) -> None:
        # the same tags as the lockstep loop, iteration i = every chain's transition i
        if i % monitor_every == 0 or i == n_total - 1:
            acc, div, depth, steps = stats.tolist()
            monitor.on_step(step_offset + i, {
                f"{prefix}/step_size": step_mean, f"{prefix}/accept": acc / B,
                f"{prefix}/divergences": int(div), f"{prefix}/n_steps": steps / B,
                f"{prefix}/tree_depth": depth / B, f"{prefix}/phase": "sample",
            })

    state, out = nuts_draw_async(
        state, potential_and_grad, eps, inv_mass, n_total, generator=generator,
        max_tree_depth=settings.get("max_tree_depth", 10), max_energy_error=settings.get("max_energy_error", 1000.0),
        compact=settings.get("compact", 0.0), thin=thin, on_transition=report if monitor is not None else None,
        stop=stop,
    )
    trace = SampleTrace(out.positions, out.potential, out.accept_prob, out.is_divergent, out.tree_depth, out.n_steps)
    return ChainState(state, eps, inv_mass), trace
