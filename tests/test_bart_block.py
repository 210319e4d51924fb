"""The CUDA BART sweep's code (``kernels/csrc/bart_block.h``: one block of threads per chain) run on the
CPU by ``bart_sweep_blocks``, host threads standing in for the block's, against the compiled CPU sweep
``bart_sweep`` (itself equal to the plain-torch reference, tests/test_native.py); then the CUDA
grow-from-root sweep's code (``bart_gfr_block.h``) by ``bart_gfr_blocks`` against ``bart_gfr_sweep``.

From the same state, uniforms and leaf normals, one sweep of every tree must make the same moves: the same
trees, leaves' maps and move counts, exactly. The cell sums add in another order (the block's threads add
atomically), so leaf values and residuals agree to rounding: float64 to 1e-12 relative, float32 to 1e-4.
Each sweep starts both from the CPU sweep's state, so a rounding difference never carries over.
The last test runs the CUDA kernel itself the same way (marked ``cuda``).
"""
import numpy as np
import pytest
import torch

from torchtree import BART, Data
from torchtree.kernels import native
from torchtree.steps.bart_moves import MOVE_PROBS, _signed, gfr_sweep_native, prior_tables, sweep_native

pytestmark = [pytest.mark.filterwarnings("ignore:MCMC chains look unconverged"),
              pytest.mark.skipif(not native.available(), reason="the C++ kernels could not be built here")]


def _setup(n=257, d=5, max_depth=8, coded=False, seed=0):
    rng = np.random.default_rng(seed)
    X = rng.uniform(size=(n, d))
    y = 10 * np.sin(np.pi * X[:, 0] * X[:, 1]) + 20 * (X[:, 2] - .5) ** 2 + 10 * X[:, 3] + rng.normal(size=n)
    if coded:  # a categorical column and missing values: the group-wise feature draw
        import pandas as pd

        frame = pd.DataFrame(X, columns=[f"x{i}" for i in range(d)])
        frame["x0"] = np.where(rng.uniform(size=n) < 0.2, np.nan, frame["x0"])
        frame["cat"] = pd.Categorical(rng.choice(list("abcd"), size=n))
        data = Data(frame, y, task="regression")
    else:
        data = Data(X, y, task="regression")
    post = BART(n_trees=4, n_chains=1, n_warmup=2, n_samples=2, max_depth=max_depth, compile="off").run(data, seed=1)
    groups = getattr(data, "groups", None)
    return post.prior, post.grid, data, groups


def _state(prior, grid, data, T, C, dtype):
    K = prior.n_slots
    feature = torch.full((T, C, K), -2, dtype=torch.int16)
    feature[..., 0] = -1
    cut = torch.zeros(T, C, K, dtype=torch.int16)
    value = torch.zeros(T, C, K, dtype=dtype)
    leaf_of = torch.zeros(T, C, data.n, dtype=torch.int16)
    y = data.y.double()
    resid = ((y - prior.offset) / prior.scale).to(dtype).repeat(C, 1).contiguous()
    return [feature, cut, value, leaf_of, resid]


def _deep_start(state, Xb, n_cuts, g, depth=3):
    """Every other tree (0, 2, ...) made a complete tree of ``depth`` levels (random rules, small leaf values, the
    points routed and the residuals updated), the others left stumps: consecutive trees of different slot counts,
    as after some sweeps (a shallow start never has them)."""
    feature, cut, value, leaf_of, resid = state
    T, C, _ = feature.shape
    D, n = Xb.shape
    for t in range(0, T, 2):
        for c in range(C):
            for k in range(2 ** depth - 1):
                f = int(torch.randint(0, D, (1,), generator=g))
                feature[t, c, k] = f
                cut[t, c, k] = int(torch.randint(0, max(int(n_cuts[f]), 1), (1,), generator=g))
            feature[t, c, 2 ** depth - 1: 2 ** (depth + 1) - 1] = -1
            node = torch.zeros(n, dtype=torch.long)
            for _ in range(depth):
                f, k = feature[t, c][node].long(), cut[t, c][node].long()
                node = torch.where(Xb[f, torch.arange(n)].long() <= k, 2 * node + 1, 2 * node + 2)
            leaf_of[t, c] = node.to(torch.int16)
            leaves = slice(2 ** depth - 1, 2 ** (depth + 1) - 1)
            value[t, c, leaves] = (0.1 * torch.randn(2 ** depth, generator=g, dtype=torch.float64)).to(value.dtype)
            resid[c] -= value[t, c][node]


