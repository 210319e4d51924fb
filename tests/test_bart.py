"""BART (method="bart", issue #23) against exact answers.

* one tree (``n_trees=1``) with the noise variance pinned by a huge ``nu``: the sampled trees'
  leaf counts and the posterior mean of f at every point equal the enumeration of
  :func:`torchtree.testing.exact_bart_tree` (backfitting MCMC and Particle Gibbs);
* prior-only runs (``use_likelihood=False``) reproduce the exact prior distribution of the
  number of leaves on a two-feature grid;
* with a fixed tree, the leaf values are the conjugate normal draw, sigma^2 draws have the
  inverse-gamma moments, probit latents the truncated-normal moments.

Tolerances come from the spread between independent chains (5 standard errors plus a small
floor), so a test fails when the sampler targets another distribution, not by chance.
"""
from __future__ import annotations

import math

import numpy as np
import pytest
import torch

from torchtree import BayesianTreeClassifier, BayesianTreeRegressor, Data
from torchtree.model.bart import LEAF, BartPrior, CutGrid
from torchtree.model.bart_posterior import BARTPosterior
from torchtree.samplers.bart import BART
from torchtree.steps.bart_moves import draw_latent, draw_sigma, tree_update
from torchtree.testing import exact_bart_tree


def _chain_stats(values: np.ndarray, n_chains: int):
    """Mean over all draws and its standard error from the per-chain means (draw-major input)."""
    per_chain = values.reshape(-1, n_chains, *values.shape[1:]).mean(0)
    return per_chain.mean(0), per_chain.std(0, ddof=1) / np.sqrt(n_chains)


def _one_tree_data():
    x = np.array([0, 1, 2, 3, 4, 5, 6, 7, 2, 5], dtype=np.float64)
    y = np.array([0.1, 0.0, 0.3, 1.1, 1.3, 1.0, 2.1, 1.9, 0.2, 0.9])
    return x[:, None], y


@pytest.mark.slow
@pytest.mark.parametrize("bart_sampler", ["mcmc", "pg"])
def test_one_tree_posterior_equals_enumeration(bart_sampler):
    X, y = _one_tree_data()
    data = Data(X, y, task="regression")
    C = 64
    # chains from single leaves (n_gfr=0): a one-tree chain crosses between its modes (which rule is the
    # root's) in thousands of sweeps, so grow-from-root starts, all near one mode, leave a bias of 2-5 se here
    kw = dict(n_trees=1, n_chains=C, n_warmup=100, n_samples=600, max_depth=3, nu=1e9, sigma_hat=0.3,
              bart_sampler=bart_sampler, beta_split=1.0, n_gfr=0)
    post = BART(**kw).run(data, seed=5)
    prior = post.prior
    grid = CutGrid.from_data(data, 100)
    bins = grid.bins(data.X).T.numpy()
    resid = (y - prior.offset) / prior.scale
    leaves_exact, mean_exact = exact_bart_tree(bins, grid.n_cuts.tolist(), prior, resid, prior.lam)
    n_leaves = (post.feature == LEAF).sum(-1)[:, 0].numpy()
    onehot = (n_leaves[:, None] == np.arange(leaves_exact.size)[None, :]).astype(float)
    freq, se = _chain_stats(onehot, C)
    assert np.all(np.abs(freq - leaves_exact) < 5 * se + 0.005), (freq[:6], leaves_exact[:6], se[:6])
    f = post.latent_draws(X).numpy()
    fm, fse = _chain_stats(f, C)
    exact_f = prior.offset + prior.scale * mean_exact
    assert np.all(np.abs(fm - exact_f) < 5 * fse + 1e-3), (fm, exact_f, fse)
    # sigma pinned at sqrt(lam) by nu = 1e9 (relative sd 4.5e-5); the trace is sigma on y's scale
    assert np.allclose(post.sigma.numpy(), np.sqrt(prior.lam), rtol=1e-3)
    assert np.allclose(post.info["trace"]["sigma"], np.sqrt(prior.lam) * prior.scale, rtol=1e-3)


