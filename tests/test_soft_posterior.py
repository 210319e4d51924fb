"""SoftTreePosterior: original label values and the save / load format."""
from __future__ import annotations

import math

import numpy as np
import pytest
import torch

import torchtree
from torchtree.soft import DCC, SoftTreePosterior


def _fit_strings():
    rng = np.random.default_rng(0)
    X = rng.random((60, 2))
    y = np.where(X[:, 0] > 0.5, "yes", "no")
    clf = torchtree.BayesianTreeClassifier(method="dcc", n_iterations=2, n_initial=5, n_chains=2, n_samples=5,
                                           n_warmup=10, max_depth=2)
    clf.fit(X, y)
    return clf, X, y


def test_string_labels_through_the_dcc_classifier(tmp_path):
    clf, X, y = _fit_strings()
    post = clf.posterior_
    assert isinstance(post, SoftTreePosterior)
    assert list(post.classes_) == ["no", "yes"]
    pred = post.predict(X)
    assert set(pred.tolist()) <= {"no", "yes"}
    assert post.predict_proba(X).shape == (60, 2)
    lp = post.log_predictive(X, y)  # original labels, not codes
    assert np.isfinite(lp) and lp < 0
    assert post.log_predictive(torch.as_tensor(X), list(y)) == pytest.approx(lp)
    assert 0.0 <= post.accuracy(X, y) <= 1.0
    with pytest.raises(ValueError, match="not seen in training"):
        post.log_predictive(X[:2], ["yes", "maybe"])
    # the labels survive save / load
    path = tmp_path / "soft.pt"
    post.save(str(path))
    back = SoftTreePosterior.load(str(path))
    assert list(back.classes_) == ["no", "yes"]
    assert back.log_predictive(X, y) == pytest.approx(lp)
    assert (back.predict(X) == pred).all()


def test_save_load_format_tag(tmp_path):
    g = torch.Generator().manual_seed(0)
    X = torch.rand(40, 2, generator=g)
    y = (X[:, 0] > 0.5).float() + 0.1 * torch.randn(40, generator=g)
    post = DCC(n_iterations=1, n_initial=4, n_chains=2, n_samples=4, n_warmup=8, max_depth=1).run((X, y), seed=0)
    path = tmp_path / "post.pt"
    post.save(str(path))
    raw = torch.load(str(path), weights_only=True)  # plain containers only
    assert raw["format"] == SoftTreePosterior.FORMAT
    back = SoftTreePosterior.load(str(path))
    assert np.allclose(back.predict(X), post.predict(X))
    assert torch.equal(back.weights, post.weights)
    assert not list(tmp_path.glob(".post.pt.*"))  # atomic: no temporary left behind
    # a file of another format (here a hard-tree posterior tag) is refused clearly
    torch.save({"format": "torchtree.TreePosterior/1"}, str(tmp_path / "hard.pt"))
    with pytest.raises(ValueError, match="TreePosterior.load"):
        SoftTreePosterior.load(str(tmp_path / "hard.pt"))
    torch.save({"draws": []}, str(tmp_path / "untagged.pt"))
    with pytest.raises(ValueError, match="not a torchtree soft-tree posterior"):
        SoftTreePosterior.load(str(tmp_path / "untagged.pt"))
    (tmp_path / "junk.pt").write_bytes(b"not a checkpoint")
    with pytest.raises(ValueError, match="not a readable"):
        SoftTreePosterior.load(str(tmp_path / "junk.pt"))
    with pytest.raises(FileNotFoundError):
        SoftTreePosterior.load(str(tmp_path / "missing.pt"))


