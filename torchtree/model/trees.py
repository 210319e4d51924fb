"""``HardTrees``: P decision trees held in padded pointer arrays.

Layout (P trees, capacity C nodes each, S sufficient statistics per node)::

    feature   int32   [P, C]   split dimension; -1 for leaves and unused slots
    threshold float   [P, C]   cut location: x[feature] <= threshold goes left
    left      int32   [P, C]   left child index, -1 if none
    right     int32   [P, C]   right child index, -1 if none
    parent    int32   [P, C]   parent index, -1 for the root and unused slots
    depth     int32   [P, C]   root has depth 0
    status    int8    [P, C]   UNUSED=0, OPEN=1 (leaf still to be considered),
                               LEAF=2 (stopped leaf), INTERNAL=3
    stats     float   [P, C, S] per-node sufficient statistics of the labels
    n_nodes   int64   [P]      nodes in use; slots [0, n_nodes) are used
    extra     dict name -> [P, C, ...] per-node fields a sampler keeps with the trees

The root is node 0 and children are appended, so a node's index is its creation
order. ``take(index)`` gathers whole particles; since every particle is padded to
the same capacity this is the shared-memory redistribution of variable-size
samples. Capacity grows by doubling.
"""
from __future__ import annotations

from typing import Dict, Optional

import torch

from torchtree.kernels.traversal import leaf_index as _leaf_index
from torchtree.model.tree_checks import asserting, check_pointers

__all__ = ["HardTrees", "UNUSED", "OPEN", "LEAF", "INTERNAL"]

UNUSED, OPEN, LEAF, INTERNAL = 0, 1, 2, 3

NODE_FIELDS = ("feature", "threshold", "left", "right", "parent", "depth", "status", "stats")
NODE_FILL = {"feature": -1, "threshold": 0.0, "left": -1, "right": -1, "parent": -1, "depth": 0, "status": UNUSED, "stats": 0}


