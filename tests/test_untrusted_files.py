"""Files and folders others can write (a QA pass as a security reviewer): a checksum anyone can recompute is not a
signature, so a crafted posterior is refused by its bounds, never loaded into unbounded memory or printed raw to
the terminal; links planted where torchtree writes are not followed; the benchmark runner never runs scripts of
the current folder."""
import os

import numpy as np
import pytest

import torchtree
from torchtree import BayesianTreeClassifier
from _edits import edited as _edited

pytestmark = pytest.mark.filterwarnings("ignore:MCMC chains look unconverged")


def _data(n=120):
    g = np.random.default_rng(0)
    X = g.normal(size=(n, 3))
    return X, (X[:, 0] > 0).astype(int)


@pytest.fixture(scope="module")
def smc_file(tmp_path_factory):
    X, y = _data()
    path = tmp_path_factory.mktemp("smc") / "post.pt"
    BayesianTreeClassifier(n_particles=30, hyper="fixed").fit(X, y).posterior_.save(path)
    return path


def test_a_lock_file_that_is_a_link_is_not_followed(tmp_path):
    """The lock was opened through the link and truncated its target: another user could plant one at
    ``<checkpoint>.lock`` in a shared folder and have the run overwrite any file the victim can write."""
    victim = tmp_path / "victim.txt"
    victim.write_text("precious")
    (tmp_path / "run.ckpt.lock").symlink_to(victim)
    X, y = _data()
    with pytest.raises(PermissionError, match=r"run.ckpt.lock is a symbolic link, which torchtree does not follow"):
        BayesianTreeClassifier(n_particles=20, hyper="fixed", checkpoint=str(tmp_path / "run.ckpt")).fit(X, y)
    assert victim.read_text() == "precious"


def test_predictions_written_as_csv_do_not_follow_a_planted_link(tmp_path):
    """The temporary file was ``<out>.tmp-<pid>``, a name one can guess and plant a link at."""
    from torchtree.io.csv import write_csv

    out, victim = tmp_path / "preds.csv", tmp_path / "victim.txt"
    victim.write_text("precious")
    os.symlink(victim, f"{out}.tmp-{os.getpid()}")
    write_csv(str(out), ["pred"], [[1.0, 2.0]])
    assert victim.read_text() == "precious"
    assert not out.is_symlink() and out.read_text() == "pred\n1.0\n2.0\n"


def test_the_benchmark_runner_never_runs_scripts_of_the_current_folder(tmp_path, monkeypatch, capsys):
    """An installed package (no benchmarks/ beside it) ran ``./benchmarks/bench_NAME.py`` of wherever it was
    called."""
    import torchtree.cli.bench as bench
    from torchtree.cli import main

    (tmp_path / "benchmarks").mkdir()
    (tmp_path / "benchmarks" / "bench_paper001.py").write_text("raise SystemExit('ran')\n")
    monkeypatch.chdir(tmp_path)
    monkeypatch.delenv("TORCHTREE_BENCHMARKS", raising=False)
    monkeypatch.setattr(bench, "__file__", str(tmp_path / "site" / "torchtree" / "cli" / "bench.py"))  # installed
    assert bench.benchmarks() == {}
    assert main(["bench", "--list"]) == 0
    assert "not with an installed package; set TORCHTREE_BENCHMARKS" in capsys.readouterr().out
    assert main(["bench", "paper001", "--smoke"]) == 2


def test_a_posterior_declaring_a_huge_tree_capacity_is_refused_before_allocating(smc_file, tmp_path, monkeypatch):
    """A file of a few hundred kB could declare any capacity: loading asked for trees x capacity slots (tens of GB
    from this file) before any check."""
    monkeypatch.setenv("TORCHTREE_MEMORY_LIMIT", "1G")
    bad = _edited(smc_file, tmp_path / "cap.pt", lambda p: p["trees"].update(capacity=10**7))
    with pytest.raises(ValueError, match=r"trees of capacity 10000000 would take .* to load, more than the 1\.0 GiB"):
        torchtree.load_posterior(bad)


def test_a_coding_of_another_width_than_the_trees_is_refused(tmp_path):
    """It loaded, and prediction failed deep inside with an IndexError."""
    X, y = _data()
    X = X.copy()
    X[::7, 1] = np.nan  # a missing cell: the posterior keeps the table's coding
    path = tmp_path / "post.pt"
    BayesianTreeClassifier(n_particles=20, hyper="fixed").fit(X, y).posterior_.save(path)
    bad = _edited(path, tmp_path / "bad.pt", lambda p: p["encoder"].update(columns=p["encoder"]["columns"][:2],
                                                                           names=p["encoder"]["names"][:2]))
    with pytest.raises(ValueError, match=r"damaged or edited: .*split columns for"):
        torchtree.load_posterior(bad)


def test_names_read_from_a_file_cannot_drive_the_terminal(smc_file, tmp_path, capsys):
    """Feature names went to the terminal raw: escape sequences recoloured it or rewrote the line, and a newline
    faked rows of the summary."""
    from torchtree.cli import main

    fake = "age\x1b[2K\rFAKE: model verified OK\nb"
    bad = _edited(smc_file, tmp_path / "names.pt", lambda p: p.update(feature_names=[fake, "x1", "x2"]))
    assert main(["summary", str(bad)]) == 0
    out = capsys.readouterr().out
    assert "\x1b" not in out and "\r" not in out and "\nb" not in out
    assert r"age\x1b[2K\rFAKE: model verified OK\nb" in out
