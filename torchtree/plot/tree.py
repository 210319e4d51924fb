"""``plot_tree``: one tree of a posterior drawn as boxes, split rules in the internal nodes and leaf
values or class probabilities in the leaves."""
from __future__ import annotations

import re
import textwrap
from dataclasses import dataclass, field
from typing import Any, Dict, List, Optional, Sequence, Tuple

import numpy as np
import torch

from torchtree.model.bart import LEAF
from torchtree.model.encoding import rule_text
from torchtree.model.trees import INTERNAL
from torchtree.plot.common import input_names, kind_of, new_axes, posterior_of, require_matplotlib

__all__ = ["plot_tree", "TreeDrawing", "tree_drawing"]


@dataclass
class TreeDrawing:
    """A tree to draw: node labels, which nodes are leaves, each internal node's (left, right) children
    and the labels of the edges to them, and a title."""

    labels: Dict[int, str]
    children: Dict[int, Tuple[int, int]] = field(default_factory=dict)
    edge_labels: Dict[Tuple[int, int], str] = field(default_factory=dict)
    title: str = ""
    root: int = 0

    @property
    def leaves(self) -> List[int]:
        return [n for n in self.labels if n not in self.children]


def _check_index(name: str, i: int, n: int) -> int:
    i = int(i)
    if not 0 <= i < n:
        raise IndexError(f"{name} {i} out of range [0, {n})")
    return i


def _hard(post, draw: Optional[int], names: Sequence[str], max_classes: int) -> TreeDrawing:
    w = post.weights
    i = int(torch.argmax(w)) if draw is None else _check_index("draw", draw, post.trees.n_trees)
    t = post.trees
    n = int(t.n_nodes[i])
    table = post.likelihood.predictive_table(t.stats[i, :n]).double().cpu()
    status, feature, threshold = t.status[i, :n].tolist(), t.feature[i, :n].tolist(), t.threshold[i, :n].tolist()
    left, right = t.left[i, :n].tolist(), t.right[i, :n].tolist()
    classes = getattr(post, "classes_", None)
    enc = getattr(post, "encoder", None)
    d = TreeDrawing({}, title=f"{'MAP tree' if draw is None else 'tree'} {i} of {t.n_trees} (weight {float(w[i]):.3g})")
    for node in range(n):
        if status[node] == INTERNAL:
            d.labels[node] = rule_text(enc, names, feature[node], threshold[node])
            d.children[node] = (left[node], right[node])
            d.edge_labels[(node, left[node])], d.edge_labels[(node, right[node])] = "yes", "no"
        elif post.task == "classification":
            p = table[node].numpy()
            labs = classes.tolist() if classes is not None else list(range(len(p)))
            show = range(len(p)) if len(p) <= max_classes else np.argsort(-p, kind="stable")[:max_classes]
            rows = [f"{labs[k]}: {p[k]:.2f}" for k in show] + ([f"({len(p) - max_classes} more)"] if len(p) > max_classes else [])
            d.labels[node] = f"n={int(t.stats[i, node].sum())}\n" + "\n".join(rows)
        else:
            d.labels[node] = f"n={int(t.stats[i, node, 0])}\nmean {float(table[node, 1]):.4g}"
    return d


def _bart(post, draw: Optional[int], tree: int, utility: int, names: Sequence[str]) -> TreeDrawing:
    s = post.n_particles - 1 if draw is None else _check_index("draw", draw, post.n_particles)
    tree = _check_index("tree", tree, post.n_trees)
    utility = _check_index("utility", utility, post.n_utilities)
    forest = s * post.n_utilities + utility
    f, c, v = (getattr(post, a)[forest, tree].tolist() for a in ("feature", "cut", "value"))
    enc = getattr(post, "encoder", None)
    unit = "the probit latent" if post.task == "classification" else "y"
    offset = float(post.offsets[utility]) if post.n_utilities > 1 else float(post.prior.offset)
    title = f"tree {tree} of draw {s}; {unit} = {offset:.4g} + the sum of {post.n_trees} trees' leaf values"
    if post.n_utilities > 1:
        labels = list(post.classes_) if post.classes_ is not None else list(range(post.n_utilities + 1))
        title += f", utility of class {labels[1 + utility]}"
    d = TreeDrawing({}, title=title)
    for j, fj in enumerate(f):
        if fj >= 0:
            d.labels[j] = rule_text(enc, names, int(fj), float(post.grid.cuts[fj, c[j]]))
            d.children[j] = (2 * j + 1, 2 * j + 2)
            d.edge_labels[(j, 2 * j + 1)], d.edge_labels[(j, 2 * j + 2)] = "yes", "no"
        elif fj == LEAF:
            d.labels[j] = f"value {post.prior.scale * v[j]:.4g}"
    return d


