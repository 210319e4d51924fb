"""A resumed top-down SMC checkpoint's state checked against the run (:mod:`torchtree.samplers.restore_checks`):
the compiled point-list passes read the node table's point lists (``buf``, ``off``, ``cnt``) and the data's
columns at its rules, and the traversal the particles' trees, unchecked, so every field is checked before the
first stage."""
from __future__ import annotations

from typing import Any, Dict, Tuple

import torch

from torchtree.model.trees import INTERNAL, UNUSED
from torchtree.samplers.restore_checks import StateFields, check_hard_trees, rebuilding
from torchtree.steps.growth import Grower, GrowthState

__all__ = ["restored_particles"]


def restored_particles(saved: Dict[str, Any], grower: Grower, n_local: int, weights: Tuple[int, int],
                       path) -> GrowthState:
    """The particles of a checkpoint's dict ``saved`` (its node table loaded into ``grower``), checked against
    the run: ``n_local`` particles on this rank, ``weights`` the (particles, islands) of its weight vectors.
    Raises :class:`~torchtree.io.integrity.CheckpointError` naming ``path`` and the field that does not fit."""
    fields = StateFields(path)
    with rebuilding(path):
        for key in ("stage", "done", "logw", "logz", "n_resample", "resample_steps", "growth"):
            if key not in saved:
                raise KeyError(key)
        growth = saved["growth"]
        table = growth["table"]  # as many records as nodes (checked before they are allocated)
        fields.require("growth.table.n_uids", int(table["n_uids"]) == table["status"].numel(), f"is "
                       f"{table['n_uids']}, for {table['status'].numel()} node records")
        particles = grower.load_state_dict(growth)
    fields.integer("stage", saved["stage"], low=0)
    fields.no_nan("logw", fields.tensor("logw", saved["logw"], shape=[weights[0]], dtype=torch.float64))
    fields.no_nan("logz", fields.tensor("logz", saved["logz"], shape=[weights[1]], dtype=torch.float64))
    for name in ("n_resample", "resample_steps"):
        fields.integer(name, saved[name], low=0)
    _check_table(fields, grower)
    uid = fields.tensor("growth.node_uid", growth["node_uid"], shape=[n_local, None], kind="int")
    cap = uid.shape[1]
    n_nodes = fields.tensor("growth.n_nodes", growth["n_nodes"], shape=[n_local], kind="int", low=1, high=cap)
    used = torch.arange(cap)[None, :] < n_nodes[:, None].cpu()
    fields.require("growth.node_uid", (uid.cpu()[used] >= 0) & (uid.cpu()[used] < grower.table.n_uids),
                   "holds nodes past the node table's")
    trees = grower.to_trees(particles)
    check_hard_trees(fields, "growth.table", trees, n_local, grower.data.X.shape[1])
    return particles


def _check_table(fields: StateFields, grower: Grower) -> None:
    """The node table: records of its ``n_uids`` nodes in range (features, parents, point lists inside the
    point buffer), the point buffer's points the data's."""
    t, N, D = grower.table, grower.data.n, grower.data.X.shape[1]
    n = fields.integer("growth.table.n_uids", t.n_uids, low=1)
    size = fields.integer("growth.table.size", t.size, low=0, high=t.buf.numel())
    fields.integer("growth.table.live_after_gc", t.live_after_gc, low=0)
    fields.tensor("growth.table.buf", t.buf[:size], low=0, high=N - 1)
    name = "growth.table."
    fields.tensor(name + "status", t.status[:n], low=UNUSED, high=INTERNAL)
    fields.tensor(name + "depth", t.depth[:n], low=0)
    fields.tensor(name + "feature", t.feature[:n], low=-1, high=D - 1)
    fields.tensor(name + "rfeat", t.rfeat[:n], low=0, high=D - 1)
    fields.tensor(name + "rparent", t.rparent[:n], low=-1, high=n - 1)
    fields.tensor(name + "cnt", t.cnt[:n], low=0, high=N)
    off = fields.tensor(name + "off", t.off[:n], low=-1, high=max(size - 1, 0))
    fields.require(name + "cnt", (off < 0) | (off + t.cnt[:n] <= size), "holds a point list past the point buffer")
    for key in ("threshold", "rthr", "stats"):
        fields.tensor(name + key, getattr(t, key)[:n], finite=True)
