"""Tree topologies in heap indexing, their Chipman prior and grow / prune / stay moves.

A topology (paper 004's discrete variable ``m``) is the set of internal nodes of a
binary tree. Nodes are heap-indexed: the root is 0, node ``i`` has children
``2i+1`` (left) and ``2i+2`` (right), and its depth is ``floor(log2(i+1))``. Because
a heap index does not depend on how deep the tree is padded, parameters of the same
node line up across topologies of different depths (see :mod:`torchtree.model.soft_trees`).

The topology itself is small bookkeeping (a handful of integers), so this module is
plain Python; everything over data and chains is batched elsewhere.
"""
from __future__ import annotations

import math
import random as _pyrandom
from dataclasses import dataclass
from typing import Iterable, List, Optional, Sequence, Tuple

import torch

from torchtree.model.priors import check_split_prior
from torchtree.core.validate import check_int

__all__ = [
    "Topology",
    "node_depth",
    "leaf_slot",
    "sample_prior_topologies",
    "propose_topology",
    "stack_node_masks",
]


def node_depth(i: int) -> int:
    """Depth of heap node ``i`` (root = 0)."""
    return (i + 1).bit_length() - 1


def leaf_slot(leaf: int, depth: int) -> int:
    """Leaf slot (0..2**depth-1) of heap node ``leaf`` when padded to ``depth``.

    A leaf above the padded depth collects its mass in its leftmost descendant at
    ``depth``, because padded internal nodes route everything left.
    """
    e = node_depth(leaf)
    if e > depth:
        raise ValueError(f"leaf {leaf} (depth {e}) is deeper than the padded depth {depth}")
    return (leaf + 1) * (1 << (depth - e)) - 1 - ((1 << depth) - 1)


