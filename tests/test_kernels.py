"""Tests for torchtree.kernels: segment primitives, traversal and the forest
mixture, each against a naive loop or dense computation."""
from __future__ import annotations

import bisect

import numpy as np
import pytest
import torch

from torchtree import ChipmanPrior, Data, DirichletMultinomial, HardTrees, TopDownSMC
from torchtree.kernels.forest import mixture_over_leaves, node_region_keys
from torchtree.kernels.segments import (exclusive_cumsum, grouped_searchsorted, ragged_arange, rank_within, segment_minmax,
                                       rows_searchsorted, segmented_searchsorted, sortable_bits,
                                       sorted_slice_searchsorted)
from torchtree.kernels.traversal import leaf_index, leaf_index_reference
from torchtree.model.trees import INTERNAL, LEAF


def gen(seed):
    return torch.Generator().manual_seed(seed)


# ------------------------------------------------------------- segments
@pytest.mark.parametrize("n", [0, 1, 2, 17])
def test_exclusive_cumsum(n):
    x = torch.randint(0, 9, (n,), generator=gen(n))
    out = exclusive_cumsum(x)
    want, acc = [], 0
    for v in x.tolist():
        want.append(acc)
        acc += v
    assert out.tolist() == want and out.dtype == x.dtype
    f = torch.rand(n, generator=gen(n), dtype=torch.float64)
    assert torch.allclose(exclusive_cumsum(f), torch.tensor([float(f[:i].sum()) for i in range(n)], dtype=torch.float64))


@pytest.mark.parametrize("seed", range(4))
def test_ragged_arange(seed):
    g = gen(seed)
    counts = torch.randint(0, 5, (int(torch.randint(1, 30, (1,), generator=g)),), generator=g)
    counts[0] = 0  # leading and inner empty segments
    seg, pos = ragged_arange(counts)
    want_seg = [s for s, c in enumerate(counts.tolist()) for _ in range(c)]
    want_pos = [i for c in counts.tolist() for i in range(c)]
    assert seg.tolist() == want_seg and pos.tolist() == want_pos
    assert seg.dtype == torch.long and pos.dtype == torch.long


def test_ragged_arange_edge_cases():
    for counts in ([], [0], [0, 0, 0], [3], [0, 0, 2]):
        seg, pos = ragged_arange(torch.tensor(counts, dtype=torch.long))
        assert seg.tolist() == [s for s, c in enumerate(counts) for _ in range(c)]
        assert pos.tolist() == [i for c in counts for i in range(c)]
    seg, pos = ragged_arange(torch.tensor([2, 1], dtype=torch.int32))  # int32 counts
    assert seg.tolist() == [0, 0, 1] and pos.tolist() == [0, 1, 0]


@pytest.mark.parametrize("seed", range(4))
def test_rank_within(seed):
    g = gen(seed)
    group = torch.sort(torch.randint(0, 8, (50,), generator=g) * 3).values  # gaps in the ids
    out = rank_within(group)
    want, last, r = [], None, 0
    for v in group.tolist():
        r = r + 1 if v == last else 0
        last = v
        want.append(r)
    assert out.tolist() == want
    assert rank_within(torch.zeros(0, dtype=torch.long)).numel() == 0


def naive_searchsorted(values, starts, ends, queries, right):
    out = []
    for s, e, q in zip(starts.tolist(), ends.tolist(), queries.tolist()):
        sl = values[s:e].tolist()
        out.append(bisect.bisect_right(sl, q) if right else bisect.bisect_left(sl, q))
    return out


@pytest.mark.parametrize("seed", range(5))
@pytest.mark.parametrize("right", [True, False])
def test_segmented_searchsorted(seed, right):
    g = gen(seed)
    G = 40
    counts = torch.randint(0, 12, (G,), generator=g)
    starts = exclusive_cumsum(counts)
    ends = starts + counts
    # sorted within each slice, with ties (values on a coarse grid)
    raw = (torch.rand(int(counts.sum()), generator=g) * 10).round() / 2
    seg, _ = ragged_arange(counts)
    values = raw[torch.argsort(seg.double() * 100 + raw.double())]
    # queries per slice: existing values, between values, outside the range
    Q = 200
    which = torch.randint(0, G, (Q,), generator=g)
    q = (torch.rand(Q, generator=g) * 12 - 1).round() / 2
    q[::3] = q[::3] + 0.25
    out = segmented_searchsorted(values, starts[which], ends[which], q, right=right)
    assert out.dtype == torch.long
    assert out.tolist() == naive_searchsorted(values, starts[which], ends[which], q, right)


