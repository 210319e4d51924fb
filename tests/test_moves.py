"""Tests of the grow / prune / change / swap moves (torchtree.steps.moves).

Statistical tests use fixed seeds; each states its tolerance. A chi-square test at
level ``alpha`` fails spuriously with probability ``alpha`` for a fixed seed only if
the seed happens to be in the tail, so these tests are deterministic given the seed.
"""
from __future__ import annotations

import math

import numpy as np
import pytest
import torch
from scipy import stats as sps

import torchtree as tt
from torchtree.steps.moves import (CHANGE, GROW, PRUNE, SWAP, TreeModel, TreeState, check_state, draw_moves,
                             propose, sample_prior_state)
from torchtree.core.random import keyed_uniform
from torchtree.testing import exact_prior_depth, exact_prior_leaves
from torchtree.model.trees import INTERNAL


def _mh_steps(state, model, n_steps, seed, move_probs=(0.25, 0.25, 0.25, 0.25), check=False, cut_proposal="prior"):
    P = state.n_trees
    idx = torch.arange(P)
    for it in range(n_steps):
        u = keyed_uniform(seed, it, idx[:, None], torch.arange(5)[None, :])
        kind = draw_moves(u[:, 0], move_probs)
        prop = propose(state, model, kind, u, move_probs, cut_proposal)
        before = state.log_posterior(model)
        acc = torch.log(u[:, 4]) < prop.log_accept_ratio
        state.accept_(prop, acc)
        if check:
            check_state(state, model)
            # The proposal's target ratio is the change of the cached log posterior.
            after = state.log_posterior(model)
            assert torch.allclose((after - before)[acc], prop.log_target_ratio[acc], atol=1e-6)
    return state


def _mixed_data(n=90, seed=0, regression=False):
    g = torch.Generator().manual_seed(seed)
    X = torch.randint(0, 4, (n, 4), generator=g).float()
    X[:, 2] = torch.randn(n, generator=g)
    X[:, 3] = 1.0  # a constant feature is never split on
    X[10] = X[11]
    X[12] = X[11]  # duplicate rows: a leaf holding only them cannot split
    if regression:
        y = X[:, 0] + 0.5 * X[:, 2] + 0.1 * torch.randn(n, generator=g)
        return tt.Data(X, y.numpy(), task="regression")
    y = ((X[:, 0] + X[:, 1] + X[:, 2]) > 3).long()
    return tt.Data(X, y)


@pytest.mark.parametrize("cut_proposal", ["prior", "data", "informed"])
@pytest.mark.parametrize("prior", [tt.ChipmanPrior(0.95, 0.5), tt.PoissonPrior(4.0)], ids=["chipman", "poisson"])
@pytest.mark.parametrize("task", ["classification", "regression"])
def test_caches_stay_consistent_under_moves(prior, task, cut_proposal):
    """Bitsets, statistics, thresholds ranks and cached log posterior match a full
    recomputation (``HardTrees.validate`` and ``prior.log_prob``) after every MH step."""
    data = _mixed_data(regression=task == "regression")
    lik = tt.DirichletMultinomial(2.0) if task == "classification" else tt.NormalInverseGamma.default_for(data.y)
    model = TreeModel(prior, lik, data)
    state, _ = sample_prior_state(model, 64, seed=3)
    check_state(state, model)
    _mh_steps(state, model, 25, seed=5, check=True, cut_proposal=cut_proposal)
    assert int(state.trees.n_leaves().max()) > 2


def test_prior_draws_density_and_validity():
    data = _mixed_data()
    prior = tt.ChipmanPrior(0.9, 0.8)
    model = TreeModel(prior, tt.DirichletMultinomial(5.0), data, use_likelihood=False)
    state, log_q0 = sample_prior_state(model, 300, seed=1)
    check_state(state, model)
    assert torch.allclose(log_q0, prior.log_prob(state.trees, data), atol=1e-9)
    # The constant feature (index 3) is never used.
    t = state.trees
    assert not bool(((t.status == INTERNAL) & (t.feature == 3)).any())


def _tiny_data():
    X = np.array([[0.1, 1.0], [0.35, 0.2], [0.4, 0.9], [0.6, 0.1], [0.7, 0.8], [0.8, 0.3], [0.9, 0.5], [0.2, 0.6]])
    y = np.array([0, 0, 1, 0, 1, 1, 1, 0])
    return tt.Data(X, y)


