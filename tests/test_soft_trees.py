"""SoftTrees: potential and gradient against finite differences and a plain per-chain
implementation built from torch.distributions; layouts, rows, prior draws and a
prior-only NUTS run that must reproduce the priors."""
import math

import pytest
import torch
import torch.distributions as td

from torchtree.soft import NUTS, SoftTreeHyper, SoftTrees, Topology
from torchtree.samplers.nuts.chains import draw, make_kernel, warmup


TOPOLOGIES = [Topology((0,)), Topology((0, 2, 5)), Topology((0, 1, 2, 3))]
HYPER = SoftTreeHyper(split_concentration=0.7, threshold_a=1.5, threshold_b=2.0, sigma_shape=2.5)


def _data(task, D=3, N=40, seed=0):
    g = torch.Generator().manual_seed(seed)
    X = torch.rand(N, D, generator=g, dtype=torch.float64) * 5 - 1
    if task == "classification":
        y = torch.randint(0, 3, (N,), generator=g)
    else:
        y = torch.randn(N, generator=g, dtype=torch.float64)
    return X, y


def _model(task, D=3, n_chains=2, seed=0, **kw):
    X, y = _data(task, D, seed=seed)
    g = torch.Generator().manual_seed(seed + 1)
    h = torch.tensor([0.1, 0.3] * len(TOPOLOGIES), dtype=torch.float64)[: len(TOPOLOGIES) * n_chains]
    m = SoftTrees(X, TOPOLOGIES, y=y, n_chains=n_chains, sharpness=h, hyper=HYPER, dtype=torch.float64,
                  generator=g, **kw)
    theta = m.theta.data + 0.5 * torch.randn(m.theta.shape, generator=g, dtype=torch.float64) * m.coord_mask
    return m, theta


def _plain_log_density(m: SoftTrees, theta_row, topo: Topology, h: float):
    """One tree at a time, unpadded, from constrained parameters and torch.distributions."""
    lay, hp = m.layout, m.hyper
    D = lay.n_features
    X, y = m.X, m.y
    lp = torch.zeros((), dtype=theta_row.dtype)
    psi = {}
    for j in topo.internal:
        z = theta_row[j * (D - 1) : (j + 1) * (D - 1)]
        zext = torch.cat([z, torch.zeros(1, dtype=z.dtype)])
        w = torch.softmax(zext, 0)
        u = theta_row[lay.u_offset + j]
        tau = torch.sigmoid(u)
        if D > 1:
            lp = lp + td.Dirichlet(torch.full((D,), hp.split_concentration, dtype=w.dtype)).log_prob(w)
            lp = lp + torch.log(w).sum()  # Jacobian of softmax([z, 0])
        lp = lp + td.Beta(torch.tensor(hp.threshold_a, dtype=w.dtype), torch.tensor(hp.threshold_b, dtype=w.dtype)).log_prob(tau)
        lp = lp + torch.log(tau) + torch.log1p(-tau)
        psi[j] = torch.sigmoid((X @ w - tau) / h)
    phis = []
    for leaf in topo.leaves:
        prob = torch.ones(X.shape[0], dtype=X.dtype)
        node = leaf
        while node > 0:
            parent = (node - 1) // 2
            prob = prob * (psi[parent] if node == 2 * parent + 2 else 1 - psi[parent])
            node = parent
        phis.append(prob)
    phi = torch.stack(phis, 1)  # [N, n_leaves]
    if m.task == "classification":
        C = m.data.n_classes
        a = hp.alpha / C
        ll = torch.zeros((), dtype=X.dtype)
        for k in range(phi.shape[1]):
            cnt = torch.stack([phi[y == c, k].sum() for c in range(C)])
            ll = ll + torch.lgamma(torch.tensor(hp.alpha, dtype=X.dtype)) - torch.lgamma(cnt.sum() + hp.alpha)
            ll = ll + (torch.lgamma(cnt + a) - math.lgamma(a)).sum()
    else:
        slots = topo.leaf_slots(lay.depth)
        mu = torch.stack([theta_row[lay.mu_offset + s] for s in slots])
        s = theta_row[lay.s_offset]
        sigma2 = torch.exp(s)
        lp = lp + td.Normal(torch.tensor(hp.mu_mean, dtype=X.dtype), math.sqrt(hp.mu_var)).log_prob(mu).sum()
        lp = lp + td.InverseGamma(torch.tensor(hp.sigma_shape, dtype=X.dtype), torch.tensor(hp.sigma_scale, dtype=X.dtype)).log_prob(sigma2) + s
        ll = td.Normal(phi @ mu, sigma2.sqrt()).log_prob(y).sum()
    return ll + lp


