"""MCMC chains started at top-down SMC draws (``init="topdown"``, the estimators' default on
large tables) and the conversion of given trees into the move samplers' state.

* ``state_from_trees`` fills every cache the moves keep; ``check_state`` recomputes them from the
  trees and the data (bitsets of the leaves, threshold ranks, the cached log posterior against
  the prior's ``log_prob`` plus the leaf likelihoods), for classification, regression, exact and
  3-bucket tables, kept and routed bitsets;
* the chains still target the model's posterior: the predictive of a short run from top-down
  starts matches exact enumeration on tiny data (same tolerance as the runs from the root in
  tests/test_mcmc.py);
* the Poisson prior is refused up front; the estimators pick ``init="topdown"`` from 5000 rows
  and leave an explicit ``init`` alone.
"""
from __future__ import annotations

import numpy as np
import pytest
import torch

import torchtree as tt
import torchtree.model.target as target
from torchtree.model.target import TreeModel
from torchtree.samplers.mcmc import MCMC
from torchtree.steps.from_trees import state_from_trees
from torchtree.steps.moves import TreeState, check_state
from torchtree.testing import exact_predictive


def _xor(n=300, seed=0, regression=False):
    rng = np.random.default_rng(seed)
    X = rng.normal(size=(n, 4))
    X[:, 1] = X[:, 1].round()  # ties
    if regression:
        return tt.Data(X, np.where(X[:, 0] > 0, 1.0, -1.0) + 0.3 * rng.normal(size=n), task="regression")
    return tt.Data(X, ((X[:, 0] * X[:, 1] > 0) ^ (rng.random(n) < 0.1)).astype(int))


@pytest.mark.parametrize("tables", ["exact", "tiny-buckets-routed"])
@pytest.mark.parametrize("task", ["classification", "regression"])
def test_caches_of_converted_trees_are_exact(task, tables, monkeypatch):
    if tables != "exact":
        monkeypatch.setattr(target, "_TABLE_BYTES", 0)
        monkeypatch.setattr(target, "_EXACT_BYTES", 0)
        monkeypatch.setattr(target, "_MIN_BUCKETS", 3)
        monkeypatch.setattr(target, "_KEEP_BITS_BYTES", 0)
    data = _xor(regression=task == "regression")
    prior = tt.ChipmanPrior(0.95, 0.5)
    lik = tt.DirichletMultinomial(1.0) if task == "classification" else tt.NormalInverseGamma()
    post = tt.TopDownSMC(prior, lik, n_particles=40, proposal="empirical").run(data, seed=0)
    model = TreeModel(prior, lik, data)
    state = state_from_trees(model, post.trees)
    assert ("bits" in state.trees.extra) == (tables == "exact")
    assert int(state.trees.n_leaves().max()) > 3  # real trees, not roots
    check_state(state, model)


@pytest.mark.parametrize("keep_bits", [True, False], ids=["kept-bits", "routed-bits"])
def test_trees_filled_in_groups_are_the_trees_filled_at_once(keep_bits, monkeypatch):
    """A level budget of one word per group splits the batch into many groups of trees (one
    tree each where a level is wider): every field equals the one-batch fill."""
    from torchtree.steps import from_trees

    if not keep_bits:
        monkeypatch.setattr(target, "_KEEP_BITS_BYTES", 0)
    data = _xor()
    prior, lik = tt.ChipmanPrior(0.95, 0.5), tt.DirichletMultinomial(1.0)
    post = tt.TopDownSMC(prior, lik, n_particles=40, proposal="empirical").run(data, seed=0)
    model = TreeModel(prior, lik, data)
    whole = state_from_trees(model, post.trees).trees
    monkeypatch.setattr(from_trees, "_LEVEL_BYTES", 8 * model.W * 6)
    assert len(from_trees._tree_groups(post.trees, model.W)) > 4
    grouped = state_from_trees(model, post.trees).trees
    assert ("bits" in grouped.extra) == keep_bits
    assert set(whole.extra) == set(grouped.extra)
    for name, a in list(whole.node_fields().items()) + [("n_nodes", whole.n_nodes)]:
        b = grouped.node_fields()[name] if name != "n_nodes" else grouped.n_nodes
        assert torch.equal(a, b), name
    check_state(TreeState(grouped), model)


