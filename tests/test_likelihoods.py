"""Tests for torchtree.model.likelihoods: conjugate marginals against independent computations."""
from __future__ import annotations

import math

import numpy as np
import pytest
import torch

from torchtree import DirichletMultinomial, NormalInverseGamma
from torchtree.model.likelihoods import likelihood_from_config


# ------------------------------------------------------ Dirichlet-multinomial
def dm_sequential(labels, K, alpha):
    """log prod_n p(y_n | y_<n): the chain rule with the Polya-urn predictive."""
    m = np.zeros(K)
    out = 0.0
    for n, k in enumerate(labels):
        out += math.log((m[k] + alpha / K) / (n + alpha))
        m[k] += 1
    return out


@pytest.mark.parametrize("K, alpha", [(2, 1.0), (3, 5.0), (5, 0.3), (4, 100.0)])
def test_dm_log_marginal_equals_sequential_predictive(K, alpha):
    g = np.random.default_rng(K)
    lik = DirichletMultinomial(alpha)
    for _ in range(20):
        counts = g.integers(0, 12, K)
        labels = np.repeat(np.arange(K), counts)
        seq1 = dm_sequential(g.permutation(labels), K, alpha)
        seq2 = dm_sequential(g.permutation(labels), K, alpha)  # any order gives the same
        got = float(lik.log_marginal(torch.as_tensor(counts, dtype=torch.float32)))
        assert got == pytest.approx(seq1, abs=1e-9, rel=1e-12)
        assert seq1 == pytest.approx(seq2, abs=1e-9)


def test_dm_log_marginal_batched_and_empty():
    lik = DirichletMultinomial(2.0)
    g = torch.Generator().manual_seed(0)
    stats = torch.randint(0, 9, (4, 6, 3), generator=g).float()
    out = lik.log_marginal(stats)
    assert out.shape == (4, 6) and out.dtype == torch.float64
    for p in range(4):
        for c in range(6):
            labels = np.repeat(np.arange(3), stats[p, c].long().numpy())
            assert float(out[p, c]) == pytest.approx(dm_sequential(labels, 3, 2.0), abs=1e-9)
    assert float(lik.log_marginal(torch.zeros(3))) == pytest.approx(0.0, abs=1e-12)
    # a single point of any class: probability 1/K
    assert float(lik.log_marginal(torch.tensor([0.0, 1.0, 0.0]))) == pytest.approx(-math.log(3))


def test_dm_predictive_table():
    lik = DirichletMultinomial(3.0)
    stats = torch.tensor([[0.0, 0.0, 0.0], [4.0, 1.0, 0.0], [100.0, 0.0, 0.0]])
    tab = lik.predictive_table(stats)
    assert torch.allclose(tab.sum(-1), torch.ones(3))
    assert torch.allclose(tab[0], torch.full((3,), 1 / 3))
    assert torch.allclose(tab[1], torch.tensor([5.0, 2.0, 1.0]) / 8.0)
    # the predictive is the ratio of marginals l(Y + y) / l(Y)
    for row in range(3):
        for k in range(3):
            plus = stats[row].clone()
            plus[k] += 1
            ratio = math.exp(float(lik.log_marginal(plus) - lik.log_marginal(stats[row])))
            assert float(tab[row, k]) == pytest.approx(ratio, rel=1e-6)
    y = torch.tensor([0, 2, 0])
    lp = lik.log_predictive_point(tab, y)
    assert torch.allclose(lp, tab[torch.arange(3), y].double().log())
    assert torch.allclose(lik.log_prob_rows(tab, y), lp)
    # with leading particle dims
    rows = tab[None].expand(2, 3, 3)
    assert lik.log_predictive_point(rows, y).shape == (2, 3)


def test_dm_point_stats():
    lik = DirichletMultinomial(1.0)
    ps = lik.point_stats(torch.tensor([2, 0, 2]), n_classes=4)
    assert ps.dtype == lik.stats_dtype and ps.tolist() == [[0, 0, 1, 0], [1, 0, 0, 0], [0, 0, 1, 0]]
    assert lik.point_stats(torch.tensor([1, 0])).shape == (2, 2)


@pytest.mark.parametrize("alpha", [0.0, -1.0, float("inf"), float("nan")])
def test_dm_parameter_validation(alpha):
    with pytest.raises(ValueError, match="alpha"):
        DirichletMultinomial(alpha)


# ------------------------------------------------------- Normal-inverse-gamma
def student_t_logpdf(y, df, loc, scale):
    z = (y - loc) / scale
    return math.lgamma((df + 1) / 2) - math.lgamma(df / 2) - 0.5 * math.log(df * math.pi) - math.log(scale) - (df + 1) / 2 * math.log1p(z * z / df)


