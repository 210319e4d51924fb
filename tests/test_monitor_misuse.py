"""Misused monitors are refused at once, and a monitor does not take the progress bars away (a QA pass: an
unwritable TensorBoard directory raised a bare NotADirectoryError after the estimator's evidence pilots, a
wrong ``monitor=`` a TypeError after them, and ``monitor=`` hid the bar that ``verbose=2`` asks for)."""
import numpy as np
import pytest

from torchtree import BayesianTreeClassifier, TensorBoardMonitor
from torchtree.cli import main
from torchtree.monitor import CallbackMonitor


def test_a_log_directory_behind_a_file_is_refused_at_construction(tmp_path):
    afile = tmp_path / "afile"
    afile.write_text("x")
    with pytest.raises(ValueError, match=r"TensorBoardMonitor: log directory .*afile/sub' cannot be created: "
                                         r".*afile' is a file"):
        TensorBoardMonitor(afile / "sub")
    with pytest.raises(ValueError, match="afile' is a file"):
        TensorBoardMonitor(afile)
    TensorBoardMonitor(tmp_path / "new" / "deeper")  # creatable: accepted, nothing created yet
    assert not (tmp_path / "new").exists()


def test_a_wrong_monitor_is_refused_before_the_pilots(monkeypatch):
    from torchtree import estimator_base

    def pilots(*a, **k):
        raise AssertionError("the evidence pilots ran")

    monkeypatch.setattr(estimator_base.BayesianTreeBase, "_search_hyperparameters", pilots)
    X = np.random.default_rng(0).uniform(size=(30, 2))
    with pytest.raises(TypeError):
        BayesianTreeClassifier("smc", n_particles=20, monitor="runs/x").fit(X, (X[:, 0] > 0.5).astype(int))


def test_verbose_2_shows_the_bar_beside_a_monitor(capsys):
    X = np.random.default_rng(0).uniform(size=(40, 2))
    y = (X[:, 0] > 0.5).astype(int)
    steps = []
    BayesianTreeClassifier("smc", n_particles=20, hyper="fixed", verbose=2,
                           monitor=[CallbackMonitor(on_step=lambda s, d: steps.append(s))]).fit(X, y)
    err = capsys.readouterr().err
    assert "torchtree smc" in err and steps  # the bar and the user's monitor both ran


def test_cli_logdir_is_checked_before_the_fit(tmp_path, capsys):
    afile = tmp_path / "afile"
    afile.write_text("x")
    data = tmp_path / "d.csv"
    rng = np.random.default_rng(0)
    data.write_text("a,b,y\n" + "\n".join(f"{u:.3f},{v:.3f},{int(u > 0.5)}" for u, v in rng.uniform(size=(30, 2))))
    assert main(["fit", str(data), "--logdir", str(afile / "x"), "--out", str(tmp_path / "p.pt"), "-q"]) == 2
    err = capsys.readouterr().err
    assert "--logdir" in err and "is a file" in err and not (tmp_path / "p.pt").exists()


def test_mcmc_iterations_per_second_after_a_resume_counts_that_segment(tmp_path):
    """It divided every iteration of the run by the seconds of the resumed segment alone."""
    from torchtree import MCMC, Data

    class Stop(Exception):
        pass

    def stop(step, info):
        if step >= 19:
            raise Stop

    rng = np.random.default_rng(0)
    X = rng.uniform(size=(40, 2))
    data = Data(X, (X[:, 0] > 0.5).astype(int), task="classification")
    kw = dict(n_chains=2, n_samples=20, n_warmup=20, monitor_every=10, checkpoint=str(tmp_path / "m.ckpt"),
              checkpoint_every=10)
    with pytest.raises(Stop):
        MCMC(**kw).run(data, seed=0, monitor=CallbackMonitor(on_step=stop))
    with pytest.warns(UserWarning):  # short chains: unconverged
        post = MCMC(**kw).run(data, seed=0)
    info = post.info
    assert info["resumed_at_iteration"] == 10 and info["n_iterations"] == 40  # the save before the stop: step 9
    assert info["iterations_per_second"] * info["seconds"] == pytest.approx(30, rel=1e-9)