def test_segmented_searchsorted_edge_cases():
    values = torch.tensor([1.0, 2.0, 2.0, 2.0, 5.0])
    # a slice of all equal values, a single element, an empty slice, the whole buffer
    starts = torch.tensor([1, 4, 2, 0, 0, 0])
    ends = torch.tensor([4, 5, 2, 5, 5, 5])
    q = torch.tensor([2.0, 5.0, 9.0, 0.0, 2.0, 7.0], dtype=torch.float64)  # query dtype converted
    for right in (True, False):
        assert segmented_searchsorted(values, starts, ends, q, right).tolist() == naive_searchsorted(values, starts, ends, q, right)
    assert segmented_searchsorted(values, starts[:0], ends[:0], q[:0]).numel() == 0
    assert segmented_searchsorted(torch.zeros(0), torch.tensor([0]), torch.tensor([0]), torch.tensor([1.0])).tolist() == [0]
    # long slices need every bisection step
    big = torch.arange(1000.0)
    qs = torch.tensor([-1.0, 0.0, 0.5, 998.5, 999.0, 1e9])
    got = segmented_searchsorted(big, torch.zeros(6, dtype=torch.long), torch.full((6,), 1000), qs)
    assert got.tolist() == [0, 1, 1, 999, 1000, 1000]
    got = segmented_searchsorted(big, torch.full((6,), 500), torch.full((6,), 1000), qs, right=False)
    assert got.tolist() == [0, 0, 0, 499, 499, 500]


@pytest.mark.parametrize("dtype", [torch.float32, torch.float16, torch.bfloat16, torch.int32, torch.int16])
def test_sortable_bits_orders_as_the_values(dtype):
    """Every pair of values compares as its keys do: negative and positive floats, the extremes,
    infinities, and -0.0 equal to +0.0."""
    if dtype.is_floating_point:
        fi = torch.finfo(dtype)
        v = torch.tensor([-float("inf"), fi.min, -3.5, -1.0, -fi.tiny, -0.0, 0.0, fi.tiny, 1.0, 1.0, 2.5, fi.max,
                          float("inf")], dtype=dtype)
        v = torch.cat([v, (torch.randn(50, generator=gen(0)) * 100).to(dtype)])
    else:
        ii = torch.iinfo(dtype)
        v = torch.tensor([ii.min, ii.min + 1, -7, -1, 0, 0, 1, 9, ii.max - 1, ii.max], dtype=torch.int64).to(dtype)
    k = sortable_bits(v)
    assert k.dtype == torch.int64 and int(k.min()) >= 0 and int(k.max()) < 2 ** 32
    a, b = v[:, None].double(), v[None, :].double()
    assert torch.equal(k[:, None] <= k[None, :], a <= b) and torch.equal(k[:, None] == k[None, :], a == b)
    assert sortable_bits(v.double()) is None and sortable_bits(v.long()) is None


@pytest.mark.parametrize("seed", range(4))
@pytest.mark.parametrize("right", [True, False])
@pytest.mark.parametrize("dtype", [torch.float32, torch.float64, torch.int32])
def test_grouped_searchsorted_equals_the_slice_search(seed, right, dtype):
    """One search over (segment, value) keys (64-bit values: the halvings) counts as a bisection of
    each query's own slice: ties, negative values, -0.0 against +0.0, empty segments, queries outside
    a slice's range."""
    g = gen(seed)
    G = 30
    counts = torch.randint(0, 9, (G,), generator=g)
    counts[::7] = 0
    starts = exclusive_cumsum(counts)
    ends = starts + counts
    seg, _ = ragged_arange(counts)
    raw = (torch.rand(int(counts.sum()), generator=g) * 12 - 6).round() / 2  # ties on a coarse grid, both signs
    raw[raw == 0] = -0.0
    values = raw[torch.argsort(seg.double() * 100 + raw.double())]
    Q = 300
    qseg = torch.randint(0, G, (Q,), generator=g)
    q = (torch.rand(Q, generator=g) * 16 - 8).round() / 2
    q[::3] = q[::3] + 0.25
    q[q == 0] = 0.0  # +0.0 queries against -0.0 values
    if not dtype.is_floating_point:
        values, q = (values * 2).to(dtype), (q * 2).round().to(dtype)
    else:
        values, q = values.to(dtype), q.to(dtype)
    out = grouped_searchsorted(values, seg, starts, ends, qseg, q, right=right, max_len=8)
    want = naive_searchsorted(values.double(), starts[qseg], ends[qseg], q.double(), right)
    assert out.dtype == torch.long and out.tolist() == want


