"""Soft routing kernel: normalisation, hard-tree limit, fast path vs references."""
import pytest
import torch

from torchtree.kernels.soft_routing import (
    dirichlet_multinomial_loglik,
    soft_class_counts,
    soft_routing,
    soft_routing_autograd,
    soft_routing_reference,
)
from torchtree.model.topology import Topology


def _random_trees(B, depth, D, seed, dtype=torch.float64):
    g = torch.Generator().manual_seed(seed)
    I = 2**depth - 1
    W = torch.softmax(2 * torch.randn(B, I, D, generator=g, dtype=dtype), -1)
    tau = torch.rand(B, I, generator=g, dtype=dtype)
    return W, tau


@pytest.mark.parametrize("depth", [1, 2, 4])
def test_routing_sums_to_one(depth):
    W, tau = _random_trees(5, depth, 3, seed=depth)
    X = torch.rand(50, 3, generator=torch.Generator().manual_seed(1), dtype=torch.float64)
    mask = torch.rand(5, 2**depth - 1, generator=torch.Generator().manual_seed(2)) < 0.6
    mask[:, 0] = True
    for h in (1.0, 0.05, 1e-4):
        phi = soft_routing(X, W, tau, h, mask)
        assert phi.shape == (5, 50, 2**depth)
        assert torch.allclose(phi.sum(-1), torch.ones(5, 50, dtype=phi.dtype), atol=1e-12)
        assert (phi >= 0).all()


def _hard_leaf_slot(X, feature, threshold, topology, depth):
    """Plain hard traversal: padded leaf slot reached by each point (x > t goes right)."""
    out = []
    internal = set(topology.internal)
    for x in X.tolist():
        node = 0
        while node in internal:
            node = 2 * node + 2 if x[feature[node]] > threshold[node] else 2 * node + 1
        out.append(topology.leaf_slots(depth)[topology.leaves.index(node)])
    return torch.tensor(out)


@pytest.mark.parametrize("internal", [(0,), (0, 1, 2), (0, 2, 5, 6), (0, 1, 4, 10)])
def test_small_sharpness_matches_hard_tree(internal):
    topo = Topology(internal)
    depth = 4
    I, D, N = 2**depth - 1, 3, 400
    g = torch.Generator().manual_seed(7)
    feature = torch.randint(0, D, (I,), generator=g)
    threshold = 0.2 + 0.6 * torch.rand(I, generator=g, dtype=torch.float64)
    X = torch.rand(N, D, generator=g, dtype=torch.float64)
    # keep points away from the cut points so that the limit is clean
    gap = (X[:, feature] - threshold).abs().min(1).values
    X = X[gap > 1e-3]
    W = torch.nn.functional.one_hot(feature, D).to(torch.float64).unsqueeze(0)
    phi = soft_routing(X, W, threshold.unsqueeze(0), 1e-6, topo.node_mask(depth).unsqueeze(0))[0]
    hard = _hard_leaf_slot(X, feature.tolist(), threshold.tolist(), topo, depth)
    assert torch.equal(phi.argmax(-1), hard)
    assert torch.allclose(phi.max(-1).values, torch.ones(len(X), dtype=phi.dtype), atol=1e-8)


def test_masked_leaf_mass_goes_to_leftmost_slot():
    topo = Topology((0, 2))  # leaves 1 (depth 1), 5, 6 (depth 2)
    W, tau = _random_trees(1, 3, 2, seed=3)
    X = torch.rand(30, 2, generator=torch.Generator().manual_seed(0), dtype=torch.float64)
    phi = soft_routing(X, W, tau, 0.1, topo.node_mask(3).unsqueeze(0))[0]
    slots = topo.leaf_slots(3)
    assert slots == (0, 4, 6)
    others = [k for k in range(8) if k not in slots]
    assert phi[:, others].abs().max() == 0
    # the depth-1 leaf's mass equals the left-branch probability at the root
    left_root = torch.sigmoid(-(X @ W[0, 0] - tau[0, 0]) / 0.1)
    assert torch.allclose(phi[:, 0], left_root, atol=1e-12)