def nig_chain_rule(y, mu0, kappa0, a0, b0):
    """log p(y_1..n) = sum_n log p(y_n | y_<n), textbook Student-t predictives
    computed from the posterior parameters written out from scratch."""
    out = 0.0
    k, m, a, b = kappa0, mu0, a0, b0
    for v in y:
        out += student_t_logpdf(v, 2 * a, m, math.sqrt(b * (k + 1) / (a * k)))
        # conjugate update with one point
        b = b + k * (v - m) ** 2 / (2 * (k + 1))
        m = (k * m + v) / (k + 1)
        k, a = k + 1, a + 0.5
    return out


def nig_mvt(y, mu0, kappa0, a0, b0):
    """The marginal of y is multivariate Student-t: df 2 a0, mean mu0,
    shape (b0 / a0) (I + 11'/kappa0)."""
    y = np.asarray(y, dtype=np.float64)
    n = len(y)
    nu = 2 * a0
    S = (b0 / a0) * (np.eye(n) + np.ones((n, n)) / kappa0)
    r = y - mu0
    q = r @ np.linalg.solve(S, r)
    _, logdet = np.linalg.slogdet(S)
    return math.lgamma((nu + n) / 2) - math.lgamma(nu / 2) - n / 2 * math.log(nu * math.pi) - 0.5 * logdet - (nu + n) / 2 * math.log1p(q / nu)


def nig_stats(lik, y):
    return lik.point_stats(torch.as_tensor(y, dtype=torch.float64)).sum(0)


PARAMS = [
    dict(mu0=0.0, kappa0=0.1, a0=2.0, b0=1.0),
    dict(mu0=3.0, kappa0=1.0, a0=1.5, b0=0.2),
    dict(mu0=-50.0, kappa0=0.01, a0=5.0, b0=30.0),
]


@pytest.mark.parametrize("params", PARAMS)
def test_nig_log_marginal_equals_chain_rule_and_mvt(params):
    lik = NormalInverseGamma(**params)
    g = np.random.default_rng(1)
    for n in (1, 2, 3, 7, 25):
        y = params["mu0"] + g.normal(size=n) * 2.0 + 1.0
        got = float(lik.log_marginal(nig_stats(lik, y)))
        assert got == pytest.approx(nig_chain_rule(y, **params), abs=1e-8, rel=1e-10)
        assert got == pytest.approx(nig_mvt(y, **params), abs=1e-8, rel=1e-10)
    assert float(lik.log_marginal(torch.zeros(3, dtype=torch.float64))) == pytest.approx(0.0, abs=1e-12)


def test_nig_chain_rule_with_library_predictives():
    """log l(y_1..n) = sum_n log-predictive of y_n under the leaf table of y_<n."""
    lik = NormalInverseGamma(mu0=1.0, kappa0=0.5, a0=2.5, b0=1.5)
    y = torch.tensor([0.3, 2.5, -1.0, 1.1, 4.0], dtype=torch.float64)
    ps = lik.point_stats(y)
    cum = torch.cat([torch.zeros(1, 3, dtype=torch.float64), ps.cumsum(0)[:-1]])  # stats of y_<n
    rows = lik.predictive_table(cum)
    total = float(lik.log_predictive_point(rows, y).sum())
    assert total == pytest.approx(float(lik.log_marginal(ps.sum(0))), abs=1e-10)
    assert torch.allclose(lik.log_prob_rows(rows, y), lik.log_predictive_point(rows, y))


def test_nig_log_marginal_by_numerical_integration():
    """Direct 2-D integration over (mu, log sigma^2) for two points."""
    p = dict(mu0=0.5, kappa0=0.7, a0=2.0, b0=1.2)
    lik = NormalInverseGamma(**p)
    y = torch.tensor([0.2, 1.7], dtype=torch.float64)
    mu = torch.linspace(-12, 12, 601, dtype=torch.float64)
    t = torch.linspace(-9, 7, 601, dtype=torch.float64)  # t = log sigma^2
    M, T = torch.meshgrid(mu, t, indexing="ij")
    s2 = T.exp()
    log_ig = p["a0"] * math.log(p["b0"]) - math.lgamma(p["a0"]) - (p["a0"] + 1) * T - p["b0"] / s2
    log_mu = -0.5 * torch.log(2 * math.pi * s2 / p["kappa0"]) - p["kappa0"] * (M - p["mu0"]) ** 2 / (2 * s2)
    log_y = sum(-0.5 * torch.log(2 * math.pi * s2) - (v - M) ** 2 / (2 * s2) for v in y)
    integrand = torch.exp(log_ig + log_mu + log_y + T)  # + T: d sigma^2 = sigma^2 dt
    val = torch.trapezoid(torch.trapezoid(integrand, t, dim=1), mu)
    assert float(lik.log_marginal(lik.point_stats(y).sum(0))) == pytest.approx(math.log(float(val)), abs=1e-5)


