"""A BART prediction does not depend on the block of points predicted with it: the mean over draws was a
reduction over the leading dimension of ``[draws, points]``, whose order of additions depends on the number of
points, so the memory budget or the rows predicted together moved a prediction in its last bit (a QA pass:
306 of 200,000 predictions under an 8 MiB budget). ``draw_mean`` reduces each point's own row of draws."""
import numpy as np
import pytest
import torch

import torchtree
from torchtree import BayesianTreeClassifier, BayesianTreeRegressor
from torchtree.model.bart_posterior import draw_mean


def test_draw_mean_of_a_point_depends_on_its_draws_alone():
    g = torch.Generator().manual_seed(0)
    f = torch.randn(1000, 4096, generator=g, dtype=torch.float64) * 3 + 1
    full = draw_mean(f)
    for m in (1, 7, 100, 777, 1000, 2048, 4095):
        assert torch.equal(draw_mean(f[:, :m]), full[:m])
    k = torch.randn(200, 3, 500, generator=g, dtype=torch.float64)  # [draws, classes, points]
    assert torch.equal(draw_mean(k[:, :, :123]), draw_mean(k)[:, :123])
    torch.testing.assert_close(full, f.mean(0), rtol=0, atol=1e-14)


@pytest.mark.filterwarnings("ignore::UserWarning")
def test_predictions_are_the_same_alone_and_under_any_budget():
    rng = np.random.default_rng(0)
    X = rng.uniform(size=(300, 3))
    reg = BayesianTreeRegressor("bart", n_trees=10, n_samples=100, random_state=0).fit(X, X[:, 0] + 0.1 * rng.normal(size=300))
    clf = BayesianTreeClassifier("bart", n_trees=10, n_samples=50, random_state=0).fit(X, np.digitize(X[:, 0], [0.3, 0.6]))
    Xt = rng.uniform(size=(1200, 3))
    m, p = reg.predict(Xt), clf.predict_proba(Xt)
    assert np.array_equal(reg.predict(Xt[:37]), m[:37]) and np.array_equal(clf.predict_proba(Xt[:37]), p[:37])
    torchtree.set_memory_budget("1M")
    try:
        assert np.array_equal(reg.predict(Xt), m) and np.array_equal(clf.predict_proba(Xt), p)
    finally:
        torchtree.set_memory_budget(None)


@pytest.mark.filterwarnings("ignore::UserWarning")
def test_deep_trees_stay_within_the_memory_budget(monkeypatch):
    """Trees kept apart as deep (a forest of one each) were summed all at once, an ``[n_deep, block]`` float64
    temporary the block size did not count (a QA pass: 7,121 deep trees, +75 MiB under a 4 MiB budget). Every
    ``forest_sum`` output of a prediction now stays within the budget, and the predictions are unchanged."""
    import torchtree.model.bart_posterior as bp

    rng = np.random.default_rng(1)
    X = rng.uniform(size=(400, 4))
    y = np.sin(6 * X[:, 0]) * X[:, 1] + (X[:, 2] > 0.5) + 0.05 * rng.normal(size=400)
    reg = BayesianTreeRegressor("bart", n_trees=20, n_samples=60, max_depth=8, random_state=0).fit(X, y)
    P = reg.posterior_
    n_deep = P._deep[0].shape[0]
    assert n_deep > 2 * P.n_particles  # more deep trees than draws: the case that overran the budget
    Xt = rng.uniform(size=(3000, 4))
    ref = reg.predict(Xt)
    sizes = []
    real = bp.forest_sum
    monkeypatch.setattr(bp, "forest_sum", lambda *a, **k: sizes.append(a[-1].shape[1] * a[0].shape[0] * 8) or real(*a, **k))
    budget = 1 << 20
    torchtree.set_memory_budget(budget)
    try:
        assert np.array_equal(reg.predict(Xt), ref)
    finally:
        torchtree.set_memory_budget(None)
    assert max(sizes) <= budget // 2 and len(sizes) > 3
