"""A resumed MCMC checkpoint's state checked against the run (:mod:`torchtree.samplers.restore_checks`): the
moves and the compiled traversal index the data and the trees' arrays with the chains' features, child
pointers and leaves unchecked, so every field is checked before the first iteration. Both engines: the batched
chains (:class:`~torchtree.samplers.mcmc.state.MCMCState`) and the host ones
(:class:`~torchtree.samplers.mcmc.state.HostMCMCState`, numpy arrays per chain)."""
from __future__ import annotations

from typing import Any, Callable, Dict

import numpy as np
import torch

from torchtree.model.trees import INTERNAL, LEAF, UNUSED, HardTrees
from torchtree.samplers.mcmc.state import HostMCMCState, HostRecord, MCMCState
from torchtree.samplers.restore_checks import StateFields, check_hard_trees, check_pointer_trees, check_tree_state, \
    rebuilding
from torchtree.steps.host_moves import HostChain
from torchtree.steps.moves import MAX_DEPTH, MOVES

__all__ = ["restored_state"]


def restored_state(saved: Dict[str, Any], ctx, path, new_chain: Callable[[], HostChain]):
    """The state a checkpoint's dict ``saved`` holds, checked against the run (``ctx``: its RunContext; host
    chains are made by ``new_chain()``). Raises :class:`~torchtree.io.integrity.CheckpointError` naming
    ``path`` and the field that does not fit."""
    setup = ctx.setup
    fields = StateFields(path)
    n_local = int(setup.chains.numel())
    with rebuilding(path):
        if setup.host:
            state = HostMCMCState.from_state_dict(saved, new_chain)
            records = saved["chains"] if "chains" in saved else [saved]
            snaps = [_snapshot_arrays(r["snaps"]) for r in records]
        else:
            state = MCMCState.from_state_dict(saved, ctx.device)
    fields.integer("step", state.step, low=0)
    if setup.host:
        fields.require("chains", len(state.chains) == n_local, f"holds {len(state.chains)} chains, where this run "
                       f"has {n_local}")
        for p, rec in enumerate(state.chains):
            _check_record(fields, f"chains[{p}]", rec, snaps[p], setup.model)
    else:
        _check_batched(fields, state, setup.model, n_local)
    return state


def _check_batched(fields: StateFields, state: MCMCState, model, P: int) -> None:
    """The batched chains: their trees and caches, move counts, kept draws and traces."""
    check_tree_state(fields, "trees", state.chains.trees, model, P, MAX_DEPTH)
    dev = state.chains.trees.feature.device
    for name in ("proposed", "accepted"):
        fields.tensor(name, getattr(state, name), shape=[len(MOVES)], dtype=torch.long, low=0)
    for kept in state.kept:
        check_hard_trees(fields, "kept", kept, None, model.D, model.S, model.X.dtype)
        fields.require("kept", kept.n_trees % P == 0, f"holds {kept.n_trees} trees, not whole draws of {P} chains")
    if state.trace_leaves:
        fields.tensor("trace_leaves", torch.stack([x.to(dev) for x in state.trace_leaves]),
                      shape=[len(state.trace_leaves), P], kind="int")
    if state.trace_lp:
        fields.no_nan("trace_lp", fields.tensor("trace_lp", torch.stack([x.to(dev) for x in state.trace_lp]),
                                                shape=[len(state.trace_lp), P], dtype=torch.float64))


