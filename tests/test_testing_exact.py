"""Tests for torchtree.testing: exact enumeration against hand formulas, brute-force
sums over tree classes, and Monte Carlo estimates from prior draws."""
from __future__ import annotations

import itertools
import math

import numpy as np
import pytest
import torch

from torchtree import ChipmanPrior, Data, DirichletMultinomial, HardTrees, NormalInverseGamma, TopDownSMC
from torchtree.testing import exact_log_evidence, exact_predictive, exact_prior_depth, exact_prior_leaves
from torchtree.model.trees import INTERNAL, LEAF


def l_dm(lik, data, rows):
    """log l(Y_rows) under a classification likelihood."""
    counts = torch.bincount(data.y[list(rows)], minlength=data.n_classes).float()
    return float(lik.log_marginal(counts))


def l_reg(lik, data, rows):
    return float(lik.log_marginal(lik.point_stats(data.y[list(rows)]).sum(0)))


# -------------------------------------------------------- hand formulas
def test_single_point_evidence_is_the_leaf_marginal():
    data = Data([[0.3, -1.0]], [1], n_classes=3)
    lik = DirichletMultinomial(2.0)
    for pr in (ChipmanPrior(0.95, 0.5), ChipmanPrior(0.2, 3.0)):
        assert exact_log_evidence(data, pr, lik) == pytest.approx(math.log(1 / 3), abs=1e-12)
        assert exact_prior_leaves(data, pr).tolist() == [0.0, 1.0]
        assert exact_prior_depth(data, pr).tolist() == [1.0, 0.0, 0.0]
        pred = exact_predictive(data, pr, lik, [[0.0, 0.0], [5.0, 5.0]])
        assert np.allclose(pred, [[2 / 3 / 3, (1 + 2 / 3) / 3, 2 / 3 / 3]] * 2)


def test_no_varying_dimension_evidence_is_the_leaf_marginal():
    data = Data(np.tile([[1.0, 2.0, 3.0]], (6, 1)), [0, 1, 1, 2, 0, 1])
    lik = DirichletMultinomial(1.5)
    pr = ChipmanPrior(0.95, 0.5)
    assert exact_log_evidence(data, pr, lik) == pytest.approx(l_dm(lik, data, range(6)), abs=1e-12)
    leaves = exact_prior_leaves(data, pr)
    assert leaves[1] == 1.0 and leaves.sum() == 1.0
    reg = Data(np.ones((4, 2)), [0.5, 1.0, -2.0, 3.0], task="regression")
    nig = NormalInverseGamma(0.0, 0.5, 2.0, 1.0)
    assert exact_log_evidence(reg, pr, nig) == pytest.approx(l_reg(nig, reg, range(4)), abs=1e-12)


@pytest.mark.parametrize("X", [[[0.0], [1.0]], [[2.0, 7.0], [-1.0, 7.0]], [[0.0, 0.0], [1.0, 5.0]]])
def test_two_points_hand_formula(X):
    """Z = (1 - p0) l(Y) + p0 l(y1) l(y2), p0 = alpha_s, whatever the number of
    varying dims (they all give the same partition)."""
    data = Data(X, [0, 1])
    lik = DirichletMultinomial(3.0)
    for a, b in ((0.95, 0.5), (0.3, 1.0)):
        pr = ChipmanPrior(a, b)
        want = math.log((1 - a) * math.exp(l_dm(lik, data, [0, 1])) + a * math.exp(l_dm(lik, data, [0]) + l_dm(lik, data, [1])))
        assert exact_log_evidence(data, pr, lik) == pytest.approx(want, abs=1e-12)
        assert np.allclose(exact_prior_leaves(data, pr), [0, 1 - a, a])
        assert np.allclose(exact_prior_depth(data, pr), [1 - a, a, 0, 0])