@pytest.mark.slow
@pytest.mark.parametrize("bart_sampler", ["mcmc", "pg"])
def test_prior_only_tree_sizes_equal_enumeration(bart_sampler):
    X = np.array([[a, b] for a in range(4) for b in range(3)], dtype=np.float64)
    data = Data(X, np.zeros(len(X)), task="regression")
    C, T = 32, 4
    post = BART(n_trees=T, n_chains=C, n_warmup=50, n_samples=500, max_depth=3, beta_split=0.5,
                use_likelihood=False, bart_sampler=bart_sampler).run(data, seed=1)
    grid = CutGrid.from_data(data, 100)
    assert grid.n_cuts.tolist() == [3, 2]
    exact, _ = exact_bart_tree(grid.bins(data.X).T.numpy(), [3, 2], post.prior)
    n_leaves = (post.feature == LEAF).sum(-1).numpy()  # [S*C, T]
    onehot = (n_leaves[..., None] == np.arange(exact.size)).astype(float).mean(1)  # trees pooled per chain
    freq, se = _chain_stats(onehot, C)
    assert abs(exact.sum() - 1) < 1e-12 and exact[1] < 0.5
    assert np.all(np.abs(freq - exact) < 5 * se + 0.005), (freq[:8], exact[:8])


def _stump_prior(max_depth=1):
    return BartPrior("regression", 1, 0.95, 2.0, max_depth, tau=0.3, nu=3.0, lam=0.1, scale=1.0, offset=0.0,
                     sigma_hat=0.3)


def test_leaf_values_are_the_conjugate_draw_for_a_fixed_tree():
    # max_depth 1: a root split cannot grow, so a grow move leaves the tree as it is
    prior = _stump_prior()
    g = torch.Generator().manual_seed(0)
    N, C, K = 50, 3, prior.n_slots
    Xb = torch.randint(0, 5, (2, N), generator=g, dtype=torch.int16)
    n_cuts = torch.tensor([4, 4])
    feature = torch.tensor([[1, LEAF, LEAF]] * C)
    cut = torch.tensor([[2, 0, 0]] * C)
    value = torch.zeros(C, K)
    leaf_of = torch.where(Xb[1] <= 2, 1, 2).expand(C, N).to(torch.int16)
    resid = torch.randn(C, N, generator=g)
    sigma2 = torch.tensor([0.5, 1.0, 2.0], dtype=torch.float64)
    u = torch.full((C, 5), 0.1)  # move type grow
    z = torch.randn(C, K, generator=g)
    f, k, v, L, r, (move, acc) = tree_update(prior, feature, cut, value, leaf_of, resid, Xb, n_cuts, sigma2, u, z)
    assert torch.equal(f, feature) and torch.equal(k, cut) and not acc.any()
    assert torch.equal(L, leaf_of)
    tau2 = prior.tau ** 2
    for c in range(C):
        for leaf in (1, 2):
            pts = leaf_of[c] == leaf
            n, s = pts.sum().item(), resid[c, pts].double().sum().item()
            post_var = 1.0 / (1.0 / tau2 + n / sigma2[c].item())
            mean = post_var * s / sigma2[c].item()
            assert v[c, leaf].item() == pytest.approx(mean + np.sqrt(post_var) * z[c, leaf].item(), rel=1e-5, abs=1e-6)
        # residuals: the old tree's zero values replaced by the new leaves
        assert torch.allclose(r[c], resid[c] - v[c, leaf_of[c].long()], atol=1e-6)


def test_sigma_draws_have_inverse_gamma_moments():
    prior = _stump_prior()
    C, N = 40000, 20
    resid = torch.linspace(-1, 1, N, dtype=torch.float64).expand(C, N)
    u = torch.rand(C, 16, 2, generator=torch.Generator().manual_seed(3), dtype=torch.float64)
    s2 = draw_sigma(prior, resid, u).numpy()
    a = 0.5 * (prior.nu + N)
    b = 0.5 * (prior.nu * prior.lam + float((resid[0] ** 2).sum()))
    mean, var = b / (a - 1), b * b / ((a - 1) ** 2 * (a - 2))
    assert abs(s2.mean() - mean) < 5 * np.sqrt(var / C)
    assert abs(s2.var() / var - 1) < 0.06  # sd of the sample variance ratio ~ 0.012 here


def test_probit_latents_are_truncated_normals():
    C = 200000
    fit = torch.full((C, 2), 0.4, dtype=torch.float64)
    y = torch.tensor([True, False])
    z = draw_latent(fit, y, torch.rand(C, 2, generator=torch.Generator().manual_seed(4), dtype=torch.float64))
    assert (z[:, 0] > 0).all() and (z[:, 1] < 0).all()
    phi = np.exp(-0.5 * 0.4 ** 2) / np.sqrt(2 * np.pi)
    Phi = 0.5 * (1 + torch.erf(torch.tensor(0.4 / np.sqrt(2))).item())
    assert z[:, 0].mean().item() == pytest.approx(0.4 + phi / Phi, abs=5 / np.sqrt(C))
    assert z[:, 1].mean().item() == pytest.approx(0.4 - phi / (1 - Phi), abs=5 / np.sqrt(C))


