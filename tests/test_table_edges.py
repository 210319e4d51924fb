"""Edges of real tables a QA pass as a pandas user found giving wrong numbers in silence: dates in a frame that
needs coding, a lone large value with missing cells, a target with missing values at scoring, and ordered
categories declared but absent from training."""
import warnings

import numpy as np
import pandas as pd
import pytest

from torchtree import BayesianTreeClassifier, BayesianTreeRegressor
from torchtree.model.encoding import TableEncoder

pytestmark = pytest.mark.filterwarnings("ignore:MCMC chains look unconverged")


@pytest.mark.parametrize("kind", ["datetime", "timedelta", "complex"])
def test_dates_durations_and_complex_numbers_are_refused_beside_text_and_missing_cells(kind):
    """Refused as they are alone (the refusals page): before, a text or missing cell anywhere sent the frame to the
    coder, which read a date as its integer count in its own unit (the same dates stored in ns instead of us then
    predicted another class) and NaT as -9.2e18, and dropped the imaginary part."""
    n = 12
    col = {"datetime": pd.date_range("2020-01-01", periods=n, freq="D"),
           "timedelta": pd.to_timedelta(np.arange(n), unit="h"),
           "complex": np.arange(n) + 1j}[kind]
    for other in ({"t": ["a", "b"] * (n // 2)}, {"x": [np.nan] + [1.0] * (n - 1)}):
        X = pd.DataFrame({"d": col, **other})
        with pytest.raises(ValueError, match="X must be numeric"):
            BayesianTreeClassifier(method="smc", n_particles=8).fit(X, np.arange(n) % 2)
        with pytest.raises(ValueError, match=r"X must be numeric, got dtype .* in column 0 \('d'\)"):
            TableEncoder.fit(X, categorical_features=["t"] if "t" in other else None)


@pytest.mark.parametrize("value", [3.0, 1e15, 1e17, -1e17, 1e300])
def test_a_lone_observed_value_stays_apart_from_its_missing_cells(value):
    """A column holding one value and missing cells: the missing rows' stand-ins lie beyond it in float32 and float64
    (the gap was an absolute 1.0, lost beside 1e17), so "is missing" can be split on: the label "x is missing" is
    learnt exactly."""
    x = np.where(np.arange(40) % 3 == 0, np.nan, value)
    X = pd.DataFrame({"x": x})
    coded = TableEncoder.fit(X).transform(X)
    miss = np.isnan(x)
    for dt in (np.float64, np.float32) if abs(value) < 1e38 else (np.float64,):  # 1e300 is stored in float64
        c = coded.astype(dt)
        assert (c[miss, 0] > c[~miss, 0].max()).all() and (c[miss, 1] < c[~miss, 1].min()).all()
    y = miss.astype(int)
    clf = BayesianTreeClassifier(method="smc", n_particles=50, random_state=0).fit(X, y)
    assert clf.score(X, y) == 1.0


def test_scoring_a_regressor_refuses_missing_and_infinite_targets():
    """``score`` gave 0.0 and ``log_predictive`` NaN for a target with one NaN, without a word (scikit-learn
    refuses it); both now raise, naming the row, for NaN and for inf, on the estimator and its posterior."""
    rng = np.random.default_rng(0)
    X = rng.uniform(size=(60, 2))
    y = 3 * X[:, 0]
    reg = BayesianTreeRegressor(method="smc", n_particles=20, random_state=0).fit(X, y)
    assert reg.score(X, y) > 0.5
    for bad, what in ((np.nan, "missing target"), (np.inf, "infinite target")):
        yb = y.copy()
        yb[3] = bad
        for score in (reg.score, reg.log_predictive, reg.posterior_.log_predictive):
            with pytest.raises(ValueError, match=f"1 {what}.*row 3"):
                score(X, yb)


def test_an_ordered_category_declared_but_absent_in_training_predicts_as_an_unseen_level():
    """Categories ``[low, mid, high, unknown]`` (ordered) with ``unknown`` in no training row: at prediction it is an
    unseen level, coded as the most frequent level (as an undeclared one, and as the docs say); it was coded above
    ``high`` and predicted as ``high``, and the warning said fit had seen it."""
    cats = pd.CategoricalDtype(["low", "mid", "high", "unknown"], ordered=True)
    rng = np.random.default_rng(1)
    lv = rng.choice(["low", "mid", "high"], 120, p=[0.6, 0.2, 0.2])
    X = pd.DataFrame({"c": pd.Series(lv, dtype=cats)})
    enc = TableEncoder.fit(X)
    assert enc.columns[0].levels == ["low", "mid", "high"]
    with warnings.catch_warnings(record=True) as got:
        warnings.simplefilter("always")
        declared = enc.transform(pd.DataFrame({"c": pd.Series(["unknown"], dtype=cats)}))
    assert any("fit saw 'low', 'mid', 'high')" in str(w.message) for w in got)
    undeclared = enc.transform(pd.DataFrame({"c": pd.Series(["other"], dtype="category")}))
    low = enc.transform(pd.DataFrame({"c": pd.Series(["low"], dtype=cats)}))
    np.testing.assert_array_equal(declared, undeclared)
    np.testing.assert_array_equal(declared, low)  # the most frequent level
    y = (lv == "high").astype(int)
    clf = BayesianTreeClassifier(method="smc", n_particles=30, random_state=0).fit(X, y)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", UserWarning)
        assert clf.predict(pd.DataFrame({"c": pd.Series(["unknown", "high"], dtype=cats)})).tolist() == [0, 1]
    # with missing cells in training, an unseen level is a missing value: the declared-unused one too
    Xm = pd.DataFrame({"c": pd.Series(np.where(np.arange(120) % 10 == 0, None, lv), dtype=cats)})
    encm = TableEncoder.fit(Xm)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", UserWarning)
        np.testing.assert_array_equal(encm.transform(pd.DataFrame({"c": pd.Series(["unknown"], dtype=cats)})),
                                      encm.transform(pd.DataFrame({"c": pd.Series([None], dtype=cats)})))


def test_categorical_features_refuses_what_is_not_an_index_a_name_or_a_mask():
    X = pd.DataFrame({"a": ["x", "y"] * 5, "b": ["u", "v"] * 5})
    with pytest.raises(ValueError, match="categorical_features holds 1.5"):
        TableEncoder.fit(X, categorical_features=[1.5])
    with pytest.raises(ValueError, match="the one text value it takes is 'from_dtype'"):
        TableEncoder.fit(X, categorical_features="auto")
    assert TableEncoder.fit(X, categorical_features=[0.0, 1]).columns[0].source == "categorical"