def test_two_points_regression_hand_formula():
    data = Data([[0.0], [1.0]], [0.3, 2.0], task="regression")
    lik = NormalInverseGamma(1.0, 0.2, 2.0, 0.5)
    a = 0.9
    want = math.log((1 - a) * math.exp(l_reg(lik, data, [0, 1])) + a * math.exp(l_reg(lik, data, [0]) + l_reg(lik, data, [1])))
    assert exact_log_evidence(data, ChipmanPrior(a, 0.5), lik) == pytest.approx(want, abs=1e-12)


def test_three_points_unequal_gaps_hand_formula():
    """x = 0, 1, 4: cuts in (0, 1] have prior mass 1/4, cuts in (1, 4) 3/4."""
    data = Data([[0.0], [1.0], [4.0]], [0, 1, 1])
    lik = DirichletMultinomial(2.0)
    a, b = 0.8, 0.6
    p0, p1 = a, a * 2 ** -b
    L = lambda *r: math.exp(l_dm(lik, data, r))
    z01 = (1 - p1) * L(0, 1) + p1 * L(0) * L(1)
    z12 = (1 - p1) * L(1, 2) + p1 * L(1) * L(2)
    want = (1 - p0) * L(0, 1, 2) + p0 * (0.25 * L(0) * z12 + 0.75 * z01 * L(2))
    assert exact_log_evidence(data, ChipmanPrior(a, b), lik) == pytest.approx(math.log(want), abs=1e-12)
    leaves = exact_prior_leaves(data, ChipmanPrior(a, b))
    assert np.allclose(leaves, [0, 1 - p0, p0 * (1 - p1), p0 * p1])
    depth = exact_prior_depth(data, ChipmanPrior(a, b))
    assert np.allclose(depth, [1 - p0, p0 * (1 - p1), p0 * p1, 0, 0])


def test_two_points_predictive_hand_formula():
    """Posterior mixes the stump and the split; a query inside (x1, x2) goes left
    with probability (x2 - x) / (x2 - x1) over the uniform cut."""
    data = Data([[0.0], [2.0]], [0, 1])
    lik = DirichletMultinomial(1.0)
    a = 0.7
    pr = ChipmanPrior(a, 0.5)
    ws = (1 - a) * math.exp(l_dm(lik, data, [0, 1]))
    wp = a * math.exp(l_dm(lik, data, [0]) + l_dm(lik, data, [1]))
    ws, wp = ws / (ws + wp), wp / (ws + wp)
    T = lambda c: lik.predictive_table(torch.tensor(c, dtype=torch.float32)).double().numpy()
    stump, left, right = T([1.0, 1.0]), T([1.0, 0.0]), T([0.0, 1.0])
    xs = np.array([[-1.0], [0.0], [0.5], [1.5], [2.0], [9.0]])
    pred = exact_predictive(data, pr, lik, xs)
    for x, row in zip(xs[:, 0], pred):
        fl = min(max((2.0 - x) / 2.0, 0.0), 1.0)
        assert np.allclose(row, ws * stump + wp * (fl * left + (1 - fl) * right), atol=1e-12)
    assert np.allclose(pred.sum(1), 1.0)


def test_two_points_regression_predictive_hand_formula():
    data = Data([[0.0], [2.0]], [-1.0, 3.0], task="regression")
    lik = NormalInverseGamma(0.0, 0.5, 2.0, 1.0)
    a = 0.7
    ws = (1 - a) * math.exp(l_reg(lik, data, [0, 1]))
    wp = a * math.exp(l_reg(lik, data, [0]) + l_reg(lik, data, [1]))
    ws, wp = ws / (ws + wp), wp / (ws + wp)
    mean = lambda r: float(lik.predictive_table(lik.point_stats(data.y[list(r)]).sum(0))[1])
    pred = exact_predictive(data, ChipmanPrior(a, 0.5), lik, [[0.5], [3.0]])
    assert pred.shape == (2, 1)
    assert pred[0, 0] == pytest.approx(ws * mean([0, 1]) + wp * (0.75 * mean([0]) + 0.25 * mean([1])), abs=1e-12)
    assert pred[1, 0] == pytest.approx(ws * mean([0, 1]) + wp * mean([1]), abs=1e-12)


