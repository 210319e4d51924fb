"""One run per checkpoint path: a second run on a checkpoint that a live run holds refuses at its start
(two runs had read and replaced each other's files: a raw ``FileNotFoundError`` on a rank's ``.new`` file,
or a hang), and a killed holder leaves no stale lock."""
import os
import signal
import subprocess
import sys
import textwrap
from pathlib import Path

import numpy as np
import pytest

from torchtree import MCMC, Data, SMCSampler
from torchtree.io.lock import CheckpointInUse, lock_path, run_lock

sys.path.insert(0, str(Path(__file__).parent / "_dist_workers"))
from thread_backend import run_threads  # noqa: E402

pytestmark = pytest.mark.skipif(sys.platform == "win32", reason="the lock is flock, POSIX only")


def _data():
    rng = np.random.default_rng(0)
    X = rng.uniform(size=(40, 2))
    return Data(X, (X[:, 0] > 0.5).astype(int), task="classification")


@pytest.fixture
def holder(tmp_path):
    """Another process holding ``run_lock`` on a path until killed."""
    procs = []

    def start(path):
        code = textwrap.dedent(f"""
            import sys, time
            sys.path.insert(0, {str(Path(__file__).parents[1])!r})
            from torchtree.io.lock import run_lock
            with run_lock({str(path)!r}):
                print("locked", flush=True)
                time.sleep(120)
        """)
        p = subprocess.Popen([sys.executable, "-c", code], stdout=subprocess.PIPE, text=True)
        procs.append(p)
        assert p.stdout.readline().strip() == "locked"
        return p

    yield start
    for p in procs:
        p.kill()
        p.wait()


def test_a_second_run_on_a_held_checkpoint_refuses_before_writing(tmp_path, holder):
    path = tmp_path / "run.ckpt"
    p = holder(path)
    with pytest.raises(CheckpointInUse, match=rf"run\.ckpt is in use by another run \(process {p.pid} on host "):
        MCMC(n_chains=2, n_samples=5, n_warmup=5, checkpoint=str(path)).run(_data(), seed=0)
    assert not path.exists()  # it refused before its first save
    assert os.path.exists(lock_path(str(path)))  # the holder's lock file is left to the holder


def test_a_killed_holder_leaves_no_stale_lock(tmp_path, holder):
    path = tmp_path / "run.ckpt"
    p = holder(path)
    os.kill(p.pid, signal.SIGKILL)
    p.wait()
    post = SMCSampler(n_particles=8, n_iterations=2, checkpoint=str(path)).run(_data(), seed=0)
    assert post is not None and path.exists()
    assert not os.path.exists(lock_path(str(path)))  # a finished run removes its lock file


@pytest.mark.filterwarnings("ignore::UserWarning")
def test_runs_one_after_another_resume_and_leave_no_lock_file(tmp_path):
    path = str(tmp_path / "run.ckpt")
    a = MCMC(n_chains=2, n_samples=5, n_warmup=5, checkpoint=path).run(_data(), seed=0)
    b = MCMC(n_chains=2, n_samples=5, n_warmup=5, checkpoint=path).run(_data(), seed=0)  # resumes the finished run
    assert np.array_equal(np.asarray(a.info["trace"]["log_posterior"]), np.asarray(b.info["trace"]["log_posterior"]))
    assert sorted(os.listdir(tmp_path)) == ["run.ckpt"]


def test_the_lock_is_released_when_the_run_raises(tmp_path):
    path = str(tmp_path / "run.ckpt")

    class Boom(SMCSampler):
        def step(self, state, ctx):
            raise RuntimeError("boom")

    with pytest.raises(RuntimeError, match="boom"):
        Boom(n_particles=8, n_iterations=2, checkpoint=path).run(_data(), seed=0)
    with run_lock(path):  # would raise CheckpointInUse had the failed run kept it
        pass


