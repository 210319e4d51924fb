"""Old import paths of the 0.1 layout, kept for one release.

In 0.2 the package was re-layered (model / steps / samplers / faces, see docs/architecture.md).
``import torchtree.topdown`` and the like still work: a meta-path finder answers each old
name with the module at its new place (the same module object, so attributes set on one are
seen through the other) and issues a ``DeprecationWarning`` naming the new path. The
aliases go in 0.3.
"""
from __future__ import annotations

import importlib
import importlib.abc
import importlib.util
import sys
import warnings

__all__ = ["MOVED", "install"]

# old module -> new module
MOVED = {
    "torchtree.validate": "torchtree.core.validate",
    "torchtree.random": "torchtree.core.random",
    "torchtree.resampling": "torchtree.core.resampling",
    "torchtree.checkpoint": "torchtree.io.checkpoint",
    "torchtree.csvio": "torchtree.io.csv",
    "torchtree.diagnostics": "torchtree.model.diagnostics",
    "torchtree.data": "torchtree.model.data",
    "torchtree.trees": "torchtree.model.trees",
    "torchtree.priors": "torchtree.model.priors",
    "torchtree.likelihoods": "torchtree.model.likelihoods",
    "torchtree.posterior": "torchtree.model.posterior",
    "torchtree.tree_model": "torchtree.model.target",
    "torchtree.growth": "torchtree.steps.growth",
    "torchtree.moves": "torchtree.steps.moves",
    "torchtree.topdown": "torchtree.samplers.topdown",
    "torchtree.topdown_dist": "torchtree.samplers.topdown",
    # a subpackage per method, tuning/ for the evidence search and the starts (same deprecation)
    "torchtree.samplers.topdown_dist": "torchtree.samplers.topdown",
    "torchtree.samplers.topdown_particles": "torchtree.samplers.topdown.particles",
    "torchtree.samplers.hyper": "torchtree.samplers.tuning.evidence",
    "torchtree.samplers.topdown_starts": "torchtree.samplers.tuning.starts",
    "torchtree.samplers.soft_chains": "torchtree.samplers.nuts.chains",
    "torchtree.samplers.smc_engine": "torchtree.core.smc",
    "torchtree.mcmc": "torchtree.samplers.mcmc",
    "torchtree.smc_moves": "torchtree.samplers.smc_moves",
    "torchtree.soft.trees": "torchtree.model.soft_trees",
    "torchtree.soft.topology": "torchtree.model.topology",
    "torchtree.soft.inputs": "torchtree.model.soft_data",
    "torchtree.soft.posterior": "torchtree.model.soft_posterior",
    "torchtree.soft.hmc": "torchtree.steps.hmc",
    "torchtree.soft.nuts": "torchtree.steps.nuts",
    "torchtree.soft.nuts_async": "torchtree.steps.nuts_async",
    "torchtree.soft.adaptation": "torchtree.steps.adaptation",
    "torchtree.soft.init": "torchtree.steps.soft_init",
    "torchtree.soft.chains": "torchtree.samplers.nuts.chains",
    "torchtree.soft.sampler": "torchtree.samplers.nuts",
    "torchtree.soft.dcc": "torchtree.samplers.dcc.sampler",
    "torchtree.soft.lais": "torchtree.samplers.dcc.lais",
    "torchtree.soft.utility": "torchtree.samplers.dcc.utility",
    "torchtree.soft.pyro_model": "torchtree.pyro",
}


class _AliasLoader(importlib.abc.Loader):
    def __init__(self, new: str) -> None:
        self.new = new

    def create_module(self, spec):
        warnings.warn(f"{spec.name} moved to {self.new}; the old path goes in torchtree 0.3",
                      DeprecationWarning, stacklevel=2)
        return importlib.import_module(self.new)

    def exec_module(self, module) -> None:
        # the module is already executed at its new place
        pass


class _AliasFinder(importlib.abc.MetaPathFinder):
    def find_spec(self, fullname, path=None, target=None):
        new = MOVED.get(fullname)
        if new is None:
            return None
        return importlib.util.spec_from_loader(fullname, _AliasLoader(new))


def install() -> None:
    """Put the alias finder first on ``sys.meta_path`` (once)."""
    if not any(isinstance(f, _AliasFinder) for f in sys.meta_path):
        sys.meta_path.insert(0, _AliasFinder())
