"""DCC's checks of its inputs: n_samples below what LAIS needs is refused before any work,
missing values at predict time get the same advice as at fit time, and columns whose range a
few extreme values set are named in a warning at fit."""
from __future__ import annotations

import time
import warnings

import numpy as np
import pytest

from torchtree import BayesianTreeClassifier
from torchtree.model.soft_data import as_soft_data, squeezed_columns
from torchtree.soft import DCC

SMALL = dict(n_iterations=1, n_initial=3, n_chains=2, n_samples=3, n_warmup=4, activation_threshold=1,
             max_depth=1, n_parallel=1)


def _cls(n=200, seed=0):
    rng = np.random.default_rng(seed)
    x = rng.normal(size=n)
    return np.c_[x, rng.normal(size=n)], (x > 0).astype(int)


def test_n_samples_below_two_is_refused_before_any_work():
    X, y = _cls(60)
    with pytest.raises(ValueError, match=r"n_samples >= 2, got 1: LAIS"):
        DCC(n_samples=1)
    t0 = time.process_time()
    with pytest.raises(ValueError, match=r"n_samples >= 2, got 1"):
        BayesianTreeClassifier(method="dcc", n_samples=1, max_seconds=15, verbose=0).fit(X, y)
    # refused while building the sampler: no warm-up ran (one would take seconds of CPU)
    assert time.process_time() - t0 < 5.0
    assert DCC(n_samples=2).n_samples == 2


def test_missing_values_at_predict_get_the_soft_tree_advice():
    X, y = _cls(60)
    post = DCC(**SMALL).run((X, y), seed=0)
    Q = X[:3].copy()
    Q[1, 0] = np.nan
    for call in (post.predict, post.predict_proba):
        with pytest.raises(ValueError, match=r"1 missing value\(s\) \(NaN; the first at row 1, column 0\).*soft trees "
                                             r"take numeric tables without missing values\. Use a hard-tree method"):
            call(Q)
    est = BayesianTreeClassifier(method="dcc", verbose=0, **SMALL).fit(X, y)
    with pytest.raises(ValueError, match="Use a hard-tree method"):
        est.predict(Q)
    Qi = X[:3].copy()
    Qi[0, 1] = np.inf  # not a missing value: the plain message
    with pytest.raises(ValueError, match="non-finite"):
        post.predict(Qi)


def test_squeezed_columns_finds_a_range_set_by_one_extreme_value():
    X, y = _cls()
    X[0, 0] = 1e3
    sd = as_soft_data(X, y)
    got = squeezed_columns(sd, 0.1)
    assert [j for j, _ in got] == [0] and 0 < got[0][1] < 0.01
    assert squeezed_columns(as_soft_data(*_cls()), 0.1) == []
    # a rare indicator (all central values equal) loses no resolution: not flagged
    Xb = np.c_[(np.arange(200) == 7).astype(float), X[:, 1]]
    assert squeezed_columns(as_soft_data(Xb, y), 0.1) == []


def test_dcc_warns_at_fit_about_an_outlier_squeezed_column():
    X, y = _cls()
    X[0, 0], y[0] = 1e3, 1
    with pytest.warns(UserWarning, match=r"extreme values set the range of X's column 0 \(0\.4\d%\).*hard-tree method"):
        DCC(**SMALL).run((X, y), seed=0)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        DCC(**SMALL).run(_cls(), seed=0)  # clean columns: no warning at all