def test_a_missing_directory_is_said_at_the_start(tmp_path):
    path = tmp_path / "no" / "such" / "run.ckpt"
    with pytest.raises(FileNotFoundError, match="directory .* does not exist"):
        SMCSampler(n_particles=8, n_iterations=2, checkpoint=str(path)).run(_data(), seed=0)


def test_the_lock_is_exclusive_within_one_process_too(tmp_path):
    path = str(tmp_path / "run.ckpt")
    with run_lock(path):
        with pytest.raises(CheckpointInUse, match="in use by another run in this process"):  # not "stop process N"
            with run_lock(path):
                pass
    with run_lock(path):  # released
        pass
    with run_lock(None):  # no path: no lock, no file
        pass
    assert os.listdir(tmp_path) == []


def test_on_several_ranks_rank_zeros_refusal_stops_every_rank(tmp_path, holder):
    path = tmp_path / "run.ckpt"
    holder(path)
    data = _data()

    def rank(be):
        try:
            MCMC(n_chains=2, n_samples=5, n_warmup=5, checkpoint=str(path), backend=be).run(data, seed=0)
        except Exception as exc:  # noqa: BLE001 - each rank's outcome is the test's subject
            return exc
        return None

    got = run_threads(2, rank, timeout=20)  # a rank left waiting would raise the backend's timeout instead
    assert isinstance(got[0], CheckpointInUse), got[0]
    assert isinstance(got[1], ValueError) and "rank 0 refused the run before it started (CheckpointInUse" in str(got[1])
    assert not any(n.startswith("run.ckpt.rank") for n in os.listdir(tmp_path))


@pytest.fixture
def read_only_dir(monkeypatch):
    """The checkpoint's directory refuses new files as a read-only mount does (``EROFS`` on the lock
    file; the tests run as root, whom ``chmod`` does not stop)."""
    import errno

    import torchtree.io.lock as lock_module

    real_open = os.open

    def no_new_files(name, flags, *args):
        if str(name).endswith(".lock"):
            raise OSError(errno.EROFS, "Read-only file system", str(name))
        return real_open(name, flags, *args)

    def refuse():
        monkeypatch.setattr(lock_module.os, "open", no_new_files)

    return refuse


def test_a_finished_checkpoint_in_a_read_only_directory_is_read_back(tmp_path, read_only_dir):
    path = tmp_path / "run.ckpt"
    a = MCMC(n_chains=2, n_samples=5, n_warmup=5, checkpoint=str(path)).run(_data(), seed=0)
    before = path.read_bytes()
    read_only_dir()
    b = MCMC(n_chains=2, n_samples=5, n_warmup=5, checkpoint=str(path)).run(_data(), seed=0)
    assert np.array_equal(np.asarray(a.info["trace"]["log_posterior"]), np.asarray(b.info["trace"]["log_posterior"]))
    assert np.array_equal(a.predict_proba(_data().X), b.predict_proba(_data().X))
    assert path.read_bytes() == before and sorted(os.listdir(tmp_path)) == ["run.ckpt"]


def test_a_read_only_checkpoint_that_would_be_written_is_refused_before_any_step(tmp_path, read_only_dir):
    path = tmp_path / "run.ckpt"
    MCMC(n_chains=2, n_samples=5, n_warmup=5, checkpoint=str(path)).run(_data(), seed=0)
    before = path.read_bytes()
    read_only_dir()
    # extending the finished run (more samples) would write the checkpoint
    with pytest.raises(PermissionError, match=r"run\.ckpt: its directory cannot be written, and the run it holds "
                                              r"is not finished with these settings"):
        MCMC(n_chains=2, n_samples=9, n_warmup=5, checkpoint=str(path)).run(_data(), seed=0)
    assert path.read_bytes() == before
    # no checkpoint there at all: refused at the start, as before
    with pytest.raises(PermissionError, match=r"other\.ckpt: cannot write in .*Read-only file system"):
        MCMC(n_chains=2, n_samples=5, n_warmup=5, checkpoint=str(tmp_path / "other.ckpt")).run(_data(), seed=0)