def _friedman(n, seed):
    rng = np.random.default_rng(seed)
    X = rng.uniform(size=(n, 6))
    f = 10 * np.sin(np.pi * X[:, 0] * X[:, 1]) + 20 * (X[:, 2] - 0.5) ** 2 + 10 * X[:, 3] + 5 * X[:, 4]
    return X, f + rng.normal(size=n), f


def test_same_seed_same_draws_and_resume(tmp_path):
    X, y, _ = _friedman(80, 0)
    data = Data(X, y, task="regression")
    kw = dict(n_trees=10, n_chains=3, n_warmup=6, n_samples=6)
    a = BART(**kw).run(data, seed=2)
    b = BART(**kw).run(data, seed=2)
    assert torch.equal(a.value, b.value) and torch.equal(a.sigma, b.sigma)
    c = BART(**kw).run(data, seed=3)
    assert not torch.equal(a.sigma, c.sigma)
    # a run stopped right after the checkpoint of sweep 5 and resumed equals the uninterrupted run
    from torchtree.monitor import CallbackMonitor

    class Stop(Exception):
        pass

    def hook(step):
        if step >= 5:
            raise Stop

    ck = str(tmp_path / "bart.ckpt")
    with pytest.raises(Stop):
        BART(**kw, checkpoint=ck, checkpoint_every=1).run(data, seed=2, monitor=CallbackMonitor(on_checkpoint=hook))
    d = BART(**kw, checkpoint=ck).run(data, seed=2)
    assert torch.equal(a.value, d.value) and torch.equal(a.sigma, d.sigma) and torch.equal(a.feature, d.feature)
    # the cached forest summary is not in the checkpoint (a resumed run recomputes it)
    saved = torch.load(ck, weights_only=True)
    assert "forest_stats" not in str(list(_keys(saved)))


def _keys(obj):
    """Every dict key in a nested checkpoint."""
    if isinstance(obj, dict):
        for k, v in obj.items():
            yield k
            yield from _keys(v)
    elif isinstance(obj, (list, tuple)):
        for v in obj:
            yield from _keys(v)


def test_sweep_reuses_the_forest_summary_and_draws_the_same(monkeypatch):
    """A sweep starts from the previous sweep's ``forest_stats`` (one compiled pass per sweep, not two), with the
    draws of a run that recomputes it."""
    import torchtree.samplers.bart.sampler as bs
    from torchtree.kernels import native

    if not native.available():
        pytest.skip("compiled kernels unavailable")
    X, y, _ = _friedman(120, 1)
    data = Data(X, y, task="regression")
    kw = dict(n_trees=12, n_chains=2, n_warmup=8, n_samples=8, n_gfr=2)
    calls = []
    real = bs._forest_stats
    monkeypatch.setattr(bs, "_forest_stats", lambda f: calls.append(1) or real(f))
    a = BART(**kw).run(data, seed=4)
    assert len(calls) == 16  # one per sweep: 2 grow-from-root + 14 MCMC sweeps
    monkeypatch.setattr(bs.BARTState, "forest_stats", property(lambda self: None, lambda self, v: None))
    b = BART(**kw).run(data, seed=4)
    assert torch.equal(a.feature, b.feature) and torch.equal(a.value, b.value) and torch.equal(a.sigma, b.sigma)


def test_the_driver_resolves_presets_with_the_ranks_it_runs_on(monkeypatch):
    """Settings left to presets are resolved inside the run with the backend's world size (the CUDA chain preset
    gives each rank's GPU its own batch): every rank sees world_size 2, a run without a backend 1."""
    import sys
    from pathlib import Path

    from torchtree.samplers import driver

    sys.path.insert(0, str(Path(__file__).parent / "_dist_workers"))
    from thread_backend import run_threads

    seen = []
    of = driver.RunShape.of

    def spy(*a, **k):
        shape = of(*a, **k)
        seen.append(shape.world_size)
        return shape

    monkeypatch.setattr(driver.RunShape, "of", spy)
    X, y, _ = _friedman(40, 1)
    data = Data(X, y, task="regression")
    kw = dict(n_trees=3, n_chains="auto", n_warmup=2, n_samples=2)
    run_threads(2, lambda be: BART(**kw, backend=be).run(data, seed=0), timeout=120)
    BART(**kw).run(data, seed=0)
    assert seen == [2, 2, 1]


