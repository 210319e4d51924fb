"""sklearn-style estimators: conventions, label mapping, errors, every registered method."""
import numpy as np
import pytest

from torchtree import BayesianTreeClassifier, BayesianTreeRegressor, Data, TopDownSMC, register_method
from torchtree.estimators import METHODS, get_method


def xor_data(n=240, seed=0):
    rng = np.random.default_rng(seed)
    X = rng.uniform(size=(n, 3))
    y = np.where((X[:, 0] > 0.5) ^ (X[:, 1] > 0.5), "yes", "no")
    return X, y


def test_classifier_fit_predict_with_string_labels():
    X, y = xor_data()
    clf = BayesianTreeClassifier(n_particles=100, n_islands=2, random_state=0).fit(X[:160], y[:160])
    assert list(clf.classes_) == ["no", "yes"]
    proba = clf.predict_proba(X[160:])
    assert proba.shape == (80, 2) and np.allclose(proba.sum(1), 1)
    pred = clf.predict(X[160:])
    assert set(pred) <= {"no", "yes"}
    assert clf.score(X[160:], y[160:]) > 0.85  # XOR is exactly representable by a depth-2 tree
    assert np.isfinite(clf.log_evidence_) and clf.log_predictive(X[160:], y[160:]) > -0.5
    assert clf.n_features_in_ == 3


def test_params_roundtrip_and_sklearn_clone():
    from sklearn.base import clone

    clf = BayesianTreeClassifier(method="smc", n_particles=50, proposal="optimal", alpha=2.0, random_state=3)
    params = clf.get_params()
    assert params["n_particles"] == 50 and params["proposal"] == "optimal" and params["alpha"] == 2.0
    c2 = clone(clf)
    assert c2.get_params() == params
    c2.set_params(n_particles=20, alpha=1.0)
    assert c2.get_params()["n_particles"] == 20 and c2.alpha == 1.0
    assert "n_particles=50" in repr(clf)


def test_same_random_state_same_predictions():
    X, y = xor_data()
    a = BayesianTreeClassifier(n_particles=60, random_state=7).fit(X, y).predict_proba(X)
    b = BayesianTreeClassifier(n_particles=60, random_state=7).fit(X, y).predict_proba(X)
    assert np.array_equal(a, b)


def test_clear_errors():
    X, y = xor_data()
    with pytest.raises(ValueError, match="unknown method"):
        BayesianTreeClassifier(method="forest").fit(X, y)
    with pytest.raises(ValueError, match="does not take"):
        BayesianTreeClassifier(n_particle=10).fit(X, y)
    with pytest.raises(RuntimeError, match="not fitted"):
        BayesianTreeClassifier().predict(X)
    with pytest.raises(ValueError, match="continuous"):
        BayesianTreeClassifier(n_particles=10).fit(X, X[:, 0])
    clf = BayesianTreeClassifier(n_particles=20).fit(X, y)
    with pytest.raises(ValueError, match="features"):
        clf.predict(X[:, :2])


def test_regressor_mean_interval_and_score():
    rng = np.random.default_rng(1)
    X = rng.uniform(size=(300, 2))
    y = np.where(X[:, 0] > 0.5, 3.0, -1.0) + 0.2 * rng.normal(size=300)
    reg = BayesianTreeRegressor(n_particles=100, n_islands=2, random_state=0).fit(X[:200], y[:200])
    assert reg.score(X[200:], y[200:]) > 0.9
    iv = reg.predict_interval(X[200:], level=0.9)
    assert iv.shape == (100, 2) and np.all(iv[:, 0] < iv[:, 1])
    coverage = np.mean((y[200:] >= iv[:, 0]) & (y[200:] <= iv[:, 1]))
    assert 0.8 < coverage <= 1.0
    # kind="mean": a credible interval of f(x), inside the predictive one. Away from the step (where the
    # trees' cut may fall) it holds the training mean of y on the row's side: ~100 rows with noise sd 0.2
    # give a posterior sd ~0.02 about it, so the 90% band is ~0.07 wide, against ~0.7 for a new y.
    band = reg.predict_interval(X[200:], level=0.9, kind="mean")
    np.testing.assert_array_equal(band, reg.posterior_.predict_interval(X[200:], level=0.9, kind="mean"))
    assert np.all(iv[:, 0] < band[:, 0]) and np.all(band[:, 1] < iv[:, 1])
    right, away = X[200:, 0] > 0.5, np.abs(X[200:, 0] - 0.5) > 0.05
    side_mean = np.where(right, y[:200][X[:200, 0] > 0.5].mean(), y[:200][X[:200, 0] <= 0.5].mean())
    assert np.all(((band[:, 0] < side_mean) & (side_mean < band[:, 1]))[away])
    assert np.median((band[:, 1] - band[:, 0])[away]) < 0.15
    with pytest.raises(ValueError, match="one of 'predictive', 'mean'"):
        reg.predict_interval(X[200:], kind="f")


