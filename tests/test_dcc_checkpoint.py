"""DCC checkpoint / resume: an interrupted and resumed run equals an uninterrupted one."""
from __future__ import annotations

import os
import signal
import subprocess
import sys
import textwrap
from pathlib import Path

import numpy as np
import pytest
import torch

from torchtree.io.checkpoint import CheckpointError, load_checkpoint
from torchtree.monitor import CallbackMonitor
from torchtree.soft import DCC

ROOT = Path(__file__).resolve().parents[1]


class _Interrupt(Exception):
    pass


def _data(task="regression"):
    g = torch.Generator().manual_seed(0)
    X = torch.rand(50, 2, generator=g, dtype=torch.float64)
    if task == "regression":
        y = torch.where(X[:, 0] > 0.5, 2.0, 0.0).double() + 0.2 * torch.randn(50, generator=g, dtype=torch.float64)
    else:
        y = (X[:, 0] > 0.5).long() + (X[:, 1] > 0.7).long()
    return X, y


def _dcc(**kw):
    base = dict(n_iterations=5, n_initial=8, n_chains=2, n_samples=4, n_warmup=10, n_warmup_warm=6, n_parallel=2,
                activation_threshold=2, max_depth=2, n_proposals=2, max_tree_depth=4, h_init=0.1, h_final=0.05,
                device="cpu")
    base.update(kw)
    return DCC(**base)


def _assert_same(a, b, X, y):
    assert [t.internal for t in a.topologies] == [t.internal for t in b.topologies]
    assert len(a.draws) == len(b.draws)
    for da, db in zip(a.draws, b.draws):
        assert torch.equal(da, db)
    assert torch.equal(a.topology_log_evidence, b.topology_log_evidence)
    assert torch.equal(a.weights, b.weights)
    assert np.array_equal(a.predict(X), b.predict(X))
    for k in ("nuts_iterations", "divergences", "transitions", "grad_evals", "warmups", "iterations", "n_discovered", "selected_counts"):
        assert a.info[k] == b.info[k], k


@pytest.mark.parametrize("task,local_posterior,warm", [
    ("regression", "weighted", True), ("classification", "chains", False),
])
def test_interrupted_run_resumes_identically(tmp_path, task, local_posterior, warm):
    X, y = _data(task)
    kw = dict(local_posterior=local_posterior, warm_start=warm)
    ref = _dcc(**kw).run((X, y), seed=3)
    path = str(tmp_path / "dcc.ckpt")
    first = _dcc(checkpoint=path, **kw)

    def stop(it):  # after iteration 1 and its checkpoint
        if it == 1:
            raise _Interrupt

    with pytest.raises(_Interrupt):
        first.run((X, y), seed=3, monitor=CallbackMonitor(on_checkpoint=stop))
    saved = load_checkpoint(path)  # weights_only=True: plain tensors and containers
    # the driver's checkpoint: {"seed", "state": DCCState.state_dict()}
    assert saved["step"] == 1 and saved["state"]["sampler_state"]["state"]["iteration"] == 1
    resumed = _dcc(checkpoint=path, **kw).run((X, y), seed=3)
    assert resumed.info["resumed_from_iteration"] == 1
    _assert_same(ref, resumed, X, y)
    # the finished run's checkpoint holds the last iteration; resuming it again changes nothing
    again = _dcc(checkpoint=path, **kw).run((X, y), seed=3)
    _assert_same(ref, again, X, y)
    if task == "regression":
        # a finished run can be extended: 5 + resume to 6 == a 6-iteration run
        longer = _dcc(checkpoint=path, n_iterations=6, **kw).run((X, y), seed=3)
        _assert_same(_dcc(n_iterations=6, **kw).run((X, y), seed=3), longer, X, y)


