"""Prediction in chunks of rows bounded by the memory budget (issue #21 item 3).

Chunking must change no bit of hard-tree ``predict`` / ``predict_proba`` / ``log_predictive``
(soft trees: rounding only, their routing is a matmul);
``predict_interval`` works in fixed blocks of rows with random numbers shared by all rows, so
a row's interval is the same in any block and alone; a computation whose smallest chunk cannot
fit the budget is refused before it allocates, naming the setting.
"""
from __future__ import annotations

import subprocess
import sys

import numpy as np
import pytest
import torch

import torchtree
from torchtree import ChipmanPrior, Data, DirichletMultinomial, TopDownSMC
from torchtree.core.budget import DEFAULT_BUDGET, memory_budget, parse_bytes, set_memory_budget
from torchtree.model.interval import INTERVAL_BLOCK, equal_tailed, polar_normal, polar_pairs, polar_student_t


@pytest.fixture
def budget():
    """Set the budget inside a test; restored afterwards."""
    old = set_memory_budget(None)
    yield set_memory_budget
    set_memory_budget(old)


def _cls():
    g = np.random.default_rng(0)
    X = g.normal(size=(80, 3))
    y = (X[:, 0] > 0).astype(int) + (X[:, 1] > 0.5).astype(int)
    post = TopDownSMC(ChipmanPrior(0.95, 0.5), DirichletMultinomial(3.0), n_particles=60,
                      proposal="optimal").run(Data(X, y), seed=1)
    return post, g.normal(size=(700, 3)), g.integers(0, 3, 700)


def _reg():
    g = np.random.default_rng(3)
    X = g.uniform(-2, 2, size=(100, 2))
    y = np.where(X[:, 0] > 0, 2.0, -1.0) + 0.3 * g.normal(size=100)
    post = TopDownSMC(n_particles=80, proposal="optimal").run(Data(X, y, task="regression"), seed=2)
    Xq = g.uniform(-2.5, 2.5, size=(2600, 2))
    return post, Xq, np.where(Xq[:, 0] > 0, 2.0, -1.0) + 0.3 * g.normal(size=2600)


@pytest.fixture(scope="module")
def cls_post():
    return _cls()


@pytest.fixture(scope="module")
def reg_post():
    return _reg()


def test_budget_setting_parses_and_restores(budget, monkeypatch):
    assert memory_budget() == DEFAULT_BUDGET == 1 << 30
    assert parse_bytes("256M") == 256 << 20 and parse_bytes("1.5GiB") == 3 << 29 and parse_bytes(4096) == 4096
    budget("64M")
    assert memory_budget() == 64 << 20
    assert budget(None) == 64 << 20 and memory_budget() == DEFAULT_BUDGET
    monkeypatch.setenv("TORCHTREE_MEMORY_BUDGET", "2G")
    assert memory_budget() == 2 << 30
    for bad in ("-1", "lots", 0, True):
        with pytest.raises(ValueError, match="positive number of bytes"):
            torchtree.set_memory_budget(bad)


