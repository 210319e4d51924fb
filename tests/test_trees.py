"""Tests for torchtree.model.trees.HardTrees (padded pointer arrays)."""
from __future__ import annotations

import numpy as np
import pytest
import torch

from torchtree import ChipmanPrior, Data, DirichletMultinomial, HardTrees, TopDownSMC
from torchtree.kernels.traversal import leaf_index_reference
from torchtree.model.trees import INTERNAL, LEAF, OPEN, UNUSED

FIELDS = ("feature", "threshold", "left", "right", "parent", "depth", "status", "stats")


# ------------------------------------------------------------- helpers
def random_hand_trees(P, D, K, seed, p_split=0.6, max_depth=5, capacity=None):
    """Random valid trees built depth-first (children appended as a pair, then the
    left subtree is filled before the right one), so the node order differs from
    the breadth-first order of the growth engine. Stats are random class counts
    at the leaves, summed upwards."""
    g = np.random.default_rng(seed)
    trees = []
    for _ in range(P):
        nodes = [dict(parent=-1, depth=0)]

        def grow(i):
            if nodes[i]["depth"] < max_depth and g.random() < p_split:
                l = len(nodes)
                nodes.append(dict(parent=i, depth=nodes[i]["depth"] + 1))
                nodes.append(dict(parent=i, depth=nodes[i]["depth"] + 1))
                nodes[i].update(feature=int(g.integers(D)), threshold=float(g.normal()), left=l, right=l + 1)
                grow(l)
                grow(l + 1)
            else:
                nodes[i].update(feature=-1, threshold=0.0, left=-1, right=-1, stats=g.integers(0, 4, K).astype(float))

        grow(0)

        def stats(i):
            n = nodes[i]
            if n["feature"] < 0:
                return n["stats"]
            n["stats"] = stats(n["left"]) + stats(n["right"])
            return n["stats"]

        stats(0)
        trees.append(nodes)
    C = capacity or max(len(t) for t in trees)
    out = HardTrees.roots(P, torch.zeros(K), capacity=C)
    for p, nodes in enumerate(trees):
        for i, n in enumerate(nodes):
            out.feature[p, i] = n["feature"]
            out.threshold[p, i] = n["threshold"]
            out.left[p, i] = n["left"]
            out.right[p, i] = n["right"]
            out.parent[p, i] = n["parent"]
            out.depth[p, i] = n["depth"]
            out.status[p, i] = INTERNAL if n["feature"] >= 0 else LEAF
            out.stats[p, i] = torch.as_tensor(n["stats"])
        out.n_nodes[p] = len(nodes)
    return out


def prior_trees(n=30, d=3, k=3, P=64, seed=0):
    """Trees drawn from the Chipman prior on random data (and the data)."""
    g = np.random.default_rng(seed)
    X = g.normal(size=(n, d))
    X[:, -1] = np.round(X[:, -1])  # a tied feature
    y = g.integers(0, k, n)
    data = Data(X, y, n_classes=k)
    lik = DirichletMultinomial(3.0)
    post = TopDownSMC(ChipmanPrior(0.95, 0.5), lik, n_particles=P, use_likelihood=False).run(data, seed=seed)
    return post.trees, data, lik


@pytest.fixture(scope="module")
def grown():
    return prior_trees()


def assert_trees_equal(a: HardTrees, b: HardTrees):
    for name in FIELDS + ("n_nodes",):
        ta, tb = getattr(a, name), getattr(b, name)
        assert ta.dtype == tb.dtype, name
        assert torch.equal(ta, tb), name
    assert set(a.extra) == set(b.extra)
    for k in a.extra:
        assert torch.equal(a.extra[k], b.extra[k]), k


def reference_paths(trees: HardTrees, X: torch.Tensor):
    """Python walk: list over trees of list over points of the visited nodes."""
    out = []
    for p in range(trees.n_trees):
        rows = []
        for m in range(X.shape[0]):
            node, path = 0, [0]
            while int(trees.feature[p, node]) >= 0:
                f = int(trees.feature[p, node])
                node = int(trees.left[p, node]) if X[m, f] <= trees.threshold[p, node] else int(trees.right[p, node])
                path.append(node)
            rows.append(path)
        out.append(rows)
    return out


