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


def test_column_names_of_mixed_types_are_refused_as_in_scikit_learn():
    """{'a': ..., 1: ...} could be matched neither by name nor safely by position (it used to fit
    without feature_names_in_, and reordered columns then swapped silently)."""
    rng = np.random.default_rng(0)
    X = pd.DataFrame({"a": rng.normal(size=50), 1: rng.normal(size=50)})
    with pytest.raises(TypeError, match=r"mix types \['int', 'str'\].*astype\(str\)"):
        BayesianTreeClassifier(**SMALL).fit(X, (X["a"] > 0).astype(int))
    clf = BayesianTreeClassifier(**SMALL).fit(X.to_numpy(), (X["a"] > 0).astype(int))
    with pytest.raises(TypeError, match="mix types"):
        clf.predict(X)


@pytest.mark.parametrize("method,kw", [("smc", dict(n_particles=30)),
                                       ("bart", dict(n_trees=10, n_chains=2, n_samples=30, n_warmup=30))])
def test_a_constant_target_is_fitted_on_its_own_scale(method, kw):
    """y == c calibrates no spread; the priors take |c| as the scale, so y == 5e-6 gives the fit of
    y == 5 times 1e-6 (it gave an absolute floor of 1: BART predicted 350 times the constant)."""
    X = pd.DataFrame({"x": np.random.default_rng(0).normal(size=120)})
    fits = [BayesianTreeRegressor(method=method, random_state=0, hyper="fixed", **kw).fit(X, np.full(120, c))
            for c in (5.0, 5e-6)]
    big, small = (np.c_[f.predict(X.iloc[:5]), f.predict_interval(X.iloc[:5], level=0.9)] for f in fits)
    np.testing.assert_allclose(small, big * 1e-6, rtol=1e-9)
    assert np.abs(big[:, 0] - 5.0).max() < 0.05 and (big[:, 2] - big[:, 1]).max() < 2.0


def test_targets_too_fine_and_columns_too_wide_for_float64_are_refused_with_their_cause():
    rng = np.random.default_rng(0)
    x = rng.normal(size=60)
    with pytest.raises(ValueError, match="y varies too finely.*multiply it"):
        BayesianTreeRegressor(**SMALL).fit(x[:, None], 3e-200 * x)
    BayesianTreeRegressor(**SMALL).fit(x[:, None], 3e-100 * x)  # fine: its squares are normal numbers
    with pytest.raises(ValueError, match="y is too small.*its square underflows"):  # a constant: its square is the scale
        BayesianTreeRegressor(**SMALL).fit(x[:, None], np.full(60, 1e-170))
    wide = pd.DataFrame({"a": np.r_[-1.5e308, np.linspace(-1e307, 1e307, 58), 1.5e308]})
    with pytest.raises(ValueError, match=r"column 0 \('a'\) spans more than float64"):
        BayesianTreeClassifier(**SMALL).fit(wide, (x > 0).astype(int))
    # 0 and 1.7e308 span a finite range, but the missing values' stand-in 1.7e308 + delta overflows
    near = pd.DataFrame({"a": np.r_[np.zeros(29), np.full(30, 1.7e308), np.nan]})
    with pytest.raises(ValueError, match=r"column 0 \('a'\) spans more than float64 can hold with its missing"):
        BayesianTreeClassifier(**SMALL).fit(near, (x > 0).astype(int))


@pytest.mark.parametrize("y", [np.array([0, 1, 0, np.nan, 1, 0] * 5), pd.array([0, 1, 0, None, 1, 0] * 5, dtype="Int64"),
                               np.array(["a", "b", "a", None, "b", "a"] * 5, dtype=object)], ids=["float", "Int64", "object"])
def test_a_missing_label_is_named_with_its_row_whatever_the_dtype(y):
    X = np.random.default_rng(0).normal(size=(30, 2))
    with pytest.raises(ValueError, match=r"y has 5 missing label\(s\) \(None / NaN\); the first is at row 3"):
        BayesianTreeClassifier(**SMALL).fit(X, y)


def test_score_is_computed_in_units_of_the_targets_spread():
    """R^2 is scale-free: it used to be 1.0 for any fit of targets near 1e-170 (the squares underflowed)."""
    rng = np.random.default_rng(0)
    x = rng.normal(size=100)
    y = x + rng.normal(size=100)
    reg = BayesianTreeRegressor(**SMALL).fit(x[:, None], y)
    r2 = reg.score(x[:, None], y)
    assert 0.3 < r2 < 0.9
    reg_small = BayesianTreeRegressor(**SMALL)  # the same predictions in units of 1e-170
    reg_small.__dict__.update(reg.__dict__)
    reg_small.predict = lambda X: reg.predict(X) * 1e-170
    assert abs(reg_small.score(x[:, None], y * 1e-170) - r2) < 1e-9


def test_dot_labels_escape_quotes_and_backslashes_of_names_and_levels():
    """A column 'weight "kg"' and a level '5" screen' used to end the DOT string early."""
    import re
    rng = np.random.default_rng(0)
    x = rng.normal(size=200)
    X = pd.DataFrame({'weight "kg"': x, "grade": rng.choice(['5" screen', "a\\b", "plain"], 200)})
    y = ((x > 0) ^ (X["grade"] == '5" screen')).astype(int)
    dot = BayesianTreeClassifier(**SMALL).fit(X, y).posterior_.to_dot()
    labels = [ln for ln in dot.splitlines() if "label=" in ln]
    quoted = re.compile(r'^\s*n\d+( -> n\d+)? \[label="(?:[^"\\]|\\.)*"(, style=rounded)?\];$')
    assert labels and all(quoted.match(ln) for ln in labels), [ln for ln in labels if not quoted.match(ln)]
    assert 'weight \\"kg\\"' in dot
