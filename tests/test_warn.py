"""Warnings name the user's line, however deep in torchtree they are raised (torchtree.core.warn)."""
from __future__ import annotations

import warnings

import numpy as np
import pytest

import torchtree
from torchtree.core.warn import warn


def _caught(fn):
    with warnings.catch_warnings(record=True) as got:
        warnings.simplefilter("always")
        fn()
    return got


def test_library_warnings_point_at_the_callers_line():
    rng = np.random.default_rng(0)
    X = np.column_stack([rng.random(60), rng.integers(0, 2, 60)]).astype(object)
    y = (X[:, 0].astype(float) > 0.5).astype(int)
    clf = torchtree.BayesianTreeClassifier(n_particles=40, random_state=0, categorical_features=[1]).fit(X, y)
    new = np.array([[0.1, 7], [0.2, 7], [0.3, 7]], dtype=object)
    got = _caught(lambda: clf.predict(new))  # the encoder warns several calls deep inside predict
    assert [w.filename for w in got if "not seen in fit" in str(w.message)] == [__file__]
    got = _caught(lambda: torchtree.BayesianTreeClassifier(method="mcmc", n_samples=20, n_chains=2,
                                                          random_state=0).fit(X, y))
    assert [w.filename for w in got if "unconverged" in str(w.message)] == [__file__]


def test_frames_of_torchtree_modules_are_skipped_by_module_name():
    """Frames count as the library's by their module's name (``torchtree.*``), not their file: two
    such frames are passed over to the test's line."""
    space = {"__name__": "torchtree.fake_cli", "warn": warn}
    exec(compile("def outer():\n    inner()\n\ndef inner():\n    warn('deep', UserWarning)\n", "fake_cli.py", "exec"), space)
    got = _caught(space["outer"])  # called from this test module: it is the first frame outside
    assert [(w.filename, str(w.message)) for w in got] == [(__file__, "deep")]
    with pytest.warns(RuntimeWarning, match="deep"):
        warn("deep", RuntimeWarning)
