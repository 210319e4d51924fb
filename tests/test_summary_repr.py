"""``posterior_.summary()`` (issue #20): still a dict (existing code indexes it), its
``feature_usage`` labelled by ``feature_names`` (the training table's column names when
the estimator was fitted on a DataFrame), and printed as a table rather than a raw dict."""
from __future__ import annotations

import numpy as np
import pytest

from torchtree import BayesianTreeClassifier, TreePosterior

pd = pytest.importorskip("pandas")


def _table(seed=0):
    g = np.random.default_rng(seed)
    X = pd.DataFrame(g.normal(size=(80, 3)), columns=["age", "income", "noise"])
    y = (X["income"] > 0).astype(int).to_numpy()
    return X, y


@pytest.fixture(scope="module")
def fitted():
    X, y = _table()
    return BayesianTreeClassifier(method="smc", n_particles=60, random_state=0).fit(X, y)


def test_summary_is_a_dict_with_feature_names(fitted):
    s = fitted.posterior_.summary()
    assert isinstance(s, dict)
    assert s["feature_names"] == ["age", "income", "noise"]
    assert s["feature_usage"].shape == (3,) and s["leaves_mean"] >= 1
    assert int(np.argmax(s["feature_usage"])) == 1  # the label depends on income only


def test_summary_repr_is_a_labelled_table(fitted):
    s = fitted.posterior_.summary()
    text = repr(s)
    assert not text.startswith("{") and "array(" not in text
    usage_lines = [line.split() for line in text.splitlines() if line.startswith("    ")]
    assert usage_lines[0][0] == "income" and sorted(r[0] for r in usage_lines) == ["age", "income", "noise"]
    assert usage_lines[0][1] == f"{s['feature_usage'][1]:.3f}"
    assert "leaves_mean" in text and "ess" in text


def test_feature_names_survive_save_and_load(fitted, tmp_path):
    path = str(tmp_path / "p.pt")
    fitted.posterior_.save(path)
    assert TreePosterior.load(path).summary()["feature_names"] == ["age", "income", "noise"]


def test_arrays_without_names_get_positional_names():
    X, y = _table()
    post = BayesianTreeClassifier(method="smc", n_particles=30, random_state=0).fit(X.to_numpy(), y).posterior_
    s = post.summary()
    assert s["feature_names"] == ["x0", "x1", "x2"] and "x1" in repr(s)


def test_soft_posterior_summary_has_names_and_table():
    from torchtree.soft import NUTS

    X, y = _table(1)
    post = NUTS(n_chains=2, n_samples=6, n_warmup=6, depth=1).run(X.to_numpy(), y, seed=0)
    s = post.summary()
    assert isinstance(s, dict) and s["feature_names"] == ["x0", "x1", "x2"]
    assert "feature_usage_top" in repr(s) and "topologies" in repr(s)


def test_refit_on_an_array_drops_the_old_names():
    X, y = _table()
    est = BayesianTreeClassifier(method="smc", n_particles=30, random_state=0).fit(X, y)
    assert est.posterior_.summary()["feature_names"] == ["age", "income", "noise"]
    est.fit(X.to_numpy(), y)
    assert est.posterior_.summary()["feature_names"] == ["x0", "x1", "x2"]
