"""Tests for torchtree.model.priors: hand-computed eq. 5 values, support, normalisation,
and prior draws of the top-down sampler against exact prior distributions."""
from __future__ import annotations

import itertools
import math

import numpy as np
import pytest
import torch

from torchtree import ChipmanPrior, Data, DirichletMultinomial, HardTrees, PoissonPrior, TopDownSMC
from torchtree.model.priors import node_ranges, prior_from_config
from torchtree.testing import exact_prior_depth, exact_prior_leaves
from torchtree.model.trees import INTERNAL, LEAF, OPEN


# ---------------------------------------------------------------- helpers
def build(specs, data: Data, capacity=None, order="bfs"):
    """HardTrees from nested specs: ``None`` is a leaf, ``(f, thr, L, R)`` a split.

    Nodes are numbered breadth-first (``order="bfs"``, as the growth engine does)
    or depth-first; stats are the class counts of the data routed to each node.
    """
    K = data.n_classes
    X = data.X
    onehot = torch.nn.functional.one_hot(data.y, K).float()
    flat = []
    for spec in specs:
        nodes = [dict(spec=spec, parent=-1, depth=0, idx=torch.arange(data.n))]
        queue = [0]
        while queue:
            i = queue.pop(0) if order == "bfs" else queue.pop()
            n = nodes[i]
            if n["spec"] is None:
                continue
            f, thr, L, R = n["spec"]
            go_left = X[n["idx"], f] <= thr
            kids = []
            for sub, mask in ((L, go_left), (R, ~go_left)):
                nodes.append(dict(spec=sub, parent=i, depth=n["depth"] + 1, idx=n["idx"][mask]))
                kids.append(len(nodes) - 1)
            n["kids"] = kids
            queue.extend(kids if order == "bfs" else kids[::-1])
        flat.append(nodes)
    C = capacity or max(len(n) for n in flat)
    t = HardTrees.roots(len(specs), torch.zeros(K), capacity=C)
    for p, nodes in enumerate(flat):
        for i, n in enumerate(nodes):
            t.parent[p, i], t.depth[p, i] = n["parent"], n["depth"]
            t.stats[p, i] = onehot[n["idx"]].sum(0)
            if n["spec"] is None:
                t.status[p, i] = LEAF
            else:
                t.status[p, i] = INTERNAL
                t.feature[p, i], t.threshold[p, i] = n["spec"][0], n["spec"][1]
                t.left[p, i], t.right[p, i] = n["kids"]
        t.n_nodes[p] = len(nodes)
    return t


def small_data():
    # x0: 0 1 3 4 4      x1: 5 5 5 5 9
    X = np.array([[0, 5], [1, 5], [3, 5], [4, 5], [4, 9]], dtype=float)
    return Data(X, [0, 1, 0, 1, 1])


A, B = 0.9, 0.7  # alpha_s, beta_s used in the hand computations


def ps(q):
    return A * (1 + q) ** -B


# tree: root x0 <= 2 | left {0, 1} leaf | right {3, 4, 4} split x1 <= 6 -> {3, 4} leaf, {4} leaf
TREE_A = (0, 2.0, None, (1, 6.0, None, None))
LOGP_A = (
    math.log(ps(0)) - math.log(2) - math.log(4)  # root: 2 varying dims, range of x0 = 4
    + math.log(1 - ps(1))  # left leaf {0, 1}: x0 varies
    + math.log(ps(1)) - math.log(2) - math.log(4)  # right node: x0 and x1 vary, range of x1 = 4
    + math.log(1 - ps(2))  # {3, 4}: x0 varies
    + 0.0  # {4}: a single point, no varying dim, stops surely
)


