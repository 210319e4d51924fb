"""What a DCC run holds: its set-up objects (:class:`DCCSetup`), its state between two iterations
(:class:`DCCState`) and the state's checkpoint form (``state_dict``), which the sampler
(:mod:`torchtree.samplers.dcc.sampler`) reads back in ``DCC.restore``."""
from __future__ import annotations

import random as _pyrandom
from dataclasses import dataclass
from typing import Any, Dict, Tuple

import torch

from torchtree.model.topology import Topology
from torchtree.samplers.dcc.lais import EvidenceAccumulator
from torchtree.samplers.dcc.records import Record, record_state
from torchtree.samplers.protocol import SamplerState

__all__ = ["DCCSetup", "DCCState", "new_stats"]


@dataclass(frozen=True)
class DCCSetup:
    """A DCC run's objects.

    Set up before the seed is known: ``hyper`` (the soft-tree hyperparameters resolved on the data),
    ``informed`` (``init="data"``), ``h_start`` (the warm-up's first split sharpness), ``cpu0`` (the
    process's CPU time at the start), ``before`` ((wall, cpu) seconds of earlier segments of a resumed
    run), ``schedule`` / ``warm_schedule`` (the sharpness of each warm-up iteration, fresh and
    warm-started). Settled in ``DCC.init`` / ``restore`` (a copy replaces ``ctx.setup``): the rows
    fitted ``rows`` = (used, total), ``n_warmup`` / ``n_warmup_warm`` (the planner may shorten them,
    with their schedules and, on a row subset, ``hyper``), and ``n_discovered`` (topologies known at
    the start).
    """

    hyper: Any
    informed: bool
    h_start: float
    cpu0: float
    before: Tuple[float, float]
    schedule: Any
    warm_schedule: Any
    n_warmup: int
    n_warmup_warm: int
    rows: Tuple[int, int]
    n_discovered: int = 0


def new_stats() -> Dict[str, int]:
    """The run's counters; ``warmups_cut`` / ``visits_cut``: topologies whose warm-up or
    refinement the time budget cut (left out, see :meth:`DCC._activate_batch`)."""
    return dict.fromkeys(("nuts_iterations", "divergences", "transitions", "grad_evals", "warmups", "warmups_cut", "visits_cut"), 0)


@dataclass
class DCCState(SamplerState):
    """DCC between two iterations.

    Attributes
    ----------
    step : int, the next iteration (= iterations done)
    done : bool, ``step >= n_iterations``
    records : dict Topology -> Record, every discovered topology
    evidence : EvidenceAccumulator, LAIS evidence per active topology (row ``Record.slot``)
    generator : torch.Generator on the run's device (NUTS, LAIS, prior draws of new chains)
    bookkeeping : torch.Generator on the CPU (warm-start resampling)
    rng : random.Random (topology proposals)
    hmc_step : int, NUTS iterations run so far (the step of the ``hmc/...`` monitor tags)
    stats : dict of counters (divergences, grad_evals, warmups, ...)
    rows_used : int, the training rows the run fits (``max_rows``, :mod:`torchtree.samplers.dcc.rows`)
    warmup_used : int, a new topology's warm-up iterations (``n_warmup``, or fewer: ``rows``)
    elapsed_budget, elapsed_wall, elapsed_cpu : float, seconds of the budget's clock, of
        wall time and of CPU time spent by the run so far (all segments)
    """

    step: int
    done: bool
    records: Dict[Topology, Record]
    evidence: EvidenceAccumulator
    generator: torch.Generator
    bookkeeping: torch.Generator
    rng: _pyrandom.Random
    hmc_step: int
    stats: Dict[str, int]
    elapsed_budget: float = 0.0
    elapsed_wall: float = 0.0
    elapsed_cpu: float = 0.0
    rows_used: int = 0
    warmup_used: int = 0

    def state_dict(self) -> Dict[str, Any]:
        """Everything the loop needs to go on, as plain tensors and containers."""
        version, internal, gauss = self.rng.getstate()
        return {
            "iteration": int(self.step) - 1,  # the last iteration done
            "records": [record_state(r) for r in self.records.values()],
            "evidence": {name: getattr(self.evidence, name).cpu() for name in EvidenceAccumulator._FIELDS},
            "generator": self.generator.get_state().cpu(), "bookkeeping_generator": self.bookkeeping.get_state(),
            "python_random": [int(version), [int(v) for v in internal], gauss],
            "hmc_step": int(self.hmc_step), "stats": dict(self.stats),
            "elapsed_budget": float(self.elapsed_budget), "elapsed_wall": float(self.elapsed_wall),
            "elapsed_cpu": float(self.elapsed_cpu), "rows_used": int(self.rows_used), "warmup_used": int(self.warmup_used),
        }

