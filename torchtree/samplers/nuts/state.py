"""What a NUTS / HMC run holds between iterations (``NUTSState``) and what ``sample`` returns (``MCMCResult``)."""
from __future__ import annotations

from dataclasses import dataclass
from typing import NamedTuple, Optional

import torch

from torchtree.model.soft_trees import SoftTrees
from torchtree.samplers.protocol import SamplerState
from torchtree.samplers.nuts.chains import ChainState, SampleTrace


__all__ = ["MCMCResult", "NUTSState"]


class MCMCResult(NamedTuple):
    """Output of :meth:`NUTS.sample` / :meth:`HMC.sample`.

    Attributes
    ----------
    samples : Tensor [S, B, P], kept draws (``S = n_samples``)
    trace : SampleTrace, per-draw diagnostics
    chains : ChainState, final state with adapted step sizes and inverse masses
    warmup_stats : dict, of warm-up: ``accept_prob`` (Tensor [B], mean over the terminal buffer),
        ``divergences`` (LongTensor [B]), ``iterations`` (int, iterations run) and ``completed``
        (bool, all ``n_warmup`` ran; False when a time budget cut it)
    seconds : float, wall time
    """

    samples: torch.Tensor
    trace: SampleTrace
    chains: ChainState
    warmup_stats: dict
    seconds: float


@dataclass
class NUTSState(SamplerState):
    """A soft-tree NUTS / HMC run: ``step`` 0 before warm-up, 1 before sampling, 2 done.

    Attributes
    ----------
    model : SoftTrees, the batch of ``n_chains`` trees of one topology
    generator : torch.Generator on the run's device
    position : Tensor [C, P], the starting positions (before warm-up)
    chains : ChainState or None, the adapted chains (after warm-up)
    warmup_stats : dict or None, of warm-up: ``accept_prob [C]``, ``divergences [C]``, ``iterations``
        (int) and ``completed`` (bool), as :attr:`MCMCResult.warmup_stats`
    trace : SampleTrace or None, the kept draws ``[S, C, P]`` (after sampling)
    """

    step: int
    done: bool
    model: SoftTrees
    generator: torch.Generator
    position: torch.Tensor
    chains: Optional[ChainState] = None
    warmup_stats: Optional[dict] = None
    trace: Optional[SampleTrace] = None