# --------------------------------------------------------------- eq. 5
def test_chipman_log_prob_hand_computed():
    data = small_data()
    pr = ChipmanPrior(A, B)
    t = build([TREE_A, None, (1, 5.0, None, None)], data)
    t.validate(data, DirichletMultinomial(1.0))
    lp = pr.log_prob(t, data)
    assert lp.dtype == torch.float64 and lp.shape == (3,)
    assert float(lp[0]) == pytest.approx(LOGP_A, abs=1e-9)
    assert float(lp[1]) == pytest.approx(math.log(1 - A), abs=1e-12)
    # x1 <= 5 (a cut at the minimum is in [min, max)): {0..3} on the left, {4} on the right
    want = math.log(A) - math.log(2) - math.log(4) + math.log(1 - ps(1)) + 0.0
    assert float(lp[2]) == pytest.approx(want, abs=1e-9)


def test_chipman_log_prob_independent_of_node_order_and_capacity():
    data = small_data()
    pr = ChipmanPrior(A, B)
    specs = [TREE_A, (0, 0.5, None, (0, 3.5, None, (1, 7.0, None, None)))]
    bfs = pr.log_prob(build(specs, data), data)
    dfs = pr.log_prob(build(specs, data, order="dfs", capacity=20), data)
    assert torch.allclose(bfs, dfs, atol=1e-12)
    assert float(bfs[0]) == pytest.approx(LOGP_A)


def test_open_leaves_scored_as_stopped():
    data = small_data()
    pr = ChipmanPrior(A, B)
    t = build([TREE_A], data)
    want = pr.log_prob(t, data)
    t.status[t.status == LEAF] = OPEN
    assert torch.allclose(pr.log_prob(t, data), want)


def test_leaf_with_constant_data_contributes_nothing():
    X = np.array([[1.0, 2.0]] * 3 + [[1.0, 3.0]])
    data = Data(X, [0, 1, 0, 1])
    pr = ChipmanPrior(A, B)
    t = build([None, (1, 2.5, None, None)], data)
    lp = pr.log_prob(t, data)
    assert float(lp[0]) == pytest.approx(math.log(1 - A))
    # root: only x1 varies (|D| = 1, range 1); {x1 = 2} x3 has no varying dim; {x1 = 3} single point
    assert float(lp[1]) == pytest.approx(math.log(A))
    const = Data(np.ones((3, 2)), [0, 1, 0])
    assert float(pr.log_prob(build([None], const), const)[0]) == 0.0


@pytest.mark.parametrize(
    "spec, why",
    [
        ((0, 4.0, None, None), "cut at the maximum: empty right child"),
        ((0, 7.5, None, None), "cut above the range"),
        ((0, -1.0, None, None), "cut below the range"),
        ((0, 2.0, (1, 5.5, None, None), None), "split on a dimension constant in the node"),
        ((0, 2.0, None, (0, 2.5, None, None)), "cut below the node's own range"),
        ((0, 0.5, (0, 0.0, None, None), None), "split of a single point"),
    ],
)
def test_out_of_support_is_minus_inf(spec, why):
    data = small_data()
    t = build([spec, TREE_A], data)
    for pr in (ChipmanPrior(A, B), PoissonPrior(3.0)):
        lp = pr.log_prob(t, data)
        assert lp[0] == -math.inf, why
        assert math.isfinite(float(lp[1]))


def test_split_prob():
    pr = ChipmanPrior(0.95, 0.5)
    d = torch.arange(5)
    assert torch.allclose(pr.split_prob(d), 0.95 * (1.0 + d.double()) ** -0.5)
    lps, lpn = pr.log_split_probs(d)
    assert torch.allclose(lps.exp() + lpn.exp(), torch.ones(5, dtype=torch.float64))
    assert torch.allclose(ChipmanPrior(0.5, 0.0).split_prob(d), torch.full((5,), 0.5, dtype=torch.float64))


# ------------------------------------------------------ normalisation
def enumerate_classes(data: Data, idx=None):
    """All trees up to the equivalence 'same cut interval': (spec, prod of gaps)."""
    X = data.X.double().numpy()
    idx = np.arange(data.n) if idx is None else idx
    yield None, 1.0
    xs = X[idx]
    for d in range(X.shape[1]):
        vals = np.unique(xs[:, d])
        for v0, v1 in zip(vals[:-1], vals[1:]):
            li, ri = idx[xs[:, d] <= v0], idx[xs[:, d] > v0]
            for (L, wl), (R, wr) in itertools.product(list(enumerate_classes(data, li)), list(enumerate_classes(data, ri))):
                yield (d, float((v0 + v1) / 2), L, R), (v1 - v0) * wl * wr


