"""Top-down SMC (paper 001) against exact answers on tiny data.

Tolerances: an SMC run's log-evidence estimate on these data has a standard
deviation of about 0.03-0.10 (200 particles); averaging the evidence over R
seeds (log-mean-exp) gives a standard error of about sd / sqrt(R). The
tolerances below are 4-5 standard errors, so a correct sampler fails a given
check with probability well under 1e-4 (the seeds are fixed, so the suite is
deterministic: these numbers say how unlucky a fixed seed would have to be).
"""
import math

import numpy as np
import pytest
import torch

from torchtree import ChipmanPrior, Data, DirichletMultinomial, NormalInverseGamma, TopDownSMC, TraceMonitor
from torchtree.steps.growth import Grower
from torchtree.testing import exact_log_evidence, exact_predictive, exact_prior_depth, exact_prior_leaves

PROPOSALS = ["prior", "empirical", "optimal"]
EXPANSIONS = ["node", "layer"]


def tiny_classification(seed=0, n=8):
    rng = np.random.default_rng(seed)
    X = rng.normal(size=(n, 2))
    X[:2, 1] = X[2, 1]  # ties in one feature exercise the distinct-value intervals
    y = (X[:, 0] + 0.3 * rng.normal(size=n) > 0).astype(int)
    return Data(X, y), rng.normal(size=(5, 2))


def tiny_regression(seed=1, n=7):
    rng = np.random.default_rng(seed)
    X = rng.normal(size=(n, 2))
    y = 2 * X[:, 0] + 0.3 * rng.normal(size=n)
    return Data(X, y, task="regression"), rng.normal(size=(4, 2))


def log_mean_exp(v):
    v = np.asarray(v)
    return float(np.log(np.mean(np.exp(v - v.max()))) + v.max())


@pytest.mark.slow
@pytest.mark.parametrize("proposal", PROPOSALS)
@pytest.mark.parametrize("expansion", EXPANSIONS)
def test_evidence_and_predictive_converge_to_exact(proposal, expansion):
    data, Xq = tiny_classification()
    prior, lik = ChipmanPrior(0.95, 0.5), DirichletMultinomial(5.0)
    exact = exact_log_evidence(data, prior, lik)
    exact_pred = exact_predictive(data, prior, lik, Xq)
    R = 12
    ests, preds = [], []
    for s in range(R):
        post = TopDownSMC(prior, lik, n_particles=200, proposal=proposal, expansion=expansion).run(data, seed=s)
        ests.append(post.log_evidence)
        preds.append(post.predict_proba(Xq))
    assert abs(log_mean_exp(ests) - exact) < 0.08, (log_mean_exp(ests), exact)
    # predictive probabilities: per-run sd about 0.02, mean of 12 -> se 0.006
    assert np.abs(np.mean(preds, 0) - exact_pred).max() < 0.03


@pytest.mark.slow
@pytest.mark.parametrize("proposal", ["prior", "optimal"])
def test_regression_evidence_and_predictive(proposal):
    data, Xq = tiny_regression()
    prior = ChipmanPrior(0.95, 0.5)
    lik = NormalInverseGamma.default_for(data.y)
    exact = exact_log_evidence(data, prior, lik)
    exact_mean = exact_predictive(data, prior, lik, Xq)[:, 0]
    ests, means = [], []
    for s in range(10):
        post = TopDownSMC(prior, lik, n_particles=300, proposal=proposal).run(data, seed=s)
        ests.append(post.log_evidence)
        means.append(post.predict(Xq))
    assert abs(log_mean_exp(ests) - exact) < 0.1
    # predictive means have per-run sd about 0.05 (targets have sd ~2)
    assert np.abs(np.mean(means, 0) - exact_mean).max() < 0.08