@pytest.mark.parametrize("L", [70, 1000, 5000])
@pytest.mark.parametrize("right", [True, False])
def test_rows_searchsorted_two_levels_equal_numpy(L, right, monkeypatch):
    """The two-level search (every B-th value, then one block) counts as numpy's search of each row: rows of
    different lengths padded with +inf, runs of ties across block boundaries, queries at block starts,
    below every value and above every value."""
    import torchtree.kernels.segments as segments

    g = np.random.default_rng(L)
    R = 6
    lengths = g.integers(1, L + 1, R)
    lengths[0] = L
    table = np.full((R, L), np.inf, dtype=np.float32)
    for r, n in enumerate(lengths):
        table[r, :n] = np.sort(np.round(g.normal(size=n) * 4) / 4)  # coarse: long runs of equal values
    rows = g.integers(0, R, 300)
    q = np.round(g.normal(size=300) * 4, 1).astype(np.float32)
    B = 1 << max(6, (L.bit_length() + 1) // 2)
    q[:40] = table[rows[:40], np.minimum(np.arange(40) % 4 * B, lengths[rows[:40]] - 1)]  # block starts
    q[40:50], q[50:60] = -1e6, 1e6
    want = [np.searchsorted(table[r], v, side="right" if right else "left") for r, v in zip(rows, q)]
    monkeypatch.setattr(segments, "_ROW_SEARCH", 0)
    got = rows_searchsorted(torch.from_numpy(table), torch.from_numpy(rows), torch.from_numpy(q), right=right)
    assert got.tolist() == want
    monkeypatch.setattr(segments, "_ROW_SEARCH", 1 << 40)  # the copied rows: the same counts
    assert rows_searchsorted(torch.from_numpy(table), torch.from_numpy(rows), torch.from_numpy(q), right=right).tolist() == want


@pytest.mark.parametrize("seed", range(4))
@pytest.mark.parametrize("right", [True, False])
def test_sorted_slice_searchsorted_equals_the_slice_search(seed, right):
    """A buffer sorted as a whole (a running sum of non-negative terms, with runs of equal values
    where a term is 0): one global search clamped to the slice counts as a bisection of the slice,
    queries below, inside and above it included."""
    g = gen(seed)
    terms = torch.rand(60, generator=g, dtype=torch.float64)
    terms[torch.rand(60, generator=g) < 0.3] = 0.0
    values = torch.cumsum(terms, 0)
    Q = 200
    a = torch.randint(0, 61, (Q,), generator=g)
    b = torch.randint(0, 61, (Q,), generator=g)
    starts, ends = torch.minimum(a, b), torch.maximum(a, b)
    pick = torch.randint(0, 60, (Q,), generator=g)
    q = torch.where(torch.rand(Q, generator=g) < 0.5, values[pick], torch.rand(Q, generator=g, dtype=torch.float64) * 40 - 2)
    out = sorted_slice_searchsorted(values, starts, ends, q, right=right)
    assert out.tolist() == naive_searchsorted(values, starts, ends, q, right)


@pytest.mark.parametrize("seed", range(3))
def test_segment_minmax(seed):
    g = gen(seed)
    T, D, S = 60, 3, 12
    x = torch.randn(T, D, generator=g)
    seg = torch.randint(0, S - 2, (T,), generator=g)  # segments S-2, S-1 are empty
    lo, hi = segment_minmax(x, seg, S)
    for s in range(S):
        rows = x[seg == s]
        if rows.shape[0]:
            assert torch.equal(lo[s], rows.min(0).values) and torch.equal(hi[s], rows.max(0).values)
        else:
            assert torch.isinf(lo[s]).all() and (lo[s] > 0).all() and torch.isinf(hi[s]).all() and (hi[s] < 0).all()


# ------------------------------------------------------------ traversal
def random_trees(P, D, seed, n_thresholds=None, p_split=0.65, max_depth=6, pad=3, order="dfs"):
    """Random valid trees. ``order="dfs"`` fills the left subtree before the right
    one; thresholds come from a small grid when ``n_thresholds`` is given, so that
    different trees share regions. Unused slots hold garbage."""
    g = np.random.default_rng(seed)
    grid = np.linspace(-1, 1, n_thresholds) if n_thresholds else None
    all_nodes = []
    for _ in range(P):
        nodes = [dict(parent=-1, depth=0)]
        queue = [0]
        while queue:
            i = queue.pop() if order == "dfs" else queue.pop(0)
            if nodes[i]["depth"] < max_depth and g.random() < p_split:
                l = len(nodes)
                for _ in range(2):
                    nodes.append(dict(parent=i, depth=nodes[i]["depth"] + 1))
                thr = float(g.choice(grid)) if grid is not None else float(g.normal())
                nodes[i].update(feature=int(g.integers(D)), threshold=thr, left=l, right=l + 1)
                queue.extend([l + 1, l] if order == "dfs" else [l, l + 1])
            else:
                nodes[i].update(feature=-1, threshold=0.0, left=-1, right=-1)
        all_nodes.append(nodes)
    C = max(map(len, all_nodes)) + pad
    t = HardTrees.roots(P, torch.zeros(1), capacity=C)
    t.threshold[:] = torch.as_tensor(g.normal(size=(P, C)), dtype=torch.float32)  # garbage in unused slots
    for p, nodes in enumerate(all_nodes):
        for i, n in enumerate(nodes):
            t.feature[p, i], t.threshold[p, i] = n["feature"], n["threshold"]
            t.left[p, i], t.right[p, i] = n["left"], n["right"]
            t.parent[p, i], t.depth[p, i] = n["parent"], n["depth"]
            t.status[p, i] = INTERNAL if n["feature"] >= 0 else LEAF
        t.n_nodes[p] = len(nodes)
    return t


def with_region_stats(t: HardTrees, X: torch.Tensor, y: torch.Tensor, K: int) -> HardTrees:
    """Set stats to the class counts of (X, y) routed to each node (a function of the region)."""
    t = t.clone()
    counts = torch.zeros(t.n_trees, t.capacity, K)
    leaf = leaf_index_reference(t.feature, t.threshold, t.left, t.right, X)
    counts.scatter_add_(1, leaf[:, :, None].expand(-1, -1, K).contiguous(),
                        torch.nn.functional.one_hot(y, K).float()[None].expand(t.n_trees, -1, -1).contiguous())
    for lev in range(int(t.depth.max()), 0, -1):
        p, c = ((t.depth == lev) & (t.status != 0)).nonzero(as_tuple=True)
        counts.index_put_((p, t.parent[p, c].long()), counts[p, c], accumulate=True)
    t.stats = counts
    return t


@pytest.mark.parametrize("seed", range(3))
@pytest.mark.parametrize("xdtype", [torch.float32, torch.float64])
@pytest.mark.parametrize("route", ["compiled", "torch"])
def test_leaf_index_matches_reference(seed, xdtype, route, monkeypatch):
    """Both routes of ``leaf_index`` (the ``tree_leaves`` kernel, the torch working set) equal the plain
    per-level reference, with ties, float64 cuts met by float32 points (the cut rounded to
    float32 first, as the reference does), and enough points for several of the kernel's blocks of 256."""
    from torchtree.kernels import native
    if route == "torch":
        monkeypatch.setenv("TORCHTREE_NATIVE", "0")
    elif not native.available():
        pytest.skip("the compiled kernels are unavailable here")
    t = random_trees(30, 4, seed)
    t.threshold = t.threshold.double() + 1e-12  # a float32 point equal to the rounded cut ties only after rounding
    X = torch.randn(600, 4, generator=gen(seed), dtype=xdtype)
    X[:6, :] = t.threshold[0, 0].to(xdtype)  # ties with a cut go left
    ref = leaf_index_reference(t.feature, t.threshold, t.left, t.right, X)
    out = leaf_index(t.feature, t.threshold, t.left, t.right, X)
    assert torch.equal(out, ref)
    X = X[:45]
    ref = ref[:, :45]
    # the reference itself against a plain Python walk
    for p in range(0, 30, 5):
        for m in range(0, 45, 4):
            node = 0
            while int(t.feature[p, node]) >= 0:
                f = int(t.feature[p, node])
                node = int(t.left[p, node] if X[m, f] <= t.threshold[p, node].to(xdtype) else t.right[p, node])
            assert int(ref[p, m]) == node


def test_leaf_index_trivial_shapes():
    t = HardTrees.roots(3, torch.zeros(1), capacity=1)
    X = torch.randn(5, 2)
    assert torch.equal(leaf_index(t.feature, t.threshold, t.left, t.right, X), torch.zeros(3, 5, dtype=torch.long))
    assert leaf_index(t.feature, t.threshold, t.left, t.right, X[:0]).shape == (3, 0)


# --------------------------------------------------------------- forest
def dense_mixture(t, weights, rows, X, fn, out_dim):
    leaf = leaf_index_reference(t.feature, t.threshold, t.left, t.right, X)
    out = torch.zeros(X.shape[0], out_dim, dtype=torch.float64)
    pts = torch.arange(X.shape[0])
    for p in range(t.n_trees):
        out += float(weights[p]) * fn(rows[p, leaf[p]], pts).double()
    return out


def call_forest(t, weights, rows, X, fn, out_dim):
    used = t.status != 0
    return mixture_over_leaves(t.feature, t.threshold, t.left, t.right, t.depth, used, weights, rows, X, fn, out_dim)


@pytest.fixture(scope="module")
def smc_forest():
    """A posterior-like forest: SMC trees with resampling (shared prefixes) and
    exact copies, class-count stats of the training data."""
    g = np.random.default_rng(0)
    X = g.normal(size=(80, 3))
    y = (X[:, 0] > 0).astype(int) + (X[:, 1] > 0.3).astype(int)
    data = Data(X, y)
    lik = DirichletMultinomial(2.0)
    post = TopDownSMC(ChipmanPrior(0.95, 0.5), lik, n_particles=150, proposal="prior", ess_threshold=0.8).run(data, seed=4)
    idx = torch.randint(0, post.trees.n_trees, (600,), generator=gen(1))  # many duplicates
    return post.trees.take(idx), data, lik


@pytest.mark.parametrize("fn_kind", ["rows", "point_dependent"])
def test_mixture_over_leaves_matches_dense_smc_forest(smc_forest, fn_kind):
    t, data, lik = smc_forest
    w = torch.rand(t.n_trees, generator=gen(2), dtype=torch.float64)
    w[::7] = 0.0
    rows = lik.predictive_table(t.stats)
    Xq = torch.cat([data.X[:30], torch.randn(50, 3, generator=gen(3))])
    yq = torch.randint(0, 3, (Xq.shape[0],), generator=gen(4))
    if fn_kind == "rows":
        fn, k = (lambda r, pts: r), 3
    else:
        fn, k = (lambda r, pts: torch.stack([r.gather(1, yq[pts, None]).squeeze(1), pts.double() * r[:, 0]], 1)), 2
    got = call_forest(t, w, rows, Xq, fn, k)
    want = dense_mixture(t, w, rows, Xq, fn, k)
    assert got.dtype == torch.float64 and got.shape == (80, k)
    assert torch.allclose(got, want, rtol=1e-9, atol=1e-9)


@pytest.mark.parametrize("seed", range(2))
def test_mixture_over_leaves_matches_dense_shared_regions(seed):
    """Hand-built trees on a coarse threshold grid share many regions without being
    identical; numbering is depth-first for half of them and breadth-first for the rest."""
    a = random_trees(60, 2, seed, n_thresholds=3, order="dfs")
    b = random_trees(60, 2, seed + 100, n_thresholds=3, order="bfs")
    t = HardTrees.cat([a, b])
    t = t.take(torch.randint(0, t.n_trees, (300,), generator=gen(seed)))
    Xtr = torch.randn(200, 2, generator=gen(seed + 7))
    ytr = torch.randint(0, 3, (200,), generator=gen(seed + 8))
    t = with_region_stats(t, Xtr, ytr, 3)
    w = torch.rand(t.n_trees, generator=gen(seed), dtype=torch.float64)
    w = w / w.sum()
    lik = DirichletMultinomial(1.0)
    rows = lik.predictive_table(t.stats)
    Xq = torch.cat([torch.randn(40, 2, generator=gen(seed + 9)), torch.tensor([[-1.0, 0.0], [0.0, 1.0], [1.0, -1.0]])])
    got = call_forest(t, w, rows, Xq, lambda r, pts: r, 3)
    want = dense_mixture(t, w, rows, Xq, lambda r, pts: r, 3)
    assert torch.allclose(got, want, rtol=1e-9, atol=1e-12)
    assert torch.allclose(got.sum(1), torch.ones(Xq.shape[0], dtype=torch.float64))


def test_node_region_keys_identify_paths():
    t = random_trees(40, 2, 5, n_thresholds=3)
    used = t.status != 0
    keys = node_region_keys(t.feature, t.threshold, t.left, t.right, t.depth, used)
    assert (keys[~used] == 0).all()
    # a region key is a function of the path of (feature, threshold, side) from the root
    path_of = {}
    for p in range(t.n_trees):
        paths = {0: ()}
        for i in range(int(t.n_nodes[p])):
            if int(t.feature[p, i]) >= 0:
                rule = (int(t.feature[p, i]), float(t.threshold[p, i]))
                paths[int(t.left[p, i])] = paths[i] + (rule + ("L",),)
                paths[int(t.right[p, i])] = paths[i] + (rule + ("R",),)
        for i, path in paths.items():
            k = int(keys[p, i])
            assert path_of.setdefault(k, path) == path  # one path per key (no collision)
    # distinct paths get distinct keys
    assert len(path_of) == len(set(path_of.values()))
    # renumbering a tree (depth-first -> breadth-first) does not change its region keys
    big = int(torch.argmax(t.n_nodes))
    n = int(t.n_nodes[big])
    r = renumber_bfs(t, big)
    r.validate()
    assert n >= 7 and not torch.equal(r.left[0, :n], t.left[big, :n])  # the numbering really changed
    kr = node_region_keys(r.feature, r.threshold, r.left, r.right, r.depth, r.status != 0)
    assert sorted(kr[0, :n].tolist()) == sorted(keys[big, :n].tolist())


def renumber_bfs(t: HardTrees, p: int) -> HardTrees:
    """Tree ``p`` of ``t`` with its nodes renumbered breadth-first."""
    order, i = [0], 0
    while i < len(order):
        node = order[i]
        if int(t.feature[p, node]) >= 0:
            order += [int(t.left[p, node]), int(t.right[p, node])]
        i += 1
    new_of = {old: new for new, old in enumerate(order)}
    r = t.take(torch.tensor([p])).clone()
    for new, old in enumerate(order):
        for name in ("feature", "threshold", "depth", "status"):
            getattr(r, name)[0, new] = getattr(t, name)[p, old]
        for name in ("left", "right", "parent"):
            v = int(getattr(t, name)[p, old])
            getattr(r, name)[0, new] = new_of[v] if v >= 0 else -1
    return r


def test_mixture_single_tree_and_stumps():
    X = torch.tensor([[-1.0], [0.0], [0.5], [2.0]])
    t = random_trees(1, 1, 0, p_split=0.0)  # a single leaf
    rows = torch.tensor([[[0.25, 0.75]]]).expand(1, t.capacity, 2).contiguous()
    out = call_forest(t, torch.tensor([2.0], dtype=torch.float64), rows, X, lambda r, pts: r, 2)
    assert torch.allclose(out, torch.tensor([[0.5, 1.5]] * 4, dtype=torch.float64))