KEYED_BASE = 0x5DEECE66D  # the leaves' stream seed of the keyed runs


def _blocks(prior, state, Xb, n_cuts, sigma2, U, Z, keyed, groups, threads, use_likelihood=True):
    _, ps_lut, log1m_ps = prior_tables(prior, state[0].shape[-1], state[0].device)
    pg, pp, _ = MOVE_PROBS
    empty = torch.empty(0, dtype=torch.long)
    base, keys, kz = keyed if Z is None else (0, empty, 0)
    return torch.ops.torchtree.bart_sweep_blocks(*state, Xb, n_cuts, sigma2, U, empty.double() if Z is None else Z,
                                                 empty if groups is None else groups, ps_lut, log1m_ps,
                                                 float(prior.tau ** 2), float(pg), float(pp), int(prior.max_depth),
                                                 bool(use_likelihood), base, keys, kz, int(threads))


def _cuda(prior, state, Xb, n_cuts, sigma2, U, Z, keyed, groups, threads, use_likelihood=True):
    """The CUDA kernel on copies of the inputs (``threads`` unused: the kernel picks its block size)."""
    dev = [x.cuda() for x in state]
    keyed = None if keyed is None else (keyed[0], keyed[1].cuda(), keyed[2])
    counts = sweep_native(prior, *dev, Xb.cuda(), n_cuts.cuda(), sigma2.cuda(), U.cuda(),
                          None if Z is None else Z.cuda(), use_likelihood, None if groups is None else groups.cuda(),
                          keyed_leaves=keyed)
    assert counts is not None, "the CUDA kernel is unavailable"
    for x, y in zip(state, dev):
        x.copy_(y.cpu())
    return counts.cpu()


def _compare(sweeps, threads, dtype=torch.float64, T=12, C=3, use_likelihood=True, run=_blocks, keyed=False,
             deep_start=False, **setup):
    prior, grid, data, groups = _setup(**setup)
    Xb, n_cuts = grid.bins(data.X).contiguous(), grid.n_cuts
    g = torch.Generator().manual_seed(3)
    ref = _state(prior, grid, data, T, C, dtype)
    if deep_start:
        _deep_start(ref, Xb, n_cuts, g)
    K = prior.n_slots
    sigma2 = torch.full((C,), 0.2, dtype=torch.float64)
    tol = dict(rtol=1e-12, atol=1e-12) if dtype == torch.float64 else dict(rtol=1e-4, atol=1e-4)
    grown = 0
    for _ in range(sweeps):
        U = torch.rand(T, C, 5, generator=g, dtype=torch.float64)
        Z = torch.randn(T, C, K, generator=g, dtype=torch.float64)
        # keyed: each leaf's normal drawn in the kernels from its key (tree and chain), slots below K - 2 only
        keys = (KEYED_BASE, torch.randint(0, 2 ** 40, (T, C), generator=g), K - 2) if keyed else None
        Z = None if keyed else Z
        mine = [x.clone() for x in ref]
        counts_ref = sweep_native(prior, *ref, Xb, n_cuts, sigma2, U, Z, use_likelihood, groups, keyed_leaves=keys)
        counts = run(prior, mine, Xb, n_cuts, sigma2, U, Z, keys, groups, threads, use_likelihood)
        assert torch.equal(counts, counts_ref)
        for a, b in zip(mine[:2] + mine[3:4], ref[:2] + ref[3:4]):  # feature, cut, leaf_of: exact
            assert torch.equal(a, b)
        for a, b in zip((mine[2], mine[4]), (ref[2], ref[4])):  # values, residuals: to rounding
            torch.testing.assert_close(a, b, **tol)
        grown = max(grown, int((ref[0] >= 0).sum()))
    return ref, grown, counts_ref


@pytest.mark.parametrize("points", ["1", "4"])
@pytest.mark.parametrize("threads", [1, 4, 7])
def test_block_sweeps_make_the_cpu_sweeps_moves(threads, points, monkeypatch):
    """Each thread's turn over one point or over four (``TORCHTREE_BLOCK_POINTS``: its loads issued first)."""
    monkeypatch.setenv("TORCHTREE_BLOCK_POINTS", points)
    ref, grown, counts = _compare(sweeps=6, threads=threads)
    assert grown > 12  # the trees grew past stumps: every move type had work to do
    assert int(counts[1].sum()) > 0


