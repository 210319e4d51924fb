"""The estimators in an ML engineer's workflows (a QA pass): resuming a checkpointed fit with the same
call (with random_state=None the seed drawn by the first fit is read back from the checkpoint, so the
evidence pilots choose the same hyperparameters), checkpoints refused by name, seeds, the user's random
stream, and the repr."""
from __future__ import annotations

import numpy as np
import pytest

from torchtree import BayesianTreeClassifier
from torchtree.io.checkpoint import CheckpointError
from torchtree.monitor import CallbackMonitor


class _Stop(Exception):
    pass


def _stop_after(k):
    def hook(step):
        if step >= k:
            raise _Stop
    return CallbackMonitor(on_checkpoint=hook)


def _data():
    rng = np.random.default_rng(0)
    X = rng.normal(size=(120, 3))
    return X, ((X[:, 0] + 0.5 * rng.normal(size=120)) > 0).astype(int)


def test_an_unseeded_checkpointed_fit_resumes_and_equals_the_seeded_uninterrupted_fit(tmp_path, monkeypatch):
    import os

    monkeypatch.setattr(os, "fsync", lambda fd: None)
    X, y = _data()
    path = str(tmp_path / "run.ckpt")
    make = lambda **k: BayesianTreeClassifier(method="mcmc", n_chains=2, n_samples=40, n_warmup=20,  # noqa: E731
                                              checkpoint=path, checkpoint_every=1, **k)
    with pytest.raises(_Stop):
        make(random_state=None, monitor=_stop_after(5)).fit(X, y)
    resumed = make(random_state=None).fit(X, y)  # used to refuse: the pilots drew another seed
    seed = resumed.posterior_.info["seed"]
    ref = BayesianTreeClassifier(method="mcmc", n_chains=2, n_samples=40, n_warmup=20, random_state=seed).fit(X, y)
    assert resumed.posterior_.info["hyper"] == ref.posterior_.info["hyper"]
    np.testing.assert_array_equal(resumed.predict_proba(X), ref.predict_proba(X))


def test_a_checkpoint_of_another_method_or_a_directory_is_refused_by_name(tmp_path):
    X, y = _data()
    path = str(tmp_path / "run.ckpt")
    BayesianTreeClassifier(method="smc", n_particles=20, random_state=0, hyper="fixed", checkpoint=path).fit(X, y)
    with pytest.raises(CheckpointError, match="written by TopDownSMC, not by this run's MCMC"):
        BayesianTreeClassifier(method="mcmc", n_chains=2, n_samples=10, random_state=0, hyper="fixed",
                               checkpoint=path).fit(X, y)
    with pytest.raises(ValueError, match="is a directory; give a file path in it"):
        BayesianTreeClassifier(n_particles=20, random_state=0, hyper="fixed", checkpoint=str(tmp_path)).fit(X, y)


def test_report_on_a_checkpoint_says_what_the_file_is(tmp_path, capsys):
    from torchtree.cli import main

    X, y = _data()
    path = str(tmp_path / "run.ckpt")
    BayesianTreeClassifier(n_particles=20, random_state=0, hyper="fixed", checkpoint=path).fit(X, y)
    assert main(["report", path]) == 2
    assert "a run's checkpoint (torchtree.io.checkpoint/1), not a posterior file" in capsys.readouterr().err


def test_prediction_leaves_the_users_torch_random_stream_alone():
    """A soft-tree posterior's prediction built a model whose starting draw used the global torch
    generator: after torch.manual_seed(1), predict changed the user's next torch.rand."""
    import torch
    from torchtree.soft import DCC

    g = torch.Generator().manual_seed(0)
    X = torch.rand(40, 2, generator=g)
    post = DCC(n_iterations=1, n_initial=4, n_chains=2, n_samples=4, n_warmup=8, max_depth=1).run(
        (X, (X[:, 0] > 0.5).long()), seed=0)
    torch.manual_seed(1)
    expected = torch.rand(3)
    torch.manual_seed(1)
    post.predict_proba(X)
    post.predict(X)
    assert torch.equal(torch.rand(3), expected)


@pytest.mark.parametrize("bad", [-1, 2 ** 63, 2 ** 64 + 3])
def test_seeds_outside_63_bits_are_refused_not_aliased(bad):
    """2**64 + 3 used to run as 3, and -1 as 2**63 - 1."""
    from torchtree import TopDownSMC, Data

    X, y = _data()
    with pytest.raises(ValueError, match=r"random_state must be None, an int in \[0, 2\*\*63 - 1\]"):
        BayesianTreeClassifier(n_particles=10, random_state=bad).fit(X, y)
    with pytest.raises(ValueError, match=r"seed must be an int in \[0, 2\*\*63 - 1\]"):
        TopDownSMC(n_particles=10).run(Data(X, y), seed=bad)


