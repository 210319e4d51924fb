"""Real tables as users bring them (a QA pass with messy pandas frames): categories that are not plain
labels, levels spelt another way at prediction, names and targets that must not be guessed."""
from __future__ import annotations

import warnings

import numpy as np
import pytest

pd = pytest.importorskip("pandas")

from torchtree import BayesianTreeClassifier, BayesianTreeRegressor  # noqa: E402

SMALL = dict(n_particles=40, random_state=0, hyper="fixed")


def _quiet(f, *a):
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        return f(*a)


def test_a_pd_cut_column_predicts_the_same_after_save_and_load(tmp_path):
    """pd.cut gives ordered Interval categories; a saved model keeps levels as text, and prediction
    must still find them (it used to predict one constant after loading)."""
    rng = np.random.default_rng(0)
    age = rng.uniform(0, 90, 200)
    X = pd.DataFrame({"agebin": pd.cut(age, [0, 30, 60, 90])})
    reg = BayesianTreeRegressor(**SMALL).fit(X, (age > 45) * 3.0)
    path = tmp_path / "post.pt"
    reg.posterior_.save(str(path))
    loaded = type(reg.posterior_).load(str(path))
    before = reg.predict(X.iloc[:20])
    assert np.ptp(before) > 2.0
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        np.testing.assert_array_equal(loaded.predict(X.iloc[:20]), before)


@pytest.mark.parametrize("ordered", [False, True])
def test_categories_of_any_type_are_levels_like_their_text(ordered):
    """Interval and Timestamp categories (unordered ones used to be refused) fit as the same levels
    as their text: the same trees, the same predictions."""
    rng = np.random.default_rng(1)
    days = pd.to_datetime(["2024-01-01", "2024-02-01", "2024-03-01"])
    pick = rng.integers(0, 3, 150)
    y = np.array([0.0, 2.0, 5.0])[pick] + 0.1 * rng.normal(size=150)
    as_cat = pd.DataFrame({"day": pd.Categorical(days[pick], categories=days, ordered=ordered)})
    as_text = pd.DataFrame({"day": pd.Categorical([str(d) for d in days[pick]], categories=[str(d) for d in days],
                                                  ordered=ordered)})
    a = BayesianTreeRegressor(**SMALL).fit(as_cat, y)
    b = BayesianTreeRegressor(**SMALL).fit(as_text, y)
    np.testing.assert_array_equal(a.predict(as_cat), b.predict(as_text))
    assert np.abs(a.predict(as_cat) - np.array([0.0, 2.0, 5.0])[pick]).max() < 0.5


def test_unseen_levels_of_an_ordered_column_warn_and_take_the_most_frequent_level():
    """As for unordered columns (docs/missing_and_categorical.md, Prediction): a warning naming the
    column, and the most frequent training level (it used to be the median code, silently)."""
    rng = np.random.default_rng(0)
    lv = ["XS", "S", "M", "L", "XL"]
    s = rng.choice(lv, 200, p=[0.1, 0.1, 0.1, 0.1, 0.6])
    y = np.array([lv.index(v) for v in s], float)
    for ordered in (False, True):
        X = pd.DataFrame({"size": pd.Categorical(s, categories=lv, ordered=ordered)})
        reg = BayesianTreeRegressor(**SMALL).fit(X, y)
        with pytest.warns(UserWarning, match="'size'.*not seen in fit.*most frequent level"):
            got = reg.predict(pd.DataFrame({"size": ["XXL", "tiny"]}))
        np.testing.assert_allclose(got, reg.predict(pd.DataFrame({"size": pd.Categorical(["XL", "XL"], categories=lv,
                                                                                           ordered=ordered)})))


def test_boolean_levels_are_found_from_their_text():
    """A category column of booleans read back as text ('True' / 'False', as a CSV read with
    dtype=str spells them) predicts as the booleans do, without an unseen-level warning."""
    rng = np.random.default_rng(0)
    b = rng.random(200) > 0.5
    X = pd.DataFrame({"flag": pd.Categorical(b)})
    clf = BayesianTreeClassifier(**SMALL).fit(X, b.astype(int))
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        got = clf.predict_proba(pd.DataFrame({"flag": X.flag.iloc[:6].astype(str)}))
    np.testing.assert_array_equal(got, clf.predict_proba(X.iloc[:6]))