@dataclass(frozen=True, order=True)
class Topology:
    """A binary-tree topology: the sorted heap indices of its internal nodes.

    Parameters
    ----------
    internal : tuple of int
        Heap indices of the internal nodes; must be closed under taking parents.
        The empty tuple is the single-leaf tree.

    Examples
    --------
    >>> Topology.full(2).internal
    (0, 1, 2)
    >>> Topology((0, 2)).leaves
    (1, 5, 6)
    """

    internal: Tuple[int, ...]

    def __post_init__(self) -> None:
        nodes = tuple(sorted(set(int(i) for i in self.internal)))
        object.__setattr__(self, "internal", nodes)
        s = set(nodes)
        for i in nodes:
            if i < 0:
                raise ValueError(f"negative heap index {i}")
            if i > 0 and (i - 1) // 2 not in s:
                raise ValueError(f"node {i} is internal but its parent {(i - 1) // 2} is not")

    # ------------------------------------------------------------- construction
    @classmethod
    def full(cls, depth: int) -> "Topology":
        """The complete tree with ``2**depth - 1`` internal nodes."""
        if not 0 <= int(depth) <= 30:
            raise ValueError(f"a tree's depth must lie in [0, 30], got {depth}")
        return cls(tuple(range((1 << int(depth)) - 1)))

    @classmethod
    def coerce(cls, obj) -> "Topology":
        """Accept a Topology, a depth (int: full tree) or an iterable of node indices."""
        if isinstance(obj, Topology):
            return obj
        if isinstance(obj, int):
            return cls.full(obj)
        return cls(tuple(obj))

    # ------------------------------------------------------------- structure
    @property
    def n_internal(self) -> int:
        """Number of internal nodes."""
        return len(self.internal)

    @property
    def leaves(self) -> Tuple[int, ...]:
        """Heap indices of the leaves, ascending."""
        if not self.internal:
            return (0,)
        s = set(self.internal)
        out = []
        for i in self.internal:
            for c in (2 * i + 1, 2 * i + 2):
                if c not in s:
                    out.append(c)
        return tuple(sorted(out))

    @property
    def n_leaves(self) -> int:
        """Number of leaves (``n_internal + 1``)."""
        return self.n_internal + 1

    @property
    def depth(self) -> int:
        """Depth of the deepest leaf (0 for the single-leaf tree)."""
        return max(node_depth(i) for i in self.leaves)

    def node_mask(self, depth: Optional[int] = None) -> torch.Tensor:
        """BoolTensor [2**depth - 1]: which internal slots are real internal nodes."""
        depth = self.depth if depth is None else depth
        m = torch.zeros((1 << depth) - 1, dtype=torch.bool)
        if self.internal:
            m[list(self.internal)] = True
        return m

    def leaf_slots(self, depth: Optional[int] = None) -> Tuple[int, ...]:
        """Padded leaf slot of each real leaf (in :attr:`leaves` order)."""
        depth = self.depth if depth is None else depth
        return tuple(leaf_slot(l, depth) for l in self.leaves)

    def growable(self, max_depth: int) -> Tuple[int, ...]:
        """Leaves that may be split without exceeding ``max_depth``."""
        return tuple(l for l in self.leaves if node_depth(l) < max_depth)

    def prunable(self) -> Tuple[int, ...]:
        """Internal nodes whose two children are both leaves."""
        s = set(self.internal)
        return tuple(i for i in self.internal if (2 * i + 1) not in s and (2 * i + 2) not in s)

    def grow(self, leaf: int) -> "Topology":
        """The topology with ``leaf`` made internal."""
        if leaf not in self.leaves:
            raise ValueError(f"{leaf} is not a leaf of {self}")
        return Topology(self.internal + (leaf,))

    def prune(self, node: int) -> "Topology":
        """The topology with the two leaf children of ``node`` removed."""
        if node not in self.prunable():
            raise ValueError(f"{node} is not prunable in {self}")
        return Topology(tuple(i for i in self.internal if i != node))

    # ------------------------------------------------------------- prior
    def log_prior(self, alpha_split: float = 0.95, beta_split: float = 1.0) -> float:
        """Chipman et al. (1998) structure prior (paper 004, eq. 6), unnormalised.

        ``p_split(node) = alpha_split * (1 + depth)**(-beta_split)``; internal nodes
        contribute ``log p_split`` and leaves ``log(1 - p_split)``.
        """
        lp = 0.0
        for i in self.internal:
            lp += math.log(alpha_split * (1.0 + node_depth(i)) ** (-beta_split))
        for l in self.leaves:
            lp += math.log1p(-alpha_split * (1.0 + node_depth(l)) ** (-beta_split))
        return lp

    def key(self) -> str:
        """Short string id, e.g. ``"0-1-2"`` (``"leaf"`` for the single-leaf tree)."""
        return "-".join(map(str, self.internal)) if self.internal else "leaf"

    def __repr__(self) -> str:
        return f"Topology({self.key()})"


