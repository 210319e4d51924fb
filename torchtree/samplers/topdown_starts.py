"""Starting points drawn from a top-down SMC run (``init="topdown"`` of MCMC, ``init_prior="topdown"``
of SMC with moves).

On large tables, chains or particles that start at the root or at prior draws need far more
moves than a fit has to grow trees of the posterior's size. A top-down SMC run on the same model
(prior x likelihood, same data) gives weighted trees that approximate the posterior; the move
samplers then start from draws of them and keep targeting the same posterior. Draws are keyed by
the global chain / particle index, so every rank (each runs the same seeded top-down fit) picks
the same start for a given index.
"""
from __future__ import annotations

from typing import Tuple

import torch

from torchtree.core.random import keyed_uniform
from torchtree.model.target import TreeModel
from torchtree.steps.from_trees import state_from_trees
from torchtree.steps.moves import TreeState

__all__ = ["TOPDOWN_INIT_PARTICLES", "topdown_draws"]

#: particles of the top-down SMC run (empirical proposal) that starts are drawn from
TOPDOWN_INIT_PARTICLES = 1000


def topdown_draws(model: TreeModel, gidx: torch.Tensor, seed: int, n_particles: int = TOPDOWN_INIT_PARTICLES
                  ) -> Tuple[TreeState, float]:
    """Draws from a one-process top-down SMC run on ``model``: index ``g`` takes the tree at its
    keyed uniform in the weights' CDF (a multinomial draw, so the draws are an equally weighted,
    properly weighted sample of the run's approximation).

    Parameters
    ----------
    model : TreeModel (Chipman prior)
    gidx : LongTensor [n] global chain / particle indices
    seed : int
    n_particles : int, particles of the top-down run

    Returns
    -------
    (TreeState [n], log_evidence of the top-down run: float)
    """
    from torchtree.samplers.topdown import TopDownSMC

    if not model.chipman:
        raise ValueError("init='topdown' needs the Chipman prior (top-down SMC grows trees under it); "
                         "use a prior-drawn start with the Poisson prior")
    post = TopDownSMC(model.prior, model.likelihood, n_particles=n_particles, proposal="empirical",
                      use_likelihood=model.use_likelihood, device=model.X.device).run(model.data, seed=seed)
    cdf = torch.softmax(post.log_weights.double(), 0).cumsum(0)
    u = keyed_uniform(seed, 0, gidx.to(cdf.device)) * cdf[-1]
    pick = torch.searchsorted(cdf, u).clamp(max=cdf.numel() - 1)
    # many draws repeat a tree: fill the caches once per distinct tree, then copy
    uniq, inv = torch.unique(pick, return_inverse=True)
    state = state_from_trees(model, post.trees.take(uniq.to(post.trees.device)))
    return TreeState(state.trees.take(inv)), float(post.log_evidence)
