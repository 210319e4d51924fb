"""Inputs an adversarial QA pass tried that were taken wrongly in silence or refused unclearly: bfloat16 tensors,
numpy masked arrays, 64-bit integers float64 cannot tell apart, score weights whose sum overflows, text where a
number is asked, a single class, and interval levels the Monte Carlo draws cannot resolve."""
import warnings

import numpy as np
import pandas as pd
import pytest
import torch

from torchtree import BayesianTreeClassifier, BayesianTreeRegressor


def _xy(n=40):
    rng = np.random.default_rng(0)
    X = rng.normal(size=(n, 2))
    return X, 2 * X[:, 0] + 0.3 * rng.normal(size=n)


SMALL = dict(n_particles=16, random_state=0, verbose=0)


def test_bfloat16_tensors_are_taken_as_their_float32_values():
    X, y = _xy()
    Xb = torch.tensor(X).bfloat16()
    a = BayesianTreeRegressor(**SMALL).fit(Xb, torch.tensor(y).bfloat16())
    b = BayesianTreeRegressor(**SMALL).fit(Xb.float(), torch.tensor(y).bfloat16().float())
    assert np.array_equal(a.predict(Xb), b.predict(Xb.float()))  # was: TypeError 'unsupported ScalarType BFloat16'


def test_masked_cells_of_a_masked_array_are_missing_values():
    X, y = _xy()
    m = np.ma.masked_array(X.copy(), mask=np.zeros_like(X, dtype=bool))
    m.data[:5, 0] = 1e6  # values under the mask, which np.asarray would read
    m.mask[:5, 0] = True
    Xn = X.copy()
    Xn[:5, 0] = np.nan
    a = BayesianTreeRegressor(**SMALL).fit(m, y)
    b = BayesianTreeRegressor(**SMALL).fit(Xn, y)
    assert np.array_equal(a.predict(X), b.predict(X)) and np.array_equal(a.predict(m), b.predict(Xn))
    # a masked array with nothing masked is its data
    c = BayesianTreeRegressor(**SMALL).fit(np.ma.masked_array(X), y)
    assert np.array_equal(c.predict(X), BayesianTreeRegressor(**SMALL).fit(X, y).predict(X))


@pytest.mark.parametrize("make", [
    lambda c, X: np.c_[c.astype(np.int64), np.arange(len(X))],
    lambda c, X: pd.DataFrame({"id": c.astype(np.int64), "b": X[:, 1]}),
    lambda c, X: pd.DataFrame({"id": c.astype(np.int64), "b": np.r_[np.nan, X[1:, 1]]}),  # the encoder's path
])
def test_training_integers_that_float64_merges_are_refused_naming_the_column(make):
    X, _ = _xy()
    y = X[:, 0] > 0
    col = np.where(y, 2 ** 62 + 1, 2 ** 62)  # one float64 value: no split could separate the classes
    with pytest.raises(ValueError, match=r"X column 0.* has 2 distinct integers but only 1 remain in float64"):
        BayesianTreeClassifier(**SMALL).fit(make(col, X), y)  # was: accuracy 0.725 with no word
    ok = np.where(y, 2 ** 62 + 2 ** 12, 2 ** 62)  # distinct in float64: fitted, and predicted
    clf = BayesianTreeClassifier(**SMALL).fit(make(ok, X), y)
    assert clf.score(make(ok, X), y) == 1.0
    clf.predict(make(col, X))  # at prediction merged values are only compared with the cuts: no refusal
    with pytest.raises(ValueError, match="only 1 remain in float64"):
        BayesianTreeClassifier(**SMALL).fit(np.c_[np.where(y, 2 ** 64 - 1, 2 ** 64 - 2).astype(np.uint64), np.arange(len(y), dtype=np.uint64)], y)


def test_score_weights_whose_sum_overflows_weigh_as_their_ratios():
    X, y = _xy()
    reg = BayesianTreeRegressor(**SMALL).fit(X, y)
    clf = BayesianTreeClassifier(**SMALL).fit(X, y > 0)
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # no overflow RuntimeWarning
        assert reg.score(X, y, sample_weight=[1e308] * len(y)) == pytest.approx(reg.score(X, y), rel=1e-12)
        assert clf.score(X, y > 0, sample_weight=[1e308] * len(y)) == pytest.approx(clf.score(X, y > 0), rel=1e-12)
    w = np.r_[np.full(20, 3e307), np.full(20, 1e307)]
    assert reg.score(X, y, sample_weight=w) == pytest.approx(reg.score(X, y, sample_weight=w / 1e307), rel=1e-12)


def test_text_for_a_real_setting_is_refused_as_for_an_integer_one():
    X, y = _xy()
    reg = BayesianTreeRegressor(**SMALL).fit(X, y)
    with pytest.raises(ValueError, match="level must be a real number, got '0.9'"):
        reg.predict_interval(X, level="0.9")  # was parsed and taken


def test_a_single_class_refusal_names_the_class_and_no_estimator_option():
    X, _ = _xy()
    with pytest.raises(ValueError, match=r"y has a single class \(1 class: 'only'\); a classifier needs at least two") as e:
        BayesianTreeClassifier(**SMALL).fit(X, np.full(len(X), "only"))
    assert "pass n_classes" not in str(e.value)  # the estimators have no such option


def test_a_level_the_draws_cannot_resolve_warns():
    X, y = _xy()
    reg = BayesianTreeRegressor(**SMALL).fit(X, y)
    with pytest.warns(UserWarning, match=r"level=0\.9999 leaves 0\.2 of the n_draws=4000 .* at least 200,000"):
        reg.predict_interval(X[:2], level=0.9999)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        reg.predict_interval(X[:2], level=0.99)  # 20 draws per tail: no warning


def test_a_sampler_setting_it_does_not_have_is_named_with_the_closest_one():
    """TopDownSMC(n_particle=1) said `TopDownConfig.__init__() got an unexpected keyword argument 'n_particle'`."""
    import torchtree
    from torchtree.soft import NUTS

    with pytest.raises(TypeError, match=r"TopDownSMC has no setting 'n_particle'; did you mean 'n_particles'\?"):
        torchtree.TopDownSMC(n_particle=1)
    for cls, bad in [(torchtree.MCMC, "n_chain"), (torchtree.SMCSampler, "n_iteration"), (torchtree.BART, "n_tree"),
                     (NUTS, "target_acept")]:
        with pytest.raises(TypeError, match=rf"has no setting '{bad}'; did you mean"):
            cls(**{bad: 1})
    with pytest.raises(TypeError, match=r"has no setting 'bogus' \(its settings: .*n_particles"):
        torchtree.TopDownSMC(bogus=1)