def test_hard_and_soft_posteriors_share_one_protocol_and_neither_inherits_the_other():
    from torchtree import Posterior, TreePosterior

    assert issubclass(SoftTreePosterior, Posterior) and issubclass(TreePosterior, Posterior)
    assert not issubclass(SoftTreePosterior, TreePosterior) and not issubclass(TreePosterior, SoftTreePosterior)
    protocol = ["predict_proba", "predict", "predict_interval", "log_predictive", "summary", "to_dot", "save", "load"]
    for cls in (TreePosterior, SoftTreePosterior):  # each implements the whole protocol itself
        assert all(name in vars(cls) for name in protocol), cls


def test_interval_of_a_row_does_not_depend_on_the_other_rows(monkeypatch):
    """Random numbers shared by all rows: a row's soft-tree interval is the same alone, in
    another block, or among other rows (to float32 routing ulps: the routing is a matmul)."""
    from torchtree.model import soft_posterior

    g = torch.Generator().manual_seed(0)
    X = torch.rand(40, 2, generator=g)
    y = (X[:, 0] > 0.5).float() + 0.1 * torch.randn(40, generator=g)
    post = DCC(n_iterations=1, n_initial=4, n_chains=2, n_samples=4, n_warmup=8, max_depth=1).run((X, y), seed=0)
    ref = post.predict_interval(X, n_draws=500, seed=2)
    width = ref[:, 1] - ref[:, 0]
    assert np.all(width > 0)
    for r in (0, 17, 39):
        assert np.allclose(post.predict_interval(X[r : r + 1], n_draws=500, seed=2)[0], ref[r], rtol=0,
                           atol=1e-5 * width[r])
    monkeypatch.setattr(soft_posterior, "INTERVAL_BLOCK", 7)  # six blocks
    assert np.allclose(post.predict_interval(X, n_draws=500, seed=2), ref, rtol=0, atol=1e-5 * width.max())
    assert not np.allclose(post.predict_interval(X, n_draws=500, seed=3), ref, rtol=0, atol=1e-3 * width.max())


def test_mean_interval_is_the_weighted_quantiles_of_the_draws_means():
    """``kind="mean"`` bounds each row by quantiles of the draws' soft-tree means (weighted by their
    topology's weight), within 4 binomial sd of ``(1 -+ level) / 2`` for ``n_draws`` Monte Carlo picks,
    and inside the predictive interval, which adds each draw's noise."""
    from torchtree.plot import prediction_draws

    g = torch.Generator().manual_seed(1)
    X = torch.rand(40, 2, generator=g)
    y = (X[:, 0] > 0.5).float() + 0.1 * torch.randn(40, generator=g)
    post = DCC(n_iterations=1, n_initial=3, n_chains=2, n_samples=30, n_warmup=20, max_depth=1).run((X, y), seed=0)
    n_draws = 40000
    mean = post.predict_interval(X, n_draws=n_draws, seed=4, kind="mean")
    pred = post.predict_interval(X, n_draws=n_draws, seed=4)
    values, weights = prediction_draws(post, X.numpy(), max_draws=None)
    eps = 4 * math.sqrt(0.05 * 0.95 / n_draws)
    for m in range(X.shape[0]):
        order = np.argsort(values[:, m])
        cdf = np.cumsum(weights[order])
        v = values[order, m]
        for k, p in ((0, 0.05), (1, 0.95)):
            lo, hi = v[np.searchsorted(cdf, p - eps)], v[min(np.searchsorted(cdf, p + eps), len(v) - 1)]
            tol = 1e-5 * (pred[m, 1] - pred[m, 0])  # float32 routing of the draws' means
            assert lo - tol <= mean[m, k] <= hi + tol, (m, k)
    assert ((pred[:, 0] < mean[:, 0]) & (mean[:, 1] < pred[:, 1])).all()


