"""Run-level semantics the soft-tree samplers share with the hard-tree ones (issue 19):
``seed=None`` is fresh randomness and an int reproduces, ``device=None`` is the data's
device, ``on_start`` names the sampler, and monitors go through ``as_monitor`` (a bad
monitor is a TypeError, not silently ignored)."""
from __future__ import annotations

import pytest
import torch

from torchtree.monitor import CallbackMonitor
from torchtree.soft import DCC, HMC, NUTS


def _data():
    g = torch.Generator().manual_seed(0)
    X = torch.rand(40, 2, generator=g)
    y = (X[:, 0] > 0.5).long()
    return X, y


def _dcc(**kw):
    base = dict(n_iterations=2, n_initial=5, n_chains=2, n_samples=3, n_warmup=5, n_warmup_warm=3, n_parallel=1,
                activation_threshold=1, max_depth=2, max_tree_depth=4)
    return DCC(**{**base, **kw})


def _nuts(cls=NUTS, **kw):
    return cls(n_chains=2, n_samples=4, n_warmup=6, depth=1, max_tree_depth=4, n_leapfrog=3, **kw)


def _draws(post):
    return torch.cat([d.reshape(-1) for d in post.draws])


@pytest.mark.parametrize("make", [_dcc, _nuts, lambda: _nuts(HMC)], ids=["dcc", "nuts", "hmc"])
def test_seed_none_is_fresh_and_an_int_reproduces(make):
    data = _data()
    a, b = make().run(data, seed=7), make().run(data, seed=7)
    assert torch.equal(_draws(a), _draws(b))
    c, d = make().run(data), make().run(data, seed=None)
    assert not torch.equal(_draws(c), _draws(d))


def test_estimator_random_state_none_is_fresh():
    from torchtree import BayesianTreeClassifier

    X, y = _data()
    kw = dict(n_iterations=2, n_initial=5, n_chains=2, n_samples=3, n_warmup=5, n_warmup_warm=3, n_parallel=1,
              activation_threshold=1, max_depth=2, max_tree_depth=4)
    p1 = BayesianTreeClassifier(method="dcc", random_state=None, **kw).fit(X, y).predict_proba(X)
    p2 = BayesianTreeClassifier(method="dcc", random_state=None, **kw).fit(X, y).predict_proba(X)
    assert not (p1 == p2).all()


@pytest.mark.parametrize("make", [_dcc, _nuts], ids=["dcc", "nuts"])
def test_device_default_is_the_datas(make):
    assert make().device is None
    post = make().run(_data(), seed=0)
    assert post.data.X.device == torch.device("cpu")


@pytest.mark.parametrize("make,name,method", [(_dcc, "DCC", "dcc"), (_nuts, "NUTS", "nuts"),
                                              (lambda: _nuts(HMC), "HMC", "hmc")], ids=["dcc", "nuts", "hmc"])
def test_on_start_names_the_sampler(make, name, method):
    seen = {}
    make().run(_data(), seed=0, monitor=CallbackMonitor(on_start=seen.update))
    assert seen["sampler"] == name and seen["method"] == method


@pytest.mark.parametrize("make", [_dcc, _nuts], ids=["dcc", "nuts"])
def test_a_bad_monitor_is_a_type_error(make):
    with pytest.raises(TypeError, match="monitor must be"):
        make().run(_data(), seed=0, monitor=object())
    with pytest.raises(TypeError, match="monitor must be"):
        make().run(_data(), seed=0, monitor=[CallbackMonitor(), "not a monitor"])


def test_the_chain_loops_check_their_monitor_too():
    from torchtree.samplers.nuts.chains import make_kernel, warmup

    def gaussian(x):
        return 0.5 * (x * x).sum(1), x

    with pytest.raises(TypeError, match="monitor must be"):
        warmup(make_kernel("hmc", n_leapfrog=2), gaussian, torch.zeros(2, 3), 2, monitor=42)


def test_monitor_lists_reach_every_member():
    a, b = [], []
    _nuts().run(_data(), seed=0, monitor=[CallbackMonitor(on_step=lambda s, i: a.append(s)),
                                          CallbackMonitor(on_step=lambda s, i: b.append(s))])
    assert a and a == b


