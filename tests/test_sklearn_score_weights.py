"""scikit-learn conventions a QA pass found missing: ``score(X, y, sample_weight=None)`` (with metadata routing
on, ``Pipeline.score`` passes ``sample_weight`` and raised TypeError), ``check_is_fitted`` after a failed first
``fit`` (it passed: an attribute ending in ``_`` was set before the data were checked), ``predict_log_proba``,
and the column-vector ``y`` warning at ``score`` as at ``fit``."""
import numpy as np
import pytest

from torchtree import BayesianTreeClassifier, BayesianTreeRegressor

sklearn = pytest.importorskip("sklearn")
from sklearn.exceptions import NotFittedError  # noqa: E402
from sklearn.metrics import accuracy_score, r2_score  # noqa: E402
from sklearn.utils.validation import check_is_fitted  # noqa: E402


def _data(n=120):
    rng = np.random.default_rng(0)
    X = rng.uniform(size=(n, 2))
    return X, (X[:, 0] + 0.3 * rng.normal(size=n) > 0.5).astype(int), X[:, 0] + 0.2 * rng.normal(size=n)


def test_weighted_scores_equal_scikit_learns():
    X, yc, yr = _data()
    w = np.random.default_rng(1).uniform(size=len(X))
    clf = BayesianTreeClassifier(n_particles=30, hyper="fixed", random_state=0).fit(X, yc)
    reg = BayesianTreeRegressor(n_particles=30, hyper="fixed", random_state=0).fit(X, yr)
    assert clf.score(X, yc, sample_weight=w) == pytest.approx(accuracy_score(yc, clf.predict(X), sample_weight=w),
                                                              rel=1e-12)
    assert reg.score(X, yr, sample_weight=w) == pytest.approx(r2_score(yr, reg.predict(X), sample_weight=w), rel=1e-10)
    assert clf.score(X, yc, sample_weight=None) == clf.score(X, yc)
    assert reg.score(X, yr, sample_weight=np.ones(len(X))) == pytest.approx(reg.score(X, yr), rel=1e-12)
    with pytest.raises(ValueError, match="sample_weight must have shape"):
        clf.score(X, yc, sample_weight=np.ones(3))
    with pytest.raises(ValueError, match="non-negative"):
        reg.score(X, yr, sample_weight=-np.ones(len(X)))
    np.testing.assert_array_equal(clf.predict_log_proba(X), np.log(clf.predict_proba(X)))


def test_pipeline_score_with_metadata_routing():
    from sklearn.pipeline import make_pipeline
    from sklearn.preprocessing import StandardScaler

    X, yc, _ = _data()
    sklearn.set_config(enable_metadata_routing=True)
    try:
        p = make_pipeline(StandardScaler(), BayesianTreeClassifier(n_particles=20, hyper="fixed", random_state=0))
        assert 0.5 < p.fit(X, yc).score(X, yc) <= 1.0
        from sklearn.model_selection import cross_validate

        w = np.random.default_rng(2).uniform(0.1, 1.0, size=len(X))
        est = BayesianTreeClassifier(n_particles=20, hyper="fixed", random_state=0).set_score_request(sample_weight=True)
        got = cross_validate(est, X, yc, cv=2, params={"sample_weight": w})["test_score"]  # routed to score only
        assert got.shape == (2,) and np.isfinite(got).all()
        p[-1].set_score_request(sample_weight=True)
        assert p.score(X, yc, sample_weight=w) == pytest.approx(accuracy_score(yc, p.predict(X), sample_weight=w))
    finally:
        sklearn.set_config(enable_metadata_routing=False)


def test_a_failed_first_fit_leaves_it_unfitted():
    c = BayesianTreeClassifier()
    with pytest.raises(ValueError):
        c.fit([[0.0], [1.0], [2.0]], [0.5, 1.5, 0.5])  # continuous labels: refused
    with pytest.raises(NotFittedError):
        check_is_fitted(c)
    X, yc, _ = _data(40)
    c.set_params(n_particles=10, hyper="fixed").fit(X, yc)
    check_is_fitted(c)


def test_score_warns_of_a_column_vector_y():
    from sklearn.exceptions import DataConversionWarning

    X, yc, _ = _data(40)
    c = BayesianTreeClassifier(n_particles=10, hyper="fixed", random_state=0).fit(X, yc)
    with pytest.warns(DataConversionWarning, match="column-vector y"):
        assert c.score(X, yc[:, None]) == c.score(X, yc)


def test_tags_declare_the_tables_the_hard_trees_take():
    """The hard-tree methods and BART take text, categorical columns and missing values; the soft trees none."""
    for method in ("smc", "bart"):
        tags = BayesianTreeClassifier(method=method).__sklearn_tags__().input_tags
        assert tags.string and tags.categorical and tags.allow_nan
    tags = BayesianTreeClassifier(method="dcc").__sklearn_tags__().input_tags
    assert not (tags.string or tags.categorical or tags.allow_nan)
