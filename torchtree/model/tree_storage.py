"""Compact storage of :class:`HardTrees` for posterior files and checkpoints.

A batch of trees is stored as

* runs: with ``stride`` (the chains of an MCMC run, kept draw after draw), a tree equal
  to the one ``stride`` places before it (the same chain's previous draw: a rejected
  move) is stored once, and ``index`` maps every tree to its stored copy;
* only the used node slots (no padding to the capacity), and for the split fields
  (feature, threshold, children) only the internal nodes;
* the narrowest integer type that holds each index field, and the statistics as
  integers when they are whole numbers (class counts) that convert back bit for bit;
* no parent array: it follows from the children.

:func:`expand_trees` gives back trees equal to the stored ones in every field and bit
(dtypes and capacity included). Trees this layout cannot reproduce exactly (extra
per-node fields, non-canonical padding) are stored as they are.
"""
from __future__ import annotations

from typing import Any, Dict

import torch

from torchtree.core.memory import available_bytes, format_bytes
from torchtree.model.trees import INTERNAL, NODE_FIELDS, NODE_FILL, HardTrees

__all__ = ["COMPACT_FORMAT", "compact_trees", "expand_trees", "is_compact"]

COMPACT_FORMAT = "torchtree.CompactTrees/1"
_CHUNK = 4096  # trees compared at once when finding runs


def is_compact(d: Any) -> bool:
    """Whether ``d`` is the output of :func:`compact_trees`."""
    return isinstance(d, dict) and d.get("format") == COMPACT_FORMAT


def _narrow(t: torch.Tensor) -> torch.Tensor:
    """``t`` (integers) in the narrowest of int8 / int16 / int32 / int64 that holds it."""
    if t.numel() == 0:
        return t.to(torch.int8)
    lo, hi = int(t.min()), int(t.max())
    for dt in (torch.int8, torch.int16, torch.int32):
        info = torch.iinfo(dt)
        if info.min <= lo and hi <= info.max:
            return t.to(dt)
    return t.to(torch.int64)


def _bits(t: torch.Tensor) -> torch.Tensor:
    """Bit pattern of a float tensor as integers (so -0.0 and NaNs compare exactly)."""
    if t.dtype.is_floating_point:
        return t.view({8: torch.int64, 4: torch.int32, 2: torch.int16}[t.element_size()])
    return t


def _same_as_before(trees: HardTrees, stride: int) -> torch.Tensor:
    """BoolTensor [P]: tree ``i`` equals tree ``i - stride`` in every field (False for ``i < stride``)."""
    P = trees.n_trees
    same = torch.zeros(P, dtype=torch.bool)
    fields = [_bits(getattr(trees, f)).reshape(P, -1) for f in NODE_FIELDS] + [trees.n_nodes[:, None]]
    for s in range(stride, P, _CHUNK):
        e = min(s + _CHUNK, P)
        eq = torch.ones(e - s, dtype=torch.bool)
        for f in fields:
            eq &= (f[s:e] == f[s - stride : e - stride]).all(1)
        same[s:e] = eq
    return same


def _derive_parent(left: torch.Tensor, right: torch.Tensor, internal: torch.Tensor) -> torch.Tensor:
    """Parent array ``[Q, C]`` int64 implied by the children of the internal nodes."""
    parent = torch.full(left.shape, -1, dtype=torch.long)
    p, n = internal.nonzero(as_tuple=True)
    parent[p, left[p, n].long()] = n
    parent[p, right[p, n].long()] = n
    return parent


