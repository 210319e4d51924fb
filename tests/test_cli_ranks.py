"""``torchtree fit`` launched by torchrun: one job over the ranks, reported and saved by rank 0."""
from __future__ import annotations

import io
import os
import re
import sys
import time
from contextlib import redirect_stdout
from pathlib import Path

import pytest

from torchtree.cli import main
from torchtree.distributed import launcher, launcher_backend

from _launch import free_port, torchrun

DATA = str(Path(__file__).resolve().parents[1] / "data" / "iris.csv.gz")


def test_launcher_is_read_from_the_environment():
    assert launcher({}) == "none"
    assert launcher({"RANK": "0", "WORLD_SIZE": "2", "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": "1"}) == "torchrun"
    assert launcher({"RANK": "0"}) == "none"  # RANK alone (a scheduler's variable) is no torch launch
    assert launcher({"OMPI_COMM_WORLD_RANK": "1"}) == "mpi" and launcher({"PMI_RANK": "0"}) == "mpi"
    if launcher() == "none":  # this test process was started by no launcher: "auto" is one local rank
        backend, name = launcher_backend("auto")
        assert name == "local" and backend.world_size == 1


def test_a_named_backend_without_its_launcher_is_a_user_error(tmp_path, capsys):
    env = {k: os.environ.pop(k) for k in ("RANK", "WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT") if k in os.environ}
    try:
        code = main(["fit", DATA, "--backend", "gloo", "--out", str(tmp_path / "p.pt"), "-q"])
    finally:
        os.environ.update(env)
    assert code == 2
    assert "--backend gloo: cannot initialise torch.distributed" in capsys.readouterr().err


def test_timeout_reaches_the_backend_and_must_be_positive(tmp_path, monkeypatch, capsys):
    """--timeout bounds the rendezvous and every collective: it is the backend's timeout."""
    import torchtree.distributed as dist

    seen = {}

    def spy(name="auto", device=None, **kw):
        seen.update(kw)
        return launcher_backend("local", device=device, **kw)

    monkeypatch.setattr(dist, "launcher_backend", spy)
    assert main(["fit", DATA, "--timeout", "12.5", "--n-particles", "20", "--hyper", "fixed",
                 "--out", str(tmp_path / "p.pt"), "-q"]) == 0
    assert seen == {"timeout": 12.5}
    for bad in ("0", "-3", "inf", "soon"):
        with pytest.raises(SystemExit) as exc:
            main(["fit", DATA, "--timeout", bad, "--out", str(tmp_path / "p.pt"), "-q"])
        assert exc.value.code == 2 and "--timeout: must be a number of seconds > 0" in capsys.readouterr().err


def _torchrun(args, tmp_path):
    return torchrun(["-m", "torchtree", *args], tmp_path)


@pytest.mark.slow
@pytest.mark.distributed
def test_fit_under_torchrun_is_one_job_over_the_ranks(tmp_path):
    """Two ranks run one top-down SMC job (half the particles each): the report is printed once, by
    rank 0, with the ranks named; the posterior is saved once; and the result is the one-process
    run's (the top-down filter's draws do not depend on the number of ranks)."""
    args = ["fit", DATA, "--method", "smc", "--n-particles", "64", "--seed", "3", "-q"]
    proc = _torchrun(args + ["--out", str(tmp_path / "ranks.pt")], tmp_path)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    report = proc.stdout.splitlines()
    assert sum(line.startswith("log evidence") for line in report) == 1, proc.stdout
    assert any(line.startswith("method") and "2 ranks (gloo)" in line for line in report), proc.stdout
    assert sorted(os.listdir(tmp_path)) == ["ranks.pt"]
    out = io.StringIO()
    with redirect_stdout(out):
        assert main(args + ["--out", str(tmp_path / "one.pt")]) == 0
    one = {line.split()[0] + line.split()[1]: line for line in out.getvalue().splitlines() if line.startswith(("log evidence", "test"))}
    got = {line.split()[0] + line.split()[1]: line for line in report if line.startswith(("log evidence", "test"))}
    assert got == one and len(one) == 3


@pytest.mark.slow
@pytest.mark.distributed
def test_a_method_that_runs_in_one_process_is_refused_under_torchrun(tmp_path):
    proc = _torchrun(["fit", DATA, "--method", "dcc", "--out", str(tmp_path / "p.pt"), "-q"], tmp_path)
    assert proc.returncode != 0
    assert "--method dcc (DCC) runs in one process, not across the 2 ranks" in proc.stderr
    assert not (tmp_path / "p.pt").exists()


