"""The compiled C++ kernels (torchtree.kernels.native) against their plain-torch references.

``bart_sweep`` (a whole backfitting sweep in place, what ``compile="native"`` runs) and
``bart_tree_update`` (one update) must return what :func:`torchtree.steps.bart_moves.tree_update` returns, bit for
bit in these runs (the sums run in the same order and dtypes; only ``log`` may differ in its last
bit, which would flip an acceptance with probability ~1e-16 per update): whole BART runs with
``compile="native"`` and ``compile="off"`` give the same trees, noise draws and predictions, for
regression (float32 and float64), binary and multiclass probit, a coded table (missing values and a
categorical column: the group-wise feature draw), Particle-Gibbs-free prior runs, and single updates
from random states.
"""
import numpy as np
import pandas as pd
import pytest
import torch

from torchtree import BART, Data
from torchtree.kernels import native
from torchtree.steps.bart_moves import tree_update, tree_update_native

pytestmark = [pytest.mark.filterwarnings("ignore:MCMC chains look unconverged"),
              pytest.mark.skipif(not native.available(), reason="the C++ kernels could not be built here")]


def _same(a, b, exact=True):
    assert torch.equal(a.feature, b.feature) and torch.equal(a.cut, b.cut)
    assert all(a.info[k] == b.info[k] for k in a.info if k.startswith("accept/"))  # the sweeps' move counts
    for x, y in zip((a.value, a.sigma), (b.value, b.sigma)):
        assert torch.equal(x, y) if exact else torch.allclose(x, y, rtol=1e-12, atol=1e-15)


def _friedman(n=300, seed=0):
    rng = np.random.default_rng(seed)
    X = rng.uniform(size=(n, 6))
    y = 10 * np.sin(np.pi * X[:, 0] * X[:, 1]) + 20 * (X[:, 2] - .5) ** 2 + 10 * X[:, 3] + 5 * X[:, 4] + rng.normal(size=n)
    return X, y


@pytest.mark.parametrize("dtype", ["float32", "float64"])
def test_regression_runs_equal_the_reference(dtype):
    X, y = _friedman()
    d = Data(X, y, task="regression")
    kw = dict(n_trees=20, n_chains=3, n_warmup=40, n_samples=40, dtype=dtype, n_gfr=0)  # MCMC sweeps only
    a = BART(**kw, compile="off").run(d, seed=2)
    b = BART(**kw, compile="native").run(d, seed=2)
    # float64: torch's index_add_ may sum a leaf's residuals in another order (last-bit differences)
    _same(a, b, exact=dtype == "float32")
    assert np.allclose(a.predict(X[:20]), b.predict(X[:20]), rtol=1e-12)


@pytest.mark.parametrize("n_classes", [2, 3])
def test_probit_runs_equal_the_reference(n_classes):
    X, y = _friedman(seed=1)
    yc = np.digitize(y, np.quantile(y, np.linspace(0, 1, n_classes + 1)[1:-1]))
    d = Data(X, yc)
    kw = dict(n_trees=10, n_chains=2, n_warmup=30, n_samples=30, n_gfr=0)
    a, b = BART(**kw, compile="off").run(d, seed=5), BART(**kw, compile="native").run(d, seed=5)
    _same(a, b)
    assert np.array_equal(a.predict_proba(X[:20]), b.predict_proba(X[:20]))


def test_coded_table_and_prior_runs_equal_the_reference():
    rng = np.random.default_rng(3)
    n = 200
    x = rng.normal(size=n)
    c = rng.choice(list("abcd"), n)
    y = x + (c == "b") + 0.3 * rng.normal(size=n)
    x[rng.random(n) < 0.2] = np.nan
    d = Data(pd.DataFrame({"x": x, "c": c, "z": rng.normal(size=n)}), y, task="regression")
    assert d.groups is not None
    for use in (True, False):
        kw = dict(n_trees=10, n_chains=2, n_warmup=30, n_samples=30, use_likelihood=use, n_gfr=0)
        _same(BART(**kw, compile="off").run(d, seed=7), BART(**kw, compile="native").run(d, seed=7))


