"""Metropolis-Hastings over decision trees (Chipman, George & McCulloch, 1998).

Any number of chains run as one batch: every iteration proposes one
grow / prune / change / swap move per chain (:mod:`torchtree.steps.moves`) and accepts it
with probability ``min(1, pi(t") q(t | t") / (pi(t) q(t" | t)))``. A single chain
is latency-bound: an iteration is a fixed number of small tensor operations,
random numbers are drawn in blocks of iterations, and nothing is synchronised
with the host except the subtree height that bounds the routing loop; the host engine
(:class:`torchtree.steps.host_moves.HostChain`) runs the same chains in numpy, one after another.

The run goes through :func:`torchtree.samplers.driver.run` (device, seed, checkpoints,
monitors). One driver step runs the iterations up to the next monitor report or
checkpoint (or the end): a host iteration costs well under a millisecond, so a call per
iteration would be a measurable share of it.

Diagnostics: acceptance rate per move type, and split-R-hat and effective sample
size (:func:`torchtree.model.diagnostics.rhat`, :func:`torchtree.model.diagnostics.chain_ess`,
re-exported here) of the number of leaves and of the log posterior over the kept
draws of all chains; the traces themselves are in ``info["trace"]``
(``[chains, draws]``), which :func:`torchtree.model.diagnostics.to_arviz` exports.
"""
from torchtree.samplers.mcmc.config import MCMCConfig, Stream, SMALL_TABLE_CHAINS, SMALL_TABLE_SAMPLES, ENGINES
from torchtree.samplers.mcmc.sampler import MCMC
from torchtree.samplers.mcmc.state import MCMCSetup, MCMCState, HostMCMCState
from torchtree.model.diagnostics import chain_ess, rhat
from torchtree.model.priors import make_prior
from torchtree.steps.moves import check_move_probs

__all__ = ["ENGINES", "HostMCMCState", "MCMC", "MCMCConfig", "MCMCSetup", "MCMCState", "SMALL_TABLE_CHAINS",
           "SMALL_TABLE_SAMPLES", "Stream", "chain_ess", "check_move_probs", "make_prior", "rhat"]