def test_chains_from_topdown_starts_sample_the_exact_posterior():
    """100 chains x 100 kept draws from top-down starts: predictive within 0.05 of exact
    enumeration (the tolerance of the root-started quick test in tests/test_mcmc.py)."""
    X = np.array([[0.1, 1.0], [0.35, 0.2], [0.4, 0.9], [0.6, 0.1], [0.7, 0.8], [0.8, 0.3], [0.9, 0.5], [0.2, 0.6]])
    data = tt.Data(X, np.array([0, 0, 1, 0, 1, 1, 1, 0]))
    prior, lik = tt.ChipmanPrior(0.95, 0.5), tt.DirichletMultinomial(1.0)
    Xq = np.array([[0.5, 0.5], [0.15, 0.8], [0.85, 0.2]])
    exact = exact_predictive(data, prior, lik, Xq)
    post = MCMC(prior, lik, n_chains=100, n_warmup=60, n_samples=100, init="topdown").run(data, seed=2)
    assert np.abs(post.predict_proba(Xq) - exact).max() < 0.05


def test_topdown_starts_are_bigger_trees_and_the_same_for_a_seed():
    data = _xor(600)
    kw = dict(n_chains=3, n_samples=5, n_warmup=0, engine="batched")
    root = MCMC(init="root", **kw).run(data, seed=4)
    a = MCMC(init="topdown", **kw).run(data, seed=4)
    b = MCMC(init="topdown", **kw).run(data, seed=4)
    assert float(a.trees.n_leaves().double().mean()) > 2 * float(root.trees.n_leaves().double().mean())
    assert torch.equal(a.trees.feature, b.trees.feature) and torch.equal(a.log_weights, b.log_weights)


@pytest.mark.parametrize("engine", ["host", "batched"])
def test_big_topdown_start_fits_every_engine(engine):
    """A start of hundreds of nodes: the host chain's arrays grew once only (64 -> 128 slots)
    and refused a 387-node start from pendigits."""
    rng = np.random.default_rng(3)
    X = rng.normal(size=(3000, 4))
    data = tt.Data(X, (np.sin(3 * X[:, 0]) + np.cos(3 * X[:, 1]) + 0.3 * rng.normal(size=3000) > 0).astype(int))
    post = MCMC(tt.ChipmanPrior(0.95, 0.5), tt.DirichletMultinomial(0.2), n_chains=1, n_samples=5, n_warmup=0,
                engine=engine, init="topdown").run(data, seed=0)
    assert int(post.trees.n_nodes.max()) > 130


def test_poisson_prior_is_refused():
    with pytest.raises(ValueError, match="init='topdown' needs the Chipman prior"):
        MCMC(tt.PoissonPrior(3.0), n_chains=2, n_samples=5, init="topdown").run(_xor(100), seed=0)


def _spy_on_start_option(monkeypatch, name):
    """The list that receives the built sampler's ``name`` setting at every fit (200-row threshold)."""
    import torchtree.estimators as est_mod
    from torchtree.samplers import presets

    seen = []
    real = est_mod.BayesianTreeBase._build_sampler

    def spy(self, data, **kw):
        s = real(self, data, **kw)
        seen.append(getattr(s.config, name))
        return s

    monkeypatch.setattr(est_mod.BayesianTreeBase, "_build_sampler", spy)
    monkeypatch.setattr(presets, "SMALL_TABLE_ROWS", 200)
    return seen


def test_estimator_default_init_by_rows(monkeypatch):
    seen = _spy_on_start_option(monkeypatch, "init")
    X, y = _xor(300).X.numpy(), _xor(300).y.numpy()
    kw = dict(method="mcmc", n_samples=20, random_state=0, hyper="fixed")
    tt.BayesianTreeClassifier(**kw).fit(X[:150], y[:150])
    tt.BayesianTreeClassifier(**kw).fit(X, y)
    tt.BayesianTreeClassifier(init="root", **kw).fit(X, y)
    tt.BayesianTreeClassifier(prior="poisson", **kw).fit(X, y)
    assert seen == ["root", "topdown", "root", "root"]


@pytest.mark.parametrize("mh_step", [False, True], ids=["weights", "resample-move"])
def test_smc_moves_from_topdown_draws_match_exact(mh_step):
    """SMC with moves started at top-down draws (``init_prior="topdown"``): predictive and log
    evidence against exact enumeration, with the tolerances of the prior-started runs in
    tests/test_smc_moves.py (0.04 / 0.2 nats weights, 0.025 / 0.1 resample-move)."""
    from torchtree.samplers.smc_moves import SMCSampler
    from torchtree.testing import exact_log_evidence

    X = np.array([[0.1, 1.0], [0.35, 0.2], [0.4, 0.9], [0.6, 0.1], [0.7, 0.8], [0.8, 0.3], [0.9, 0.5], [0.2, 0.6]])
    data = tt.Data(X, np.array([0, 0, 1, 0, 1, 1, 1, 0]))
    prior, lik = tt.ChipmanPrior(0.95, 0.5), tt.DirichletMultinomial(1.0)
    XQ = np.array([[0.5, 0.5], [0.15, 0.8], [0.85, 0.2], [0.3, 0.3]])
    post = SMCSampler(prior, lik, n_particles=4000, n_iterations=10, mh_step=mh_step,
                      init_prior="topdown").run(data, seed=0)
    tol_pred, tol_ev = (0.025, 0.1) if mh_step else (0.04, 0.2)
    assert np.abs(post.predict_proba(XQ) - exact_predictive(data, prior, lik, XQ)).max() < tol_pred
    assert abs(post.log_evidence - exact_log_evidence(data, prior, lik)) < tol_ev


