"""What a top-down SMC run holds: its set-up objects (``TopDownSetup``) and its particles between stages (``TopDownState``, what a checkpoint saves)."""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Dict

import torch

from torchtree.samplers.protocol import SamplerState
from torchtree.steps.growth import GrowthState


__all__ = ["TopDownSetup", "TopDownState"]


@dataclass(frozen=True)
class TopDownSetup:
    """A top-down SMC run's objects: the ``likelihood`` and the rank ``layout`` (``"single"``,
    ``"islands"`` or ``"gathered"``, see :mod:`torchtree.samplers.topdown`)."""

    likelihood: Any
    layout: str


@dataclass
class TopDownState(SamplerState):
    """A top-down SMC run between two stages.

    Attributes
    ----------
    step : int, the next stage
    done : bool, no open node is left
    particles : GrowthState (rows of node uids ``[P, C]``, ``n_nodes [P]``)
    logw : Tensor [P] float64, island-major log-weights
    logz : Tensor [I] float64, each island's log-evidence so far
    n_resample, resample_steps : int, islands resampled / stages with a resampling
    resample_seconds : float
    grower : Grower, the node table the particles point into (saved with them)
    layout : {"single", "islands", "gathered"}, how the particles are laid out over ranks
        (see :mod:`torchtree.samplers.topdown`); ``logw`` is this rank's ``[P / W]`` in
        ``"islands"`` (with ``logz`` its ``[I / W]`` islands), the global ``[P]`` otherwise
    received : int, particles this rank received from other ranks
    """

    step: int
    done: bool
    particles: GrowthState
    logw: torch.Tensor
    logz: torch.Tensor
    n_resample: int
    resample_steps: int
    resample_seconds: float
    grower: Any
    layout: str = "single"
    received: int = 0

    def state_dict(self) -> Dict[str, Any]:
        return {"stage": self.step, "done": self.done, "logw": self.logw.clone(), "logz": self.logz.clone(),
                "n_resample": self.n_resample, "resample_steps": self.resample_steps,
                "growth": self.grower.state_dict(self.particles)}
