"""What a BART run holds: its set-up objects (``BARTSetup``) and its chains between sweeps (``BARTState``, what a checkpoint saves)."""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Callable, List, Optional, Tuple

import torch

from torchtree.samplers.protocol import TRANSIENT, SamplerState


__all__ = ["BARTSetup", "BARTState"]


@dataclass
class BARTState(SamplerState):
    """A sweep's state; trees are ``[T, C, K]`` heap arrays, points' leaves ``[T, C, N]``, residuals and
    latents ``[C, N]``, ``C`` this rank's forests (chains x utilities, :class:`BARTSetup`)."""

    step: int
    done: bool
    feature: torch.Tensor
    cut: torch.Tensor
    value: torch.Tensor
    leaf_of: torch.Tensor
    resid: torch.Tensor
    sigma2: torch.Tensor
    latent: torch.Tensor
    counts: torch.Tensor  # [2, 3] proposed / accepted per move type (grow, prune, change)
    kept: List[Tuple[torch.Tensor, torch.Tensor, torch.Tensor]]  # per kept sweep: [C, T, K'] trees
    kept_sigma: List[torch.Tensor]  # per kept sweep: [C]
    trace_leaves: List[torch.Tensor]  # per sweep: [C] mean leaves per tree
    #: ``forest_stats`` of the trees as they are (the last sweep's), where the compiled kernels computed them
    forest_stats: Optional[torch.Tensor] = field(default=None, metadata=TRANSIENT)


@dataclass(frozen=True)
class BARTSetup:
    """A BART run's objects.

    Attributes
    ----------
    prior : BartPrior, calibrated on the data; grid : CutGrid, the cut grid
    Xb : int Tensor [N, D], each point's bin per feature; n_cuts : LongTensor [D], cuts per feature
    dt : torch.dtype of the leaf values and residuals; target : Tensor [N], the standardised
        response (regression) or the labels (classification)
    chains : LongTensor [n_local], this rank's global chain indices
    n_utilities : int, forests per chain: 1 (regression, two classes), or ``K - 1`` for ``K >= 3``
        classes (multinomial probit: a latent utility per class but the reference class 0)
    instances : LongTensor [n_local * n_utilities], this rank's global forest indices
        (``chain * n_utilities + utility``; the chains themselves when ``n_utilities == 1``): the
        chain axis of the trees, residuals and latents, and the keys of their random draws
    offsets : Tensor [n_utilities] float64, the utilities' offsets (multinomial probit), or None
    update_fn : the tree update (``tree_update``, or its compiled form); pg_level_fn : the Particle
        Gibbs level update's compiled form, or None (eager)
    groups : LongTensor [D] or None, the input column of each feature of a coded table
    n_warmup : int, burn-in sweeps per chain (``BARTConfig.n_warmup`` as resolved for the run)
    n_gfr : int, the grow-from-root sweeps opening them (0 where the compiled kernels do not run)
    graph : :class:`~torchtree.samplers.bart.graph.SweepGraph` or None, the sweeps' tree updates as a
        recorded CUDA graph (``compile="graph"``)
    """

    prior: Any
    grid: Any
    Xb: torch.Tensor
    n_cuts: torch.Tensor
    dt: torch.dtype
    target: torch.Tensor
    chains: torch.Tensor
    update_fn: Callable
    pg_level_fn: Optional[Callable]
    n_utilities: int = 1
    instances: Optional[torch.Tensor] = None
    offsets: Optional[torch.Tensor] = None
    groups: Optional[torch.Tensor] = None
    n_warmup: int = 0
    n_gfr: int = 0
    graph: Optional[Any] = None
