"""The SMC engine's weight bookkeeping, shared by every SMC sampler and every rank layout.

Islands are independent particle filters of ``m`` particles each, stored island-major in
one ``[I * m]`` vector of log-weights (float64). Per step the engine

* adds the incremental log-weights and updates each island's log-evidence
  (:func:`island_weights_step`),
* measures each island's ESS and resamples the islands whose ESS fell below the threshold
  (:func:`island_ancestors`), with one generator per (seed, step, island) so that any number
  of ranks draws the same ancestors,
* and at the end weighs the islands equally (:func:`island_posterior`).

Adaptive likelihood tempering (:func:`next_temperature`) picks the next power of the
likelihood from the weights' ESS.
"""
from __future__ import annotations

import math
from typing import Callable, List, Tuple

import torch

from torchtree.core.random import derive_seed
from torchtree.core.resampling import ess_rows
from torchtree.model.data import Data
from torchtree.model.posterior import TreePosterior
from torchtree.model.trees import HardTrees

#: the islands' resampling generators: ``derive_seed(seed, RESAMPLING_STREAM, step, island)``
RESAMPLING_STREAM = 1

__all__ = ["RESAMPLING_STREAM", "canonical_ancestors", "island_weights_step", "island_ancestors", "island_posterior", "islands_ess",
           "next_temperature"]


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
    """Add one step's incremental weights.

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


def island_ancestors(logw: torch.Tensor, need: List[int], m: int, resample: Callable, seed: int, step: int,
                     first_island: int = 0) -> torch.Tensor:
    """Resample the islands ``need``; the others keep their particles.

    Parameters
    ----------
    logw : Tensor [I_local * m] float64, island-major; the resampled islands' weights are
        reset to zero in place
    need : list of int, local indices of the islands to resample
    m : int, particles per island
    resample : ``fn(generator, log_weights [m], m) -> ancestors [m]`` (``torchtree.resampling``)
    seed, step : int, the run's seed and the step (keys of each island's generator)
    first_island : int, global index of local island 0 (ranks holding whole islands)

    Returns
    -------
    LongTensor [I_local * m]: local slot -> local ancestor, canonical order within islands.
    """
    anc = torch.arange(logw.numel(), device=logw.device)
    lw2 = logw.view(-1, m)
    for j in need:
        g = torch.Generator(device="cpu").manual_seed(derive_seed(seed, RESAMPLING_STREAM, step, first_island + j))
        a = resample(g, lw2[j], m)
        anc[j * m:(j + 1) * m] = canonical_ancestors(a) + j * m
        logw[j * m:(j + 1) * m] = 0.0
    return anc


def island_posterior(trees: HardTrees, logw: torch.Tensor, logz: torch.Tensor, lik, data: Data,
                     info: dict) -> TreePosterior:
    """The posterior of a finished run: islands weighted equally, each normalised.

    Parameters
    ----------
    trees : HardTrees [P trees], logw : Tensor [P] (island-major),
    logz : Tensor [I] per-island log evidence, lik : likelihood, data : Data
    info : dict, run facts (``sampler``, ``n_stages``, ``seconds``, ...)

    Returns
    -------
    TreePosterior with final log weights summing to one over all P particles.
    """
    I = logz.numel()
    lw2 = logw.view(I, -1)
    final_lw = (lw2 - torch.logsumexp(lw2, 1, keepdim=True) - math.log(I)).reshape(-1)
    log_evidence = float(torch.logsumexp(logz, 0) - math.log(I))
    info = {**info, "island_log_evidence": logz.cpu().tolist(), "island_ess": islands_ess(logw, I).cpu().tolist()}
    return TreePosterior(trees, final_lw, lik, data.d, classes=data.classes_, log_evidence=log_evidence, info=info)


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