def test_smc_moves_topdown_refuses_tempering():
    from torchtree.samplers.smc_moves import SMCSampler

    with pytest.raises(ValueError, match="tempering"):
        SMCSampler(init_prior="topdown", tempering=True)


def test_estimator_smc_moves_starts_at_topdown_draws_at_every_size(monkeypatch):
    seen = _spy_on_start_option(monkeypatch, "init_prior")
    d = _xor(300)
    kw = dict(method="smc-moves", n_particles=32, n_iterations=2, random_state=0, hyper="fixed")
    tt.BayesianTreeClassifier(**kw).fit(d.X.numpy()[:150], d.y.numpy()[:150])
    tt.BayesianTreeClassifier(**kw).fit(d.X.numpy(), d.y.numpy())
    tt.BayesianTreeClassifier(tempering=True, **kw).fit(d.X.numpy(), d.y.numpy())
    tt.BayesianTreeClassifier(prior="poisson", **kw).fit(d.X.numpy(), d.y.numpy())
    assert seen == ["topdown", "topdown", None, None]


def test_start_settings_by_table():
    from torchtree.samplers.tuning.starts import start_settings

    assert start_settings(300, 13, "classification", 1000) == {"proposal": "optimal", "n_islands": 1, "n_particles": 1000}
    assert start_settings(3000, 36, "classification", 1000)["proposal"] == "empirical"
    assert start_settings(300, 3, "regression", 1000) == {"proposal": "prior", "n_islands": 5, "n_particles": 1000}
    assert start_settings(300, 3, "regression", 1024) == {"proposal": "prior", "n_islands": 5, "n_particles": 1020}
    assert start_settings(300, 3, "regression", 8) == {"proposal": "prior", "n_islands": 1, "n_particles": 8}
    for task in ("classification", "regression"):
        assert start_settings(5000, 10, task, 1000) == {"proposal": "empirical", "n_islands": 1, "n_particles": 1000}
    # wide classification tables: the empirical start's filter takes 40 particles per feature (thousands, <= 8000)
    assert start_settings(1820, 500, "classification", 1024)["n_particles"] == 8000
    assert start_settings(3096, 36, "classification", 1000)["n_particles"] == 2000
    assert start_settings(50_000, 100, "classification", 1000)["n_particles"] == 4000
    assert start_settings(10**6, 100, "classification", 1000)["n_particles"] == 1000  # rows x particles bounded
    assert start_settings(50_000, 100, "regression", 1000)["n_particles"] == 1000
    assert start_settings(90, 100, "classification", 1000)["n_particles"] == 1000  # optimal proposal: kept


def test_wide_table_particles():
    from torchtree.samplers.tuning.starts import wide_table_particles

    assert [wide_table_particles(2000, d, 1000) for d in (1, 25, 26, 50, 51, 100, 200, 201, 10_000)] == \
        [1000, 1000, 2000, 2000, 3000, 4000, 8000, 8000, 8000]
    assert wide_table_particles(2000, 100, 6000) == 6000  # more asked for: kept
    assert wide_table_particles(2000, 4, 24) == 24
    # rows x particles at most 4 x 10^8: 10^5 rows 4000, 2 x 10^5 rows 2000, from 4 x 10^5 rows as asked
    assert [wide_table_particles(n, 500, 1000) for n in (100_000, 200_000, 300_000, 400_000, 10**6)] == \
        [4000, 2000, 1000, 1000, 1000]