@pytest.mark.parametrize("task", ["classification", "regression"])
@pytest.mark.parametrize("D", [1, 3])
def test_potential_matches_plain_per_chain(task, D):
    m, theta = _model(task, D)
    U = m.potential(theta)
    hs = m.sharpness.tolist()
    for b in range(m.batch_size):
        topo = m.topologies[int(m.topology_index[b])]
        ref = -_plain_log_density(m, theta[b], topo, hs[b])
        assert torch.allclose(U[b], ref, rtol=1e-10, atol=1e-8), (b, U[b], ref)
    # gradients: analytic == autograd == autograd of the plain implementation
    U1, g1 = m.potential_and_grad(theta)
    U2, g2 = m.potential_and_grad_autograd(theta)
    assert torch.allclose(U1, U2, atol=1e-9) and torch.allclose(g1, g2, atol=1e-9, rtol=1e-8)
    for b in range(m.batch_size):
        th = theta[b].clone().requires_grad_(True)
        topo = m.topologies[int(m.topology_index[b])]
        (gref,) = torch.autograd.grad(-_plain_log_density(m, th, topo, hs[b]), th)
        assert torch.allclose(g1[b], gref, atol=1e-8, rtol=1e-7)


@pytest.mark.parametrize("task", ["classification", "regression"])
def test_gradient_matches_finite_differences(task):
    m, theta = _model(task, 3, n_chains=1)
    _, g = m.potential_and_grad(theta)
    eps = 1e-6
    for b in range(m.batch_size):
        for i in m.coord_mask[b].nonzero().squeeze(1).tolist():
            tp, tm = theta.clone(), theta.clone()
            tp[b, i] += eps
            tm[b, i] -= eps
            fd = (m.potential(tp)[b] - m.potential(tm)[b]) / (2 * eps)
            assert abs(float(fd - g[b, i])) < 1e-5 * max(1.0, abs(float(fd))), (b, i, fd, g[b, i])
    # inactive coordinates: no gradient, and the potential does not depend on them
    assert (g[~m.coord_mask] == 0).all()
    t2 = theta.clone()
    t2[~m.coord_mask] = 3.0
    assert torch.allclose(m.potential(t2), m.potential(theta))


def test_rows_and_padding_depth_do_not_change_a_topology():
    X, y = _data("regression", 3)
    topo = Topology((0, 2))
    small = SoftTrees(X, [topo], y=y, n_chains=3, hyper=HYPER, dtype=torch.float64)
    big = SoftTrees(X, [Topology((0, 1, 3, 7)), topo], y=y, n_chains=3, hyper=HYPER, dtype=torch.float64)
    compact = small.theta.data[:, small.compact_index(0)]
    theta_big = big.theta.data.clone()
    theta_big[3:, big.compact_index(1)] = compact
    assert big.depth == 4 and small.depth == 2
    assert torch.allclose(small.potential(small.theta.data), big.potential(theta_big)[3:])
    rows = torch.tensor([4, 4, 0])
    U, g = big.potential_and_grad(theta_big[rows], rows)
    Uf, gf = big.potential_and_grad(theta_big)
    assert torch.allclose(U, Uf[rows]) and torch.allclose(g, gf[rows])


def test_prior_draws_have_prior_moments():
    X, y = _data("regression", 4, N=10)
    m = SoftTrees(X, [Topology.full(2)], y=y, n_chains=20000, hyper=HYPER, dtype=torch.float64,
                  generator=torch.Generator().manual_seed(3))
    c = m.constrain(m.theta.data)
    a, b = HYPER.threshold_a, HYPER.threshold_b
    tau = c["thresholds"][:, 0]
    # 20000 draws: standard errors ~ 0.002 (tau), 0.002 (weights); 5 SE tolerances
    assert abs(float(tau.mean()) - a / (a + b)) < 0.01
    assert abs(float(c["weights"][:, 1, 2].mean()) - 0.25) < 0.01
    mu = c["mu"][:, 0]
    assert abs(float(mu.mean()) - m.hyper.mu_mean) < 5 * math.sqrt(m.hyper.mu_var / 20000)


def _chain_mean_se(x):
    """Mean and standard error from per-chain means; x [S, C]."""
    cm = x.mean(0)
    return float(cm.mean()), float(cm.std() / math.sqrt(x.shape[1]))


