"""The compiled forest kernels: ``forest_sum`` (sums of BART trees at new points) against a point-by-point
walk of every tree and against the plain-torch route of :func:`torchtree.model.bart.forest_sum`, and
``forest_stats`` (a sweep's leaves per tree and deepest node) against torch reductions.

Random heap trees cover both of the kernel's routes: trees with at most 8 split nodes (read through a
table of rule codes) and larger ones (walked level by level), lone leaves, absent slots, cuts past the
int16 range, float32 and float64 leaf values, several heap widths, 1 and 2 threads.
"""
import numpy as np
import pytest
import torch

from torchtree import BART, Data
from torchtree.kernels import native
from torchtree.model.bart import ABSENT, LEAF, forest_sum

pytestmark = pytest.mark.skipif(not native.available(), reason="the C++ kernels could not be built here")


def _random_trees(S, T, depth, D, n_bins, p_split, seed, dtype=torch.float64):
    """Heap trees grown from the root: a node at depth < ``depth`` splits with probability ``p_split``."""
    rng = np.random.default_rng(seed)
    K = 2 ** (depth + 1) - 1
    f = np.full((S, T, K), ABSENT, dtype=np.int64)
    c = np.zeros((S, T, K), dtype=np.int64)
    v = np.zeros((S, T, K))
    for s in range(S):
        for t in range(T):
            stack = [(0, 0)]
            while stack:
                k, d = stack.pop()
                if d < depth and rng.uniform() < p_split:
                    f[s, t, k], c[s, t, k] = rng.integers(D), rng.integers(n_bins)
                    stack += [(2 * k + 1, d + 1), (2 * k + 2, d + 1)]
                else:
                    f[s, t, k], v[s, t, k] = LEAF, rng.normal()
    return torch.from_numpy(f).short(), torch.from_numpy(c).short(), torch.from_numpy(v).to(dtype)


def _walk(f, c, v, Xb):
    """sum_t value at each point's leaf, walked point by point in float64 (the definition)."""
    S, T, K = f.shape
    out = np.zeros((S, Xb.shape[1]))
    f, c, v, X = f.numpy(), c.numpy(), v.double().numpy(), Xb.numpy()
    for s in range(S):
        for t in range(T):
            for m in range(X.shape[1]):
                k = 0
                while f[s, t, k] >= 0:
                    k = 2 * k + 1 + int(X[f[s, t, k], m] > c[s, t, k])
                out[s, m] += v[s, t, k]
    return out


@pytest.mark.parametrize("depth,p_split,threads", [(3, 0.7, 1), (6, 0.85, 1), (6, 0.85, 2), (2, 0.0, 1)])
@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
def test_kernel_equals_the_walk_and_the_torch_route(depth, p_split, threads, dtype):
    D, n_bins, M = 5, 30, 3000  # M > the kernel's 2048-row block: two blocks, the second partial
    f, c, v = _random_trees(6, 7, depth, D, n_bins, p_split, seed=depth + threads, dtype=dtype)
    splits = (f >= 0).sum(-1)
    if p_split > 0.8:  # both routes: coded trees (<= 8 split nodes) and walked ones
        assert (splits <= 8).any() and (splits > 8).any()
    Xb = torch.from_numpy(np.random.default_rng(1).integers(0, n_bins + 1, size=(D, M))).short()
    old = torch.get_num_threads()
    torch.set_num_threads(threads)
    try:
        got = forest_sum(f, c, v, Xb, use_native=True)
    finally:
        torch.set_num_threads(old)
    ref = forest_sum(f, c, v, Xb, use_native=False)
    assert got.dtype == torch.float64 and got.shape == (6, M)
    # the kernel adds tree by tree, as the walk: equal to rounding of a few float64 sums
    np.testing.assert_allclose(got[:, :400].numpy(), _walk(f, c, v, Xb[:, :400]), rtol=0, atol=1e-12)
    np.testing.assert_allclose(got.numpy(), ref.numpy(), rtol=0, atol=1e-12)


