"""Checkpoint and resume (issue #7): TopDownSMC (one process and 2 ranks) and MCMC (both engines).

A run killed at any moment and resumed from its checkpoint returns exactly what an
uninterrupted run with the same seed returns: every tree field, the log weights, the log
evidence, predict_proba and the MCMC traces are compared with ``torch.equal`` /
``np.array_equal`` (no tolerance: the samplers' random numbers are keyed by seed, particle
or chain, and stage or iteration, and the checkpoints hold every array that decides the
rest of the run).

* a real child process, killed with SIGKILL while it waits right after a checkpoint, then
  resumed in this process;
* checkpoints of other runs (another seed, other data, other settings, another number of
  ranks) are refused with ``CheckpointError``;
* ``checkpoint_every=3`` saves after steps 2, 5, 8, ... and after the last step;
* a finished run re-run with its checkpoint returns the same posterior without running;
* in-process stops at many steps (a hook raising after a checkpoint), 2 thread-ranks and 2
  real gloo ranks;
* the estimators forward ``checkpoint=`` / ``checkpoint_every=``.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import numpy as np
import pytest
import torch

from torchtree import MCMC, BayesianTreeClassifier, Data, TopDownSMC, TraceMonitor
from torchtree.samplers.mcmc import sampler as mcmc_module

from _launch import gloo_ranks
from torchtree.io.checkpoint import CheckpointError, load_checkpoint
from torchtree.monitor import CallbackMonitor

ROOT = Path(__file__).resolve().parents[1]
WORKERS = Path(__file__).parent / "_dist_workers"
sys.path.insert(0, str(WORKERS))
import resume_cases as rc  # noqa: E402
from thread_backend import run_threads  # noqa: E402

DATA, XQ = rc.data()
SMC_KW = dict(n_particles=64, n_islands=2, proposal="prior", ess_threshold=0.9)
MCMC_KW = {"host": dict(n_chains=1, n_samples=60, engine="host"),
           "host2": dict(n_chains=2, n_samples=60, engine="host"),
           "batched": dict(n_chains=3, n_samples=40, engine="batched")}


@pytest.fixture(autouse=True)
def _no_fsync(monkeypatch):
    """In this process, checkpoints are renamed into place as usual but not fsync'ed
    (about 12 ms per save here, most of this file's time with ``checkpoint_every=1``).
    Durability is tested in test_checkpoint.py; the killed child processes below (and the
    gloo ranks) keep the real ``os.fsync``."""
    monkeypatch.setattr(os, "fsync", lambda fd: None)


class Stop(Exception):
    """Raised by the test hook right after a checkpoint: an in-process crash."""


def _same(post, ref):
    """Exact equality of two posteriors (trees, weights, evidence, predictions, traces)."""
    a, b = post.trees.as_dict(), ref.trees.as_dict()
    assert a.keys() == b.keys()
    for k in b:
        assert torch.equal(a[k], b[k]), k
    assert torch.equal(post.log_weights, ref.log_weights)
    assert post.log_evidence == ref.log_evidence
    assert post.n_particles == ref.n_particles
    p, q = np.asarray(post.predict_proba(XQ)), np.asarray(ref.predict_proba(XQ))
    if post.log_weights.device.type == "cuda":
        # CUDA sums a prediction's mixture with atomic adds, in no fixed order: two calls on one
        # posterior may differ in the last bits (README, "CUDA")
        np.testing.assert_allclose(p, q, rtol=1e-12, atol=1e-15)
    else:
        assert np.array_equal(p, q)
    for key in ("n_stages", "n_resample", "island_log_evidence", "accept/all"):
        if key in ref.info:
            assert post.info[key] == ref.info[key], key
    if "trace" in ref.info:
        for k, v in ref.info["trace"].items():
            assert np.array_equal(post.info["trace"][k], v), k


def _sampler(kind, path=None, every=1, **over):
    if kind == "smc":
        return TopDownSMC(**{**SMC_KW, **over}, checkpoint=path, checkpoint_every=every)
    return MCMC(**{**MCMC_KW[kind], **over}, checkpoint=path, checkpoint_every=every)


def _run_stopped(kind, path, stop_at, every=1, data=DATA, seed=rc.SEED):
    """Run with a hook that raises right after the checkpoint of step ``stop_at``."""
    s = _sampler(kind, path, every)

    def hook(step):
        if step >= stop_at:
            raise Stop

    with pytest.raises(Stop):
        s.run(data, seed=seed, monitor=CallbackMonitor(on_checkpoint=hook))


_REF: dict = {}


def _reference(kind):
    if kind not in _REF:
        _REF[kind] = _sampler(kind).run(DATA, seed=rc.SEED)
    return _REF[kind]


# --------------------------------------------------------------------------- SIGKILL
CHILD = textwrap.dedent("""
    import sys
    sys.path.insert(0, {workers!r})
    import torch
    torch.set_num_threads(1)
    import resume_cases as rc
    from torchtree import MCMC, TopDownSMC
    from torchtree.monitor import CallbackMonitor
    kind, path, stop_at = sys.argv[1], sys.argv[2], int(sys.argv[3])
    data, _ = rc.data()
    if kind == "smc":
        s = TopDownSMC(**{smc!r}, checkpoint=path, checkpoint_every=1)
    else:
        s = MCMC(**{mcmc!r}[kind], checkpoint=path, checkpoint_every=1)
    def hook(step):
        print("checkpoint", step, flush=True)
        if step == stop_at:
            sys.stdin.readline()  # wait here until the test kills us
    s.run(data, seed=rc.SEED, monitor=CallbackMonitor(on_checkpoint=hook))
    print("finished", flush=True)
""")


@pytest.mark.parametrize("kind,stop_at", [("smc", 12), ("host", 70), ("host2", 70), ("batched", 43)])
def test_sigkill_then_resume_equals_uninterrupted(tmp_path, kind, stop_at):
    path = str(tmp_path / f"{kind}.ckpt")
    env = dict(os.environ, OMP_NUM_THREADS="1")
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(ROOT), env.get("PYTHONPATH", "")]))
    code = CHILD.format(workers=str(WORKERS), smc=SMC_KW, mcmc=MCMC_KW)
    child = subprocess.Popen([sys.executable, "-c", code, kind, path, str(stop_at)], stdin=subprocess.PIPE,
                             stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env)
    seen = []
    try:
        deadline = time.monotonic() + 120
        for line in child.stdout:
            seen.append(line.strip())
            if line.strip() == f"checkpoint {stop_at}" or time.monotonic() > deadline:
                break
        child.send_signal(signal.SIGKILL)
        child.wait(timeout=30)
    finally:
        if child.poll() is None:
            child.kill()
            child.wait()
    assert seen and seen[-1] == f"checkpoint {stop_at}", (seen[-3:], child.stderr.read()[-2000:])
    assert child.returncode == -signal.SIGKILL
    assert load_checkpoint(path)["step"] == stop_at  # the file of the killed run
    ref = _reference(kind)
    mon = TraceMonitor()
    # checkpoint_every is not part of the run's identity: resume saving only at the end.
    _same(_sampler(kind, path, every=1000).run(DATA, seed=rc.SEED, monitor=mon), ref)
    # it continued from the checkpoint, not from the start
    assert mon.start_info["resumed_at_stage" if kind == "smc" else "resumed_at_iteration"] == stop_at + 1


# ------------------------------------------------------------------ in-process stops
@pytest.mark.parametrize("kind,stops", [("smc", (0, 5, 30)), ("host", (0, 59, 119)), ("host2", (0, 59, 119)),
                                        ("batched", (10, 60))])
def test_stop_anywhere_then_resume(tmp_path, monkeypatch, kind, stops):
    ref = _reference(kind)
    # MCMC draws its uniforms in blocks of _BLOCK iterations (512): with blocks of 16 the
    # runs resume inside a block and cross block boundaries afterwards (the draws are keyed
    # by iteration, so the block size does not change them).
    monkeypatch.setattr(mcmc_module, "_BLOCK", 16)
    for i, stop_at in enumerate(stops):
        path = str(tmp_path / f"{i}.ckpt")
        _run_stopped(kind, path, stop_at)
        _same(_sampler(kind, path).run(DATA, seed=rc.SEED), ref)


def test_smc_layer_optimal_and_regression_resume(tmp_path):
    """Other proposals / expansion, and float node statistics (regression)."""
    rng = np.random.default_rng(1)
    X = rng.normal(size=(150, 3))
    reg = Data(X, 2 * X[:, 0] + np.sin(3 * X[:, 1]) + 0.2 * rng.normal(size=150), task="regression")
    for data, kw in ((DATA, dict(proposal="optimal", expansion="layer", n_islands=4)),
                     (reg, dict(proposal="empirical", n_islands=1))):
        ref = TopDownSMC(**{**SMC_KW, **kw}).run(data, seed=3)
        path = str(tmp_path / f"{kw['proposal']}.ckpt")
        s = TopDownSMC(**{**SMC_KW, **kw}, checkpoint=path)

        def hook(step):
            if step >= 4:
                raise Stop

        with pytest.raises(Stop):
            s.run(data, seed=3, monitor=CallbackMonitor(on_checkpoint=hook))
        post = TopDownSMC(**{**SMC_KW, **kw}, checkpoint=path).run(data, seed=3)
        a, b = post.trees.as_dict(), ref.trees.as_dict()
        assert all(torch.equal(a[k], b[k]) for k in b)
        assert torch.equal(post.log_weights, ref.log_weights) and post.log_evidence == ref.log_evidence


# ------------------------------------------------------------------ other runs refused
@pytest.mark.parametrize("kind", ["smc", "host", "host2", "batched"])
def test_checkpoint_of_another_run_is_refused(tmp_path, kind):
    path = str(tmp_path / "run.ckpt")
    _run_stopped(kind, path, 3)
    # the refusal names what differs: the seed, the data, the settings by name
    with pytest.raises(CheckpointError, match=r"different run \(the seed differs:"):
        _sampler(kind, path).run(DATA, seed=rc.SEED + 1)
    other, _ = rc.data(seed=1)
    with pytest.raises(CheckpointError, match=r"different run \(the training data differs:"):
        _sampler(kind, path).run(other, seed=rc.SEED)
    over = {"n_particles": 32} if kind == "smc" else {"n_samples": 50}
    with pytest.raises(CheckpointError, match=rf"different run \(the setting {next(iter(over))} differs:"):
        _sampler(kind, path, **over).run(DATA, seed=rc.SEED)
    with pytest.raises(CheckpointError, match=rf"\(the seed and the setting {next(iter(over))} differ:"):
        _sampler(kind, path, **over).run(DATA, seed=rc.SEED + 1)
    # Options that do not change the result may differ (here: how often to save).
    _sampler(kind, path, every=5).run(DATA, seed=rc.SEED)


def test_checkpoint_of_the_other_mcmc_engine_is_refused(tmp_path, monkeypatch):
    """``engine="auto"`` is the setting the fingerprint sees, whichever engine it resolves to (a
    release with another cost model may resolve it otherwise): the state's layout then refuses a
    file of the other engine, with a message that says so."""
    import torchtree.samplers.mcmc.sampler as mcmc_sampler

    kw = {**MCMC_KW["host2"], "engine": "auto"}
    for first, then, msg in ((False, True, "host engine"), (True, False, "batched engine")):
        path = str(tmp_path / f"run{first}.ckpt")
        monkeypatch.setattr(mcmc_sampler, "host_is_cheaper", lambda p, n: first)
        with pytest.raises(Stop):
            MCMC(**kw, checkpoint=path).run(DATA, seed=rc.SEED, monitor=CallbackMonitor(on_checkpoint=_stop_at(3)))
        monkeypatch.setattr(mcmc_sampler, "host_is_cheaper", lambda p, n: then)
        with pytest.raises(CheckpointError, match=msg):
            MCMC(**kw, checkpoint=path).run(DATA, seed=rc.SEED)


def _stop_at(stop_at):
    def hook(step):
        if step >= stop_at:
            raise Stop
    return hook


# --------------------------------------------------------- save steps, finished runs
@pytest.mark.parametrize("kind", ["smc", "host", "host2", "batched"])
def test_every_3_saves_at_expected_steps_and_finished_run_returns_at_once(tmp_path, kind):
    path = str(tmp_path / "run.ckpt")
    s = _sampler(kind, path, every=3)
    steps = []
    post = s.run(DATA, seed=rc.SEED, monitor=CallbackMonitor(on_checkpoint=steps.append))
    ref = _reference(kind)
    _same(post, ref)
    final = ref.info["n_stages"] if kind == "smc" else s.n_iterations - 1
    expected = [k for k in range(final) if (k + 1) % 3 == 0]
    if kind == "smc":
        expected.append(final)  # the stage that finds no open node ends the run: always saved
    elif final not in expected:
        expected.append(final)
    assert steps == expected
    assert load_checkpoint(path)["step"] == final
    # Re-running the finished run: no step runs, nothing is rewritten, same posterior.
    mtime = os.stat(path).st_mtime_ns
    again = _sampler(kind, path, every=3)
    again_steps = []
    _same(again.run(DATA, seed=rc.SEED, monitor=CallbackMonitor(on_checkpoint=again_steps.append)), ref)
    assert again_steps == [] and os.stat(path).st_mtime_ns == mtime


def test_seed_none_reuses_the_stored_seed(tmp_path):
    path = str(tmp_path / "run.ckpt")
    _run_stopped("smc", path, 4, seed=None)
    seed = load_checkpoint(path)["state"]["sampler_state"]["seed"]
    _same(_sampler("smc", path).run(DATA, seed=None), _sampler("smc").run(DATA, seed=seed))


def test_checkpoint_every_must_be_positive():
    with pytest.raises(ValueError, match="checkpoint_every"):
        TopDownSMC(checkpoint="x", checkpoint_every=0)
    with pytest.raises(ValueError, match="checkpoint_every"):
        MCMC(checkpoint="x", checkpoint_every=0)


@pytest.mark.cuda
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
@pytest.mark.parametrize("kind", ["smc", "batched"])
def test_cuda_stop_and_resume(tmp_path, kind):
    """Checkpoints of a CUDA run (saved from device tensors, loaded on the CPU, moved back)."""
    ref = _sampler(kind, device="cuda").run(DATA, seed=rc.SEED)
    path = str(tmp_path / "run.ckpt")
    s = _sampler(kind, path, device="cuda")

    def hook(step):
        if step >= 7:
            raise Stop

    with pytest.raises(Stop):
        s.run(DATA, seed=rc.SEED, monitor=CallbackMonitor(on_checkpoint=hook))
    _same(_sampler(kind, path, device="cuda").run(DATA, seed=rc.SEED), ref)


# ----------------------------------------------------------------------------- estimators
@pytest.mark.parametrize("method,kw", [("smc", dict(n_particles=32)), ("mcmc", dict(n_chains=2, n_samples=50))])
def test_estimator_forwards_checkpoint_options(tmp_path, method, kw):
    path = str(tmp_path / f"{method}.ckpt")
    X, y = DATA.X.numpy(), DATA.y.numpy()
    plain = BayesianTreeClassifier(method=method, random_state=2, **kw).fit(X, y)
    est = BayesianTreeClassifier(method=method, random_state=2, checkpoint=path, checkpoint_every=2, **kw).fit(X, y)
    assert os.path.exists(path)
    assert est.get_params()["checkpoint_every"] == 2
    again = BayesianTreeClassifier(method=method, random_state=2, checkpoint=path, checkpoint_every=2, **kw).fit(X, y)
    for e in (est, again):
        assert np.array_equal(e.predict_proba(XQ), plain.predict_proba(XQ))
    with pytest.raises(CheckpointError):
        BayesianTreeClassifier(method=method, random_state=3, checkpoint=path, **kw).fit(X, y)


# ----------------------------------------------------------------------------- multi-rank
@pytest.mark.parametrize("name", list(rc.DIST_CASES))
def test_two_thread_ranks_stop_and_resume(tmp_path, name):
    kw = rc.DIST_CASES[name]
    ref = TopDownSMC(**kw).run(DATA, seed=rc.SEED)
    for stop_at in (3, 21):
        path = str(tmp_path / f"{stop_at}.ckpt")

        def first(b):
            s = TopDownSMC(**kw, backend=b, checkpoint=path, checkpoint_every=rc.EVERY)

            def hook(step):
                if step >= stop_at:
                    raise Stop

            return s.run(DATA, seed=rc.SEED, monitor=CallbackMonitor(on_checkpoint=hook, all_ranks=True))

        with pytest.raises(Stop):
            run_threads(2, first, timeout=60)
        outs = run_threads(2, lambda b: TopDownSMC(**kw, backend=b, checkpoint=path, checkpoint_every=rc.EVERY)
                           .run(DATA, seed=rc.SEED), timeout=60)
        for post in outs:
            _same(post, ref)
    # Another number of ranks cannot resume it.
    with pytest.raises(CheckpointError, match="rank"):
        TopDownSMC(**kw, checkpoint=path, checkpoint_every=rc.EVERY).run(DATA, seed=rc.SEED)


def test_two_thread_ranks_that_would_not_resume_alike_raise(tmp_path):
    """Per-rank checkpoint paths: after a stop, rank 1's files are gone (node-local storage
    lost), so it would start afresh while rank 0 resumed. It used to give a wrong posterior
    without a word; now every rank raises the same CheckpointError."""
    kw = rc.DIST_CASES[next(iter(rc.DIST_CASES))]

    def sampler(b):
        return TopDownSMC(**kw, backend=b, checkpoint=str(tmp_path / f"rank{b.rank}" / "run.ckpt"), checkpoint_every=1)

    def hook(step):
        if step >= 3:
            raise Stop

    stop = CallbackMonitor(on_checkpoint=hook, all_ranks=True)

    for r in (0, 1):
        (tmp_path / f"rank{r}").mkdir()
    with pytest.raises(Stop):
        run_threads(2, lambda b: sampler(b).run(DATA, seed=rc.SEED, monitor=stop), timeout=60)
    for f in (tmp_path / "rank1").iterdir():
        f.unlink()
    errors = []

    def resume(b):
        try:
            sampler(b).run(DATA, seed=rc.SEED, monitor=stop)
        except CheckpointError as exc:
            errors.append(str(exc))

    run_threads(2, resume, timeout=60)
    assert len(errors) == 2 and all("rank 1 finds no checkpoint" in e for e in errors), errors


@pytest.mark.distributed
def test_two_gloo_ranks_stop_and_resume(tmp_path):
    env = dict(os.environ, OMP_NUM_THREADS="1", TT_TEST_TIMEOUT="60")
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(ROOT), env.get("PYTHONPATH", "")]))
    job = gloo_ranks("resume_worker.py", [tmp_path], 2, WORKERS, tmp_path, 180.0, env=lambda r: env, tail=3000).wait()
    assert job.codes == [0, 0], job.logs
    results = [torch.load(tmp_path / f"rank{r}.pt", weights_only=False) for r in range(2)]
    for name, kw in rc.DIST_CASES.items():
        ref = TopDownSMC(**kw).run(DATA, seed=rc.SEED)
        want = rc.summary(ref, XQ)
        for res in results:
            got = res[name]
            assert got["stopped"] and got["before"][-1] == rc.STOP_AT
            assert got["after"][0] == rc.STOP_AT + rc.EVERY  # resumed, not restarted
            assert got["log_evidence"] == want["log_evidence"] and got["n_stages"] == want["n_stages"]
            assert torch.equal(got["log_weights"], want["log_weights"])
            assert np.array_equal(got["proba"], want["proba"])
            assert all(torch.equal(got["trees"][k], want["trees"][k]) for k in want["trees"])
        with pytest.raises(CheckpointError, match="2 rank"):
            TopDownSMC(**kw, checkpoint=str(tmp_path / f"{name}.ckpt")).run(DATA, seed=rc.SEED)
