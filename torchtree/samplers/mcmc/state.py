"""What an MCMC run holds: its set-up objects (``MCMCSetup``) and its chains between iterations (``MCMCState``, ``HostMCMCState``: what a checkpoint saves)."""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Callable, Dict, List

import numpy as np
import torch

from torchtree.model.trees import HardTrees
from torchtree.samplers.protocol import SamplerState
from torchtree.steps.host_moves import HostChain, pack_snapshots, unpack_snapshots
from torchtree.model.tree_storage import compact_trees, expand_trees, is_compact
from torchtree.steps.moves import TreeModel, TreeState


__all__ = ["MCMCSetup", "MCMCState", "HostMCMCState", "HostRecord"]


@dataclass(frozen=True)
class MCMCSetup:
    """An MCMC run's objects.

    Attributes
    ----------
    likelihood : the leaf model
    model : TreeModel, the target (prior x likelihood on the run's data)
    host : bool, the host engine runs (each chain in numpy, one after another) instead of the batched one
    chains : LongTensor [n_local], this rank's global chain indices
    uniforms : list, the block of keyed uniforms in use (``[(first iteration, uniforms)]``; filled by
        the steps, so that a block is drawn once)
    """

    likelihood: Any
    model: TreeModel
    host: bool
    chains: torch.Tensor
    uniforms: list = field(default_factory=list)


@dataclass
class MCMCState(SamplerState):
    """The batched chains between two iterations.

    Attributes
    ----------
    step : int, the next iteration
    done : bool, every iteration ran
    chains : TreeState [P] (the trees with the moves' per-node caches)
    proposed, accepted : LongTensor [4], moves per type (grow, prune, change, swap)
    kept : list of HardTrees, the draws kept for prediction (concatenated at saves and at the end)
    trace_leaves : list of LongTensor [P], every chain's number of leaves at each recorded draw
    trace_lp : list of float64 Tensor [P], every chain's log posterior at each recorded draw
    """

    step: int
    done: bool
    chains: TreeState
    proposed: torch.Tensor
    accepted: torch.Tensor
    kept: List[HardTrees]
    trace_leaves: List[torch.Tensor]
    trace_lp: List[torch.Tensor]

    def state_dict(self) -> Dict[str, Any]:
        if len(self.kept) > 1:  # concatenating in pieces gives the same trees as at the end, and saves stay O(new)
            self.kept[:] = [HardTrees.cat(self.kept)]
        return {"step": int(self.step), "done": bool(self.done),
                "trees": {k: v.clone() for k, v in self.chains.trees.as_dict().items()},
                "proposed": self.proposed.clone(), "accepted": self.accepted.clone(),
                "kept": compact_trees(self.kept[0], stride=self.chains.trees.n_trees) if self.kept else None,
                "trace_leaves": torch.stack(self.trace_leaves) if self.trace_leaves else None,
                "trace_lp": torch.stack(self.trace_lp) if self.trace_lp else None}

    @classmethod
    def from_state_dict(cls, saved: Dict[str, Any], device=None) -> "MCMCState":
        def trace(t):
            return [] if t is None else list(t.to(device).unbind(0))

        return cls(step=int(saved["step"]), done=bool(saved["done"]),
                   chains=TreeState(HardTrees.from_dict(saved["trees"]).to(device)),
                   proposed=saved["proposed"].to(device), accepted=saved["accepted"].to(device),
                   kept=[] if saved["kept"] is None else [_kept_trees(saved["kept"]).to(device)],
                   trace_leaves=trace(saved["trace_leaves"]), trace_lp=trace(saved["trace_lp"]))


def _kept_trees(saved) -> HardTrees:
    """The kept draws of a checkpoint: compact (deduplicated runs) or, from older files, plain."""
    return expand_trees(saved) if is_compact(saved) else HardTrees.from_dict(saved)


@dataclass
class HostRecord:
    """One host chain between two iterations, and what it has kept.

    Attributes
    ----------
    chain : HostChain (its arrays are the state; ``chain.state_dict()``)
    proposed, accepted : int64 ndarray [4], moves per type
    snaps : list of snapshot tuples, the distinct consecutive kept trees
    counts : list of
        int, how many kept iterations each stands for
    trace_leaves : list of int
    trace_lp : list of float (one per recorded draw)
    version : int, accepted moves so far
    snap_version : int, ``version`` of the last snapshot
    """

    chain: HostChain
    proposed: np.ndarray
    accepted: np.ndarray
    snaps: list
    counts: List[int]
    trace_leaves: List[int]
    trace_lp: List[float]
    version: int
    snap_version: int

    @classmethod
    def start(cls, chain: HostChain) -> "HostRecord":
        """A loaded chain with nothing kept yet."""
        return cls(chain=chain, proposed=np.zeros(4, np.int64), accepted=np.zeros(4, np.int64), snaps=[], counts=[],
                   trace_leaves=[], trace_lp=[], version=0, snap_version=-1)

    @classmethod
    def from_state_dict(cls, saved: Dict[str, Any], chain: HostChain) -> "HostRecord":
        """Rebuild from :meth:`state_dict`; ``chain``: a fresh HostChain of the run's model and
        move probabilities (the arrays are loaded into it)."""
        chain.load_state_dict(saved["chain"])
        return cls(chain=chain, proposed=saved["proposed"].numpy().copy(), accepted=saved["accepted"].numpy().copy(),
                   snaps=unpack_snapshots(saved["snaps"]), counts=list(saved["counts"]),
                   trace_leaves=list(saved["trace_leaves"]), trace_lp=list(saved["trace_lp"]),
                   version=int(saved["version"]), snap_version=int(saved["snap_version"]))

    def state_dict(self) -> Dict[str, Any]:
        return {"chain": self.chain.state_dict(),
                "proposed": torch.from_numpy(self.proposed.copy()), "accepted": torch.from_numpy(self.accepted.copy()),
                "snaps": pack_snapshots(self.snaps), "counts": list(self.counts),
                "trace_leaves": list(self.trace_leaves), "trace_lp": list(self.trace_lp),
                "version": int(self.version), "snap_version": int(self.snap_version)}


@dataclass
class HostMCMCState(SamplerState):
    """The host chains between two iterations (each run to the same iteration).

    Attributes
    ----------
    step : int, the next iteration
    done : bool
    chains : list of HostRecord, this rank's chains in order
    """

    step: int
    done: bool
    chains: List[HostRecord]

    @classmethod
    def from_state_dict(cls, saved: Dict[str, Any], new_chain: Callable[[], HostChain]) -> "HostMCMCState":  # type: ignore[override]
        """Rebuild from :meth:`state_dict`; ``new_chain()`` makes a fresh HostChain of the run's
        model and move probabilities. A checkpoint of the one-chain layout (``chain`` at the
        top, written before several host chains were possible) loads as one chain."""
        records = saved["chains"] if "chains" in saved else [saved]
        return cls(step=int(saved["step"]), done=bool(saved["done"]),
                   chains=[HostRecord.from_state_dict(r, new_chain()) for r in records])

    def state_dict(self) -> Dict[str, Any]:
        return {"step": int(self.step), "done": bool(self.done), "chains": [r.state_dict() for r in self.chains]}