def test_dcc_time_budget_reads_its_clock_saves_and_resumes(tmp_path, monkeypatch):
    """max_seconds counts the clock the config names (driver.CLOCKS); a run stopped by it
    saves its last iteration (even between two regular saves) and a later run without the
    budget resumes there and ends where an uninterrupted run ends."""
    from torchtree.io.checkpoint import load_checkpoint
    from torchtree.samplers import driver

    now = [0.0]
    monkeypatch.setitem(driver.CLOCKS, "cpu", lambda: now[0])

    def tick(step, info):  # every DCC iteration costs 10 "CPU seconds"
        if "dcc/n_active" in info:
            now[0] += 10.0

    data = _data()
    ref = _dcc(n_iterations=3).run(data, seed=4)
    # the wall clock does not see the fake CPU time: all 3 iterations
    walled = _dcc(n_iterations=3, max_seconds=5.0, clock="wall").run(data, seed=4, monitor=CallbackMonitor(on_step=tick))
    assert walled.info["iterations"] == 3
    path = str(tmp_path / "dcc.ckpt")
    saved = []
    post = _dcc(n_iterations=3, max_seconds=5.0, clock="cpu", checkpoint=path, checkpoint_every=5).run(
        data, seed=4, monitor=CallbackMonitor(on_step=tick, on_checkpoint=saved.append))
    assert post.info["iterations"] == 1 and saved == [0] and load_checkpoint(path)["step"] == 0
    resumed = _dcc(n_iterations=3, checkpoint=path, checkpoint_every=5).run(data, seed=4)
    assert resumed.info["iterations"] == 3 and resumed.info["resumed_from_iteration"] == 0
    assert torch.equal(_draws(resumed), _draws(ref))
    assert torch.equal(resumed.topology_log_evidence, ref.topology_log_evidence)


def test_nuts_on_start_total_counts_its_steps():
    seen, steps = {}, []
    _nuts(thin=2).run(_data(), seed=0, monitor=CallbackMonitor(on_start=seen.update,
                                                               on_step=lambda s, i: steps.append(s)))
    assert seen["total"] == len(steps) == 6 + 4 * 2


def test_dcc_seed_none_checkpoint_keeps_the_drawn_seed(tmp_path):
    """seed=None draws a seed once; the checkpoint keeps it, so the resumed run continues
    the same run (and equals an uninterrupted run with that seed)."""
    from torchtree.io.checkpoint import load_checkpoint

    class Stop(Exception):
        pass

    def stop(step):
        if step == 1:
            raise Stop

    data, path = _data(), str(tmp_path / "dcc.ckpt")
    with pytest.raises(Stop):
        _dcc(n_iterations=3, checkpoint=path).run(data, monitor=CallbackMonitor(on_checkpoint=stop))
    drawn = load_checkpoint(path)["state"]["sampler_state"]["seed"]
    resumed = _dcc(n_iterations=3, checkpoint=path).run(data)
    assert resumed.info["resumed_from_iteration"] == 1
    ref = _dcc(n_iterations=3).run(data, seed=drawn)
    assert torch.equal(_draws(resumed), _draws(ref))


@pytest.mark.parametrize("cls", [DCC, NUTS, HMC])
def test_cli_help_comes_from_the_config(cls):
    """Every option has help text, without docstring debris (raw types, Sphinx roles,
    cut sentences)."""
    from torchtree.cli.options import sampler_options
    from torchtree.samplers.protocol import config_class_of

    assert config_class_of(cls) is cls.config_class
    opts = dict(sampler_options(cls))
    assert {"n_chains", "dtype", "asynchronous", "signed_splits"} <= set(opts)
    for name, kw in opts.items():
        text = kw["help"]
        assert text and not text.startswith(("int,", "float,", "bool,", "(default")), (name, text)
        assert ":class:" not in text and ":func:" not in text and "``" not in text and "..." not in text, (name, text)


def test_soft_gradient_kernel_imports_nothing_above_kernels():
    import ast
    from pathlib import Path

    import torchtree.kernels.soft_gradient as kernel

    tree = ast.parse(Path(kernel.__file__).read_text())
    mods = [n.module for n in ast.walk(tree) if isinstance(n, ast.ImportFrom)]
    mods += [a.name for n in ast.walk(tree) if isinstance(n, ast.Import) for a in n.names]
    assert all(not m.startswith("torchtree") or m.startswith("torchtree.kernels") for m in mods), mods