def test_two_ranks_draw_what_one_rank_draws():
    import sys
    from pathlib import Path

    sys.path.insert(0, str(Path(__file__).parent / "_dist_workers"))
    from thread_backend import run_threads

    X, y, _ = _friedman(60, 1)
    data = Data(X, (y > y.mean()).astype(int), task="classification")
    kw = dict(n_trees=8, n_chains=4, n_warmup=4, n_samples=5)
    one = BART(**kw).run(data, seed=7)
    outs = run_threads(2, lambda be: BART(**kw, backend=be).run(data, seed=7), timeout=120)
    for o in outs:
        assert torch.equal(o.value, one.value) and torch.equal(o.feature, one.feature)
        assert np.array_equal(o.predict_proba(X), one.predict_proba(X))
        assert np.array_equal(o.info["trace"]["f"], one.info["trace"]["f"]) and o.info["rhat_f"] == one.info["rhat_f"]


def test_estimators_fit_predict_intervals_and_save(tmp_path):
    X, y, f = _friedman(300, 2)
    Xt, yt, ft = _friedman(300, 3)
    reg = BayesianTreeRegressor(method="bart", random_state=0, n_trees=50, n_samples=60, n_warmup=60).fit(X, y)
    pred = reg.predict(Xt)
    assert np.sqrt(np.mean((pred - ft) ** 2)) < 1.6  # sd of y is ~5; a constant predictor gets ~4.9
    iv = reg.predict_interval(Xt)
    cover = np.mean((yt >= iv[:, 0]) & (yt <= iv[:, 1]))
    assert 0.8 <= cover <= 0.98
    assert reg.log_predictive(Xt, yt) > -2.3
    s = reg.posterior_.summary()
    assert np.sum(s["split_share"][:5]) > 0.8  # the five features f uses
    # the same summary type as the other posteriors: a dict whose repr is a table, the split
    # shares listed most used first (x0..x4 are f's features, x5.. noise)
    from torchtree.model.posterior import PosteriorSummary

    assert isinstance(s, PosteriorSummary) and s["n_trees"] == 50
    text = repr(s)
    assert "split_share (per feature, most used first):" in text and "alpha_split=0.95" in text
    listed = [ln.split()[0] for ln in text.split("split_share (per feature, most used first):")[1].splitlines() if ln.strip()]
    assert len(listed) == X.shape[1] and set(listed[:5]) == {f"x{j}" for j in range(5)}
    path = str(tmp_path / "bart.pt")
    reg.posterior_.save(path)
    back = BARTPosterior.load(path)
    assert np.array_equal(back.predict(Xt), pred)
    from torchtree import TreePosterior

    with pytest.raises(ValueError, match=r"of hard trees: it holds a torchtree\.BARTPosterior/2 \(torchtree\.load_posterior"):
        TreePosterior.load(path)  # the loader of another kind names the kind and the loader that reads it
    yc = (y > np.median(y)).astype(int)
    clf = BayesianTreeClassifier(method="bart", random_state=0, n_trees=50, n_samples=60, n_warmup=60).fit(X, yc)
    p = clf.predict_proba(Xt)
    assert p.shape == (300, 2) and np.allclose(p.sum(1), 1)
    assert np.mean(clf.predict(Xt) == (ft > np.median(f))) > 0.8
    with pytest.raises(ValueError, match="does not use"):
        BayesianTreeRegressor(method="bart", b0=0.3).fit(X, y)


def test_prediction_blocks_and_monitor(monkeypatch, tmp_path):
    from torchtree.model import bart_posterior
    from torchtree.monitor import TraceMonitor

    X, y, _ = _friedman(120, 4)
    mon = TraceMonitor()
    post = BART(n_trees=10, n_chains=2, n_warmup=5, n_samples=10, monitor_every=5).run(
        Data(X, y, task="regression"), seed=0, monitor=mon)
    ref = (post.predict(X), post.predict_interval(X, n_draws=300), post.log_predictive(X, y))
    monkeypatch.setattr(bart_posterior, "_ROWS", 7)  # many blocks: the same numbers
    got = (post.predict(X), post.predict_interval(X, n_draws=300), post.log_predictive(X, y))
    assert np.allclose(ref[0], got[0], rtol=0, atol=1e-12) and np.array_equal(ref[1], got[1])
    # the noise is shared by all rows: a row's interval is the same alone or among others
    for r in (0, 5, 119):
        assert np.allclose(post.predict_interval(X[r : r + 1], n_draws=300)[0], ref[1][r], rtol=0, atol=1e-12)
    assert not np.array_equal(post.predict_interval(X, n_draws=300, seed=1), ref[1])
    assert abs(ref[2] - got[2]) < 1e-10
    assert np.allclose(post.latent_draws(X).mean(0).numpy(), ref[0])
    assert {"bart/sigma", "bart/accept", "trees/leaves_mean", "bart/splits/x0"} <= set(mon.trace)
    assert mon.steps == [4, 9, 14]  # the 0-based index of the sweep reported


