"""A set-up that refuses on one rank only (a memory check where ranks see different free memory) stops every
rank at once, naming the refusing rank, instead of leaving the others in a collective until its timeout."""
import sys
from pathlib import Path

import numpy as np
import pytest

from torchtree import BART, MCMC, Data, SMCSampler

sys.path.insert(0, str(Path(__file__).parent / "_dist_workers"))
from thread_backend import run_threads  # noqa: E402


def _refusing(cls):
    class Refusing(cls):
        def setup(self, ctx):
            if ctx.rank == 1:
                raise ValueError("MCMC needs 2 GiB but 1 MiB is available on this rank")
            return super().setup(ctx)
    return Refusing


@pytest.mark.parametrize("cls,kw", [(MCMC, dict(n_chains=2, n_samples=5, n_warmup=5)),
                                    (BART, dict(n_trees=4, n_chains=2, n_samples=4, n_warmup=4)),
                                    (SMCSampler, dict(n_particles=8, n_iterations=2))])
def test_a_refusal_on_one_rank_stops_every_rank_at_once(cls, kw):
    rng = np.random.default_rng(0)
    X = rng.uniform(size=(40, 2))
    data = Data(X, (X[:, 0] > 0.5).astype(int), task="classification")
    sampler = _refusing(cls)

    def rank(be):
        try:
            sampler(**kw, backend=be).run(data, seed=0)
        except Exception as exc:  # noqa: BLE001 - each rank's outcome is the test's subject
            return exc
        return None

    got = run_threads(2, rank, timeout=20)  # a rank left waiting would raise the backend's timeout instead
    assert isinstance(got[1], ValueError) and "1 MiB is available on this rank" in str(got[1])
    assert isinstance(got[0], ValueError), got[0]
    assert str(got[0]).startswith("rank 1 refused the run before it started (ValueError: MCMC needs 2 GiB")


def test_smc_with_moves_checks_its_memory_on_several_ranks_too(monkeypatch):
    """It skipped the check on several ranks (one rank refusing alone would have hung the others)."""
    monkeypatch.setenv("TORCHTREE_MEMORY_LIMIT", "1M")
    rng = np.random.default_rng(0)
    X = rng.uniform(size=(40, 2))
    data = Data(X, (X[:, 0] > 0.5).astype(int), task="classification")

    def rank(be):
        try:
            SMCSampler(n_particles=256, n_iterations=2, backend=be).run(data, seed=0)
        except ValueError as exc:
            return str(exc)
        return None

    got = run_threads(2, rank, timeout=20)
    assert all(g is not None and "SMCSampler" in g and "memory" in g for g in got), got


def test_top_down_smc_refusing_its_memory_on_one_rank_stops_every_rank(monkeypatch):
    """Its memory check ran in ``init``, outside the agreed set-up: rank 1 refused alone and rank 0 was left in its
    first exchange (the thread ranks' broken barrier here; under torchrun, the backend's timeout)."""
    import threading

    import torchtree.core.memory as memory
    from torchtree import TopDownSMC

    ranks = {}
    real = memory.available_bytes
    monkeypatch.setattr(memory, "available_bytes",
                        lambda device=None: 1024 if ranks.get(threading.get_ident()) == 1 else real(device))
    rng = np.random.default_rng(0)
    X = rng.uniform(size=(40, 2))
    data = Data(X, (X[:, 0] > 0.5).astype(int), task="classification")

    def rank(be):
        ranks[threading.get_ident()] = be.rank
        try:
            TopDownSMC(n_particles=64, backend=be).run(data, seed=0)
        except Exception as exc:  # noqa: BLE001 - each rank's outcome is the test's subject
            return exc
        return None

    got = run_threads(2, rank, timeout=20)
    assert isinstance(got[1], ValueError) and str(got[1]).startswith("TopDownSMC (32 x"), got[1]
    assert isinstance(got[0], ValueError), got[0]
    assert str(got[0]).startswith("rank 1 refused the run before it started (ValueError: TopDownSMC (32 x"), got[0]


def test_a_method_without_ranks_says_so_for_backend():
    """``method="dcc"`` with ``backend=`` listed forty options it takes instead of saying why."""
    from torchtree import BayesianTreeClassifier

    X = np.random.default_rng(0).uniform(size=(30, 2))
    with pytest.raises(ValueError, match="method 'dcc' runs in one process and takes no backend="):
        BayesianTreeClassifier(method="dcc", backend="local").fit(X, (X[:, 0] > 0.5).astype(int))


@pytest.mark.distributed
@pytest.mark.parametrize("mode", ["abort", "wait"])
def test_a_rank_failing_mid_run_under_mpiexec_ends_the_job_at_once(mode):
    """``mpiexec`` does not stop the other ranks when one raises: with MPIBackend's ``abort_on_error`` (the default)
    the failing rank ends the job at once, its message on stderr; with it off, the other rank waits for the
    backend's timeout (20 s here) and reports it."""
    import importlib.util
    import os
    import subprocess
    import time

    mpiexec = Path(sys.executable).parent / "mpiexec"
    if importlib.util.find_spec("mpi4py") is None or not mpiexec.exists():
        pytest.skip("needs mpi4py and its mpiexec")
    t0 = time.monotonic()
    out = subprocess.run([str(mpiexec), "-n", "2", sys.executable, "step_failure_worker.py", "20", mode],
                         cwd=Path(__file__).parent / "_dist_workers", capture_output=True, text=True, timeout=120,
                         env=dict(os.environ, OMP_NUM_THREADS="1"))
    took, said = time.monotonic() - t0, out.stdout + out.stderr
    assert out.returncode != 0 and "rank 1 failed mid-run on purpose" in said and "finished" not in said
    if mode == "abort":
        assert took < 15 and "aborting every rank" in said, (took, said[-2000:])
    else:
        assert took >= 20 and "did not complete within 20 s" in said, (took, said[-2000:])
