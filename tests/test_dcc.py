"""DCC-Tree pieces: LAIS evidence against known answers, incremental evidence, utility,
topology prior and moves, and an end-to-end DCC run."""
import math
import random

import pytest
import torch

from torchtree.soft import DCC, NUTS, SoftTrees, Topology
from torchtree.samplers.nuts.chains import draw, make_kernel, warmup
from torchtree.samplers.dcc.lais import EvidenceAccumulator, lais_log_weights
from torchtree.model.topology import propose_topology, sample_prior_topologies
from torchtree.samplers.dcc.utility import dcc_utility, exploitation_term, exploration_term


# ----------------------------------------------------------------------------- LAIS
P = 5
Y = torch.tensor([1.5, -0.7, 2.2, 0.3, -1.9], dtype=torch.float64)


def conjugate_log_target(theta):
    """log N(Y | theta, I) + log N(theta | 0, I); evidence N(Y | 0, 2 I)."""
    return (-0.5 * (Y - theta) ** 2 - 0.5 * theta**2 - math.log(2 * math.pi)).sum(-1)


LOG_Z = float((-0.25 * Y**2 - 0.5 * math.log(4 * math.pi)).sum())


@pytest.mark.parametrize("form", ["spatial", "basic"])
def test_lais_conjugate_gaussian_exact_draws(form):
    g = torch.Generator().manual_seed(0)
    # two groups; the second uses only the first 3 coordinates (padded like a topology)
    draws = Y / 2 + math.sqrt(0.5) * torch.randn(2, 4, 60, P, generator=g, dtype=torch.float64)
    mask = torch.ones(2, P, dtype=torch.bool)
    mask[1, 3:] = False
    draws[1, :, :, 3:] = 0.0  # inactive coordinates do not move

    def log_target(xi):
        out = conjugate_log_target(xi)
        out[1] = (-0.5 * (Y[:3] - xi[1, :, :3]) ** 2 - 0.5 * xi[1, :, :3] ** 2 - math.log(2 * math.pi)).sum(-1)
        return out

    acc = EvidenceAccumulator(2)
    acc.update(lais_log_weights(draws, mask, log_target, 10, g, form).reshape(2, -1))
    log_z3 = float((-0.25 * Y[:3] ** 2 - 0.5 * math.log(4 * math.pi)).sum())
    # 2400 weights of a 5-d Gaussian target: the spatial (mixture) form is within 5%.
    # The basic form is unbiased but, with Sigma equal to the posterior covariance,
    # its weights have infinite variance (the integral over the centre diverges), so
    # it only gets a loose tolerance.
    if form == "spatial":
        assert abs(float(acc.log_evidence[0]) - LOG_Z) < 0.05
        assert abs(float(acc.log_evidence[1]) - log_z3) < 0.05
    else:
        assert abs(float(acc.log_evidence[0]) - LOG_Z) < 0.5
        assert math.isfinite(float(acc.log_evidence[1]))


def test_lais_with_nuts_draws_and_incremental_update():
    g = torch.Generator().manual_seed(1)

    def pg(x, rows=None):
        return -conjugate_log_target(x), -(Y - x) + x

    k = make_kernel("nuts", max_tree_depth=5)
    ch, _ = warmup(k, pg, torch.randn(6, P, generator=g, dtype=torch.float64), 100, generator=g)
    acc = EvidenceAccumulator(1)
    all_lw = []
    for _ in range(3):  # three visits, folded in with eq. 65
        ch, tr = draw(k, pg, ch, 30, generator=g)
        lw = lais_log_weights(tr.positions.permute(1, 0, 2).unsqueeze(0), torch.ones(1, P, dtype=torch.bool),
                              lambda xi: conjugate_log_target(xi), 5, g)
        acc.update(lw.reshape(1, -1))
        all_lw.append(lw.reshape(-1))
    batch = torch.logsumexp(torch.cat(all_lw), 0) - math.log(torch.cat(all_lw).numel())
    assert abs(float(acc.log_evidence[0]) - float(batch)) < 1e-10
    assert abs(float(acc.log_evidence[0]) - LOG_Z) < 0.1
    assert math.isfinite(float(acc.log_var_w[0])) and float(acc.logw_std[0]) > 0


