"""The Pyro modules follow Pyro's conventions (a QA pass as a Pyro user): batch dims against the data
plate, gradients into the inputs, refusals of what would silently go wrong."""
from __future__ import annotations

import warnings

import pytest
import torch

pyro = pytest.importorskip("pyro")
import pyro.distributions as dist  # noqa: E402
from pyro.infer import Predictive, Trace_ELBO  # noqa: E402
from pyro.infer.autoguide import AutoDelta  # noqa: E402

from torchtree.pyro import SoftTreeClassifier, SoftTreeFunction, SoftTreeRegressor  # noqa: E402
from torchtree.pyro_bart import BARTFunction  # noqa: E402


def _data(n=60):
    g = torch.Generator().manual_seed(0)
    X = torch.rand(n, 2, generator=g, dtype=torch.float64)
    return X, torch.where(X[:, 0] > 0.5, 1.0, -1.0).double() + 0.1 * torch.randn(n, generator=g, dtype=torch.float64)


@pytest.mark.parametrize("user_model", [False, True])
def test_vectorized_particles_give_the_sequential_elbo(user_model):
    """With a point-mass guide every particle is the same, so the ELBO of 4 vectorized particles equals
    that of 4 sequential ones (to rounding). The tree's batch dims used to land left of the particle
    plate's slot, and the vectorized loss came out 4x too large."""
    X, y = _data()
    if user_model:
        tree = SoftTreeFunction(2, topology=1)

        def model(X, y=None):
            sigma = pyro.sample("sigma", dist.HalfNormal(torch.tensor(1.0, dtype=torch.float64)))
            mean = tree(X)
            with pyro.plate("data", X.shape[0]):
                pyro.sample("y", dist.Normal(mean, sigma), obs=y)
    else:
        model = SoftTreeRegressor(2, topology=1)
    pyro.clear_param_store()
    pyro.set_rng_seed(0)
    guide = AutoDelta(model)
    guide(X, y)
    losses = [Trace_ELBO(num_particles=4, vectorize_particles=v, max_plate_nesting=1).loss(model, guide, X, y)
              for v in (False, True)]
    assert losses[1] == pytest.approx(losses[0], rel=1e-6)


def test_parallel_predictive_draws_one_row_per_sample():
    X, y = _data()
    model = SoftTreeRegressor(2, topology=1)
    pyro.clear_param_store()
    pyro.set_rng_seed(0)
    guide = AutoDelta(model)
    guide(X, y)
    out = Predictive(model, guide=guide, num_samples=5, parallel=True, return_sites=["y"])(X)
    assert out["y"].shape == (5, X.shape[0])


def test_gradients_reach_inputs_that_are_learned():
    X, _ = _data()
    tree = SoftTreeFunction(2, topology=2)
    lin = torch.nn.Linear(2, 2).double()
    with pyro.poutine.trace():
        f = tree(torch.sigmoid(lin(X)))
    f.sum().backward()
    assert lin.weight.grad is not None and lin.weight.grad.abs().sum() > 0


def test_refusals_of_what_would_go_wrong_in_silence():
    with pytest.raises(ValueError, match="give feature_min and feature_max together"):
        SoftTreeFunction(2, feature_min=torch.tensor([5.0, 5.0]))
    with pytest.raises(ValueError, match="feature_max >= feature_min"):
        SoftTreeFunction(2, feature_min=torch.tensor([1.0, 0.0]), feature_max=torch.tensor([0.0, 1.0]))
    X, _ = _data()
    with pytest.raises(ValueError, match="integer class codes"):
        with pyro.poutine.trace():
            SoftTreeClassifier(2, 3, topology=1)(X, torch.full((X.shape[0],), 0.5, dtype=torch.float64))
    b = BARTFunction(X, y_scale=X[:, 0], n_trees=4)
    target = X[:, 0].clone()
    target[3] = float("nan")
    with pytest.raises(ValueError, match="finite values"):
        b.gibbs_step(target, 0.3)
    for sigma in (0.0, -1.0, float("nan"), torch.tensor([0.3, 0.2])):
        with pytest.raises(ValueError, match="sigma must be one finite positive number"):
            b.gibbs_step(X[:, 0], sigma)
    assert bool(torch.isfinite(b.f).all())  # the refused calls left the trees as they were
    s = torch.tensor(0.3, dtype=torch.float64, requires_grad=True)
    assert not b.gibbs_step(X[:, 0], s).requires_grad  # no graph kept across Gibbs steps


