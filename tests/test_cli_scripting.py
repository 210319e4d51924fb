"""The command line as a script uses it (a QA pass): labels and numbers written back exactly as read,
outputs that would destroy an input or cannot be written refused before any work, warnings that ``-q``
does not hide, and input from a pipe."""
from __future__ import annotations

import csv
import errno
import io
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from torchtree.cli import load_posterior, main

ROOT = Path(__file__).resolve().parents[1]
FIT = ["--n-particles", "30", "--n-islands", "1", "--hyper", "fixed", "-q"]


def _write(path, header, rows, sep=","):
    path.write_text(header + "\n" + "\n".join(sep.join(map(str, r)) for r in rows) + "\n")
    return str(path)


def _three_classes(labels, n=60, seed=0):
    """Rows of two features whose first one separates three classes, labelled ``labels``."""
    rng = np.random.default_rng(seed)
    x = rng.uniform(0, 3, size=n).round(3)
    z = rng.normal(size=n).round(3)
    return [(a, b, labels[min(int(a), 2)]) for a, b in zip(x, z)]


@pytest.mark.parametrize("labels", [("007", "010", "1e3"), ("1.0", "2.0", "3.0")])
def test_class_labels_are_written_as_the_file_wrote_them(tmp_path, capsys, labels):
    """Labels that read as integers were written back as the integers (007 -> 7, 1e3 -> 1000, 1.0 -> 1); the task
    is still decided by their values (integers: classification) and the classes keep their numeric order."""
    path = _write(tmp_path / "codes.csv", "x,z,code", _three_classes(labels))
    model = str(tmp_path / "codes.pt")
    assert main(["fit", path, *FIT, "--out", model]) == 0
    assert f"(classification, 3 classes: {', '.join(labels)})" in capsys.readouterr().out
    assert main(["predict", model, path, "--proba"]) == 0
    rows = list(csv.reader(io.StringIO(capsys.readouterr().out)))
    assert rows[0] == ["prediction"] + [f"p_{c}" for c in labels]
    assert {r[0] for r in rows[1:]} <= set(labels) and len({r[0] for r in rows[1:]}) == 3
    assert main(["predict", model, path]) == 0
    assert {r[0] for r in list(csv.reader(io.StringIO(capsys.readouterr().out)))[1:]} == set(labels)
    assert main(["summary", model]) == 0
    text = capsys.readouterr().out
    assert f"3 classes ({', '.join(labels)})" in text and f": {labels[0]} (p=" in text


def test_predictions_are_written_at_full_precision(tmp_path, capsys):
    """Means, intervals and probabilities read back to the numbers the posterior gives (they were cut to six
    significant digits: 1.6818e+06 for 1681795.24)."""
    rng = np.random.default_rng(1)
    x = rng.uniform(size=80).round(4)
    y = (1.2e6 + 9e5 * x + rng.normal(scale=1e4, size=80)).round(2)
    path = _write(tmp_path / "big.csv", "x,y", zip(x, y))
    model = str(tmp_path / "big.pt")
    assert main(["fit", path, *FIT, "--out", model]) == 0
    capsys.readouterr()
    assert main(["predict", model, path, "--out", str(tmp_path / "p.csv"), "-q"]) == 0
    got = np.loadtxt(tmp_path / "p.csv", delimiter=",", skiprows=1)
    post = load_posterior(model)
    X = x.reshape(-1, 1)
    assert np.array_equal(got[:, 0], post.predict(X))
    assert np.array_equal(got[:, 1:], post.predict_interval(X, level=0.9))

    cls = _write(tmp_path / "cls.csv", "x,z,label", _three_classes(("a", "b", "c")))
    assert main(["fit", cls, *FIT, "--out", str(tmp_path / "c.pt")]) == 0
    capsys.readouterr()
    assert main(["predict", str(tmp_path / "c.pt"), cls, "--proba", "-q"]) == 0
    rows = list(csv.reader(io.StringIO(capsys.readouterr().out)))[1:]
    Xc = np.loadtxt(cls, delimiter=",", skiprows=1, usecols=(0, 1))
    assert np.array_equal(np.array([[float(v) for v in r[1:]] for r in rows]), load_posterior(str(tmp_path / "c.pt")).predict_proba(Xc))