@pytest.mark.parametrize("method,opts", [
    ("mcmc", dict(n_chains=4, n_samples=50, n_warmup=50)),
    ("smc-moves", dict(n_particles=64, n_iterations=5)),
])
def test_other_methods_through_the_same_face(method, opts):
    X, y = xor_data(n=160)
    clf = BayesianTreeClassifier(method=method, random_state=0, **opts).fit(X, y)
    assert clf.predict_proba(X).shape == (160, 2)
    assert clf.score(X, y) > 0.6


def test_registered_method_appears_without_special_cases():
    class Halved(TopDownSMC):
        pass

    register_method("smc-halved", Halved)
    try:
        X, y = xor_data(n=100)
        clf = BayesianTreeClassifier(method="smc-halved", n_particles=20).fit(X, y)
        assert isinstance(get_method("smc-halved")(), Halved)
        assert clf.predict(X).shape == (100,)
    finally:
        METHODS.pop("smc-halved")


def test_model_settings_a_method_does_not_use_are_refused():
    """DCC builds its own soft-tree priors: mu0 / b0 / prior used to be dropped silently,
    and a bad prior name passed unnoticed."""
    from torchtree.estimators import model_settings
    from torchtree.soft import DCC

    X, y = xor_data(n=60)
    rng = np.random.default_rng(0)
    yr = rng.normal(size=60)
    assert model_settings(DCC) == {"alpha_split": "keyword", "beta_split": "keyword", "alpha": "keyword"}
    assert set(model_settings(TopDownSMC).values()) == {"object"}
    with pytest.raises(ValueError, match=r"'dcc' \(DCC\) does not use mu0, b0: .*DCC\(hyper=\.\.\.\)"):
        BayesianTreeRegressor(method="dcc", mu0=100.0, b0=1e-3).fit(X, yr)
    with pytest.raises(ValueError, match="does not use prior"):
        BayesianTreeClassifier(method="dcc", prior="poisson").fit(X, y)
    with pytest.raises(ValueError, match="prior must be 'chipman', 'poisson' or a prior object"):
        BayesianTreeClassifier(method="dcc", prior="nonsense").fit(X, y)
    # the other structure prior's settings would be dropped as well
    with pytest.raises(ValueError, match="poisson_lambda do\\(es\\) not apply to prior='chipman'"):
        BayesianTreeClassifier(poisson_lambda=3.0, n_particles=10).fit(X, y)
    with pytest.raises(ValueError, match="alpha_split do\\(es\\) not apply to prior='poisson'"):
        BayesianTreeClassifier(prior="poisson", alpha_split=0.9, n_particles=10).fit(X, y)
    # settings left at their defaults are fine, and settings DCC takes by name reach it
    kw = dict(n_iterations=1, n_initial=3, n_chains=2, n_samples=3, n_warmup=3, activation_threshold=1,
              n_parallel=1, max_depth=2)
    clf = BayesianTreeClassifier(method="dcc", alpha=2.0, beta_split=2.0, **kw).fit(X, y)
    assert clf.posterior_.hyper.alpha == 2.0


