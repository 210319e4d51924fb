"""Text columns whose cells read as numbers (pandas ``string`` / ``object`` columns): codes written with a leading
zero (``"01"``, ``"02139"``) are categorical labels, other numbers written as text are used as numbers, each with
a warning that says which and how to choose the other; ``categorical_features`` given explicitly decides alone."""
import warnings

import numpy as np
import pandas as pd
import pytest

from torchtree import BayesianTreeRegressor
from torchtree.model.levels import text_numbers


def _fit(X, y, **kw):
    with warnings.catch_warnings(record=True) as w:
        warnings.simplefilter("always")
        m = BayesianTreeRegressor(verbose=0, random_state=0, n_particles=100, **kw).fit(X, y)
    return m, [str(x.message) for x in w]


@pytest.mark.parametrize("dtype", ["string", object])
def test_codes_with_leading_zeros_are_labels(dtype):
    """'1', '01' and '001' are three codes (as numbers all three would be 1.0, and the column useless)."""
    r = np.random.default_rng(0)
    code = r.choice(["1", "01", "001"], 300)
    y = (code == "01") * 3.0 + r.normal(scale=0.1, size=300)
    X = pd.DataFrame({"code": pd.Series(code, dtype=dtype), "x": r.normal(size=300)})
    m, msgs = _fit(X, y)
    assert any("leading zero ('" in s and "categorical" in s for s in msgs), msgs
    as_category, _ = _fit(X.astype({"code": "category"}), y)
    np.testing.assert_allclose(m.predict(X), as_category.predict(X.astype({"code": "category"})))
    assert m.score(X, y) > 0.9
    with warnings.catch_warnings(record=True):  # an unseen code is an unseen level (a warning), not an error
        warnings.simplefilter("always")
        assert np.isfinite(m.predict(X.head(3).assign(code="A7"))).all()


def test_numbers_written_as_text_are_numbers_with_a_warning():
    r = np.random.default_rng(1)
    v = r.normal(size=300).round(2)
    y = 2 * v + r.normal(scale=0.1, size=300)
    m_text, msgs = _fit(pd.DataFrame({"v": pd.Series(v.astype(str), dtype="string")}), y)
    m_num, msgs_num = _fit(pd.DataFrame({"v": v}), y)
    assert any("written as text" in s and "used as numbers" in s for s in msgs), msgs
    assert not any("written as text" in s for s in msgs_num)
    np.testing.assert_array_equal(m_text.predict(pd.DataFrame({"v": v})), m_num.predict(pd.DataFrame({"v": v})))


def test_declared_columns_are_taken_as_declared():
    """With categorical_features given, a column of codes not named there is numbers (as asked), without the
    leading-zero rule."""
    r = np.random.default_rng(2)
    code = r.choice(["1", "01", "2"], 200)
    X = pd.DataFrame({"code": code, "x": r.normal(size=200)})
    m, msgs = _fit(X, r.normal(size=200), categorical_features=["x"])
    assert not any("leading zero" in s for s in msgs)
    q = pd.DataFrame({"code": ["1", "01", "001"], "x": [0.0, 0.0, 0.0]})
    p = m.predict(q)
    assert p[0] == p[1] == p[2]  # numbers: all three are 1.0


@pytest.mark.parametrize("cells, want", [(["1", "2.5", "-3"], (None, "1")), (["0.5", "0", "-0.25"], (None, "0.5")),
                                         (["7", "007"], ("007", "7")), (["-01", "2"], ("-01", "-01")),
                                         ([1.0, 2.0], (None, None)), ([1.0, " 02"], (" 02", " 02")),
                                         (["NA", "3"], (None, "3"))])
def test_text_numbers(cells, want):
    assert text_numbers(np.array(cells, dtype=object)) == want