@pytest.mark.parametrize("coded", [False, True])
def test_columns_exhausted_by_ancestors_equal_the_reference(coded):
    """Binary columns (one cut each): a split uses its column up for the subtree below it, so deeper proposals
    draw among the columns left (the kernel counts them from the sweep's prefix tables and the node's
    ancestors); with a categorical column's subset columns, input column then split column. Prior-only runs
    grow deep trees, where every column can be used up (a grow then refused)."""
    rng = np.random.default_rng(11)
    n = 300
    B = rng.integers(0, 2, size=(n, 5)).astype(float)
    frame = pd.DataFrame(B, columns=[f"b{i}" for i in range(5)])
    if coded:
        frame["c"] = pd.Categorical(rng.choice(list("abcde"), n))
        frame.loc[rng.random(n) < 0.2, "b0"] = np.nan
    y = B[:, 0] + B[:, 1] * B[:, 2] + 0.3 * rng.normal(size=n)
    d = Data(frame, y, task="regression")
    assert (d.groups is not None) == coded
    for use in (True, False):
        kw = dict(n_trees=10, n_chains=2, n_warmup=40, n_samples=40, use_likelihood=use, n_gfr=0)
        a, b = BART(**kw, compile="off").run(d, seed=5), BART(**kw, compile="native").run(d, seed=5)
        _same(a, b)
        depth = int(np.floor(np.log2(int((b.feature >= 0).nonzero()[:, -1].max()) + 1)))
        assert depth >= 2  # split nodes two levels down: their children drew among the columns left


def test_single_updates_from_random_states_equal_the_reference():
    """200 updates from states reached by earlier updates, with fresh uniforms each: every output equal."""
    X, y = _friedman(n=150, seed=4)
    post = BART(n_trees=5, n_chains=4, n_warmup=5, n_samples=5, compile="off").run(Data(X, y, task="regression"), seed=1)
    prior, grid = post.prior, post.grid
    Xb = grid.bins(torch.as_tensor(X)).contiguous()
    g = torch.Generator().manual_seed(0)
    C, K = 4, prior.n_slots
    feature = torch.full((C, K), -2, dtype=torch.long)
    feature[:, 0] = -1
    cut = torch.zeros(C, K, dtype=torch.long)
    value = torch.zeros(C, K)
    leaf_of = torch.zeros(C, len(y), dtype=torch.int16)
    resid = torch.as_tensor((y - prior.offset) / prior.scale, dtype=torch.float32).repeat(C, 1)
    sigma2 = torch.full((C,), 0.3, dtype=torch.float64)
    for _ in range(200):
        u = torch.rand(C, 5, generator=g, dtype=torch.float64)
        z = torch.randn(C, K, generator=g)
        a = tree_update(prior, feature, cut, value, leaf_of, resid, Xb, grid.n_cuts, sigma2, u, z)
        b = tree_update_native(prior, feature, cut, value, leaf_of, resid, Xb, grid.n_cuts, sigma2, u, z)
        for x_, y_ in zip(a[:5] + a[5], b[:5] + b[5]):
            assert torch.equal(x_, y_)
        feature, cut, value, leaf_of, resid = a[:5]
    assert int((feature >= 0).sum()) > 0  # the trees grew


def test_without_the_kernels_the_reference_runs(monkeypatch):
    """TORCHTREE_NATIVE=0 (or a failed build) leaves the reference: same results, no error."""
    X, y = _friedman(n=100)
    d = Data(X, y, task="regression")
    kw = dict(n_trees=5, n_chains=2, n_warmup=10, n_samples=10)
    ref = BART(**kw, compile="off").run(d, seed=0)
    monkeypatch.setenv("TORCHTREE_NATIVE", "0")
    assert native.op("bart_tree_update") is None
    _same(BART(**kw, compile="native").run(d, seed=0), ref)


def test_a_library_that_does_not_load_is_rebuilt_not_fatal(tmp_path):
    """A library file that does not load (another process still linking it, or a truncated file) sends the loader to
    the locked build instead of raising: _load_built says False; a library that loads says True."""
    broken = tmp_path / "torchtree_native.so"
    broken.write_bytes(b"\x7fELF" + b"\0" * 12)  # an ELF header cut short, as a half-linked file is
    assert native._load_built(broken) is False
    if native.available():
        assert native._load_built(native.build_directory() / "torchtree_native.so") is True