def test_scikit_learn_model_selection():
    """cross_val_score / GridSearchCV need scikit-learn's estimator tags (>= 1.6) or
    ``_estimator_type`` (older)."""
    pytest.importorskip("sklearn")
    from sklearn.base import is_classifier, is_regressor
    from sklearn.model_selection import GridSearchCV, cross_val_score

    X, y = xor_data(n=120)
    assert is_classifier(BayesianTreeClassifier()) and is_regressor(BayesianTreeRegressor())
    scores = cross_val_score(BayesianTreeClassifier(n_particles=40, n_islands=2), X, y, cv=3)
    assert scores.shape == (3,) and scores.min() > 0.6
    yr = np.where(X[:, 0] > 0.5, 2.0, -1.0)
    grid = GridSearchCV(BayesianTreeRegressor(n_particles=20, n_islands=2), {"n_particles": [10, 20]}, cv=2).fit(X, yr)
    assert grid.best_params_["n_particles"] in (10, 20) and grid.best_score_ > 0.5


def test_not_fitted_error_is_what_scikit_learn_catches():
    from torchtree.estimators import NotFittedError

    X, _ = xor_data(n=20)
    for exc in (NotFittedError, RuntimeError, ValueError, AttributeError):
        with pytest.raises(exc, match="not fitted yet"):
            BayesianTreeClassifier().predict(X)


def test_mcmc_defaults_scale_with_the_rows():
    from torchtree.samplers import presets
    from torchtree.samplers.mcmc import SMALL_TABLE_CHAINS, SMALL_TABLE_SAMPLES, MCMCConfig

    rng = np.random.default_rng(0)
    X = rng.normal(size=(120, 3))
    y = (X[:, 0] > 0).astype(int)
    data = Data(X, y)

    def config(**kw):
        return BayesianTreeClassifier(method="mcmc", hyper="fixed", **kw)._build_sampler(data).config

    c = config()
    assert (c.n_chains, c.n_samples, c.n_warmup) == (SMALL_TABLE_CHAINS, SMALL_TABLE_SAMPLES, None)
    assert c.resolution["n_chains"].preset == "small-table"
    c = config(n_chains=2, n_samples=6)  # what the user gives is kept
    assert (c.n_chains, c.n_samples) == (2, 6) and "n_chains" not in c.resolution
    assert config(engine="host", n_samples=6).n_chains == 1
    # from SMALL_TABLE_ROWS rows MCMC's own defaults (1 x 1000)
    big = MCMCConfig(n_chains="auto", n_samples="auto").resolve(
        presets.RunShape(presets.SMALL_TABLE_ROWS, 3, "classification", 2))
    assert (big.n_chains, big.n_samples) == (1, 1000) and big.resolution["n_chains"].preset == "default"
    # a fit keeps the resolved config and says which preset chose what
    est = BayesianTreeClassifier(method="mcmc", hyper="fixed", random_state=0, n_samples=5).fit(X, y)
    assert est.sampler_config_.n_chains == SMALL_TABLE_CHAINS
    assert est.posterior_.info["settings"]["n_chains"].startswith(f"{SMALL_TABLE_CHAINS} (small-table: ")
    assert "n_samples" not in est.posterior_.info["settings"]  # given, not chosen
    assert "settings" in repr(est.posterior_.summary()) and "small-table" in repr(est.posterior_.summary())


