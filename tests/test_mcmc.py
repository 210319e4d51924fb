"""Tests of the MCMC sampler (torchtree.samplers.mcmc) against exact answers on tiny data."""
from __future__ import annotations

import numpy as np
import pytest
from scipy import stats as sps

import torchtree as tt
from torchtree.samplers.mcmc import MCMC, chain_ess, rhat
from torchtree.testing import exact_predictive, exact_prior_depth, exact_prior_leaves


def _tiny_data():
    X = np.array([[0.1, 1.0], [0.35, 0.2], [0.4, 0.9], [0.6, 0.1], [0.7, 0.8], [0.8, 0.3], [0.9, 0.5], [0.2, 0.6]])
    y = np.array([0, 0, 1, 0, 1, 1, 1, 0])
    return tt.Data(X, y)


def _chi2_pvalue(counts, probs, min_expected=5.0):
    n = counts.sum()
    exp = probs * n
    big = exp >= min_expected
    obs = np.append(counts[big], counts[~big].sum())
    ex = np.append(exp[big], exp[~big].sum())
    keep = ex > 0
    stat = ((obs[keep] - ex[keep]) ** 2 / ex[keep]).sum()
    return float(sps.chi2.sf(stat, keep.sum() - 1))


# ----------------------------------------------------------------------------- diagnostics
def test_rhat_and_ess_on_known_processes():
    """iid normal: R-hat within 0.02 of 1 and ESS within 15% of the draw count;
    AR(1) with rho = 0.8: ESS within 25% of n (1 - rho) / (1 + rho); shifted chains: R-hat > 1.5."""
    rng = np.random.default_rng(0)
    iid = rng.standard_normal((8, 2000))
    assert abs(rhat(iid) - 1) < 0.02
    assert abs(chain_ess(iid) / iid.size - 1) < 0.15
    rho, m, n = 0.8, 8, 4000
    x = np.zeros((m, n))
    e = rng.standard_normal((m, n))
    for t in range(1, n):
        x[:, t] = rho * x[:, t - 1] + np.sqrt(1 - rho**2) * e[:, t]
    assert abs(chain_ess(x) / (m * n * (1 - rho) / (1 + rho)) - 1) < 0.25
    shifted = iid + np.arange(8)[:, None]
    assert rhat(shifted) > 1.5
    assert np.isnan(rhat(np.ones((2, 10))))
    assert np.isnan(chain_ess(np.ones((1, 3))))


# ----------------------------------------------------------------------------- prior reproduction
def _prior_check(init, n_warmup, n_chains, seed):
    data = _tiny_data()
    prior = tt.ChipmanPrior(0.95, 0.5)
    post = MCMC(prior, tt.DirichletMultinomial(1.0), n_chains=n_chains, n_warmup=n_warmup, n_samples=1,
                init=init, use_likelihood=False).run(data, seed=seed)
    # Dedupe merged identical trees: weights x chains are the counts.
    w = (post.weights * n_chains).round().numpy()
    leaves = np.bincount(post.trees.n_leaves().numpy(), weights=w, minlength=data.n + 1)
    depth = np.bincount(post.trees.max_depth().numpy(), weights=w, minlength=data.n + 2)
    assert leaves.sum() == n_chains
    assert _chi2_pvalue(leaves, exact_prior_leaves(data, prior)) > 1e-3
    assert _chi2_pvalue(depth, exact_prior_depth(data, prior)) > 1e-3


def test_chains_keep_the_prior_without_likelihood():
    """4000 chains started from prior draws, 40 MH iterations with the labels ignored:
    the trees' leaves and depth still match exact enumeration (chi-square, alpha = 1e-3)."""
    _prior_check("prior", 39, 4000, seed=3)


@pytest.mark.slow
def test_chains_converge_to_the_prior_from_the_root():
    """2000 chains from the root-only tree, 300 iterations, labels ignored: leaves and depth
    match exact enumeration (chi-square, alpha = 1e-3). 60 iterations are not enough
    (the test then fails: mixing towards large trees is slow)."""
    _prior_check("root", 299, 2000, seed=4)


# ----------------------------------------------------------------------------- posterior
@pytest.mark.slow
def test_posterior_predictive_matches_exact_enumeration():
    """400 chains x 200 kept draws: predictive class probabilities within 0.02 of exact
    enumeration (Monte Carlo SD about 0.005 at these ESS)."""
    data = _tiny_data()
    prior, lik = tt.ChipmanPrior(0.95, 0.5), tt.DirichletMultinomial(1.0)
    Xq = np.array([[0.5, 0.5], [0.15, 0.8], [0.85, 0.2], [0.3, 0.3]])
    exact = exact_predictive(data, prior, lik, Xq)
    post = MCMC(prior, lik, n_chains=400, n_warmup=100, n_samples=200).run(data, seed=1)
    assert np.abs(post.predict_proba(Xq) - exact).max() < 0.02
    assert post.info["ess_leaves"] > 500