def _chi2_pvalue(counts: np.ndarray, probs: np.ndarray, min_expected: float = 5.0) -> float:
    """Chi-square goodness of fit, pooling cells with small expected counts into one."""
    n = counts.sum()
    exp = probs * n
    big = exp >= min_expected
    obs = np.append(counts[big], counts[~big].sum())
    ex = np.append(exp[big], exp[~big].sum())
    keep = ex > 0
    stat = ((obs[keep] - ex[keep]) ** 2 / ex[keep]).sum()
    return float(sps.chi2.sf(stat, keep.sum() - 1))


def test_prior_draws_match_exact_prior_distribution():
    """Leaves and depth of 20000 prior draws vs exact enumeration; chi-square, alpha = 1e-3."""
    data = _tiny_data()
    prior = tt.ChipmanPrior(0.95, 0.5)
    model = TreeModel(prior, tt.DirichletMultinomial(1.0), data, use_likelihood=False)
    state, _ = sample_prior_state(model, 20000, seed=11)
    leaves = np.bincount(state.trees.n_leaves().numpy(), minlength=data.n + 1)
    depth = np.bincount(state.trees.max_depth().numpy(), minlength=data.n + 2)
    assert _chi2_pvalue(leaves, exact_prior_leaves(data, prior)) > 1e-3
    assert _chi2_pvalue(depth, exact_prior_depth(data, prior)) > 1e-3


# ----------------------------------------------------------------------------- detailed balance
def _class_keys(state: TreeState, model: TreeModel) -> torch.Tensor:
    """Equivalence class of each tree (cuts in the same data interval are the same tree):
    the set of its internal nodes as (points in the node, feature, points sent left),
    hashed to one int64 per tree."""
    t = state.trees
    bits = state.node_bitsets(model)[..., 0]  # N <= 64: one word per node
    left = bits.gather(1, t.left.long().clamp(min=0))
    N = 8  # the toy data sets below have at most 8 points
    code = bits + (t.feature.long().clamp(min=0) << N) + (left << (N + 4))
    table = torch.randint(-(2**62), 2**62, (1 << (2 * N + 4),), generator=torch.Generator().manual_seed(0))
    h = torch.where(t.status == INTERNAL, table[code.clamp(max=table.numel() - 1)], torch.zeros_like(code))
    return h.sum(1)


@pytest.mark.parametrize("cut_proposal", ["prior", "data", "informed"])
@pytest.mark.parametrize(
    "move_probs",
    [(0.5, 0.5, 0.0, 0.0), (0.0, 0.0, 1.0, 0.0), (0.0, 0.0, 0.0, 1.0), (0.25, 0.25, 0.25, 0.25)],
    ids=["grow-prune", "change", "swap", "mixture"],
)
def test_detailed_balance_on_enumerable_space(move_probs, cut_proposal):
    """pi(A) K(A -> B) = pi(B) K(B -> A) for tree classes A != B of a 4-point data set.

    Trees are drawn from the prior (within a class, cuts are then uniform on their
    data intervals, as under the posterior) and moved by one MH step of the kernel.
    With n_AB transitions A -> B among the draws, E[n_AB] is proportional to
    prior(A) K(A, B), so detailed balance w.r.t. pi = prior x L says that, given
    n = n_AB + n_BA, n_AB ~ Binomial(n, L(B) / (L(A) + L(B))). The per-pair z-scores
    are combined into one chi-square test (alpha = 1e-3) over pairs with n >= 20.
    A wrong proposal ratio (e.g. dropping a candidate count or the rule density)
    shifts these binomials by factors of 1.5-4 and fails the test.

    The gaps between distinct values are unequal (0.4 / 1.6 / 1 and 1 / 2), so the
    ``"data"`` cut proposal (gap uniform, then uniform in it) differs from the prior's
    (uniform on the range) and a missing or wrong cut density ratio shows.
    """
    X = np.array([[0.0, 1.0], [0.4, 1.0], [2.0, 0.0], [3.0, 3.0]])  # tie in feature 1
    y = np.array([0, 1, 1, 0])
    data = tt.Data(X, y)
    lik = tt.DirichletMultinomial(1.0)
    model = TreeModel(tt.ChipmanPrior(0.95, 0.5), lik, data)
    T = 60000
    state, _ = sample_prior_state(model, T, seed=21)
    key_a = _class_keys(state, model)
    leaf = state.trees.is_leaf()
    loglik_a = torch.where(leaf, lik.log_marginal(state.trees.stats), torch.zeros((), dtype=torch.float64)).sum(1)
    u = keyed_uniform(77, 0, torch.arange(T)[:, None], torch.arange(5)[None, :])
    kind = draw_moves(u[:, 0], move_probs)
    prop = propose(state, model, kind, u, move_probs, cut_proposal)
    state.accept_(prop, torch.log(u[:, 4]) < prop.log_accept_ratio)
    check_state(state, model)
    key_b = _class_keys(state, model)
    moved = key_a != key_b
    assert int(moved.sum()) > 1000
    uniq, inv = torch.unique(torch.cat([key_a, key_b]), return_inverse=True)
    ia, ib = inv[:T][moved].numpy(), inv[T:][moved].numpy()
    ll = np.zeros(uniq.numel())
    ll[inv[:T].numpy()] = loglik_a.numpy()
    K = uniq.numel()
    flows = np.zeros((K, K))
    np.add.at(flows, (ia, ib), 1)
    stat, df = 0.0, 0
    for a in range(K):
        for b in range(a + 1, K):
            n = flows[a, b] + flows[b, a]
            if n < 20:
                continue
            assert np.isfinite(ll[a]) and np.isfinite(ll[b]) and ll[a] != 0 or ll[b] != 0
            p = 1.0 / (1.0 + math.exp(ll[a] - ll[b]))  # L(B) / (L(A) + L(B))
            stat += (flows[a, b] - n * p) ** 2 / (n * p * (1 - p))
            df += 1
    assert df >= 5
    assert sps.chi2.sf(stat, df) > 1e-3, (stat, df)


