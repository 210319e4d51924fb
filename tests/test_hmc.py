"""Batched HMC: leapfrog properties, frozen coordinates, adaptation pieces, Gaussian moments."""
import math

import pytest
import torch

from torchtree.steps.adaptation import (
    dual_averaging_init,
    dual_averaging_update,
    find_reasonable_step_size,
    sharpness_schedule,
    warmup_windows,
    welford_init,
    welford_update,
    welford_variance,
)
from torchtree.samplers.nuts.chains import draw, make_kernel, warmup
from torchtree.steps.hmc import hmc_init, kinetic_energy, leapfrog, sample_momentum


MEAN = torch.tensor([0.0, 1.0, -2.0, 3.0], dtype=torch.float64)
SD = torch.tensor([0.1, 1.0, 3.0, 0.5], dtype=torch.float64)


def gaussian(x, rows=None):
    """Potential and gradient of independent N(MEAN, SD^2), batched [B, P]."""
    z = (x - MEAN) / SD
    return 0.5 * (z * z).sum(-1), z / SD


def test_leapfrog_is_reversible_and_nearly_conserves_energy():
    g = torch.Generator().manual_seed(0)
    B = 6
    inv_mass = torch.rand(B, 4, generator=g, dtype=torch.float64) + 0.5
    state = hmc_init(MEAN + torch.randn(B, 4, generator=g, dtype=torch.float64), gaussian)
    p0 = sample_momentum(inv_mass, g)
    eps = torch.full((B,), 0.002, dtype=torch.float64)
    H0 = state.potential + kinetic_energy(p0, inv_mass)
    s, p = state, p0
    for _ in range(20):
        s, p = leapfrog(s, p, eps, inv_mass, gaussian)
    H1 = s.potential + kinetic_energy(p, inv_mass)
    assert ((H1 - H0).abs() / H0).max() < 1e-3  # O(eps^2) energy error, stiffest scale 0.1
    for _ in range(20):  # integrate back with the negated step size
        s, p = leapfrog(s, p, -eps, inv_mass, gaussian)
    assert torch.allclose(s.position, state.position, atol=1e-10)
    assert torch.allclose(p, p0, atol=1e-10)


def test_zero_inverse_mass_freezes_coordinates():
    g = torch.Generator().manual_seed(1)
    inv_mass = torch.ones(3, 4, dtype=torch.float64)
    inv_mass[:, 2] = 0
    p = sample_momentum(inv_mass, g)
    assert (p[:, 2] == 0).all()
    state = hmc_init(torch.randn(3, 4, generator=g, dtype=torch.float64), gaussian)
    s, _ = leapfrog(state, p, torch.full((3,), 0.3, dtype=torch.float64), inv_mass, gaussian)
    assert torch.equal(s.position[:, 2], state.position[:, 2])


def test_warmup_windows_follow_stan():
    assert warmup_windows(1000) == [(75, 100), (100, 150), (150, 250), (250, 450), (450, 950)]
    w = warmup_windows(100)  # buffers rescaled to 15 / 75 / 10 %
    assert w[0][0] == 15 and w[-1][1] == 90
    assert warmup_windows(10) == []
    h = sharpness_schedule(1000, 0.1, 0.01)
    assert h[0] == pytest.approx(0.1) and h[949] == pytest.approx(0.01) and h[-1] == pytest.approx(0.01)
    assert all(a >= b for a, b in zip(h, h[1:]))


def test_welford_and_dual_averaging():
    g = torch.Generator().manual_seed(2)
    x = torch.randn(500, 3, 2, generator=g, dtype=torch.float64) * torch.tensor([1.0, 2.0], dtype=torch.float64)
    st = welford_init(x[0])
    for i in range(500):
        st = welford_update(st, x[i])
    assert torch.allclose(st.mean, x.mean(0), atol=1e-12)
    assert torch.allclose(welford_variance(st, regularize=False), x.var(0), atol=1e-12)
    # dual averaging on a synthetic acceptance curve a(eps) = exp(-eps) finds a(eps) = 0.8
    da = dual_averaging_init(torch.full((3,), 1.0, dtype=torch.float64))
    for _ in range(2000):
        da = dual_averaging_update(da, torch.exp(-torch.exp(da.log_step)), 0.8)
    assert torch.allclose(torch.exp(-torch.exp(da.log_step_avg)), torch.full((3,), 0.8, dtype=torch.float64), atol=0.02)


def test_find_reasonable_step_size_scales_with_target():
    g = torch.Generator().manual_seed(3)
    state = hmc_init(MEAN.expand(4, 4).clone(), gaussian)
    inv_mass = (SD * SD).expand(4, 4).clone()  # well-conditioned after preconditioning
    eps = find_reasonable_step_size(state, gaussian, inv_mass, torch.full((4,), 1e-3, dtype=torch.float64), g)
    assert (eps > 0.1).all() and (eps < 10).all()


def _moment_check(positions):
    """Per-chain means/variances -> between-chain standard errors; positions [S, C, P]."""
    cm = positions.mean(0)
    cv = positions.var(0)
    C = positions.shape[1]
    mean, se_mean = cm.mean(0), cm.std(0) / math.sqrt(C)
    var, se_var = cv.mean(0), cv.std(0) / math.sqrt(C)
    return mean, se_mean, var, se_var


def test_hmc_gaussian_moments():
    g = torch.Generator().manual_seed(4)
    k = make_kernel("hmc", n_leapfrog=12)
    init = torch.randn(32, 4, generator=g, dtype=torch.float64)
    ch, _ = warmup(k, gaussian, init, 300, generator=g)
    _, tr = draw(k, gaussian, ch, 400, generator=g)
    mean, se_mean, var, se_var = _moment_check(tr.positions)
    # 5 between-chain standard errors (plus 3% for the small bias of per-chain variances)
    assert ((mean - MEAN).abs() < 5 * se_mean + 1e-3 * SD).all(), (mean, se_mean)
    assert ((var - SD**2).abs() < 5 * se_var + 0.03 * SD**2).all(), (var, se_var)
    assert 0.6 < float(tr.accept_prob.mean()) < 0.99