def test_repr_shows_the_parameters_changed_from_their_defaults():
    from torchtree import BayesianTreeRegressor

    assert repr(BayesianTreeClassifier()) == "BayesianTreeClassifier()"
    assert (repr(BayesianTreeClassifier(method="mcmc", random_state=5, alpha=2.0, n_chains=3))
            == "BayesianTreeClassifier(method='mcmc', random_state=5, alpha=2.0, n_chains=3)")
    assert repr(BayesianTreeRegressor(kappa0=0.2, verbose=0)) == "BayesianTreeRegressor(verbose=0, kappa0=0.2)"


def test_summary_effective_sizes_say_what_they_count():
    """MCMC's ess is the chains' autocorrelation ESS (it was Kish's of the stored run-length weights:
    16 with the host loop and 300 with the batched one for the same draws); SMC's ess_distinct counts
    the distinct trees that carry the weight, resampled copies merged."""
    from torchtree import MCMC, Data, TopDownSMC

    X, y = _data()
    data = Data(X, y)
    posts = [MCMC(n_chains=2, n_samples=60, engine=e).run(data, seed=0) for e in ("host", "batched")]
    for post in posts:
        s = post.summary()
        assert s["ess"] == min(post.info["ess_leaves"], post.info["ess_log_posterior"])
    assert posts[0].summary()["ess"] == posts[1].summary()["ess"]
    post = TopDownSMC(n_particles=200).run(data, seed=0)
    smc, w = post.summary(), post.weights.double()
    assert abs(smc["ess_distinct"] - float(1 / (w * w).sum())) < 1e-9 and smc["ess_distinct"] <= smc["ess"] + 1e-9


def test_class_probabilities_sum_to_one_in_float64():
    """The leaves' rows are float32; their mixture summed to 1 only within ~3e-8, which scikit-learn's
    log_loss warns about."""
    X, y = _data()
    for method, kw in (("smc", dict(n_particles=100)), ("mcmc", dict(n_chains=2, n_samples=50))):
        p = BayesianTreeClassifier(method=method, random_state=0, hyper="fixed", **kw).fit(X, y).predict_proba(X)
        assert np.abs(p.sum(1) - 1.0).max() <= 4e-16


def test_the_forest_routing_plan_is_built_once_per_posterior_and_not_pickled(monkeypatch):
    """Prediction rebuilt the row-independent routing of the whole forest at every call (a one-row
    predict cost as much as a thousand rows); it is now built at the first call and reused, with the
    same numbers as a fresh build. Counted, not timed."""
    import pickle

    from torchtree.kernels import forest
    from torchtree.model import posterior as posterior_module

    X, y = _data()
    post = BayesianTreeClassifier(n_particles=50, random_state=0, hyper="fixed").fit(X, y).posterior_
    builds = []
    real = forest.forest_plan
    monkeypatch.setattr(posterior_module, "forest_plan", lambda *a: builds.append(1) or real(*a))
    post._table = None  # as a freshly loaded posterior
    first = post.predict_proba(X[:1])
    for i in range(5):
        post.predict_proba(X[i:i + 1])
    assert len(builds) == 1
    t = post.trees
    fresh = forest.mixture_over_leaves(t.feature, t.threshold, t.left, t.right, t.depth, t.status != 0, post.weights,
                                       post._table, post.inputs(X[:1]), lambda rows, pts: rows, first.shape[1]).numpy()
    np.testing.assert_array_equal(first, fresh / fresh.sum(1, keepdims=True))
    back = pickle.loads(pickle.dumps(post))
    assert back._plan is None and back._table is None
    np.testing.assert_array_equal(back.predict_proba(X[:1]), first)
    del post.__dict__["_plan"]  # as pickled by a version without the plan: its _table is set
    np.testing.assert_array_equal(post.predict_proba(X[:1]), first)


def test_a_drawn_seed_resumes_a_checkpoint_of_a_run_asked_with_seed_none(tmp_path, monkeypatch):
    """Checkpoints of seed=None runs are keyed "drawn"; the estimator's read-back seed (a DrawnSeed)
    keys them the same way, so checkpoints written before it, or by run(seed=None), still resume."""
    import os

    from torchtree import MCMC, Data
    from torchtree.io.checkpoint import Checkpointer
    from torchtree.samplers.driver import DrawnSeed, seed_key

    monkeypatch.setattr(os, "fsync", lambda fd: None)
    assert seed_key(DrawnSeed(5)) == seed_key(None) == "drawn" and seed_key(5) == 5
    X, y = _data()
    data, path = Data(X, y), str(tmp_path / "run.ckpt")
    make = lambda: MCMC(n_chains=2, n_samples=30, checkpoint=path, checkpoint_every=1)  # noqa: E731
    with pytest.raises(_Stop):
        make().run(data, seed=None, monitor=_stop_after(5))
    stored = Checkpointer(path).stored_seed()
    resumed = make().run(data, seed=DrawnSeed(stored))
    ref = MCMC(n_chains=2, n_samples=30).run(data, seed=stored)
    np.testing.assert_array_equal(resumed.predict_proba(X), ref.predict_proba(X))
