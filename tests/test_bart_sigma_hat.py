"""BART's default ``sigma_hat`` (the residual sd of a linear fit) does not depend on where the columns sit: a
column far from 0 next to its spread (seconds since 1970 within one day) was nearly collinear with the intercept,
and the least-squares rank cut dropped it, so ``sigma_hat`` came out twice the linear fit's (a QA pass)."""
import numpy as np
import pytest

from torchtree.model.bart import BartPrior
from torchtree.model.data import Data


@pytest.mark.parametrize("shift", [lambda X: X, lambda X: np.c_[1.7e9 + 86400 * X[:, :1], X[:, 1:]],
                                   lambda X: X + 1e8, lambda X: X * 1e-9, lambda X: np.c_[X, np.full(len(X), 7.0)]])
def test_sigma_hat_is_the_linear_fits_residual_sd_wherever_the_columns_sit(shift):
    rng = np.random.default_rng(0)
    n = 500
    X = rng.uniform(size=(n, 4))
    y = 3 * X[:, 0] + 2 * X[:, 1] + 0.5 * rng.normal(size=n)
    A = np.c_[X, np.ones(n)]
    res = y - A @ np.linalg.lstsq(A, y, rcond=None)[0]
    want = np.sqrt((res ** 2).sum() / (n - 5))  # the linear fit on the columns as drawn (well conditioned)
    Z = shift(X)
    d = Data(Z, y, task="regression")
    prior = BartPrior.from_data(d.X, d.y, "regression")
    got = prior.sigma_hat * prior.scale
    dof = n - Z.shape[1] - 1  # a constant column adds a column to the count (as in a fit that keeps it)
    assert got == pytest.approx(want * np.sqrt((n - 5) / dof), rel=1e-6)


def test_an_exact_linear_target_calibrates_the_noise_prior_on_the_sd_of_y():
    """A noise-free linear target (an emulated computer model) has linear-fit residuals of rounding size. Calibrated on
    them (floored at 1e-6 of the range), the noise prior let 200 trees interpolate the training points: a 90% interval
    of width 7e-6 at x = 0.5, 4,000 half-widths from the truth (a QA pass). The sd of y, the other published choice
    (Chipman et al. 2010), is used instead, with a warning; intervals then cover the truth between training points."""
    from torchtree import BayesianTreeRegressor

    X = np.linspace(0, 1, 100)[:, None]
    y = 3 * X[:, 0] + 1
    d = Data(X, y, task="regression")
    with pytest.warns(UserWarning, match="y is a linear function of X .* calibrated on the sd of y"):
        prior = BartPrior.from_data(d.X, d.y, "regression")
    assert prior.sigma_hat == pytest.approx(float(np.std((y - 2.5) / 3, ddof=1)), rel=1e-12)
    with pytest.warns(UserWarning, match="linear function of X"):
        reg = BayesianTreeRegressor(method="bart", n_samples=50, random_state=0, verbose=0).fit(X, y)
    Xt = np.linspace(0.003, 0.997, 50)[:, None]
    lo, hi = reg.predict_interval(Xt, level=0.9).T
    truth = 3 * Xt[:, 0] + 1
    assert np.mean((lo <= truth) & (truth <= hi)) >= 0.9  # was 0.0: widths of 1e-5 around a step function
    # a given sigma_hat is taken as it is, without a warning
    import warnings
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        assert BartPrior.from_data(d.X, d.y, "regression", sigma_hat=0.03).sigma_hat == pytest.approx(0.01)