@pytest.mark.parametrize("threads", [1, 4])
def test_block_sweeps_from_trees_of_different_depths(threads):
    """Consecutive trees of different slot counts (depth 3 and stumps): each tree's cells cleared and summed over
    its own slots."""
    _compare(sweeps=4, threads=threads, deep_start=True, n=600)


def test_float32_and_a_shallow_prior():
    """float32 sums, and trees held at max_depth = 2 (a grow refused there)."""
    ref, _, _ = _compare(sweeps=8, threads=3, dtype=torch.float32, max_depth=2)
    assert int(ref[0][..., 1:3].ge(0).sum()) > 0  # nodes at depth 1 split
    assert int(ref[0][..., 3:].ge(0).sum()) == 0  # none at depth 2


def test_keyed_leaf_normals():
    """The leaves' normals drawn in the kernel from (stream seed, tree-chain key, slot), as the CPU kernel's."""
    _, grown, _ = _compare(sweeps=5, threads=4, keyed=True)
    assert grown > 12


def test_coded_table_groups():
    """A categorical column and missing values: the feature drawn by input column, then split column."""
    _, grown, _ = _compare(sweeps=4, threads=4, coded=True)
    assert grown > 0


def test_prior_only():
    """use_likelihood=False: the sums read as zeros, the trees sample the prior."""
    _, grown, _ = _compare(sweeps=4, threads=2, use_likelihood=False)
    assert grown > 0


@pytest.mark.parametrize("points", ["1", "4"])
@pytest.mark.parametrize("T", [1, 2, 3])
def test_few_trees(T, points, monkeypatch):
    """Sweeps of one, two and three trees (the block's first and last passes; the lookahead of its scans)."""
    monkeypatch.setenv("TORCHTREE_BLOCK_POINTS", points)
    _compare(sweeps=5, threads=5, T=T, C=2)


@pytest.mark.cuda
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
@pytest.mark.parametrize("adds", ["atomic", "warp", "warp, 4 points"])
@pytest.mark.parametrize("case", ["float64", "float32", "coded", "prior", "two trees", "many points", "keyed"])
def test_cuda_kernel_makes_the_cpu_sweeps_moves(case, adds, monkeypatch):
    """The kernel itself (``bart_cuda.cu``, ``compile="native"`` on CUDA) against the CPU sweep, as above, with
    either way of adding the cell sums (``TORCHTREE_CUDA_CELL_ADDS``: one atomic per point, or a warp's
    points per cell first), and four points per thread's turn (``TORCHTREE_BLOCK_POINTS``)."""
    monkeypatch.setenv("TORCHTREE_CUDA_CELL_ADDS", adds.split(",")[0])
    monkeypatch.setenv("TORCHTREE_BLOCK_POINTS", "4" if "4 points" in adds else "1")
    monkeypatch.setenv("TORCHTREE_CHAIN_BLOCKS", "1")
    kw = {"float64": {}, "float32": dict(dtype=torch.float32, max_depth=3), "coded": dict(coded=True),
          "prior": dict(use_likelihood=False), "two trees": dict(T=2, C=5), "many points": dict(n=20_000, T=6),
          "keyed": dict(keyed=True)}[case]
    assert native.cuda_available(), "the CUDA kernels did not build"
    _compare(sweeps=4, threads=0, run=_cuda, **kw)


@pytest.mark.cuda
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
@pytest.mark.parametrize("case, blocks", [("float64", 3), ("float32", 3), ("deep start", 3), ("one tree", 3),
                                          ("blocks without points", 8), ("many points", 16), ("keyed", 4)])
def test_cuda_grid_kernel_makes_the_cpu_sweeps_moves(case, blocks, monkeypatch):
    """The grid kernel itself (a chain's points over ``blocks`` blocks, a cooperative launch:
    bart_grid_block.h) against the CPU sweep; the profiler shows that it, not the one-block kernel, ran."""
    monkeypatch.setenv("TORCHTREE_CUDA_CELL_ADDS", "warp")
    monkeypatch.setenv("TORCHTREE_BLOCK_POINTS", "4")
    monkeypatch.setenv("TORCHTREE_CHAIN_BLOCKS", str(blocks))
    kw = {"float64": {}, "float32": dict(dtype=torch.float32, max_depth=3), "deep start": dict(deep_start=True, n=600),
          "one tree": dict(T=1, C=2), "blocks without points": dict(n=6, T=4, C=2),
          "many points": dict(n=20_000, T=6), "keyed": dict(keyed=True)}[case]
    assert native.cuda_available(), "the CUDA kernels did not build"
    with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CUDA]) as prof:
        _compare(sweeps=4, threads=0, run=_cuda, **kw)
    assert any("grid_kernel" in e.key for e in prof.key_averages()), "the grid kernel did not run"


