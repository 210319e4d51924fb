"""Soft decision trees with batched HMC / NUTS, LAIS evidence and DCC-Tree (paper 004).

The face of the soft-tree family: one import for what lives in the layers below.

model     ``SoftTrees`` (torchtree.model.soft_trees), ``SoftTreeHyper`` / ``ParamLayout``
          (model.soft_params), ``Topology`` (model.topology), ``SoftData`` (model.soft_data),
          ``SoftTreePosterior`` (model.soft_posterior); the hand-derived gradient is
          torchtree.kernels.soft_gradient
steps     HMC and NUTS transitions (steps.hmc, steps.nuts, steps.nuts_async), adaptation
samplers  ``NUTS`` / ``HMC`` with ``NUTSConfig`` (samplers.nuts; warm-up and draw loops in
          samplers.nuts.chains), ``DCC`` with ``DCCConfig`` (samplers.dcc: sampler, config,
          records, lais, utility); both run through torchtree.samplers.driver.run
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
from torchtree.samplers.nuts.chains import ChainState, SampleTrace, draw, make_kernel, warmup
from torchtree.samplers.dcc.config import DCCConfig
from torchtree.samplers.dcc.sampler import DCC
from torchtree.steps.hmc import HMCInfo, HMCState, hmc_init, hmc_step, kinetic_energy, leapfrog, sample_momentum
from torchtree.model.soft_data import SoftData, as_soft_data, train_test_split
from torchtree.samplers.dcc.lais import EvidenceAccumulator, chain_covariance, lais_log_weights
from torchtree.steps.nuts import NUTSInfo, nuts_init, nuts_step
from torchtree.model.soft_posterior import SoftTreePosterior
from torchtree.samplers.nuts import HMC, NUTS, MCMCResult, NUTSConfig
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
    "HMC", "NUTS", "NUTSConfig", "MCMCResult", "DCC", "DCCConfig", "SoftTreePosterior",
    "lais_log_weights", "chain_covariance", "EvidenceAccumulator",
    "dcc_utility", "exploitation_term", "exploration_term",
    "SoftData", "as_soft_data", "train_test_split",
]
