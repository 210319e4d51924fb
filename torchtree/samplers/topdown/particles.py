"""Top-down particles across ranks: the one particle codec of the multi-rank top-down SMC.

A particle is a row of node uids into its rank's node table. To move it to another rank it is
exported as padded per-node arrays (``EXPORT_FIELDS``), sent through
``torchtree.distributed.redistribute`` and imported into the receiver's table, which
re-materialises the node data of the ancestors it did not hold (see
:mod:`torchtree.samplers.topdown` for the layouts and costs).
"""
from __future__ import annotations

from typing import Optional

import torch

from torchtree.distributed import BlockLayout, redistribute, take_rows
from torchtree.model.trees import LEAF, OPEN, HardTrees
from torchtree.steps.growth import Grower, GrowthState, NodeTable

__all__ = ["EXPORT_FIELDS", "expansion_pairs", "tree_report", "layout_for", "export_particles", "import_particles", "materialise_ancestors",
           "move_particles", "gather_trees"]


#: Per-node fields of an exported particle (plus per-particle ``n_nodes``).
EXPORT_FIELDS = ("feature", "threshold", "left", "right", "parent", "depth", "status", "stats", "uid", "cnt")


def layout_for(n_particles: int, n_islands: int, world_size: int) -> str:
    """``"islands"`` when whole islands fit on ranks, else ``"gathered"``; checks divisibility.

    Raises
    ------
    ValueError
        ``n_particles`` not divisible by ``world_size``.
    """
    if n_particles % world_size:
        raise ValueError(
            f"n_particles ({n_particles}) must be divisible by the number of ranks ({world_size}): "
            "every rank holds n_particles / world_size particles"
        )
    return "islands" if n_islands % world_size == 0 else "gathered"


# ---------------------------------------------------------------------------- export / import
def export_particles(grower: Grower, state: GrowthState, rows: torch.Tensor, width: int, n_rows: Optional[int] = None) -> dict:
    """The trees of particles ``rows`` as padded arrays, in a block of ``n_rows`` particles.

    Parameters
    ----------
    grower : Grower (its NodeTable holds the records)
    state : GrowthState
    rows : LongTensor [k], particles to export (distinct)
    width : int >= the largest exported tree
    n_rows : int, optional
        Rows of the returned block (default ``k``: row ``j`` is particle ``rows[j]``); when
        given, particle ``rows[j]`` sits at row ``rows[j]`` and the other rows are empty
        (``n_nodes`` 0), the shape ``redistribute`` wants (one row per local particle).

    Returns
    -------
    dict str -> Tensor: ``feature``, ``left``, ``right``, ``parent`` (parent slot), ``depth``,
    ``uid`` (sender uid), ``cnt`` (points in the node) int32 ``[R, width]``; ``threshold``
    (data dtype) and ``status`` int8 ``[R, width]``; ``stats`` ``[R, width, S]``;
    ``n_nodes`` int64 ``[R]``.
    """
    t = grower.table
    dev = state.node_uid.device
    rows = rows.to(dev).long()
    k = rows.numel()
    C = state.node_uid.shape[1]
    nn = state.n_nodes.index_select(0, rows)
    if k and int(nn.max()) > width:
        raise ValueError(f"width {width} is below the largest exported tree ({int(nn.max())} nodes)")
    uid = torch.zeros(k, width, dtype=torch.long, device=dev)
    w = min(C, width)
    uid[:, :w] = state.node_uid.index_select(0, rows)[:, :w].long()
    used = torch.arange(width, device=dev)[None] < nn[:, None]

    def g(field, fill, dtype=None):
        v = getattr(t, field)[uid]
        v = torch.where(used, v, torch.full_like(v, fill))
        return v if dtype is None else v.to(dtype)

    out = {
        "feature": g("feature", -1),
        "threshold": g("threshold", 0),
        "left": g("left", -1),
        "right": g("right", -1),
        "parent": g("pslot", -1),
        "depth": g("depth", 0),
        "status": g("status", 0),
        "stats": t.stats[uid] * used[..., None].to(t.stats.dtype),
        "uid": torch.where(used, uid, 0).to(torch.int32),
        "cnt": g("cnt", 0, torch.int32),
        "n_nodes": nn.clone(),
    }
    if n_rows is None:
        return out
    full = {}
    for key, v in out.items():
        fill = -1 if key in ("feature", "left", "right", "parent") else 0
        f = torch.full((n_rows,) + tuple(v.shape[1:]), fill, dtype=v.dtype, device=dev)
        f[rows] = v
        full[key] = f
    return full