# ----------------------------------------------------------------------------- grow-from-root
def _gfr_blocks(prior, state, Xb, n_cuts, sigma2, U, Z, keyed, groups, threads, use_likelihood=True, extra_bins=0):
    _, ps_lut, _ = prior_tables(prior, state[0].shape[-1], state[0].device)
    empty = torch.empty(0, dtype=torch.long)
    u_base, leaves_base, keys = keyed if U is None else (0, 0, empty)
    torch.ops.torchtree.bart_gfr_blocks(*state, Xb, n_cuts, sigma2, empty.double() if U is None else U,
                                        empty.double() if Z is None else Z, empty if groups is None else groups,
                                        ps_lut, float(prior.tau ** 2), int(prior.max_depth), bool(use_likelihood),
                                        _signed(u_base), _signed(leaves_base), keys,
                                        int(n_cuts.max()) + 1 + extra_bins, int(threads))


def _gfr_cuda(prior, state, Xb, n_cuts, sigma2, U, Z, keyed, groups, threads, use_likelihood=True, extra_bins=0):
    """The CUDA grow-from-root kernel on copies of the inputs, through the sampler's call."""
    dev = [x.cuda() for x in state]
    keyed = None if keyed is None else (keyed[0], keyed[1], keyed[2].cuda())
    assert gfr_sweep_native(prior, *dev, Xb.cuda(), n_cuts.cuda(), sigma2.cuda(), None if U is None else U.cuda(),
                            None if Z is None else Z.cuda(), use_likelihood, None if groups is None else groups.cuda(),
                            keyed=keyed, max_bins=int(n_cuts.max()) + 1 + extra_bins), "the CUDA kernel is unavailable"
    for x, y in zip(state, dev):
        x.copy_(y.cpu())


def _compare_gfr(threads, dtype=torch.float64, sweeps=2, T=6, C=3, use_likelihood=True, keyed=False, run=_gfr_blocks,
                 extra_bins=0, **setup):
    """Grow-from-root sweeps from the same state and draws, the block code's against the CPU kernel's: trees and
    leaf maps equal; values and residuals bit for bit with one thread (every sum in the CPU kernel's order),
    else to rounding (float64 1e-12, float32 1e-5 relative)."""
    from torchtree.core.random import derive_seed

    prior, grid, data, groups = _setup(**setup)
    Xb, n_cuts = grid.bins(data.X).contiguous(), grid.n_cuts
    g = torch.Generator().manual_seed(5)
    ref = _state(prior, grid, data, T, C, dtype)
    K = prior.n_slots
    sigma2 = torch.full((C,), 0.1, dtype=torch.float64)
    tol = dict(rtol=1e-12, atol=1e-12) if dtype == torch.float64 else dict(rtol=1e-5, atol=1e-5)
    nodes = 0
    for i in range(sweeps):
        U = torch.rand(T, C, K, generator=g, dtype=torch.float64)
        Z = torch.randn(T, C, K, generator=g, dtype=torch.float64)
        keys = (derive_seed(9, 2 * i), derive_seed(9, 2 * i + 1), torch.randint(0, 2 ** 40, (T, C), generator=g))
        U, Z, keys = (None, None, keys) if keyed else (U, Z, None)
        mine = [x.clone() for x in ref]
        assert gfr_sweep_native(prior, *ref, Xb, n_cuts, sigma2, U, Z, use_likelihood, groups, keyed=keys)
        run(prior, mine, Xb, n_cuts, sigma2, U, Z, keys, groups, threads, use_likelihood, extra_bins)
        for a, b in zip(mine[:2] + mine[3:4], ref[:2] + ref[3:4]):  # feature, cut, leaf_of: exact
            assert torch.equal(a, b)
        for a, b in zip((mine[2], mine[4]), (ref[2], ref[4])):  # values, residuals
            if threads == 1:
                assert torch.equal(a, b)
            else:
                torch.testing.assert_close(a, b, **tol)
        nodes = max(nodes, int((ref[0] >= 0).sum()))
    return ref, nodes