def test_bart_function_state_dict_holds_the_trees_and_continues_the_chain():
    """``state_dict`` holds the trees, ``f`` and the sweep count: a fresh module loaded from it predicts
    the same and its next Gibbs step draws what the original's does (the streams are keyed by sweep)."""
    X, y = _data()
    a = BARTFunction(X, y_scale=y, n_trees=4, seed=3)
    for _ in range(3):
        a.gibbs_step(y, 0.3)
    b = BARTFunction(X, y_scale=y, n_trees=4, seed=3)
    b.load_state_dict(a.state_dict())
    assert b.sweeps == 3 and torch.equal(b(X[:7]), a(X[:7])) and torch.equal(b.f, a.f)
    assert torch.equal(b.gibbs_step(y, 0.3), a.gibbs_step(y, 0.3))


def test_misuse_is_refused_in_the_users_words():
    X, y = _data()
    with pytest.raises(ValueError, match=r"depth must lie in \[0, 30\], got -1"):
        SoftTreeFunction(2, topology=-1)
    with pytest.raises(ValueError, match="leaf_scale"):
        SoftTreeFunction(2, leaf_scale=0.0)
    with pytest.raises(ValueError, match="mu_var"):
        SoftTreeRegressor(2, mu_var=-1.0)
    bad = X.clone()
    bad[0, 0] = float("nan")
    with pytest.raises(ValueError, match="X holds NaN or infinite values"):
        with pyro.poutine.trace():
            SoftTreeFunction(2)(bad)
    b = BARTFunction(X, y_scale=y, n_trees=3)
    for new in (X[:, :1], X[:, 0]):
        with pytest.raises(ValueError, match=r"X must have shape \[M, 2\]"):
            b(new)
    with pytest.raises(ValueError, match="X holds NaN or infinite values"):
        b(bad)
    for kw, what in ((dict(n_trees=0), "n_trees"), (dict(k=0.0), "k "), (dict(alpha_split=2.0), "alpha_split"),
                     (dict(max_cuts=0), "max_cuts")):
        with pytest.raises(ValueError, match=what):
            BARTFunction(X, **kw)


def test_inputs_outside_the_unit_range_without_ranges_warn_once():
    X, _ = _data()
    tree = SoftTreeFunction(2)
    with pytest.warns(UserWarning, match=r"X lies in \[\S+, \S+\] but no feature_min / feature_max were given"):
        with pyro.poutine.trace():
            tree(X * 100 + 1)
    import warnings

    with warnings.catch_warnings():
        warnings.simplefilter("error")
        for module, inputs in ((tree, X * 100 + 1),  # once per module
                               (SoftTreeFunction(2), X),  # inside [0, 1]: nothing to say
                               (SoftTreeFunction(2, feature_min=torch.zeros(2), feature_max=torch.full((2,), 200.0)),
                                X * 100 + 1)):
            with pyro.poutine.trace():
                module(inputs)


def test_bart_function_warns_once_when_the_target_is_off_the_leaf_priors_scale():
    """The leaf prior is calibrated to y_scale's range (1 without it): a target 100 times wider
    warns once; one on the calibrated scale does not."""

    g = torch.Generator().manual_seed(0)
    X = torch.rand(40, 2, generator=g, dtype=torch.float64)
    y = 100 * X[:, 0]
    bart = BARTFunction(X, n_trees=5)
    with pytest.warns(UserWarning, match="no y_scale was given") as rec:
        bart.gibbs_step(y, 1.0)
        bart.gibbs_step(y, 1.0)
    assert len([w for w in rec if "y_scale" in str(w.message)]) == 1
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        BARTFunction(X, y_scale=y, n_trees=5).gibbs_step(y - 3.0, 1.0)
        BARTFunction(X, n_trees=5).gibbs_step(X[:, 0], 0.1)


def test_two_trees_in_one_module_have_sites_of_their_own():
    """Every site of the soft-tree modules (the observed ``y`` and its ``data`` plate, the classifier's
    factor and ``class_probs``) is named after the module, as Pyro names a PyroModule's samples: two
    trees as attributes of one parent model do not clash, and a top-level module keeps the bare names."""
    from pyro import poutine
    from pyro.nn import PyroModule

    X, y = _data()
    labels = (y > 0).long()

    class Two(PyroModule):
        def __init__(self):
            super().__init__()
            self.a, self.b = SoftTreeRegressor(2, topology=1), SoftTreeRegressor(2, topology=1)
            self.c, self.d = SoftTreeClassifier(2, 2, topology=1), SoftTreeClassifier(2, 2, topology=1)

        def forward(self, X, y, labels):
            self.a(X, y), self.b(X, y)
            self.c(X, labels, X[:3]), self.d(X, labels, X[:3])

    pyro.set_rng_seed(0)
    tr = poutine.trace(Two()).get_trace(X, y, labels)
    for m in "ab":
        assert {f"{m}.y", f"{m}.data", f"{m}.sigma2", f"{m}.tree.leaf_values"} <= set(tr.nodes)
        assert tr.nodes[f"{m}.y"]["is_observed"]
    for m in "cd":
        assert {f"{m}.soft_dirichlet_multinomial", f"{m}.class_probs", f"{m}.split_weights"} <= set(tr.nodes)
    alone = poutine.trace(SoftTreeRegressor(2, topology=1)).get_trace(X, y)
    assert {"y", "data", "sigma2"} <= set(alone.nodes)