@pytest.mark.slow
@pytest.mark.parametrize("expansion", EXPANSIONS)
def test_prior_only_reproduces_tree_size_distribution(expansion):
    """With the likelihood switched off, the particles are prior draws."""
    rng = np.random.default_rng(3)
    X = rng.normal(size=(7, 2))
    data = Data(X, rng.integers(0, 2, 7), n_classes=2)
    prior = ChipmanPrior(0.95, 0.5)
    n = 6000
    post = TopDownSMC(prior, DirichletMultinomial(), n_particles=n, expansion=expansion, use_likelihood=False).run(data, seed=11)
    trees = post.trees
    w = post.weights.numpy()
    leaves = trees.n_leaves().numpy()
    depth = trees.max_depth().numpy()
    for values, expected in ((leaves, exact_prior_leaves(data, prior)), (depth, exact_prior_depth(data, prior))):
        observed = np.bincount(values, weights=w * n, minlength=len(expected))[: len(expected)]
        exp_counts = expected * n
        keep = exp_counts >= 5  # pool bins too small for the chi-square approximation
        obs = np.append(observed[keep], observed[~keep].sum())
        exp = np.append(exp_counts[keep], exp_counts[~keep].sum())
        nz = exp > 0
        chi2 = float((((obs - exp) ** 2)[nz] / exp[nz]).sum())
        dof = int(nz.sum()) - 1
        # 99.9% quantile of chi-square via Wilson-Hilferty (alpha = 1e-3)
        z = 3.09
        crit = dof * (1 - 2 / (9 * dof) + z * math.sqrt(2 / (9 * dof))) ** 3
        assert chi2 < crit, (chi2, crit, obs, exp)


def _hand_data():
    # One feature with distinct values 0, 1, 3: intervals (0,1) and (1,3), range 3.
    return Data(np.array([[0.0], [1.0], [3.0]]), np.array([0, 0, 1]))


def _l(lik, counts):
    return float(lik.log_marginal(torch.tensor(counts, dtype=torch.float32)))


@pytest.mark.parametrize("proposal", PROPOSALS)
def test_incremental_weights_match_hand_computation(proposal):
    data = _hand_data()
    prior, lik = ChipmanPrior(0.95, 0.5), DirichletMultinomial(5.0)
    g = Grower(prior, lik, data, proposal, seed=5)
    P = 400
    state = g.init_state(P)
    pp = torch.arange(P)
    res = g.expand(state, pp, torch.zeros(P, dtype=torch.long), pp, stage=0)
    trees = g.to_trees(state)
    lp = _l(lik, [2, 1])
    splits = {0.0: ([1, 0], [1, 1]), 1.0: ([2, 0], [0, 1])}  # keyed by the lower end of the interval
    p = 0.95
    z_opt = math.log((1 - p) * math.exp(lp) + p * (1 / 3 * math.exp(_l(lik, [1, 0]) + _l(lik, [1, 1])) + 2 / 3 * math.exp(_l(lik, [2, 0]) + _l(lik, [0, 1]))))
    assert res.split.any() and (~res.split).any()
    for i in range(P):
        lw = float(res.log_weight[i])
        if not res.split[i]:
            expected = z_opt - lp if proposal == "optimal" else 0.0
        else:
            thr = float(trees.threshold[i, 0])
            lo = 0.0 if thr < 1.0 else 1.0
            left, right = splits[lo]
            gap = 1.0 if lo == 0.0 else 2.0
            if proposal == "prior":
                expected = _l(lik, left) + _l(lik, right) - lp
            elif proposal == "empirical":
                expected = _l(lik, left) + _l(lik, right) - lp + math.log(2 * gap / 3)
            else:
                expected = z_opt - lp
        assert lw == pytest.approx(expected, abs=1e-9), (i, proposal)
    if proposal != "optimal":
        # The prior proposal splits the root with probability alpha_s = 0.95.
        assert abs(float(res.split.double().mean()) - 0.95) < 4 * math.sqrt(0.95 * 0.05 / P)