@pytest.fixture
def iris_like(tmp_path, capsys):
    path = _write(tmp_path / "train.csv", "x,z,label", _three_classes(("a", "b", "c")))
    model = str(tmp_path / "m.pt")
    assert main(["fit", path, *FIT, "--out", model]) == 0
    capsys.readouterr()
    return path, model


def test_report_warns_when_it_takes_columns_by_position_as_predict_does(tmp_path, capsys, iris_like):
    _, model = iris_like
    other = _write(tmp_path / "other.csv", "p,q,label", _three_classes(("a", "b", "c"), n=20, seed=3))
    assert main(["report", model, "--plots", str(tmp_path / "plots"), "--data", other, "-q"]) == 0
    err = capsys.readouterr().err
    assert "torchtree report: warning: none of " in err and "(p, q) is named as a training feature (x, z)" in err


@pytest.mark.parametrize("which", ["data", "test", "data-by-link"])
def test_fit_refuses_an_out_that_is_its_input(tmp_path, capsys, which):
    train = _write(tmp_path / "train.csv", "x,z,label", _three_classes(("a", "b", "c")))
    test = _write(tmp_path / "test.csv", "x,z,label", _three_classes(("a", "b", "c"), n=20, seed=5))
    before = {p: Path(p).read_bytes() for p in (train, test)}
    out = {"data": train, "test": test, "data-by-link": str(tmp_path / "link.csv")}[which]
    if which == "data-by-link":
        os.symlink(train, out)
    assert main(["fit", train, "--test", test, *FIT, "--out", out]) == 2
    err = capsys.readouterr().err
    assert f"--out {out} is the {'--test file' if which == 'test' else 'training data'}" in err
    assert {p: Path(p).read_bytes() for p in (train, test)} == before


@pytest.fixture
def read_only(monkeypatch, tmp_path):
    """``tmp_path/ro`` refuses new files and directories as a read-only mount does (EROFS; the tests run as
    root, whom chmod does not stop)."""
    import builtins

    ro = tmp_path / "ro"
    ro.mkdir()
    inside = lambda name: os.path.abspath(os.fspath(name)).startswith(str(ro) + os.sep)  # noqa: E731
    real_open, real_mkdir, real_builtin_open = os.open, os.mkdir, builtins.open

    def os_open(name, flags, *a, **k):
        if inside(name) and flags & (os.O_WRONLY | os.O_RDWR | os.O_CREAT):
            raise OSError(errno.EROFS, "Read-only file system", str(name))
        return real_open(name, flags, *a, **k)

    def mkdir(name, *a, **k):
        if inside(name):
            raise OSError(errno.EROFS, "Read-only file system", str(name))
        return real_mkdir(name, *a, **k)

    def builtin_open(name, mode="r", *a, **k):
        if isinstance(name, (str, os.PathLike)) and inside(name) and any(c in mode for c in "wax+"):
            raise OSError(errno.EROFS, "Read-only file system", str(name))
        return real_builtin_open(name, mode, *a, **k)

    monkeypatch.setattr(os, "open", os_open)
    monkeypatch.setattr(os, "mkdir", mkdir)
    monkeypatch.setattr(builtins, "open", builtin_open)
    return ro


def test_unwritable_outputs_are_refused_before_the_work(tmp_path, capsys, iris_like, read_only, monkeypatch):
    data, model = iris_like
    import torchtree.cli.fit as fit_module

    def no_work(*a, **k):
        raise AssertionError("the posterior was loaded before the output was checked")

    monkeypatch.setattr(fit_module, "load_posterior", no_work)
    assert main(["predict", model, data, "--out", str(read_only / "p.csv")]) == 2
    err = capsys.readouterr().err
    assert f"--out {read_only / 'p.csv'}: cannot write in directory {read_only} (Read-only file system)" in err
    monkeypatch.undo()