def test_hard_predictions_are_bit_identical_in_tiny_chunks(cls_post, reg_post, budget):
    post, Xq, yq = cls_post
    rpost, rX, ry = reg_post
    full = (post.predict_proba(Xq), post.predict(Xq), post.log_predictive(Xq, yq), rpost.predict(rX),
            rpost.log_predictive(rX, ry))
    # a budget of about 3 rows per chunk (see TreePosterior._mixture)
    per_row = max(200 * (p._pairs_per_row() + 3) + 8 * 6 for p in (post, rpost))
    budget(3 * per_row)
    Xt = post.inputs(Xq)
    assert post._mixture(Xt, lambda rows, pts: rows, 3).shape == (700, 3)
    chunked = (post.predict_proba(Xq), post.predict(Xq), post.log_predictive(Xq, yq), rpost.predict(rX),
               rpost.log_predictive(rX, ry))
    for a, b in zip(full, chunked):
        assert np.array_equal(a, b)
    budget(200 * post._pairs_per_row() // 2)  # not even one row fits
    with pytest.raises(ValueError, match=r"set_memory_budget.*TORCHTREE_MEMORY_BUDGET"):
        post.predict_proba(Xq)


def _plain_interval(post, X, level, n_draws, seed):
    """predict_interval written plainly: every draw routed, all rows at once, the Student-t
    variates from the polar pairs by Bailey's formula, ``torch.quantile``."""
    Xt = post.inputs(X)
    g = torch.Generator(device="cpu").manual_seed(seed)
    idx = torch.multinomial(post.weights.cpu().float(), n_draws, replacement=True, generator=g)
    u, w = polar_pairs(g, n_draws)
    rows = post.trees.take(idx).predict(Xt, post.likelihood).double()
    df, loc, scale = rows[..., 0], rows[..., 1], rows[..., 2]
    t = u[:, None] * torch.sqrt(df * (w[:, None] ** (-2 / df) - 1) / w[:, None])
    q = torch.tensor([(1 - level) / 2, 1 - (1 - level) / 2], dtype=torch.float64)
    return torch.quantile(loc + scale * t, q, dim=0).T.numpy()


def test_interval_is_the_plain_algorithm(reg_post):
    """The blocked, in-place computation against the plain one; pow and expm1 round
    differently, so to 1e-9 of the width (a Monte Carlo bound moves by ~1e-2 of it)."""
    post, X, _ = reg_post
    for n, level, n_draws, seed in [(20, 0.8, 4000, 0), (INTERVAL_BLOCK, 0.9, 300, 5), (7, 0.5, 1001, 3)]:
        got, ref = post.predict_interval(X[:n], level, n_draws, seed), _plain_interval(post, X[:n], level, n_draws, seed)
        width = ref[:, 1] - ref[:, 0]
        assert np.all(np.abs(got - ref) <= 1e-9 * width[:, None]), np.abs(got - ref).max()


def test_polar_student_t_is_student_t():
    """Kolmogorov-Smirnov distance of 20000 polar variates to the exact t CDF (scipy), for
    df from 0.7 to 1e6: below 0.0136 (the 1% critical value 1.63 / sqrt(n)); the normal
    variates likewise."""
    stats = pytest.importorskip("scipy.stats")
    u, w = polar_pairs(torch.Generator().manual_seed(0), 20000)
    crit = 1.63 / np.sqrt(20000)
    for df in (0.7, 1.0, 3.0, 11.5, 1e3, 1e6):
        t = polar_student_t(u, w, torch.tensor(df, dtype=torch.float64)).numpy()
        assert stats.kstest(t, "t", args=(df,)).statistic < crit, df
    assert stats.kstest(polar_normal(u, w).numpy(), "norm").statistic < crit
    # one pair serves every df: the variates are monotone in the pair's radius, not reshuffled
    a, b = (polar_student_t(u, w, torch.tensor(d, dtype=torch.float64)) for d in (2.0, 50.0))
    assert torch.equal(torch.sign(a), torch.sign(b)) and bool((a.abs() >= b.abs() - 1e-12).all())


def test_equal_tailed_matches_torch_quantile_bit_for_bit():
    g = torch.Generator().manual_seed(0)
    for n, m in [(4000, 50), (7, 3), (1, 2), (1001, 5)]:
        d = torch.randn(n, m, generator=g, dtype=torch.float64)
        d[: n // 3] = d[: n // 3].round()  # ties
        for level in (0.0, 0.5, 0.8, 0.9, 0.999):
            q = torch.tensor([(1 - level) / 2, 1 - (1 - level) / 2], dtype=torch.float64)
            assert np.array_equal(equal_tailed(d, level), torch.quantile(d, q, dim=0).T.numpy())


def test_interval_blocks_are_deterministic_budget_free_and_row_independent(reg_post, budget):
    post, X, _ = reg_post
    first = max(INTERVAL_BLOCK, 500)
    n = first + 500
    Xb = np.concatenate([X[:first], X[:500]])  # rows 0..499 again, in other blocks
    iv = post.predict_interval(Xb, level=0.9, n_draws=2000, seed=4)
    assert iv.shape == (n, 2) and np.all(iv[:, 0] < iv[:, 1])
    assert np.array_equal(iv[:INTERVAL_BLOCK], post.predict_interval(X[:INTERVAL_BLOCK], 0.9, 2000, 4))
    budget(int(1.2 * (120 * 2000 + 64 * len(post)) * INTERVAL_BLOCK) + (1 << 20))  # one block just fits
    assert np.array_equal(iv, post.predict_interval(Xb, level=0.9, n_draws=2000, seed=4))
    # the random numbers are shared by all rows: the same row in another block, or alone,
    # gets the same interval bit for bit; another seed moves it
    assert np.array_equal(iv[:500], iv[first:])
    for r in (0, 3, 499):
        assert np.array_equal(iv[r], post.predict_interval(X[r : r + 1], 0.9, 2000, 4)[0])
    assert not np.array_equal(iv[:500], post.predict_interval(X[:500], 0.9, 2000, 5))
    # a budget under one block's needs takes smaller blocks (here 40 rows) with the same intervals
    budget(int(1.2 * (120 * 2000 + 64 * len(post)) * 40))
    assert np.array_equal(iv, post.predict_interval(Xb, level=0.9, n_draws=2000, seed=4))
    budget(100 << 10)  # not one row's draws: refused, naming the setting
    with pytest.raises(ValueError, match=r"predict_interval with n_draws=2000.*lower n_draws"):
        post.predict_interval(Xb, level=0.9, n_draws=2000)


def test_soft_predictions_are_bit_identical_in_tiny_chunks(budget):
    rng = np.random.default_rng(0)
    X = rng.random((300, 2))
    y = X[:, 0] * 2 + 0.1 * rng.normal(size=300)
    reg = torchtree.BayesianTreeRegressor(method="dcc", n_iterations=2, n_initial=4, n_chains=2, n_samples=6,
                                          n_warmup=10, max_depth=2).fit(X, y)
    post = reg.posterior_
    full = (post.predict(X), post.log_predictive(X, y))
    budget(int(3 * post._row_bytes(200)))  # 3 rows per chunk
    chunked = (post.predict(X), post.log_predictive(X, y))
    for a, b in zip(full, chunked):
        # the soft routing is a batched float32 matmul whose rounding depends on the number
        # of rows (BLAS kernels): chunks agree to a few float32 ulps, not bit for bit
        eps = float(torch.finfo(post.data.X.dtype).eps)
        assert np.allclose(a, b, rtol=8 * eps, atol=0), np.max(np.abs(np.asarray(a) - np.asarray(b)))
    budget(int(post._row_bytes(200) // 2))
    with pytest.raises(ValueError, match="set_memory_budget"):
        post.predict(X)


def test_peak_memory_of_prediction_is_flat_in_the_rows(tmp_path):
    """Predicting 200000 rows under a 32 MiB budget stays within ~100 MiB above the input."""
    post, _, _ = _reg()
    path = str(tmp_path / "post.pt")
    post.save(path)
    code = f"""
import resource, numpy as np, torch, torchtree
torchtree.set_memory_budget("32M")
post = torchtree.TreePosterior.load({path!r})
X = torch.as_tensor(np.random.default_rng(0).uniform(-2, 2, size=(200000, 2)))
out = post.predict(X)  # warm-up: allocator pools, the predictive table
base = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
post.predict(X); post.log_predictive(X, out)
print((resource.getrusage(resource.RUSAGE_SELF).ru_maxrss - base) / 1024)
"""
    grew = float(subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout)
    assert grew < 100, f"peak RSS grew by {grew:.0f} MiB"