@pytest.mark.slow
def test_soft_tree_evidence_matches_quadrature():
    # One split on one feature: the only parameter is the threshold, so the evidence
    # is a 1-d integral over tau in (0, 1) (Beta(1, 1) prior) done by quadrature.
    g = torch.Generator().manual_seed(2)
    N = 40
    X = torch.rand(N, 1, generator=g, dtype=torch.float64)
    y = ((X[:, 0] + 0.2 * torch.randn(N, generator=g, dtype=torch.float64)) > 0.5).long()
    h = 0.1
    grid = torch.linspace(1e-5, 1 - 1e-5, 20001, dtype=torch.float64)
    m = SoftTrees(X, [Topology((0,))], y=y, n_chains=grid.numel(), sharpness=h, dtype=torch.float64)
    theta = m.unconstrain(thresholds=grid.unsqueeze(-1))
    ll = m.log_likelihood(theta)
    log_z = float(torch.logsumexp(ll, 0) + math.log(float(grid[1] - grid[0])))
    post = NUTS(n_chains=8, n_samples=100, n_warmup=100, depth=1, sharpness=h, evidence=True, n_proposals=5,
                max_tree_depth=5, dtype=torch.float64).run((X, y), seed=0)
    assert abs(post.log_evidence - log_z) < 0.05, (post.log_evidence, log_z)
    # the draws are draw-major over the chains: 8 chains' rows of draw s, then draw s + 1 (info says how many)
    assert post.info["n_chains"] == 8 and post.draws[0].shape[0] == 8 * 100


# ----------------------------------------------------------------------------- utility
def test_utility_terms():
    log_z = torch.tensor([-1000.0, -1001.0, -1010.0], dtype=torch.float64)
    log_var = torch.tensor([-2002.0, -2003.0, -2000.0], dtype=torch.float64)
    tau = exploitation_term(log_z, log_var)
    # tau_m = sqrt(Z_m^2 + Var_m), computed relative to the largest (shift by e^1000)
    ref = torch.sqrt(torch.exp(2 * (log_z + 1000)) + torch.exp(log_var + 2000))
    assert torch.allclose(tau, ref / ref.max(), rtol=1e-10)
    assert float(tau[2]) > float(tau[1])  # a large weight variance raises the exploitation term
    rho = exploration_term(torch.tensor([0.0, -5.0]), torch.tensor([1.0, 1.0]), 2.0, 1000.0)
    assert 0 < float(rho[1]) < float(rho[0]) <= 1
    u = dcc_utility(log_z, log_var, torch.zeros(3), torch.ones(3), 2.0, torch.tensor([1, 1, 10]))
    assert float(u[2]) < float(u[0])  # often-refined topologies lose priority


# ----------------------------------------------------------------------------- topologies
def test_topology_prior_and_moves():
    t = Topology((0, 2, 5))
    assert t.leaves == (1, 6, 11, 12) and t.depth == 3 and t.prunable() == (5,)
    a, b = 0.95, 1.0
    # Chipman prior: a stump with two leaves at depth 1
    assert Topology((0,)).log_prior(a, b) == pytest.approx(math.log(a) + 2 * math.log(1 - a / 2))
    # prior draws: frequency of the one-split tree matches its prior probability
    draws = sample_prior_topologies(4000, a, b, max_depth=6, rng=random.Random(0), min_internal=0)
    p_stump = math.exp(Topology((0,)).log_prior(a, b))
    freq = sum(d == Topology((0,)) for d in draws) / len(draws)
    assert abs(freq - p_stump) < 5 * math.sqrt(p_stump * (1 - p_stump) / len(draws))
    rng = random.Random(1)
    seen = {propose_topology(t, rng, (0.6, 0.3, 0.1), max_depth=3)[1] for _ in range(200)}
    assert seen == {"grow", "prune", "stay"}
    for _ in range(100):
        new, move = propose_topology(Topology((0,)), rng, max_depth=3)
        assert move != "prune" and new.n_internal >= 1
    full = Topology.full(2)
    assert all(propose_topology(full, rng, max_depth=2)[1] != "grow" for _ in range(50))


# ----------------------------------------------------------------------------- end to end
class _Recorder:
    def __init__(self):
        self.start, self.steps, self.end = None, [], None

    def on_start(self, info):
        self.start = dict(info)

    def on_step(self, step, info):
        self.steps.append((step, dict(info)))

    def on_end(self, info):
        self.end = dict(info)