def test_checkpoint_every_and_mismatch(tmp_path):
    X, y = _data()
    ref = _dcc().run((X, y), seed=1)
    path = str(tmp_path / "dcc.ckpt")
    first = _dcc(checkpoint=path, checkpoint_every=2)

    def stop(it, info):
        if it == 2 and "dcc/n_active" in info:  # iteration 2 ran but was not saved (saves after 1, 3, ...)
            raise _Interrupt

    with pytest.raises(_Interrupt):
        first.run((X, y), seed=1, monitor=CallbackMonitor(on_step=stop))
    assert load_checkpoint(path)["step"] == 1
    _assert_same(ref, _dcc(checkpoint=path, checkpoint_every=2).run((X, y), seed=1), X, y)
    # another seed, other data or other settings: a clear error, not a silent mix
    with pytest.raises(CheckpointError, match="different run"):
        _dcc(checkpoint=path).run((X, y), seed=2)
    with pytest.raises(CheckpointError, match="different run"):
        _dcc(checkpoint=path).run((X, y + 1), seed=1)
    with pytest.raises(CheckpointError, match="different run"):
        _dcc(checkpoint=path, n_chains=3).run((X, y), seed=1)
    with pytest.raises(ValueError, match="checkpoint_every"):
        DCC(checkpoint=path, checkpoint_every=0)


_SCRIPT = textwrap.dedent("""
    import sys, time, torch
    sys.path.insert(0, {root!r})
    from torchtree.monitor import CallbackMonitor
    from torchtree.soft import DCC
    g = torch.Generator().manual_seed(0)
    X = torch.rand(50, 2, generator=g, dtype=torch.float64)
    y = torch.where(X[:, 0] > 0.5, 2.0, 0.0).double() + 0.2 * torch.randn(50, generator=g, dtype=torch.float64)
    torch.set_num_threads(1)
    dcc = DCC(n_iterations=4, n_initial=8, n_chains=2, n_samples=4, n_warmup=10, n_warmup_warm=6, n_parallel=2,
              activation_threshold=2, max_depth=2, n_proposals=2, max_tree_depth=4, h_init=0.1, h_final=0.05,
              device="cpu", warm_start=True, checkpoint=sys.argv[1])
    mon = None
    if len(sys.argv) > 2:  # pause after iteration 2's checkpoint so the parent can SIGKILL us there
        def pause(it):
            if it == 2:
                print("PAUSED", flush=True)
                time.sleep(600)
        mon = CallbackMonitor(on_checkpoint=pause)
    post = dcc.run((X, y), seed=5, monitor=mon)
    torch.save({{"draws": post.draws, "lz": post.topology_log_evidence, "pred": torch.as_tensor(post.predict(X))}},
               sys.argv[1] + ".out")
""")


@pytest.mark.slow
@pytest.mark.skipif(sys.platform == "win32", reason="SIGKILL")
def test_sigkill_then_resume_matches(tmp_path):
    script = tmp_path / "run.py"
    script.write_text(_SCRIPT.format(root=str(ROOT)))
    env = dict(os.environ, OMP_NUM_THREADS="1")
    ref_ck, ck = str(tmp_path / "ref.ckpt"), str(tmp_path / "killed.ckpt")
    subprocess.run([sys.executable, str(script), ref_ck], check=True, env=env, timeout=300)
    p = subprocess.Popen([sys.executable, str(script), ck, "pause"], stdout=subprocess.PIPE, text=True, env=env)
    try:
        assert p.stdout.readline().strip() == "PAUSED"
        os.kill(p.pid, signal.SIGKILL)
        p.wait(timeout=60)
    finally:
        if p.poll() is None:
            p.kill()
    assert p.returncode == -signal.SIGKILL
    assert load_checkpoint(ck)["step"] == 2 and not os.path.exists(ck + ".out")
    subprocess.run([sys.executable, str(script), ck], check=True, env=env, timeout=300)
    a, b = torch.load(ref_ck + ".out"), torch.load(ck + ".out")
    assert all(torch.equal(u, v) for u, v in zip(a["draws"], b["draws"])) and len(a["draws"]) == len(b["draws"])
    assert torch.equal(a["lz"], b["lz"]) and torch.equal(a["pred"], b["pred"])
