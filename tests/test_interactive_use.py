"""Interactive use (a QA pass as a notebook user): an interrupted fit closes its progress bars and leaves the
estimator as the last finished fit left it; a fit whose chains look unconverged warns every time, a re-run of
the same line included; a disabled bar needs no tqdm."""
import os
import subprocess
import sys
import textwrap

import numpy as np
import pytest

from torchtree import BayesianTreeClassifier, BayesianTreeRegressor, Monitor


class _Interrupt(Monitor):
    """Raises KeyboardInterrupt (as Ctrl-C would) after step ``at``; counts its ``close`` calls."""

    def __init__(self, at: int):
        super().__init__()
        self.at, self.closed = at, 0

    def on_step(self, step, info):
        if step >= self.at:
            raise KeyboardInterrupt

    def close(self):
        self.closed += 1


def _data(n=120, seed=0):
    g = np.random.default_rng(seed)
    X = g.normal(size=(n, 3))
    return X, (X[:, 0] > 0).astype(int)


def test_an_interrupted_fit_closes_its_bars_and_monitors():
    """The bar stayed registered with tqdm: every later bar was drawn one line down with cursor-up codes,
    which a notebook prints as a new line per update."""
    tqdm = pytest.importorskip("tqdm")
    X, y = _data()
    stop = _Interrupt(at=2)
    before = set(tqdm.tqdm._instances)
    with pytest.raises(KeyboardInterrupt) as caught:  # its traceback keeps the frames alive, as a notebook's does
        BayesianTreeClassifier(n_particles=50, verbose=2, hyper="evidence", monitor=stop).fit(X, y)
    assert stop.closed == 1
    assert set(tqdm.tqdm._instances) == before, caught  # no bar left open


def test_an_interrupted_evidence_search_closes_its_bar(monkeypatch):
    tqdm = pytest.importorskip("tqdm")
    import torchtree.samplers.tuning.evidence as evidence

    def interrupted(*args, **kwargs):
        raise KeyboardInterrupt

    monkeypatch.setattr(evidence, "_pilot_evidences", interrupted)
    X, y = _data()
    before = set(tqdm.tqdm._instances)
    with pytest.raises(KeyboardInterrupt) as caught:  # its traceback keeps the frames alive, as a notebook's does
        BayesianTreeClassifier(n_particles=50, verbose=2).fit(X, y)
    assert set(tqdm.tqdm._instances) == before, caught


def test_an_interrupted_refit_leaves_the_last_fit_whole():
    """sampler_config_ was set before the run: after an interrupted refit it described the unfinished run
    while posterior_ and n_features_in_ described the last finished one."""
    X, y = _data()
    est = BayesianTreeClassifier(n_particles=30, hyper="fixed", verbose=0).fit(X[:, :2], y)
    config, post = est.sampler_config_, est.posterior_
    est.set_params(method="mcmc", n_samples=50, n_warmup=20, monitor=_Interrupt(at=3))
    with pytest.raises(KeyboardInterrupt):
        est.fit(X, y)
    assert est.sampler_config_ is config and est.posterior_ is post and est.n_features_in_ == 2
    fresh = BayesianTreeClassifier(method="mcmc", n_samples=50, n_warmup=20, monitor=_Interrupt(at=3))
    with pytest.raises(KeyboardInterrupt):
        fresh.fit(X, y)
    assert not [k for k in vars(fresh) if k.endswith("_") and not k.startswith("_")]  # nothing fitted


def _run(code: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-c", textwrap.dedent(code)], capture_output=True, text=True, timeout=300,
                          env={**{k: v for k, v in os.environ.items() if k != "PYTHONWARNINGS"}, "OMP_NUM_THREADS": "1"})


def test_every_unconverged_fit_warns_a_rerun_of_the_same_line_included():
    """Python's default action shows a warning once per text and line: a notebook cell run again with the same
    seed (same text, same line) stayed silent. The child process runs without pytest's warning filters."""
    out = _run("""
        import numpy as np, torchtree
        g = np.random.default_rng(0)
        X = g.uniform(size=(100, 2)); y = X[:, 0] + 0.1 * g.normal(size=100)
        for _ in range(3):
            torchtree.BayesianTreeRegressor(method="bart", n_trees=5, n_chains=2, n_warmup=5, n_samples=10,
                                            verbose=0).fit(X, y)
        """)
    assert out.returncode == 0, out.stderr
    assert out.stderr.count("ConvergenceWarning: MCMC chains look unconverged") == 3, out.stderr
    silenced = _run("""
        import warnings, numpy as np, torchtree
        warnings.filterwarnings("ignore", category=torchtree.ConvergenceWarning)
        g = np.random.default_rng(0)
        X = g.uniform(size=(100, 2)); y = X[:, 0] + 0.1 * g.normal(size=100)
        torchtree.BayesianTreeRegressor(method="bart", n_trees=5, n_chains=2, n_warmup=5, n_samples=10,
                                        verbose=0).fit(X, y)
        """)
    assert silenced.returncode == 0 and "ConvergenceWarning" not in silenced.stderr, silenced.stderr


def test_a_default_fit_without_tqdm_where_no_bar_would_show():
    """verbose=1 on a stream that is not a terminal shows no bar, yet the bar imported tqdm.auto."""
    out = _run("""
        import sys
        sys.modules["tqdm"] = None; sys.modules["tqdm.auto"] = None
        import numpy as np, torchtree
        g = np.random.default_rng(0)
        X = g.normal(size=(80, 2))
        print(torchtree.BayesianTreeClassifier(n_particles=20).fit(X, X[:, 0] > 0).score(X, X[:, 0] > 0))
        """)
    assert out.returncode == 0, out.stderr
    assert 0.5 < float(out.stdout) <= 1.0


def test_the_repr_summarises_long_parameters():
    """A 300-entry categorical_features printed in full (1,713 characters); numpy and scikit-learn summarise."""
    for given in (np.arange(300), list(range(300)), tuple(range(300))):
        text = repr(BayesianTreeClassifier(categorical_features=given, n_particles=7))
        assert len(text) < 150 and "297, 298, 299" in text and "n_particles=7" in text, text
    long_name = "m" * 500
    text = repr(BayesianTreeClassifier(method=long_name))
    assert len(text) < 200 and "..." in text


def test_a_printed_summary_of_a_wide_table_shows_the_most_used_features():
    from torchtree.model.summary import SHOWN_FEATURES

    g = np.random.default_rng(0)
    X = g.normal(size=(200, 40))
    s = BayesianTreeClassifier(n_particles=30, verbose=0).fit(X, (X[:, 0] > 0).astype(int)).posterior_.summary()
    text = repr(s)
    rows = [line for line in text.splitlines() if line.startswith("    x")]
    u = np.asarray(s["feature_usage"])
    assert len(u) == 40 and len(rows) == SHOWN_FEATURES and rows[0].split()[0] == "x0"
    assert f"... {40 - SHOWN_FEATURES} more ({int((u == 0).sum()) - (SHOWN_FEATURES - int((u > 0).sum()))} never split on)" in text