def test_a_build_killed_midway_does_not_block_the_next(tmp_path):
    """torch's build lock file left by a build killed by a signal (a time limit) is removed by the next build,
    which holds torchtree's own lock (released by the system with its process), instead of waiting on it for ever;
    a build that finds the library loads it without building; a second process waits for the first's lock."""
    import subprocess
    import sys
    import textwrap

    folder, lib = tmp_path / "build", tmp_path / "build" / "torchtree_native.so"
    folder.mkdir()
    (folder / "lock").write_text("")  # what a killed torch build leaves
    seen = []
    native._build_once(folder, lib, "test kernels", lambda: seen.append((folder / "lock").exists()))
    assert seen == [False]  # built once, with the stale lock gone
    if native.available():  # a library that loads: no build
        built = native.build_directory() / "torchtree_native.so"
        native._build_once(built.parent, built, "test kernels", lambda: seen.append("built again"))
        assert seen == [False]
    # the lock serialises processes: a child cannot take it while this process holds it
    child = textwrap.dedent(f"""
        import fcntl, sys
        with open({str(folder / "torchtree.lock")!r}, "a") as fh:
            try:
                fcntl.flock(fh, fcntl.LOCK_EX | fcntl.LOCK_NB)
            except BlockingIOError:
                sys.exit(3)
    """)
    with native._build_lock(folder):
        assert subprocess.run([sys.executable, "-c", child]).returncode == 3
    assert subprocess.run([sys.executable, "-c", child]).returncode == 0


def test_grow_from_root_without_likelihood_draws_the_prior():
    """With the likelihood off, the grow-from-root proposal is the BART tree prior itself: 4000 trees
    regrown once have the leaf-count distribution of exact enumeration (chi-square, alpha = 1e-3);
    with a planted defect (the split probability of the next depth) the test fails."""
    from scipy.stats import chisquare

    from torchtree.model.bart import LEAF, CutGrid
    from torchtree.steps.bart_moves import gfr_sweep_native
    from torchtree.testing import exact_bart_tree

    X = np.array([[a, b] for a in range(4) for b in range(3)], dtype=np.float64)
    data = Data(X, np.zeros(len(X)), task="regression")
    prior = BART(n_trees=1, n_chains=1, n_warmup=1, n_samples=1, max_depth=3, beta_split=0.5).run(data, seed=0).prior
    grid = CutGrid.from_data(data, 100)
    Xb = grid.bins(data.X).contiguous()
    C, K, N = 4000, prior.n_slots, len(X)
    feature = torch.full((1, C, K), -2, dtype=torch.int16)
    feature[..., 0] = LEAF
    cut = torch.zeros(1, C, K, dtype=torch.int16)
    value = torch.zeros(1, C, K)
    leaf_of = torch.zeros(1, C, N, dtype=torch.int16)
    resid = torch.zeros(C, N)
    g = torch.Generator().manual_seed(3)
    U, Z = torch.rand(1, C, K, generator=g, dtype=torch.float64), torch.randn(1, C, K, generator=g, dtype=torch.float64)
    assert gfr_sweep_native(prior, feature, cut, value, leaf_of, resid, Xb, grid.n_cuts, torch.ones(C, dtype=torch.float64),
                            U, Z, use_likelihood=False)
    exact, _ = exact_bart_tree(Xb.T.numpy(), grid.n_cuts.tolist(), prior)
    leaves = (feature[0] == LEAF).sum(1).numpy()
    counts = np.bincount(leaves, minlength=exact.size)[: exact.size].astype(float)
    keep = exact * C > 5
    f_exp = exact[keep] * C
    assert chisquare(counts[keep], f_exp * counts[keep].sum() / f_exp.sum()).pvalue > 1e-3, (counts[:8], f_exp[:8])
    # every point sits in a leaf that holds it, and the residuals moved by the leaf values drawn
    rows = torch.arange(C)[:, None]
    assert bool((feature[0][rows, leaf_of[0].long()] == LEAF).all())
    assert torch.allclose(resid, -value[0].gather(1, leaf_of[0].long()))


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
def test_grow_from_root_keyed_draws_equal_the_tensors_they_replace(dtype):
    """The sampler's grow-from-root sweeps draw each node's uniform and each leaf's normal in the kernel
    (keyed by tree and chain); a sweep given the same numbers as tensors regrows the same trees (float32:
    the same bits; float64: the same trees, the values to rounding)."""
    from torchtree.core.random import derive_seed, keyed_uniform
    from torchtree.model.bart import LEAF, CutGrid
    from torchtree.steps.bart_moves import gfr_sweep_native

    X, y = _friedman(n=300, seed=2)
    data = Data(X, y, task="regression")
    prior = BART(n_trees=1, n_chains=1, n_warmup=1, n_samples=1).run(data, seed=0).prior
    grid = CutGrid.from_data(data, 100)
    Xb = grid.bins(data.X).contiguous()
    T, C, K, N = 6, 3, prior.n_slots, len(X)
    keys = torch.arange(T)[:, None] * C + torch.arange(C)[None, :] + 7
    state = []
    for _ in range(2):
        feature = torch.full((T, C, K), -2, dtype=torch.int16)
        feature[..., 0] = LEAF
        resid = torch.as_tensor((y - prior.offset) / prior.scale, dtype=dtype).repeat(C, 1)
        state.append([feature, torch.zeros(T, C, K, dtype=torch.int16), torch.zeros(T, C, K, dtype=dtype),
                      torch.zeros(T, C, N, dtype=torch.int16), resid])
    sigma2 = torch.full((C,), 0.05, dtype=torch.float64)
    slots = torch.arange(K)
    U = keyed_uniform(11, 5, keys[..., None], slots)
    Z = torch.special.ndtri(keyed_uniform(11, 1, keys[..., None], slots))
    assert gfr_sweep_native(prior, *state[0], Xb, grid.n_cuts, sigma2, U, Z)
    assert gfr_sweep_native(prior, *state[1], Xb, grid.n_cuts, sigma2, None, None,
                            keyed=(derive_seed(11, 5), derive_seed(11, 1), keys))
    for i, (a, b) in enumerate(zip(state[0], state[1])):
        # the kernel's ndtri may differ from torch's in the last bit of a float64 normal: trees and leaves equal,
        # values and residuals to rounding there; float32 rounds the normals first, so every bit is equal
        exact = i in (0, 1, 3) or dtype == torch.float32
        assert torch.equal(a, b) if exact else torch.allclose(a, b, rtol=1e-12, atol=1e-15)
    assert int((state[0][0] >= 0).sum()) > T * C  # the trees grew: the uniforms decided splits
    # a planted error: other keys give other trees
    other = [t.clone() for t in state[1]]
    other[0].fill_(-2), other[0][..., 0].fill_(LEAF), other[4].copy_(state[1][4])
    gfr_sweep_native(prior, *other, Xb, grid.n_cuts, sigma2, None, None, keyed=(derive_seed(11, 5), derive_seed(11, 1), keys + 1))
    assert not torch.equal(other[0], state[1][0])