_DOT_NODE = re.compile(r'^\s*n(\d+) \[label="(.*?)"')
_DOT_EDGE = re.compile(r"^\s*n(\d+) -> n(\d+)(?: \[label=\"?(\w+)\"?\])?;")


def _soft(post, draw: Optional[int], names: Sequence[str]) -> TreeDrawing:
    """The soft topology as its DOT text gives it (``SoftTreePosterior.to_dot``)."""
    i = int(torch.argmax(post.weights)) if draw is None else _check_index("draw", draw, len(post.topologies))
    d = TreeDrawing({}, title=f"soft topology {i} of {len(post.topologies)} (weight {float(post.weights[i]):.3g})\n"
                              "gates: heaviest feature, mean threshold on [0, 1]-scaled inputs")
    kids: Dict[int, List[int]] = {}
    for line in post.to_dot(i, feature_names=names).splitlines():
        e = _DOT_EDGE.match(line)
        if e:
            a, b = int(e.group(1)), int(e.group(2))
            kids.setdefault(a, []).append(b)
            if e.group(3):
                d.edge_labels[(a, b)] = e.group(3)
            continue
        m = _DOT_NODE.match(line)
        if m:
            d.labels[int(m.group(1))] = m.group(2).replace("\\n", "\n")
    d.children = {a: (b[0], b[1]) for a, b in kids.items() if len(b) == 2}
    # the leaves' posterior-mean values (SoftTreePosterior.gates): a mean of y, or class probabilities
    for leaf, value in post.gates(i)["leaves"].items():
        if leaf in d.labels:
            v = value.reshape(-1).tolist()
            d.labels[leaf] += (f"\nmean {v[0]:.4g}" if post.task == "regression"
                               else "\np=[" + ", ".join(f"{p:.2f}" for p in v) + "]")
    return d


def collapse(d: TreeDrawing, max_depth: int) -> TreeDrawing:
    """``d`` with every internal node at depth ``max_depth`` drawn as a leaf saying how many leaves
    it holds (``...`` + the count), its subtree left out; ``d`` itself when it is no deeper."""
    if int(max_depth) < 0:
        raise ValueError(f"max_depth must be >= 0, got {max_depth}")
    out = TreeDrawing({}, title=d.title, root=d.root)
    cut = 0
    todo = [(d.root, 0)]
    while todo:
        node, depth = todo.pop()
        if node in d.children and depth >= max_depth:
            below, stack = 0, [node]
            while stack:
                k = stack.pop()
                if k in d.children:
                    stack += list(d.children[k])
                else:
                    below += 1
            out.labels[node] = f"{d.labels.get(node, '')}\n... {below} leaves below"
            cut += 1
            continue
        out.labels[node] = d.labels.get(node, "")
        if node in d.children:
            out.children[node] = d.children[node]
            for k in d.children[node]:
                if (node, k) in d.edge_labels:
                    out.edge_labels[(node, k)] = d.edge_labels[(node, k)]
                todo.append((k, depth + 1))
    if cut:
        out.title = f"{d.title}\n(levels below depth {max_depth} collapsed)"
    return out


def tree_drawing(posterior: Any, draw: Optional[int] = None, *, tree: int = 0, utility: int = 0,
                 feature_names: Optional[Sequence[str]] = None, max_classes: int = 4,
                 max_depth: Optional[int] = None) -> TreeDrawing:
    """The labels and structure :func:`plot_tree` draws (arguments as there)."""
    d = _drawing(posterior, draw, tree, utility, feature_names, max_classes)
    return d if max_depth is None else collapse(d, max_depth)


def _drawing(posterior, draw, tree, utility, feature_names, max_classes) -> TreeDrawing:
    post = posterior_of(posterior)
    names = list(feature_names) if feature_names is not None else input_names(post)
    kind = kind_of(post)
    if kind != "bart" and (tree != 0 or utility != 0):
        raise ValueError(f"tree= and utility= pick a tree of a BART draw; this {type(post).__name__} draws one tree "
                         "per draw (pick it with draw=)")
    if kind == "hard":
        return _hard(post, draw, names, max_classes)
    if kind == "bart":
        return _bart(post, draw, tree, utility, names)
    return _soft(post, draw, names)