@pytest.mark.filterwarnings("ignore:MCMC chains look unconverged")
def test_bart_chains_are_device_aware_and_keep_the_posteriors_size():
    """On CUDA the estimators' BART runs gpu_chains(rows) chains (64 up to 65,536 rows, halved past that bound, 4 from
    about 10^6 rows; the class utilities of a multinomial probit count as rows), each keeping ceil(400 / chains)
    draws thinned so that it still runs about 100 sweeps past its warm-up; on the CPU 4 x 100, thin 1. More chains
    asked for on the CPU resolve n_samples and thin the same way, and the fit keeps that many draws."""
    from torchtree.samplers import presets
    from torchtree.samplers.bart.config import BARTConfig, gpu_chains

    assert [gpu_chains(n) for n in (100, 65_536, 65_537, 131_072, 300_000, 10 ** 6, 10 ** 7)] == [64, 64, 32, 32, 8, 4, 4]
    assert gpu_chains(10_000, n_utilities=9) == 32 and gpu_chains(10_000, n_utilities=200) == 4

    def resolved(device, n, task="regression", classes=0, world_size=1, **given):
        kw = {"n_chains": "auto", "n_samples": "auto", "thin": "auto", **given}
        c = BARTConfig(**kw).resolve(presets.RunShape(n, 5, task, classes, device, world_size=world_size))
        return (c.n_chains, c.n_samples, c.thin), {k: r.preset for k, r in c.resolution.items()}

    assert resolved("cpu", 1000) == ((4, 100, 1), {"n_chains": "default", "n_samples": "default", "thin": "default"})
    assert resolved("cpu", 10 ** 6)[0] == (4, 100, 1)
    assert resolved("cuda", 1000) == ((64, 7, 14), {"n_chains": "gpu-batch", "n_samples": "many-chains",
                                                    "thin": "many-chains"})
    assert resolved("cuda", 100_000)[0] == (32, 13, 7)
    assert resolved("cuda", 10 ** 6)[0] == (4, 100, 1)
    assert resolved("cuda", 20_000, "classification", 10)[0] == (16, 25, 4)  # 9 utilities x 20,000 rows
    assert resolved("cuda", 1000, n_samples=100)[0] == (64, 100, 1)  # draws given: as many, unthinned
    assert resolved("cpu", 1000, n_chains=8, n_samples=5)[0] == (8, 5, 1)  # a short run asked for stays short
    assert resolved("cuda", 1000, n_chains=2)[0] == (2, 100, 1)
    # over ranks (torchrun, MPI): each rank's GPU runs its own batch; the posterior keeps about 400 draws in all
    assert resolved("cuda", 100_000, world_size=2)[0] == (64, 7, 14)
    assert resolved("cuda", 10 ** 6, world_size=3)[0] == (12, 34, 2)
    assert resolved("cpu", 1000, world_size=2)[0] == (4, 100, 1)
    rng = np.random.default_rng(0)
    X = rng.normal(size=(60, 3))
    y = X[:, 0] + 0.1 * rng.normal(size=60)
    est = BayesianTreeRegressor(method="bart", random_state=0, n_chains=8, n_trees=5, n_warmup=3).fit(X, y)
    c = est.sampler_config_
    assert (c.n_chains, c.n_samples, c.thin) == (8, 50, 2)
    assert est.posterior_.info["n_samples"] == 50 and est.posterior_.n_particles == 8 * 50
    assert est.posterior_.info["settings"]["thin"].startswith("2 (many-chains: ")


def test_mcmc_starts_wide_tables_at_topdown_draws(monkeypatch):
    from torchtree.samplers import presets

    rng = np.random.default_rng(1)
    X = rng.normal(size=(80, 6))
    y = (X[:, 0] > 0).astype(int)
    kw = dict(method="mcmc", hyper="fixed", random_state=0, n_chains=2, n_samples=5)
    monkeypatch.setattr(presets, "WIDE_TABLE_FEATURES", 5)
    assert BayesianTreeClassifier(**kw)._build_sampler(Data(X, y)).config.init == "topdown"
    assert BayesianTreeClassifier(**kw, init="root")._build_sampler(Data(X, y)).config.init == "root"
    monkeypatch.setattr(presets, "WIDE_TABLE_FEATURES", 6)
    assert BayesianTreeClassifier(**kw)._build_sampler(Data(X, y)).config.init == "root"


def test_dcc_gets_a_budget_of_counted_work_unless_max_seconds_is_given(monkeypatch):
    from torchtree.samplers.dcc.config import BOUNDED_FIT_SECONDS, DCCConfig

    X = np.random.default_rng(2).normal(size=(40, 2))
    y = (X[:, 0] > 0).astype(int)
    data = Data(X, y)
    c = BayesianTreeClassifier(method="dcc")._build_sampler(data).config
    assert (c.max_seconds, c.clock) == (BOUNDED_FIT_SECONDS, "work")  # the same draws on any machine
    assert (DCCConfig.max_seconds, DCCConfig.clock) == (None, "wall")  # the sampler's own defaults stay
    c = BayesianTreeClassifier(method="dcc", max_seconds=None)._build_sampler(data).config
    assert c.max_seconds is None
    c = BayesianTreeClassifier(method="dcc", max_seconds=5, clock="wall")._build_sampler(data).config
    assert (c.max_seconds, c.clock) == (5, "wall")
    # one clock: a given budget is counted work too unless clock is named (it used to switch to wall time)
    c = BayesianTreeClassifier(method="dcc", max_seconds=5)._build_sampler(data).config
    assert (c.max_seconds, c.clock) == (5, "work")