def test_report_plots_in_an_unwritable_place_are_refused(tmp_path, capsys, iris_like, read_only):
    _, model = iris_like
    assert main(["report", model, "--plots", str(read_only / "plots"), "-q"]) == 2
    assert f"--plots {read_only / 'plots'}: cannot write in directory {read_only} (Read-only file system)" in \
        capsys.readouterr().err


def test_bench_out_in_an_unwritable_place_is_refused_before_the_run(tmp_path, capsys, read_only, monkeypatch):
    bench = tmp_path / "benches"
    bench.mkdir()
    ran = tmp_path / "ran"
    (bench / "bench_tiny.py").write_text(
        '"""A tiny benchmark."""\nimport argparse, pathlib\np = argparse.ArgumentParser()\np.add_argument("--out")\n'
        f'p.parse_args()\npathlib.Path({str(ran)!r}).write_text("x")\n')
    monkeypatch.setenv("TORCHTREE_BENCHMARKS", str(bench))
    assert main(["bench", "tiny", "--out", str(read_only / "b.json")]) == 2
    assert "cannot write in directory" in capsys.readouterr().err and not ran.exists()


def test_an_out_ending_in_a_slash_is_refused_before_the_work(tmp_path, capsys, iris_like, monkeypatch):
    data, model = iris_like
    monkeypatch.chdir(tmp_path)
    assert main(["fit", data, *FIT, "--out", "nosuchdir/"]) == 2
    assert "--out nosuchdir/: directory nosuchdir does not exist" in capsys.readouterr().err
    assert not [p for p in os.listdir(tmp_path) if p.startswith("torchtree-posterior-")]
    assert main(["predict", model, data, "--out", "nosuchdir/"]) == 2
    err = capsys.readouterr().err
    assert "--out nosuchdir/: directory nosuchdir does not exist" in err and ".tmp-" not in err
    os.mkdir("there")
    assert main(["predict", model, data, "--out", "there/"]) == 2
    assert "--out there/: is a directory; give a file name" in capsys.readouterr().err


def test_the_decimal_comma_notice_is_shown_under_quiet(tmp_path, capsys):
    rng = np.random.default_rng(0)
    x = rng.normal(size=40)
    path = _write(tmp_path / "comma.csv", "x;label", ([f"{a:.3f}".replace(".", ","), "yes" if a > 0 else "no"]
                                                       for a in x), sep=";")
    assert main(["fit", path, *FIT, "--out", str(tmp_path / "p.pt")]) == 0
    assert "convert the file first" in capsys.readouterr().err


def test_predict_names_the_bad_cell_not_a_missing_value_token(tmp_path, capsys, iris_like):
    _, model = iris_like
    bad = _write(tmp_path / "bad.csv", "x,z", [("n/a", 0.1), ("abc", 0.2), ("NA", 0.3)])
    assert main(["predict", model, bad]) == 2
    err = capsys.readouterr().err
    assert "line 3: column 'x': 'abc' is not a number" in err and "'n/a'" not in err


def test_predict_reads_a_pipe_and_standard_input(tmp_path, capsys, iris_like, monkeypatch):
    data, model = iris_like
    assert main(["predict", model, data]) == 0
    expected = capsys.readouterr().out
    env = {**os.environ, "PYTHONPATH": str(ROOT) + os.pathsep + os.environ.get("PYTHONPATH", "")}
    r = subprocess.run([sys.executable, "-m", "torchtree", "predict", model, "/dev/stdin"], input=Path(data).read_bytes(),
                       capture_output=True, env=env, timeout=300)
    assert r.returncode == 0, r.stderr.decode()
    assert r.stdout.decode() == expected
    monkeypatch.setattr(sys, "stdin", io.TextIOWrapper(io.BytesIO(Path(data).read_bytes())))
    assert main(["predict", model, "-", "--out", "-"]) == 0
    assert capsys.readouterr().out == expected