def _no_torchtree_traceback(said: str) -> bool:
    """Whether no traceback through torchtree's code was printed (torchrun prints its own on a failed job). The
    package's folders are compared, not the word: a checkout named torchtree holds the venv with torch's files."""
    import torchtree
    import torchtree.distributed
    import torchtree.kernels

    own = [Path(m.__file__).resolve().parent for m in (torchtree, torchtree.distributed, torchtree.kernels)]
    frames = [Path(f).resolve() for f in re.findall(r'File "([^"]+)"', said)]
    return not any(d in f.parents for f in frames for d in own)


@pytest.mark.slow
@pytest.mark.distributed
def test_a_rank_failing_mid_run_ends_the_job_with_its_error(tmp_path):
    """Rank 1's node table outgrows its memory limit mid-run: it prints its error and leaves at once, and rank 0's
    exchange fails then. The failing rank's barrier in closing the backend held it (and its message) until the
    timeout, then printed tracebacks ending in a CollectiveTimeout."""
    wrapper = tmp_path / "rank1_limited.sh"
    wrapper.write_text(f'#!/bin/sh\n[ "$RANK" = 1 ] && export TORCHTREE_MEMORY_LIMIT=40K\nexec "{sys.executable}" "$@"\n')
    wrapper.chmod(0o755)
    pima = str(Path(DATA).with_name("pima_diabetes.csv.gz"))
    proc = torchrun(["--no-python", str(wrapper), "-m", "torchtree", "fit", pima, "--method", "smc", "--n-particles",
                     "64", "--seed", "1", "--hyper", "fixed", "--out", str(tmp_path / "p.pt"), "--timeout", "30"],
                    tmp_path, timeout=120)
    said = proc.stdout + proc.stderr
    assert proc.returncode != 0
    assert "torchtree: error: out of memory: the node-data pool would need" in said, said[-3000:]
    assert "did not complete within" not in said and _no_torchtree_traceback(said), said[-3000:]
    assert not (tmp_path / "p.pt").exists()


@pytest.mark.slow
@pytest.mark.distributed
@pytest.mark.parametrize("method", [["--method", "smc", "--n-particles", "256", "--hyper", "fixed"],
                                    ["--method", "smc-moves", "--n-particles", "64", "--n-iterations", "100000",
                                     "--hyper", "fixed"]])
def test_ctrl_c_stops_every_rank_with_its_checkpoint_kept(tmp_path, method):
    """Ctrl-C on a 2-rank run (torchrun passes SIGINT to every rank) after its first checkpoint: each rank says
    ``torchtree: interrupted`` and leaves, and the checkpoint is complete. The barrier in closing the backend met
    the other rank inside another exchange: tracebacks, and top-down SMC's ranks killed 30 s later by torchrun."""
    import signal
    import subprocess

    exe = Path(sys.executable).parent / "torchrun"
    if not exe.exists():
        pytest.skip("torchrun not found next to the interpreter")
    magic = str(Path(DATA).with_name("magic04.csv.gz"))
    ck = tmp_path / "ck.pt"
    proc = subprocess.Popen([str(exe), "--nproc-per-node", "2", "--master-port", str(free_port()), "-m", "torchtree",
                             "fit", magic, *method, "--seed", "3", "-q", "--out", str(tmp_path / "p.pt"),
                             "--checkpoint", str(ck), "--timeout", "60"],
                            cwd=tmp_path, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                            env=dict(os.environ, OMP_NUM_THREADS="1", TORCHTREE_CHECKPOINT_MIN_SECONDS="0"))
    try:
        deadline = time.monotonic() + 150
        while not (tmp_path / "ck.pt.manifest.json").exists() and proc.poll() is None and time.monotonic() < deadline:
            time.sleep(0.05)
        assert proc.poll() is None, "the run ended before its first checkpoint"
        proc.send_signal(signal.SIGINT)
        out, err = proc.communicate(timeout=90)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.communicate()
    said = out + err
    assert said.count(f"torchtree: interrupted; {ck} holds the run so far") == 2, said[-3000:]
    assert _no_torchtree_traceback(said) and "forcefully exiting" not in said, said[-3000:]
    assert not (tmp_path / "p.pt").exists()
    # a .prev stays only where the stop fell between the rank files and the manifest (the manifest needs it)
    files = {p.name for p in tmp_path.iterdir() if p.name.startswith("ck.pt")}
    assert {"ck.pt.manifest.json", "ck.pt.rank0", "ck.pt.rank1"} <= files <= {
        "ck.pt.manifest.json", "ck.pt.rank0", "ck.pt.rank1", "ck.pt.rank0.prev", "ck.pt.rank1.prev"}, files