def test_mean_interval_is_the_quantiles_of_the_function_draws():
    """``kind="mean"`` resamples the kept draws ``f_s(x)`` (no noise): each bound is a quantile of
    ``latent_draws`` at a probability within 4 binomial sd of ``(1 -+ level) / 2`` for ``n_draws``
    Monte Carlo picks; the predictive interval, which adds ``sigma_s e``, holds it."""
    X, y, _ = _friedman(120, 5)
    post = BART(n_trees=10, n_chains=2, n_warmup=20, n_samples=100).run(Data(X, y, task="regression"), seed=0)
    n_draws = 40000
    mean = post.predict_interval(X[:30], level=0.9, n_draws=n_draws, kind="mean")
    pred = post.predict_interval(X[:30], level=0.9, n_draws=n_draws)
    f = np.sort(post.latent_draws(X[:30]).numpy(), axis=0)
    eps = 4 * math.sqrt(0.05 * 0.95 / n_draws)
    for k, p in ((0, 0.05), (1, 0.95)):
        below = np.quantile(f, p - eps, axis=0, method="inverted_cdf")
        above = np.quantile(f, p + eps, axis=0, method="inverted_cdf")
        assert ((below <= mean[:, k]) & (mean[:, k] <= above)).all()
    assert ((pred[:, 0] < mean[:, 0]) & (mean[:, 1] < pred[:, 1])).all()


def test_prior_only_sigma_follows_its_calibrated_prior():
    X, y, _ = _friedman(100, 5)
    post = BART(n_trees=3, n_chains=50, n_warmup=0, n_samples=200, use_likelihood=False, q=0.75).run(
        Data(X, y, task="regression"), seed=4)
    p = post.prior
    s = post.sigma.numpy()  # scaled units, like sigma_hat
    # P(sigma < sigma_hat) = q by the calibration of lambda (draws are independent: no data)
    frac = np.mean(s < p.sigma_hat)
    assert abs(frac - 0.75) < 5 * np.sqrt(0.75 * 0.25 / s.size)
    # sigma^2 ~ nu lam / chi2_nu: E[1 / sigma^2] = 1 / lam
    assert abs(np.mean(1 / s ** 2) * p.lam - 1) < 5 * np.sqrt(2 / p.nu / s.size)


@pytest.mark.slow
def test_gibbs_kernel_keeps_the_joint_distribution():
    """Geweke's test: (trees, leaves, sigma) from the prior and data from the model given them,
    then Gibbs sweeps: every sweep's state is again distributed as the prior. Replications
    are the chains of one batch (each chain its own data set, through its residuals)."""
    from torchtree.samplers.bart import backfit_sweep

    prior = BartPrior("regression", 4, 0.95, 1.0, 3, tau=0.4, nu=5.0, lam=0.3, scale=1.0, offset=0.0, sigma_hat=0.5)
    rng = np.random.default_rng(0)
    Xr = rng.uniform(size=(25, 2))
    grid = CutGrid.from_data(Data(Xr, np.zeros(25), task="regression"), 4)
    Xb, n_cuts = grid.bins(torch.as_tensor(Xr)), grid.n_cuts
    C, T, N, K = 10000, prior.n_trees, 25, prior.n_slots
    feature = torch.full((T, C, K), -2, dtype=torch.int16)
    feature[:, :, 0] = LEAF
    cut, value = torch.zeros_like(feature), torch.zeros(T, C, K, dtype=torch.float64)
    leaf_of = torch.zeros(T, C, N, dtype=torch.int16)
    keys = torch.arange(T)[:, None] * C + torch.arange(C)[None, :]
    resid = torch.zeros(C, N, dtype=torch.float64)
    for sweep in range(60):  # prior draws of the trees (no data)
        resid, _ = backfit_sweep(prior, feature, cut, value, leaf_of, resid, Xb, n_cuts,
                                 torch.ones(C, dtype=torch.float64), 11, 8 * sweep, keys, use_likelihood=False)
    # sigma^2 = nu lam / chi2_nu from torch's own sampler (not the code under test)
    chi2 = torch.distributions.Chi2(torch.tensor(prior.nu, dtype=torch.float64))
    torch.manual_seed(12)
    sigma2 = prior.nu * prior.lam / chi2.sample((C,))
    e = torch.randn(C, N, generator=torch.Generator().manual_seed(13), dtype=torch.float64)
    resid = sigma2.sqrt()[:, None] * e  # y - sum of trees, with y drawn given the trees and sigma
    leaves0 = (feature == LEAF).sum(2).double().mean(0).numpy()
    f0 = value.gather(2, leaf_of.long()).sum(0)[:, 0].numpy()  # f at the first point
    s0 = sigma2.numpy().copy()
    for sweep in range(60, 90):
        resid, _ = backfit_sweep(prior, feature, cut, value, leaf_of, resid, Xb, n_cuts, sigma2, 11, 8 * sweep, keys)
        sigma2 = draw_sigma(prior, resid, keyed_uniform_for_test(100 + sweep, C))
    leaves1 = (feature == LEAF).sum(2).double().mean(0).numpy()
    f1 = value.gather(2, leaf_of.long()).sum(0)[:, 0].numpy()
    s1 = sigma2.numpy()

    def same(a, b, what):  # two samples of C draws each, compared in mean (5 standard errors)
        se = np.sqrt(a.var() / a.size + b.var() / b.size)
        assert abs(a.mean() - b.mean()) < 5 * se, (what, a.mean(), b.mean(), se)

    same(np.log(s0), np.log(s1), "log sigma^2")
    same(leaves0, leaves1, "leaves")
    same(f0 ** 2, f1 ** 2, "f(x)^2")
    same(f0, f1, "f(x)")


