"""The settings of SMC with moves (``SMCSamplerConfig``, with their presets) and its named random streams."""
from __future__ import annotations

import enum
from dataclasses import dataclass
from typing import Optional, Tuple, Union

from torchtree.core.resampling import RESAMPLERS
from torchtree.distributed import METHODS as REDISTRIBUTION_METHODS
from torchtree.model.priors import ChipmanPrior, make_prior
from torchtree.samplers.presets import Preset, optimal_proposal_fits
from torchtree.samplers.protocol import SamplerConfig, option
from torchtree.steps.moves import CUT_PROPOSALS, check_move_probs

__all__ = ["SMCSamplerConfig", "Stream"]


class Stream(enum.IntEnum):
    """SMC with moves' random streams: ``derive_seed(run seed, stream, ...)`` seeds each (fixed values)."""

    PRIOR_START = 1  #: the initial particles drawn from q_0
    MOVES = 2  #: every iteration's move type, cut and acceptance uniforms, keyed by particle and iteration
    RESAMPLING = 3  #: the resampling generator of each iteration (``derive_seed(seed, RESAMPLING, step)``)
    TOPDOWN_START = 4  #: ``init_prior="topdown"``: the top-down run and the draws from it


@dataclass(frozen=True)
class SMCSamplerConfig(SamplerConfig):
    """Settings of :class:`SMCSampler` (see its docstring)."""

    n_particles: int = option(1024, help="N, particles over all ranks (a multiple of the number of ranks)", low=1)
    n_iterations: int = option(10, help="K, move-reweight-resample iterations", low=0)
    move_probs: Tuple[float, float, float, float] = option(
        (0.25, 0.25, 0.25, 0.25), help="probabilities of grow, prune, change, swap (normalised)")
    resampling: str = option("multinomial", help="resampling scheme", choices=tuple(RESAMPLERS))
    ess_threshold: float = option(0.5, help="resample when ESS < ess_threshold x n_particles (paper: 0.5)",
                                  low=0.0, high=1.0)
    mh_step: bool = option(False, help="resample-move variant: accept/reject every proposal with the MH ratio "
                                       "(weights then stay constant after the initial step)", presets=(
        Preset("well-weighted-start", "from a top-down start that is already well weighted (regression, small "
               "classification tables) reweighting after each move collapses the particles onto a few trees",
               lambda v, s: not v["tempering"] and (s.regression or optimal_proposal_fits(s)), True),))
    use_likelihood: bool = option(True, help="False targets the prior (labels ignored)")
    init_prior: Optional[Union[str, ChipmanPrior]] = option(
        None, help="initial proposal q_0: 'chipman' (in Python also a ChipmanPrior; default: the target's "
                   "Chipman prior, or ChipmanPrior() for a Poisson target), or 'topdown': draws from a top-down "
                   "SMC run on the same model (big data)", presets=(
        Preset("topdown-start", "particles drawn from the prior stay far below the posterior's trees in 10 "
               "iterations", lambda v, s: s.prior == "chipman" and not v["tempering"], "topdown"),))
    tempering: bool = option(False, help="likelihood tempering from power 0 to 1 with MH moves, instead of "
                                         "reweighting by eq. 5b")
    device: Optional[str] = option(None, help="torch device (None: the data's; 'auto': CUDA if present)",
                                   result=False)
    redistribution: str = option("auto", help="how resampled particles travel between ranks (same result for all)",
                                 choices=tuple(REDISTRIBUTION_METHODS), result=False)
    checkpoint: Optional[str] = option(None, help="checkpoint file (resume when it exists)", result=False)
    checkpoint_every: int = option(1, help="save after every k-th iteration", low=1, result=False)
    cut_proposal: str = option("informed", help="how grow / change moves draw a cut: uniform on the node's range "
                                                "(prior), among the gaps between distinct values (data), or one of "
                                                "16 cells by the likelihood of the split (informed)",
                               choices=CUT_PROPOSALS)
    max_bins: Optional[int] = option(None, help="rank each feature into at most max_bins quantile bins and cut only "
                                                "between bins: a change of the split prior (cuts uniform over the "
                                                "grid's range, not the data's), for large data; None: the data "
                                                "(the paper's model)", low=2)

    def check(self) -> None:
        object.__setattr__(self, "move_probs", check_move_probs(self.move_probs))
        if self.init_prior == "topdown" and self.tempering:
            raise ValueError("init_prior='topdown' starts at posterior draws, tempering at the prior: use one")
        ip = self.init_prior if self.init_prior != "topdown" else None
        ip = make_prior(ip) if isinstance(ip, str) else ip
        if ip is not None and getattr(ip, "name", None) != "chipman":
            raise ValueError("init_prior must be a ChipmanPrior (the initial proposal must be easy to sample)")