class HardTrees:
    """A batch of P binary decision trees in padded pointer arrays (capacity C nodes each, S
    sufficient statistics per node).

    Construct with :meth:`roots` (P single-node trees) or :meth:`from_dict`. The root is node 0
    and children are appended, so a node's index is its creation order; capacity grows by doubling.

    Parameters
    ----------
    feature : IntTensor [P, C], the split dimension; -1 for leaves and unused slots
    threshold : Tensor [P, C], the cut: ``x[feature] <= threshold`` goes left
    left, right : IntTensor [P, C], the children's indices, -1 if none
    parent : IntTensor [P, C], -1 for the root and unused slots
    depth : IntTensor [P, C], 0 at the root
    status : Int8Tensor [P, C], ``UNUSED`` 0, ``OPEN`` 1 (a leaf still to be considered for
        expansion), ``LEAF`` 2 (a stopped leaf), ``INTERNAL`` 3
    stats : Tensor [P, C, S], each node's sufficient statistics of the labels (the likelihood's)
    n_nodes : LongTensor [P], nodes in use: slots ``[0, n_nodes)``
    extra : dict name -> Tensor [P, C, ...], optional; per-node fields a sampler keeps with the trees
    """

    def __init__(
        self,
        feature: torch.Tensor,
        threshold: torch.Tensor,
        left: torch.Tensor,
        right: torch.Tensor,
        parent: torch.Tensor,
        depth: torch.Tensor,
        status: torch.Tensor,
        stats: torch.Tensor,
        n_nodes: torch.Tensor,
        extra: Optional[Dict[str, torch.Tensor]] = None,
    ) -> None:
        self.feature, self.threshold = feature, threshold
        self.left, self.right, self.parent = left, right, parent
        self.depth, self.status, self.stats = depth, status, stats
        self.n_nodes = n_nodes
        self.extra: Dict[str, torch.Tensor] = dict(extra or {})

    # ------------------------------------------------------------ construction
    @classmethod
    def roots(
        cls,
        n_trees: int,
        root_stats: torch.Tensor,
        capacity: int = 16,
        threshold_dtype: torch.dtype = torch.float32,
        status: int = OPEN,
    ) -> "HardTrees":
        """P trees that are a single root node each.

        Parameters
        ----------
        n_trees : int
            P.
        root_stats : Tensor [S] or [P, S]
            Sufficient statistics of all the data (the root's).
        capacity : int
            Initial node capacity C (grows by doubling when needed).
        threshold_dtype : torch.dtype
            Dtype of thresholds (match the data's).
        status : int
            Initial status of the root (OPEN for top-down growth, LEAF for MCMC).

        Returns
        -------
        HardTrees
        """
        if n_trees < 1:
            raise ValueError(f"n_trees must be >= 1, got {n_trees}")
        capacity = max(int(capacity), 1)
        dev = root_stats.device
        P, C = n_trees, capacity
        S = root_stats.shape[-1]
        i32 = dict(dtype=torch.int32, device=dev)
        trees = cls(
            feature=torch.full((P, C), -1, **i32),
            threshold=torch.zeros(P, C, dtype=threshold_dtype, device=dev),
            left=torch.full((P, C), -1, **i32),
            right=torch.full((P, C), -1, **i32),
            parent=torch.full((P, C), -1, **i32),
            depth=torch.zeros(P, C, **i32),
            status=torch.zeros(P, C, dtype=torch.int8, device=dev),
            stats=torch.zeros(P, C, S, dtype=root_stats.dtype, device=dev),
            n_nodes=torch.ones(P, dtype=torch.long, device=dev),
        )
        trees.status[:, 0] = status
        trees.stats[:, 0] = root_stats
        return trees

    # --------------------------------------------------------------- shape info
    @property
    def n_trees(self) -> int:
        """Number of trees P."""
        return self.feature.shape[0]

    def __len__(self) -> int:
        return self.n_trees

    @property
    def capacity(self) -> int:
        """Node capacity C."""
        return self.feature.shape[1]

    @property
    def device(self) -> torch.device:
        """Device of the arrays."""
        return self.feature.device

    def node_fields(self) -> Dict[str, torch.Tensor]:
        """All per-node tensors [P, C, ...] by name (core fields and extras)."""
        out = {name: getattr(self, name) for name in NODE_FIELDS}
        out.update({f"extra.{k}": v for k, v in self.extra.items()})
        return out

    # ------------------------------------------------------------ manipulation
    def reserve(self, needed: int) -> None:
        """Grow capacity (by doubling) so that ``needed`` nodes fit in every tree."""
        if needed <= self.capacity:
            return
        new_c = self.capacity
        while new_c < needed:
            new_c *= 2
        self._set_capacity(new_c)

    def with_capacity(self, capacity: int) -> "HardTrees":
        """A copy padded (or trimmed) to ``capacity`` nodes; trimming below the
        largest tree raises ``ValueError``."""
        out = self.clone()
        out._set_capacity(capacity)
        return out

    def _set_capacity(self, new_c: int) -> None:
        if new_c < int(self.n_nodes.max()):
            raise ValueError(f"capacity {new_c} is below the largest tree ({int(self.n_nodes.max())} nodes)")
        old_c = self.capacity
        if new_c == old_c:
            return

        def resize(t: torch.Tensor, fill) -> torch.Tensor:
            if new_c < old_c:
                return t[:, :new_c].contiguous()
            pad = torch.full((t.shape[0], new_c - old_c) + tuple(t.shape[2:]), fill, dtype=t.dtype, device=t.device)
            return torch.cat([t, pad], 1)

        for name in NODE_FIELDS:
            setattr(self, name, resize(getattr(self, name), NODE_FILL[name]))
        self.extra = {k: resize(v, 0) for k, v in self.extra.items()}

    def take(self, index: torch.Tensor) -> "HardTrees":
        """Gather particles: ``out[i] = self[index[i]]``.

        Parameters
        ----------
        index : LongTensor [Q]

        Returns
        -------
        HardTrees with Q trees.
        """
        index = index.to(self.device)
        return HardTrees(
            **{name: getattr(self, name).index_select(0, index) for name in NODE_FIELDS},
            n_nodes=self.n_nodes.index_select(0, index),
            extra={k: v.index_select(0, index) for k, v in self.extra.items()},
        )

    def take_(self, index: torch.Tensor, moved: Optional[torch.Tensor] = None) -> None:
        """In-place gather ``self[i] = self[index[i]]`` copying only rows that change.

        Parameters
        ----------
        index : LongTensor [P]
            Ancestors, ideally from ``stable_ancestors`` so survivors keep their slot.
        moved : BoolTensor [P], optional
            Rows to rewrite (default ``index != arange(P)``).
        """
        index = index.to(self.device)
        if moved is None:
            moved = index != torch.arange(self.n_trees, device=self.device)
        dst = moved.nonzero().squeeze(1)
        if dst.numel() == 0:
            return
        src = index[dst]
        for name in NODE_FIELDS:
            t = getattr(self, name)
            t[dst] = t[src]
        self.n_nodes[dst] = self.n_nodes[src]
        for t in self.extra.values():
            t[dst] = t[src]

    def clone(self) -> "HardTrees":
        """Deep copy."""
        return HardTrees(
            **{name: getattr(self, name).clone() for name in NODE_FIELDS},
            n_nodes=self.n_nodes.clone(),
            extra={k: v.clone() for k, v in self.extra.items()},
        )

    def to(self, device) -> "HardTrees":
        """Copy to ``device``."""
        return HardTrees(
            **{name: getattr(self, name).to(device) for name in NODE_FIELDS},
            n_nodes=self.n_nodes.to(device),
            extra={k: v.to(device) for k, v in self.extra.items()},
        )

    @staticmethod
    def cat(parts: "list[HardTrees]") -> "HardTrees":
        """Concatenate batches of trees (capacities are padded to the largest)."""
        if not parts:
            raise ValueError("nothing to concatenate")
        c = max(p.capacity for p in parts)
        parts = [p if p.capacity == c else p.with_capacity(c) for p in parts]
        keys = set(parts[0].extra)
        return HardTrees(
            **{name: torch.cat([getattr(p, name) for p in parts]) for name in NODE_FIELDS},
            n_nodes=torch.cat([p.n_nodes for p in parts]),
            extra={k: torch.cat([p.extra[k] for p in parts]) for k in keys},
        )

    # ------------------------------------------------------------ serialising
    def as_dict(self) -> Dict[str, torch.Tensor]:
        """Plain tensors by name (every tensor has leading dim P); inverse of :meth:`from_dict`."""
        d = {name: getattr(self, name) for name in NODE_FIELDS}
        d["n_nodes"] = self.n_nodes
        d.update({f"extra.{k}": v for k, v in self.extra.items()})
        return d

    @classmethod
    def from_dict(cls, d: Dict[str, torch.Tensor]) -> "HardTrees":
        """Rebuild from :meth:`as_dict` output."""
        missing = [k for k in NODE_FIELDS + ("n_nodes",) if k not in d]
        if missing:
            raise ValueError(f"tree dict lacks fields {missing}")
        extra = {k[len("extra."):]: v for k, v in d.items() if k.startswith("extra.")}
        return cls(**{k: d[k] for k in NODE_FIELDS}, n_nodes=d["n_nodes"], extra=extra)

    # ------------------------------------------------------------- inspection
    def is_leaf(self) -> torch.Tensor:
        """BoolTensor [P, C]: open or stopped leaves."""
        return (self.status == OPEN) | (self.status == LEAF)

    def n_leaves(self) -> torch.Tensor:
        """LongTensor [P]: leaves per tree."""
        return self.is_leaf().sum(1)

    def max_depth(self) -> torch.Tensor:
        """LongTensor [P]: depth of the deepest leaf of each tree."""
        return torch.where(self.is_leaf(), self.depth, torch.zeros_like(self.depth)).amax(1).long()

    def n_open(self) -> torch.Tensor:
        """LongTensor [P]: leaves still to be considered for expansion."""
        return (self.status == OPEN).sum(1)

    def leaf_index(self, X: torch.Tensor, chunk_pairs: int = 1 << 23) -> torch.Tensor:
        """Leaf reached by every point in every tree.

        Parameters
        ----------
        X : Tensor [M, D]
        chunk_pairs : int
            Bound on trees x points processed at once (memory).

        Returns
        -------
        LongTensor [P, M]
        """
        X = X.to(self.device)
        P, M = self.n_trees, X.shape[0]
        step = max(1, chunk_pairs // max(M, 1))
        if step >= P:
            return _leaf_index(self.feature, self.threshold, self.left, self.right, X)
        return torch.cat(
            [
                _leaf_index(self.feature[s : s + step], self.threshold[s : s + step], self.left[s : s + step], self.right[s : s + step], X)
                for s in range(0, P, step)
            ]
        )

    def predict(self, X: torch.Tensor, likelihood, table: Optional[torch.Tensor] = None) -> torch.Tensor:
        """Per-tree posterior predictive at ``X``.

        Parameters
        ----------
        X : Tensor [M, D]
        likelihood : a likelihood with ``predictive_table(stats)`` (e.g. DirichletMultinomial)
        table : Tensor [P, C, K], optional, ``likelihood.predictive_table(self.stats)`` when already made
            (a caller predicting several blocks of rows builds it once)

        Returns
        -------
        Tensor [P, M, K] (class probabilities) or [P, M, 3] (Student-t df, loc, scale).
        """
        leaves = self.leaf_index(X)
        table = likelihood.predictive_table(self.stats) if table is None else table  # [P, C, K]
        return torch.gather(table, 1, leaves[:, :, None].expand(-1, -1, table.shape[-1]))

    def route_counts(self, X: torch.Tensor) -> torch.Tensor:
        """Number of rows of ``X`` reaching each node (internal nodes included).

        Returns
        -------
        LongTensor [P, C]
        """
        leaves = self.leaf_index(X)
        P, C = self.n_trees, self.capacity
        counts = torch.zeros(P, C, dtype=torch.long, device=self.device)
        counts.scatter_add_(1, leaves, torch.ones_like(leaves))
        # Push leaf counts up to the ancestors, deepest level first.
        depth = torch.where(self.status != UNUSED, self.depth, torch.full_like(self.depth, -1))
        for lev in range(int(depth.max()), 0, -1):
            at = depth == lev
            p_idx, n_idx = at.nonzero(as_tuple=True)
            par = self.parent[p_idx, n_idx].long()
            counts.index_put_((p_idx, par), counts[p_idx, n_idx], accumulate=True)
        return counts

    def validate(self, data=None, likelihood=None) -> None:
        """Check structural invariants; raise ``AssertionError`` naming the first violation (also under
        ``python -O``: the checks are explicit).

        The invariants are :func:`~torchtree.model.tree_checks.check_pointers`', plus: ``n_nodes`` in
        ``[1, C]``, status ``UNUSED`` on exactly the slots past it, feature and children -1 there too, and a
        split node's statistics the sum of its children's (to rounding relative to theirs: a centred sum can
        cancel to about 0 while its parts are large).

        Parameters
        ----------
        data : Data, optional
            With ``likelihood``, also check that every leaf's statistics equal those of the training data
            routed to it, and that every leaf holds some.
        likelihood : likelihood object, optional
        """
        P, C = self.n_trees, self.capacity
        used = torch.arange(C, device=self.device)[None, :] < self.n_nodes[:, None]
        st = self.status
        asserting("n_nodes", (self.n_nodes >= 1) & (self.n_nodes <= C), "out of range")
        asserting("status", (st != UNUSED) == used, "UNUSED must mark exactly the slots >= n_nodes")
        internal = st == INTERNAL
        asserting("feature", (self.feature >= 0) == internal, ">= 0 exactly on internal nodes")
        asserting("left", (self.left >= 0) == internal, "children exactly on internal nodes")
        asserting("right", (self.right >= 0) == internal, "children exactly on internal nodes")
        check_pointers(asserting, self.feature, self.left, self.right, self.parent, self.depth, internal,
                       self.n_nodes)
        pi, ni = internal.nonzero(as_tuple=True)
        if pi.numel():
            s = self.stats
            sl, sr = s[pi, self.left[pi, ni].long()].double(), s[pi, self.right[pi, ni].long()].double()
            gap = (s[pi, ni].double() - (sl + sr)).abs()
            asserting("stats", gap <= 1e-9 * (sl.abs() + sr.abs()) + 1e-6, "of a split node must equal the sum of "
                      "its children's")
        if data is not None and likelihood is not None:
            leaves = self.leaf_index(data.X)
            S = self.stats.shape[-1]
            pstats = likelihood.point_stats(data.y, data.n_classes).to(self.stats.dtype)  # [N, S]
            rec = torch.zeros(P, C, S, dtype=self.stats.dtype, device=self.device)
            rec.scatter_add_(1, leaves[:, :, None].expand(-1, -1, S), pstats[None].expand(P, -1, -1).contiguous())
            lv = self.is_leaf()
            asserting("stats", torch.allclose(rec[lv].double(), self.stats[lv].double(), atol=1e-5, rtol=1e-7),
                      "at the leaves differ from the data routed through the tree")
            n_at_leaf = torch.zeros(P, C, dtype=torch.long, device=self.device).scatter_add_(1, leaves, torch.ones_like(leaves))
            asserting("stats", n_at_leaf[lv] > 0, "count a leaf that holds no training data")

    def __repr__(self) -> str:
        return f"HardTrees(P={self.n_trees}, capacity={self.capacity}, max_nodes={int(self.n_nodes.max())}, device={self.device})"