def test_refuses_large_data():
    data = Data(np.arange(34.0).reshape(17, 2), np.arange(17) % 2)
    with pytest.raises(ValueError, match="tiny"):
        exact_log_evidence(data, ChipmanPrior(), DirichletMultinomial())


# ------------------------------------ brute force over tree classes
def build(specs, data: Data, K):
    """HardTrees (breadth-first numbering) from nested specs; ``None`` = leaf."""
    flat = []
    for spec in specs:
        nodes = [dict(spec=spec, parent=-1, depth=0, idx=torch.arange(data.n))]
        i = 0
        while i < len(nodes):
            n = nodes[i]
            if n["spec"] is not None:
                f, thr, L, R = n["spec"]
                gl = data.X[n["idx"], f] <= thr
                n["kids"] = [len(nodes), len(nodes) + 1]
                nodes.append(dict(spec=L, parent=i, depth=n["depth"] + 1, idx=n["idx"][gl]))
                nodes.append(dict(spec=R, parent=i, depth=n["depth"] + 1, idx=n["idx"][~gl]))
            i += 1
        flat.append(nodes)
    t = HardTrees.roots(len(specs), torch.zeros(K, dtype=torch.float64), capacity=max(map(len, flat)))
    t.threshold = t.threshold.to(data.X.dtype)
    t.idx = []
    for p, nodes in enumerate(flat):
        for i, n in enumerate(nodes):
            t.parent[p, i], t.depth[p, i] = n["parent"], n["depth"]
            t.status[p, i] = LEAF if n["spec"] is None else INTERNAL
            if n["spec"] is not None:
                t.feature[p, i], t.threshold[p, i] = n["spec"][0], n["spec"][1]
                t.left[p, i], t.right[p, i] = n["kids"]
        t.n_nodes[p] = len(nodes)
        t.idx.append([n["idx"] for n in nodes])
    return t


def enumerate_classes(X: np.ndarray, idx):
    """All trees up to 'same cut interval', with the product of interval widths."""
    yield None, 1.0
    xs = X[idx]
    for d in range(X.shape[1]):
        vals = np.unique(xs[:, d])
        for v0, v1 in zip(vals[:-1], vals[1:]):
            li, ri = idx[xs[:, d] <= v0], idx[xs[:, d] > v0]
            for (L, wl), (R, wr) in itertools.product(list(enumerate_classes(X, li)), list(enumerate_classes(X, ri))):
                yield (d, float((v0 + v1) / 2), L, R), (v1 - v0) * wl * wr


def brute_force(data, pr, lik, S):
    """Per tree class: log prior mass (eq. 5 density x widths), log likelihood, leaf stats."""
    classes = list(enumerate_classes(data.X.double().numpy(), np.arange(data.n)))
    specs, widths = zip(*classes)
    t = build(list(specs), data, S)
    ps = lik.point_stats(data.y, data.n_classes).double()
    for p in range(t.n_trees):
        for i in range(int(t.n_nodes[p])):
            t.stats[p, i] = ps[t.idx[p][i]].sum(0)
    log_mass = pr.log_prob(t, data) + torch.log(torch.tensor(widths, dtype=torch.float64))
    leafll = torch.where(t.is_leaf(), lik.log_marginal(t.stats), torch.zeros(()).double()).sum(1)
    return t, log_mass, leafll


