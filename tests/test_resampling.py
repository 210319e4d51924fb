"""Tests for torchtree.core.resampling.

Statistical tests are seeded (so they are deterministic); their tolerances are
stated next to them together with the false-failure rate they would have for
an unseeded run.
"""
from __future__ import annotations

import math

import numpy as np
import pytest
import torch
from scipy import stats

from torchtree.core import resampling as rs
from torchtree.core.resampling import (
    RESAMPLERS,
    ancestors_from_ncopies,
    cumulative_weights,
    ess,
    get_resampler,
    ncopies,
    ncopies_from_cdf,
    normalize,
    stable_ancestors,
)

SCHEMES = sorted(RESAMPLERS)
W7 = torch.tensor([0.02, 0.05, 0.10, 0.13, 0.20, 0.20, 0.30], dtype=torch.float64)
REPS = 4000


def _gen(seed: int) -> torch.Generator:
    return torch.Generator().manual_seed(seed)


def _counts(scheme: str, w: torch.Tensor, n: int, reps: int, seed: int) -> torch.Tensor:
    """[reps, N] copy counts from ``reps`` independent resamplings."""
    fn = RESAMPLERS[scheme]
    g = _gen(seed)
    lw = torch.log(w)
    return torch.stack([ncopies(fn(g, lw, n), w.numel()) for _ in range(reps)])


@pytest.fixture(scope="module")
def counts7():
    return {s: _counts(s, W7, 7, REPS, seed=1234 + i) for i, s in enumerate(SCHEMES)}


# ----------------------------------------------------------------------------
# basic contract
# ----------------------------------------------------------------------------


@pytest.mark.parametrize("scheme", SCHEMES)
@pytest.mark.parametrize("n", [0, 1, 7, 11, 50])
def test_output_contract(scheme, n):
    anc = RESAMPLERS[scheme](_gen(0), torch.log(W7), n)
    assert anc.dtype == torch.long
    assert anc.shape == (n,)
    if n:
        assert bool((anc[1:] >= anc[:-1]).all()), "ancestors must be sorted ascending"
        assert 0 <= int(anc.min()) and int(anc.max()) < 7
    assert int(ncopies(anc, 7).sum()) == n


@pytest.mark.parametrize("scheme", SCHEMES)
def test_reproducible_and_no_global_rng(scheme):
    fn = get_resampler(scheme)
    lw = torch.log(W7)
    torch.manual_seed(99)
    state = torch.get_rng_state()
    a = fn(_gen(5), lw, 20)
    b = fn(_gen(5), lw, 20)
    c = fn(_gen(6), lw, 20)
    assert torch.equal(torch.get_rng_state(), state), "global RNG must not be touched"
    assert torch.equal(a, b)
    # Different seeds differ for at least one of a few tries (systematic draws one u).
    assert not torch.equal(a, c) or not torch.equal(fn(_gen(7), lw, 20), a)
    # generator=None works and is still valid output
    d = fn(None, lw, 20)
    assert d.shape == (20,) and torch.equal(torch.get_rng_state(), state)


@pytest.mark.parametrize("scheme", SCHEMES)
def test_dtype_and_scale_invariance(scheme):
    """float32 input is converted; adding a constant to all log-weights changes nothing."""
    fn = RESAMPLERS[scheme]
    lw64 = torch.log(W7)
    lw32 = lw64.to(torch.float32)
    a = fn(_gen(3), lw32, 30)
    b = fn(_gen(3), lw32.to(torch.float64), 30)
    assert torch.equal(a, b)
    big = fn(_gen(3), lw64 + 1e4, 30)
    base = fn(_gen(3), lw64, 30)
    # exp(lw - max) is exact up to round-off in the shift; counts may differ only
    # if a point lands within ~1e-12 of a cdf boundary, which these seeds do not.
    assert torch.equal(big, base)


@pytest.mark.parametrize("scheme", SCHEMES)
def test_zero_weight_particles_never_selected(scheme):
    lw = torch.tensor([-math.inf, 0.0, -math.inf, 1.0, -math.inf, -2.0, -math.inf])
    fn = RESAMPLERS[scheme]
    g = _gen(11)
    zero = torch.isneginf(lw)
    for _ in range(300):
        c = ncopies(fn(g, lw, 9), 7)
        assert int(c[zero].sum()) == 0


@pytest.mark.parametrize("scheme", SCHEMES)
def test_one_hot_weights(scheme):
    lw = torch.full((5,), -math.inf)
    lw[3] = -7.0
    anc = RESAMPLERS[scheme](_gen(0), lw, 8)
    assert torch.equal(anc, torch.full((8,), 3))


