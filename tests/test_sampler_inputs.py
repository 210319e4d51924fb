"""The hard-tree samplers' inputs and settings: what a QA pass found accepted and then
crashed on, ignored, or mishandled (tenth session). Each check fails on the old code."""
from __future__ import annotations

import numpy as np
import pytest
import torch

from torchtree import (BayesianTreeClassifier, BayesianTreeRegressor, ChipmanPrior, Data, DirichletMultinomial,
                       PoissonPrior, TopDownSMC)
from torchtree.io.checkpoint import CheckpointError
from torchtree.cli import main
from torchtree.samplers.mcmc import MCMC
from torchtree.samplers.smc_moves import SMCSampler


def _xy(n=60, seed=0):
    rng = np.random.default_rng(seed)
    X = rng.uniform(size=(n, 2))
    return X, np.where(X[:, 0] > 0.5, "hi", "lo")


def test_top_down_smc_refuses_the_poisson_prior_up_front_and_takes_names():
    """PoissonPrior has no per-node split probabilities: this used to be an AttributeError
    at the first proposal (and a traceback from the CLI's --prior poisson)."""
    X, y = _xy()
    with pytest.raises(ValueError, match="per-node split probabilities"):
        TopDownSMC(PoissonPrior(3.0))
    with pytest.raises(ValueError, match="per-node split probabilities"):
        BayesianTreeClassifier(prior="poisson", n_particles=10).fit(X, y)
    assert TopDownSMC("chipman").prior.config() == ChipmanPrior().config()
    with pytest.raises(ValueError, match="prior must be 'chipman', 'poisson' or a prior object"):
        TopDownSMC("uniform")
    with pytest.raises(TypeError, match="backend must be a torchtree.distributed.Backend"):
        TopDownSMC(backend=42)


@pytest.mark.parametrize("make", [lambda: TopDownSMC(n_particles=10), lambda: MCMC(n_samples=10, n_warmup=10),
                                  lambda: SMCSampler(n_particles=16, n_iterations=2)])
def test_samplers_take_a_pair_x_y(make):
    X, y = _xy()
    a = make().run((X, y), seed=0)
    b = make().run(Data(X, y), seed=0)
    np.testing.assert_array_equal(a.predict_proba(X), b.predict_proba(X))
    with pytest.raises(TypeError, match="data must be a torchtree.Data or a pair"):
        make().run(X, seed=0)


def test_mcmc_host_engine_runs_several_chains_and_device_auto_resolves():
    X, y = _xy()
    post = MCMC(n_chains=3, engine="host", n_samples=5, n_warmup=5).run((X, y), seed=0)
    assert post.info["engine"] == "host" and post.info["trace"]["n_leaves"].shape == (3, 5)
    with pytest.raises(ValueError, match="engine='host' implements cut_proposal='prior' only"):
        MCMC(n_chains=3, engine="host", cut_proposal="data")
    # "auto" (documented for the estimators) used to reach torch.device("auto")
    for method, kw in (("mcmc", dict(n_samples=10, n_warmup=10)), ("smc-moves", dict(n_particles=16, n_iterations=2))):
        clf = BayesianTreeClassifier(method, device="auto", **kw).fit(X, y)
        assert clf.predict(X).shape == (60,)


def test_smc_moves_checkpoint_tells_numpy_integer_seeds_apart(tmp_path):
    """Every non-int seed used to fingerprint as 'generator': seed np.int64(2) resumed the
    finished run of np.int64(1), and int 3's checkpoint was refused for np.int64(3)."""
    X, y = _xy()
    kw = dict(n_particles=16, n_iterations=3)
    path = str(tmp_path / "s.ckpt")
    first = SMCSampler(checkpoint=path, **kw).run(Data(X, y), seed=np.int64(1))
    with pytest.raises(CheckpointError):
        SMCSampler(checkpoint=path, **kw).run(Data(X, y), seed=np.int64(2))
    again = SMCSampler(checkpoint=path, **kw).run(Data(X, y), seed=1)  # the same seed as an int resumes
    assert again.log_evidence == first.log_evidence