def import_particles(grower: Grower, block: dict, src_rank: torch.Tensor):
    """Create local node uids for exported particles; lists needed next are rebuilt.

    One local uid per distinct (``src_rank``, sender uid): copies of a tree made on the
    sender share their nodes here too. Each node gets its records and its data-derivation
    rule (``rparent`` = local uid of the parent, ``rfeat``/``rthr`` = the parent's split,
    ``rside`` = which child), so open nodes materialise lazily through
    :meth:`NodeTable.materialise`; the lists of the open nodes' parents are rebuilt here
    (:func:`materialise_ancestors`).

    Parameters
    ----------
    grower : Grower
    block : dict from :func:`export_particles` (``k`` rows, all non-empty)
    src_rank : LongTensor [k], the rank each particle came from

    Returns
    -------
    node_uid : IntTensor [k, width]  (slots >= n_nodes are 0)
    n_nodes : LongTensor [k]
    """
    t = grower.table
    feat = block["feature"]
    dev = feat.device
    k, width = feat.shape
    nn = block["n_nodes"].long()
    if k == 0:
        return torch.zeros(0, width, dtype=torch.int32, device=dev), nn
    if bool((nn < 1).any()):
        raise RuntimeError("internal error: an imported particle has no nodes")
    used = torch.arange(width, device=dev)[None] < nn[:, None]
    key = (src_rank.to(dev).long()[:, None] << 32) | block["uid"].long()
    pi, si = used.nonzero(as_tuple=True)  # row-major: particle, then slot
    ukey, inv = torch.unique(key[pi, si], return_inverse=True)
    U = ukey.numel()
    first = torch.full((U,), pi.numel(), dtype=torch.long, device=dev)
    first.scatter_reduce_(0, inv, torch.arange(pi.numel(), device=dev), "amin")
    new = t.new(U)
    local = torch.zeros(k, width, dtype=torch.long, device=dev)
    local[pi, si] = new[inv]
    pf, sf = pi[first], si[first]
    t.depth[new] = block["depth"][pf, sf].to(t.depth.dtype)
    t.status[new] = block["status"][pf, sf].to(t.status.dtype)
    t.feature[new] = feat[pf, sf].to(t.feature.dtype)
    t.threshold[new] = block["threshold"][pf, sf].to(t.threshold.dtype)
    t.left[new] = block["left"][pf, sf].to(t.left.dtype)
    t.right[new] = block["right"][pf, sf].to(t.right.dtype)
    t.pslot[new] = block["parent"][pf, sf].to(t.pslot.dtype)
    t.stats[new] = block["stats"][pf, sf].to(t.stats.dtype)
    t.cnt[new] = block["cnt"][pf, sf].long()
    ps = block["parent"][pf, sf].long()
    has = ps >= 0
    pc = ps.clamp(min=0)
    t.rparent[new] = torch.where(has, local[pf, pc], torch.full_like(pc, -1))
    t.rfeat[new] = torch.where(has, feat[pf, pc].long(), torch.zeros_like(pc))
    t.rthr[new] = torch.where(has, block["threshold"][pf, pc].double(), torch.zeros(U, dtype=torch.float64, device=dev))
    t.rside[new] = has & (block["right"][pf, pc].long() == sf)
    # Expanding an open node filters its parent's list (an open root needs its own).
    op = new[block["status"][pf, sf] == OPEN]
    par = t.rparent[op]
    need = torch.cat([par[par >= 0], op[par < 0]])
    materialise_ancestors(t, need, grower.data.X)
    return local.to(torch.int32), nn


def materialise_ancestors(table: NodeTable, uids: torch.Tensor, X: torch.Tensor) -> None:
    """Make sure the point lists of ``uids`` exist, rebuilding missing ancestors top-down.

    Walks ``rparent`` up from the nodes without a list until a node with one (or a root) is
    met, then materialises the collected nodes level by level (vectorised over the nodes of a
    depth; the loop runs over depths only). A root without a list gets all the points.

    Parameters
    ----------
    table : NodeTable
    uids : LongTensor [k] (repeats allowed)
    X : Tensor [N, D], the training features
    """
    if uids.numel() == 0:
        return
    off, rparent = table.off, table.rparent
    frontier = torch.unique(uids)
    frontier = frontier[off[frontier] < 0]
    todo = []
    while frontier.numel():
        todo.append(frontier)
        par = rparent[frontier]
        par = torch.unique(par[par >= 0])
        frontier = par[off[par] < 0]
    if not todo:
        return
    allu = torch.unique(torch.cat(todo))
    is_root = rparent[allu] < 0
    roots = allu[is_root]
    if roots.numel():
        if bool((table.cnt[roots] != table.n_points).any()):
            raise RuntimeError("internal error: an imported root does not hold all the points")
        start = table._append(torch.arange(table.n_points, dtype=table.buf.dtype, device=table.device))
        off[roots] = start
    rest = allu[~is_root]
    depth = table.depth[rest]
    for d in torch.unique(depth).tolist():  # ascending: parents before children
        table.materialise(rest[depth == d], X)


