"""Bad settings and bad data for the soft-tree samplers fail early, with a clear message.

Before these checks, ``DCC(max_depth=0)`` and ``DCC(alpha_split=0)`` looped for ever
drawing initial topologies (no tree with a split has positive prior probability), and
``n_chains=0`` or ``h_final=0`` failed deep inside tensor code.
"""
from __future__ import annotations

import random

import numpy as np
import pytest

from torchtree.soft import DCC, NUTS, SoftTreeHyper, Topology, sample_prior_topologies
from torchtree.model.soft_data import as_soft_data
from torchtree.core.validate import check_int, check_probabilities, check_real


@pytest.mark.parametrize("kwargs, name", [
    (dict(max_depth=0), "max_depth"),
    (dict(alpha_split=0.0), "alpha_split"),
    (dict(alpha_split=1.0), "alpha_split"),
    (dict(beta_split=-0.5), "beta_split"),
    (dict(n_chains=0), "n_chains"),
    (dict(n_chains=2.5), "n_chains"),
    (dict(n_samples=0), "n_samples"),
    (dict(n_initial=0), "n_initial"),
    (dict(n_iterations=0), "n_iterations"),
    (dict(n_warmup=-1), "n_warmup"),
    (dict(n_warmup_warm=-1), "n_warmup_warm"),
    (dict(n_proposals=0), "n_proposals"),
    (dict(activation_threshold=0), "activation_threshold"),
    (dict(h_init=-0.1), "h_init"),
    (dict(h_final=0.0), "h_final"),
    (dict(h_final=float("nan")), "h_final"),
    (dict(target_accept=1.0), "target_accept"),
    (dict(delta=1.5), "delta"),
    (dict(look_ahead=0.0), "look_ahead"),
    (dict(move_probs=(0.5, 0.5)), "move_probs"),
    (dict(move_probs=(-0.1, 0.6, 0.5)), "move_probs"),
    (dict(move_probs=(0.0, 0.0, 0.0)), "move_probs"),
    (dict(lais_form="layered"), "lais_form"),
    (dict(max_predict_draws=0), "max_predict_draws"),
    (dict(max_seconds=-1.0), "max_seconds"),
    (dict(checkpoint_every=0), "checkpoint_every"),
])
def test_dcc_rejects_bad_settings_by_name(kwargs, name):
    with pytest.raises(ValueError, match=name):
        DCC(**kwargs)


@pytest.mark.parametrize("kwargs, name", [
    (dict(n_chains=0), "n_chains"),
    (dict(n_samples=0), "n_samples"),
    (dict(thin=0), "thin"),
    (dict(n_warmup=-5), "n_warmup"),
    (dict(sharpness=0.0), "sharpness"),
    (dict(h_init=-1.0), "h_init"),
    (dict(max_tree_depth=0), "max_tree_depth"),
    (dict(target_accept=0.0), "target_accept"),
    (dict(n_leapfrog=0), "n_leapfrog"),
    (dict(depth=0), "depth"),
    (dict(topology=()), "at least one split"),
    (dict(max_energy_error=-1.0), "max_energy_error"),
])
def test_nuts_rejects_bad_settings_by_name(kwargs, name):
    with pytest.raises(ValueError, match=name):
        NUTS(**kwargs)


@pytest.mark.parametrize("field", ["split_concentration", "threshold_a", "threshold_b", "sigma_shape",
                                   "alpha", "mu_var", "sigma_scale"])
def test_hyperparameters_must_be_positive(field):
    with pytest.raises(ValueError, match=field):
        SoftTreeHyper(**{field: 0.0})
    SoftTreeHyper(**{field: 0.5})  # a positive value is accepted
    with pytest.raises(ValueError, match="alpha"):
        DCC(alpha=-1.0)


def test_prior_topologies_fail_instead_of_looping_when_splits_are_too_rare():
    # P(>= 1 split) = alpha_split: 1e-6 needs ~1e6 draws per kept tree, beyond the cap
    with pytest.raises(ValueError, match="raise alpha_split"):
        sample_prior_topologies(5, alpha_split=1e-6, max_depth=3, rng=random.Random(0))
    with pytest.raises(ValueError, match="min_internal"):
        sample_prior_topologies(5, max_depth=2, min_internal=4)  # a depth-2 tree has <= 3 internal nodes
    # a reachable request still works and honours both constraints
    tops = sample_prior_topologies(50, alpha_split=0.95, beta_split=1.0, max_depth=2, min_internal=3,
                                   rng=random.Random(1))
    assert len(tops) == 50 and all(t == Topology((0, 1, 2)) for t in tops)


