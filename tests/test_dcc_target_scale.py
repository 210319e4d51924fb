"""DCC regression is equivariant to an affine change of the target: it samples the standardised
target ``(y - mean) / sd`` and maps every output back, so ``a y + b`` gives ``a`` times the
predictions plus ``b``, the same R^2, and log densities shifted by the log-Jacobian, for any
magnitude of ``a`` (1e-40 and 1e40 used to crash or fail)."""
from __future__ import annotations

import math

import numpy as np
import pytest
import torch

from torchtree.model.soft_data import as_soft_data, target_standardization
from torchtree.model.soft_posterior import SoftTreePosterior
from torchtree.model.soft_trees import SoftTreeHyper
from torchtree.soft import DCC

SMALL = dict(n_iterations=2, n_initial=4, n_chains=2, n_samples=4, n_warmup=8, activation_threshold=1,
             max_depth=2, n_parallel=2)


def _reg(n=40, seed=0):
    rng = np.random.default_rng(seed)
    X = rng.normal(size=(n, 2))
    return X, 2 * X[:, 0] + 0.3 * rng.normal(size=n)


def _fit(X, y, **kw):
    return DCC(**SMALL, **kw).run((X, y), seed=0)


def test_target_standardization_is_exact_under_power_of_two_scaling_and_handles_constants():
    _, y = _reg()
    z, off, sc = target_standardization(torch.as_tensor(y))
    assert abs(float(z.mean())) < 1e-14 and abs(float(z.std()) - 1) < 1e-14
    assert np.allclose(off + sc * z.numpy(), y, rtol=0, atol=1e-14)
    for k in (-500, -130, 130, 500):  # exact scaling: the same z bit for bit
        zk, offk, sck = target_standardization(torch.as_tensor(y) * 2.0 ** k)
        assert torch.equal(zk, z) and offk == off * 2.0 ** k and sck == sc * 2.0 ** k
    zc, offc, scc = target_standardization(torch.full((5,), -3e-200, dtype=torch.float64))
    assert torch.equal(zc, torch.zeros(5, dtype=torch.float64)) and offc == -3e-200 and scc == 3e-200
    z0, off0, sc0 = target_standardization(torch.zeros(3, dtype=torch.float64))
    assert torch.equal(z0, torch.zeros(3, dtype=torch.float64)) and (off0, sc0) == (0.0, 1.0)


def test_dcc_regression_outputs_map_exactly_under_an_affine_target_change():
    """Fit on y and on 1e-10 y + 3e-10 with one seed: the standardised targets agree to float64
    rounding, so the runs agree and the outputs map through y -> a y + b to 1e-6 of the target's
    scale; log_predictive differs by -log a per point and the log evidence by -N log a (1e-8)."""
    X, y = _reg()
    a, b = 1e-10, 3e-10
    p1, p2 = _fit(X, y), _fit(X, a * y + b)
    assert p2.data.standardized and abs(p2.data.y_scale / (a * p1.data.y_scale) - 1) < 1e-12
    Q = np.r_[X[:5], [[0.3, -0.2], [3.0, 1.0]]]
    sd = float(np.std(y))
    assert np.abs((p2.predict(Q) - b) / a - p1.predict(Q)).max() < 1e-6 * sd
    assert np.abs((p2.predict_interval(Q) - b) / a - p1.predict_interval(Q)).max() < 1e-6 * sd
    assert ((p2.predict_draws(Q).numpy() - b) / a - p1.predict_draws(Q).numpy()).__abs__().max() < 1e-6 * sd
    lp1, lp2 = p1.log_predictive(Q, y[:7]), p2.log_predictive(Q, a * y[:7] + b)
    assert abs(lp2 - (lp1 - math.log(a))) < 1e-8
    assert abs(p2.log_evidence - (p1.log_evidence - len(y) * math.log(a))) < 1e-8 * abs(p2.log_evidence)
    assert torch.allclose(p2.topology_log_evidence, p1.topology_log_evidence - len(y) * math.log(a), rtol=1e-12)
    assert torch.equal(p1.weights, p2.weights)
    g1, g2 = p1.gates(), p2.gates()
    for leaf in g1["leaves"]:
        assert abs((float(g2["leaves"][leaf]) - b) / a - float(g1["leaves"][leaf])) < 1e-6 * sd


@pytest.mark.parametrize("scale", [1e-40, 1e-150, 1e40, 1e150])
def test_dcc_regression_fits_targets_of_any_magnitude(scale):
    """No Cholesky failure, no float32 underflow: R^2 on the training rows equals scale 1's (1e-9)
    and the 90% intervals scale with the target."""
    X, y = _reg()
    p1, ps = _fit(X, y), _fit(X, y * scale)

    def r2(p, t):
        return 1 - np.sum((p.predict(X) - t) ** 2) / np.sum((t - t.mean()) ** 2)

    assert r2(p1, y) > 0.8
    assert abs(r2(ps, y * scale) - r2(p1, y)) < 1e-9
    assert np.allclose(ps.predict_interval(X[:3]) / scale, p1.predict_interval(X[:3]), rtol=1e-6, atol=1e-9)


def test_a_given_regression_prior_is_read_in_the_targets_units():
    """mu_mean, mu_var and sigma_scale are in y's units: the prior (a mu_mean + b, a^2 mu_var,
    a^2 sigma_scale) on a y + b gives the fit of (mu_mean, mu_var, sigma_scale) on y."""
    X, y = _reg()
    a, b = 1e-10, 3e-10
    h1 = SoftTreeHyper(mu_mean=1.0, mu_var=0.5, sigma_scale=0.2)
    h2 = SoftTreeHyper(mu_mean=a * 1.0 + b, mu_var=a * a * 0.5, sigma_scale=a * a * 0.2)
    p1, p2 = _fit(X, y, hyper=h1), _fit(X, a * y + b, hyper=h2)
    assert abs(p1.hyper.mu_var - 0.5 / p1.data.y_scale ** 2) < 1e-12
    assert abs(p2.hyper.mu_var / p1.hyper.mu_var - 1) < 1e-9
    assert np.abs((p2.predict(X[:5]) - b) / a - p1.predict(X[:5])).max() < 1e-6 * float(np.std(y))
    p0 = _fit(X, y)  # and the prior matters: the default prior gives another fit
    assert np.abs(p0.predict(X[:5]) - p1.predict(X[:5])).max() > 1e-4


def test_standardised_posterior_round_trips_through_save(tmp_path):
    X, y = _reg()
    post = _fit(X, 1e-30 * y + 7.0e-30)
    path = str(tmp_path / "post.pt")
    post.save(path)
    back = SoftTreePosterior.load(path)
    assert (back.data.y_offset, back.data.y_scale) == (post.data.y_offset, post.data.y_scale)
    assert np.array_equal(back.predict(X[:4]), post.predict(X[:4]))
    assert back.log_evidence == post.log_evidence


def test_as_soft_data_standardizes_only_regression_on_request():
    X, y = _reg()
    raw = as_soft_data(X, y)
    assert not raw.standardized and raw.target_log_jacobian == 0.0
    sd = as_soft_data(X, 1e-40 * y, standardize=True)
    assert sd.standardized and abs(float(sd.y.std()) - 1) < 1e-12
    assert abs(sd.target_log_jacobian + len(y) * math.log(sd.y_scale)) < 1e-9
    assert as_soft_data(raw, standardize=True).standardized
    cls = as_soft_data(X, (y > 0).astype(int), standardize=True)
    assert not cls.standardized
