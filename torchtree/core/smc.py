"""The SMC engine: the weights, evidence, ESS, resampling and tempering of every particle system.

In the Feynman-Kac view (Chopin & Papaspiliopoulos 2020), an SMC run alternates a move of every
particle ``M_t`` with a reweighting by a potential ``G_t``, and resamples when the weights
degenerate. The three SMCs of torchtree supply their own moves and potentials (top-down SMC:
a node's split and the likelihood ratio, paper 001; SMC with moves: grow / prune / change /
swap and eq. 5b, paper 002; BART's Particle Gibbs: a level of a tree's growth, conditional on
the current tree); this module is everything they share, with one vocabulary:

* **weights**: log-weights float64, island-major ``[I * m]`` for ``I`` independent islands of
  ``m`` particles. Two reductions of the same quantities:

  - :func:`island_weights_step` / :func:`islands_ess`: float reductions per island on this
    process (one rank, or ranks that hold whole islands);
  - :func:`exact_weights_step`: one island spread over the ranks of a backend, summed in exact
    fixed-point integers (:func:`torchtree.distributed.exact.global_stats`), so that the result
    is the same on any number of ranks;

* **evidence**: each step adds ``log sum_i W_i exp(incr_i)`` (normalised previous weights) to
  the island's log-evidence;
* **resampling**: of islands on this process (:func:`island_ancestors`, one generator per
  (seed, :data:`RESAMPLING_STREAM`, step, island)), of one global island across ranks
  (:func:`global_ncopies`, then ``torchtree.distributed.redistribute``), and *conditional*
  multinomial resampling (:func:`conditional_ancestors`: particle 0 is the reference particle of
  Particle Gibbs and keeps its own lineage);
* **tempering**: :func:`next_temperature`, the next power of the likelihood from the ESS.

Every draw is keyed by the run's seed and the step, so one process and several ranks resample
the same particles, and ancestors are in canonical order (:func:`canonical_ancestors`).
"""
from __future__ import annotations

from typing import Callable, List, Sequence, Tuple

import torch

from torchtree.core.random import derive_seed
from torchtree.core.resampling import ess_rows, get_resampler
from torchtree.distributed import ncopies_from_log_weights
from torchtree.distributed.exact import global_stats

__all__ = ["RESAMPLING_STREAM", "canonical_ancestors", "islands_ess", "island_weights_step", "exact_weights_step",
           "island_ancestors", "global_ncopies", "conditional_ancestors", "next_temperature"]

#: the islands' resampling generators: ``derive_seed(seed, RESAMPLING_STREAM, step, island)``
RESAMPLING_STREAM = 1


def canonical_ancestors(ancestors: torch.Tensor) -> torch.Tensor:
    """Slot -> ancestor map in canonical order: ``repeat_interleave(arange(m), ncopies)``.

    The order every redistribution (``torchtree.distributed.redistribute``) produces, so a
    resampling step maps global slots to the same ancestors on 1 rank or many. The
    built-in resamplers already return sorted ancestors; a custom one may not.
    """
    return torch.sort(ancestors).values


def islands_ess(logw: torch.Tensor, n_islands: int) -> torch.Tensor:
    """ESS of each island, ``[I]`` float64, from island-major log-weights ``[I * m]``."""
    return ess_rows(logw.view(n_islands, -1))