def sample_prior_topologies(
    n: int,
    alpha_split: float = 0.95,
    beta_split: float = 1.0,
    max_depth: int = 6,
    rng: Optional[_pyrandom.Random] = None,
    min_internal: int = 1,
) -> List[Topology]:
    """Draw ``n`` topologies from the Chipman prior truncated at ``max_depth``.

    A node at depth ``k`` splits with probability ``alpha_split * (1 + k)**(-beta_split)``
    (Chipman, George & McCulloch 1998; paper 004, eq. 6), independently, from the root down;
    DCC draws its initial topologies so (paper 004, Alg. 1).

    Parameters
    ----------
    n : int
        Number of topologies, >= 0.
    alpha_split : float, default 0.95
        Base split probability ``alpha`` of the Chipman prior, in (0, 1).
    beta_split : float, default 1.0
        Depth penalty ``beta`` of the Chipman prior, >= 0.
    max_depth : int, default 6
        Leaves at this depth never split (truncation of the prior).
    rng : random.Random, optional
        Source of the draws (default: ``random.Random(0)``, so the same list every call).
    min_internal : int, default 1
        Draws with fewer internal nodes are rejected and redrawn (DCC works with
        trees that split at least once); at most ``2**max_depth - 1``.

    Returns
    -------
    list of Topology
        ``n`` draws, with repeats (the counts matter to DCC).

    Raises
    ------
    ValueError
        A bad ``n``, ``max_depth``, ``min_internal`` or split prior, or ``10000 + 1000 n``
        draws gave fewer than ``n`` trees with ``min_internal`` internal nodes (the prior
        almost never splits that much).
    """
    n = check_int("n", n, 0)
    check_split_prior(alpha_split, beta_split)
    max_depth = check_int("max_depth", max_depth, 0)
    min_internal = check_int("min_internal", min_internal, 0, (1 << max_depth) - 1)
    rng = rng or _pyrandom.Random(0)
    out: List[Topology] = []
    # rejection costs about 1 / P(at least min_internal splits) draws per kept one;
    # give up (rather than loop for ever) when that probability is tiny
    tries, max_tries = 0, 10_000 + 1_000 * n
    while len(out) < n:
        tries += 1
        if tries > max_tries:
            raise ValueError(
                f"the structure prior (alpha_split={alpha_split}, beta_split={beta_split}, max_depth={max_depth}) "
                f"gave {len(out)} of {n} trees with >= {min_internal} internal nodes in {max_tries} draws; "
                "raise alpha_split or lower beta_split")
        internal = []
        frontier = [0]
        while frontier:
            node = frontier.pop()
            d = node_depth(node)
            if d < max_depth and rng.random() < alpha_split * (1.0 + d) ** (-beta_split):
                internal.append(node)
                frontier += [2 * node + 1, 2 * node + 2]
        if len(internal) >= min_internal:
            out.append(Topology(tuple(internal)))
    return out


def propose_topology(
    topology: Topology,
    rng: _pyrandom.Random,
    move_probs: Sequence[float] = (0.6, 0.3, 0.1),
    max_depth: int = 6,
) -> Tuple[Topology, str]:
    """Global grow / prune / stay proposal from ``topology`` (paper 004, Sec. 3.2).

    Grow splits a leaf chosen uniformly among those above ``max_depth``; prune removes the
    two leaf children of an internal node chosen uniformly among those whose children are
    both leaves; stay returns ``topology`` itself. DCC uses it to propose new topologies
    near the ones it has explored.

    Parameters
    ----------
    topology : Topology
    rng : random.Random
        Source of the move and of the node.
    move_probs : (float, float, float), default (0.6, 0.3, 0.1)
        ``(p_grow, p_prune, p_stay)``, normalised by their sum. A tree with one internal
        node cannot be pruned (its grow probability takes the prune share); a tree at
        ``max_depth`` everywhere cannot grow (its prune probability takes the grow share).
    max_depth : int, default 6
        Leaves at this depth are not grown.

    Returns
    -------
    topology : Topology
        The proposed topology.
    move : str
        ``"grow"``, ``"prune"`` or ``"stay"``.
    """
    p_grow, p_prune, p_stay = (float(p) for p in move_probs)
    growable = topology.growable(max_depth)
    prunable = topology.prunable() if topology.n_internal > 1 else ()
    if not prunable:
        p_grow, p_prune = p_grow + p_prune, 0.0
    if not growable:
        p_prune, p_grow = p_prune + p_grow, 0.0
    if not growable and not prunable:
        return topology, "stay"
    u = rng.random() * (p_grow + p_prune + p_stay)
    if u < p_grow:
        return topology.grow(rng.choice(growable)), "grow"
    if u < p_grow + p_prune:
        return topology.prune(rng.choice(prunable)), "prune"
    return topology, "stay"


def stack_node_masks(topologies: Iterable[Topology], depth: int) -> torch.Tensor:
    """BoolTensor [M, 2**depth - 1] of internal-node masks for several topologies."""
    return torch.stack([t.node_mask(depth) for t in topologies])