def keyed_uniform_for_test(stream: int, C: int) -> torch.Tensor:
    from torchtree.core.random import keyed_uniform

    return keyed_uniform(99, stream, torch.arange(C)[:, None, None], torch.arange(32).view(16, 2))


@pytest.mark.parametrize("shape", [0.3, 0.75, 1.0, 4.5])
def test_gamma_draws_have_the_gamma_moments(shape):
    from torchtree.steps.bart_moves import gamma_from_uniforms

    C = 100000
    u = torch.rand(C, 16, 2, generator=torch.Generator().manual_seed(int(shape * 10)), dtype=torch.float64)
    g = gamma_from_uniforms(torch.full((C,), shape, dtype=torch.float64), u).numpy()
    assert abs(g.mean() - shape) < 5 * np.sqrt(shape / C)
    assert abs(g.var() / shape - 1) < 0.05
    assert abs(np.mean(g < shape) - float(torch.special.gammainc(torch.tensor(shape), torch.tensor(shape)))) < 0.005


@pytest.mark.slow
@pytest.mark.distributed
def test_torchrun_gloo_ranks_draw_what_one_process_draws(tmp_path):
    import sys
    from pathlib import Path

    from _launch import torchrun

    workers = Path(__file__).parent / "_dist_workers"
    proc = torchrun(["bart_worker.py", tmp_path], workers)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    sys.path.insert(0, str(workers))
    import bart_worker

    X, y, kw = bart_worker.case()
    ref = BART(**kw).run(Data(X, y, task="regression"), seed=11)
    for r in range(2):
        got = torch.load(tmp_path / f"rank{r}.pt", weights_only=False)
        assert torch.equal(got["value"], ref.value) and torch.equal(got["feature"], ref.feature)
        assert torch.equal(got["sigma"], ref.sigma) and np.array_equal(got["predict"], ref.predict(X))


def test_time_budget_stops_between_sweeps_and_keeps_a_posterior(monkeypatch):
    from torchtree.samplers import driver
    from _counting import TickClock

    X, y, _ = _friedman(200, 6)
    tick = TickClock(0.02)  # the budget's clock, injected: 50 readings make the 1 s budget
    monkeypatch.setitem(driver.CLOCKS, "wall", tick)
    with pytest.warns(UserWarning, match=r"max_seconds=1 ran out in warm-up, after \d+ of 100000 warm-up sweeps"):
        post = BART(n_trees=20, n_warmup=100000, n_samples=10, max_seconds=1.0, compile="off").run(
            Data(X, y, task="regression"), seed=0)
    assert 1.0 <= tick.t <= 1.0 + 2 * tick.step, tick.t
    assert post.n_particles == 4 and post.info["sweeps"] < 100000  # the last sweep of each chain
    assert post.info["n_warmup"] == post.info["sweeps"]  # the warm-up sweeps that ran, not those asked for
    assert np.isfinite(post.predict(X)).all()


