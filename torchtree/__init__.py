"""torchtree: Bayesian decision trees as batched PyTorch tensors.

Samplers: top-down SMC (paper 001), MCMC and SMC with grow/prune/change/swap
moves (paper 002), soft trees with HMC/NUTS and DCC-Tree (paper 004).
"""

__version__ = "0.1.0"

from .data import Data
from .trees import HardTrees
from .priors import ChipmanPrior, PoissonPrior
from .likelihoods import DirichletMultinomial, NormalInverseGamma
from .posterior import TreePosterior
from .monitor import Monitor, MonitorList, ProgressMonitor, TensorBoardMonitor, TraceMonitor
from .resampling import ess, multinomial, residual, stratified, systematic
from .topdown import TopDownSMC
from .mcmc import MCMC
from .smc_moves import SMCSampler
from .estimators import BayesianTreeClassifier, BayesianTreeRegressor, register_method

# The soft-tree family is imported on first use (it is the heaviest part).
_LAZY = {
    "SoftTrees": "torchtree.soft",
    "HMC": "torchtree.soft",
    "NUTS": "torchtree.soft",
    "DCC": "torchtree.soft",
    "SoftTreePosterior": "torchtree.soft",
}


def __getattr__(name):
    if name in _LAZY:
        import importlib

        return getattr(importlib.import_module(_LAZY[name]), name)
    raise AttributeError(f"module 'torchtree' has no attribute {name!r}")


__all__ = [
    "Data",
    "HardTrees",
    "ChipmanPrior",
    "PoissonPrior",
    "DirichletMultinomial",
    "NormalInverseGamma",
    "TreePosterior",
    "Monitor",
    "MonitorList",
    "ProgressMonitor",
    "TensorBoardMonitor",
    "TraceMonitor",
    "TopDownSMC",
    "MCMC",
    "SMCSampler",
    "SoftTrees",
    "HMC",
    "NUTS",
    "DCC",
    "SoftTreePosterior",
    "BayesianTreeClassifier",
    "BayesianTreeRegressor",
    "register_method",
    "multinomial",
    "systematic",
    "stratified",
    "residual",
    "ess",
]