@pytest.mark.parametrize("cut_proposal", ["prior", "data", "informed"])
def test_posterior_predictive_quick(cut_proposal):
    """Short run (100 chains x 100 kept draws): predictive within 0.05 of exact, with
    either cut proposal (the data's gaps are unequal, so they differ)."""
    data = _tiny_data()
    prior, lik = tt.ChipmanPrior(0.95, 0.5), tt.DirichletMultinomial(1.0)
    Xq = np.array([[0.5, 0.5], [0.15, 0.8], [0.85, 0.2]])
    exact = exact_predictive(data, prior, lik, Xq)
    post = MCMC(prior, lik, n_chains=100, n_warmup=60, n_samples=100, cut_proposal=cut_proposal).run(data, seed=2)
    assert np.abs(post.predict_proba(Xq) - exact).max() < 0.05


# ----------------------------------------------------------------------------- API
def test_info_monitor_and_keep_all():
    data = _tiny_data()
    mon = tt.TraceMonitor()
    post = MCMC(n_chains=3, n_warmup=20, n_samples=10, thin=2, keep="all", monitor_every=5).run(data, seed=0, monitor=mon)
    assert post.n_particles == 3 * (20 + 10 * 2)
    arr = mon.as_arrays()
    for m in ("grow", "prune", "change", "swap"):
        assert f"mcmc/accept/{m}" in arr
        assert 0.0 <= post.info[f"accept/{m}"] <= 1.0 or np.isnan(post.info[f"accept/{m}"])
    for k in ("rhat_leaves", "ess_leaves", "rhat_log_posterior", "ess_log_posterior", "iterations_per_second"):
        assert k in post.summary()
    assert post.log_evidence is None
    post.trees.validate(data, post.likelihood)


def test_poisson_prior_regression_and_prior_init():
    rng = np.random.default_rng(0)
    X = rng.uniform(size=(60, 3))
    y = np.where(X[:, 0] > 0.5, 2.0, -1.0) + 0.1 * rng.standard_normal(60)
    data = tt.Data(X, y, task="regression")
    post = MCMC("poisson", poisson_lambda=3.0, n_chains=8, n_warmup=100, n_samples=50, init="prior").run(data, seed=4)
    assert post.task == "regression"
    pred = post.predict(np.array([[0.2, 0.5, 0.5], [0.8, 0.5, 0.5]]))
    assert pred[0] < 0 < pred[1]
    post.trees.validate(data, post.likelihood)


def test_same_seed_same_result_and_validation():
    data = _tiny_data()
    a = MCMC(n_chains=4, n_samples=20).run(data, seed=7)
    b = MCMC(n_chains=4, n_samples=20).run(data, seed=7)
    assert np.allclose(a.predict_proba(data.X), b.predict_proba(data.X))
    with pytest.raises(ValueError):
        MCMC(n_chains=0)
    with pytest.raises(ValueError):
        MCMC(move_probs=(0.5, 0.0, 0.5, 0.0))
    with pytest.raises(ValueError):
        MCMC(prior="nope")
    with pytest.raises(ValueError):
        MCMC(keep="some")


@pytest.mark.parametrize("case", ["dm-chipman", "nig-poisson", "dm-no-likelihood"])
def test_host_engine_reproduces_batched_chain(case):
    """The numpy single-chain engine consumes the same uniforms as the batched engine:
    the kept trees, their counts and the acceptance counts must be identical."""
    rng = np.random.default_rng(3)
    X = rng.integers(0, 5, size=(70, 3)).astype(float)
    X[:, 2] = rng.standard_normal(70)
    X[5] = X[6]
    if case.startswith("nig"):
        data = tt.Data(X, X[:, 0] - X[:, 2] + 0.2 * rng.standard_normal(70), task="regression")
        kw = dict(prior="poisson", poisson_lambda=4.0)
    else:
        data = tt.Data(X, (X[:, 0] + X[:, 2] > 2).astype(int))
        kw = dict(use_likelihood=case != "dm-no-likelihood")
    runs = [MCMC(n_chains=1, n_warmup=150, n_samples=150, init="prior", engine=e, **kw).run(data, seed=11)
            for e in ("host", "batched")]
    a, b = runs
    for k in ("accept/grow", "accept/prune", "accept/change", "accept/swap"):
        assert a.info[k] == b.info[k] or (np.isnan(a.info[k]) and np.isnan(b.info[k]))
    assert a.n_particles == b.n_particles == 150
    assert len(a) == len(b)
    Xq = data.X[:20]
    if data.task == "classification":
        assert np.allclose(a.predict_proba(Xq), b.predict_proba(Xq), atol=1e-6)
    else:
        assert np.allclose(a.predict(Xq), b.predict(Xq), atol=1e-9)
    a.trees.validate(data, a.likelihood)
    assert a.info["rhat_log_posterior"] == pytest.approx(b.info["rhat_log_posterior"], rel=1e-9)


