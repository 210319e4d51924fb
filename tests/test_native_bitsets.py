"""The compiled bitset kernels of the move samplers against their plain-torch references.

``bitset_counts`` must equal the SWAR popcounts of :func:`torchtree.kernels.bitsets.count_bits`, and
``TreeModel.split_bits`` with the kernel its torch route (random bitsets, every kind of cut: below the
data, inside a bucket of several values, at a bucket's end; with and without a parent index; coarse
bucket tables that force scans); ``extent_ranks`` (a node's smallest and largest rank in a column)
its torch route, for empty, small and large nodes. Whole MCMC and SMC-with-moves runs give the same trees, weights and
predictions with the kernels and without them.
"""
import numpy as np
import pytest
import torch

from torchtree import MCMC, ChipmanPrior, Data, DirichletMultinomial, SMCSampler
from torchtree.kernels import native
from torchtree.kernels.bitsets import count_bits
from torchtree.model import target as target_mod
from torchtree.model.target import TreeModel

pytestmark = [pytest.mark.filterwarnings("ignore:MCMC chains look unconverged"),
              pytest.mark.skipif(not native.available(), reason="the C++ kernels could not be built here")]


def _bits(n, W, rng, density=0.5):
    words = rng.integers(-2**63, 2**63 - 1, size=(n, W), dtype=np.int64)
    keep = rng.uniform(size=(n, W)) < density
    return torch.as_tensor(np.where(keep, words, 0))


@pytest.mark.parametrize("threads", [1, 2])
def test_counts_equal_the_swar_popcount(threads):
    rng = np.random.default_rng(0)
    B, masks = _bits(37, 5, rng), _bits(3, 5, rng)
    B[3] = -1  # every bit, the sign bit included
    B[4] = 0
    old = torch.get_num_threads()
    torch.set_num_threads(threads)
    try:
        for m in (None, masks):
            got, want = count_bits(B, m, use_native=True), count_bits(B, m, use_native=False)
            assert torch.equal(got, want) and got.dtype == torch.long
        assert int(count_bits(B, None, True)[3]) == 5 * 64 and int(count_bits(B, None, True)[4]) == 0
    finally:
        torch.set_num_threads(old)


def _model(rng, N, levels_a, levels_c, coarse, monkeypatch):
    """A TreeModel of N points in 3 columns (integers with ``levels_a`` and ``levels_c`` values around a
    continuous one). ``coarse``: few buckets per column, so cuts and extents fall inside buckets of
    several values and scan their points."""
    X = np.column_stack([rng.integers(0, levels_a, N), rng.normal(size=N), rng.integers(0, levels_c, N)])
    data = Data(X.astype(np.float32), (X[:, 1] > 0).astype(np.int64))
    if coarse:
        monkeypatch.setattr(target_mod, "_TABLE_BYTES", 1)
        monkeypatch.setattr(target_mod, "_EXACT_BYTES", 1)
    return TreeModel(ChipmanPrior(0.95, 0.5), DirichletMultinomial(1.0), data)


@pytest.mark.parametrize("coarse", [False, True])
def test_split_bits_equal_the_torch_route(coarse, monkeypatch):
    rng, N, D = np.random.default_rng(1), 700, 3
    model = _model(rng, N, 40, 3, coarse, monkeypatch)
    assert model.native
    n = 200
    B = _bits(n, model.W, rng, 0.8) & model.all_bits[None]
    f = torch.as_tensor(rng.integers(0, D, n))
    r = torch.as_tensor(rng.integers(-1, int(model.umax), n)).minimum(model.n_unique[f] - 1)
    right = torch.as_tensor(rng.integers(0, 2, n).astype(bool))
    src = torch.as_tensor(rng.integers(0, n, n))
    got = model.split_bits(B, f, r, right)
    got_src = model.split_bits(B, f, r, right, src=src)
    model.native = False
    assert torch.equal(got, model.split_bits(B, f, r, right))
    assert torch.equal(got_src, model.split_bits(B, f, r, right, src=src))
    # what a split means: the left child holds the parent's points of rank <= r
    rank = model.rank[torch.arange(N)]
    i = int((r > 0).nonzero()[0])
    pts = [p for p in range(N) if (int(B[i, p // 64]) >> (p % 64)) & 1]
    left = {p for p in pts if int(rank[p, f[i]]) <= int(r[i])}
    bits = {p for p in range(N) if (int(got[i, p // 64]) >> (p % 64)) & 1}
    assert bits == (set(pts) - left if bool(right[i]) else left)


@pytest.mark.parametrize("coarse", [False, True])
def test_extent_ranks_equal_the_torch_route(coarse, monkeypatch):
    rng, N, D = np.random.default_rng(2), 900, 3
    model = _model(rng, N, 50, 4, coarse, monkeypatch)
    n = 120
    density = np.repeat([0.0, 0.002, 0.05, 0.9], n // 4)  # empty, a few points (read directly), large (searched)
    B = torch.stack([_bits(1, model.W, rng, float(p))[0] for p in density]) & model.all_bits[None]
    for i in range(n // 4, n // 2):  # 1-6 points: under W / 2, read point by point
        B[i] = 0
        for p in rng.choice(N, size=int(rng.integers(1, 7)), replace=False):
            B[i, p // 64] |= torch.tensor(1) << int(p % 64)  # bit 63 is the sign bit
    assert model.W > 12 and bool((model.count(B[n // 4: n // 2]) * 2 < model.W).all())
    f = torch.as_tensor(rng.integers(0, D, n))
    got = model._extent_ranks_all(B, f)
    model.native = False
    want = model._extent_ranks_all(B, f)
    for a, b in zip(got, want):
        assert torch.equal(a, b)
    # what the ranks mean, on one large node
    i = n - 1
    pts = [p for p in range(N) if (int(B[i, p // 64]) >> (p % 64)) & 1]
    ranks = model.rank[pts, int(f[i])]
    assert (int(got[2][i]), int(got[3][i])) == (int(ranks.min()), int(ranks.max()))


def _same_posterior(a, b, X):
    for name in ("feature", "threshold", "left", "right", "status", "n_nodes"):
        assert torch.equal(getattr(a.trees, name), getattr(b.trees, name)), name
    assert torch.equal(a.log_weights, b.log_weights)
    assert np.array_equal(a.predict_proba(X), b.predict_proba(X))


@pytest.mark.parametrize("sampler", ["mcmc", "smc-moves"])
def test_runs_with_and_without_the_kernels_are_equal(sampler, monkeypatch):
    rng = np.random.default_rng(3)
    X = np.round(rng.normal(size=(400, 4)), 1).astype(np.float32)
    data = Data(X, (X[:, 0] * X[:, 1] + X[:, 2] > 0).astype(np.int64))

    def run():
        if sampler == "mcmc":
            return MCMC(None, DirichletMultinomial(1.0), n_chains=3, n_warmup=30, n_samples=30,
                        engine="batched").run(data, seed=4)  # the batched moves route on the kernels
        return SMCSampler(None, DirichletMultinomial(1.0), n_particles=40, n_iterations=6).run(data, seed=4)

    calls = []
    kernel = target_mod.split_bits_native

    def counted(*args):
        calls.append(1)
        return kernel(*args)

    monkeypatch.setattr(target_mod, "split_bits_native", counted)
    a = run()
    assert calls  # the kernel ran
    monkeypatch.setattr(native, "usable", lambda device: False)
    del calls[:]
    b = run()
    assert not calls
    _same_posterior(a, b, X[:50])
