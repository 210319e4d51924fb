"""Signed splits (``signed_splits=True``): split weights on the simplex over the scaled
inputs and their mirror images ``1 - x``.

Checks: the inputs and their scaling, the potential against the paper's model on
hand-mirrored inputs, a boundary that needs a negative coefficient (learnt with signed
splits, not without), and the posterior's features, save / load and errors.
"""
import re

import pytest
import torch

from torchtree.soft import DCC, NUTS, SoftTreeHyper, SoftTrees, Topology, as_soft_data
from torchtree.model.soft_posterior import SoftTreePosterior


def _diagonal(N=200, seed=0):
    """Two features; class 1 above the diagonal x0 > x1, no noise."""
    g = torch.Generator().manual_seed(seed)
    X = torch.rand(N, 2, generator=g, dtype=torch.float64) * torch.tensor([4.0, 10.0]) + torch.tensor([1.0, -3.0])
    Xs = (X - X.min(0).values) / (X.max(0).values - X.min(0).values)
    y = (Xs[:, 0] > Xs[:, 1]).long()
    return X, y


def test_inputs_are_mirrored_and_test_inputs_scaled_the_same_way():
    X, y = _diagonal(50)
    sd = as_soft_data(X, y, signed=True, dtype=torch.float64)
    plain = as_soft_data(X, y, dtype=torch.float64)
    assert sd.signed and sd.n_features == 4 and sd.n_input_features == 2
    assert torch.allclose(sd.X[:, :2], plain.X) and torch.allclose(sd.X[:, 2:], 1 - plain.X)
    new = X[:5] * 1.5
    assert torch.allclose(sd.scale(new), torch.cat([plain.scale(new), 1 - plain.scale(new)], 1))
    assert sd.check_X(X[:3]).shape == (3, 2)
    with pytest.raises(ValueError):
        sd.check_X(sd.X[:3])  # 2 D columns: the mirrored inputs are not raw inputs


@pytest.mark.parametrize("task", ["classification", "regression"])
def test_potential_equals_the_paper_model_on_mirrored_inputs(task):
    """Min-max scaling maps -x to 1 - x, so the paper's model on [X, -X] is the signed model on X."""
    g = torch.Generator().manual_seed(3)
    X = torch.rand(40, 3, generator=g, dtype=torch.float64) * 3 - 1
    y = torch.randint(0, 3, (40,), generator=g) if task == "classification" else torch.randn(40, generator=g, dtype=torch.float64)
    tops = [Topology((0,)), Topology((0, 1, 2))]
    hyper = SoftTreeHyper(split_concentration=0.8)
    signed = SoftTrees(X, tops, y=y, n_chains=2, sharpness=0.1, dtype=torch.float64, generator=g,
                       hyper=SoftTreeHyper(split_concentration=0.8, signed_splits=True))
    plain = SoftTrees(torch.cat([X, -X], 1), tops, y=y, n_chains=2, sharpness=0.1, hyper=hyper, dtype=torch.float64)
    theta = signed.theta.data
    assert signed.n_params == plain.n_params
    assert torch.allclose(signed.potential(theta), plain.potential(theta), rtol=1e-10, atol=1e-9)
    _, g_signed = signed.potential_and_grad(theta)
    _, g_plain = plain.potential_and_grad(theta)
    assert torch.allclose(g_signed, g_plain, rtol=1e-8, atol=1e-8)


def test_signed_split_learns_a_boundary_with_a_negative_coefficient():
    """y = [x0 > x1] needs x0 - x1: one signed split fits it, one positive-weight split cannot.

    A split x0 w0 + x1 w1 > tau with w on the simplex has a boundary of negative slope
    and classifies about 3/4 of this design (x0 > 1/2 gets 0.75). So every posterior
    draw of the paper's model stays below 0.8, while the signed draws sit above 0.9
    (seeded; measured 0.68-0.77 and 0.93-1.0). The posterior *mean* of the paper's
    model mixes splits of several directions and reaches ~0.8, so single draws are
    compared.
    """
    X, y = _diagonal(150)
    kw = dict(n_chains=4, n_samples=20, n_warmup=80, depth=1, sharpness=0.02, h_init=0.2, max_tree_depth=6)
    signed = NUTS(signed_splits=True, **kw).run((X, y), seed=0)
    plain = NUTS(**kw).run((X, y), seed=0)

    def draw_accuracy(post):
        return (post.predict_draws(X).argmax(-1) == y).double().mean(1)

    assert float(draw_accuracy(signed).median()) > 0.9
    assert float(draw_accuracy(plain).max()) < 0.8
    assert signed.accuracy(X, y) > 0.95
    usage = signed.feature_usage(0)
    assert usage.shape == (2,) and abs(float(usage.sum()) - 1) < 1e-5
    # each node is labelled with its heaviest column: a feature or a mirrored one
    assert re.search(r'n0 \[label="(1-)?(a|b) \(w=', signed.to_dot(feature_names=["a", "b"]))


def test_posterior_save_load_keeps_signed_inputs(tmp_path):
    X, y = _diagonal(60)
    post = NUTS(n_chains=2, n_samples=10, n_warmup=20, depth=1, sharpness=0.1, max_tree_depth=4,
                signed_splits=True).run((X, y), seed=0)
    path = str(tmp_path / "signed.pt")
    post.save(path)
    back = SoftTreePosterior.load(path)
    assert back.data.signed and back.n_features == 2 and back.hyper.signed_splits
    assert torch.allclose(torch.as_tensor(back.predict_proba(X)), torch.as_tensor(post.predict_proba(X)))


def test_dcc_runs_with_signed_splits():
    X, y = _diagonal(80)
    post = DCC(n_iterations=2, n_initial=10, n_chains=2, n_samples=5, n_warmup=20, n_parallel=2, max_depth=2,
               h_init=0.1, h_final=0.05, max_tree_depth=4, signed_splits=True).run((X, y), seed=0)
    assert post.data.signed and post.predict(X).shape == (80,)
    assert post.feature_usage(0).shape == (2,)


def test_estimator_passes_signed_splits_to_dcc():
    import torchtree

    X, y = _diagonal(60)
    clf = torchtree.BayesianTreeClassifier(method="dcc", n_iterations=2, n_initial=5, n_chains=2, n_samples=5,
                                           n_warmup=10, max_depth=2, signed_splits=True)
    clf.fit(X.numpy(), y.numpy())
    assert clf.posterior_.data.signed and clf.predict(X.numpy()).shape == (60,)


def test_errors():
    X, y = _diagonal(20)
    with pytest.raises(ValueError, match="signed_splits must be True or False"):
        SoftTreeHyper(signed_splits=1)
    sd = as_soft_data(X, y, signed=True)
    with pytest.raises(ValueError, match="signed=True"):
        SoftTrees(sd, [1])  # the default hyper asks for the paper's (unsigned) model
    assert SoftTrees(sd, [1], hyper=SoftTreeHyper(signed_splits=True)).layout.n_features == 4
