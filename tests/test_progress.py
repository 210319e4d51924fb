"""Progress bars of a fit: one per phase (evidence pilots, the run, nested top-down starts), each with its
total; ``verbose=0`` silences them, ``verbose=1`` (default) shows only phases longer than the delay at a
terminal or in a notebook, ``verbose=2`` shows every one on any stream."""
from __future__ import annotations

import io
import re
import sys
import types

import numpy as np
import pytest

from torchtree import BayesianTreeClassifier, BayesianTreeRegressor, ProgressMonitor, TopDownSMC
from torchtree.monitor import progress_bars, progress_monitor


def _data(n=150, seed=0):
    g = np.random.default_rng(seed)
    X = g.normal(size=(n, 3))
    return X, (X[:, 0] > 0).astype(int)


def _bars(err: str) -> dict:
    """label -> (done, total) of each tqdm bar's last state in ``err``; total None for a bar without one
    (top-down SMC: its number of stages is not known in advance)."""
    out = {}
    for line in err.replace("\r", "\n").splitlines():
        m = re.match(r"\s*([\w\- ]+?): *\d+%\|[^|]*\| *(\d+)/(\d+)", line)
        if m:
            out[m[1]] = (int(m[2]), int(m[3]))
        elif m := re.match(r"\s*([\w\- ]+?): *(\d+)it \[", line):
            out[m[1]] = (int(m[2]), None)
    return out


def test_verbose_2_shows_each_phase_with_its_total(capsys):
    X, y = _data()
    BayesianTreeClassifier("smc", n_particles=20, verbose=2).fit(X, y)
    bars = _bars(capsys.readouterr().err)
    # the evidence search runs one pilot per grid point of each curve, all finished
    assert "evidence pilots" in bars and bars["evidence pilots"][0] == bars["evidence pilots"][1] > 1
    assert "torchtree smc" in bars and bars["torchtree smc"][0] > 0


def test_nested_top_down_starts_get_their_own_bar(capsys):
    X, y = _data()
    BayesianTreeClassifier("mcmc", init="topdown", n_chains=2, n_samples=5, n_warmup=5, hyper=None,
                           verbose=2).fit(X, y)
    bars = _bars(capsys.readouterr().err)
    assert "top-down start" in bars and bars["top-down start"][0] > 0
    assert bars["torchtree mcmc"] == (10, 10)  # warm-up + kept iterations


def test_bart_bar_counts_its_sweeps(capsys):
    X, y = _data()
    BayesianTreeClassifier("bart", n_trees=5, n_warmup=6, n_samples=4, verbose=2).fit(X, y)
    assert _bars(capsys.readouterr().err)["torchtree bart"] == (10, 10)


def test_pilot_count_matches_the_search(capsys):
    """The pilots' bar total is the number of pilots the search ran (its curves' points, the shared one once)."""
    X, y = _data()
    est = BayesianTreeRegressor("smc", n_particles=20, verbose=2).fit(X, y.astype(float))
    curves = est.hyper_search_.curves
    shared = 1 if "b0" in curves and "beta_split" in curves else 0
    assert _bars(capsys.readouterr().err)["evidence pilots"] == (sum(map(len, curves.values())) - shared,) * 2


def test_verbose_0_and_the_default_off_a_terminal_are_silent(capsys):
    X, y = _data()
    for v in (0, 1):  # capsys's stderr is no terminal: the default shows nothing
        BayesianTreeClassifier("smc", n_particles=20, verbose=v).fit(X, y)
        assert capsys.readouterr().err == ""


def test_levels_and_the_delay():
    assert progress_monitor("x") is None  # outside a fit: no bars
    with progress_bars(0):
        assert progress_monitor("x") is None
    with progress_bars(1):
        m = progress_monitor("x", total=3)
        assert m.delay > 0 and m.total == 3
    with progress_bars(2):
        m = progress_monitor("x")
        assert m.delay == 0 and m.disable is False
    assert progress_monitor("x") is None  # the setting ends with the block


@pytest.mark.parametrize("delay, shown", [(0.0, True), (3600.0, False)])
def test_a_run_shorter_than_the_delay_shows_nothing(delay, shown):
    X, y = _data()
    buf = io.StringIO()
    TopDownSMC(n_particles=10).run((X, y), seed=0, monitor=ProgressMonitor(disable=False, delay=delay, file=buf))
    assert bool(buf.getvalue()) is shown


def test_a_jupyter_kernel_gets_bars_without_a_terminal(monkeypatch):
    class ZMQInteractiveShell:  # the class name IPython's kernel shell has
        pass

    monkeypatch.setitem(sys.modules, "IPython", types.SimpleNamespace(get_ipython=lambda: ZMQInteractiveShell()))
    assert ProgressMonitor().disable is False
    monkeypatch.setitem(sys.modules, "IPython", types.SimpleNamespace(get_ipython=lambda: None))
    assert ProgressMonitor().disable is True  # pytest's stderr is no terminal
