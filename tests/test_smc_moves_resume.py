"""SMCSampler checkpoint / resume (``checkpoint=``, ``checkpoint_every=``).

A run interrupted after iteration k and resumed from its checkpoint equals the
uninterrupted run bit for bit (trees, log-weights, log evidence, predictive
probabilities, ESS trace): the checkpoint holds the trees with their caches and
every piece of sampler state, and there is no generator state (all draws are keyed).
Interruptions: an exception from a monitor's ``on_checkpoint`` / ``on_step`` hook
(``smc_moves_cases.stop_after``, in process), and a real subprocess killed with SIGKILL
after its checkpoint of iteration k appeared.
Multi-rank resume (per-rank files + manifest) is covered in test_smc_moves_dist.py.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pytest
import torch

from torchtree.io.checkpoint import CheckpointError, load_checkpoint
from torchtree.samplers.smc_moves import SMCSampler

WORKERS = Path(__file__).parent / "_dist_workers"
ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(WORKERS))
import smc_moves_cases as sc  # noqa: E402


def _same(a: torch.Tensor, b: torch.Tensor) -> bool:
    if a.dtype != b.dtype or a.shape != b.shape:
        return False
    if a.is_floating_point():
        bits = {4: torch.int32, 8: torch.int64}[a.element_size()]
        a, b = a.view(bits), b.view(bits)
    return torch.equal(a, b)


def _check(got: dict, ref: dict) -> None:
    assert got["log_evidence"] == ref["log_evidence"]
    assert np.array_equal(got["pred"], ref["pred"])
    for k, v in ref["trees"].items():
        assert _same(got["trees"][k], v), k
    assert _same(got["log_weights"], ref["log_weights"])
    for k in ("n_resample", "final_ess", "ess_trace", "temperatures", "accept_fraction"):
        assert got["info"][k] == ref["info"][k], k


def _stopped(name: str, path: str, k: int, **kw) -> None:
    with pytest.raises(sc.Stop):
        sc.run_case(name, checkpoint=path, monitor=sc.stop_after(k), **kw)


@pytest.mark.parametrize("name", ["weights_multinomial", "mh_stratified", "tempering_residual", "poisson", "regression"])
def test_interrupted_and_resumed_equals_uninterrupted(name, tmp_path):
    ref = sc.run_case(name)
    path = str(tmp_path / "run.ckpt")
    _stopped(name, path, 2)
    assert load_checkpoint(path)["step"] == 2
    got = sc.run_case(name, checkpoint=path)
    assert got["info"]["resumed_from"] == 2
    _check(got, ref)
    # The finished run's checkpoint (last iteration) gives the same result without iterating.
    again = sc.run_case(name, checkpoint=path)
    assert again["info"]["resumed_from"] == sc.CASES[name][1]["n_iterations"] - 1
    _check(again, ref)


def test_checkpoint_every_two(tmp_path):
    """Saved after iterations 1, 3, ...: stopping after 2 resumes after 1 (iteration 2 is redone)."""
    ref = sc.run_case("weights_multinomial")
    path = str(tmp_path / "run.ckpt")
    _stopped("weights_multinomial", path, 2, checkpoint_every=2)
    assert load_checkpoint(path)["step"] == 1
    got = sc.run_case("weights_multinomial", checkpoint=path, checkpoint_every=2)
    assert got["info"]["resumed_from"] == 1
    _check(got, ref)


def test_checkpoint_holds_plain_tensors_only(tmp_path):
    path = str(tmp_path / "run.ckpt")
    _stopped("tempering_residual", path, 1)
    state = torch.load(path, weights_only=True)["state"]["sampler_state"]["state"]  # no pickled code
    assert state["iteration"] == 1 and isinstance(state["trees"]["extra.bits"], torch.Tensor)
    assert state["ll"].shape == (sc.N_PARTICLES,) and 0.0 < state["phi"] < 1.0


def test_other_runs_checkpoint_is_refused(tmp_path):
    path = str(tmp_path / "run.ckpt")
    _stopped("weights_multinomial", path, 1)
    d, _ = sc.data("classification")
    kw = dict(sc.CASES["weights_multinomial"][1])
    with pytest.raises(CheckpointError, match="different run"):
        SMCSampler(n_particles=sc.N_PARTICLES, checkpoint=path, **kw).run(d, seed=sc.SEED + 1)
    kw["ess_threshold"] = 0.5
    with pytest.raises(CheckpointError, match="different run"):
        SMCSampler(n_particles=sc.N_PARTICLES, checkpoint=path, **kw).run(d, seed=sc.SEED)
    with pytest.raises(ValueError, match="checkpoint_every"):
        SMCSampler(checkpoint=path, checkpoint_every=0)


def test_sigkill_after_checkpoint_then_resume(tmp_path):
    """A real process, killed with SIGKILL once its checkpoint of iteration 3 is on disk."""
    name, k = "tempering_residual", 3
    ref = sc.run_case(name)
    path = str(tmp_path / "run.ckpt")
    env = dict(os.environ, OMP_NUM_THREADS="1")
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(ROOT), str(WORKERS), env.get("PYTHONPATH", "")]))
    log = open(tmp_path / "worker.log", "w")
    proc = subprocess.Popen([sys.executable, str(WORKERS / "smc_moves_kill_worker.py"), path, name, str(k)],
                            env=env, stdout=log, stderr=subprocess.STDOUT, start_new_session=True)
    try:
        deadline = time.monotonic() + 120
        step = None
        while time.monotonic() < deadline and proc.poll() is None:
            if os.path.exists(path):
                step = load_checkpoint(path)["step"]
                if step >= k:
                    break
            time.sleep(0.05)
        assert proc.poll() is None, (tmp_path / "worker.log").read_text()
        assert step == k, step
        os.kill(proc.pid, signal.SIGKILL)
        assert proc.wait(timeout=30) == -signal.SIGKILL
    finally:
        if proc.poll() is None:
            os.kill(proc.pid, signal.SIGKILL)
            proc.wait()
        log.close()
    got = sc.run_case(name, checkpoint=path)
    assert got["info"]["resumed_from"] == k
    _check(got, ref)