def island_weights_step(logw: torch.Tensor, logz: torch.Tensor, incr: torch.Tensor, n_islands: int,
                        m: int) -> Tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Add one step's incremental weights to islands held on this process.

    Parameters
    ----------
    logw : Tensor [I * m] float64, island-major log-weights before the step
    logz : Tensor [I] float64, each island's running log-evidence
    incr : Tensor [I * m] float64, incremental log-weights of the step
    n_islands, m : int, islands and particles per island

    Returns
    -------
    (logw [I * m], logz [I], ess [I]) after the step (new tensors).
    """
    lw2 = logw.view(n_islands, m)
    lwn = lw2 - torch.logsumexp(lw2, 1, keepdim=True)
    logz = logz + torch.logsumexp(lwn + incr.view(n_islands, m), 1)
    logw = logw + incr
    return logw, logz, islands_ess(logw, n_islands)


def exact_weights_step(backend, n_total: int, logw: torch.Tensor, new_logw: torch.Tensor, maxes: Sequence = (),
                       sums: Sequence = ()) -> Tuple[float, float, List[float], List[int]]:
    """One global island's step from ``logw`` to ``new_logw``, the same on any number of ranks.

    Parameters
    ----------
    backend : Backend (``LocalBackend()`` on one process)
    n_total : int, particles over all ranks
    logw, new_logw : float64 Tensor [n_local], this rank's log-weights before and after the step
    maxes, sums : more values reduced in the same two collectives (``max`` floats, ``sum`` ints)

    Returns
    -------
    (log-evidence increment ``lse(new) - lse(old)``, ESS of ``new_logw``, maxes, sums)
    """
    (l0, l1), (_, ess), mx, sm = global_stats(backend, n_total, torch.stack([logw, new_logw]), maxes, sums)
    return l1 - l0, ess, mx, sm


def island_ancestors(logw: torch.Tensor, need: List[int], m: int, resample: Callable, seed: int, step: int,
                     first_island: int = 0, shared_keys: bool = False) -> torch.Tensor:
    """Resample the islands ``need``; the others keep their particles.

    Parameters
    ----------
    logw : Tensor [I_local * m] float64, island-major; the resampled islands' weights are
        reset to zero in place
    need : list of int, local indices of the islands to resample
    m : int, particles per island
    resample : ``fn(generator, log_weights [m], m) -> ancestors [m]`` (``torchtree.core.resampling``)
    seed, step : int, the run's seed and the step (keys of each island's generator)
    first_island : int, global index of local island 0 (ranks holding whole islands)
    shared_keys : bool, every island draws with island ``first_island``'s generator (islands that each
        reproduce a run of one island)

    Returns
    -------
    LongTensor [I_local * m]: local slot -> local ancestor, canonical order within islands.
    """
    anc = torch.arange(logw.numel(), device=logw.device)
    lw2 = logw.view(-1, m)
    for j in need:
        g = torch.Generator(device="cpu").manual_seed(derive_seed(seed, RESAMPLING_STREAM, step,
                                                                  first_island + (0 if shared_keys else j)))
        a = resample(g, lw2[j], m)
        anc[j * m:(j + 1) * m] = canonical_ancestors(a) + j * m
        logw[j * m:(j + 1) * m] = 0.0
    return anc


def global_ncopies(logw: torch.Tensor, backend, scheme: str, generator: torch.Generator, n_total: int,
                   rank: int = 0) -> torch.Tensor:
    """How many copies each of this rank's particles gets when one island spread over the ranks is
    resampled by ``scheme``.

    ``"systematic"`` and ``"multinomial"`` run the distributed ``ncopies``
    (:func:`torchtree.distributed.ncopies_from_log_weights`); the other schemes all-gather the
    ``n_total`` log-weights (8 bytes each) and draw the same global ancestors on every rank.

    Parameters
    ----------
    logw : float64 Tensor [n_local]
    backend : Backend
    scheme : a ``torchtree.core.resampling`` name
    generator : torch.Generator (CPU), the same on every rank
    n_total : int, particles over all ranks
    rank : int, this rank

    Returns
    -------
    LongTensor [n_local] on ``logw``'s device (sums to ``n_total`` over the ranks)
    """
    if scheme in ("systematic", "multinomial"):
        return ncopies_from_log_weights(logw, backend, method=scheme, generator=generator)
    world = int(backend.world_size)
    full = backend.all_gather(logw.cpu()) if world > 1 else logw.cpu()
    anc = torch.sort(get_resampler(scheme)(generator, full, n_total)).values
    n_local = logw.numel()
    first = rank * n_local
    return torch.bincount(anc, minlength=n_total)[first:first + n_local].to(logw.device)


def conditional_ancestors(logw: torch.Tensor, u: torch.Tensor, active: torch.Tensor) -> torch.Tensor:
    """Conditional multinomial resampling of ``C`` independent particle systems (Particle Gibbs).

    Particle 0 of each system is the reference: it keeps its own lineage. Particle ``p > 0`` of an
    ``active`` system draws its ancestor by inverting the weights' CDF at ``u[c, p]``; an inactive
    system keeps every particle.

    Parameters
    ----------
    logw : Tensor [C, P] log-weights
    u : Tensor [C, P] uniforms in [0, 1)
    active : BoolTensor [C]

    Returns
    -------
    LongTensor [C, P], each particle's ancestor within its system.
    """
    P = logw.shape[1]
    pidx = torch.arange(P, device=logw.device)
    cdf = torch.softmax(logw, 1).cumsum(1)
    anc = torch.searchsorted(cdf, (u * cdf[:, -1:]).contiguous()).clamp(max=P - 1)
    return torch.where(active[:, None] & (pidx[None, :] > 0), anc, pidx[None, :])


def next_temperature(stats, logw: torch.Tensor, ll: torch.Tensor, phi: float, target_ess: float,
                     steps_left: int, grid: int = 16, rounds: int = 5) -> float:
    """Next likelihood power: about the largest one whose reweighting keeps ESS >= ``target_ess``,
    but at least an equal share of what is left so that 1 is reached in time.

    A grid search (``grid`` candidates per round, ``rounds`` rounds: resolution
    ``(1 - phi) grid^-rounds``) that evaluates all candidates of a round in the two
    collectives of ``stats`` (:func:`torchtree.distributed.exact.global_stats` over the
    rows ``logw + d ll``, logw and ll [n] float64); like a bisection it assumes the ESS
    falls with the step.
    """
    floor = phi + (1.0 - phi) / steps_left
    span = 1.0 - phi
    lo, hi = 0.0, span
    for rnd in range(rounds):
        cands = [lo + (hi - lo) * (i + 1) / grid for i in range(grid)]
        cands[-1] = hi
        d = torch.tensor(cands, dtype=torch.float64, device=logw.device)
        _, ess, _, _ = stats(logw[None, :] + d[:, None] * ll[None, :])
        if rnd == 0 and ess[-1] >= target_ess:
            return 1.0
        f = next((i for i, e in enumerate(ess) if e < target_ess), grid - 1)
        lo, hi = (cands[f - 1] if f > 0 else lo), cands[f]
    return max(phi + lo, floor)