@pytest.mark.parametrize("threads", [1, 3, 4, 7])
@pytest.mark.parametrize("dtype", [torch.float64, torch.float32])
def test_gfr_block_sweeps_regrow_the_cpu_sweeps_trees(threads, dtype):
    _, nodes = _compare_gfr(threads, dtype)
    assert nodes > 6 * 3  # the trees grew: the weights chose splits


def test_gfr_blocks_coded_table_prior_only_and_keyed_draws():
    """A categorical column and missing values (the column drawn by input column, then split column), a
    sweep without the likelihood, keyed node uniforms and leaf normals, more histogram bins than needed."""
    assert _compare_gfr(4, coded=True)[1] > 0
    assert _compare_gfr(1, coded=True, extra_bins=3)[1] > 0
    assert _compare_gfr(4, use_likelihood=False)[1] > 0
    assert _compare_gfr(1, keyed=True)[1] > 0
    assert _compare_gfr(5, keyed=True, T=2, C=2)[1] > 0


def test_gfr_blocks_shallow_trees_and_one_tree():
    ref, _ = _compare_gfr(4, max_depth=2, T=1, C=4)
    assert int(ref[0][..., 3:].ge(0).sum()) == 0  # no split at depth 2


@pytest.mark.cuda
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
@pytest.mark.parametrize("case", ["float64", "float32", "coded", "prior", "many points", "keyed"])
def test_cuda_gfr_kernel_regrows_the_cpu_sweeps_trees(case):
    """The grow-from-root kernel itself (``bart_cuda.cu``) against the CPU kernel, as above (threads > 1: values to
    rounding)."""
    kw = {"float64": {}, "float32": dict(dtype=torch.float32), "coded": dict(coded=True),
          "prior": dict(use_likelihood=False), "many points": dict(n=20_000, T=3), "keyed": dict(keyed=True)}[case]
    assert native.cuda_available(), "the CUDA kernels did not build"
    _compare_gfr(0, run=_gfr_cuda, **kw)


@pytest.mark.parametrize("threads, blocks, points", [(1, 2, "1"), (4, 3, "4"), (3, 5, "4"), (2, 4, "1")])
def test_grid_sweeps_make_the_cpu_sweeps_moves(threads, blocks, points, monkeypatch):
    """A chain's points over several blocks (``TORCHTREE_CHAIN_BLOCKS``, ``bart_grid_block.h``: the leader block
    decides each tree from the chain's summed cells and publishes the decision), each block of ``threads`` host
    threads: the CPU sweep's moves."""
    monkeypatch.setenv("TORCHTREE_BLOCK_POINTS", points)
    monkeypatch.setenv("TORCHTREE_CHAIN_BLOCKS", str(blocks))
    ref, grown, counts = _compare(sweeps=6, threads=threads)
    assert grown > 12
    assert int(counts[1].sum()) > 0


@pytest.mark.parametrize("case", ["one tree", "two trees", "three trees", "coded", "keyed", "prior", "float32",
                                  "more blocks than points", "deep start", "deep start, 4 blocks"])
def test_grid_sweep_cases(case, monkeypatch):
    """The grid sweep's first and last trees, coded tables, keyed normals, the prior, float32, and blocks left
    without points (every block still meets every barrier)."""
    monkeypatch.setenv("TORCHTREE_CHAIN_BLOCKS", "3")
    kw = {"one tree": dict(T=1, C=2), "two trees": dict(T=2, C=2), "three trees": dict(T=3, C=2),
          "coded": dict(coded=True), "keyed": dict(keyed=True), "prior": dict(use_likelihood=False),
          "float32": dict(dtype=torch.float32, max_depth=3), "more blocks than points": dict(n=6, T=4, C=2),
          "deep start": dict(deep_start=True, n=600), "deep start, 4 blocks": dict(deep_start=True, n=600, T=8)}[case]
    if case == "more blocks than points":
        monkeypatch.setenv("TORCHTREE_CHAIN_BLOCKS", "8")
    elif case == "deep start, 4 blocks":
        monkeypatch.setenv("TORCHTREE_CHAIN_BLOCKS", "4")
    _compare(sweeps=4, threads=2, **kw)
