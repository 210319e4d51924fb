"""``posterior.accuracy`` with labels the model never saw: those rows count as errors with a warning naming the
labels, as the estimators' ``score`` does; it returned 0.0 in silence (a QA pass)."""
import numpy as np
import pytest

from torchtree import Data, TopDownSMC


def test_unseen_labels_warn_and_count_as_errors():
    rng = np.random.default_rng(0)
    X = rng.uniform(size=(60, 2))
    y = (X[:, 0] > 0.5).astype(int)
    post = TopDownSMC(n_particles=50).run(Data(X, y), seed=0)
    right = post.accuracy(X, y)
    with pytest.warns(UserWarning, match=r"label\(s\) \[5, 6\] not seen in training \(classes: \[0, 1\]\)"):
        assert post.accuracy(X, y + 5) == 0.0
    mixed = np.where(np.arange(60) < 30, y, 7)
    with pytest.warns(UserWarning, match=r"\[7\] not seen"):
        got = post.accuracy(X, mixed)
    assert got == pytest.approx(np.mean((post.predict(X) == y)[:30]) / 2)
    assert right > 0.9


def test_string_classes_are_the_known_labels():
    rng = np.random.default_rng(1)
    X = rng.uniform(size=(60, 2))
    y = np.where(X[:, 0] > 0.5, "yes", "no")
    post = TopDownSMC(n_particles=50).run(Data(X, y), seed=0)
    with pytest.warns(UserWarning, match=r"\['maybe'\] not seen in training \(classes: \['no', 'yes'\]\)"):
        post.accuracy(X, np.where(np.arange(60) < 5, "maybe", y))


def test_missing_labels_are_refused_not_counted_as_errors():
    """A missing label (NaN, None, pd.NA) cannot be scored: the classifier's ``score``, ``accuracy`` and
    ``log_predictive`` refuse it as ``fit`` does (they counted it as an error, 0.9 for one NaN in ten rows), and
    ``rmse`` refuses a missing target instead of returning NaN."""
    import pandas as pd

    from torchtree import BayesianTreeClassifier

    rng = np.random.default_rng(2)
    X = rng.uniform(size=(60, 2))
    y = (X[:, 0] > 0.5).astype(float)
    clf = BayesianTreeClassifier(n_particles=30, random_state=0).fit(X, y.astype(int))
    bad = [y.copy(), y.astype(object), pd.array(y.astype(int), dtype="Int64")]
    bad[0][3], bad[1][3], bad[2][3] = np.nan, None, pd.NA
    for yb in bad:
        for score in (clf.score, clf.posterior_.accuracy, clf.log_predictive):
            with pytest.raises(ValueError, match=r"y has 1 missing label\(s\) \(None / NaN\); the first is at row 3"):
                score(X, yb)
    reg = TopDownSMC(n_particles=30).run(Data(X, X[:, 1], task="regression"), seed=0)
    with pytest.raises(ValueError, match=r"missing target\(s\)"):
        reg.rmse(X, np.where(np.arange(60) == 5, np.nan, X[:, 1]))
