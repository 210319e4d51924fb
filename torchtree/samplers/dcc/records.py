"""DCC's per-topology bookkeeping: records, their checkpoint form, and warm-start inheritance.

A :class:`Record` holds what DCC knows of one discovered topology (counts, its chains'
positions and tuning, draws, LAIS pseudo-samples, per-chain evidence). The functions here
move chains between a record (compact coordinates of its topology, ``[C, P_m]``) and a
batched :class:`~torchtree.model.soft_trees.SoftTrees` (padded coordinates, ``[G C, P]``),
and map a child topology's coordinates onto its parent's for warm starts.
"""
from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any, Dict, List, Optional

import torch

from torchtree.model.soft_trees import SoftTrees
from torchtree.model.topology import Topology

__all__ = ["Record", "compact_keys", "inherit", "record_state", "record_from_state", "systematic_indices",
           "embed", "store_chains", "warm_start_chains", "bound_pseudo", "PSEUDO_BYTES", "PSEUDO_KEEP", "local_draws"]

#: Bytes of LAIS pseudo-samples a topology keeps for its weighted local posterior before they
#: are resampled down to ``PSEUDO_KEEP * max_predict_draws`` (see :func:`bound_pseudo`).
PSEUDO_BYTES = 64 << 20
PSEUDO_KEEP = 4


@dataclass
class Record:
    """Bookkeeping of one discovered topology."""

    topology: Topology
    log_prior: float
    proposed: int = 0
    selected: int = 0
    active: bool = False
    slot: int = -1  # row in the evidence accumulator
    position: Optional[torch.Tensor] = None  # [C, P_m] compact
    step_size: Optional[torch.Tensor] = None  # [C]
    inv_mass: Optional[torch.Tensor] = None  # [C, P_m]
    draws: List[torch.Tensor] = field(default_factory=list)  # each [T, C, P_m]
    pseudo: List[torch.Tensor] = field(default_factory=list)  # LAIS pseudo-samples, each [K, P_m]
    pseudo_logw: List[torch.Tensor] = field(default_factory=list)  # their log weights, each [K]
    parent: Optional[Topology] = None  # topology whose global move first proposed this one
    chain_log_z: Optional[torch.Tensor] = None  # [C] per-chain LAIS evidence of the latest visit
    chain_log_sum_w: Optional[torch.Tensor] = None  # [C] log sum of each chain's weights, all visits
    chain_n: int = 0  # weights per chain so far
    draw_chain: List[torch.Tensor] = field(default_factory=list)  # chain index of each stored draw


def compact_keys(topology: Topology, n_features: int, regression: bool) -> List[tuple]:
    """Meaning of each compact coordinate (same order as ``ParamLayout.compact_index``)."""
    keys: List[tuple] = [("w", i, k) for i in topology.internal for k in range(n_features - 1)]
    keys += [("u", i) for i in topology.internal]
    if regression:
        keys += [("mu", l) for l in topology.leaves] + [("s",)]
    return keys