def test_invalid_proposals_are_flagged_not_raised():
    """Root-only trees: prune / change / swap have no candidate; a leaf made of
    duplicate rows cannot grow."""
    X = np.array([[1.0, 2.0], [1.0, 2.0], [1.0, 2.0]])
    data = tt.Data(X, np.array([0, 1, 0]))
    model = TreeModel(tt.ChipmanPrior(), tt.DirichletMultinomial(), data)
    state = TreeState.roots(model, 4)
    u = torch.full((4, 5), 0.5, dtype=torch.float64)
    prop = propose(state, model, torch.tensor([GROW, PRUNE, CHANGE, SWAP]), u)
    assert not bool(prop.valid.any())
    assert bool(torch.isinf(prop.log_accept_ratio).all())
    state.accept_(prop, prop.valid)
    check_state(state, model)


@pytest.mark.parametrize("cut_proposal", ["prior", "data", "informed"])
def test_grow_then_prune_ratios_are_inverse(cut_proposal):
    """log q ratio of a grow and of the prune that undoes it are exact negatives, and
    so are the target ratios."""
    data = _mixed_data()
    model = TreeModel(tt.ChipmanPrior(), tt.DirichletMultinomial(), data)
    state, _ = sample_prior_state(model, 200, seed=9)
    u = keyed_uniform(1, 0, torch.arange(200)[:, None], torch.arange(5)[None, :])
    grow = propose(state, model, torch.full((200,), GROW), u, cut_proposal=cut_proposal)
    ok = grow.valid
    before = state.clone()
    state.accept_(grow, ok)
    # Prune the node just grown: pick it among the prunable nodes by its rank.
    t = state.trees
    leaf = t.is_leaf()
    prunable = (t.status == INTERNAL) & leaf.gather(1, t.left.long().clamp(min=0)) & leaf.gather(1, t.right.long().clamp(min=0))
    rank = (prunable.long().cumsum(1) - 1).gather(1, grow.node[:, None].clamp(min=0)).squeeze(1)
    u2 = u.clone()
    u2[:, 1] = (rank.double() + 0.5) / prunable.sum(1).clamp(min=1).double()
    prune = propose(state, model, torch.full((200,), PRUNE), u2, cut_proposal=cut_proposal)
    assert bool(prune.valid[ok].all())
    assert bool((prune.node[ok] == grow.node[ok]).all())
    assert torch.allclose(prune.log_q_ratio[ok], -grow.log_q_ratio[ok], atol=1e-9)
    assert torch.allclose(prune.log_target_ratio[ok], -grow.log_target_ratio[ok], atol=1e-6)
    state.accept_(prune, ok)
    check_state(state, model)
    assert torch.allclose(state.log_posterior(model), before.log_posterior(model), atol=1e-6)
