"""A resumed BART checkpoint's state checked against the run (:mod:`torchtree.samplers.restore_checks`): the
compiled sweep indexes the bins with the trees' features and cuts and the trees' slots with each point's leaf,
unchecked, so every field is checked before the first sweep."""
from __future__ import annotations

from typing import Any, Dict, List

import torch

from torchtree.model.bart import ABSENT, LEAF
from torchtree.samplers.bart.state import BARTSetup, BARTState
from torchtree.samplers.restore_checks import StateFields, rebuilding

__all__ = ["restored_state", "check_state", "check_heap_trees"]

#: kept sweeps whose trees are checked together (one copy of this many sweeps at a time)
_KEPT_GROUP = 64
#: (tree, point) pairs whose leaves are looked up at once (their indices stay in cache)
_LEAF_BLOCK = 1 << 16


def check_heap_trees(fields: StateFields, names: List[str], feature: torch.Tensor, cut: torch.Tensor,
                     n_cuts: torch.Tensor, structure: bool = True) -> None:
    """Heap trees ``[..., K]`` (:mod:`torchtree.model.bart`) on the cut grid ``n_cuts [D]``: features in
    ``{ABSENT, LEAF} u [0, D)``, a split's cut in ``[0, n_cuts[feature])``; with ``structure``, a root in every
    tree, splits only where both children fit in the heap, and a slot holds a node exactly when its parent
    splits. ``names``: the fields' names (feature, cut)."""
    D, K = n_cuts.numel(), feature.shape[-1]
    f = feature.long()
    fields.require(names[0], (f >= ABSENT) & (f < D), f"holds values outside [{ABSENT}, {D - 1}] (a column of "
                   f"the data's {D}, or {LEAF} for a leaf, {ABSENT} for no node)")
    split = f >= 0
    c = cut.long()[split]
    fields.require(names[1], (c >= 0) & (c < n_cuts.to(f.device)[f[split]]),
                   "holds a split's cut outside its column's cut grid")
    if not structure:
        return
    fields.require(names[0], f[..., 0] != ABSENT, "holds a tree without a root")
    fields.require(names[0], ~split[..., (K - 1) // 2:], "splits a node of the deepest level")
    if K > 1:
        parent = (torch.arange(1, K, device=f.device) - 1) // 2
        fields.require(names[0], (f[..., 1:] != ABSENT) == split[..., parent],
                       "holds a node whose parent does not split, or a split without its children")


def restored_state(saved: Dict[str, Any], ctx, config) -> BARTState:
    """The state a checkpoint's dict ``saved`` holds, on the run's device, checked (:func:`check_state`) against
    the run (``ctx``: its RunContext, ``config``: its BARTConfig)."""
    fields, setup = StateFields(config.checkpoint), ctx.setup
    with rebuilding(config.checkpoint):
        if isinstance(saved.get("kept"), dict):  # packed kept sweeps: sized before they are unpacked (allocated)
            for chunk in saved["kept"]["chunks"]:
                fields.require("kept.shape", [int(n) for n in chunk["shape"]] in ([setup.instances.numel(),
                               config.n_trees], [0, 0]), f"is {chunk['shape']}, not this run's chains and trees")
                fields.tensor("kept.widths", chunk["widths"], shape=[None], kind="int", low=1,
                              high=setup.prior.n_slots)
        state = BARTState.from_state_dict(saved, ctx.device)
    check_state(state, setup, config.n_trees, ctx.data.n, config.checkpoint)
    return state


def check_state(state: BARTState, setup: BARTSetup, n_trees: int, n_points: int, path) -> None:
    """Every field of the restored ``state`` fits the run (``setup``, ``n_trees`` trees, ``n_points`` points):
    shapes, dtypes, the trees on the run's cut grid, each point's leaf a leaf of its tree, finite values, the
    kept sweeps' trees. Raises :class:`~torchtree.io.integrity.CheckpointError` naming ``path`` and the field."""
    fields = StateFields(path)
    T, C, K, N = n_trees, setup.instances.numel(), setup.prior.n_slots, n_points
    dt, regression = setup.dt, setup.prior.task == "regression"
    fields.integer("step", state.step, low=0)
    feature = fields.tensor("feature", state.feature, shape=[T, C, K], dtype=torch.int16)
    cut = fields.tensor("cut", state.cut, shape=[T, C, K], dtype=torch.int16)
    fields.tensor("value", state.value, shape=[T, C, K], dtype=dt, finite=True)
    check_heap_trees(fields, ["feature", "cut"], feature, cut, setup.n_cuts)
    leaf_of = fields.tensor("leaf_of", state.leaf_of, shape=[T, C, N], dtype=torch.int16, low=0, high=K - 1)
    # each point's slot looked up in its tree's leaf mask: flat int32 indices (int64 past 2^31 slots), in cache-sized
    # blocks of trees
    is_leaf = (feature == LEAF).reshape(-1).to(torch.uint8)
    rows = leaf_of.reshape(T * C, N)
    wide = torch.int64 if T * C * K >= 2 ** 31 else torch.int32
    offsets = (torch.arange(T * C, dtype=wide, device=rows.device) * K)[:, None]
    step = max(1, _LEAF_BLOCK // max(N, 1))
    for t0 in range(0, T * C, step):
        slots = (rows[t0:t0 + step].to(wide) + offsets[t0:t0 + step]).reshape(-1)
        fields.require("leaf_of", is_leaf.index_select(0, slots), "sends a point to a slot that is not a leaf of "
                       "its tree")
    fields.tensor("resid", state.resid, shape=[C, N], dtype=dt, finite=True)
    fields.tensor("sigma2", state.sigma2, shape=[C], dtype=torch.float64, finite=True)
    fields.require("sigma2", state.sigma2 > 0, "holds a variance that is not positive")
    fields.tensor("latent", state.latent, shape=[0] if regression else [C, N], dtype=dt, finite=True)
    fields.tensor("counts", state.counts, shape=[2, 3], dtype=torch.long, low=0)
    _check_kept(fields, state, setup, T, C, K)


def _check_kept(fields: StateFields, state: BARTState, setup: BARTSetup, T: int, C: int, K: int) -> None:
    """The kept sweeps (``[C, T, K']`` trees each, ``K' <= K``, on the grid), their noise variances and
    traces."""
    kept = state.kept
    if not isinstance(kept, list):
        raise fields.error("kept", f"is a {type(kept).__name__}, not a list of sweeps")
    for name, seq in (("kept_sigma", state.kept_sigma), ("trace_leaves", state.trace_leaves), ("kept_f", state.kept_f)):
        if not isinstance(seq, list):
            raise fields.error(name, f"is a {type(seq).__name__}, not a list")
    fields.require("kept_sigma", len(state.kept_sigma) == len(kept), f"holds {len(state.kept_sigma)} sweeps' "
                   f"variances for {len(kept)} kept sweeps")
    fields.require("trace_leaves", len(state.trace_leaves) <= int(state.step), f"traces {len(state.trace_leaves)} "
                   f"sweeps of {int(state.step)}")
    R = int(setup.f_rows.numel())
    for name, seq, shape in (("kept_sigma", state.kept_sigma, [C]), ("trace_leaves", state.trace_leaves, [C]),
                             ("kept_f", state.kept_f, [C, R])):
        if seq:
            fields.require(name, all(isinstance(x, torch.Tensor) for x in seq), "holds something else than tensors")
            found = {(tuple(x.shape), x.dtype.is_floating_point) for x in seq}  # one entry, unless edited
            fields.require(name, found == {(tuple(shape), True)}, f"holds arrays of shapes {sorted(found)[:3]}, "
                           f"where this run needs floating-point {list(shape)}")
            fields.tensor(name, torch.cat([x.reshape(-1) for x in seq]), finite=True)
    for s, k in enumerate(kept):
        if not (isinstance(k, (tuple, list)) and len(k) == 3):
            raise fields.error(f"kept[{s}]", "is not a sweep's (feature, cut, value)")
        f = fields.tensor(f"kept[{s}].feature", k[0], shape=[C, T, None], dtype=torch.int16)
        fields.require(f"kept[{s}].feature", f.shape[-1] <= K, f"holds trees of {f.shape[-1]} slots, more than {K}")
        fields.tensor(f"kept[{s}].cut", k[1], shape=list(f.shape), dtype=torch.int16)
        fields.tensor(f"kept[{s}].value", k[2], shape=list(f.shape), dtype=setup.dt)
    for s0 in range(0, len(kept), _KEPT_GROUP):  # groups of sweeps: a few tensor operations each
        group = kept[s0:s0 + _KEPT_GROUP]
        f, c, v = (torch.cat([k[i].reshape(-1) for k in group]) for i in range(3))
        check_heap_trees(fields, ["kept.feature", "kept.cut"], f, c, setup.n_cuts, structure=False)
        fields.tensor("kept.value", v, finite=True)