def test_nuts_chain_draws_go_to_arviz_and_the_summary_by_chain():
    """A NUTS posterior's draws per chain (draw-major rows ``s C + c``) on the parameters' own scales: planting
    chain ``c``'s threshold coordinate at ``c - 1`` in every one of its rows gives ``sigmoid(c - 1)`` throughout
    chain ``c`` (the layout), the summary's worst R-hat sees chains set apart, ArviZ gets the same arrays, and
    the chains' mean equals the posterior-mean gates. A DCC posterior (several topologies) has none."""
    from torchtree.model.diagnostics import to_arviz
    from torchtree.soft import NUTS

    rng = np.random.default_rng(0)
    X = rng.uniform(size=(60, 2))
    y = 2 * (X[:, 0] > 0.5) + 0.1 * rng.normal(size=60)
    post = NUTS(n_chains=3, n_samples=12, n_warmup=12, depth=1).run(X, y, seed=0)
    ch = post.chain_draws()
    assert {k: v.shape for k, v in ch.items()} == {"thresholds": (3, 12, 1), "split_weights": (3, 12, 1, 2),
                                                    "leaf_means": (3, 12, 2), "sigma2": (3, 12)}
    g = post.gates()
    np.testing.assert_allclose(ch["thresholds"].mean((0, 1)), g["thresholds"][:1].double().numpy(), rtol=1e-6)
    np.testing.assert_allclose(ch["split_weights"].mean((0, 1)), g["weights"][:1].double().numpy(), rtol=1e-6)
    pytest.importorskip("arviz")
    idata = to_arviz(post)
    np.testing.assert_array_equal(idata.posterior["leaf_means"].values, ch["leaf_means"])
    # the threshold's unconstrained coordinate: the first after the split weights' D - 1
    model = post._model(0, 1)
    u = int(model.layout.u_offset)
    col = int((model.compact_index(0) == u).nonzero())
    planted = post.draws[0].clone()
    planted[:, col] = (torch.arange(planted.shape[0]) % 3 - 1).to(planted)
    post.draws[0] = planted
    th = post.chain_draws()["thresholds"][..., 0]
    np.testing.assert_allclose(th, np.broadcast_to(1 / (1 + np.exp(-np.array([-1.0, 0.0, 1.0])))[:, None], (3, 12)),
                               rtol=1e-6)
    shifted = planted.clone()
    shifted[:, col] = 3.0 * planted[:, col] + 0.1 * torch.randn(planted.shape[0], generator=torch.Generator().manual_seed(1))
    post.draws[0] = shifted  # chains apart, each varying
    assert post.summary()["rhat_max"] > 1.5
    dcc = DCC(n_iterations=2, n_chains=2, n_samples=5, n_warmup=5, max_depth=1).run(X, y, seed=0)
    assert dcc.chain_draws() is None and "rhat_max" not in dcc.summary()


def test_class_probabilities_sum_to_one_and_mix_only_topologies_with_draws():
    """Each row of ``predict_proba`` sums to 1 to float64 rounding (the draws' softmax outputs are float32),
    and the mixture is normalised by the weights of the topologies it mixes: one without draws (weighted, but
    not predicting) leaves the others' mixture a distribution."""
    rng = np.random.default_rng(0)
    X = rng.random((60, 2))
    y = np.where(X[:, 0] > 0.5, "yes", "no")
    post = torchtree.BayesianTreeClassifier(method="dcc", n_iterations=4, n_initial=10, activation_threshold=1,
                                            n_chains=2, n_samples=5, n_warmup=10, max_depth=2,
                                            verbose=0).fit(X, y).posterior_
    p = post.predict_proba(X)
    assert np.abs(p.sum(1) - 1).max() < 1e-12
    with_draws = [m for m in range(len(post.topologies)) if post.draws[m].shape[0] > 0]
    assert len(with_draws) >= 2, "the fit needs two topologies with draws"
    heaviest = max(with_draws, key=lambda m: float(post.weights[m]))
    post.draws[heaviest] = post.draws[heaviest][:0]
    q = post.predict_proba(X)
    assert np.abs(q.sum(1) - 1).max() < 1e-12
    for m in with_draws:
        post.draws[m] = post.draws[m][:0]
    with pytest.raises(ValueError, match="no topology with draws"):
        post.predict_proba(X)