def test_estimator_uses_a_given_likelihood_and_prior_object():
    """A likelihood= sampler option used to be replaced by the estimator's default."""
    X, y = _xy()
    clf = BayesianTreeClassifier(likelihood=DirichletMultinomial(0.01), n_particles=10).fit(X, y)
    assert clf.posterior_.likelihood.alpha == 0.01
    with pytest.raises(ValueError, match="alpha do\\(es\\) not apply when likelihood= is given"):
        BayesianTreeClassifier(likelihood=DirichletMultinomial(0.01), alpha=2.0, n_particles=10).fit(X, y)
    clf = BayesianTreeClassifier("mcmc", prior=PoissonPrior(2.0), n_samples=10, n_warmup=10)
    assert clf._build_sampler(Data(X, y)).prior.lam == 2.0
    assert clf.fit(X, y).predict(X).shape == (60,)


def test_score_takes_a_column_y_and_refuses_other_shapes():
    """score() used to broadcast [N] against [N, 1]: a regressor scored -471 for 0.59."""
    rng = np.random.default_rng(1)
    X = rng.uniform(size=(80, 2))
    yr = np.where(X[:, 0] > 0.5, 2.0, -1.0) + 0.3 * rng.normal(size=80)
    reg = BayesianTreeRegressor(n_particles=20).fit(X, yr.reshape(-1, 1))
    assert reg.score(X, yr.reshape(-1, 1)) == reg.score(X, yr) > 0.5
    _, y = _xy(80)
    clf = BayesianTreeClassifier(n_particles=20).fit(X, y)
    assert clf.score(X, y.reshape(-1, 1)) == clf.score(X, y)
    for est, target in ((reg, yr), (clf, y)):
        with pytest.raises(ValueError, match=r"y must have shape \[80\]"):
            est.score(X, target[:-1])


def test_cli_options_that_would_be_ignored(tmp_path, capsys):
    X, y = _xy()
    path = tmp_path / "d.csv"
    np.savetxt(path, np.column_stack([X, (y == "hi").astype(int)]), delimiter=",", header="a,b,y", comments="")
    out = str(tmp_path / "p.pt")
    assert main(["fit", str(path), "--n-particles", "10", "--checkpoint-every", "5", "--out", out, "--quiet"]) == 2
    assert "--checkpoint-every applies with --checkpoint" in capsys.readouterr().err
    assert main(["fit", str(path), "--method", "smc-moves", "--n-particles", "16", "--n-iterations", "2",
                 "--init-prior", "chipman", "--out", out, "--quiet"]) == 0
    assert main(["predict", out, str(path), "--level", "0.5"]) == 0
    assert "--level applies to regression" in capsys.readouterr().err


def test_smc_moves_takes_a_backend_name_and_checks_redistribution_against_the_ranks():
    """SMCSampler(backend='local') used to fail on 'str'.world_size; 'gather' on two ranks
    failed at the first resampling with advice about other methods."""
    X, y = _xy()
    a = SMCSampler(n_particles=16, n_iterations=2, backend="local").run(Data(X, y), seed=0)
    b = SMCSampler(n_particles=16, n_iterations=2).run(Data(X, y), seed=0)
    np.testing.assert_array_equal(a.predict_proba(X), b.predict_proba(X))

    class TwoRanks:  # fails the run at its set-up, whose refusal the ranks share in one all_gather
        rank, world_size = 0, 2

        def all_reduce(self, t):
            raise AssertionError("no collective expected but the set-up's")

        def all_gather(self, t):  # the other rank refused alike
            return torch.cat([t, t])

    for method in ("gather", "sequential"):
        with pytest.raises(ValueError, match=f"redistribution='{method}' runs on one rank; this run has 2"):
            SMCSampler(n_particles=16, n_iterations=2, backend=TwoRanks(), redistribution=method).run(Data(X, y), seed=0)


def test_many_integer_labels_without_a_task_warn_that_they_are_taken_as_classes():
    """``BART.run((X, y))`` with a count target fitted a 13-utility multinomial probit in silence (a QA pass):
    ``Data`` without ``task`` now warns past ``ASK_CLASSES`` distinct integers, naming ``task='regression'``;
    a few classes, or a task given, do not warn."""
    import warnings

    from torchtree.model.data import ASK_CLASSES

    X = np.random.default_rng(0).uniform(size=(200, 2))
    with pytest.warns(UserWarning, match=rf"y holds {ASK_CLASSES + 1} distinct integers, taken as that many classes"):
        d = Data(X, np.arange(200) % (ASK_CLASSES + 1))
    assert d.task == "classification" and d.n_classes == ASK_CLASSES + 1
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        Data(X, np.arange(200) % ASK_CLASSES)
        assert Data(X, np.arange(200) % 50, task="regression").task == "regression"
