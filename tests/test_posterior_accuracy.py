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