def test_grow_from_root_runs_are_seeded_and_fall_back_to_mcmc():
    X, y = _friedman(n=200)
    d = Data(X, y, task="regression")
    kw = dict(n_trees=20, n_chains=2, n_warmup=20, n_samples=20, n_gfr=5)
    a, b = BART(**kw).run(d, seed=4), BART(**kw).run(d, seed=4)
    _same(a, b)
    off = BART(**kw, compile="off").run(d, seed=4)  # no compiled kernels: the 5 sweeps are MCMC sweeps
    assert not torch.equal(off.feature, a.feature)
    assert a.info["n_gfr"] == 5 and off.info["n_gfr"] == 0
    assert BART(**{**kw, "n_gfr": 30}).run(d, seed=4).info["n_gfr"] == 20  # at most n_warmup of them
    default = BART(n_trees=5, n_chains=2, n_samples=5).run(d, seed=4).info
    assert (default["n_gfr"], default["n_warmup"]) == (5, 50)  # GFR_SWEEPS, GFR_WARMUP: 6 columns
    assert BART(n_trees=5, n_chains=2, n_samples=5, n_gfr=0).run(d, seed=4).info["n_warmup"] == 250


def test_grow_from_root_by_default_only_where_it_costs_less_than_the_burn_in_it_saves():
    """default_gfr_sweeps: 5 grow-from-root sweeps (each scoring every cut of every column) when they cost
    at most the 200 MCMC sweeps of burn-in they save, by gfr_cost; a wide table starts from single leaves."""
    from torchtree.samplers.bart.config import default_gfr_sweeps, gfr_cost

    assert gfr_cost(1000, 10, 1000) == pytest.approx((1.4e4 + 1e4) / 1720)  # the formula, as documented
    assert default_gfr_sweeps(1000, 10, 1000) == 5 and default_gfr_sweeps(683, 347, 347) == 0
    rng = np.random.default_rng(0)
    wide = Data(rng.normal(size=(150, 300)), rng.normal(size=150), task="regression")
    info = BART(n_trees=3, n_chains=2, n_samples=2).run(wide, seed=0).info
    assert (info["n_gfr"], info["n_warmup"]) == (0, 250)
    info = BART(n_trees=3, n_chains=2, n_samples=2, n_gfr=2, n_warmup=4).run(wide, seed=0).info
    assert (info["n_gfr"], info["n_warmup"]) == (2, 4)  # asked for: run
