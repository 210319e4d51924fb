"""The SMC engine (torchtree.core.smc): its weights, evidence, ESS and resampling against exact formulas.

Each test computes the expected value independently (plain log-sum-exp, the ESS formula, the inverse
CDF by hand); tolerances are stated where floating point enters.
"""
from __future__ import annotations

import math

import torch

from torchtree.core.resampling import get_resampler
from torchtree.core.smc import (canonical_ancestors, conditional_ancestors, exact_weights_step, global_ncopies,
                                island_ancestors, island_weights_step, islands_ess, next_temperature)
from torchtree.distributed import LocalBackend
from torchtree.distributed.exact import global_stats


def _ess(lw: torch.Tensor) -> float:
    w = torch.exp(lw - lw.max())
    return float(w.sum() ** 2 / (w ** 2).sum())


def test_island_step_adds_each_islands_log_mean_weight_to_its_evidence():
    g = torch.Generator().manual_seed(0)
    I, m = 3, 5
    logw = torch.randn(I * m, generator=g, dtype=torch.float64)
    incr = torch.randn(I * m, generator=g, dtype=torch.float64)
    logz = torch.tensor([0.5, -1.0, 2.0], dtype=torch.float64)
    new_w, new_z, ess = island_weights_step(logw, logz, incr, I, m)
    for i in range(I):
        sl = slice(i * m, (i + 1) * m)
        W = torch.softmax(logw[sl], 0)  # normalised previous weights
        expect = float(logz[i]) + math.log(float((W * torch.exp(incr[sl])).sum()))
        assert abs(float(new_z[i]) - expect) < 1e-12
        assert abs(float(ess[i]) - _ess(logw[sl] + incr[sl])) < 1e-9
    assert torch.equal(new_w, logw + incr)
    assert torch.allclose(islands_ess(new_w, I), ess)


def test_exact_step_is_the_float_step_of_one_island():
    g = torch.Generator().manual_seed(1)
    P = 64
    logw = torch.randn(P, generator=g, dtype=torch.float64)
    new = logw + torch.randn(P, generator=g, dtype=torch.float64)
    dlz, ess, (mx,), (sm,) = exact_weights_step(LocalBackend(), P, logw, new, maxes=[3.5], sums=[7])
    assert abs(dlz - float(torch.logsumexp(new, 0) - torch.logsumexp(logw, 0))) < 1e-12
    assert abs(ess - _ess(new)) < 1e-9 * P
    assert (mx, sm) == (3.5, 7)
    # the same numbers global_stats gives for the two rows
    (l0, l1), (_, e), _, _ = global_stats(LocalBackend(), P, torch.stack([logw, new]))
    assert dlz == l1 - l0 and ess == e


def test_island_ancestors_resample_only_the_islands_asked_for_in_canonical_order():
    g = torch.Generator().manual_seed(2)
    I, m = 3, 8
    logw = torch.randn(I * m, generator=g, dtype=torch.float64)
    keep = logw.clone()
    anc = island_ancestors(logw, [1], m, get_resampler("multinomial"), seed=5, step=3)
    assert torch.equal(anc[:m], torch.arange(m)) and torch.equal(anc[2 * m:], torch.arange(2 * m, 3 * m))
    mid = anc[m:2 * m]
    assert bool(((mid >= m) & (mid < 2 * m)).all()) and torch.equal(mid, canonical_ancestors(mid))
    assert bool((logw[m:2 * m] == 0).all()) and torch.equal(logw[:m], keep[:m])
    again = island_ancestors(keep.clone(), [1], m, get_resampler("multinomial"), seed=5, step=3)
    assert torch.equal(anc, again)  # keyed by (seed, step, island): reproducible


def test_conditional_ancestors_invert_the_cdf_and_keep_the_reference():
    lw = torch.log(torch.tensor([[0.1, 0.2, 0.3, 0.4], [0.25, 0.25, 0.25, 0.25]], dtype=torch.float64))
    u = torch.tensor([[0.99, 0.05, 0.25, 0.65], [0.9, 0.1, 0.6, 0.3]], dtype=torch.float64)
    anc = conditional_ancestors(lw, u, torch.tensor([True, False]))
    # system 0: cdf 0.1, 0.3, 0.6, 1.0 -> u 0.05 -> 0, 0.25 -> 1, 0.65 -> 3; particle 0 keeps itself
    assert anc[0].tolist() == [0, 0, 1, 3]
    assert anc[1].tolist() == [0, 1, 2, 3]  # inactive: unchanged


def test_conditional_ancestors_draw_in_proportion_to_the_weights():
    w = torch.tensor([0.1, 0.6, 0.3], dtype=torch.float64)
    n = 200_000
    g = torch.Generator().manual_seed(3)
    u = torch.rand(n, 3, generator=g, dtype=torch.float64)
    anc = conditional_ancestors(torch.log(w).expand(n, 3), u, torch.ones(n, dtype=torch.bool))
    freq = torch.bincount(anc[:, 1:].reshape(-1), minlength=3).double() / (2 * n)
    assert torch.allclose(freq, w, atol=4e-3)  # binomial standard error ~1e-3 at 4e5 draws


def test_global_ncopies_are_the_resamplers_copies_on_one_process():
    g = torch.Generator().manual_seed(4)
    logw = torch.randn(50, generator=g, dtype=torch.float64)
    for scheme in ("multinomial", "systematic", "stratified", "residual"):
        nc = global_ncopies(logw, LocalBackend(), scheme, torch.Generator().manual_seed(9), 50)
        assert int(nc.sum()) == 50 and bool((nc >= 0).all())
        if scheme in ("stratified", "residual"):
            anc = get_resampler(scheme)(torch.Generator().manual_seed(9), logw, 50)
            assert torch.equal(nc, torch.bincount(anc, minlength=50))


def test_next_temperature_jumps_to_one_when_the_ess_allows_and_else_keeps_its_floor():
    P = 100
    stats = lambda rows: global_stats(LocalBackend(), P, rows)  # noqa: E731
    flat = torch.zeros(P, dtype=torch.float64)
    assert next_temperature(stats, flat, torch.zeros(P, dtype=torch.float64), 0.2, 50.0, 4) == 1.0
    steep = torch.linspace(-400.0, 0.0, P, dtype=torch.float64)  # any power above ~0 collapses the ESS
    phi = next_temperature(stats, flat, steep, 0.0, 50.0, 4)
    assert 0.25 <= phi < 1.0  # at least an equal share of what is left (1/4)
