"""``BART``: sum-of-trees models by batched Bayesian backfitting or Particle Gibbs.

Every chain holds ``n_trees`` heap trees (:mod:`torchtree.model.bart`); a step is one sweep:
each tree in turn is redrawn on its partial residual in all chains at once (grow / prune /
change moves, :func:`torchtree.steps.bart_moves.tree_update`, or a conditional top-down SMC,
:func:`torchtree.steps.bart_pg.pg_tree_update`), then the noise variance (regression) or
the probit latents (classification). Randomness is keyed by (sweep, tree, global chain), so
chains split over ranks draw what one process draws.
"""
from torchtree.samplers.bart.config import BARTConfig, Stream
from torchtree.samplers.bart.sampler import BART, backfit_sweep
from torchtree.samplers.bart.state import BARTSetup, BARTState

__all__ = ["BART", "BARTConfig", "BARTSetup", "BARTState", "Stream", "backfit_sweep"]