@pytest.mark.parametrize("alpha, beta", [(0.95, 0.5), (0.6, 1.5)])
def test_exact_evidence_equals_sum_over_tree_classes(alpha, beta):
    X = np.array([[0.0, 1.0], [0.5, 1.0], [2.0, 3.0], [2.0, 4.5], [3.5, 1.0]])
    data = Data(X, [0, 1, 1, 0, 1])
    pr, lik = ChipmanPrior(alpha, beta), DirichletMultinomial(2.0)
    t, log_mass, leafll = brute_force(data, pr, lik, 2)
    assert float(torch.logsumexp(log_mass, 0)) == pytest.approx(0.0, abs=1e-9)
    want = float(torch.logsumexp(log_mass + leafll, 0))
    assert exact_log_evidence(data, pr, lik) == pytest.approx(want, abs=1e-9)
    # prior distributions of leaves and depth from the same enumeration
    mass = log_mass.exp().numpy()
    leaves = np.bincount(t.n_leaves().numpy(), weights=mass, minlength=data.n + 1)
    depth = np.bincount(t.max_depth().numpy(), weights=mass, minlength=data.n + 2)
    assert np.allclose(exact_prior_leaves(data, pr), leaves, atol=1e-12)
    assert np.allclose(exact_prior_depth(data, pr), depth, atol=1e-12)
    # predictive at the training inputs (no cut falls on a data value)
    post = (log_mass + leafll - want).exp()
    table = lik.predictive_table(t.stats).double()
    leaf = t.leaf_index(data.X)
    rows = table[torch.arange(t.n_trees)[:, None], leaf]  # [T, N, K]
    brute_pred = (post[:, None, None] * rows).sum(0).numpy()
    assert np.allclose(exact_predictive(data, pr, lik, X), brute_pred, atol=1e-9)


def test_exact_regression_evidence_equals_sum_over_tree_classes():
    X = np.array([[0.0], [1.0], [1.0], [3.0], [4.0]])
    data = Data(X, [0.1, 1.5, 1.2, -0.7, 2.2], task="regression")
    pr, lik = ChipmanPrior(0.9, 0.8), NormalInverseGamma(0.5, 0.3, 2.0, 0.7)
    t, log_mass, leafll = brute_force(data, pr, lik, 3)
    want = float(torch.logsumexp(log_mass + leafll, 0))
    assert exact_log_evidence(data, pr, lik) == pytest.approx(want, abs=1e-9)
    post = (log_mass + leafll - want).exp()
    means = lik.predictive_table(t.stats)[..., 1]
    leaf = t.leaf_index(data.X)
    brute = (post[:, None] * means.gather(1, leaf)).sum(0).numpy()
    assert np.allclose(exact_predictive(data, pr, lik, X)[:, 0], brute, atol=1e-9)


# ------------------------------------------- distributions sum to one
@pytest.mark.parametrize("seed", [0, 1, 2])
def test_exact_distributions_normalised(seed):
    g = np.random.default_rng(seed)
    X = np.column_stack([g.normal(size=8), g.integers(0, 3, 8)])
    data = Data(X, g.integers(0, 3, 8), n_classes=3)
    pr = ChipmanPrior(0.95, 0.5)
    for dist in (exact_prior_leaves(data, pr), exact_prior_depth(data, pr)):
        assert dist.sum() == pytest.approx(1.0, abs=1e-12) and (dist >= 0).all()
    leaves = exact_prior_leaves(data, pr)
    assert leaves[0] == 0 and leaves[1] == pytest.approx(0.05)
    pred = exact_predictive(data, pr, DirichletMultinomial(1.0), g.normal(size=(4, 2)))
    assert pred.shape == (4, 3) and np.allclose(pred.sum(1), 1.0) and (pred > 0).all()


# ----------------------------------------- Monte Carlo from prior draws
N_DRAWS = 6000


@pytest.fixture(scope="module")
def prior_sample():
    """6000 trees from the Chipman prior on 6 points (with a tied feature)."""
    g = np.random.default_rng(7)
    X = np.column_stack([g.normal(size=6), g.integers(0, 2, 6)])
    y = np.array([0, 0, 1, 1, 1, 0])
    data = Data(X, y)
    pr = ChipmanPrior(0.95, 0.5)
    post = TopDownSMC(pr, DirichletMultinomial(1.0), n_particles=N_DRAWS, use_likelihood=False).run(data, seed=5)
    return data, pr, post