def inherit(child: Topology, parent: Topology, n_features: int, regression: bool) -> List[List[int]]:
    """For each compact coordinate of ``child``, the parent coordinates it copies (averaged).

    Shared split nodes keep their weights and thresholds; a leaf created by a grow
    move inherits its parent leaf's mean; a leaf created by a prune move takes the
    mean of the two leaves it replaces; a new split gets nothing (empty list).
    """
    pk = {k: j for j, k in enumerate(compact_keys(parent, n_features, regression))}
    out: List[List[int]] = []
    for key in compact_keys(child, n_features, regression):
        if key in pk:
            out.append([pk[key]])
        elif key[0] == "mu":
            l = key[1]
            up = ("mu", (l - 1) // 2) if l > 0 else None
            down = [("mu", 2 * l + 1), ("mu", 2 * l + 2)]
            if up in pk:
                out.append([pk[up]])
            elif all(d in pk for d in down):
                out.append([pk[d] for d in down])
            else:
                out.append([])
        else:
            out.append([])
    return out


def record_state(r: Record) -> Dict[str, Any]:
    """``r`` as plain tensors and containers (``torch.load(weights_only=True)`` reads it back)."""

    def cpu(t):
        return None if t is None else t.detach().cpu()

    return {
        "topology": list(r.topology.internal), "log_prior": float(r.log_prior), "proposed": int(r.proposed),
        "selected": int(r.selected), "active": bool(r.active), "slot": int(r.slot),
        "position": cpu(r.position), "step_size": cpu(r.step_size), "inv_mass": cpu(r.inv_mass),
        "draws": [cpu(x) for x in r.draws], "pseudo": [cpu(x) for x in r.pseudo],
        "pseudo_logw": [cpu(x) for x in r.pseudo_logw],
        "parent": None if r.parent is None else list(r.parent.internal),
        "chain_log_z": cpu(r.chain_log_z), "chain_log_sum_w": cpu(r.chain_log_sum_w), "chain_n": int(r.chain_n),
        "draw_chain": [cpu(x) for x in r.draw_chain],
    }


def record_from_state(d: Dict[str, Any], dev: torch.device) -> Record:
    """The :class:`Record` that :func:`record_state` wrote; the chains go to ``dev``."""

    def on(t):
        return None if t is None else t.to(dev)

    return Record(
        Topology(tuple(int(i) for i in d["topology"])), float(d["log_prior"]), int(d["proposed"]),
        int(d["selected"]), bool(d["active"]), int(d["slot"]),
        on(d["position"]), on(d["step_size"]), on(d["inv_mass"]),
        list(d["draws"]), list(d["pseudo"]), list(d["pseudo_logw"]),
        None if d["parent"] is None else Topology(tuple(int(i) for i in d["parent"])),
        d["chain_log_z"], d["chain_log_sum_w"], int(d["chain_n"]), list(d["draw_chain"]),
    )


def systematic_indices(logw: torch.Tensor, n: int, generator: torch.Generator) -> torch.Tensor:
    """``n`` systematic-resampling indices ``[n]`` into ``logw [M]`` (unnormalised log weights).

    NaN weights count as zero. One uniform from ``generator`` (CPU, float64); the kept set
    follows the normalised weights with the least variance of the counts.
    """
    w = torch.softmax(torch.nan_to_num(logw, nan=-float("inf")), 0)
    u = (torch.rand((), generator=generator, dtype=torch.float64) + torch.arange(n, dtype=torch.float64)) / n
    return torch.searchsorted(torch.cumsum(w, 0), u).clamp(max=w.numel() - 1)


def embed(model: SoftTrees, recs: List[Record], name: str, fill: torch.Tensor, n_chains: int) -> torch.Tensor:
    """The records' ``name`` (``"position"`` / ``"inv_mass"``, compact ``[C, P_m]``) in the
    model's padded layout ``[G C, P]``; other coordinates keep ``fill``."""
    out = fill.clone()
    C = n_chains
    for m, r in enumerate(recs):
        out[m * C : (m + 1) * C, model.compact_index(m)] = getattr(r, name).to(out)
    return out


def store_chains(model: SoftTrees, recs: List[Record], position: torch.Tensor, step_size: torch.Tensor,
                 inv_mass: torch.Tensor, draws: torch.Tensor, n_chains: int) -> None:
    """Keep each record's chains (``position``, ``inv_mass`` ``[G C, P]``, ``step_size [G C]``)
    and append its draws (``draws [T, G C, P]``, stored compact on the CPU)."""
    C = n_chains
    for m, r in enumerate(recs):
        rows, idx = slice(m * C, (m + 1) * C), model.compact_index(m)
        r.position = position[rows][:, idx].clone()
        r.step_size = step_size[rows].clone()
        r.inv_mass = inv_mass[rows][:, idx].clone()
        r.draws.append(draws[:, rows][:, :, idx].cpu())
        r.draw_chain.append(torch.arange(C).repeat(draws.shape[0]))


def warm_start_chains(model: SoftTrees, batch: List[Record], records: Dict[Topology, Record], n_chains: int,
                      regression: bool, generator: torch.Generator):
    """Initial positions ``[G C, P]``, inverse masses ``[G C, P]`` and step sizes ``[G C]``
    of a batch of new topologies, copied from the chains of the topologies that proposed them.

    The parent's chains are resampled by their per-chain evidence (systematic, with
    ``generator``): chains stuck in a poor mode of the parent do not seed the child.
    Coordinates with nothing to inherit keep the model's prior draw and unit mass.
    """
    C = n_chains
    pos, inv = model.theta.data.clone(), model.coord_mask.to(model.theta.dtype).clone()
    steps = []
    for m, r in enumerate(batch):
        par = records[r.parent]
        if par.chain_log_z is not None and torch.isfinite(par.chain_log_z).any():
            pick = systematic_indices(par.chain_log_z, C, generator)
        else:
            pick = torch.arange(C)
        ppos, pinv, pstep = par.position[pick], par.inv_mass[pick], par.step_size[pick]
        idx = model.compact_index(m).unsqueeze(0)
        rows = torch.arange(m * C, (m + 1) * C, device=pos.device).unsqueeze(1)
        src = inherit(r.topology, par.topology, model.data.n_features, regression)
        cpos, cinv = pos[rows, idx], inv[rows, idx]  # prior draws / unit mass by default
        for j, js in enumerate(src):
            if js:
                cpos[:, j] = ppos[:, js].mean(1).to(cpos)
                cinv[:, j] = pinv[:, js].mean(1).to(cinv)
        pos[rows, idx], inv[rows, idx] = cpos, cinv
        steps.append(pstep.to(pos))
    return pos, inv, torch.cat(steps)


def bound_pseudo(r: Record, max_predict_draws: int) -> None:
    """Keep ``r``'s weighted pseudo-samples under :data:`PSEUDO_BYTES` (in place).

    On a wide table they grow by ``C T N_M x P_m`` numbers a visit (32 MB with 10,000
    features). Past the cap they are resampled by weight (systematic) to ``PSEUDO_KEEP x
    max_predict_draws`` equally weighted points carrying the same total weight: the same
    weighted measure in expectation, from which the posterior draws its ``max_predict_draws``.
    Small problems never reach the cap (their numbers do not move)."""
    if sum(x.numel() * x.element_size() for x in r.pseudo) <= PSEUDO_BYTES:
        return
    lw = torch.cat(r.pseudo_logw).double()
    keep = PSEUDO_KEEP * int(max_predict_draws)
    idx = systematic_indices(lw, keep, torch.Generator().manual_seed(int(r.chain_n)))
    total = float(torch.logsumexp(torch.nan_to_num(lw, nan=-float("inf")), 0))
    r.pseudo = [torch.cat(r.pseudo)[idx]]
    r.pseudo_logw = [torch.full((keep,), total - math.log(keep), dtype=r.pseudo_logw[0].dtype)]


def local_draws(r: Record, local_posterior: str, n: int, gen: torch.Generator) -> torch.Tensor:
    """At most ``n`` draws ``[n, P_m]`` of ``r``'s local posterior (see ``DCC``'s
    ``local_posterior``); ``gen`` (CPU) drives the resampling."""
    if local_posterior == "weighted" and r.pseudo:
        # eq. 14: importance-resample the LAIS pseudo-samples
        return torch.cat(r.pseudo)[systematic_indices(torch.cat(r.pseudo_logw).double(), n, gen)]
    if local_posterior == "chains" and r.draws and r.chain_log_sum_w is not None:
        # NUTS draws, each chain weighted by its own LAIS evidence (the mass of the mode it
        # explores); draws within a chain keep equal weights
        d = torch.cat([x.reshape(-1, x.shape[-1]) for x in r.draws])
        chain = torch.cat(r.draw_chain)
        per = torch.log_softmax(r.chain_log_sum_w.double(), 0)
        counts = torch.bincount(chain, minlength=per.numel()).double()
        return d[systematic_indices((per[chain] - torch.log(counts[chain])).double(), n, gen)]
    d = torch.cat([x.reshape(-1, x.shape[-1]) for x in r.draws]) if r.draws else torch.zeros(0)
    if d.shape[0] > n:  # evenly thinned
        d = d[torch.linspace(0, d.shape[0] - 1, n).round().long()]
    return d