def test_estimator_smc_particles_by_width(monkeypatch):
    """Classification smc without the optimal proposal takes wide_table_particles; given settings, the optimal
    proposal and regression keep theirs."""
    from torchtree.samplers import presets as starts

    seen = _spy_on_start_option(monkeypatch, "n_particles")
    d = _xor(120)
    X, y = d.X.numpy(), d.y.numpy()
    kw = dict(random_state=0, hyper="fixed")
    tt.BayesianTreeClassifier(**kw).fit(X, y)  # optimal proposal: 1000
    monkeypatch.setattr(starts, "OPTIMAL_MAX_CELLS", 10)  # the table is "wide": prior proposal
    monkeypatch.setattr(starts, "PARTICLES_PER_FEATURE", 300)  # 4 features -> 1200 -> 2000
    tt.BayesianTreeClassifier(**kw).fit(X, y)
    tt.BayesianTreeClassifier(n_particles=30, **kw).fit(X, y)
    tt.BayesianTreeClassifier(n_islands=5, **kw).fit(X, y)
    tt.BayesianTreeClassifier(proposal="optimal", **kw).fit(X, y)
    tt.BayesianTreeRegressor(**kw).fit(X, X[:, 0])
    assert seen == [1000, 2000, 30, 1000, 1000, 1000]


def test_topdown_draws_use_the_start_settings(monkeypatch):
    """The top-down run behind a start is built with :func:`start_settings` of its data."""
    import torchtree.samplers.topdown as topdown
    from torchtree.samplers.mcmc import MCMC

    built = []
    real = topdown.TopDownSMC.__init__

    def spy(self, *a, **kw):
        built.append((kw["proposal"], kw["n_islands"], kw["n_particles"]))
        real(self, *a, **kw)

    monkeypatch.setattr(topdown.TopDownSMC, "__init__", spy)
    d = _xor(120)
    MCMC(tt.ChipmanPrior(0.95, 0.5), tt.DirichletMultinomial(1.0), n_chains=2, n_samples=5, init="topdown").run(d, seed=0)
    MCMC(tt.ChipmanPrior(0.95, 0.5), n_chains=2, n_samples=5, init="topdown").run(_xor(120, regression=True), seed=0)
    assert built == [("optimal", 1, 1000), ("prior", 5, 1000)]


def test_estimator_smc_proposal_by_table(monkeypatch):
    """Classification on a small table runs the optimal proposal, regression and a given proposal are kept."""
    seen = _spy_on_start_option(monkeypatch, "proposal")
    d = _xor(120)
    X, y = d.X.numpy(), d.y.numpy()
    tt.BayesianTreeClassifier(n_particles=20, random_state=0, hyper="fixed").fit(X, y)
    tt.BayesianTreeClassifier(n_particles=20, proposal="prior", random_state=0, hyper="fixed").fit(X, y)
    tt.BayesianTreeRegressor(n_particles=20, random_state=0, hyper="fixed").fit(X, X[:, 0])
    assert seen == ["optimal", "prior", "prior"]


def test_estimator_regression_starts(monkeypatch):
    """Regression below TOPDOWN_INIT_ROWS: MCMC starts at top-down draws (classification keeps the root)."""
    seen = _spy_on_start_option(monkeypatch, "init")
    d = _xor(120, regression=True)
    X, y = d.X.numpy(), d.y.numpy()
    kw = dict(n_samples=10, random_state=0, hyper="fixed")
    tt.BayesianTreeRegressor(method="mcmc", **kw).fit(X, y)
    tt.BayesianTreeRegressor(method="mcmc", init="root", **kw).fit(X, y)
    tt.BayesianTreeClassifier(method="mcmc", **kw).fit(X, (y > 0).astype(int))
    assert seen == ["topdown", "root", "root"]


def test_estimator_smc_moves_is_resample_move(monkeypatch):
    """SMC with moves runs as resample-move for regression and from the optimal proposal's start, unless
    mh_step or tempering is given; reweighted from the empirical proposal's start (wider tables)."""
    from torchtree.samplers import presets as starts

    seen = _spy_on_start_option(monkeypatch, "mh_step")
    d = _xor(120, regression=True)
    X, y = d.X.numpy(), d.y.numpy()
    kw = dict(method="smc-moves", n_particles=20, n_iterations=2, random_state=0, hyper="fixed")
    tt.BayesianTreeRegressor(**kw).fit(X, y)
    tt.BayesianTreeRegressor(mh_step=False, **kw).fit(X, y)
    tt.BayesianTreeClassifier(**kw).fit(X, (y > 0).astype(int))
    tt.BayesianTreeClassifier(tempering=True, **kw).fit(X, (y > 0).astype(int))
    monkeypatch.setattr(starts, "OPTIMAL_MAX_CELLS", 10)  # this table is "wide": the empirical proposal
    tt.BayesianTreeClassifier(**kw).fit(X, (y > 0).astype(int))
    tt.BayesianTreeRegressor(**kw).fit(X, y)
    assert seen == [True, False, True, False, False, True]