def test_optimal_proposal_interval_frequencies():
    """The optimal proposal picks interval j with probability proportional to its term."""
    data = _hand_data()
    prior, lik = ChipmanPrior(0.95, 0.5), DirichletMultinomial(5.0)
    g = Grower(prior, lik, data, "optimal", seed=1)
    P = 20000
    state = g.init_state(P)
    pp = torch.arange(P)
    g.expand(state, pp, torch.zeros(P, dtype=torch.long), pp, stage=0)
    trees = g.to_trees(state)
    lp = _l(lik, [2, 1])
    p = 0.95
    terms = np.array([(1 - p) * math.exp(lp), p / 3 * math.exp(_l(lik, [1, 0]) + _l(lik, [1, 1])), p * 2 / 3 * math.exp(_l(lik, [2, 0]) + _l(lik, [0, 1]))])
    probs = terms / terms.sum()
    split = trees.status[:, 0] == 3
    thr = trees.threshold[:, 0]
    freq = np.array([float((~split).double().mean()), float((split & (thr < 1)).double().mean()), float((split & (thr >= 1)).double().mean())])
    assert np.abs(freq - probs).max() < 5 * np.sqrt(probs * (1 - probs) / P).max()
    # within the chosen interval the cut is uniform: its mean is the midpoint
    in_second = split & (thr >= 1)
    assert abs(float(thr[in_second].mean()) - 2.0) < 0.05


def test_same_seed_same_result_and_islands():
    data, Xq = tiny_classification(n=10)
    a = TopDownSMC(n_particles=60, n_islands=3).run(data, seed=4)
    b = TopDownSMC(n_particles=60, n_islands=3).run(data, seed=4)
    c = TopDownSMC(n_particles=60, n_islands=3).run(data, seed=5)
    assert a.log_evidence == b.log_evidence
    assert np.array_equal(a.predict_proba(Xq), b.predict_proba(Xq))
    assert a.log_evidence != c.log_evidence
    assert len(a.info["island_log_evidence"]) == 3
    isl = np.array(a.info["island_log_evidence"])
    assert a.log_evidence == pytest.approx(log_mean_exp(isl))


def test_monitor_receives_stage_reports():
    data, _ = tiny_classification(n=10)
    mon = TraceMonitor()
    post = TopDownSMC(n_particles=50).run(data, seed=0, monitor=mon)
    for key in ("smc/ess", "smc/log_evidence", "smc/resampled", "trees/leaves_mean", "trees/depth_max", "smc/open_nodes", "time/seconds"):
        assert key in mon.trace, key
        assert len(mon.trace[key]) == post.info["n_stages"]
    assert mon.trace["smc/log_evidence"][-1] == pytest.approx(post.log_evidence)


@pytest.mark.slow
def test_trees_are_valid_and_leaf_stats_consistent():
    rng = np.random.default_rng(0)
    X = rng.normal(size=(300, 4))
    X[:, 3] = 1.0  # a constant feature is never split on
    y = (X[:, 0] * X[:, 1] > 0).astype(int)
    data = Data(X, y)
    lik = DirichletMultinomial(5.0)
    for proposal in PROPOSALS:
        for expansion in EXPANSIONS:
            post = TopDownSMC(None, lik, n_particles=40, proposal=proposal, expansion=expansion).run(data, seed=1)
            post.trees.validate(data, lik)
            internal = post.trees.status == 3
            assert not bool((post.trees.feature[internal] == 3).any())
            assert post.accuracy(X, y) > 0.8


def test_parameter_validation_errors():
    with pytest.raises(ValueError, match="n_islands"):
        TopDownSMC(n_particles=10, n_islands=3)
    with pytest.raises(ValueError, match="proposal"):
        TopDownSMC(proposal="best")
    with pytest.raises(ValueError, match="expansion"):
        TopDownSMC(expansion="depth")
    with pytest.raises(ValueError, match="resampling"):
        TopDownSMC(resampling="fancy")
    with pytest.raises(ValueError, match="ess_threshold"):
        TopDownSMC(ess_threshold=2.0)
    data, _ = tiny_classification()
    with pytest.raises(ValueError, match="regression"):
        TopDownSMC(likelihood=NormalInverseGamma()).run(data, seed=0)


def test_memory_limit_gives_clear_error():
    rng = np.random.default_rng(0)
    X = rng.normal(size=(2000, 3))
    y = rng.integers(0, 2, 2000)
    with pytest.raises(MemoryError, match="n_particles"):
        TopDownSMC(n_particles=50, max_memory_bytes=20_000).run(Data(X, y), seed=0)