@pytest.mark.slow
def test_dcc_end_to_end_regression():
    from torchtree.datasets.synthetic import wu

    Xtr, ytr, Xte, yte = wu(n_per_group=30, seed=0)
    mon = _Recorder()
    dcc = DCC(n_iterations=4, n_initial=30, n_chains=4, n_samples=6, n_warmup=30, n_parallel=3, activation_threshold=2,
              max_depth=3, h_init=0.2, h_final=0.05, max_tree_depth=4, warm_start=True, n_warmup_warm=10)
    post = dcc.run((Xtr, ytr), seed=0, monitor=mon)
    assert mon.start is not None and mon.end is not None
    tags = set().union(*(d.keys() for _, d in mon.steps))
    assert {"dcc/n_active", "dcc/topology_log_evidence", "dcc/utilities", "hmc/step_size", "hmc/accept"} <= tags
    w = post.weights
    assert torch.allclose(w.sum(), torch.tensor(1.0, dtype=torch.float64))
    assert post.topology_log_evidence.shape == (len(post.topologies),)
    assert math.isfinite(post.log_evidence)
    pred = post.predict(Xte)
    mse = float(((torch.as_tensor(pred) - yte) ** 2).mean())
    assert mse < 1.0  # var(y) ~ 2.7; a tree with the right first split gets far below 1
    assert post.predict_interval(Xte[:5]).shape == (5, 2)
    assert post.info["warmups"] == len(post.topologies)
    # every NUTS iteration moves at least one topology's 4 chains; the rate is per chain transition
    info = post.info
    assert info["transitions"] >= 4 * info["nuts_iterations"] > 0
    assert info["divergence_rate"] == info["divergences"] / info["transitions"]
    # the draws-based local posterior is available from the same run
    dcc.local_posterior = "draws"
    alt = dcc._posterior(post.data, post.run_records, post.run_evidence, {})
    assert not hasattr(dcc, "records_")  # nothing of the run lives on the sampler
    assert torch.allclose(alt.weights, post.weights)


def test_dcc_final_monitor_values_use_their_own_names():
    """on_end used to repeat the per-iteration dcc/n_active and dcc/log_evidence tags (one
    extra point on the last step) and gave no log_evidence, which the other samplers give."""
    g = torch.Generator().manual_seed(0)
    X = torch.rand(40, 2, generator=g)
    y = (X[:, 0] > 0.5).long()
    mon = _Recorder()
    post = DCC(n_iterations=2, n_initial=5, n_chains=2, n_samples=3, n_warmup=5, n_warmup_warm=3, n_parallel=1,
               activation_threshold=1, max_depth=2).run((X, y), seed=0, monitor=mon)
    assert set(mon.end) == {"log_evidence", "n_active", "topology_log_evidence", "seconds", "divergence_rate",
                            "posterior"}
    assert 0 <= mon.end["divergence_rate"] <= 1
    assert mon.end["log_evidence"] == post.log_evidence and mon.end["posterior"] is post
    per_iteration = [d["dcc/log_evidence"] for _, d in mon.steps if "dcc/log_evidence" in d]
    assert len(per_iteration) == post.info["iterations"]


def test_warm_start_inheritance_map():
    from torchtree.samplers.dcc.sampler import _compact_keys, _inherit

    parent, child = Topology((0, 1)), Topology((0, 1, 4))  # grow leaf 4
    keys_p = _compact_keys(parent, 3, True)
    src = _inherit(child, parent, 3, True)
    got = {k: [keys_p[j] for j in js] for k, js in zip(_compact_keys(child, 3, True), src)}
    assert got[("u", 1)] == [("u", 1)] and got[("w", 0, 1)] == [("w", 0, 1)]
    assert got[("u", 4)] == [] and got[("w", 4, 0)] == []  # the new split starts from its prior draw
    assert got[("mu", 9)] == [("mu", 4)] and got[("mu", 10)] == [("mu", 4)]  # children inherit the leaf mean
    back = {k: [_compact_keys(child, 3, True)[j] for j in js]
            for k, js in zip(keys_p, _inherit(parent, child, 3, True))}
    assert back[("mu", 4)] == [("mu", 9), ("mu", 10)]  # prune: mean of the two leaves