@pytest.fixture
def benches(tmp_path, monkeypatch):
    """A benchmarks folder of two tiny scripts (one with --out, one without) that record their arguments."""
    d = tmp_path / "benches"
    d.mkdir()
    for name, out in (("writer", True), ("printer", False)):
        (d / f"bench_{name}.py").write_text(
            f'"""The {name}."""\nimport argparse, json, pathlib, sys\np = argparse.ArgumentParser()\n'
            + ('p.add_argument("--out")\n' if out else "")
            + f'p.add_argument("--smoke", action="store_true")\np.parse_args()\n'
              f'pathlib.Path({str(tmp_path / name)!r}).write_text(json.dumps(sys.argv[1:]))\n')
    monkeypatch.setenv("TORCHTREE_BENCHMARKS", str(d))
    return tmp_path


def test_bench_out_is_refused_before_running_a_script_that_takes_none(benches, capsys):
    for argv in (["bench", "printer", "--out", str(benches / "b.json")],
                 ["bench", "printer", "--smoke", "--out", str(benches / "b.json")]):
        assert main(argv) == 2
        err = capsys.readouterr().err
        assert "benchmark 'printer' takes no --out; those that write their results with --out FILE.json: writer" in err
        assert not (benches / "printer").exists()
    assert main(["bench", "writer", "--smoke", "--out", str(benches / "b.json")]) == 0
    assert (benches / "writer").read_text() == f'["--smoke", "--out", "{benches / "b.json"}"]'


def test_bench_quiet_is_torchtrees_option_not_the_scripts(benches, capsys):
    assert main(["bench", "printer", "--smoke", "-q"]) == 0
    assert (benches / "printer").read_text() == '["--smoke"]'
    assert capsys.readouterr().err == ""


def test_bench_without_a_name_lists_on_standard_error(benches, capsys):
    assert main(["bench"]) == 2
    out, err = capsys.readouterr()
    assert out == "" and "printer" in err and "usage: torchtree bench NAME" in err


def test_sigterm_during_a_checkpointed_fit_stops_as_ctrl_c_does(tmp_path):
    """SIGTERM (cron, systemd, Kubernetes) killed the process in silence and left the checkpoint's lock file;
    now it stops the run as Ctrl-C does: the write in progress completes, the lock is released, a message
    names the checkpoint, exit status 143. The signal is sent from inside the checkpoint's torch.save."""
    import textwrap

    data = _write(tmp_path / "d.csv", "x,z,label", _three_classes(("a", "b", "c")))
    ck = str(tmp_path / "run.ckpt")
    code = textwrap.dedent(f"""
        import os, signal, sys, torch
        from torchtree.cli import main
        real, writes = torch.save, []

        class Terminating:
            def __init__(self, fh):
                self.fh = fh
            def write(self, b):
                writes.append(1)
                if len(writes) == 3:
                    os.kill(os.getpid(), signal.SIGTERM)
                return self.fh.write(b)
            def flush(self):
                self.fh.flush()

        torch.save = lambda obj, f, *a, **k: real(obj, Terminating(f) if hasattr(f, "write") else f, *a, **k)
        sys.exit(main(["fit", {data!r}, "--method", "mcmc", "--n-chains", "1", "--n-samples", "20", "--n-warmup", "5",
                       "--checkpoint", {ck!r}, "--quiet", "--out", {str(tmp_path / "p.pt")!r}]))
    """)
    env = {**os.environ, "PYTHONPATH": str(ROOT) + os.pathsep + os.environ.get("PYTHONPATH", ""),
           "TORCHTREE_CHECKPOINT_MIN_SECONDS": "0"}
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env, timeout=300)
    assert r.returncode == 143, (r.returncode, r.stderr[-2000:])
    assert f"torchtree: terminated; {ck} holds the run so far: the same command resumes it" in r.stderr
    assert "Traceback" not in r.stderr
    assert not os.path.exists(ck + ".lock") and not (tmp_path / "p.pt").exists()
    from torchtree.io.checkpoint import load_checkpoint

    assert load_checkpoint(ck)  # the write the signal landed in was completed


def test_the_cli_puts_back_the_sigterm_handler_it_found(tmp_path, capsys):
    import signal

    before = signal.getsignal(signal.SIGTERM)
    assert main(["summary", str(tmp_path / "none.pt")]) == 2
    assert signal.getsignal(signal.SIGTERM) is before
