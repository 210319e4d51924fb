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
    "multinomial",
    "systematic",
    "stratified",
    "residual",
    "ess",
]
