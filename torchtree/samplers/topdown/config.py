"""The settings of top-down SMC (``TopDownConfig``, with their presets)."""
from __future__ import annotations

from dataclasses import dataclass
from typing import Optional

from torchtree.core.resampling import RESAMPLERS
from torchtree.samplers.presets import (OPTIMAL_MAX_CELLS, PARTICLES_PER_FEATURE, REGRESSION_ISLANDS, SMALL_TABLE_ROWS,
                                        WIDE_MAX_PARTICLES, WIDE_MAX_WORK, Preset, needs_more_particles, optimal_proposal_fits,
                                        wide_table_particles)
from torchtree.samplers.protocol import SamplerConfig, option
from torchtree.steps.growth import PROPOSALS


__all__ = ["TopDownConfig", "EXPANSIONS", "REDISTRIBUTIONS"]


EXPANSIONS = ("node", "layer")
REDISTRIBUTIONS = ("auto", "alltoall", "rotational")


@dataclass(frozen=True)
class TopDownConfig(SamplerConfig):
    """Settings of :class:`TopDownSMC` (see its docstring)."""

    n_particles: int = option(1000, help="particles in total, across islands (and ranks)", low=1, presets=(
        Preset("wide-table", f"a particle tries one feature per node: {PARTICLES_PER_FEATURE} particles per feature "
               f"(thousands, at most {WIDE_MAX_PARTICLES} and {WIDE_MAX_WORK:.0e} rows x particles)",
               lambda v, s: (s.classification and v["proposal"] != "optimal" and not v.given("n_islands")
                             and needs_more_particles(s)),
               lambda v, s: wide_table_particles(s.n_rows, s.n_features, TopDownConfig.n_particles)),))
    n_islands: int = option(1, help="independent filters sharing n_particles equally (must divide it)", low=1, presets=(
        Preset("regression-islands", f"{REGRESSION_ISLANDS} independent filters: one regression filter collapses "
               "onto few distinct trees", lambda v, s: s.regression and v["n_particles"] % REGRESSION_ISLANDS == 0,
               REGRESSION_ISLANDS),))
    proposal: str = option("prior", help="how a node's split is proposed", choices=PROPOSALS, presets=(
        Preset("small-classification", f"every cut scored: nearly perfect weights, affordable below "
               f"{SMALL_TABLE_ROWS} rows and {OPTIMAL_MAX_CELLS} rows x features x classes / 2",
               lambda v, s: optimal_proposal_fits(s), "optimal"),))
    expansion: str = option("node", help="one node per stage (breadth-first) or a whole layer", choices=EXPANSIONS)
    resampling: str = option("multinomial", help="resampling scheme", choices=tuple(RESAMPLERS))
    ess_threshold: float = option(0.1, help="resample an island when its ESS < ess_threshold x its particles",
                                  low=0.0, high=1.0)
    use_likelihood: bool = option(True, help="False samples the prior (labels ignored)")
    device: Optional[str] = option(None, help="torch device (None: the data's; 'auto': CUDA if present)",
                                   result=False)
    redistribution: str = option("auto", help="how resampled particles move between ranks",
                                 choices=REDISTRIBUTIONS, result=False)
    max_stages: int = option(100000, help="safety bound on the number of stages", low=1, result=False)
    max_memory_bytes: Optional[int] = option(None, help="bound on the node table: node records, their statistics and "
                                             "the node-data pool (bytes)", low=1, result=False)
    checkpoint: Optional[str] = option(None, help="checkpoint file (resume when it exists)", result=False)
    checkpoint_every: int = option(1, help="save after every k-th stage", low=1, result=False)

    def check(self) -> None:
        if self.n_particles % self.n_islands:
            raise ValueError(f"n_islands ({self.n_islands}) must be >= 1 and divide n_particles ({self.n_particles})")
