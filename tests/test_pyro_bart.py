"""BARTFunction (torchtree.pyro_bart) inside a Pyro model: Gibbs with NUTS recovers a
partially linear model's coefficient and noise (examples/pyro_bart.py), and a BART step on
a fixed noise fits its target."""
from __future__ import annotations

import sys
from pathlib import Path

import numpy as np
import pytest
import torch

from torchtree.pyro_bart import BARTFunction

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "examples"))


def test_gibbs_steps_fit_the_target_and_predict_new_points():
    rng = np.random.default_rng(0)
    X = rng.uniform(size=(200, 3))
    f = 2 * (X[:, 0] > 0.5) + X[:, 1]
    y = torch.tensor(f + 0.1 * rng.normal(size=200))
    bart = BARTFunction(X, y_scale=y, n_trees=20, seed=1)
    for _ in range(60):
        bart.gibbs_step(y, 0.1)
    assert float(torch.sqrt(torch.mean((bart.f - torch.tensor(f)) ** 2))) < 0.2
    assert torch.allclose(bart(X), bart.f, atol=1e-9)  # new-point prediction = the fit at the training points
    again = BARTFunction(X, y_scale=y, n_trees=20, seed=1)
    for _ in range(60):
        again.gibbs_step(y, 0.1)
    assert torch.equal(again.f, bart.f)  # keyed by seed and sweep


@pytest.mark.slow
def test_partially_linear_model_by_gibbs_with_nuts():
    import pyro_bart as ex

    r = ex.run(n=200, iterations=160, n_trees=20, seed=0)
    assert abs(r["beta_mean"] - 2.0) < 0.15  # posterior sd ~0.04
    assert 0.35 < r["sigma_mean"] < 0.75
    assert r["f_rmse"] < 0.6  # sd of the true f is ~1.0
