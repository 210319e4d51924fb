"""SMC with moves reports Kish's ESS of its particle weights, resampled copies counted apart (``summary()["ess"]``,
``posterior.ess``, the CLI's ESS row), as the docs say; it reported the ESS of the weights merged over identical
trees (``ess_distinct``), so 15.2 where the run's own ``final_ess`` was 26.5 (a QA pass)."""
import numpy as np
import pytest
import torch

from torchtree import Data, SMCSampler


@pytest.mark.parametrize("task", ["classification", "regression"])
def test_the_posterior_ess_is_the_particles_kish_ess(task):
    rng = np.random.default_rng(0)
    X = rng.uniform(size=(80, 2))
    y = (X[:, 0] > 0.5).astype(int) if task == "classification" else X[:, 0] + 0.1 * rng.normal(size=80)
    post = SMCSampler(n_particles=64, n_iterations=4).run(Data(X, y, task=task), seed=3)
    s = post.summary()
    assert s["ess"] == post.ess == pytest.approx(post.info["final_ess"], rel=1e-12)
    w = post.weights.double()
    assert s["ess_distinct"] == pytest.approx(float(1 / (w * w).sum()), rel=1e-12)
    # resampled copies merged can only lower Kish's ESS: (sum of merged w)^2 >= sum of the copies' w^2
    assert s["ess_distinct"] <= s["ess"] + 1e-9
    assert post.summary()["n_distinct_trees"] < 64 or s["ess_distinct"] == pytest.approx(s["ess"], rel=1e-9)
    assert torch.isclose(post.weights.sum(), torch.tensor(1.0, dtype=post.weights.dtype))