@pytest.mark.parametrize("alpha, beta", [(0.95, 0.5), (0.5, 2.0), (0.99, 0.0)])
def test_chipman_prior_integrates_to_one(alpha, beta):
    """sum over tree classes of h(T) x (product of cut-interval widths) = 1 (eq. 5
    is a density over cut locations), on data with ties and a constant-in-a-node dim."""
    X = np.array([[0.0, 1.0], [0.5, 1.0], [2.0, 3.0], [2.0, 4.5]])
    data = Data(X, [0, 1, 1, 0])
    classes = list(enumerate_classes(data))
    assert len(classes) > 20
    specs, widths = zip(*classes)
    t = build(list(specs), data)
    lp = ChipmanPrior(alpha, beta).log_prob(t, data)
    assert torch.isfinite(lp).all()
    total = float((lp.exp() * torch.tensor(widths, dtype=torch.float64)).sum())
    assert total == pytest.approx(1.0, abs=1e-9)


# ------------------------------------------------------------- Poisson
def test_poisson_leaf_term():
    pr = PoissonPrior(2.5)
    m = torch.arange(1, 8)
    want = [k * math.log(2.5) - math.log(math.exp(2.5) - 1) - math.lgamma(k + 1) for k in range(1, 8)]
    assert torch.allclose(pr.log_prob_leaves(m), torch.tensor(want, dtype=torch.float64))
    # zero-truncated Poisson: sums to one over m >= 1
    assert float(pr.log_prob_leaves(torch.arange(1, 60)).exp().sum()) == pytest.approx(1.0, abs=1e-12)


def test_poisson_log_prob_hand_computed():
    data = small_data()
    pr = PoissonPrior(2.5)
    t = build([TREE_A, None], data)
    lp = pr.log_prob(t, data)
    rules = 2 * (-math.log(2) - math.log(4))
    assert float(lp[0]) == pytest.approx(float(pr.log_prob_leaves(torch.tensor(3))) + rules, abs=1e-9)
    assert float(lp[1]) == pytest.approx(float(pr.log_prob_leaves(torch.tensor(1))), abs=1e-12)


# ---------------------------------------------------------- validation
@pytest.mark.parametrize("a, b", [(0.0, 0.5), (1.0, 0.5), (-0.1, 0.5), (float("nan"), 0.5), (0.5, -1.0), (0.5, float("inf")), (0.5, float("nan"))])
def test_chipman_parameter_validation(a, b):
    with pytest.raises(ValueError, match="alpha_split|beta_split"):
        ChipmanPrior(a, b)


@pytest.mark.parametrize("lam", [0.0, -2.0, float("inf"), float("nan")])
def test_poisson_parameter_validation(lam):
    with pytest.raises(ValueError, match="lambda"):
        PoissonPrior(lam)


@pytest.mark.parametrize("pr", [ChipmanPrior(0.8, 1.5), PoissonPrior(7.0)])
def test_config_round_trip(pr):
    back = prior_from_config(pr.config())
    assert type(back) is type(pr) and back.config() == pr.config() and repr(back) == repr(pr)
    data = small_data()
    t = build([TREE_A, None], data)
    assert torch.equal(back.log_prob(t, data), pr.log_prob(t, data))
    with pytest.raises(ValueError, match="unknown prior"):
        prior_from_config({"name": "uniform"})