@pytest.mark.parametrize("scheme", SCHEMES)
def test_posinf_share_mass(scheme):
    lw = torch.tensor([0.0, math.inf, 3.0, math.inf, -math.inf])
    c = ncopies(RESAMPLERS[scheme](_gen(2), lw, 40), 5)
    assert int(c[[0, 2, 4]].sum()) == 0
    if scheme != "multinomial":
        assert c.tolist() == [0, 20, 0, 20, 0]
    assert torch.allclose(normalize(lw).exp(), torch.tensor([0, 0.5, 0, 0.5, 0], dtype=torch.float64))


# ----------------------------------------------------------------------------
# unbiasedness and per-scheme properties
# ----------------------------------------------------------------------------


@pytest.mark.parametrize("scheme", SCHEMES)
def test_unbiased(scheme, counts7):
    """E[ncopies] = N w. Tolerance: |z| < 5 with z from the empirical std / sqrt(REPS).

    7 particles x 4 schemes = 28 z-tests; unseeded false-failure rate about
    28 * 5.7e-7 ~ 2e-5 (normal approximation).
    """
    c = counts7[scheme].to(torch.float64)
    mean = c.mean(0)
    sd = c.std(0)
    target = 7 * W7
    for i in range(7):
        if sd[i] == 0:
            assert mean[i] == target[i]
        else:
            z = (mean[i] - target[i]) / (sd[i] / math.sqrt(REPS))
            assert abs(float(z)) < 5.0, f"{scheme}: particle {i} z={float(z):.2f}"


def test_systematic_floor_ceil(counts7):
    """Systematic: every particle gets floor(N w) or ceil(N w) copies, every time."""
    c = counts7["systematic"]
    nw = 7 * W7
    assert bool((c >= torch.floor(nw)).all() and (c <= torch.ceil(nw)).all())
    assert float((c - nw).abs().max()) < 1.0


def test_stratified_bounds(counts7):
    """Stratified: |ncopies - N w| < 2 (each stratum holds exactly one point)."""
    c = counts7["stratified"]
    assert float((c - 7 * W7).abs().max()) < 2.0
    # ... and it does vary more than systematic on these weights
    assert float((c - 7 * W7).abs().max()) >= 1.0


def test_residual_deterministic_part(counts7):
    """Residual: at least floor(N w) copies, and the random part is the remainder."""
    c = counts7["residual"]
    floor = torch.floor(7 * W7).to(torch.long)
    assert bool((c >= floor).all())
    rest = c - floor
    assert bool((rest.sum(1) == 7 - int(floor.sum())).all())


def test_residual_exact_when_nw_integer():
    w = torch.tensor([2.0, 1.0, 0.0, 4.0], dtype=torch.float64) / 7
    for seed in range(20):
        c = ncopies(rs.residual(_gen(seed), torch.log(w), 7), 4)
        assert c.tolist() == [2, 1, 0, 4]


def test_residual_remainder_unbiased():
    """With n=10 and w=[.25,.25,.5]: floors [2,2,5], remainder 1 copy w.p. (.5,.5,0).

    Over 2000 reps, P(extra copy to particle 0) = 0.5; tolerance 5 sigma
    (sigma = sqrt(.25/2000)), unseeded false-failure rate ~ 6e-7.
    """
    reps = 2000
    w = torch.tensor([0.25, 0.25, 0.5], dtype=torch.float64)
    c = _counts("residual", w, 10, reps, seed=77)
    assert bool((c[:, 2] == 5).all())
    assert bool(((c[:, 0] == 2) | (c[:, 0] == 3)).all())
    p0 = float((c[:, 0] == 3).double().mean())
    assert abs(p0 - 0.5) < 5 * math.sqrt(0.25 / reps)


def test_multinomial_binomial_marginal(counts7):
    """Copies of particle 0 under multinomial ~ Binomial(7, w0).

    Also particle 6 (the heaviest). Pearson chi-square with bins pooled so every
    expected count is >= 5; alpha = 1e-3 per test (unseeded false-failure
    rate ~ 2e-3 for both together).
    """
    c = counts7["multinomial"]
    for i in (0, 6):
        x = c[:, i].numpy()
        pmf = stats.binom.pmf(np.arange(8), 7, float(W7[i]))
        obs = np.bincount(x, minlength=8).astype(float)
        exp = pmf * REPS
        # Pool the upper tail into the last bin with expected count >= 5.
        k = int(np.max(np.nonzero(exp >= 5)[0]))
        obs_p = np.concatenate([obs[:k], [obs[k:].sum()]])
        exp_p = np.concatenate([exp[:k], [exp[k:].sum()]])
        chi2, p = stats.chisquare(obs_p, exp_p)
        assert p > 1e-3, f"particle {i}: chi2={chi2:.2f} p={p:.2e}"


