"""A posterior fitted on a frame takes a frame's columns by name, as the estimator does: its own
``predict`` / ``predict_interval`` / draws and the plots' partial dependence, for hard trees, BART and
soft trees. They took them by position and gave other numbers in silence (a QA pass: a frame with its
columns reordered)."""
from __future__ import annotations

import warnings

import numpy as np
import pytest

from torchtree import BayesianTreeRegressor

pd = pytest.importorskip("pandas")

CASES = [("smc", dict(n_particles=30)), ("bart", dict(n_trees=10, n_samples=20, n_warmup=10)),
         ("dcc", dict(n_iterations=1, max_seconds=None, n_warmup=15, n_samples=4, n_chains=2))]


@pytest.fixture(scope="module")
def frame():
    rng = np.random.default_rng(0)
    df = pd.DataFrame({"a": rng.uniform(size=200), "b": rng.uniform(size=200), "c": rng.uniform(size=200)})
    return df, 5 * df["a"] + 0.1 * rng.normal(size=200)


@pytest.mark.parametrize("method, kw", CASES)
def test_the_posterior_matches_a_frames_columns_by_name(frame, method, kw):
    from torchtree.plot.effects import partial_dependence

    df, y = frame
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        est = BayesianTreeRegressor(method=method, **kw).fit(df, y)
    post, rows = est.posterior_, df.iloc[:6]
    rev = rows[["c", "b", "a"]]
    np.testing.assert_array_equal(post.predict(rev), post.predict(rows))
    np.testing.assert_array_equal(post.predict(rev), est.predict(rows))
    np.testing.assert_array_equal(post.predict_interval(rev, seed=1), post.predict_interval(rows, seed=1))
    # partial dependence on "a" (the signal, 5 a): it rises with a, whichever order the frame's columns have
    rising = partial_dependence(est, rev, "a", grid=[0.1, 0.9])["mean"]
    np.testing.assert_allclose(rising, partial_dependence(est, rows, "a", grid=[0.1, 0.9])["mean"])
    assert rising[1] - rising[0] > 2.0
    with pytest.raises(ValueError, match=r"do not match the feature names seen at fit; unknown: \['d'\]"):
        post.predict(rows.rename(columns={"c": "d"}))
    np.testing.assert_array_equal(post.predict(rows.to_numpy()), post.predict(rows))  # arrays: by position