def test_a_failing_compiler_falls_back_to_eager_with_a_warning(monkeypatch):
    from torchtree.samplers.bart import sampler as bart_module

    def broken(*args):
        raise RuntimeError("no C++ compiler")

    X, y, _ = _friedman(60, 7)
    data = Data(X, y, task="regression")
    kw = dict(n_trees=5, n_chains=2, n_warmup=3, n_samples=3)
    ref = BART(**kw, compile="off").run(data, seed=1)
    monkeypatch.setitem(bart_module._COMPILED, "fn", broken)
    with pytest.warns(RuntimeWarning, match="torch.compile failed"):
        got = BART(**kw, compile="on").run(data, seed=1)
    assert torch.equal(got.value, ref.value) and torch.equal(got.sigma, ref.sigma)
    # Particle Gibbs' compiled levels likewise
    ref = BART(**kw, compile="off", bart_sampler="pg").run(data, seed=1)
    monkeypatch.setitem(bart_module._COMPILED, "pg", broken)
    with pytest.warns(RuntimeWarning, match="torch.compile failed"):
        got = BART(**kw, compile="on", bart_sampler="pg").run(data, seed=1)
    assert torch.equal(got.value, ref.value) and torch.equal(got.feature, ref.feature)


def test_the_compiled_update_compiles_once_per_run(monkeypatch):
    """One graph for every tree of a run. The update's cached tables are filled before its first compiled
    call (a compiled function guards on them): counted with Dynamo's eager backend, one graph. And no
    tree's tensors reach it at a storage offset (Inductor specialises on offset 0 against the others' and
    would compile the first tree's graph apart): checked on what the compiled function receives."""
    from torchtree.samplers.bart import sampler as bart_module
    from torchtree.steps import bart_moves

    X, y, _ = _friedman(80, 3)
    data = Data(X, y, task="regression")
    kw = dict(n_trees=4, n_chains=2, n_warmup=2, n_samples=2, compile="on")
    torch._dynamo.reset()
    monkeypatch.setattr(bart_moves, "_TABLES", {})  # as in a fresh process
    monkeypatch.setitem(bart_module._COMPILED, "fn", torch.compile(tree_update, backend="eager", dynamic=False))
    before = torch._dynamo.utils.counters["stats"]["unique_graphs"]
    BART(**kw).run(data, seed=0)
    assert torch._dynamo.utils.counters["stats"]["unique_graphs"] - before == 1
    torch._dynamo.reset()

    offsets = []

    def received(*args):
        offsets.extend(a.storage_offset() for a in args if isinstance(a, torch.Tensor))
        return tree_update(*args)

    monkeypatch.setitem(bart_module._COMPILED, "fn", received)
    BART(**kw).run(data, seed=0)
    assert len(offsets) > 4 * 4 and set(offsets) == {0}


def test_unconverged_chains_warn_and_prior_only_ones_do_not():
    """Two chains of 8 kept sweeps from single leaves on Friedman data: the diagnostics are off their
    limits and a UserWarning names them. Prior-only chains of 3 trees mix fast: no warning."""
    import warnings

    X, y, _ = _friedman(200, 5)
    data = Data(X, y, task="regression")
    with pytest.warns(UserWarning, match="unconverged.*ess_"):
        BART(n_trees=20, n_chains=2, n_warmup=0, n_samples=8).run(data, seed=0)
    with warnings.catch_warnings():
        warnings.simplefilter("error", UserWarning)
        post = BART(n_trees=3, n_chains=4, n_warmup=100, n_samples=1000, use_likelihood=False).run(data, seed=0)
    assert post.info["rhat_sigma"] <= 1.1 and post.info["ess_sigma"] >= 100