@pytest.mark.parametrize("init", ["root", "prior"])
def test_host_chains_one_after_another_reproduce_the_batch(init):
    """Several chains on the host engine are the batched engine's chains: the same acceptance
    counts, the same per-chain traces (so the same R-hat and ESS; the log posterior to rounding)
    and the same predictions (the host merges repeated draws and orders them by chain: the weights
    sum in another order)."""
    rng = np.random.default_rng(5)
    X = rng.standard_normal((90, 3))
    data = tt.Data(X, (X[:, 0] + 0.5 * X[:, 1] > 0).astype(int))
    kw = dict(n_chains=3, n_warmup=60, n_samples=40, thin=2, init=init)
    host, batched = (MCMC(engine=e, **kw).run(data, seed=4) for e in ("host", "batched"))
    assert host.info["engine"] == "host" and batched.info["engine"] == "batched"
    for k in ("accept/grow", "accept/prune", "accept/change", "accept/swap", "rhat_leaves", "ess_leaves"):
        assert host.info[k] == batched.info[k] or (np.isnan(host.info[k]) and np.isnan(batched.info[k])), k
    assert host.info["trace"]["n_leaves"].shape == (3, 40)
    assert np.array_equal(host.info["trace"]["n_leaves"], batched.info["trace"]["n_leaves"])
    # the log posterior: numpy's sum of the node terms against torch's (the last bits)
    assert np.allclose(host.info["trace"]["log_posterior"], batched.info["trace"]["log_posterior"], rtol=1e-12, atol=0)
    assert host.info["ess_log_posterior"] == pytest.approx(batched.info["ess_log_posterior"], rel=1e-9)
    assert host.n_particles == batched.n_particles == 120
    assert np.allclose(host.predict_proba(data.X), batched.predict_proba(data.X), rtol=0, atol=1e-12)
    host.trees.validate(data, host.likelihood)


def test_auto_engine_follows_its_cost_model():
    """``engine="auto"``: host for one chain, and for several on the CPU where
    ``host_is_cheaper`` says so; a table the host engine cannot take stays batched."""
    from torchtree.samplers.mcmc.config import host_is_cheaper

    assert host_is_cheaper(1, 10 ** 7)
    assert host_is_cheaper(16, 1000) and not host_is_cheaper(16, 4000)
    assert host_is_cheaper(4, 6000) and not host_is_cheaper(4, 12000)
    assert not host_is_cheaper(64, 10) and not host_is_cheaper(2000, 8)  # large batches: batched (measured)
    rng = np.random.default_rng(0)

    def engine(n, n_chains, missing=False):
        X = rng.standard_normal((n, 2))
        if missing:
            X[0, 0] = np.nan
        return MCMC(n_chains=n_chains, n_warmup=1, n_samples=1).run(tt.Data(X, (X[:, 0] > 0).astype(int)),
                                                                      seed=0).info["engine"]

    assert engine(300, 16) == "host"
    assert engine(300, 64) == "batched"
    assert engine(5000, 16) == "batched"
    assert engine(300, 16, missing=True) == "batched"
    assert engine(300, 16) == "host"


def test_cut_proposal_option():
    """``cut_proposal="data"`` runs the batched engine (also for one chain); unknown
    values and the host engine with it are refused."""
    assert MCMC(n_chains=1, cut_proposal="data").engine == "batched"
    assert MCMC(n_chains=1).engine == "auto"
    with pytest.raises(ValueError):
        MCMC(cut_proposal="gaps")
    with pytest.raises(ValueError):
        MCMC(engine="host", cut_proposal="data")
    data = _tiny_data()
    post = MCMC(n_chains=1, n_warmup=20, n_samples=20, cut_proposal="data").run(data, seed=0)
    post.trees.validate(data, tt.DirichletMultinomial(5.0))


def test_a_host_checkpoint_of_the_one_chain_layout_loads_as_one_chain(monkeypatch):
    """Before several host chains, a host state was one chain's record with ``step`` and ``done``
    beside it; ``HostMCMCState.from_state_dict`` reads that layout as a run of one chain."""
    from torchtree.samplers.mcmc.state import HostMCMCState
    from torchtree.steps.host_moves import HostChain

    data = _tiny_data()
    s = MCMC(n_chains=1, n_warmup=10, n_samples=10, engine="host")
    captured = {}

    def capture(self, state, ctx, step=MCMC.step):
        out = step(self, state, ctx)
        captured.update(state=state, model=ctx.setup.model)
        return out

    monkeypatch.setattr(MCMC, "step", capture)
    s.run(data, seed=0)
    monkeypatch.undo()
    new = captured["state"].state_dict()
    old = {"step": new["step"], "done": new["done"], **new["chains"][0]}  # the one-chain layout
    back = HostMCMCState.from_state_dict(old, lambda: HostChain(captured["model"], s.config.move_probs))
    assert back.step == new["step"] and back.done == new["done"] and len(back.chains) == 1
    again = back.state_dict()["chains"][0]
    for k in ("counts", "trace_leaves", "trace_lp", "version", "snap_version"):
        assert again[k] == new["chains"][0][k], k
    assert back.chains[0].chain.log_posterior() == captured["state"].chains[0].chain.log_posterior()