def test_a_tree_called_inside_the_data_plate_warns():
    """Inside a plate at dim -1 of as many entries as X's rows every row gets a tree of its own ([N, N]):
    a warning says so; a plate of groups (another size) and a call outside any plate stay silent."""
    X, _ = _data(30)
    tree = SoftTreeFunction(2, topology=1)
    with pytest.warns(UserWarning, match=r"inside the plate 'data' of 30 entries at dim -1"):
        with pyro.plate("data", 30):
            assert tree(X).shape == (30, 30)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        with pyro.plate("groups", 4):
            assert tree(X).shape == (4, 30)  # a tree per group: a hierarchical model, not a mistake
        assert tree(X).shape == (30,)

        def model(X):  # no data plate: Predictive's own plate of 30 samples is not one
            return pyro.deterministic("f", tree(X))

        out = Predictive(model, num_samples=30, parallel=True, return_sites=["f"])(X)["f"]
        assert out.shape == (30, 30)


def test_the_docstring_models_group_term_gives_the_sequential_elbo_vectorized():
    """SoftTreeFunction's docstring example drew its group offsets as one site with an event dim: under
    vectorized particles ``offset[..., group]`` was [P, 1, N] against the tree's [P, N], broadcast to [P, P, N],
    and the ELBO was some 300 times too large (a QA pass as a Pyro user). Drawn in a plate, as the docstring now
    says, 4 vectorized point-mass particles give the ELBO of 4 sequential ones."""
    X, y = _data()
    group = torch.arange(X.shape[0]) % 3
    tree = SoftTreeFunction(2, topology=1)

    def model(X, group, y=None):
        with pyro.plate("groups", 3):
            offset = pyro.sample("offset", dist.Normal(torch.tensor(0.0, dtype=torch.float64), 1.0))
        mean = tree(X) + offset[..., group]
        with pyro.plate("data", X.shape[0]):
            pyro.sample("y", dist.Normal(mean, 0.1), obs=y)

    pyro.clear_param_store()
    pyro.set_rng_seed(0)
    guide = AutoDelta(model)
    guide(X, group, y)
    losses = [Trace_ELBO(num_particles=4, vectorize_particles=v, max_plate_nesting=1).loss(model, guide, X, group, y)
              for v in (False, True)]
    assert losses[1] == pytest.approx(losses[0], rel=1e-6)


def test_leaf_probabilities_called_alone_are_sample_sites_pyro_sees():
    """``leaf_probabilities`` outside the module's call drew its splits afresh on every access, recorded nowhere:
    condition, replay, NUTS and SVI ignored them."""
    from pyro import poutine

    X, _ = _data(20)
    tree = SoftTreeFunction(2, topology=1)
    tr = poutine.trace(lambda: tree.leaf_probabilities(X)).get_trace()
    sites = [n for n, s in tr.nodes.items() if s["type"] == "sample"]
    assert set(sites) == {"thresholds", "split_weights"}
    replayed = poutine.replay(lambda: tree.leaf_probabilities(X), trace=tr)
    assert torch.equal(replayed(), tr.nodes["_RETURN"]["value"]) and torch.equal(replayed(), replayed())
    fixed = {"thresholds": torch.tensor([0.3]), "split_weights": torch.tensor([[1.0, 0.0]])}
    phi = poutine.condition(lambda: tree.leaf_probabilities(X), data=fixed)()
    assert torch.allclose(phi, poutine.condition(lambda: tree.leaf_probabilities(X), data=fixed)())


def test_bart_function_refuses_targets_and_scales_of_another_shape():
    """A [2, N/2] target was read row by row and a short y_scale blamed "y ... labels" (a QA pass)."""
    X, y = _data()
    b = BARTFunction(X, y_scale=y, n_trees=5, seed=0)
    with pytest.raises(ValueError, match=r"target must be 1-D \[60\], got shape \(2, 30\)"):
        b.gibbs_step(y.reshape(2, -1), 0.2)
    with pytest.raises(ValueError, match=r"target must be 1-D \[60\], got shape \(60, 1\)"):
        b.gibbs_step(y[:, None], 0.2)
    with pytest.raises(ValueError, match=r"y_scale must be 1-D with one value per row of X \(60\), got shape \(5,\)"):
        BARTFunction(X, y_scale=y[:5])