@pytest.mark.slow
def test_prior_only_nuts_reproduces_priors():
    X, y = _data("regression", 3, N=30)
    m = SoftTrees(X, [Topology((0, 1))], y=y, n_chains=20, hyper=HYPER, include_likelihood=False,
                  dtype=torch.float64, generator=torch.Generator().manual_seed(0))
    g = torch.Generator().manual_seed(1)
    k = make_kernel("nuts", max_tree_depth=5)
    ch, _ = warmup(k, m.potential_and_grad, m.theta.data, 80, generator=g, coord_mask=m.coord_mask)
    _, tr = draw(k, m.potential_and_grad, ch, 120, generator=g)
    assert (tr.positions[:, ~m.coord_mask] == m.theta.data[~m.coord_mask]).all()  # frozen padding
    S, C, P = tr.positions.shape
    c = m.constrain(tr.positions.reshape(S * C, P))
    a, b = HYPER.threshold_a, HYPER.threshold_b
    checks = [
        (c["thresholds"][:, 0], a / (a + b)),
        (c["thresholds"][:, 1] ** 2, a * (a + 1) / ((a + b) * (a + b + 1))),
        (c["weights"][:, 0, 0], 1 / 3),
        (c["mu"][:, 0], m.hyper.mu_mean),
        ((c["mu"][:, 2] - m.hyper.mu_mean) ** 2, m.hyper.mu_var),
        (c["s"], math.log(m.hyper.sigma_scale) - float(torch.digamma(torch.tensor(m.hyper.sigma_shape)))),
    ]
    for vals, truth in checks:
        mean, se = _chain_mean_se(vals.reshape(S, C))
        # 5 standard errors (between-chain): false failure rate < 1e-5 per check
        assert abs(mean - truth) < 5 * se + 1e-3, (mean, truth, se)


def test_nuts_run_returns_posterior_api():
    X, y = _data("classification", 2, N=60)
    post = NUTS(n_chains=4, n_samples=20, n_warmup=30, depth=1, sharpness=0.1, max_tree_depth=4,
                evidence=True).run((X, y), seed=0)
    assert post.predict_proba(X).shape == (60, 3)
    assert post.predict(X).shape == (60,)
    assert post.log_evidence is not None and math.isfinite(post.log_evidence)
    assert 0 <= post.accuracy(X, y) <= 1
    s = post.summary()
    assert s["n_topologies"] == 1 and "accept" in s


@pytest.mark.cuda
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
def test_cuda_matches_cpu():
    X, y = _data("classification", 3)
    cpu = SoftTrees(X, TOPOLOGIES, y=y, n_chains=2, hyper=HYPER, dtype=torch.float64,
                    generator=torch.Generator().manual_seed(0))
    gpu = SoftTrees(X, TOPOLOGIES, y=y, n_chains=2, hyper=HYPER, dtype=torch.float64, device="cuda")
    theta = cpu.theta.data
    U0, g0 = cpu.potential_and_grad(theta)
    U1, g1 = gpu.potential_and_grad(theta.cuda())
    assert torch.allclose(U0, U1.cpu(), atol=1e-8) and torch.allclose(g0, g1.cpu(), atol=1e-8)
    post = NUTS(n_chains=4, n_samples=5, n_warmup=10, depth=1, device="cuda", max_tree_depth=3).run((X, y), seed=0)
    assert post.predict_proba(X).shape == (X.shape[0], 3)


@pytest.mark.slow
def test_compiled_potential_matches_eager():
    """``compile=True`` runs the same closed-form potential through torch.compile;
    values and gradients agree with eager to float64 rounding (tolerance 1e-9 relative)."""
    m, theta = _model("classification")
    mc, _ = _model("classification", compile=True)
    U, g = m.potential_and_grad(theta)
    Uc, gc = mc.potential_and_grad(theta)
    torch.testing.assert_close(Uc, U, rtol=1e-9, atol=1e-9)
    torch.testing.assert_close(gc, g, rtol=1e-9, atol=1e-9)


@pytest.mark.parametrize("task", ["classification", "regression"])
def test_fused_parts_reproduce_the_potential(task):
    """``fused_parts(rows)`` is the potential as a pure function (what a compiled NUTS
    step calls): same values and gradients, for all rows and for a subset with its own
    per-row sharpness and masks (tolerance 1e-12)."""
    m, theta = _model(task)
    for rows in (None, torch.tensor([4, 1, 1])):
        core, tensors, consts = m.fused_parts(rows)
        th = theta if rows is None else theta[rows]
        U, g = core(th, *tensors, consts)
        U0, g0 = m.potential_and_grad(th, rows)
        torch.testing.assert_close(U, U0, rtol=1e-12, atol=1e-12)
        torch.testing.assert_close(g, g0, rtol=1e-12, atol=1e-12)


@pytest.mark.slow
def test_compiled_nuts_run_matches_eager():
    """``NUTS(compile=True)`` runs fused, compiled leapfrog steps with the same random
    numbers as the eager sampler: in float64 every trajectory takes the same number of
    steps and the draws agree to 1e-3 (fused kernels round differently, and 32
    transitions of Hamiltonian dynamics amplify 1e-16 to about 5e-5 here)."""
    X, y = _data("regression", N=30)
    kw = dict(n_chains=6, n_samples=8, n_warmup=24, depth=2, dtype=torch.float64, max_tree_depth=5, sharpness=0.2)
    eager = NUTS(**kw).run((X, y), seed=3)
    fused = NUTS(compile=True, **kw).run((X, y), seed=3)
    assert eager.info["grad_evals"] == fused.info["grad_evals"]
    torch.testing.assert_close(fused.draws[0], eager.draws[0], rtol=0, atol=1e-3)
