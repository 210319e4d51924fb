"""Cells of messy tables (a QA pass as a data scientist): what a table with pandas' nullable numbers,
dates, text spellings of NaN, empty columns or numeric categories gets, checked against the documented rules
(docs/missing_and_categorical.md)."""
import warnings

import numpy as np
import pandas as pd
import pytest

import torchtree as tt
from torchtree.model.encoding import TableEncoder
from torchtree.model.inputs import as_feature_matrix


def _messages(fn):
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        fn()
    return [str(w.message) for w in caught]


def test_a_category_column_of_numbers_not_named_categorical_is_numbers():
    """categorical_features=None: a pandas category column of numbers is used as its numbers (it said the column
    held text, 'None'); a category column of text is refused, naming the text."""
    rng = np.random.default_rng(0)
    k = rng.integers(0, 4, 80)
    df = pd.DataFrame({"k": pd.Categorical(k), "x": rng.normal(size=80)})
    enc = TableEncoder.fit(df, categorical_features=None)
    assert [c.source for c in enc.columns] == ["numeric", "numeric"]
    np.testing.assert_array_equal(enc.transform(df)[:, 0], k)
    with pytest.raises(ValueError, match=r"column 0 \('k'\) holds text \('a'\) but categorical_features does not"):
        TableEncoder.fit(df.assign(k=pd.Categorical(np.where(k > 1, "a", "b"))), categorical_features=None)


def test_nullable_numbers_dates_and_infinities_get_the_documented_messages():
    """The numeric path reads pd.NA as a missing value (as NaN: it said the frame held text), refuses a date column
    with the advice the coded path gives whatever the other columns hold, and names an infinite cell's column."""
    X = pd.DataFrame({"a": pd.array([1.0, 2.0, 3.0], dtype="Float64"), "b": [1.0, 2.0, 3.0]})
    np.testing.assert_array_equal(as_feature_matrix(X), [[1, 1], [2, 2], [3, 3]])
    X.loc[1, "a"] = pd.NA
    with pytest.raises(ValueError, match=r"first is NaN at row 1, column 0 \('a'\)"):
        as_feature_matrix(X)
    dates = pd.DataFrame({"a": [1.0, 2.0], "t": pd.to_datetime(["2020-01-01", "2021-01-01"])})
    for frame in (dates, dates.assign(c=["x", "y"])):  # numeric path, coded path
        with pytest.raises(ValueError, match=r"dtype datetime64\[\w+\] in column 1 \('t'\): dates, durations"):
            tt.BayesianTreeRegressor(n_particles=5).fit(frame, [0.0, 1.0])
    with pytest.raises(ValueError, match=r"first is infinite at row 0, column 1 \('b'\)"):
        as_feature_matrix(pd.DataFrame({"a": [1.0, 2.0], "b": [np.inf, 1.0]}))


def test_dcc_prediction_with_pd_na_gives_the_missing_value_advice():
    rng = np.random.default_rng(1)
    X = pd.DataFrame({"a": pd.array(rng.normal(size=40), dtype="Float64"), "b": rng.normal(size=40)})
    reg = tt.BayesianTreeRegressor(method="dcc", random_state=0, n_iterations=2, n_warmup=2, n_samples=2)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        reg.fit(X, rng.normal(size=40))
    X.loc[2, "a"] = pd.NA
    with pytest.raises(ValueError, match=r"X has 1 missing value\(s\) \(NaN; the first at row 2, column 0\), and"):
        reg.predict(X)


def test_integer_levels_read_as_written_and_text_nan_is_a_missing_token():
    """An integer column declared categorical keeps integer levels (rules read 'zip in {1, 3}', not 1.0, 3.0;
    warnings show 7, not 7.0); 'nan' / 'NaN' text among numbers is a missing value with the token warning the
    docs promise; a column with no value warns that it is never split on."""
    rng = np.random.default_rng(2)
    df = pd.DataFrame({"zip": rng.choice([1, 3, 4], 90), "x": rng.normal(size=90)})
    enc = TableEncoder.fit(df, (df.zip == 3).to_numpy().astype(int), categorical_features=["zip"])
    assert enc.columns[0].levels == [1, 3, 4] and all(type(v) is int for v in enc.columns[0].levels)
    assert [enc.describe(i, 0.5) for i in range(3)] == ["zip in {1}", "zip in {1, 3}", "zip in {1, 4}"]
    assert any("such as 7; fit saw 1, 3, 4" in m for m in _messages(lambda: enc.transform(df.assign(zip=7))))
    np.testing.assert_array_equal(enc.transform(df.assign(zip=df.zip.astype(str))), enc.transform(df))
    text = pd.DataFrame({"a": np.array(["1.5", "nan", "2", "NaN"] * 5, dtype=object), "b": rng.normal(size=20)})
    msgs = _messages(lambda: TableEncoder.fit(text))
    assert any("10 text cell(s) among numbers read as missing values ('NaN', 'nan')" in m for m in msgs)
    empty = pd.DataFrame({"a": [np.nan] * 20, "b": rng.normal(size=20), "c": [None] * 20})
    msgs = _messages(lambda: TableEncoder.fit(empty))
    assert sum("holds no value in training (every cell is missing): it is never split on" in m for m in msgs) == 2