def test_multinomial_variance_matches(counts7):
    """Var of copies under multinomial is N w (1 - w); systematic's is smaller."""
    var = counts7["multinomial"].to(torch.float64).var(0)
    target = 7 * W7 * (1 - W7)
    # Relative sd of a sample variance is ~ sqrt(2/REPS) ~ 2.2% for near-normal
    # counts; 20% is a loose bound that still catches i.i.d.-vs-systematic mixups.
    assert torch.allclose(var, target, rtol=0.2)
    assert bool((counts7["systematic"].to(torch.float64).var(0) < target).all())


# ----------------------------------------------------------------------------
# ncopies conversions and the paper-002 route
# ----------------------------------------------------------------------------


def test_ncopies_roundtrip():
    anc = rs.multinomial(_gen(0), torch.log(W7), 30)
    c = ncopies(anc, 7)
    assert c.shape == (7,) and int(c.sum()) == 30
    assert torch.equal(ancestors_from_ncopies(c), anc)
    assert torch.equal(ancestors_from_ncopies(c, total=30), anc)
    assert ncopies(torch.tensor([], dtype=torch.long), 4).tolist() == [0, 0, 0, 0]


def test_cumulative_weights():
    lw = torch.tensor([0.0, -math.inf, 1.0, -math.inf], dtype=torch.float32)
    c = cumulative_weights(lw)
    assert c.dtype == torch.float64
    assert c[-1].item() == 1.0 and c[2].item() == 1.0
    assert bool((c[1:] >= c[:-1]).all())
    assert c[0].item() == c[1].item()


@pytest.mark.parametrize("n", [7, 13])
def test_ncopies_from_cdf_matches_systematic(n):
    lw = torch.log(W7)
    cdf = cumulative_weights(lw)
    for seed in range(50):
        u = torch.rand(1, generator=_gen(seed), dtype=torch.float64)
        ref = ncopies(rs.systematic(_gen(seed), lw, n), 7)
        full = ncopies_from_cdf(cdf, u, n)
        assert torch.equal(full, ref), (seed, full, ref)
        # Three "ranks" holding slices of the cdf, each given the previous value.
        parts = [
            ncopies_from_cdf(cdf[0:2], u, n),
            ncopies_from_cdf(cdf[2:5], u, n, prev=cdf[1]),
            ncopies_from_cdf(cdf[5:7], u, n, prev=cdf[4]),
        ]
        assert torch.equal(torch.cat(parts), ref)


def test_ncopies_from_cdf_paper_eq10():
    """Eq. 10: 0 <= ncopies <= n and sum == n, for random weights and u at the edges."""
    g = _gen(8)
    for _ in range(100):
        lw = torch.randn(33, generator=g, dtype=torch.float64) * 3
        cdf = cumulative_weights(lw)
        for u in (0.0, float(torch.rand(1, generator=g)), 1.0 - 2.0**-53):
            c = ncopies_from_cdf(cdf, u, 33)
            assert int(c.sum()) == 33 and int(c.min()) >= 0 and int(c.max()) <= 33


def test_ncopies_from_cdf_robust_to_last_value_above_one():
    cdf = torch.tensor([0.25, 0.5, 1.0 + 1e-15], dtype=torch.float64)
    c = ncopies_from_cdf(cdf, 1e-17, 4)
    assert int(c.sum()) == 4 and int(c.min()) >= 0


# ----------------------------------------------------------------------------
# ESS and normalize
# ----------------------------------------------------------------------------


def test_ess_equal_and_one_hot():
    assert ess(torch.zeros(10)).item() == pytest.approx(10.0, rel=1e-12)
    assert ess(torch.full((10,), -1234.5)).item() == pytest.approx(10.0, rel=1e-12)
    oh = torch.full((6,), -math.inf)
    oh[4] = 3.0
    assert ess(oh).item() == pytest.approx(1.0, rel=1e-12)
    e = ess(torch.tensor([0.0, 0.0, -math.inf, -math.inf]))
    assert e.dtype == torch.float64 and e.dim() == 0
    assert e.item() == pytest.approx(2.0, rel=1e-12)


def test_ess_matches_direct_formula():
    w = W7
    direct = 1.0 / float((w**2).sum())
    assert ess(torch.log(w) + 500.0).item() == pytest.approx(direct, rel=1e-12)
    # Huge spread stays finite and correct (w would underflow naively in float32).
    lw = torch.tensor([0.0, -800.0, -1600.0], dtype=torch.float32)
    assert ess(lw).item() == pytest.approx(1.0, rel=1e-12)