def compact_trees(trees: HardTrees, stride: int = 0) -> Dict[str, Any]:
    """Compact plain-tensor form of ``trees`` (see the module docstring).

    Parameters
    ----------
    trees : HardTrees [P] (any device; stored on the CPU)
    stride : int
        Store a tree equal to the one ``stride`` before it once (0: no runs). For MCMC
        draws kept as ``[draws, chains]`` flattened, ``stride = chains``.

    Returns
    -------
    dict of tensors, ints and strings (what ``torch.load(weights_only=True)`` reads).
    """
    t = trees.to("cpu")
    dtypes = {f: str(getattr(t, f).dtype).removeprefix("torch.") for f in NODE_FIELDS + ("n_nodes",)}
    raw = {"format": COMPACT_FORMAT, "raw": t.as_dict()}
    if t.extra:
        return raw
    P, C = t.n_trees, t.capacity
    index = None
    if stride > 0 and P > stride:
        same = _same_as_before(t, stride)
        if bool(same.any()):
            rank = torch.cumsum(~same, 0) - 1  # a stored tree's position among the stored
            pos = torch.where(same, torch.full((P,), -1), torch.arange(P))
            T = -(-P // stride)
            pad = torch.full((T * stride - P,), -1, dtype=torch.long)
            last = torch.cummax(torch.cat([pos, pad]).view(T, stride), 0).values.reshape(-1)[:P]
            index = rank[last]
            t = t.take((~same).nonzero().squeeze(1))
    used = torch.arange(C)[None] < t.n_nodes[:, None]
    status = t.status
    internal = status == INTERNAL
    leafy = used & ~internal
    # the layout stores nothing else, so refuse anything it would not give back
    ok = all(bool((_bits(getattr(t, f))[~used] == _bits(torch.tensor(NODE_FILL[f], dtype=getattr(t, f).dtype))).all())
             for f in ("feature", "threshold", "left", "right", "parent", "depth", "status"))
    ok = ok and bool((_bits(t.stats)[~used] == 0).all())
    ok = ok and bool((t.feature[leafy] == -1).all() and (t.left[leafy] == -1).all() and (t.right[leafy] == -1).all())
    ok = ok and bool((_bits(t.threshold)[leafy] == 0).all())
    if ok:
        ok = bool((_derive_parent(t.left, t.right, internal)[used] == t.parent[used].long()).all())
    if not ok:
        return raw
    stats = t.stats[used]
    if stats.dtype.is_floating_point:
        whole = stats.round()
        if bool(torch.isfinite(stats).all()) and float(whole.abs().max() if whole.numel() else 0) < 2 ** 31:
            as_int = _narrow(whole.to(torch.int64))
            if torch.equal(_bits(as_int.to(stats.dtype)), _bits(stats)):
                stats = as_int
    out: Dict[str, Any] = {
        "format": COMPACT_FORMAT, "capacity": C, "n_trees": P, "dtypes": dtypes,
        "n_nodes": _narrow(t.n_nodes), "status": t.status[used], "depth": _narrow(t.depth[used]), "stats": stats,
        "feature": _narrow(t.feature[internal]), "threshold": t.threshold[internal],
        "left": _narrow(t.left[internal]), "right": _narrow(t.right[internal]),
    }
    if index is not None:
        out["index"] = _narrow(index)
    return out


def _check_expansion(n_trees: int, capacity: int, dtypes: Dict[str, torch.dtype], n_stats: int) -> None:
    """Refuse padded arrays of ``n_trees`` x ``capacity`` slots that would not fit in the memory available: a
    file of a few hundred kB can declare any capacity (an edit that recomputed the checksum)."""
    per_slot = sum(dtypes[k].itemsize for k in NODE_FIELDS if k in dtypes and k != "stats")
    per_slot += n_stats * dtypes["stats"].itemsize
    need = 2 * n_trees * capacity * per_slot  # the arrays and the temporaries that fill them
    have = available_bytes()
    if have is not None and need > have:
        raise ValueError(f"{n_trees} trees of capacity {capacity} would take {format_bytes(need)} to load, more than "
                         f"the {format_bytes(have)} available")


def expand_trees(d: Dict[str, Any]) -> HardTrees:
    """Inverse of :func:`compact_trees`: the stored trees, on the CPU.

    Raises
    ------
    ValueError
        ``d`` is malformed (a damaged or edited file).
    """
    if not is_compact(d):
        raise ValueError("not compact trees")
    if "raw" in d:
        return HardTrees.from_dict(d["raw"])
    try:
        dt = {k: getattr(torch, v) for k, v in d["dtypes"].items()}
        C = int(d["capacity"])
        n_nodes = d["n_nodes"].long()
        Q = n_nodes.shape[0]
        if bool((n_nodes < 1).any() or (n_nodes > C).any()):
            raise ValueError("node counts out of range")
        _check_expansion(max(Q, int(d["index"].numel()) if "index" in d else 0), C, dt, int(d["stats"].shape[-1]))
        used = torch.arange(C)[None] < n_nodes[:, None]
        status = torch.zeros(Q, C, dtype=dt["status"])
        status[used] = d["status"].to(dt["status"])
        stats = torch.zeros(Q, C, d["stats"].shape[-1], dtype=dt["stats"])
        stats[used] = d["stats"].to(dt["stats"])
        internal = status == INTERNAL

        def split_field(name, fill):
            out = torch.full((Q, C), fill, dtype=dt[name])
            out[internal] = d[name].to(dt[name])
            return out

        feature, threshold = split_field("feature", -1), split_field("threshold", 0)
        left, right = split_field("left", -1), split_field("right", -1)
        if bool(((left[internal] <= 0) | (left[internal] >= C) | (right[internal] <= 0) | (right[internal] >= C)).any()):
            raise ValueError("child index out of range")
        depth = torch.zeros(Q, C, dtype=dt["depth"])
        depth[used] = d["depth"].to(dt["depth"])
        parent = _derive_parent(left, right, internal).to(dt["parent"])
        trees = HardTrees(feature, threshold, left, right, parent, depth, status, stats, n_nodes.to(dt["n_nodes"]))
        if "index" in d:
            index = d["index"].long()
            if index.shape != (int(d["n_trees"]),) or bool((index < 0).any() or (index >= Q).any()):
                raise ValueError("tree index out of range")
            trees = trees.take(index)
    except (KeyError, TypeError, AttributeError, RuntimeError, IndexError) as exc:
        raise ValueError(f"malformed compact trees ({type(exc).__name__}: {exc})") from None
    return trees
