"""What makes padded pointer arrays a batch of trees: one statement of the structural invariants, shared by
every reader of trees it did not build (:meth:`~torchtree.model.trees.HardTrees.validate`, the posterior
loader, a resumed checkpoint's state).

The callers differ only in the error they raise, so each passes its own ``require(field, ok, why)``, which
must raise when ``ok`` (a bool, or a bool tensor all of whose elements must hold) does not hold, and may name
``field`` in its own words. The checks are explicit (not ``assert``), so they hold under ``python -O``, and
each is a few tensor operations over all trees at once; a pointer is range-checked before it indexes anything.
"""
from __future__ import annotations

from typing import Callable, Optional

import torch

__all__ = ["Require", "holds", "asserting", "check_pointers"]

Require = Callable[[str, object, str], None]


def holds(ok) -> bool:
    """``ok`` as a bool: a tensor holds when every element does (an empty one does)."""
    if isinstance(ok, torch.Tensor):
        return bool(ok.all()) if ok.numel() else True
    return bool(ok)


def asserting(field: str, ok, why: str) -> None:
    """A ``require`` that raises ``AssertionError("<field> <why>")`` (for debugging checks of trees a sampler
    built, whose violation is a bug)."""
    if not holds(ok):
        raise AssertionError(f"{field} {why}")


def check_pointers(require: Require, feature: torch.Tensor, left: torch.Tensor, right: torch.Tensor,
                   parent: torch.Tensor, depth: torch.Tensor, internal: torch.Tensor, n_nodes: torch.Tensor,
                   n_features: Optional[int] = None, heap: Optional[torch.Tensor] = None,
                   threshold: Optional[torch.Tensor] = None) -> None:
    """Trees in padded pointer arrays ``[P, C]`` (:class:`~torchtree.model.trees.HardTrees`' layout, ``n_nodes
    [P]`` already in ``[1, C]``) are trees.

    Slots ``[0, n_nodes)`` are in use and split nodes (``internal``) are among them; a split node's feature
    is at least 0 (and below ``n_features``, given), a leaf's is -1 and so are its children; a split node's
    children are two distinct later nodes of its tree, whose parent it is, one level deeper (and, with
    ``heap``, whose heap codes are ``2h`` and ``2h + 1``, the root's 1); every node in use but the root is the
    child of exactly one split; the root has no parent and depth 0; thresholds (given) of split nodes are
    finite. Slots past ``n_nodes`` are not read. Violations reach ``require`` with the field they are found
    in: ``"status"``, ``"feature"``, ``"left"``, ``"right"``, ``"parent"``, ``"depth"``, ``"heap"`` or
    ``"threshold"``.
    """
    P, C = feature.shape
    dev = feature.device
    n_nodes = n_nodes.to(dev)
    used = torch.arange(C, device=dev)[None, :] < n_nodes[:, None]
    require("status", ~internal | used, "marks split nodes past the trees' node counts")
    leaf = used & ~internal
    f = feature.long()
    ok = f >= 0 if n_features is None else (f >= 0) & (f < n_features)
    require("feature", ok[internal], "holds split features below 0" if n_features is None else
            f"holds split features outside [0, {n_features - 1}]")
    require("feature", f[leaf] == -1, "holds a feature at a leaf")
    for side, ch in (("left", left), ("right", right)):
        require(side, ch[leaf] == -1, "gives a leaf a child")
    pi, ni = internal.nonzero(as_tuple=True)
    lc, rc = left[pi, ni].long(), right[pi, ni].long()
    last = n_nodes[pi]
    for side, ch in (("left", lc), ("right", rc)):
        require(side, (ch > ni) & (ch < last), "points a split node at a slot that is not a later node of its "
                "tree")
    require("right", lc != rc, "gives a split node the same child twice")
    require("parent", parent[:, 0] == -1, "gives a root a parent")
    count = torch.zeros(P * C, dtype=torch.long, device=dev)
    if pi.numel():
        require("parent", (parent[pi, lc] == ni) & (parent[pi, rc] == ni),
                "disagrees with the children of the split nodes")
        count.index_add_(0, torch.cat([pi * C + lc, pi * C + rc]), torch.ones(2 * pi.numel(), dtype=torch.long,
                                                                              device=dev))
    nonroot = used.clone()
    nonroot[:, 0] = False
    require("left", count.view(P, C) == nonroot.long(), "leaves a node in use outside its tree, or shares one "
            "between two splits")
    require("depth", depth[:, 0] == 0, "gives a root a depth")
    if pi.numel():
        d = depth[pi, ni]
        require("depth", (depth[pi, lc] == d + 1) & (depth[pi, rc] == d + 1), "disagrees with the trees' levels")
    if heap is not None:
        require("heap", heap[:, 0] == 1, "gives a root a heap code other than 1")
        if pi.numel():
            h = heap[pi, ni]
            require("heap", (heap[pi, lc] == 2 * h) & (heap[pi, rc] == 2 * h + 1), "disagrees with the trees' paths")
    if threshold is not None:
        require("threshold", torch.isfinite(threshold[internal]), "holds a NaN or infinite threshold")
