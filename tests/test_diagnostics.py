"""Tests of torchtree.model.diagnostics: R-hat / ESS helpers and the ArviZ export."""
from __future__ import annotations

import sys

import numpy as np
import pytest
import torch

from torchtree import Data, TopDownSMC, TreePosterior
from torchtree.model.diagnostics import (ARVIZ_MISSING, chain_ess, ess_columns, posterior_traces, rhat, rhat_columns, to_arviz,
                                        tree_sizes, weighted_ess)


@pytest.fixture(scope="module")
def smc_posterior():
    rng = np.random.default_rng(0)
    X = rng.uniform(size=(80, 3))
    y = (X[:, 0] > 0.5).astype(int)
    return TopDownSMC(n_particles=20, n_islands=2).run(Data(X, y), seed=0)


def _traced(post: TreePosterior, chains=4, draws=50, seed=0) -> TreePosterior:
    rng = np.random.default_rng(seed)
    post.info["trace"] = {
        "n_leaves": torch.as_tensor(rng.integers(2, 6, size=(chains, draws)).astype(np.float64)),
        "log_posterior": torch.as_tensor(rng.normal(-50, 1, size=(chains, draws))),
    }
    return post


# ----------------------------------------------------------------------------- rhat / ess
def test_rhat_and_ess_on_iid_and_stuck_chains():
    # Tolerances: for 4 x 1000 iid normals R-hat - 1 has sd ~ 0.003 and ESS/4000 ~ 1 +- 0.05;
    # the bounds below are > 5 sd away (false-failure rate < 1e-6, and the seed is fixed anyway).
    rng = np.random.default_rng(1)
    iid = rng.normal(size=(4, 1000))
    assert abs(rhat(iid) - 1.0) < 0.02
    assert 3000 < chain_ess(iid) < 5000
    stuck = iid + np.arange(4)[:, None] * 3.0  # chains around different values
    assert rhat(stuck) > 1.5
    ar = np.zeros((2, 2000))
    for t in range(1, 2000):  # AR(1) with phi = 0.9: ESS ~ n (1 - phi) / (1 + phi) ~ 210
        ar[:, t] = 0.9 * ar[:, t - 1] + rng.normal(size=2)
    assert 100 < chain_ess(ar) < 400
    assert np.isnan(rhat(np.ones((2, 10)))) and np.isnan(chain_ess(np.ones((1, 3))))
    assert rhat(torch.as_tensor(iid[0])) == pytest.approx(rhat(iid[:1]))


def _rhat_by_hand(a):
    """BDA3 sec. 11.4, written plainly: split each chain, W the mean within-half variance, B / n the variance of
    the halves' means."""
    n = a.shape[1] // 2
    if n < 2:
        return float("nan")
    halves = [c[:n] for c in a] + [c[len(c) - n:] for c in a]
    W = np.mean([np.var(h, ddof=1) for h in halves])
    B = n * np.var([np.mean(h) for h in halves], ddof=1)
    return float("nan") if W <= 0 else float(np.sqrt(((n - 1) / n * W + B / n) / W))


