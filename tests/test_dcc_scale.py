"""DCC on wide tables (issue #21, item 5): LAIS asked for 78 GB on a 50 x 10,000 table (P x P
covariances per chain). Above LOWRANK_MIN_PARAMS parameters it now uses the exact
diagonal-plus-low-rank form of the same covariance, with memory linear in P."""
from __future__ import annotations

import math

import numpy as np
import pytest
import torch

from torchtree.core.memory import lais_bytes
from torchtree.samplers.dcc.lais import LOWRANK_MIN_PARAMS, chain_covariance, lais_log_weights, lais_memory_bytes
from torchtree.soft import DCC


def _draws(G=2, C=3, T=6, P=9, seed=0):
    g = torch.Generator().manual_seed(seed)
    d = torch.randn(G, C, T, P, generator=g, dtype=torch.float64) * torch.rand(P, generator=g, dtype=torch.float64)
    d = d + 3 * torch.randn(P, generator=g, dtype=torch.float64)
    mask = torch.ones(G, P, dtype=torch.bool)
    if C > 1 and G > 1:
        d[0, 1, :, 2] = 0.7  # a chain that did not move on one coordinate
        mask[1, 6:] = False  # a smaller topology in the same batch
    return d, mask


@pytest.mark.parametrize("form", ["spatial", "basic"])
def test_lowrank_densities_are_the_dense_covariance_densities(form):
    """log Phi of the low-rank form equals the Gaussian (mixture) density with chain_covariance's
    matrix, evaluated directly, to 1e-10 (float64 rounding of a Woodbury solve)."""
    draws, mask = _draws()
    G, C, T, P = draws.shape
    NM = 3
    target = lambda xi: -0.5 * (xi**2).sum(-1)  # noqa: E731
    lw, xi = lais_log_weights(draws, mask, target, NM, torch.Generator().manual_seed(1), form,
                              return_samples=True, covariance="lowrank")
    log_phi = target(xi) - lw
    Sigma = chain_covariance(draws, mask)
    for g in range(G):
        a = mask[g]
        for c in range(C):
            qs = torch.distributions.MultivariateNormal(draws[g, c][:, a], Sigma[g, c][a][:, a])  # batch of T
            x = xi[g, c][..., a]  # [T, NM, Pa]
            if form == "basic":
                ref = qs.log_prob(x.transpose(0, 1)).transpose(0, 1)
            else:
                ref = torch.logsumexp(qs.log_prob(x.reshape(T * NM, 1, -1)), -1).reshape(T, NM) - math.log(T)
            assert torch.allclose(log_phi[g, c], ref, rtol=0, atol=1e-10)
            # inactive coordinates are not perturbed (as in the dense form)
            assert torch.equal(xi[g, c][..., ~a], draws[g, c][:, None, ~a].expand(T, NM, -1))


def test_lowrank_pseudo_samples_have_the_dense_covariance():
    """20,000 pseudo-samples around one draw: their covariance is chain_covariance's matrix
    within 5 standard errors of each entry (Wishart sd of a covariance estimate)."""
    draws, mask = _draws(G=1, C=1, T=5, P=7, seed=2)
    n = 20_000
    _, xi = lais_log_weights(draws, mask, lambda x: x.sum(-1), n, torch.Generator().manual_seed(3), "basic",
                             return_samples=True, covariance="lowrank")
    S = chain_covariance(draws, mask)[0, 0]
    dev = xi[0, 0, 0] - draws[0, 0, 0]  # [n, P]
    emp = dev.T @ dev / n
    se = torch.sqrt((S**2 + torch.outer(S.diagonal(), S.diagonal())) / n)
    assert ((emp - S).abs() <= 5 * se + 1e-12).all()


def test_memory_is_at_most_linear_in_the_parameters():
    C, T, NM = 8, 20, 5
    dense = lais_bytes(1, C, T, NM, 10_004)
    auto = lais_memory_bytes(1, C, T, NM, 10_004)
    assert dense > 16 * 2**30 and auto < 2**30
    # small topologies keep the dense form (the golden outputs' numbers)
    assert lais_memory_bytes(1, C, T, NM, LOWRANK_MIN_PARAMS) == lais_bytes(1, C, T, NM, LOWRANK_MIN_PARAMS)
    # at most linear in P (the work chunks stay under a fixed number of elements)
    ratio = lais_memory_bytes(1, C, T, NM, 40_000) / lais_memory_bytes(1, C, T, NM, 10_000)
    assert ratio <= 4.0


def test_dcc_runs_on_50_by_10000_under_a_4_gib_cap(monkeypatch):
    monkeypatch.setenv("TORCHTREE_MEMORY_LIMIT", "4G")
    g = np.random.default_rng(0)
    X = g.normal(size=(50, 10_000))
    y = (X[:, 0] > 0).astype(int)
    post = DCC(n_iterations=2, n_warmup=10, n_samples=5, n_initial=5, max_depth=2, max_tree_depth=4).run((X, y), seed=0)
    assert len(post.topologies) >= 1 and torch.isfinite(post.topology_log_evidence).all()
    p = post.predict_proba(X[:3])
    assert np.isfinite(p).all() and np.allclose(p.sum(1), 1)


def test_weighted_pseudo_samples_are_bounded(monkeypatch):
    """Past PSEUDO_BYTES a topology's pseudo-samples are resampled to PSEUDO_KEEP x
    max_predict_draws equally weighted points with the same total weight."""
    import torchtree.samplers.dcc.records as dcc_sampler

    monkeypatch.setattr(dcc_sampler, "PSEUDO_BYTES", 1)
    g = np.random.default_rng(1)
    X = g.normal(size=(80, 3))
    y = (X[:, 0] > 0).astype(int)
    kw = dict(n_iterations=3, n_initial=5, n_chains=2, n_samples=4, n_warmup=5, activation_threshold=1, max_depth=2,
              n_parallel=1, max_predict_draws=7)
    d = DCC(**kw)
    post = d.run((X, y), seed=0)
    for r in post.run_records.values():
        if r.active:
            assert len(r.pseudo) == 1 and r.pseudo[0].shape[0] == dcc_sampler.PSEUDO_KEEP * 7
            lw = r.pseudo_logw[0]
            assert torch.allclose(lw, lw[0].expand_as(lw))
    assert all(x.shape[0] == 7 for x in post.draws)