def test_fast_path_matches_references_and_gradcheck():
    B, depth, D, N = 4, 3, 3, 20
    W, tau = _random_trees(B, depth, D, seed=11)
    X = torch.rand(N, D, generator=torch.Generator().manual_seed(5), dtype=torch.float64)
    mask = torch.ones(B, 2**depth - 1, dtype=torch.bool)
    mask[1, 3:] = False
    mask[2, [2, 5, 6]] = False
    h = torch.tensor([0.3, 0.1, 0.05, 0.2], dtype=torch.float64)
    G = torch.randn(B, N, 2**depth, generator=torch.Generator().manual_seed(9), dtype=torch.float64)
    results = []
    for fn in (soft_routing, soft_routing_autograd, soft_routing_reference):
        Wr, tr = W.clone().requires_grad_(True), tau.clone().requires_grad_(True)
        phi = fn(X, Wr, tr, h, mask)
        gw, gt = torch.autograd.grad((phi * G).sum(), (Wr, tr))
        results.append((phi.detach(), gw, gt))
    for other in results[1:]:
        for a, b in zip(results[0], other):
            assert torch.allclose(a, b, atol=1e-12, rtol=1e-10)
    Wr, tr = W.clone().requires_grad_(True), tau.clone().requires_grad_(True)
    assert torch.autograd.gradcheck(lambda w, t: soft_routing(X, w, t, h, mask), (Wr, tr))
    # inputs that require a gradient (a latent X, a network's output) get it, as through autograd
    grads = []
    for fn in (soft_routing, soft_routing_autograd):
        Xr = X.clone().requires_grad_(True)
        grads.append(torch.autograd.grad((fn(Xr, W, tau, h, mask) * G).sum(), Xr)[0])
    assert grads[0].abs().max() > 0 and torch.allclose(grads[0], grads[1], atol=1e-12, rtol=1e-10)
    assert torch.autograd.gradcheck(lambda x: soft_routing(x, W, tau, h, mask), (X.clone().requires_grad_(True),))


def test_second_derivatives_are_exact():
    """A Hessian through the fast path (its closed-form backward is not differentiable; a backward that records a
    graph differentiates the plain levels) equals autograd's through the reference, and gradgradcheck passes in
    the parameters and in X: a Laplace approximation's covariance came out wrong in silence (zero curvature)."""
    from torch.autograd.functional import hessian

    B, depth, D, N = 2, 2, 3, 12
    W, tau = _random_trees(B, depth, D, seed=3)
    X = torch.rand(N, D, generator=torch.Generator().manual_seed(4), dtype=torch.float64)
    mask = torch.ones(B, 3, dtype=torch.bool)
    mask[1, 2] = False
    h = torch.tensor([0.3, 0.15], dtype=torch.float64)
    G = torch.randn(B, N, 4, generator=torch.Generator().manual_seed(6), dtype=torch.float64)
    hs = [hessian(lambda t: (fn(X, W, t, h, mask) * G).sum(), tau) for fn in (soft_routing, soft_routing_autograd)]
    assert hs[1].abs().max() > 1 and torch.allclose(hs[0], hs[1], atol=1e-10, rtol=1e-8)
    Wr, tr = W.clone().requires_grad_(True), tau.clone().requires_grad_(True)
    assert torch.autograd.gradgradcheck(lambda w, t: soft_routing(X, w, t, h, mask), (Wr, tr))
    assert torch.autograd.gradgradcheck(lambda x: soft_routing(x, W, tau, h, mask), (X.clone().requires_grad_(True),))


def test_dirichlet_multinomial_matches_explicit_formula():
    # eq. 8 written out with integer counts equals the Dirichlet-multinomial marginal
    counts = torch.tensor([[[3.0, 1.0, 0.0], [0.0, 0.0, 0.0]]], dtype=torch.float64)
    a = 0.5
    lg = torch.special.gammaln
    expected = lg(torch.tensor(1.5)) - lg(torch.tensor(4 + 1.5)) + sum(
        lg(torch.tensor(c + a)) - lg(torch.tensor(a)) for c in (3.0, 1.0, 0.0)
    )
    got = dirichlet_multinomial_loglik(counts, a)
    assert torch.allclose(got, expected.to(got.dtype).reshape(1), atol=1e-10)
    # soft counts of a one-leaf hard routing are the class counts
    y = torch.tensor([0, 0, 1, 2, 0])
    phi = torch.zeros(1, 5, 2, dtype=torch.float64)
    phi[..., 0] = 1
    c = soft_class_counts(phi, torch.nn.functional.one_hot(y, 3))
    assert torch.equal(c[0, 0], torch.tensor([3.0, 1.0, 1.0], dtype=torch.float64))
