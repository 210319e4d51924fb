"""What a BART run holds: its set-up objects (``BARTSetup``) and its chains between sweeps (``BARTState``, what a checkpoint saves)."""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Callable, Dict, List, Optional, Tuple

import torch

from torchtree.model.bart import ABSENT
from torchtree.samplers.protocol import TRANSIENT, SamplerState


__all__ = ["BARTSetup", "BARTState", "pack_kept", "unpack_kept", "COMPACT_EVERY"]

#: Kept sweeps are trimmed together in groups of this many (one host read per group); a group, once
#: trimmed, never changes, so a checkpoint packs it once (``BARTState.packed``)
COMPACT_EVERY = 16


def pack_kept(kept: List[Tuple[torch.Tensor, torch.Tensor, torch.Tensor]]) -> Dict[str, Any]:
    """The kept sweeps ``[C, T, K_s]`` (feature, cut, value each) as ragged trees, for a checkpoint.

    A sweep's width ``K_s`` is that of its deepest tree, and most trees are far shallower: each
    tree keeps only its slots up to the last one that holds anything (a node, or a cut or value
    left in an absent slot), so :func:`unpack_kept` gives back the same tensors bit for bit. Sweeps
    of one width are packed together: a few groups, no tensor work per sweep.

    Returns
    -------
    dict: ``widths`` LongTensor [S], ``lengths`` LongTensor [S C T] (slots kept per tree, sweeps in
    width-group order), ``feature`` / ``cut`` / ``value`` [sum of lengths], ``shape`` [C, T]
    """
    S = len(kept)
    out: Dict[str, Any] = {"widths": torch.tensor([k[0].shape[-1] for k in kept], dtype=torch.long),
                           "shape": list(kept[0][0].shape[:-1]) if S else [0, 0]}
    lengths, parts = [], ([], [], [])
    for w in torch.unique(out["widths"]).tolist():
        group = [k for k in kept if k[0].shape[-1] == w]
        f, c, v = (torch.stack([k[i] for k in group]) for i in range(3))  # [n, C, T, w]
        slots = torch.arange(w, device=f.device)
        used = (f != ABSENT) | (c != 0) | (v != 0) | torch.signbit(v)  # a -0.0 is kept too: bit for bit
        last = torch.where(used, slots, -1).amax(-1) + 1  # [n, C, T]
        mask = slots < last.unsqueeze(-1)
        lengths.append(last.reshape(-1))
        for part, x in zip(parts, (f, c, v)):
            part.append(x[mask])
    out["lengths"] = torch.cat(lengths) if lengths else torch.zeros(0, dtype=torch.long)
    for name, part in zip(("feature", "cut", "value"), parts):
        out[name] = torch.cat(part) if part else torch.zeros(0)
    return out


def unpack_kept(packed: Dict[str, Any]) -> List[Tuple[torch.Tensor, torch.Tensor, torch.Tensor]]:
    """The kept sweeps that :func:`pack_kept` packed, in their order, each ``[C, T, K_s]``."""
    widths = packed["widths"]
    C, T = (int(x) for x in packed["shape"])
    kept: List[Any] = [None] * int(widths.numel())
    at_tree = at_slot = 0
    for w in torch.unique(widths).tolist():
        idx = (widths == w).nonzero().flatten().tolist()
        n = len(idx)
        last = packed["lengths"][at_tree : at_tree + n * C * T].reshape(n, C, T)
        mask = torch.arange(w, device=last.device) < last.unsqueeze(-1)
        size = int(last.sum())
        dense = []
        for name, fill in (("feature", ABSENT), ("cut", 0), ("value", 0)):
            flat = packed[name][at_slot : at_slot + size]
            x = torch.full((n, C, T, w), fill, dtype=flat.dtype, device=flat.device)
            x[mask] = flat
            dense.append(x)
        for j, s in enumerate(idx):
            kept[s] = (dense[0][j], dense[1][j], dense[2][j])
        at_tree, at_slot = at_tree + n * C * T, at_slot + size
    return kept


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
    #: per kept sweep: ``[C, R]`` the fit at the traced training rows (:mod:`torchtree.samplers.bart.mixing`)
    kept_f: List[torch.Tensor] = field(default_factory=list)
    #: ``forest_stats`` of the trees as they are (the last sweep's), where the compiled kernels computed them
    forest_stats: Optional[torch.Tensor] = field(default=None, metadata=TRANSIENT)
    #: :func:`pack_kept` of each trimmed group of ``COMPACT_EVERY`` kept sweeps, in order (a checkpoint's cache)
    packed: List[Dict[str, Any]] = field(default_factory=list, metadata=TRANSIENT)

    def state_dict(self) -> Dict[str, Any]:
        """As :meth:`SamplerState.state_dict`, with the kept sweeps packed (:func:`pack_kept`): the trimmed
        groups once each (cached), the sweeps after them at every save."""
        out = super().state_dict()
        done = len(self.kept) // COMPACT_EVERY * COMPACT_EVERY  # trimmed (sampler.py trims each full group)
        for start in range(len(self.packed) * COMPACT_EVERY, done, COMPACT_EVERY):
            self.packed.append(pack_kept(self.kept[start : start + COMPACT_EVERY]))
        out["kept"] = {"chunks": self.packed[: done // COMPACT_EVERY] + [pack_kept(self.kept[done:])]}
        return out

    @classmethod
    def from_state_dict(cls, saved: Dict[str, Any], device: Optional[torch.device] = None) -> "BARTState":
        """Rebuild a state from :meth:`state_dict` (also one that holds the kept sweeps as a list, as
        checkpoints before :func:`pack_kept` did)."""
        if isinstance(saved.get("kept"), dict):
            saved = {**saved, "kept": [k for chunk in saved["kept"]["chunks"] for k in unpack_kept(chunk)]}
        return super().from_state_dict(saved, device)


@dataclass(frozen=True)
class BARTSetup:
    """A BART run's objects.

    Attributes
    ----------
    prior : BartPrior, calibrated on the data
    grid : CutGrid, the cut grid
    Xb : int Tensor [N, D], each point's bin per feature
    n_cuts : LongTensor [D], cuts per feature
    dt : torch.dtype of the leaf values and residuals
    target : Tensor [N], the standardised
        response (regression) or the labels (classification)
    chains : LongTensor [n_local], this rank's global chain indices
    n_utilities : int, forests per chain: 1 (regression, two classes), or ``K - 1`` for ``K >= 3``
        classes (multinomial probit: a latent utility per class but the reference class 0)
    instances : LongTensor [n_local * n_utilities], this rank's global forest indices
        (``chain * n_utilities + utility``; the chains themselves when ``n_utilities == 1``): the
        chain axis of the trees, residuals and latents, and the keys of their random draws
    offsets : Tensor [n_utilities] float64, the utilities' offsets (multinomial probit), or None
    update_fn : the tree update (``tree_update``, or its compiled form)
    pg_level_fn : the Particle
        Gibbs level update's compiled form, or None (eager)
    groups : LongTensor [D] or None, the input column of each feature of a coded table
    n_warmup : int, burn-in sweeps per chain (``BARTConfig.n_warmup`` as resolved for the run)
    n_gfr : int, the grow-from-root sweeps opening them (0 where the compiled kernels do not run)
    graph : :class:`~torchtree.samplers.bart.graph.SweepGraph` or None, the sweeps' tree updates as a
        recorded CUDA graph (``compile="graph"``)
    f_rows : LongTensor [R], the training rows whose fit the run traces
        (:func:`~torchtree.samplers.bart.mixing.traced_rows`)
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
    f_rows: Optional[torch.Tensor] = None
