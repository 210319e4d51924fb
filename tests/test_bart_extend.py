"""A BART run that ended unconverged goes on from its checkpoint with a larger ``n_samples``: the kept sweeps are
those of one run of the new length, bit for bit (a sweep's random numbers depend on its index alone). Before,
the checkpoint was refused as another run's, and the remedy the convergence warning names meant starting over."""
from __future__ import annotations

import numpy as np
import pytest
import torch

from torchtree import BART, BayesianTreeClassifier, BayesianTreeRegressor, Data
from torchtree.io.checkpoint import CheckpointError

pytestmark = pytest.mark.filterwarnings("ignore::UserWarning")  # short runs: the convergence warning

KW = dict(n_trees=10, n_chains=2, n_warmup=12)


def _regression():
    rng = np.random.default_rng(0)
    X = rng.uniform(size=(150, 3))
    return Data(X, np.sin(3 * X[:, 0]) + 0.1 * rng.normal(size=150), task="regression")


def _same_posterior(a, b, X):
    assert a.info["n_samples"] == b.info["n_samples"]
    for k in a.info["trace"]:
        assert np.array_equal(a.info["trace"][k], b.info["trace"][k]), k
    assert torch.equal(torch.as_tensor(a.predict(X)), torch.as_tensor(b.predict(X)))
    assert a.info["rhat_f"] == b.info["rhat_f"] and a.info["ess_sigma"] == b.info["ess_sigma"]


@pytest.mark.parametrize("first", [8, 25])  # ends in warm-up (a time budget's stop) or after it
def test_a_finished_run_extended_is_the_longer_run(tmp_path, first):
    data = _regression()
    ck = str(tmp_path / "bart.ckpt")
    short = BART(**KW, n_samples=first, checkpoint=ck).run(data, seed=5)
    assert short.info["n_samples"] == first
    longer = BART(**KW, n_samples=40, checkpoint=ck).run(data, seed=5)
    _same_posterior(longer, BART(**KW, n_samples=40).run(data, seed=5), data.X)
    again = BART(**KW, n_samples=40, checkpoint=ck).run(data, seed=5)  # finished at 40: resumes with no sweep
    _same_posterior(again, longer, data.X)


def test_a_budget_stopped_run_resumes_with_a_larger_n_samples(tmp_path):
    data = _regression()
    ck = str(tmp_path / "bart.ckpt")
    steps = []

    class Stop(Exception):
        pass

    from torchtree.monitor import CallbackMonitor

    def on_step(step, info):
        steps.append(step)
        if step >= 19:  # a run killed after sweep 20 of 12 + 30
            raise Stop

    with pytest.raises(Stop):
        BART(**KW, n_samples=30, checkpoint=ck, checkpoint_every=1, monitor_every=1).run(
            data, seed=2, monitor=CallbackMonitor(on_step=on_step))
    longer = BART(**KW, n_samples=45, checkpoint=ck).run(data, seed=2)
    _same_posterior(longer, BART(**KW, n_samples=45).run(data, seed=2), data.X)


def test_the_estimator_extends_through_set_params(tmp_path):
    rng = np.random.default_rng(1)
    X = rng.uniform(size=(120, 2))
    y = (X[:, 0] + 0.2 * rng.normal(size=120) > 0.5).astype(int)
    ck = str(tmp_path / "clf.ckpt")
    est = BayesianTreeClassifier(method="bart", n_trees=8, n_samples=10, checkpoint=ck, random_state=4).fit(X, y)
    est.set_params(n_samples=30).fit(X, y)
    ref = BayesianTreeClassifier(method="bart", n_trees=8, n_samples=30, random_state=4).fit(X, y)
    assert est.posterior_.info["n_samples"] == 30
    assert np.array_equal(est.predict_proba(X), ref.predict_proba(X))


def test_fewer_kept_sweeps_than_the_checkpoint_holds_are_refused(tmp_path):
    data = _regression()
    ck = str(tmp_path / "bart.ckpt")
    BART(**KW, n_samples=20, checkpoint=ck).run(data, seed=0)
    with pytest.raises(ValueError, match=r"has kept 20 sweeps per chain, more than n_samples=10; .*n_samples >= 20"):
        BART(**KW, n_samples=10, checkpoint=ck).run(data, seed=0)


def test_other_settings_and_min_ess_runs_still_refuse(tmp_path):
    data = _regression()
    ck = str(tmp_path / "bart.ckpt")
    BART(**KW, n_samples=10, checkpoint=ck).run(data, seed=0)
    with pytest.raises(CheckpointError, match="the setting thin differs"):
        BART(**KW, thin=2, n_samples=20, checkpoint=ck).run(data, seed=0)
    ck2 = str(tmp_path / "ess.ckpt")
    BART(**KW, n_samples=10, min_ess=5.0, max_samples=10, checkpoint=ck2).run(data, seed=0)
    # with min_ess the run decides every n_samples kept sweeps: a changed n_samples is another run
    with pytest.raises(CheckpointError, match="the setting n_samples differs"):
        BART(**KW, n_samples=20, min_ess=5.0, max_samples=10, checkpoint=ck2).run(data, seed=0)


def test_a_checkpoint_fingerprinted_before_n_samples_could_grow_still_resumes(tmp_path, monkeypatch):
    """A checkpoint of an earlier version hashed n_samples with the rest: its own run still resumes it."""
    data = _regression()
    ck = str(tmp_path / "bart.ckpt")
    monkeypatch.setattr(BART, "growable_settings", lambda self: ())
    BART(**KW, n_samples=10, checkpoint=ck).run(data, seed=0)
    monkeypatch.undo()
    got = BART(**KW, n_samples=10, checkpoint=ck).run(data, seed=0)
    _same_posterior(got, BART(**KW, n_samples=10).run(data, seed=0), data.X)
    with pytest.raises(CheckpointError):  # ... but only as the same run: it cannot tell what else it hashed
        BART(**KW, n_samples=20, checkpoint=ck).run(data, seed=0)


def test_regression_estimator_default_seed_extends(tmp_path):
    """``random_state=None``: the seed the first fit drew is in the checkpoint and the second fit reads it."""
    rng = np.random.default_rng(2)
    X = rng.uniform(size=(100, 2))
    y = X[:, 0] + 0.1 * rng.normal(size=100)
    ck = str(tmp_path / "reg.ckpt")
    est = BayesianTreeRegressor(method="bart", n_trees=8, n_samples=10, checkpoint=ck, random_state=None).fit(X, y)
    seed = est.posterior_.info["seed"]
    est.set_params(n_samples=20).fit(X, y)
    assert est.posterior_.info["seed"] == seed
    ref = BayesianTreeRegressor(method="bart", n_trees=8, n_samples=20, random_state=seed).fit(X, y)
    assert np.array_equal(est.predict(X), ref.predict(X))
