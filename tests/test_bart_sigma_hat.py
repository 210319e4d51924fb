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
