"""torchtree: Bayesian decision trees as batched PyTorch tensors.

Samplers: top-down SMC (paper 001), MCMC and SMC with grow/prune/change/swap
moves (paper 002), soft trees with HMC/NUTS and DCC-Tree (paper 004), and BART
(sums of trees; Chipman, George & McCulloch 2010).

References
----------
The docstrings cite the three papers the project implements by number, with their
equation and algorithm numbers:

- paper 001: B. Lakshminarayanan, D. M. Roy and Y. W. Teh, "Top-down particle
  filtering for Bayesian decision trees", ICML 2013.
- paper 002: E. Drousiotis, A. M. Varsi, A. M. Phillips, P. G. Spirakis and
  S. Maskell, parallel SMC samplers for Bayesian decision trees on shared and
  distributed memory (SMC with grow / prune / change / swap proposals, MCMC
  baselines, O(log2 N) redistribution).
- paper 004: J. A. Cochrane, A. Wills and S. J. Johnson, "Divide, Conquer, Combine
  Bayesian Decision Tree Sampling" (DCC-Tree).
"""

from torchtree._version import __version__
from torchtree import _aliases

_aliases.install()  # old module paths (torchtree.topdown, ...) answer for one release, with a warning

from torchtree.model.data import Data
from torchtree.model.trees import HardTrees
from torchtree.model.priors import ChipmanPrior, PoissonPrior
from torchtree.model.likelihoods import DirichletMultinomial, NormalInverseGamma
from torchtree.model.likelihood_protocol import LeafLikelihood, register_likelihood
from torchtree.model.posterior import TreePosterior
from torchtree.model.posterior_base import Posterior
from torchtree.model.loading import load_posterior
from torchtree.monitor import Monitor, MonitorList, ProgressMonitor, TensorBoardMonitor, TraceMonitor
from torchtree.core.resampling import ess, multinomial, residual, stratified, systematic
from torchtree.samplers.topdown import TopDownSMC
from torchtree.samplers.mcmc import MCMC
from torchtree.samplers.smc_moves import SMCSampler
from torchtree.estimators import BayesianTreeClassifier, BayesianTreeRegressor, register_method
from torchtree.core.budget import memory_budget, set_memory_budget
from torchtree.core.warn import ConvergenceWarning
from torchtree._sklearn import InconsistentVersionWarning

from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:  # what the lazy names below are, for type checkers and IDEs (nothing is imported at run time)
    from torchtree.soft import DCC, HMC, NUTS, SoftTreePosterior, SoftTrees
    from torchtree.samplers.bart import BART
    from torchtree.model.bart_posterior import BARTPosterior

# The soft-tree family is imported on first use (it is the heaviest part).
_LAZY = {
    "SoftTrees": "torchtree.soft",
    "HMC": "torchtree.soft",
    "NUTS": "torchtree.soft",
    "DCC": "torchtree.soft",
    "SoftTreePosterior": "torchtree.soft",
    "BART": "torchtree.samplers.bart",
    "BARTPosterior": "torchtree.model.bart_posterior",
}


def __getattr__(name: str) -> Any:
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
    "LeafLikelihood",
    "register_likelihood",
    "TreePosterior",
    "Posterior",
    "load_posterior",
    "Monitor",
    "MonitorList",
    "ProgressMonitor",
    "TensorBoardMonitor",
    "TraceMonitor",
    "TopDownSMC",
    "MCMC",
    "SMCSampler",
    "BART",
    "BARTPosterior",
    "SoftTrees",
    "HMC",
    "NUTS",
    "DCC",
    "SoftTreePosterior",
    "BayesianTreeClassifier",
    "BayesianTreeRegressor",
    "register_method",
    "set_memory_budget",
    "memory_budget",
    "multinomial",
    "systematic",
    "stratified",
    "residual",
    "ess",
    "ConvergenceWarning",
    "InconsistentVersionWarning",
]