def test_validators_accept_in_range_and_normalise():
    assert check_int("k", 3.0, 1) == 3 and isinstance(check_int("k", 3.0, 1), int)
    with pytest.raises(ValueError, match="k must be an integer"):
        check_int("k", True, 0)
    with pytest.raises(ValueError, match=r"k must be >= 1 and <= 4"):
        check_int("k", 5, 1, 4)
    assert check_real("x", 1.0, 0.0, 1.0) == 1.0  # (0, 1] includes 1
    with pytest.raises(ValueError, match=r"\(0, 1\)"):
        check_real("x", 1.0, 0.0, 1.0, high_open=True)
    with pytest.raises(ValueError, match="real number"):
        check_real("x", "abc")
    assert check_probabilities("p", [1, 3], 2) == (0.25, 0.75)


# ----------------------------------------------------------------------------- data
@pytest.fixture(scope="module")
def separable():
    g = np.random.default_rng(0)
    X = g.random((60, 3))
    return X, X[:, 0] > 0.5


def _fit(X, y):
    return NUTS(n_chains=2, n_samples=20, n_warmup=20, sharpness=0.05, max_tree_depth=5).run(X, y, seed=0)


@pytest.fixture(scope="module")
def fitted(separable):
    X, cls = separable
    return _fit(X, cls.astype(np.int64))


def test_bare_labels_are_coded_like_torchtree_data(separable):
    """{2, 4} labels (BCW's coding) used to become codes 0..4: a 5-class model with three
    empty classes. Every coding of the same two classes must now give the same fit."""
    X, cls = separable
    posts = {name: _fit(X, y) for name, y in [
        ("codes", cls.astype(np.int64)), ("2/4", np.where(cls, 4, 2)),
        ("strings", np.where(cls, "yes", "no")), ("bool", cls)]}
    ref = posts["codes"].predict_proba(X)
    assert ref.shape == (60, 2)
    for name, post in posts.items():
        assert post.data.n_classes == 2, name
        np.testing.assert_allclose(post.predict_proba(X), ref, rtol=0, atol=1e-12, err_msg=name)
    assert set(posts["2/4"].predict(X).tolist()) <= {2, 4}
    assert set(posts["strings"].predict(X).tolist()) <= {"yes", "no"}
    # the separable classes are learnt (well above chance), in the original labels
    assert (posts["strings"].predict(X) == np.where(cls, "yes", "no")).mean() > 0.9
    with pytest.raises(ValueError, match="regression needs numeric y"):
        as_soft_data(X, np.where(cls, "a", "b"), task="regression")


@pytest.mark.parametrize("X_bad, match", [
    (np.zeros((4, 5)), "5 features, but the model is expecting 3"),
    (np.array([[np.nan, 0.1, 0.2]]), r"missing value\(s\) \(NaN.*Use a hard-tree method"),
    (np.array([[np.inf, 0.1, 0.2]]), "non-finite"),
    (np.zeros(3), "2-D"),
    (np.zeros((0, 3)), "zero rows"),
])
def test_prediction_inputs_are_checked(fitted, X_bad, match):
    post = fitted
    for call in (post.predict, post.predict_proba, lambda Z: post.predict_draws(Z),
                 lambda Z: post.log_predictive(Z, np.zeros(len(Z), dtype=np.int64))):
        with pytest.raises(ValueError, match=match):
            call(X_bad)


def test_prediction_options_are_checked(fitted, separable):
    """``max_draws=0`` used to average over no draws (NaN probabilities), and a regression
    ``level`` outside (0, 1) failed inside ``torch.quantile``."""
    X, cls = separable
    with pytest.raises(ValueError, match="max_draws"):
        fitted.predict_proba(X, max_draws=0)
    # a cap at or above the stored draws changes nothing; a smaller one thins evenly
    full = fitted.predict_proba(X, max_draws=None)
    np.testing.assert_allclose(fitted.predict_proba(X, max_draws=10_000), full, rtol=0, atol=0)
    assert fitted.predict_draws(X, max_draws=5).shape[0] == 5
    reg = _fit(X, X[:, 0] * 2.0 + 0.1 * cls)
    lo, hi = reg.predict_interval(X[:5], level=0.5, n_draws=500).T
    assert np.all(lo < hi)
    for kwargs, name in [(dict(level=1.0), "level"), (dict(level=0.0), "level"), (dict(n_draws=0), "n_draws")]:
        with pytest.raises(ValueError, match=name):
            reg.predict_interval(X[:5], **kwargs)