# ---------------------------------------------------------- construction
def test_roots():
    t = HardTrees.roots(4, torch.tensor([3.0, 5.0]), capacity=5)
    assert t.n_trees == len(t) == 4 and t.capacity == 5
    assert t.n_nodes.tolist() == [1] * 4
    assert (t.status[:, 0] == OPEN).all() and (t.status[:, 1:] == UNUSED).all()
    assert (t.feature == -1).all() and (t.left == -1).all() and (t.right == -1).all() and (t.parent == -1).all()
    assert torch.equal(t.stats[:, 0], torch.tensor([[3.0, 5.0]] * 4)) and (t.stats[:, 1:] == 0).all()
    assert t.feature.dtype == torch.int32 and t.status.dtype == torch.int8 and t.n_nodes.dtype == torch.long
    t.validate()
    s = HardTrees.roots(2, torch.tensor([[1.0], [2.0]]), capacity=0, status=LEAF)  # per-tree root stats
    assert s.capacity == 1 and s.stats[:, 0, 0].tolist() == [1.0, 2.0] and (s.status[:, 0] == LEAF).all()
    with pytest.raises(ValueError, match="n_trees"):
        HardTrees.roots(0, torch.zeros(2))


def test_reserve_doubles_and_pads():
    t = random_hand_trees(5, 3, 2, seed=1)
    t.extra["score"] = torch.randn(5, t.capacity)
    before = {k: v.clone() for k, v in t.as_dict().items()}
    c0 = t.capacity
    t.reserve(c0)  # fits: nothing happens
    assert t.capacity == c0
    t.reserve(c0 + 1)
    assert t.capacity == 2 * c0
    t.reserve(4 * c0 + 1)
    assert t.capacity == 8 * c0
    fills = {"feature": -1, "threshold": 0, "left": -1, "right": -1, "parent": -1, "depth": 0, "status": UNUSED, "stats": 0, "extra.score": 0}
    for k, v in before.items():
        if k == "n_nodes":
            assert torch.equal(t.n_nodes, v)
            continue
        now = t.as_dict()[k]
        assert now.shape[1] == 8 * c0
        assert torch.equal(now[:, :c0], v), k
        assert (now[:, c0:] == fills[k]).all(), k
    t.validate()


def test_with_capacity_pads_and_trims_copy():
    t = random_hand_trees(6, 2, 3, seed=2)
    big = t.with_capacity(t.capacity + 7)
    assert big.capacity == t.capacity + 7 and t.capacity == big.capacity - 7  # original untouched
    back = big.with_capacity(int(t.n_nodes.max()))
    assert_trees_equal(back, t.with_capacity(int(t.n_nodes.max())))
    with pytest.raises(ValueError, match="below the largest tree"):
        t.with_capacity(int(t.n_nodes.max()) - 1)
    big.validate()
    back.validate()


def test_take_equals_gathering_every_field():
    t = random_hand_trees(7, 3, 2, seed=3)
    t.extra["u"] = torch.arange(7 * t.capacity, dtype=torch.float32).view(7, -1)
    idx = torch.tensor([6, 0, 0, 3, 6, 6, 1, 2, 2])
    out = t.take(idx)
    assert out.n_trees == 9
    for name, v in t.as_dict().items():
        assert torch.equal(out.as_dict()[name], v[idx]), name
    out.validate()
    # the gather is a copy
    out.feature[0, 0] = 99
    assert int(t.feature[6, 0]) != 99


@pytest.mark.parametrize("explicit_moved", [False, True])
def test_take_inplace_matches_take(explicit_moved):
    t = random_hand_trees(8, 2, 3, seed=4)
    t.extra["u"] = torch.randn(8, t.capacity, 2)
    idx = torch.tensor([0, 0, 5, 3, 3, 7, 6, 2])
    want = t.take(idx)
    moved = (idx != torch.arange(8)) if explicit_moved else None
    t.take_(idx, moved)
    assert_trees_equal(t, want)
    t.take_(torch.arange(8))  # identity: no-op
    assert_trees_equal(t, want)