def test_posterior_storage_follows_the_trees_it_holds(tmp_path):
    """A few deep trees no longer set the width of every tree: the posterior keeps a main block and
    the deep trees apart, predicts exactly what the dense trees give, and saves and loads both forms."""
    from torchtree.model.bart import ABSENT, LEAF, forest_sum
    from torchtree.model.bart_posterior import BARTPosterior

    X, y, _ = _friedman(300, 4)
    post = BART(n_trees=20, n_samples=30, n_warmup=30, compile="off").run(Data(X, y, task="regression"), seed=1)
    S, T = post.n_particles, post.n_trees
    f, c, v = post.feature.clone(), post.cut.clone(), post.value.clone()
    # make three trees deep: a chain of splits down the left edge to depth 7
    K = 255
    wide = lambda a, fill: torch.cat([a, torch.full((S, T, K - a.shape[-1]), fill, dtype=a.dtype)], -1)  # noqa: E731
    f, c, v = wide(f, ABSENT), wide(c, 0), wide(v, 0)
    for s_, t_ in ((0, 0), (5, 3), (29 * 4 - 1, 19)):
        f[s_, t_] = ABSENT
        node = 0
        for depth in range(7):
            f[s_, t_, node], c[s_, t_, node] = depth % 4, 1 + depth
            f[s_, t_, 2 * node + 2], v[s_, t_, 2 * node + 2] = LEAF, 0.01 * depth
            node = 2 * node + 1
        f[s_, t_, node], v[s_, t_, node] = LEAF, -0.05
    deep = BARTPosterior(post.prior, post.grid, f, c, v, post.sigma, post.chain_of, post.n_features, info=post.info)
    main_f, deep_f = deep._main[0], deep._deep[0]
    apart = set(zip(deep._deep[3].tolist(), deep._deep[4].tolist()))
    assert {(0, 0), (5, 3), (29 * 4 - 1, 19)} <= apart and len(apart) < S * T // 10
    assert main_f.shape[-1] < 64 and deep_f.shape[-1] == K
    stored = sum(t.numel() * t.element_size() for t in (*deep._main, *deep._deep))
    assert stored < (f.numel() * (2 + 2 + v.element_size())) / 4  # the dense form's quarter at most
    assert torch.equal(deep.feature[..., :K], f) and torch.equal(deep.value[..., :K], v)
    Xb = deep._bins(X[:50])
    ref = post.prior.offset + post.prior.scale * forest_sum(f, c, v, Xb).mean(0)
    np.testing.assert_allclose(deep.predict(X[:50]), ref.numpy(), rtol=0, atol=1e-9)
    deep.save(str(tmp_path / "b.pt"))
    back = BARTPosterior.load(str(tmp_path / "b.pt"))
    np.testing.assert_array_equal(back.predict(X[:50]), deep.predict(X[:50]))
    assert back.summary()["leaves_mean"] == deep.summary()["leaves_mean"]
    assert 'n0 -> n1 [label="yes"]' in deep.to_dot(0, tree=0) and deep.to_dot(0, tree=0).count("->") == 14


@pytest.mark.slow
def test_one_tree_and_sigma_jointly_equal_enumeration():
    """Sigma free (its prior nu lambda / chi2_nu): the joint posterior of the tree and sigma^2, enumerated over
    the trees (:func:`~torchtree.testing.exact_bart_tree` at each sigma^2) and integrated over sigma^2 on a
    fine grid, against backfitting MCMC's draws of sigma, the leaf count and f. The pinned-sigma test above
    does not see the joint (a QA pass: a warm-up of 300 sweeps left a 3-4 se bias in a long run; 2000 here).
    Tolerance: 5 chain-based standard errors (64 independent chains) plus 0.005."""
    from scipy.special import gammaln, logsumexp

    X, y = _one_tree_data()
    data = Data(X, y, task="regression")
    C = 64
    post = BART(n_trees=1, n_chains=C, n_warmup=2000, n_samples=800, max_depth=3, beta_split=1.0, n_gfr=0,
                sigma_hat=0.4).run(data, seed=11)
    prior = post.prior
    grid = CutGrid.from_data(data, 100)
    bins = grid.bins(data.X).T.numpy()
    resid = (y - prior.offset) / prior.scale
    s2 = np.exp(np.linspace(np.log(1e-6), np.log(2.0), 300))  # sigma^2 on the scaled target (steps of 0.05 in log)
    runs = [exact_bart_tree(bins, grid.n_cuts.tolist(), prior, resid, float(v), evidence=True) for v in s2]
    a, b = prior.nu / 2, prior.nu * prior.lam / 2
    log_prior = a * np.log(b) - gammaln(a) - (a + 1) * np.log(s2) - b / s2 + np.log(s2)  # density in log sigma^2
    logw = log_prior + np.array([r[2] for r in runs])
    w = np.exp(logw - logsumexp(logw))
    assert w[0] < 1e-8 and w[-1] < 1e-8  # the grid holds the posterior of sigma^2
    sigma_exact = float((w * np.sqrt(s2)).sum())
    L = max(r[0].size for r in runs)
    leaves_exact = sum(wi * np.pad(r[0], (0, L - r[0].size)) for wi, r in zip(w, runs))
    f_exact = prior.offset + prior.scale * sum(wi * r[1] for wi, r in zip(w, runs))

    sig, sig_se = _chain_stats(post.sigma.numpy(), C)
    assert abs(sig - sigma_exact) < 5 * sig_se + 0.005 * sigma_exact, (sig, sigma_exact, sig_se)
    n_leaves = (post.feature == LEAF).sum(-1)[:, 0].numpy()
    onehot = (n_leaves[:, None] == np.arange(L)[None, :]).astype(float)
    freq, se = _chain_stats(onehot, C)
    assert np.all(np.abs(freq - leaves_exact) < 5 * se + 0.005), (freq[:6], leaves_exact[:6], se[:6])
    fm, fse = _chain_stats(post.latent_draws(X).numpy(), C)
    assert np.all(np.abs(fm - f_exact) < 5 * fse + 1e-3), (fm, f_exact, fse)