def _ess_by_hand(a):
    """Stan's multi-chain ESS with Geyer's initial monotone sequence, one lag at a time."""
    m, n = a.shape
    if n < 4:
        return float("nan")
    acov = np.array([[np.sum((c[: n - t] - c.mean()) * (c[t:] - c.mean())) / n for t in range(n)] for c in a])
    W = np.mean(acov[:, 0] * n / (n - 1))
    var = (n - 1) / n * W + (np.var(a.mean(1), ddof=1) if m > 1 else 0.0)
    if not var > 0:
        return float("nan")
    rho = 1.0 - (W - acov.mean(0)) / var
    rho[0] = 1.0
    total, last = 0.0, np.inf
    for k in range(n // 2):
        p = rho[2 * k] + rho[2 * k + 1]
        if p <= 0:
            break
        last = min(last, p)
        total += last
    return m * n / max(-1.0 + 2.0 * total, 1.0 / np.log10(max(m * n, 10)))


def test_column_diagnostics_equal_the_plain_formulas_column_by_column():
    """``rhat_columns`` / ``ess_columns`` (and the scalar ``rhat`` / ``chain_ess`` built on them) against the
    formulas written one chain and one lag at a time, on random walks, stuck chains, a constant column and
    chains too short for an estimate (NaN); agreement to 1e-9 relative."""
    rng = np.random.default_rng(5)
    for m, n in ((1, 40), (3, 25), (4, 7), (2, 3)):
        a = rng.normal(size=(m, n, 5)).cumsum(1) * rng.uniform(0.5, 2, size=5) + np.arange(m)[:, None, None] * [0, 0, 2, 0, 0]
        a[:, :, 4] = 1.5  # constant
        want_r = np.array([_rhat_by_hand(a[:, :, p]) for p in range(5)])
        want_e = np.array([_ess_by_hand(a[:, :, p]) for p in range(5)])
        np.testing.assert_allclose(rhat_columns(a), want_r, rtol=1e-9, equal_nan=True)
        np.testing.assert_allclose(ess_columns(a), want_e, rtol=1e-9, equal_nan=True)
        np.testing.assert_allclose([rhat(a[:, :, p]) for p in range(5)], want_r, rtol=1e-9, equal_nan=True)
        np.testing.assert_allclose([chain_ess(a[:, :, p]) for p in range(5)], want_e, rtol=1e-9, equal_nan=True)
        assert np.isnan(want_r[4]) and np.isnan(want_e[4])


def test_matches_mcmc_module_if_present():
    mcmc = pytest.importorskip("torchtree.samplers.mcmc")
    if not hasattr(mcmc, "rhat") or not hasattr(mcmc, "chain_ess"):
        pytest.skip("torchtree.samplers.mcmc has no rhat/chain_ess")
    rng = np.random.default_rng(2)
    x = rng.normal(size=(3, 200)).cumsum(1)
    assert rhat(x) == pytest.approx(mcmc.rhat(x))
    assert chain_ess(x) == pytest.approx(mcmc.chain_ess(x))


def test_weighted_ess():
    assert weighted_ess(np.ones(10)) == pytest.approx(10)
    assert weighted_ess(torch.tensor([1.0, 0.0, 0.0])) == pytest.approx(1)
    with pytest.raises(ValueError):
        weighted_ess([0.0, 0.0])


def test_tree_sizes(smc_posterior):
    s = tree_sizes(smc_posterior)
    q = smc_posterior.trees.n_trees
    assert s["n_leaves"].shape == s["depth"].shape == s["weight"].shape == (q,)
    assert s["weight"].sum() == pytest.approx(1.0)
    assert np.all(s["n_leaves"] >= 1) and np.all(s["depth"] >= 0)
    assert float((s["weight"] * s["n_leaves"]).sum()) == pytest.approx(smc_posterior.summary()["leaves_mean"])


def test_posterior_traces(smc_posterior):
    assert posterior_traces(smc_posterior) is None
    post = _traced(TreePosterior(smc_posterior.trees, smc_posterior.log_weights, smc_posterior.likelihood, 3))
    tr = posterior_traces(post)
    assert tr["n_leaves"].shape == (4, 50) and tr["log_posterior"].dtype == np.float64


# ----------------------------------------------------------------------------- arviz
def test_to_arviz_without_arviz_says_how_to_install(smc_posterior, monkeypatch):
    monkeypatch.setitem(sys.modules, "arviz", None)  # makes "import arviz" fail
    with pytest.raises(ImportError, match="pip install arviz"):
        to_arviz(smc_posterior)
    assert "pip install arviz" in ARVIZ_MISSING


def test_to_arviz_weighted_smc(smc_posterior):
    az = pytest.importorskip("arviz")
    idata = to_arviz(smc_posterior)
    q = smc_posterior.trees.n_trees
    assert idata.posterior["n_leaves"].shape == (1, q)
    assert idata.posterior["depth"].shape == (1, q)
    w = idata.sample_stats["weight"].values
    assert w.shape == (1, q) and w.sum() == pytest.approx(1.0)
    assert idata.attrs["sampler"] == "TopDownSMC" and idata.attrs["weighted"] == 1
    assert idata.attrs["log_evidence"] == pytest.approx(smc_posterior.log_evidence)
    mean = float(np.average(idata.posterior["n_leaves"].values[0], weights=w[0]))
    assert mean == pytest.approx(smc_posterior.summary()["leaves_mean"])
    assert az is not None


def test_to_arviz_mcmc_traces_after_save_and_load(smc_posterior, tmp_path):
    az = pytest.importorskip("arviz")
    post = _traced(TreePosterior(smc_posterior.trees, smc_posterior.log_weights, smc_posterior.likelihood, 3,
                                 info={"sampler": "MCMC"}))
    path = tmp_path / "mcmc.pt"
    post.save(str(path))
    loaded = TreePosterior.load(str(path))
    idata = to_arviz(loaded)
    assert idata.posterior["n_leaves"].shape == (4, 50)
    assert idata.posterior.sizes["chain"] == 4 and idata.posterior.sizes["draw"] == 50
    np.testing.assert_allclose(idata.sample_stats["lp"].values, post.info["trace"]["log_posterior"].numpy())
    assert idata.attrs["sampler"] == "MCMC" and idata.attrs["weighted"] == 0
    r = az.rhat(idata, var_names=["n_leaves"])["n_leaves"].item()
    assert r == pytest.approx(rhat(post.info["trace"]["n_leaves"]), rel=0.05)