# ---------------------------------------------------------- node_ranges
def test_node_ranges_by_hand():
    data = small_data()
    t = build([TREE_A], data, capacity=8)
    lo, hi, count = node_ranges(t, data.X)
    # nodes (bfs): 0 root, 1 {0,1}, 2 {3,4,4}, 3 {3,4}, 4 {4 (x1=9)}
    assert count[0].tolist() == [5, 2, 3, 2, 1, 0, 0, 0]
    assert lo[0, :5].tolist() == [[0, 5], [0, 5], [3, 5], [3, 5], [4, 9]]
    assert hi[0, :5].tolist() == [[4, 9], [1, 5], [4, 9], [4, 5], [4, 9]]
    assert torch.isinf(lo[0, 5:]).all() and (lo[0, 5:] > 0).all() and (hi[0, 5:] < 0).all()
    # chunking over trees gives the same
    t2 = build([TREE_A, None, (1, 5.0, None, None)], data)
    full = node_ranges(t2, data.X)
    chunked = node_ranges(t2, data.X, chunk_pairs=1)
    for a, b in zip(full, chunked):
        assert torch.equal(a, b)


# ----------------------------------------------- prior draws vs exact
def chi2_sf(x: float, dof: int) -> float:
    """Upper tail of the chi-square distribution (no scipy needed)."""
    return float(torch.special.gammaincc(torch.tensor(dof / 2, dtype=torch.float64), torch.tensor(x / 2, dtype=torch.float64)))


def chi2_pvalue(counts: np.ndarray, probs: np.ndarray, min_expected: float = 5.0):
    """Pearson chi-square, pooling adjacent bins until each expects >= min_expected."""
    n = counts.sum()
    exp = probs * n
    assert counts[exp == 0].sum() == 0, "a draw fell where the exact probability is zero"
    obs_p, exp_p, o, e = [], [], 0.0, 0.0
    for oi, ei in zip(counts, exp):
        o, e = o + oi, e + ei
        if e >= min_expected:
            obs_p.append(o)
            exp_p.append(e)
            o = e = 0.0
    if e > 0:  # fold the remainder into the last bin
        obs_p[-1] += o
        exp_p[-1] += e
    obs_p, exp_p = np.array(obs_p), np.array(exp_p)
    stat = float(((obs_p - exp_p) ** 2 / exp_p).sum())
    return chi2_sf(stat, len(obs_p) - 1), len(obs_p)


def test_chi2_helper_sanity():
    assert chi2_sf(3.841458820694124, 1) == pytest.approx(0.05, abs=1e-9)
    g = np.random.default_rng(0)
    probs = np.array([0.5, 0.3, 0.15, 0.05])
    p, _ = chi2_pvalue(np.bincount(g.choice(4, 5000, p=probs), minlength=4), probs)
    assert p > 1e-3
    p, _ = chi2_pvalue(np.bincount(g.choice(4, 5000, p=[0.45, 0.35, 0.15, 0.05]), minlength=4), probs)
    assert p < 1e-6  # the test has power against a 5-point shift


N_PRIOR_DRAWS = 8000


@pytest.fixture(scope="module")
def prior_draws():
    g = np.random.default_rng(2)
    X = np.column_stack([g.normal(size=7), g.integers(0, 3, 7)])  # ties in x1
    data = Data(X, g.integers(0, 2, 7))
    pr = ChipmanPrior(0.95, 0.5)
    post = TopDownSMC(pr, DirichletMultinomial(1.0), n_particles=N_PRIOR_DRAWS, use_likelihood=False).run(data, seed=11)
    # distinct trees with weights = multiplicity / N (no resampling without a likelihood)
    mult = (post.weights * N_PRIOR_DRAWS).round().long()
    assert int(mult.sum()) == N_PRIOR_DRAWS
    assert torch.allclose(post.weights * N_PRIOR_DRAWS, mult.double(), atol=1e-6)
    assert post.info["n_resample"] == 0
    return data, pr, post, mult


@pytest.mark.slow
def test_prior_draws_leaf_count_match_exact(prior_draws):
    """Chi-square of the number of leaves of 8000 prior draws against the exact
    enumeration; alpha = 1e-3 (the false-failure rate for an unseeded run)."""
    data, pr, post, mult = prior_draws
    exact = exact_prior_leaves(data, pr)
    assert exact.sum() == pytest.approx(1.0, abs=1e-12)
    counts = np.bincount(post.trees.n_leaves().numpy(), weights=mult.numpy(), minlength=len(exact))
    assert len(counts) == len(exact)
    p, bins = chi2_pvalue(counts, exact)
    assert bins >= 5
    assert p > 1e-3, (counts / N_PRIOR_DRAWS, exact)


