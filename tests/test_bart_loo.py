"""BART's pointwise log-likelihood and posterior predictive draws, and their ArviZ groups (``to_arviz(post, X, y)``),
so that ``az.loo`` / ``az.waic`` compare fits (a BART user's request: no ``log_likelihood`` group was exported)."""
import numpy as np
import pytest
import torch

from torchtree import BayesianTreeClassifier, BayesianTreeRegressor, SMCSampler, Data
from torchtree.model.diagnostics import to_arviz

pytestmark = pytest.mark.filterwarnings("ignore::UserWarning")


def _reg():
    rng = np.random.default_rng(0)
    X = rng.uniform(size=(120, 2))
    y = np.sin(4 * X[:, 0]) + 0.2 * rng.normal(size=120)
    return BayesianTreeRegressor(method="bart", n_trees=10, n_samples=30, random_state=0).fit(X, y), X, y


def test_log_likelihood_draws_are_the_gaussian_terms_log_predictive_averages():
    est, X, y = _reg()
    post = est.posterior_
    lp = post.log_likelihood_draws(X, y)
    f = post.latent_draws(X)
    sd = post.noise_sd[:, None]
    want = -0.5 * ((torch.as_tensor(y)[None, :] - f) / sd) ** 2 - torch.log(sd) - 0.5 * np.log(2 * np.pi)
    torch.testing.assert_close(lp, want, rtol=1e-12, atol=1e-12)
    mean_lpd = float((torch.logsumexp(lp, 0) - np.log(lp.shape[0])).mean())
    assert mean_lpd == pytest.approx(post.log_predictive(X, y), rel=1e-12)


def test_predictive_draws_are_keyed_by_row_and_centred_on_the_prediction():
    est, X, y = _reg()
    post = est.posterior_
    d = post.predictive_draws(X, seed=3)
    assert d.shape == (post.n_particles, len(X))
    # a row's draws do not depend on the rows after it or their number (they were keyed by draw x rows + row,
    # so one row alone drew other numbers than the same row among five: a QA pass)
    np.testing.assert_array_equal(post.predictive_draws(X[:7], seed=3), d[:, :7])
    np.testing.assert_array_equal(post.predictive_draws(X[:1], seed=3), d[:, :1])
    assert not np.array_equal(post.predictive_draws(X, seed=4), d)
    # each row's draws: mean f + noise, sd sqrt(var f + E sigma^2); 120 draws -> loose 4-se bounds
    se = np.sqrt(post.latent_draws(X).var(0).numpy() + (post.noise_sd ** 2).mean().item()) / np.sqrt(d.shape[0])
    assert np.mean(np.abs(d.mean(0) - est.predict(X)) < 4 * se) > 0.97


def test_to_arviz_with_data_gives_the_groups_loo_reads():
    est, X, y = _reg()
    post = est.posterior_
    idata = to_arviz(post, X, y)
    C = int(post.chain_of.max()) + 1
    ll = idata.log_likelihood["y"].values
    assert ll.shape == (C, post.n_particles // C, len(X))
    lp = post.log_likelihood_draws(X, y).numpy()
    np.testing.assert_array_equal(ll[1, 2], lp[2 * C + 1])  # draw 2 of chain 1 is row 2 C + 1
    np.testing.assert_array_equal(idata.observed_data["y"].values, y)
    assert idata.posterior_predictive["y"].shape == ll.shape
    az = pytest.importorskip("arviz")
    loo = az.loo(idata)
    assert np.isfinite(loo.elpd_loo) and loo.elpd_loo <= float(np.log(np.exp(lp).mean(0)).sum()) + 1e-9


def test_classifiers_export_class_codes():
    rng = np.random.default_rng(1)
    X = rng.uniform(size=(90, 2))
    labels = np.where(X[:, 0] > 0.5, "yes", "no")
    post = BayesianTreeClassifier(method="bart", n_trees=6, n_samples=20, random_state=0).fit(X, labels).posterior_
    idata = to_arviz(post, X, labels)
    np.testing.assert_array_equal(idata.observed_data["y"].values, (labels == "yes").astype(int))
    assert set(np.unique(idata.posterior_predictive["y"].values)) <= {0, 1}
    assert set(np.unique(post.predictive_draws(X))) <= {"no", "yes"}
    lp = post.log_likelihood_draws(X, labels)
    assert float((torch.logsumexp(lp, 0) - np.log(lp.shape[0])).mean()) == pytest.approx(post.log_predictive(X, labels))


def test_weighted_posteriors_and_half_the_data_are_refused():
    rng = np.random.default_rng(2)
    X = rng.uniform(size=(40, 2))
    y = (X[:, 0] > 0.5).astype(int)
    smc = SMCSampler(n_particles=16, n_iterations=2).run(Data(X, y), seed=0)
    with pytest.raises(TypeError, match="equally weighted draws in chains"):
        to_arviz(smc, X, y)
    est, X, y = _reg()
    with pytest.raises(ValueError, match="X and y together"):
        to_arviz(est.posterior_, X)