def test_pyro_modules_check_settings_and_inputs():
    import torch
    from torchtree.pyro import SoftTreeClassifier, SoftTreeFunction

    with pytest.raises(ValueError, match="sharpness"):
        SoftTreeFunction(2, topology=1, sharpness=0.0)
    with pytest.raises(ValueError, match="feature_min and feature_max"):
        SoftTreeFunction(2, topology=1, feature_min=torch.zeros(3), feature_max=torch.ones(3))
    with pytest.raises(ValueError, match="n_classes"):
        SoftTreeClassifier(2, 1)
    with pytest.raises(ValueError, match="signed_splits must be True or False"):
        SoftTreeClassifier(2, 2, signed_splits=1)
    tree = SoftTreeFunction(2, topology=1, sharpness=0.1)
    assert tree(torch.rand(5, 2)).shape == (5,)
    with pytest.raises(ValueError, match=r"X must have shape \[N, 2\]"):
        tree(torch.rand(5, 3))


# ------------------------------------------------- defects found by a QA pass (tenth session)
def test_dataframe_inputs_are_accepted(separable, fitted):
    """A pandas DataFrame X used to fail in ``torch.as_tensor`` (prediction took it)."""
    pd = pytest.importorskip("pandas")
    X, cls = separable
    frame = pd.DataFrame(X, columns=["a", "b", "c"])
    post = _fit(frame, pd.Series(cls.astype(np.int64)))
    np.testing.assert_allclose(post.predict_proba(X), fitted.predict_proba(X), rtol=0, atol=1e-12)


def test_dtype_and_evidence_settings_are_checked_up_front():
    import torch

    for make in (lambda: NUTS(dtype="float16"), lambda: DCC(dtype=torch.int64)):
        with pytest.raises(ValueError, match="dtype must be float32 or float64"):
            make()
    assert NUTS(dtype="float64").config.dtype is torch.float64  # a name reads as its dtype, as BART's does
    with pytest.raises(ValueError, match="dtype must be one of"):
        as_soft_data(np.zeros((3, 2)), np.array([0, 1, 0]), dtype=torch.float16)
    # with one draw per chain LAIS has nothing to build proposals from: this used to
    # return log_evidence None without a word
    with pytest.raises(ValueError, match="n_samples >= 2"):
        NUTS(evidence=True, n_samples=1)


def test_signed_splits_accepts_numpy_booleans_only_as_booleans():
    assert SoftTreeHyper(signed_splits=np.True_).signed_splits is True
    assert NUTS(signed_splits=np.bool_(False)).hyper.signed_splits is False
    for bad in (1, "yes"):
        with pytest.raises(ValueError, match="signed_splits must be True or False"):
            SoftTreeHyper(signed_splits=bad)


def test_topology_index_and_feature_names_are_checked(fitted, separable):
    """Out-of-range (and negative) topology indices used to raise a bare IndexError or
    wrap around; a short feature_names list failed inside to_dot."""
    X, _ = separable
    n = len(fitted.topologies)
    for bad in (n, -1):
        for call in (lambda: fitted.to_dot(bad), lambda: fitted.feature_usage(bad),
                     lambda: fitted.predict_draws(X, topology=bad)):
            with pytest.raises(IndexError, match=rf"topology index {bad} out of range \[0, {n}\)"):
                call()
    with pytest.raises(ValueError, match="feature_names has 1 names; the data has 3 features"):
        fitted.to_dot(feature_names=["a"])
    assert fitted.to_dot(0, feature_names=["a", "b", "c"]).startswith("digraph")


def test_pyro_modules_scale_constant_features_and_check_y():
    """Pyro's scaling now matches torchtree.model.soft_data (a constant feature maps to 0.5),
    so the Pyro model is the batched samplers' model on such data too."""
    import torch
    from torchtree.pyro import SoftTreeClassifier, SoftTreeRegressor
    from torchtree.model.soft_data import scale_inputs

    X = torch.tensor([[1.0, 0.2], [1.0, 0.9], [1.0, 0.5]])
    clf = SoftTreeClassifier(2, 2, topology=1, feature_min=X.min(0).values, feature_max=X.max(0).values)
    ref = scale_inputs(X, X.min(0).values.double(), X.max(0).values.double(), torch.float32)
    assert torch.allclose(clf.scale(X), ref) and float(clf.scale(X)[0, 0]) == 0.5
    with pytest.raises(ValueError, match="y must be 1-D with 3 entries"):
        clf(X, torch.tensor([0, 1]))
    with pytest.raises(ValueError, match="class codes 0..1"):
        clf(X, torch.tensor([0, 1, 2]))
    with pytest.raises(ValueError, match="needs the labels y"):
        clf(X, None)
    with pytest.raises(ValueError, match="y must be 1-D with 3 entries"):
        SoftTreeRegressor(2, topology=1)(X, torch.zeros(4))
