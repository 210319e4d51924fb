"""The settings of the NUTS / HMC samplers (``NUTSConfig``)."""
from __future__ import annotations

from dataclasses import dataclass
from typing import Optional

import torch

from torchtree.core.validate import check_float_dtype
from torchtree.model.soft_data import FLOAT_DTYPES
from torchtree.model.soft_trees import SoftTreeHyper
from torchtree.model.topology import Topology
from torchtree.samplers.protocol import SamplerConfig, option
from torchtree.steps.soft_init import INIT_MODES


__all__ = ["NUTSConfig", "ASYNC_DEFAULT", "soft_tree_option"]


ASYNC_DEFAULT = False


def soft_tree_option(name: str):
    """The option of a soft-tree hyperparameter setting, shared by NUTS's and DCC's configs (one help text)."""
    table = {
        "hyper": dict(help="soft-tree prior and likelihood hyperparameters (alpha, split_concentration, "
                           "signed_splits override it)", cli=False),
        "alpha": dict(help="Dirichlet-multinomial total concentration (default: the number of classes, or "
                           "hyper's value)", low=0.0, low_open=True),
        "split_concentration": dict(help="Dirichlet prior of split weights (default: 1, or hyper's value)",
                                    low=0.0, low_open=True),
        "signed_splits": dict(help="splits weigh the inputs and their mirror images 1 - x, so either sign (not in "
                                   "the paper; default: off, or hyper's value)"),
    }
    return option(None, **table[name])


@dataclass(frozen=True)
class NUTSConfig(SamplerConfig):
    """Settings of :class:`NUTS` and :class:`HMC` (their docstring says more on a few).

    A frozen dataclass: ``NUTS(**settings)`` builds one and exposes its fields as attributes;
    its option table (rendered in the API reference) lists every setting with its default,
    allowed values and help. Construction checks every value against its bounds and choices.

    Raises
    ------
    ValueError
        A setting out of its bounds or choices, a topology without a split, or
        ``evidence=True`` with ``n_samples < 2``.
    """

    n_chains: int = option(4, help="chains, sampled in one batch", low=1)
    n_samples: int = option(500, help="kept draws per chain", low=1)
    n_warmup: int = option(500, help="warm-up (adaptation) iterations", low=0)
    thin: int = option(1, help="keep every thin-th draw", low=1)
    depth: int = option(2, help="depth of the full tree sampled when no topology is given", low=1)
    topology: Optional[Topology] = option(None, help="the topology: a Topology or its internal node ids "
                                          "(default: the full tree of depth)", cli=False)
    sharpness: float = option(0.05, help="split sharpness h of the target", low=0.0, low_open=True)
    h_init: Optional[float] = option(None, help="split sharpness at the start of the warm-up, annealed to "
                                     "sharpness (default: no annealing)", low=0.0, low_open=True)
    max_tree_depth: int = option(10, help="NUTS trajectory depth cap", low=1)
    target_accept: float = option(0.8, help="acceptance rate the step-size adaptation aims at",
                                  low=0.0, high=1.0, low_open=True, high_open=True)
    max_energy_error: float = option(1000.0, help="energy error that marks a divergent transition",
                                     low=0.0, low_open=True)
    hyper: Optional[SoftTreeHyper] = soft_tree_option("hyper")
    alpha: Optional[float] = soft_tree_option("alpha")
    split_concentration: Optional[float] = soft_tree_option("split_concentration")
    signed_splits: Optional[bool] = soft_tree_option("signed_splits")
    evidence: bool = option(False, help="estimate the topology's log evidence with LAIS after sampling")
    n_proposals: int = option(5, help="LAIS pseudo-samples per draw", low=1)
    device: Optional[str] = option(None, help="torch device (default: the data's; 'auto': CUDA if present)",
                                   result=False)
    dtype: torch.dtype = option(torch.float32, help="float dtype of the scaled inputs and the parameters",
                                choices=FLOAT_DTYPES,
                                check=check_float_dtype)
    n_leapfrog: int = option(10, help="leapfrog steps per HMC iteration (HMC only)", low=1)
    compile: bool = option(False, help="run the potential (lockstep NUTS: each leapfrog step) through "
                           "torch.compile, compiled once per process and tree depth")
    asynchronous: bool = option(ASYNC_DEFAULT, help="NUTS sampling phase with every chain at its own pace "
                                "(warm-up stays in lockstep)")
    init: str = option("prior", help="where the chains start: prior draws, or splits fitted to the data "
                       "(then the warm-up runs at sharpness)", choices=INIT_MODES)

    def check(self) -> None:
        if self.topology is not None:
            object.__setattr__(self, "topology", Topology.coerce(self.topology))
        if self.tree_topology().n_internal == 0:
            raise ValueError("the topology needs at least one split (depth >= 1)")
        if self.evidence and self.n_samples < 2:
            raise ValueError(f"evidence=True needs n_samples >= 2 (LAIS builds its proposals from the draws), "
                             f"got n_samples={self.n_samples}")

    def tree_topology(self) -> Topology:
        """``topology``, or the full tree of ``depth``."""
        return self.topology if self.topology is not None else Topology.coerce(self.depth)

    def soft_hyper(self) -> SoftTreeHyper:
        """``hyper`` with the ``alpha`` / ``split_concentration`` / ``signed_splits`` overrides."""
        return SoftTreeHyper.with_overrides(self.hyper, alpha=self.alpha, split_concentration=self.split_concentration,
                                            signed_splits=self.signed_splits)
