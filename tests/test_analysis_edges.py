"""Posterior analysis at its edges, as two QA passes (an analyst, an API auditor) found it: devices named as
the docs say, task refusals, importance of multiclass BART and of chains that never moved, one-sided Wilson
bounds, and draws and seeds that are not numbers of draws or seeds."""
import numpy as np
import pytest
import torch
from scipy.stats import norm

import torchtree
import torchtree.plot as tp
from torchtree import BayesianTreeClassifier, BayesianTreeRegressor
from torchtree.plot.common import wilson_interval


def _xy(n=60):
    rng = np.random.default_rng(0)
    X = rng.normal(size=(n, 3))
    return X, X[:, 0] + 0.1 * rng.normal(size=n)


def test_data_resolves_its_device_as_the_samplers_do():
    X, y = _xy(6)
    assert torchtree.Data(X, y, task="regression", device="auto").X.device.type == (
        "cuda" if torch.cuda.is_available() else "cpu")  # was: RuntimeError from torch.device("auto")
    if not torch.cuda.is_available():
        with pytest.raises(ValueError, match="CUDA is not available"):  # was: AssertionError
            torchtree.Data(X, y, task="regression", device="cuda")
    with pytest.raises(ValueError, match="'gpu' is not a device"):
        torchtree.Data(X, y, task="regression", device="gpu")


def test_rmse_of_a_classification_posterior_is_refused():
    X, y = _xy()
    clf = BayesianTreeClassifier(n_particles=20, random_state=0).fit(X, y > 0)
    with pytest.raises(ValueError, match="rmse applies to regression"):  # was: 0.577, a number of nothing
        clf.posterior_.rmse(X, y > 0)


def test_inclusion_of_a_multiclass_bart_posterior():
    X, y = _xy()
    y3 = np.digitize(X[:, 0], [-0.5, 0.5])
    post = torchtree.BART(n_trees=10, n_chains=2, n_samples=20, n_warmup=20).run((X, y3), seed=0)
    imp = tp.feature_importance(post, "inclusion")  # was: IndexError (chains of [S U] forests against S draws)
    S, U = post.n_particles, post.n_utilities
    trees = post.feature.reshape(S, U * post.n_trees, -1)  # a draw's forests are consecutive
    used = (trees.long() >= 0)
    per = np.stack([(trees == d).any(2).double().mean(1).numpy() for d in range(3)], 1)  # share of the U T trees
    assert U == 2 and used.any() and np.allclose(imp["value"], per.mean(0))
    assert np.all(imp["lower"] <= imp["value"] + 1e-12) and np.all(imp["value"] <= imp["upper"] + 1e-12)


def test_wilson_bounds_are_one_sided_at_each_quantile():
    p, n = np.array([0.3]), np.array([100.0])

    def wilson(z, sign):
        c = (p + z * z / (2 * n)) / (1 + z * z / n)
        return c + sign * z / (1 + z * z / n) * np.sqrt(p * (1 - p) / n + z * z / (4 * n * n))

    lo, hi = wilson_interval(p, n, 0.10, 0.95)  # was: the central 85% interval's bounds
    assert lo == pytest.approx(wilson(norm.ppf(0.90), -1), rel=1e-12) and lo == pytest.approx(0.2449, abs=1e-4)
    assert hi == pytest.approx(wilson(norm.ppf(0.95), 1), rel=1e-12) and hi == pytest.approx(0.3798, abs=1e-4)
    lo2, hi2 = wilson_interval(p, n, 0.05, 0.95)
    assert hi2 == hi and lo2 == pytest.approx(wilson(norm.ppf(0.95), -1), rel=1e-12)
    assert np.isfinite(wilson_interval(p, np.array([np.nan]), 0.05, 0.95)).all()  # NaN ESS: one trial


def test_inclusion_intervals_of_chains_that_never_moved_are_numbers():
    """MCMC chains whose trees never change (every draw a single leaf) have a NaN ESS; the inclusion intervals,
    Wilson's with that many trials, were NaN and drew no error bars."""
    X, y = _xy()
    post = BayesianTreeRegressor(method="mcmc", n_samples=20, random_state=0).fit(X, y).posterior_
    post.ess = float("nan")
    imp = tp.feature_importance(post, "inclusion")
    assert np.isfinite(imp["lower"]).all() and np.isfinite(imp["upper"]).all()
    lo, hi = wilson_interval(imp["value"], np.ones(3), 0.05, 0.95)  # counted as one trial
    assert np.array_equal(imp["lower"], lo) and np.array_equal(imp["upper"], hi)


@pytest.mark.parametrize("method", ["smc", "bart"])
def test_max_draws_and_seed_must_be_counts_and_seeds(method):
    X, y = _xy()
    kw = dict(n_samples=10) if method == "bart" else dict(n_particles=20)
    est = BayesianTreeRegressor(method=method, random_state=0, **kw).fit(X, y)
    with pytest.raises(ValueError, match="max_draws must be >= 1, got 0"):  # was: zeros (smc), ZeroDivisionError
        tp.partial_dependence(est, X, 0, max_draws=0)
    with pytest.raises(ValueError, match="seed must be an integer, got None"):  # was: a raw RuntimeError/TypeError
        est.posterior_.predict_interval(X[:2], seed=None)


@pytest.mark.parametrize("method", ["smc", "bart"])
def test_tree_inclusion_counts_a_column_of_several_split_columns_once_per_tree(method):
    """A column with missing values in training splits on two split columns (value and missingness); a
    tree that uses both counts once: ``tree_inclusion`` equals a brute-force count over the trees' nodes,
    mapped to input columns by the encoder."""
    import pandas as pd

    from torchtree.model.trees import INTERNAL
    from torchtree.plot.draws import tree_inclusion

    rng = np.random.default_rng(3)
    X = pd.DataFrame({"a": rng.normal(size=200), "b": rng.normal(size=200), "c": rng.choice(list("pqr"), 200)})
    y = X["a"].to_numpy() + np.where(X["c"] == "p", 2.0, 0.0) + 0.1 * rng.normal(size=200)
    X.loc[rng.random(200) < 0.3, "a"] = np.nan
    opts = dict(n_trees=5, n_chains=2, n_samples=20, n_warmup=20) if method == "bart" else dict(n_particles=50)
    post = BayesianTreeRegressor(method=method, random_state=0, **opts).fit(X, y).posterior_
    groups = post.encoder.groups
    assert len(groups) > 3  # some input column has several split columns
    if method == "smc":
        t = post.trees
        nodes = [[int(t.feature[q, k]) for k in range(int(t.n_nodes[q])) if int(t.status[q, k]) == INTERNAL]
                 for q in range(t.n_trees)]
        brute = np.array([[float(any(groups[f] == d for f in nd)) for d in range(3)] for nd in nodes])
    else:
        feat = post.feature.numpy()
        brute = np.array([[np.mean([d in {groups[f] for f in feat[s, t] if f >= 0} for t in range(feat.shape[1])])
                           for d in range(3)] for s in range(feat.shape[0])])
    per, w = tree_inclusion(post)
    np.testing.assert_allclose(per, brute, rtol=0, atol=1e-12)
    np.testing.assert_allclose(tp.feature_importance(post, "inclusion")["value"], w @ brute, rtol=0, atol=1e-12)
    assert per[:, 0].max() > 0  # column a is used