def _layout(d: TreeDrawing) -> Dict[int, Tuple[float, float]]:
    """Leaves at ``x = 0, 1, ...`` from left to right, each internal node above the middle of its
    children, depth downwards."""
    pos: Dict[int, Tuple[float, float]] = {}
    next_x = [0.0]

    def walk(node: int, depth: int) -> float:
        if node not in d.children:
            pos[node] = (next_x[0], -float(depth))
            next_x[0] += 1.0
            return pos[node][0]
        xs = [walk(k, depth + 1) for k in d.children[node]]
        pos[node] = (sum(xs) / len(xs), -float(depth))
        return pos[node][0]

    walk(d.root, 0)
    return pos


def plot_tree(posterior: Any, draw: Optional[int] = None, *, tree: int = 0, utility: int = 0,
              feature_names: Optional[Sequence[str]] = None, max_classes: int = 4, fontsize: Optional[float] = None,
              max_depth: Optional[int] = None, ax: Any = None):
    """Draw one tree of a posterior as boxes: split rules in the internal nodes (left branch "yes":
    the rule holds), leaf values or class probabilities in the leaves.

    Parameters
    ----------
    posterior : TreePosterior, BARTPosterior, SoftTreePosterior, or a fitted estimator
        Hard trees (smc, mcmc, smc-moves): tree ``draw`` (default: the heaviest, the MAP tree); its
        leaves show their training count and predictive mean (regression) or class probabilities.
        BART: tree ``tree`` of draw ``draw`` (default: the last kept draw; ``utility`` picks the class
        utility's forest of a multinomial probit); its leaves show their value (a term of the sum, in
        units of ``y`` for regression, of the probit latent for classification). Soft trees (nuts,
        dcc): topology ``draw`` (default: the heaviest), each gate shown as its heaviest feature and
        the posterior-mean threshold on the [0, 1]-scaled inputs (as ``SoftTreePosterior.to_dot``);
        a soft gate weighs every feature, so this is a reading aid, not the model.
    draw : int, optional
    tree : int, default 0 (BART only)
    utility : int, default 0 (BART multinomial probit only)
    feature_names : sequence of str, optional
        Default: the names the posterior keeps (the training table's columns), else ``x0, x1, ...``.
    max_classes : int, default 4
        A leaf lists at most this many classes (the most probable ones when there are more).
    fontsize : float, optional (default 9; the figure is sized to the tree)
    max_depth : int, optional
        Draw the tree down to this depth: an internal node there is drawn as a box saying how many
        leaves its subtree holds (default: the whole tree). Deep trees are readable this way.
    ax : matplotlib Axes, optional

    Returns
    -------
    matplotlib Axes; each node is a text artist (``ax.texts``) holding its rule (the encoder's rule text
    for coded tables: ``x <= 0.2``, ``c in {a, b}``, ``x is missing``) or its leaf text.
    """
    require_matplotlib()
    d = tree_drawing(posterior, draw, tree=tree, utility=utility, feature_names=feature_names, max_classes=max_classes,
                     max_depth=max_depth)
    pos = _layout(d)
    n_leaves = max(1, len([n for n in pos if n not in d.children]))
    depth = int(-min(y for _, y in pos.values()))
    # the figure grows with the tree (a leaf's width, a level's height), so the text keeps a readable size
    ax = new_axes(ax, 1, (max(4.0, 2.2 * n_leaves), max(2.5, 1.2 * (depth + 1))))
    fs = fontsize if fontsize is not None else 9.0
    for a, kids in d.children.items():
        for b in kids:
            (x0, y0), (x1, y1) = pos[a], pos[b]
            ax.plot([x0, x1], [y0, y1], color="0.55", lw=1.0, zorder=1)
            if (a, b) in d.edge_labels:
                ax.text((x0 + x1) / 2, (y0 + y1) / 2, d.edge_labels[(a, b)], fontsize=fs * 0.85, color="0.35",
                        ha="center", va="center", zorder=3, bbox=dict(boxstyle="round,pad=0.1", fc="white", ec="none"))
    for node, (x, y) in pos.items():
        leaf = node not in d.children
        ax.text(x, y, d.labels.get(node, ""), ha="center", va="center", fontsize=fs, zorder=4,
                bbox=dict(boxstyle="round,pad=0.35" if leaf else "square,pad=0.35",
                          fc="#e6f0fa" if leaf else "#fbf0dc", ec="0.35"))
    ax.set_xlim(-0.7, n_leaves - 0.3)
    ax.set_ylim(-depth - 0.6, 0.6)
    ax.set_axis_off()
    # a title wider than the axes (BART's on a small tree) is wrapped, not cut at the figure's edge
    width = ax.figure.get_size_inches()[0] * ax.get_position().width * 72 / (0.6 * max(fs, 8.0))
    ax.set_title("\n".join(textwrap.fill(line, max(30, int(width))) for line in d.title.split("\n")),
                 fontsize=max(fs, 8.0))
    return ax