def _leaf_stats(trees, data, lik):
    """Per-node stats of ``data`` routed through ``trees`` (leaves only are used)."""
    leaf = trees.leaf_index(data.X)
    ps = lik.point_stats(data.y, data.n_classes).double()
    S = ps.shape[1]
    st = torch.zeros(trees.n_trees, trees.capacity, S, dtype=torch.float64)
    st.scatter_add_(1, leaf[:, :, None].expand(-1, -1, S), ps[None].expand(trees.n_trees, -1, -1).contiguous())
    return st


def _is_check(post, data, pr, lik, queries):
    """Importance estimate from prior draws: log Z = log mean_T l(Y | T), and the
    self-normalised predictive; each with its delta-method standard error."""
    t = post.trees
    w = post.weights  # multiplicity / N_DRAWS
    st = _leaf_stats(t, data, lik)
    ll = torch.where(t.is_leaf(), lik.log_marginal(st), torch.zeros((), dtype=torch.float64)).sum(1)
    logz = float(torch.logsumexp(ll + w.log(), 0))
    L = (ll - logz).exp()  # likelihood ratios, mean 1 under the draws
    se_logz = math.sqrt(float((w * (L - 1) ** 2).sum()) / N_DRAWS)
    exact = exact_log_evidence(data, pr, lik)
    assert se_logz < 0.05  # the check is meaningful
    # 4 standard errors: false-failure rate ~6e-5 under the CLT
    assert abs(logz - exact) < 4 * se_logz, (logz, exact, se_logz)
    # self-normalised importance estimate of the predictive at query points
    table = lik.predictive_table(st.to(lik.stats_dtype)).double()
    Xq = torch.as_tensor(queries, dtype=data.X.dtype)
    leaf = t.leaf_index(Xq)
    rows = table[torch.arange(t.n_trees)[:, None], leaf]  # [T, M, S]
    wl = w * L
    vals = rows if lik.task == "classification" else rows[..., 1:2]
    est = (wl[:, None, None] * vals).sum(0)
    se = ((w[:, None, None] * (L[:, None, None] * (vals - est)) ** 2).sum(0) / N_DRAWS).sqrt()
    ex = torch.as_tensor(exact_predictive(data, pr, lik, queries))
    # 4.5 standard errors for each of a handful of comparisons: ~1e-4 in all
    assert ((est - ex).abs() < 4.5 * se + 1e-9).all(), (est, ex, se)
    return logz, exact


@pytest.mark.slow
def test_prior_importance_estimate_of_evidence_classification(prior_sample):
    data, pr, post = prior_sample
    lik = DirichletMultinomial(1.0)
    logz, exact = _is_check(post, data, pr, lik, [[-0.5, 0.0], [0.3, 1.0], [2.0, 0.5]])
    assert abs(logz - exact) < 0.05


@pytest.mark.slow
def test_prior_importance_estimate_of_evidence_regression(prior_sample):
    data, pr, post = prior_sample
    yr = np.array([0.2, 0.5, 2.5, 2.2, 3.0, 0.1])
    reg = Data(data.X, yr, task="regression")
    lik = NormalInverseGamma(1.0, 0.5, 2.0, 0.5)
    logz, exact = _is_check(post, reg, pr, lik, [[-0.5, 0.0], [0.3, 1.0], [2.0, 0.5]])
    assert abs(logz - exact) < 0.05


@pytest.mark.slow
def test_prior_importance_check_has_power(prior_sample):
    """The same draws reject the evidence of a different prior: guards against a
    check that would pass whatever the numbers."""
    data, pr, post = prior_sample
    lik = DirichletMultinomial(1.0)
    with pytest.raises(AssertionError):
        _is_check(post, data, ChipmanPrior(0.5, 2.0), lik, [[0.3, 1.0]])