def _check_record(fields: StateFields, name: str, rec: HostRecord, snaps, model) -> None:
    """One host chain: its arrays (a tree of ``n`` nodes, each training point's leaf), move counts and kept
    snapshots (``snaps``: :func:`_snapshot_arrays` of the checkpoint's)."""
    arr = rec.chain.state_dict()
    N, S = model.N, model.S
    C = fields.tensor(f"{name}.chain.feat", arr["feat"], shape=[None]).shape[0]
    for key in ("thr", "left", "right", "parent", "depth", "leaf", "heap", "term"):
        fields.tensor(f"{name}.chain.{key}", arr[key], shape=[C])
    fields.tensor(f"{name}.chain.stats", arr["stats"], shape=[C, S])
    n = fields.integer(f"{name}.chain.n", arr["n"], low=1, high=C)
    fields.tensor(f"{name}.chain.depth", arr["depth"][:n], low=0, high=MAX_DEPTH)
    internal = ~arr["leaf"] & (torch.arange(C) < n)
    check_pointer_trees(fields, f"{name}.chain", _row(arr["feat"]), _row(arr["left"]), _row(arr["right"]),
                        _row(arr["parent"]), _row(arr["depth"]), internal[None], torch.tensor([n]), model.D,
                        heap=_row(arr["heap"]), threshold=_row(arr["thr"]),
                        rename={"feature": "feat", "threshold": "thr", "status": "leaf"})
    fields.no_nan(f"{name}.chain.term", arr["term"][:n])
    fields.tensor(f"{name}.chain.stats", arr["stats"][:n], finite=True)
    assign = fields.tensor(f"{name}.chain.assign", arr["assign"], shape=[N], low=0, high=n - 1)
    fields.require(f"{name}.chain.assign", arr["leaf"][assign], "sends a point to a node that is not a leaf")
    for key in ("proposed", "accepted"):
        fields.tensor(f"{name}.{key}", torch.from_numpy(np.asarray(getattr(rec, key))), shape=[len(MOVES)], low=0)
    fields.require(f"{name}.counts", len(rec.counts) == len(rec.snaps) and all(int(k) >= 1 for k in rec.counts),
                   "does not count each kept snapshot")
    if snaps is not None:
        _check_snapshots(fields, f"{name}.snaps", snaps, model)


def _row(a: torch.Tensor) -> torch.Tensor:
    return a.reshape(1, -1)


def _snapshot_arrays(packed: Dict[str, Any]):
    """A host chain's kept snapshots as :func:`~torchtree.steps.host_moves.pack_snapshots` stored them:
    ``(lengths [Q], the 8 fields [sum n_q] in their own dtypes)``, or None without any."""
    lengths = packed["lengths"]
    if not lengths.numel():
        return None
    dtypes = packed.get("dtypes")
    return lengths, [torch.from_numpy(f.numpy() if dtypes is None else f.numpy().astype(np.dtype(dtypes[i])))
                     for i, f in enumerate(packed["fields"])]


def _check_snapshots(fields: StateFields, name: str, snaps, model) -> None:
    """A host chain's kept snapshots (the trees its posterior predicts with), padded into ``[Q, C]`` arrays at
    once and checked as trees."""
    lengths, flat = snaps
    fields.tensor(f"{name}.lengths", lengths, shape=[None], kind="int", low=1)
    fields.require(f"{name}.fields", len(flat) == 8, f"holds {len(flat)} fields of a tree's 8")
    total = int(lengths.sum())
    for i, x in enumerate(flat):
        fields.tensor(f"{name}.fields[{i}]", x, shape=[total] + ([model.S] if i == 7 else []))
    Q, C = lengths.numel(), int(lengths.max())
    row = torch.repeat_interleave(torch.arange(Q), lengths)
    col = torch.arange(total) - torch.repeat_interleave(torch.cumsum(lengths, 0) - lengths, lengths)

    def pad(x: torch.Tensor, fill) -> torch.Tensor:
        out = torch.full((Q, C) + tuple(x.shape[1:]), fill, dtype=x.dtype)
        out[row, col] = x
        return out

    feat, thr, left, right, parent, depth, leaf, stats = flat
    used = torch.arange(C)[None, :] < lengths[:, None]
    internal = ~pad(leaf.bool(), True) & used
    status = torch.where(internal, INTERNAL, torch.where(used, LEAF, UNUSED)).to(torch.int8)
    trees = HardTrees(pad(feat, -1), pad(thr, 0), pad(left, -1), pad(right, -1), pad(parent, -1), pad(depth, 0),
                      status, pad(stats, 0), lengths)
    check_hard_trees(fields, name, trees, Q, model.D, model.S)