def test_nig_predictive_table_is_a_normalised_student_t():
    lik = NormalInverseGamma(mu0=2.0, kappa0=0.3, a0=2.0, b0=0.8)
    y = torch.tensor([1.0, 3.5, 2.2, 2.9], dtype=torch.float64)
    stats = torch.stack([torch.zeros(3, dtype=torch.float64), lik.point_stats(y[:1]).sum(0), lik.point_stats(y).sum(0)])
    tab = lik.predictive_table(stats)
    n = stats[:, 0]
    assert torch.allclose(tab[:, 0], 2 * (2.0 + n / 2))
    # location: posterior mean of mu
    assert torch.allclose(tab[:, 1], (0.3 * 2.0 + torch.tensor([0.0, 1.0, float(y.sum())], dtype=torch.float64)) / (0.3 + n))
    grid = torch.linspace(-150, 150, 60001, dtype=torch.float64)
    for r in range(3):
        rows = tab[r].expand(grid.numel(), 3)
        dens = lik.log_predictive_point(rows, grid).exp()
        assert float(torch.trapezoid(dens, grid)) == pytest.approx(1.0, abs=2e-4)
        ref = torch.distributions.StudentT(tab[r, 0], tab[r, 1], tab[r, 2]).log_prob(grid[::500])
        assert torch.allclose(lik.log_predictive_point(tab[r].expand(ref.numel(), 3), grid[::500]), ref, atol=1e-10)


def test_nig_point_stats_are_centred():
    lik = NormalInverseGamma(mu0=10.0)
    ps = lik.point_stats(torch.tensor([9.0, 12.0]))
    assert ps.dtype == torch.float64 and ps.tolist() == [[1.0, -1.0, 1.0], [1.0, 2.0, 4.0]]


def test_nig_large_offset_is_stable():
    """Centring on mu0 keeps the marginal accurate for targets far from zero."""
    y0 = np.array([0.1, -0.3, 0.25, 0.05])
    a = NormalInverseGamma(mu0=0.0, kappa0=0.2, a0=2.0, b0=0.5)
    b = NormalInverseGamma(mu0=1e7, kappa0=0.2, a0=2.0, b0=0.5)
    la = float(a.log_marginal(nig_stats(a, y0)))
    lb = float(b.log_marginal(nig_stats(b, y0 + 1e7)))
    assert la == pytest.approx(lb, abs=1e-6)


def test_nig_default_for():
    y = torch.tensor([1.0, 2.0, 4.0, 7.0], dtype=torch.float64)
    lik = NormalInverseGamma.default_for(y)
    assert lik.mu0 == pytest.approx(3.5) and lik.kappa0 == 0.1 and lik.a0 == 2.0
    assert lik.b0 == pytest.approx(1.0 * 0.5 * float(y.var()))
    # prior mean of sigma^2 = b0 / (a0 - 1) = noise_fraction * var(y)
    lik = NormalInverseGamma.default_for(y, a0=3.0, noise_fraction=0.25)
    assert lik.b0 / (lik.a0 - 1) == pytest.approx(0.25 * float(y.var()))
    # degenerate targets still give a proper prior
    for yy in (torch.tensor([5.0]), torch.tensor([2.0, 2.0, 2.0])):
        lik = NormalInverseGamma.default_for(yy)
        assert lik.b0 > 0 and math.isfinite(lik.b0) and lik.mu0 == float(yy[0])
    lik = NormalInverseGamma.default_for(y, a0=1.2)
    assert lik.b0 == pytest.approx(0.5 * 0.5 * float(y.var()))


@pytest.mark.parametrize(
    "kwargs, name",
    [
        (dict(kappa0=0.0), "kappa0"),
        (dict(a0=-1.0), "a0"),
        (dict(b0=0.0), "b0"),
        (dict(b0=float("inf")), "b0"),
        (dict(a0=float("nan")), "a0"),
        (dict(mu0=float("inf")), "mu0"),
    ],
)
def test_nig_parameter_validation(kwargs, name):
    with pytest.raises(ValueError, match=name):
        NormalInverseGamma(**kwargs)


# ------------------------------------------------------------------ config
@pytest.mark.parametrize("lik", [DirichletMultinomial(0.7), NormalInverseGamma(1.5, 0.2, 3.0, 0.4)])
def test_config_round_trip(lik):
    back = likelihood_from_config(lik.config())
    assert type(back) is type(lik) and back.config() == lik.config()
    stats = torch.tensor([[3.0, 1.0, 2.0]], dtype=torch.float64)
    assert torch.equal(back.log_marginal(stats), lik.log_marginal(stats))
    assert repr(back) == repr(lik)


def test_config_unknown():
    with pytest.raises(ValueError, match="unknown likelihood"):
        likelihood_from_config({"name": "Poisson"})


def test_n_stats():
    class D:
        n_classes = 4

    assert DirichletMultinomial().n_stats(D) == 4 and NormalInverseGamma().n_stats(D) == 3
    assert DirichletMultinomial.task == "classification" and NormalInverseGamma.task == "regression"