def test_normalize():
    lw = torch.tensor([1.0, 2.0, 3.0], dtype=torch.float16)
    out = normalize(lw)
    assert out.dtype == torch.float64
    assert torch.logsumexp(out, 0).item() == pytest.approx(0.0, abs=1e-14)
    assert torch.allclose(out.exp(), torch.softmax(lw.double(), 0))


# ----------------------------------------------------------------------------
# stable_ancestors
# ----------------------------------------------------------------------------


def test_stable_ancestors_example():
    anc = torch.tensor([0, 0, 2, 2, 3, 3, 3, 3, 3, 3])
    out = stable_ancestors(anc, 10)
    assert out.tolist() == [0, 0, 2, 3, 2, 3, 3, 3, 3, 3]


@pytest.mark.parametrize("scheme", SCHEMES)
def test_stable_ancestors_properties(scheme):
    g = _gen(21)
    N = 64
    for _ in range(50):
        lw = torch.randn(N, generator=g, dtype=torch.float64) * 2
        anc = RESAMPLERS[scheme](g, lw, N)
        out = stable_ancestors(anc, N)
        assert torch.equal(torch.sort(out).values, anc), "must be a permutation of the multiset"
        c = ncopies(anc, N)
        survivors = torch.nonzero(c >= 1).flatten()
        assert torch.equal(out[survivors], survivors), "survivors keep their slot"
        # Only dead slots receive a different particle.
        moved = torch.nonzero(out != torch.arange(N)).flatten()
        assert bool((c[moved] == 0).all())


def test_stable_ancestors_identity_and_errors():
    assert torch.equal(stable_ancestors(torch.arange(5), 5), torch.arange(5))
    # Unsorted input is accepted.
    assert stable_ancestors(torch.tensor([3, 3, 0, 0]), 4).tolist() == [0, 0, 3, 3]
    with pytest.raises(ValueError, match="one ancestor per slot"):
        stable_ancestors(torch.tensor([0, 1, 1]), 4)


# ----------------------------------------------------------------------------
# errors and registry
# ----------------------------------------------------------------------------


@pytest.mark.parametrize("scheme", SCHEMES)
def test_invalid_weights(scheme):
    fn = RESAMPLERS[scheme]
    with pytest.raises(ValueError, match="NaN"):
        fn(_gen(0), torch.tensor([0.0, math.nan, 1.0]), 3)
    with pytest.raises(ValueError, match="all particle weights are zero"):
        fn(_gen(0), torch.full((4,), -math.inf), 3)
    with pytest.raises(ValueError, match="1-D"):
        fn(_gen(0), torch.zeros(2, 3), 3)
    with pytest.raises(ValueError, match="empty"):
        fn(_gen(0), torch.zeros(0), 3)
    with pytest.raises(ValueError, match="n must be >= 0"):
        fn(_gen(0), torch.zeros(3), -1)
    with pytest.raises(TypeError):
        fn(_gen(0), torch.zeros(3, dtype=torch.long), 3)


def test_ess_and_normalize_errors():
    with pytest.raises(ValueError, match="all particle weights are zero"):
        ess(torch.full((3,), -math.inf))
    with pytest.raises(ValueError, match="NaN"):
        normalize(torch.tensor([math.nan]))


def test_get_resampler():
    for name, fn in RESAMPLERS.items():
        assert get_resampler(name) is fn
        assert get_resampler(name.upper()) is fn
    assert set(RESAMPLERS) == {"multinomial", "systematic", "stratified", "residual"}
    custom = lambda g, lw, n: torch.zeros(n, dtype=torch.long)  # noqa: E731
    assert get_resampler(custom) is custom
    with pytest.raises(ValueError) as ei:
        get_resampler("bootstrap")
    msg = str(ei.value)
    assert "bootstrap" in msg
    for name in RESAMPLERS:
        assert name in msg


# ----------------------------------------------------------------------------
# CUDA
# ----------------------------------------------------------------------------


@pytest.mark.cuda
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
@pytest.mark.parametrize("scheme", SCHEMES)
def test_cuda_matches_cpu(scheme):
    """A CPU generator gives the same ancestors for CPU and CUDA weights."""
    fn = RESAMPLERS[scheme]
    g = _gen(0)
    lw = torch.randn(1000, generator=g, dtype=torch.float64)
    a = fn(_gen(4), lw, 1000)
    b = fn(_gen(4), lw.cuda(), 1000)
    assert b.device.type == "cuda"
    assert torch.equal(a, b.cpu())
    gc = torch.Generator(device="cuda").manual_seed(4)
    c = fn(gc, lw.cuda(), 1000)
    assert c.device.type == "cuda" and int(ncopies(c, 1000).sum()) == 1000
    out = stable_ancestors(b, 1000)
    assert torch.equal(out.sort().values, b)
    assert ess(lw.cuda()).device.type == "cuda"
