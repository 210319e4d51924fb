"""Soft decision trees with batched HMC / NUTS, LAIS evidence and DCC-Tree (paper 004).

Modules (one concept each):

topology     heap-indexed topologies, Chipman structure prior, grow / prune / stay
trees        ``SoftTrees``: batched soft trees (chains x topologies) and their potential
hmc          batched HMC state, leapfrog, HMC step
nuts         batched iterative multinomial NUTS step
adaptation   dual averaging, Welford mass matrix, Stan windows, sharpness annealing
chains       warm-up and sampling loops (functional driver)
sampler      ``HMC`` / ``NUTS`` classes (``run(data)`` on soft trees, ``sample(potential)``)
lais         layered adaptive importance sampling evidence
utility      DCC utility (exploitation, exploration, optimism)
dcc          ``DCC``: the DCC-Tree algorithm
posterior    ``SoftTreePosterior`` (a ``TreePosterior``)
pyro_model   Pyro modules (imported lazily by ``torchtree.pyro``)
inputs       data coercion and [0, 1] scaling
"""
from torchtree.steps.adaptation import (
    DualAveragingState,
    WelfordState,
    dual_averaging_init,
    dual_averaging_update,
    find_reasonable_step_size,
    sharpness_schedule,
    warmup_windows,
    welford_init,
    welford_update,
    welford_variance,
)
from torchtree.samplers.soft_chains import ChainState, SampleTrace, draw, make_kernel, warmup
from torchtree.samplers.dcc.sampler import DCC
from torchtree.steps.hmc import HMCInfo, HMCState, hmc_init, hmc_step, kinetic_energy, leapfrog, sample_momentum
from torchtree.model.soft_data import SoftData, as_soft_data, train_test_split
from torchtree.samplers.dcc.lais import EvidenceAccumulator, chain_covariance, lais_log_weights
from torchtree.steps.nuts import NUTSInfo, nuts_init, nuts_step
from torchtree.model.soft_posterior import SoftTreePosterior
from torchtree.samplers.nuts import HMC, NUTS, MCMCResult
from torchtree.model.topology import Topology, propose_topology, sample_prior_topologies
from torchtree.model.soft_trees import ParamLayout, SoftTreeHyper, SoftTrees
from torchtree.samplers.dcc.utility import dcc_utility, exploitation_term, exploration_term

__all__ = [
    "SoftTrees", "SoftTreeHyper", "ParamLayout", "Topology", "sample_prior_topologies", "propose_topology",
    "HMCState", "HMCInfo", "NUTSInfo", "hmc_init", "hmc_step", "nuts_init", "nuts_step", "leapfrog",
    "sample_momentum", "kinetic_energy",
    "DualAveragingState", "WelfordState", "dual_averaging_init", "dual_averaging_update",
    "find_reasonable_step_size", "sharpness_schedule", "warmup_windows", "welford_init", "welford_update",
    "welford_variance",
    "ChainState", "SampleTrace", "make_kernel", "warmup", "draw",
    "HMC", "NUTS", "MCMCResult", "DCC", "SoftTreePosterior",
    "lais_log_weights", "chain_covariance", "EvidenceAccumulator",
    "dcc_utility", "exploitation_term", "exploration_term",
    "SoftData", "as_soft_data", "train_test_split",
]