def move_particles(grower: Grower, state: GrowthState, anc: torch.Tensor, width: int, backend, method: str = "auto", workspace=None) -> int:
    """Apply a global resampling ``slot j <- particle anc[j]`` (canonical order) on every rank.

    Parameters
    ----------
    grower, state : this rank's (``state`` holds global particles ``[rank n, (rank+1) n)``)
    anc : LongTensor [N], the same on every rank, ``canonical_ancestors`` order within islands
    width : int, the largest tree on any rank (the same on every rank)
    backend : Backend
    method : redistribution method (see ``torchtree.distributed.redistribute``)
    workspace : torchtree.distributed.Workspace, optional

    Returns
    -------
    int : particles this rank received from other ranks.

    Notes
    -----
    Collective only when some particle changes rank (every rank knows ``anc``, so they
    agree); otherwise a local ``take_``.
    """
    r, W = backend.rank, backend.world_size
    n = state.n_particles
    N = n * W
    dev = state.node_uid.device
    anc = anc.to(dev)
    g0 = r * n
    mine = anc[g0:g0 + n]
    src = torch.div(anc, n, rounding_mode="floor")
    dst = torch.div(torch.arange(N, device=dev), n, rounding_mode="floor")
    cross = src != dst
    if not bool(cross.any()):
        state.take_(mine - g0)
        return 0
    ncopies = torch.bincount(anc, minlength=N)
    send_rows = torch.unique(anc[cross & (src == r)]) - g0
    block = export_particles(grower, state, send_rows, width, n_rows=n)
    recv = redistribute(block, ncopies[g0:g0 + n], backend, method=method, workspace=workspace)
    remote = src[g0:g0 + n] != r
    rem = remote.nonzero().squeeze(1)
    loc = (~remote).nonzero().squeeze(1)
    ra = mine[rem]
    ua, uinv = torch.unique(ra, return_inverse=True)
    first = torch.full((ua.numel(),), rem.numel(), dtype=torch.long, device=dev)
    first.scatter_reduce_(0, uinv, torch.arange(rem.numel(), device=dev), "amin")
    got = take_rows(recv, rem[first])
    if bool((got["n_nodes"] < 1).any()):
        raise RuntimeError("internal error: redistribution delivered an empty particle")
    new_uid, new_nn = import_particles(grower, got, torch.div(ua, n, rounding_mode="floor"))
    state.reserve(width)
    C = state.node_uid.shape[1]
    node_uid = torch.zeros(n, C, dtype=state.node_uid.dtype, device=dev)
    n_nodes = torch.empty_like(state.n_nodes)
    node_uid[loc] = state.node_uid[mine[loc] - g0]
    n_nodes[loc] = state.n_nodes[mine[loc] - g0]
    node_uid[rem, :width] = new_uid[uinv]
    n_nodes[rem] = new_nn[uinv]
    state.node_uid, state.n_nodes = node_uid, n_nodes
    return int(rem.numel())


def gather_trees(grower: Grower, state: GrowthState, backend, width: int) -> HardTrees:
    """Every rank's particles as one global :class:`HardTrees` ``[N]`` on every rank.

    One ``all_gather`` of the packed trees (capacity ``width`` = the largest tree anywhere,
    as the one-process ``Grower.to_trees`` trims to).
    """
    trees = grower.to_trees(state)
    if trees.capacity != width:
        trees = trees.with_capacity(width)
    d = trees.as_dict()
    layout = BlockLayout(d)
    buf = backend.all_gather(layout.pack(d))
    return HardTrees.from_dict(layout.unpack(buf))


def expansion_pairs(grower: Grower, particles: GrowthState, expansion: str, stage: int):
    """The (particle, slot) pairs a stage expands: node ``stage`` of every tree that has it
    (``"node"``, breadth-first) or every open leaf (``"layer"``).

    Returns
    -------
    (pp, nn) : LongTensor [A] particle rows, LongTensor [A] slots.
    """
    if expansion == "node":
        pp = (particles.n_nodes > stage).nonzero().squeeze(1)
        return pp, torch.full_like(pp, stage)
    return (grower.slot_status(particles) == OPEN).nonzero(as_tuple=True)


def tree_report(grower: Grower, particles: GrowthState) -> dict:
    """Leaves and depth of the particles' trees (mean and max), for the monitors."""
    st = grower.slot_status(particles)
    is_leaf = (st == OPEN) | (st == LEAF)
    leaves = is_leaf.sum(1).double()
    depth = torch.where(is_leaf, grower.table.depth[particles.node_uid.long()], 0).amax(1).double()
    return {"trees/leaves_mean": float(leaves.mean()), "trees/leaves_max": float(leaves.max()),
            "trees/depth_mean": float(depth.mean()), "trees/depth_max": float(depth.max())}