@pytest.mark.slow
def test_prior_draws_depth_match_exact(prior_draws):
    """Same for the depth of the deepest leaf; alpha = 1e-3."""
    data, pr, post, mult = prior_draws
    exact = exact_prior_depth(data, pr)
    assert exact.sum() == pytest.approx(1.0, abs=1e-12)
    counts = np.bincount(post.trees.max_depth().numpy(), weights=mult.numpy(), minlength=len(exact))
    assert len(counts) == len(exact)
    p, bins = chi2_pvalue(counts, exact)
    assert bins >= 4
    assert p > 1e-3, (counts / N_PRIOR_DRAWS, exact)


@pytest.mark.slow
def test_prior_draws_are_in_support_and_valid(prior_draws):
    data, pr, post, _ = prior_draws
    post.trees.validate(data, DirichletMultinomial(1.0))
    assert torch.isfinite(pr.log_prob(post.trees, data)).all()
    # the stump fraction is 1 - alpha_s (the root's data varies): 3.9-sigma band, binomial
    p0 = float(post.weights[post.trees.n_nodes == 1].sum())
    sd = math.sqrt(0.05 * 0.95 / N_PRIOR_DRAWS)
    assert abs(p0 - 0.05) < 3.9 * sd


@pytest.mark.slow
def test_prior_draws_root_rule_is_uniform(prior_draws):
    """Given a split, the root's dimension is uniform over the varying dims
    (chi-square) and its cut uniform over the data range (KS); alpha = 1e-3 each."""
    data, pr, post, mult = prior_draws
    t = post.trees
    split = t.n_nodes > 1
    f = t.feature[split, 0].long()
    m = mult[split]
    counts = torch.zeros(2, dtype=torch.float64).index_add_(0, f, m.double()).numpy()
    p, _ = chi2_pvalue(counts, np.array([0.5, 0.5]))
    assert p > 1e-3, counts
    # cut locations scaled to [0, 1) by the root's range in the chosen dim, pooled over dims
    lo, hi = data.X.min(0).values.double(), data.X.max(0).values.double()
    u = (t.threshold[split, 0].double() - lo[f]) / (hi[f] - lo[f])
    u, _ = torch.sort(u.repeat_interleave(m))
    n = u.numel()
    assert n == int(m.sum()) and float(u.min()) >= 0 and float(u.max()) < 1
    i = torch.arange(1, n + 1, dtype=torch.float64)
    ks = float(torch.maximum(i / n - u, u - (i - 1) / n).max())
    assert ks * math.sqrt(n) < 1.9495, ks  # Kolmogorov critical value at 1e-3


def test_poisson_normaliser_does_not_overflow():
    """log(e^lam - 1) was computed as log(expm1(lam)): OverflowError above lam ~ 709."""
    big = PoissonPrior(1000.0).log_prob_leaves(torch.tensor([1000]))
    # Stirling: log p(m = lam) ~ -0.5 log(2 pi lam) for a large Poisson mean
    assert float(big) == pytest.approx(-0.5 * math.log(2 * math.pi * 1000), abs=1e-3)


def test_make_prior_refuses_settings_it_would_drop():
    from torchtree.model.priors import ChipmanPrior, make_prior

    assert make_prior("poisson", poisson_lambda=3.0).lam == 3.0
    assert make_prior(None, 0.9, 1.0).config() == ChipmanPrior(0.9, 1.0).config()
    obj = ChipmanPrior(0.5, 0.5)
    assert make_prior(obj) is obj
    with pytest.raises(ValueError, match="alpha_split do\\(es\\) not apply"):
        make_prior(obj, alpha_split=0.99)
    with pytest.raises(ValueError, match="poisson_lambda do\\(es\\) not apply to prior='chipman'"):
        make_prior("chipman", poisson_lambda=2.0)
    with pytest.raises(ValueError, match="prior must be 'chipman', 'poisson' or a prior object"):
        make_prior("uniform")