def test_cuts_past_the_int16_range_and_a_wrong_rule_fails():
    f, c, v = _random_trees(3, 5, 3, 4, 20, 0.8, seed=9)
    Xb = torch.from_numpy(np.random.default_rng(2).integers(0, 21, size=(4, 500))).short()
    wide = c.long()
    wide[f >= 0] += 40000  # every rule sends every point left
    got = forest_sum(f, wide, v, Xb, use_native=True)
    leftmost = torch.zeros(3, 5, dtype=torch.long)
    for _ in range(3):
        step = f.gather(2, leftmost[..., None])[..., 0] >= 0
        leftmost = torch.where(step, 2 * leftmost + 1, leftmost)
    expect = v.gather(2, leftmost[..., None])[..., 0].sum(1)
    np.testing.assert_allclose(got.numpy(), expect[:, None].expand(3, 500).numpy(), rtol=0, atol=1e-12)
    # a planted error: one rule's comparison flipped (>= instead of >) changes the sums
    bumped = c.clone()
    bumped[f >= 0] -= 1
    assert not torch.allclose(forest_sum(f, bumped, v, Xb, use_native=True), forest_sum(f, c, v, Xb, use_native=True))


def test_posterior_predictions_equal_with_and_without_the_kernel(monkeypatch):
    rng = np.random.default_rng(0)
    X = rng.uniform(size=(200, 4))
    y = np.sin(3 * X[:, 0]) + X[:, 1] + 0.1 * rng.normal(size=200)
    post = BART(n_trees=20, n_chains=2, n_warmup=20, n_samples=20).run(Data(X, y, task="regression"), seed=0)
    calls = []
    real = native.op
    monkeypatch.setattr(native, "op", lambda name: calls.append(name) or real(name))
    fast = post.latent_draws(X[:100])
    assert "forest_sum" in calls
    monkeypatch.setattr(native, "usable", lambda device: False)
    slow = post.latent_draws(X[:100])
    np.testing.assert_allclose(fast.numpy(), slow.numpy(), rtol=0, atol=1e-12)


@pytest.mark.parametrize("depth,p_split", [(6, 0.85), (3, 0.0), (8, 0.6)])
def test_forest_stats_equal_torch_reductions(depth, p_split):
    from torchtree.model.bart import heap_depth

    f, _, _ = _random_trees(9, 4, depth, 5, 30, p_split, seed=depth)
    f = f.transpose(0, 1).contiguous()  # [T, C, K] as a sweep holds them
    got = native.op("forest_stats")(f)
    leaves = (f == LEAF).sum(2).double().mean(0)
    used = (f != ABSENT).flatten(0, 1).any(0).nonzero()
    assert torch.equal(got[:-1], leaves)
    assert int(got[-1]) == int(heap_depth(used.max()))
    assert int(native.op("forest_stats")(torch.full((2, 3, 7), ABSENT, dtype=torch.int16))[-1]) == 0


@pytest.mark.parametrize("M", [1, 7, 63, 64, 65])
def test_few_points_are_walked_with_the_same_sums(M):
    """Below 64 points the kernel walks every tree instead of building its code table (a table per tree per call
    cost ~140 ns a tree: 11 ms for one row of a 400-draw x 200-tree posterior); the sums are the same, bit for bit,
    as the coded route's on the same points inside a larger call."""
    f, c, v = _random_trees(6, 7, 6, 5, 30, 0.85, seed=M, dtype=torch.float64)
    Xb = torch.from_numpy(np.random.default_rng(M).integers(0, 31, size=(5, 200))).short()
    few = forest_sum(f, c, v, Xb[:, :M].contiguous(), use_native=True)
    many = forest_sum(f, c, v, Xb, use_native=True)  # 200 points: coded trees
    assert torch.equal(few, many[:, :M])
    np.testing.assert_allclose(few.numpy(), _walk(f, c, v, Xb[:, :M]), rtol=0, atol=1e-12)
    np.testing.assert_allclose(few.numpy(), forest_sum(f, c, v, Xb[:, :M].contiguous(), use_native=False).numpy(),
                               rtol=0, atol=1e-12)