def test_take_inplace_respects_moved_mask():
    t = random_hand_trees(4, 2, 2, seed=5)
    orig = t.clone()
    idx = torch.tensor([1, 0, 3, 2])
    # only row 0 is rewritten although the ancestors say 'swap everything'
    t.take_(idx, torch.tensor([True, False, False, False]))
    want = orig.take(torch.tensor([1, 1, 2, 3]))
    assert_trees_equal(t, want)


def test_clone_is_deep():
    t = random_hand_trees(3, 2, 2, seed=6)
    c = t.clone()
    assert_trees_equal(c, t)
    c.stats += 1
    c.n_nodes[0] = 99
    assert not torch.equal(c.stats, t.stats) and int(t.n_nodes[0]) != 99


def test_cat_pads_capacities():
    a = random_hand_trees(3, 2, 2, seed=7)
    b = random_hand_trees(2, 2, 2, seed=8, capacity=a.capacity + 5)
    a.extra["u"] = torch.ones(3, a.capacity)
    b.extra["u"] = 2 * torch.ones(2, b.capacity)
    c = HardTrees.cat([a, b])
    assert c.n_trees == 5 and c.capacity == b.capacity
    assert_trees_equal(c.take(torch.arange(3)), a.with_capacity(b.capacity))
    assert_trees_equal(c.take(torch.tensor([3, 4])), b)
    c.validate()
    with pytest.raises(ValueError):
        HardTrees.cat([])


def test_dict_round_trip():
    t = random_hand_trees(4, 3, 3, seed=9)
    t.extra["logp"] = torch.randn(4, t.capacity, dtype=torch.float64)
    d = t.as_dict()
    assert set(d) == set(FIELDS) | {"n_nodes", "extra.logp"}
    assert all(v.shape[0] == 4 for v in d.values())
    assert_trees_equal(HardTrees.from_dict(d), t)
    d.pop("parent")
    with pytest.raises(ValueError, match="parent"):
        HardTrees.from_dict(d)


# ------------------------------------------------------------ traversal
@pytest.mark.parametrize("seed", [0, 1, 2])
def test_leaf_index_matches_reference_hand_trees(seed):
    t = random_hand_trees(40, 4, 2, seed=seed, capacity=None)
    X = torch.randn(57, 4, generator=torch.Generator().manual_seed(seed))
    X[:5] = torch.as_tensor(t.threshold[0, 0]).expand(5, 4)  # points exactly on a cut go left
    ref = leaf_index_reference(t.feature, t.threshold, t.left, t.right, X)
    got = t.leaf_index(X)
    assert got.dtype == torch.long and got.shape == (40, 57)
    assert torch.equal(got, ref)
    # every result is a leaf
    assert t.is_leaf().gather(1, got).all()
    # chunked over trees: same answer
    assert torch.equal(t.leaf_index(X, chunk_pairs=57 * 3), ref)
    assert torch.equal(t.leaf_index(X, chunk_pairs=1), ref)
    # and it is the end of the Python walk
    paths = reference_paths(t.take(torch.arange(5)), X)
    assert [[p[-1] for p in rows] for rows in paths] == got[:5].tolist()


def test_leaf_index_matches_reference_grown(grown):
    t, data, _ = grown
    Xq = torch.cat([data.X, torch.randn(20, data.d, generator=torch.Generator().manual_seed(1))])
    assert torch.equal(t.leaf_index(Xq), leaf_index_reference(t.feature, t.threshold, t.left, t.right, Xq))


def test_predict_gathers_leaf_rows(grown):
    t, data, lik = grown
    X = data.X[:11]
    pred = t.predict(X, lik)
    table = lik.predictive_table(t.stats)
    leaves = t.leaf_index(X)
    for p in range(0, t.n_trees, 7):
        for m in range(X.shape[0]):
            assert torch.equal(pred[p, m], table[p, leaves[p, m]])
    assert torch.allclose(pred.sum(-1), torch.ones(pred.shape[:2]))


