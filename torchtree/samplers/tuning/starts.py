"""Starting points drawn from a top-down SMC run (``init="topdown"`` of MCMC, ``init_prior="topdown"``
of SMC with moves).

On large tables, chains or particles that start at the root or at prior draws need far more
moves than a fit has to grow trees of the posterior's size. A top-down SMC run on the same model
(prior x likelihood, same data) gives weighted trees that approximate the posterior; the move
samplers then start from draws of them and keep targeting the same posterior. Draws are keyed by
the global chain / particle index, so every rank (each runs the same seeded top-down fit) picks
the same start for a given index.

The top-down run mirrors what ``method="smc"`` does best on the table (:func:`start_settings`): on
small tables the one-step optimal proposal for classification (every cut scored: a nearly
perfectly weighted filter, cheap up to ``OPTIMAL_MAX_CELLS`` rows x features) and islands of the
prior proposal for regression (one filter keeps few distinct trees); from ``SMALL_TABLE_ROWS``
rows, or on wider tables, the empirical proposal.
"""
from __future__ import annotations

from typing import Tuple

import torch

from torchtree.core.random import keyed_uniform
from torchtree.samplers.presets import (OPTIMAL_MAX_CELLS, PARTICLES_PER_FEATURE, REGRESSION_ISLANDS, SMALL_TABLE_ROWS,
                                        WIDE_MAX_PARTICLES, WIDE_MAX_WORK, RunShape, optimal_proposal_fits, small_table,
                                        wide_table_particles)
from torchtree.model.target import TreeModel
from torchtree.steps.from_trees import state_from_trees
from torchtree.steps.moves import TreeState

__all__ = ["TOPDOWN_INIT_PARTICLES", "SMALL_TABLE_ROWS", "OPTIMAL_MAX_CELLS", "REGRESSION_ISLANDS",
           "PARTICLES_PER_FEATURE", "WIDE_MAX_PARTICLES", "WIDE_MAX_WORK", "wide_table_particles", "start_settings",
           "topdown_draws"]

#: particles of the top-down SMC run that starts are drawn from
TOPDOWN_INIT_PARTICLES = 1000


def start_settings(n: int, d: int, task: str, n_particles: int, n_classes: int = 2) -> dict:
    """The top-down SMC settings (``proposal``, ``n_islands``, ``n_particles``) of a start on an ``n x d`` table.

    On small classification tables the optimal proposal's filter is close to
    perfectly weighted; on small regression tables one filter of the empirical proposal collapses
    onto few trees, islands of the prior proposal do not; from ``SMALL_TABLE_ROWS`` rows the
    empirical proposal finds cuts the prior proposal misses; wider classification tables take
    :func:`wide_table_particles`.

    Parameters
    ----------
    n, d : int, rows and features of the training data
    task : "classification" or "regression"
    n_particles : int, particles asked for (regression islands may take up to 4 fewer)
    n_classes : int, classes (the optimal proposal's work per cell grows with them: its bound is
        on ``n * d * n_classes / 2``, rows x features for binary labels)

    Returns
    -------
    dict of :class:`~torchtree.samplers.topdown.TopDownSMC` settings
    """
    wide = wide_table_particles(n, d, n_particles) if task == "classification" else n_particles
    if not small_table(RunShape(n, d, task, n_classes)):  # the prior proposal's cuts miss on many rows
        return {"proposal": "empirical", "n_islands": 1, "n_particles": wide}
    if task == "regression" and n_particles >= 2 * REGRESSION_ISLANDS:
        # islands must divide the particles: a few fewer (1020 of 1024) rather than one filter
        return {"proposal": "prior", "n_islands": REGRESSION_ISLANDS,
                "n_particles": n_particles - n_particles % REGRESSION_ISLANDS}
    if task == "regression":
        return {"proposal": "prior", "n_islands": 1, "n_particles": n_particles}
    if optimal_proposal_fits(RunShape(n, d, task, n_classes)):
        return {"proposal": "optimal", "n_islands": 1, "n_particles": n_particles}
    return {"proposal": "empirical", "n_islands": 1, "n_particles": wide}


def topdown_draws(model: TreeModel, gidx: torch.Tensor, seed: int, n_particles: int = TOPDOWN_INIT_PARTICLES,
                  ctx=None) -> Tuple[TreeState, float]:
    """Draws from a one-process top-down SMC run on ``model``: index ``g`` takes the tree at its
    keyed uniform in the weights' CDF (a multinomial draw, so the draws are an equally weighted,
    properly weighted sample of the run's approximation).

    Parameters
    ----------
    model : TreeModel (Chipman prior)
    gidx : LongTensor [n] global chain / particle indices
    seed : int
    n_particles : int, particles asked for (regression islands may take up to 4 fewer)
    ctx : RunContext of the run being started, optional: the top-down run is then its recorded
        sub-run (:func:`torchtree.samplers.driver.sub_run`: its threads, recorded in its posterior)

    Returns
    -------
    (TreeState [n], log_evidence of the top-down run: float)
    """
    from torchtree.samplers.topdown import TopDownSMC

    if not model.chipman:
        raise ValueError("init='topdown' needs the Chipman prior (top-down SMC grows trees under it); "
                         "use a prior-drawn start with the Poisson prior")
    from torchtree.samplers.driver import sub_run

    data = model.data
    smc = TopDownSMC(model.prior, model.likelihood, use_likelihood=model.use_likelihood, device=model.X.device,
                     **start_settings(data.n, data.d, data.task, n_particles, data.n_classes or 2))
    post = smc.run(data, seed=seed) if ctx is None else sub_run(ctx, smc, data, seed=seed, purpose="top-down start")
    cdf = torch.softmax(post.log_weights.double(), 0).cumsum(0)
    u = keyed_uniform(seed, 0, gidx.to(cdf.device)) * cdf[-1]
    pick = torch.searchsorted(cdf, u).clamp(max=cdf.numel() - 1)
    # many draws repeat a tree: fill the caches once per distinct tree, then copy
    uniq, inv = torch.unique(pick, return_inverse=True)
    state = state_from_trees(model, post.trees.take(uniq.to(post.trees.device)))
    return TreeState(state.trees.take(inv)), float(post.log_evidence)
