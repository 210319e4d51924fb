"""What an SMC-with-moves run holds: its set-up objects (``SMCSamplerSetup``) and its state between iterations
(``SMCSamplerState``, what a checkpoint saves)."""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Dict, List, Optional

import torch

from torchtree.model.trees import HardTrees
from torchtree.samplers.protocol import SamplerState
from torchtree.steps.moves import TreeModel, TreeState

__all__ = ["SMCSamplerSetup", "SMCSamplerState"]


@dataclass(frozen=True)
class SMCSamplerSetup:
    """An SMC-with-moves run's objects: the ``likelihood``, the target ``model`` (TreeModel), the
    ``backend`` of the exact reductions (a ``LocalBackend`` on one process), this rank's ``n_local``
    particles and their global indices ``gidx`` [n_local], and whether the run is ``tempered``."""

    likelihood: Any
    model: TreeModel
    backend: Any
    n_local: int
    gidx: torch.Tensor
    tempered: bool


@dataclass
class SMCSamplerState(SamplerState):
    """This rank's share of an SMC-with-moves run between two iterations.

    Attributes
    ----------
    step : int, the next iteration
    done : bool, all ``n_iterations`` ran
    particles : TreeState [n] (this rank's ``n = n_particles / world_size`` trees with their caches)
    logw : float64 Tensor [n], log-weights
    ll : float64 Tensor [n] or None, each tree's log-likelihood (tempering only)
    log_z : float, log evidence so far
    phi : float, the likelihood power (1 without tempering)
    n_resample : int, resampling steps so far (with ``mh_step=True``, the resampling of the initial importance
        sample included, which no step reports as ``smc/resampled``)
    moved, ess, phis : lists of floats, per iteration: fraction of particles moved, ESS
        (and the initial ESS first, without tempering), likelihood power
    """

    step: int
    done: bool
    particles: TreeState
    logw: torch.Tensor
    ll: Optional[torch.Tensor]
    log_z: float
    phi: float
    n_resample: int
    moved: List[float]
    ess: List[float]
    phis: List[float]

    def state_dict(self) -> Dict[str, Any]:
        return {"iteration": int(self.step) - 1, "done": bool(self.done),
                "trees": {key: v.detach().cpu() for key, v in self.particles.trees.as_dict().items()},
                "logw": self.logw.detach().cpu(), "ll": None if self.ll is None else self.ll.detach().cpu(),
                "n_resample": int(self.n_resample), "log_z": float(self.log_z), "phi": float(self.phi),
                "moved": [float(v) for v in self.moved], "ess": [float(v) for v in self.ess],
                "phis": [float(v) for v in self.phis]}

    @classmethod
    def from_state_dict(cls, saved: Dict[str, Any], device=None) -> "SMCSamplerState":
        return cls(step=int(saved["iteration"]) + 1, done=bool(saved["done"]),
                   particles=TreeState(HardTrees.from_dict({k: v.to(device) for k, v in saved["trees"].items()})),
                   logw=saved["logw"].to(device), ll=None if saved["ll"] is None else saved["ll"].to(device),
                   log_z=saved["log_z"], phi=saved["phi"], n_resample=saved["n_resample"],
                   moved=list(saved["moved"]), ess=list(saved["ess"]), phis=list(saved["phis"]))