def test_route_counts_matches_paths():
    t = random_hand_trees(12, 3, 2, seed=11)
    X = torch.randn(30, 3, generator=torch.Generator().manual_seed(11))
    counts = t.route_counts(X)
    want = torch.zeros_like(counts)
    for p, rows in enumerate(reference_paths(t, X)):
        for path in rows:
            for node in path:
                want[p, node] += 1
    assert torch.equal(counts, want)
    assert (counts[:, 0] == 30).all()


def test_route_counts_reproduce_training_stats(grown):
    t, data, _ = grown
    counts = t.route_counts(data.X)
    used = t.status != UNUSED
    assert torch.equal(counts[used].float(), t.stats.sum(-1)[used])
    assert (counts[~used] == 0).all()


def test_n_leaves_and_max_depth_by_hand():
    t = random_hand_trees(15, 2, 2, seed=12)
    for p in range(t.n_trees):
        n = int(t.n_nodes[p])
        leaves = [i for i in range(n) if int(t.feature[p, i]) < 0]
        assert int(t.n_leaves()[p]) == len(leaves) == (n + 1) // 2
        assert int(t.max_depth()[p]) == max(int(t.depth[p, i]) for i in leaves)
    # open leaves count as leaves
    r = HardTrees.roots(2, torch.zeros(1))
    assert r.n_leaves().tolist() == [1, 1] and r.max_depth().tolist() == [0, 0] and r.n_open().tolist() == [1, 1]


