"""Simulation-based calibration of the regression predictive (issue #22, item 2).

When the data are drawn from the model's own prior (a tree from the Chipman prior, leaf means
and noise variances from the Normal-inverse-gamma prior, targets from the leaves), the exact
posterior predictive's 90% interval holds a fresh point's target with probability exactly 0.9.
Top-down SMC with many particles on 10 rows is close to exact, so over R = 300 seeded
replications the coverage must be 0.9 within 0.06 (3.5 Monte Carlo standard deviations of a
binomial share, sqrt(0.09 / 300) = 0.017). An interval that is too wide or too narrow by a
fifth of its width moves the coverage by more than that.
"""
from __future__ import annotations

import numpy as np
import pytest
import torch

from torchtree import TopDownSMC
from torchtree.model.data import Data
from torchtree.model.likelihoods import NormalInverseGamma
from torchtree.model.priors import ChipmanPrior

R, N_TRAIN = 300, 10


def _replicate(r: int, prior: ChipmanPrior, lik: NormalInverseGamma):
    """(training data, x_new [1, 2], y_new) drawn from the prior."""
    rng = np.random.default_rng(10_000 + r)
    X = rng.uniform(0.0, 1.0, size=(N_TRAIN + 1, 2))
    # a tree from the prior: the sampler with the labels ignored, one particle
    dummy = Data(X[:N_TRAIN], np.zeros(N_TRAIN), task="regression")
    tree = TopDownSMC(prior, lik, n_particles=1, use_likelihood=False).run(dummy, seed=r).trees
    leaf = tree.leaf_index(torch.as_tensor(X, dtype=dummy.X.dtype))[0].numpy()
    y = np.empty(N_TRAIN + 1)
    for node in np.unique(leaf):  # per leaf: sigma^2 ~ IG(a0, b0), mu ~ N(mu0, sigma^2 / kappa0)
        sigma2 = lik.b0 / rng.gamma(lik.a0)
        mu = rng.normal(lik.mu0, np.sqrt(sigma2 / lik.kappa0))
        rows = leaf == node
        y[rows] = rng.normal(mu, np.sqrt(sigma2), size=rows.sum())
    return Data(X[:N_TRAIN], y[:N_TRAIN], task="regression"), X[N_TRAIN:], y[N_TRAIN]


@pytest.mark.slow
def test_predictive_interval_covers_at_its_level_on_data_from_the_prior():
    prior = ChipmanPrior(0.95, 1.0)
    lik = NormalInverseGamma(mu0=0.0, kappa0=1.0, a0=3.0, b0=2.0)
    hits = 0
    for r in range(R):
        data, x_new, y_new = _replicate(r, prior, lik)
        post = TopDownSMC(prior, lik, n_particles=300).run(data, seed=r)
        lo, hi = np.asarray(post.predict_interval(x_new, level=0.9))[0]
        hits += int(lo <= y_new <= hi)
    coverage = hits / R
    assert abs(coverage - 0.9) < 0.06, coverage


@pytest.mark.parametrize("method", ["smc", "mcmc", "smc-moves", "bart"])
def test_targets_with_no_spread_do_not_make_a_confident_prior(method):
    """One row, or a constant target, says nothing about the noise: the data-calibrated prior falls
    back to the targets' magnitude instead of a variance of 1 (or 0) that the evidence then shrinks
    (one row used to predict 3.0 within [2.82, 3.18]; a constant 5.0 within 5 +- 2e-7)."""
    import warnings

    from torchtree import BayesianTreeRegressor

    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # MCMC's convergence warning on such data
        one = BayesianTreeRegressor(method=method, random_state=0).fit(np.array([[1.0, 2.0]]), np.array([3.0]))
        const = BayesianTreeRegressor(method=method, random_state=0).fit(
            np.random.default_rng(0).normal(size=(50, 2)), np.full(50, 5.0))
    lo, hi = one.predict_interval(np.array([[1.0, 2.0]]), 0.9)[0]
    assert lo < 3.0 < hi and hi - lo > 2.5, (lo, hi)  # about the targets' magnitude, 3
    lo, hi = const.predict_interval(np.zeros((1, 2)), 0.9)[0]
    assert lo < 5.0 < hi and hi - lo > 1.0, (lo, hi)


def test_target_scale_falls_back_to_the_magnitude():
    import torch

    from torchtree.model.likelihoods import NormalInverseGamma, target_scale

    assert target_scale(torch.tensor([1.0, 3.0])) == 2.0  # the variance when there is spread
    # no spread: the magnitude squared, so that rescaling y rescales the prior (1 only for zeros)
    assert target_scale(torch.tensor([3.0])) == 9.0 and abs(target_scale(torch.full((4,), -0.1)) - 0.01) < 1e-8  # float32 -0.1
    assert target_scale(torch.zeros(3)) == 1.0
    assert NormalInverseGamma.default_for(torch.tensor([3.0])).b0 == 0.5 * 9.0