def test_dcc_warns_when_its_budget_ends_the_run_early(monkeypatch):
    from torchtree.samplers import driver
    from torchtree.soft import DCC

    from _counting import TickClock

    X = np.random.default_rng(2).normal(size=(60, 2))
    y = (X[:, 0] > 0).astype(int)
    kw = dict(n_iterations=50, n_initial=6, n_chains=2, n_samples=4, n_warmup=6, max_depth=2, max_tree_depth=3,
              max_rows=None, clock="cpu")
    monkeypatch.setitem(driver.CLOCKS, "cpu", TickClock(1.0))
    with pytest.warns(UserWarning, match=r"stopped the run after \d+ of n_iterations=50 iterations"):
        post = DCC(max_seconds=400, **kw).run((X, y), seed=0)
    assert post.info["iterations"] < 50


def test_dcc_regression_aims_at_a_higher_acceptance_unless_given():
    from torchtree.samplers.dcc.config import DCCConfig

    X = np.random.default_rng(2).normal(size=(40, 2))
    reg = Data(X, X[:, 0] + 0.1 * X[:, 1], task="regression")
    cls = Data(X, (X[:, 0] > 0).astype(int))
    assert BayesianTreeRegressor(method="dcc")._build_sampler(reg).config.target_accept == 0.9
    assert BayesianTreeRegressor(method="dcc", target_accept=0.7)._build_sampler(reg).config.target_accept == 0.7
    assert BayesianTreeClassifier(method="dcc")._build_sampler(cls).config.target_accept == DCCConfig.target_accept


def test_smc_regression_runs_islands_unless_given():
    from torchtree.samplers.presets import REGRESSION_ISLANDS

    rng = np.random.default_rng(3)
    X = rng.normal(size=(60, 2))
    data = Data(X, X[:, 0] + 0.1 * rng.normal(size=60), task="regression")
    assert BayesianTreeRegressor()._build_sampler(data).config.n_islands == REGRESSION_ISLANDS
    assert BayesianTreeRegressor(n_islands=2)._build_sampler(data).config.n_islands == 2
    assert BayesianTreeRegressor(n_particles=999)._build_sampler(data).config.n_islands == 1  # 5 does not divide it
    clf = Data(X, (X[:, 0] > 0).astype(int))
    assert BayesianTreeClassifier()._build_sampler(clf).config.n_islands == 1


def test_one_seed_per_fit_and_nested_runs_are_recorded():
    """random_state=None: the evidence pilots and the run share one drawn seed, recorded in both; the
    top-down run that starts MCMC's chains is a recorded sub-run on the parent's stream."""
    from torchtree.core.random import derive_seed
    from torchtree.samplers.mcmc import Stream

    rng = np.random.default_rng(5)
    X = rng.normal(size=(80, 2))
    y = X[:, 0] + 0.1 * rng.normal(size=80)
    est = BayesianTreeRegressor(method="mcmc", random_state=None, n_chains=2, n_samples=5).fit(X, y)
    seed = est.posterior_.info["seed"]
    assert est.hyper_search_.seed == seed and est.posterior_.info["hyper_search"]["seed"] == seed
    (start,) = est.posterior_.info["sub_runs"]  # regression: MCMC starts at top-down draws
    assert start["purpose"] == "top-down start" and start["sampler"] == "TopDownSMC"
    assert start["seed"] == derive_seed(seed, Stream.TOPDOWN_START)
    assert start["settings"]["proposal"] == "prior" and start["settings"]["n_islands"] == 5
    again = BayesianTreeRegressor(method="mcmc", random_state=seed, n_chains=2, n_samples=5).fit(X, y)
    assert np.array_equal(again.predict(X), est.predict(X))  # the recorded seed reproduces the fit