def test_grown_tree_counts(grown):
    t, _, _ = grown
    assert torch.equal(t.n_leaves(), (t.n_nodes + 1) // 2)
    assert (t.n_open() == 0).all()


# ------------------------------------------------------------- validate
def test_validate_passes_on_valid_trees(grown):
    t, data, lik = grown
    t.validate()
    t.validate(data, lik)
    random_hand_trees(20, 3, 2, seed=13).validate()
    t.with_capacity(t.capacity * 2).validate(data, lik)


def _a_split_tree(t):
    """Index of a tree with at least 5 nodes."""
    return int(torch.nonzero(t.n_nodes >= 5)[0])


def _add_orphan(t, p):
    """A used leaf slot that no internal node points to."""
    n = int(t.n_nodes[p])
    t.status[p, n], t.parent[p, n], t.depth[p, n] = LEAF, 0, 1
    t.n_nodes[p] = n + 1


@pytest.mark.parametrize(
    "corrupt, message",
    [
        (lambda t, p: t.parent.__setitem__((p, int(t.left[p, 0])), 2 if int(t.left[p, 0]) != 2 else 1), "parent disagrees with the children"),
        (lambda t, p: t.left.__setitem__((p, 0), int(t.n_nodes[p])), "(left|right) points a split node at a slot that is not a later node"),
        (lambda t, p: t.right.__setitem__((p, 0), 0), "(left|right) points a split node at a slot that is not a later node"),
        (lambda t, p: t.left.__setitem__((p, 0), -1), "children exactly on internal nodes"),
        (lambda t, p: t.stats.__setitem__((p, int(t.left[p, 0]), 0), t.stats[p, int(t.left[p, 0]), 0] + 1), "stats of a split node must equal the sum"),
        (lambda t, p: t.depth.__setitem__((p, int(t.left[p, 0])), 5), "depth"),
        (lambda t, p: t.feature.__setitem__((p, int(t.n_nodes[p]) - 1), 0), "feature >= 0 exactly on internal"),
        (lambda t, p: t.status.__setitem__((p, int(t.n_nodes[p])), LEAF) if int(t.n_nodes[p]) < t.capacity else t.n_nodes.__setitem__(p, 0), "UNUSED|n_nodes"),
        (lambda t, p: t.n_nodes.__setitem__(p, t.capacity + 1), "n_nodes out of range"),
        (lambda t, p: t.parent.__setitem__((p, 0), 1), "parent gives a root a parent"),
        (lambda t, p: t.right.__setitem__((p, 0), int(t.left[p, 0])), "right gives a split node the same child twice"),
        (_add_orphan, "left leaves a node in use outside its tree"),
    ],
)
def test_validate_catches_corruption(corrupt, message):
    t = random_hand_trees(6, 2, 2, seed=14, capacity=None).with_capacity(16)
    p = _a_split_tree(t)
    t.validate()
    corrupt(t, p)
    with pytest.raises(AssertionError, match=message):
        t.validate()


def test_validate_against_data_catches_stats_that_do_not_match_routing(grown):
    t, data, lik = grown
    t = t.clone()
    p = _a_split_tree(t)
    # add one count of class 0 to a leaf and all its ancestors: internally
    # consistent, but not what the data routed through the tree gives
    leaf = int(torch.nonzero(t.is_leaf()[p])[0])
    node = leaf
    while node >= 0:
        t.stats[p, node, 0] += 1
        node = int(t.parent[p, node])
    t.validate()
    with pytest.raises(AssertionError, match="stats at the leaves differ from the data"):
        t.validate(data, lik)


def test_validate_catches_a_leaf_without_training_data(grown):
    t, data, lik = grown
    t = t.clone()
    p = _a_split_tree(t)
    # move the root threshold beyond the data: the right subtree gets no points
    # (and stats mismatch). Either violation is reported.
    t.threshold[p, 0] = 1e9
    with pytest.raises(AssertionError, match="stats (at the leaves differ|count a leaf that holds no)"):
        t.validate(data, lik)


def test_validate_against_data_with_a_class_no_label_holds():
    """``Data(X, y, classes=[0, 1, 2])`` with labels 0 and 1 only: the trees' statistics have 3 columns, and
    validate rebuilds the leaves' statistics with the data's 3 classes (not ``max(y) + 1``)."""
    g = torch.Generator().manual_seed(0)
    X = torch.rand(30, 2, generator=g)
    data = Data(X, (X[:, 0] > 0.5).long(), classes=[0, 1, 2])
    post = TopDownSMC(n_particles=8).run(data, seed=0)
    assert post.trees.stats.shape[-1] == 3
    post.trees.validate(data, post.likelihood)


def test_to_and_repr(grown):
    t, _, _ = grown
    u = t.to("cpu")
    assert_trees_equal(u, t)
    assert f"P={t.n_trees}" in repr(t)


def test_validate_checks_under_python_O(monkeypatch):
    """``validate`` (which the posterior loader relies on) raises explicitly: compiled as ``python -O`` compiles
    (``assert`` statements removed), its module and the checks it calls still refuse a corrupt tree."""
    import sys
    import types
    from pathlib import Path

    import torchtree.model.tree_checks as checks_module
    import torchtree.model.trees as trees_module

    def optimized(module):
        out = types.ModuleType(module.__name__)
        out.__file__ = module.__file__
        exec(compile(Path(module.__file__).read_text(), module.__file__, "exec", optimize=1), out.__dict__)
        return out

    monkeypatch.setitem(sys.modules, checks_module.__name__, optimized(checks_module))
    OptimizedTrees = optimized(trees_module).HardTrees
    t = OptimizedTrees.roots(1, torch.zeros(2), capacity=3)
    t.feature[0, 0], t.threshold[0, 0], t.left[0, 0], t.right[0, 0] = 0, 0.5, 1, 2
    t.status[0] = torch.tensor([INTERNAL, LEAF, LEAF], dtype=t.status.dtype)
    t.parent[0, 1:], t.depth[0, 1:], t.n_nodes[0] = 0, 1, 3
    t.stats[0] = torch.tensor([[2.0, 1.0], [1.0, 1.0], [1.0, 0.0]])
    t.validate()
    t.parent[0, 0] = 1
    with pytest.raises(AssertionError, match="parent gives a root a parent"):
        t.validate()
