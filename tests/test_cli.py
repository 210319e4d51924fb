"""Tests of the ``torchtree`` command line and of CSV reading (torchtree.cli, torchtree.io.csv).

End to end on tiny generated CSV files in tmp_path, in process (``main(argv)``)
except for one ``python -m torchtree --help`` subprocess. Seeded; every fit uses a
few particles so that the file runs in seconds.
"""
from __future__ import annotations

import csv
import gzip
import json
import os
import re
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from torchtree.cli import load_posterior, main, sampler_options
from torchtree.io.csv import infer_task, parse_target, read_csv
from torchtree.io.features import read_features

ROOT = Path(__file__).resolve().parents[1]
SMALL = ["--n-particles", "10", "--n-islands", "1", "--quiet"]


# ----------------------------------------------------------------------------- data
def _write(path: Path, header, rows) -> Path:
    with open(path, "w", newline="") as fh:
        w = csv.writer(fh)
        w.writerow(header)
        w.writerows(rows)
    return path


def _xy(n=90, seed=0):
    rng = np.random.default_rng(seed)
    X = np.round(rng.uniform(size=(n, 3)), 4)
    return X, rng


@pytest.fixture(scope="module")
def files(tmp_path_factory):
    d = tmp_path_factory.mktemp("cli")
    X, rng = _xy()
    lab = np.where(X[:, 0] > 0.5, np.where(X[:, 1] > 0.4, "cat", "dog"), "bird")
    cls = _write(d / "animals.csv", ["a", "b", "c", "animal"], [[*x, l] for x, l in zip(X, lab)])
    yr = np.round(np.sin(4 * X[:, 0]) + 0.1 * rng.normal(size=len(X)), 4)
    reg = _write(d / "reg.csv", ["a", "b", "c", "y"], [[*x, v] for x, v in zip(X, yr)])
    return {"dir": d, "cls": cls, "reg": reg, "X": X, "labels": lab, "yr": yr}


@pytest.fixture(scope="module")
def fitted(files):
    """Fit once per module: a classification and a regression posterior."""
    d = files["dir"]
    out_c, out_r = d / "cls.pt", d / "reg.pt"
    assert main(["fit", str(files["cls"]), "--out", str(out_c), "--seed", "1", *SMALL]) == 0
    assert main(["fit", str(files["reg"]), "--out", str(out_r), "--seed", "1", *SMALL]) == 0
    return {"cls": out_c, "reg": out_r}


def _lines(text: str):
    return [l for l in text.splitlines() if l.strip()]


# ----------------------------------------------------------------------------- fit
def test_fit_classification_string_labels(files, tmp_path, capsys):
    out = tmp_path / "p.pt"
    rc = main(["fit", str(files["cls"]), "--out", str(out), *SMALL, "--n-islands", "2"])
    assert rc == 0
    text = capsys.readouterr().out
    assert "classification, 3 classes: bird, cat, dog" in text
    for key in ("time", "log evidence", "ESS", "test accuracy", "test log p(y|x)", "trees", "saved"):
        assert any(l.startswith(key) for l in text.splitlines()), (key, text)
    acc = float(next(l for l in text.splitlines() if l.startswith("test accuracy")).split()[-1])
    assert 0.0 <= acc <= 1.0
    post = load_posterior(str(out))
    assert post.task == "classification"
    assert [str(c) for c in post.classes_] == ["bird", "cat", "dog"]
    schema = json.loads(post.info["cli"])
    assert schema["features"] == ["a", "b", "c"] and schema["target"] == "animal"
    assert schema["options"] == {"n_particles": 10, "n_islands": 2}


def test_fit_regression_inferred(files, fitted, capsys):
    post = load_posterior(str(fitted["reg"]))
    assert post.task == "regression"
    out = files["dir"] / "reg2.pt"
    assert main(["fit", str(files["reg"]), "--out", str(out), *SMALL, "--test-size", "0.25"]) == 0
    text = capsys.readouterr().out
    assert "(regression)" in text
    assert any(l.startswith("test RMSE") for l in text.splitlines())
    assert any(l.startswith("90% interval") and "covers" in l for l in text.splitlines())


def test_fit_test_file_and_named_target(files, tmp_path, capsys):
    # Target in the middle column, found by name; a separate test file.
    X, lab = files["X"], files["labels"]
    tr = _write(tmp_path / "tr.csv", ["a", "animal", "b", "c"], [[x[0], l, x[1], x[2]] for x, l in zip(X[:60], lab[:60])])
    te = _write(tmp_path / "te.csv", ["a", "animal", "b", "c"], [[x[0], l, x[1], x[2]] for x, l in zip(X[60:], lab[60:])])
    out = tmp_path / "p.pt"
    assert main(["fit", str(tr), "--target", "animal", "--test", str(te), "--out", str(out), *SMALL]) == 0
    text = capsys.readouterr().out
    assert "train 60" in text and "test 30" in text
    assert json.loads(load_posterior(str(out)).info["cli"])["features"] == ["a", "b", "c"]


def test_fit_integer_target_with_task_regression(tmp_path, capsys):
    X, rng = _xy(60)
    path = _write(tmp_path / "int.csv", ["a", "b", "c", "count"], [[*x, int(5 * x[0])] for x in X])
    assert main(["fit", str(path), "--task", "regression", "--out", str(tmp_path / "p.pt"), *SMALL]) == 0
    assert "(regression)" in capsys.readouterr().out
    assert main(["fit", str(path), "--out", str(tmp_path / "q.pt"), *SMALL]) == 0
    assert "(classification, " in capsys.readouterr().out


def test_fit_logdir_writes_tensorboard_run(files, tmp_path, capsys):
    logdir = tmp_path / "tb"
    assert main(["fit", str(files["cls"]), "--logdir", str(logdir), "--out", str(tmp_path / "p.pt"), *SMALL]) == 0
    assert any(name.startswith("events.out.tfevents") for name in os.listdir(logdir))
    assert "TensorBoard run in" in capsys.readouterr().out


def test_generated_options_from_signature(files, tmp_path, monkeypatch, capsys):
    """A newly registered sampler gets its options with no change to the CLI (``verbose`` is the
    estimators' own parameter, so the boolean option here is ``loud``)."""
    from torchtree.estimators import METHODS
    from torchtree.samplers.topdown import TopDownSMC

    seen = {}

    class Recording(TopDownSMC):
        """A test sampler.

        Parameters
        ----------
        shrink : float
            How much to shrink.
        """

        def __init__(self, prior=None, likelihood=None, *, n_particles: int = 10, shrink: float = 1.0,
                     loud: bool = False, weights=(0.5, 0.5), mode: str = "a", limit=None, device=None):
            seen.update(n_particles=n_particles, shrink=shrink, loud=loud, weights=weights, mode=mode, limit=limit)
            super().__init__(prior, likelihood, n_particles=n_particles, device=device)

    monkeypatch.setitem(METHODS, "recording", Recording)
    names = [n for n, _ in sampler_options(Recording)]
    assert names == ["n_particles", "shrink", "loud", "weights", "mode", "limit"]
    rc = main(["fit", str(files["cls"]), "--method", "recording", "--shrink", "0.5", "--loud", "--weights", "0.2", "0.8",
               "--mode", "b", "--limit", "7", "--out", str(tmp_path / "p.pt"), "--quiet"])
    assert rc == 0
    assert seen == {"n_particles": 10, "shrink": 0.5, "loud": True, "weights": (0.2, 0.8), "mode": "b", "limit": 7}
    capsys.readouterr()
    with pytest.raises(SystemExit) as exc:
        main(["fit", "--method", "recording", "--help"])
    assert exc.value.code == 0
    sub = capsys.readouterr().out
    assert "sampler options (--method recording: Recording)" in sub
    assert "--shrink X" in sub and "How much to shrink." in sub and "--no-loud" in sub


def test_sampler_default_untouched_when_option_not_given(files, tmp_path, monkeypatch):
    from torchtree.estimators import METHODS
    from torchtree.samplers.topdown import TopDownSMC

    seen = {}

    class Recording(TopDownSMC):
        def __init__(self, prior=None, likelihood=None, *, n_particles: int = 10, shrink: float = 1.0, device=None):
            seen.update(shrink=shrink, device=device)
            super().__init__(prior, likelihood, n_particles=n_particles, device=device)

    monkeypatch.setitem(METHODS, "recording", Recording)
    assert main(["fit", str(files["cls"]), "--method", "recording", "--out", str(tmp_path / "p.pt"), "--quiet", "--device", "cpu"]) == 0
    assert seen == {"shrink": 1.0, "device": "cpu"}


def test_fit_checkpoint_resume_gives_same_posterior(files, tmp_path, capsys):
    """--checkpoint saves the run; a second fit with the same file resumes from the
    final state and saves a posterior with identical predictions."""
    ck = tmp_path / "run.ckpt"
    args = ["fit", str(files["cls"]), "--seed", "3", *SMALL, "--checkpoint", str(ck), "--checkpoint-every", "2"]
    assert main([*args, "--out", str(tmp_path / "a.pt")]) == 0
    assert ck.exists()
    assert main([*args, "--out", str(tmp_path / "b.pt")]) == 0
    a, b = load_posterior(str(tmp_path / "a.pt")), load_posterior(str(tmp_path / "b.pt"))
    np.testing.assert_array_equal(a.predict_proba(files["X"]), b.predict_proba(files["X"]))
    # another seed is another run: its checkpoint is refused with a clear message
    capsys.readouterr()
    bad = ["fit", str(files["cls"]), "--seed", "4", *SMALL, "--checkpoint", str(ck), "--out", str(tmp_path / "c.pt")]
    assert main(bad) == 2
    assert "different run" in capsys.readouterr().err


def test_checkpoint_option_errors(files, tmp_path, monkeypatch, capsys):
    from torchtree.estimators import METHODS

    class NoCheckpoints:
        def __init__(self, prior=None, likelihood=None, *, n_particles: int = 10):
            pass

    monkeypatch.setitem(METHODS, "nockpt", NoCheckpoints)
    rc = main(["fit", str(files["cls"]), "--method", "nockpt", "--checkpoint", str(tmp_path / "x.ckpt"), "--quiet"])
    assert rc == 2 and "cannot checkpoint" in capsys.readouterr().err
    rc = main(["fit", str(files["cls"]), *SMALL, "--checkpoint", str(tmp_path / "no" / "x.ckpt")])
    assert rc == 2 and "does not exist" in capsys.readouterr().err
    rc = main(["fit", str(files["cls"]), *SMALL, "--checkpoint", str(tmp_path / "x.ckpt"), "--checkpoint-every", "0"])
    assert rc == 2 and "--checkpoint-every" in capsys.readouterr().err


# ----------------------------------------------------------------------------- predict
def test_predict_proba_mapped_labels(files, fitted, tmp_path, capsys):
    # With the target column present (ignored by name) and with --out.
    out = tmp_path / "preds.csv"
    assert main(["predict", str(fitted["cls"]), str(files["cls"]), "--proba", "--out", str(out)]) == 0
    err = capsys.readouterr().err
    assert "target column 'animal' ignored" in err and "accuracy" in err
    rows = list(csv.reader(open(out)))
    assert rows[0] == ["prediction", "p_bird", "p_cat", "p_dog"]
    assert len(rows) == 1 + len(files["X"])
    for r in rows[1:]:
        assert r[0] in ("bird", "cat", "dog")
        p = np.array(r[1:], dtype=float)
        assert abs(p.sum() - 1) < 1e-4 and r[0] == ["bird", "cat", "dog"][int(np.argmax(p))]


def test_predict_without_target_column_to_stdout(files, fitted, tmp_path, capsys):
    X = files["X"][:5]
    path = _write(tmp_path / "new.csv", ["a", "b", "c"], X.tolist())
    assert main(["predict", str(fitted["cls"]), str(path)]) == 0
    lines = _lines(capsys.readouterr().out)
    assert lines[0] == "prediction,probability" and len(lines) == 6
    label, prob = lines[1].split(",")
    assert label in ("bird", "cat", "dog") and 0 < float(prob) <= 1


def test_predict_by_column_count_unnamed(files, fitted, tmp_path, capsys):
    # Different column names: the count decides; 4 columns = features + target (last).
    X, lab = files["X"][:4], files["labels"][:4]
    path = _write(tmp_path / "other.csv", ["u", "v", "w", "label"], [[*x, l] for x, l in zip(X, lab)])
    assert main(["predict", str(fitted["cls"]), str(path), "-q"]) == 0
    got = capsys.readouterr()
    assert len(_lines(got.out)) == 5
    # columns taken by position are said, -q or not (they were taken in silence: a QA pass)
    assert re.search(r"warning: none of .*other\.csv's columns \(u, v, w\) is named as a training feature "
                     r"\(.+\): its columns are taken in their order", got.err), got.err


def test_predict_by_name_says_nothing_of_positions(files, fitted, capsys):
    assert main(["predict", str(fitted["cls"]), str(files["cls"])]) == 0
    assert "taken in their order" not in capsys.readouterr().err


def test_predict_regression_interval(files, fitted, capsys):
    assert main(["predict", str(fitted["reg"]), str(files["reg"]), "--level", "0.8"]) == 0
    lines = _lines(capsys.readouterr().out)
    assert lines[0] == "mean,lower_80,upper_80"
    vals = np.array([l.split(",") for l in lines[1:]], dtype=float)
    assert vals.shape == (len(files["X"]), 3)
    assert np.all(vals[:, 1] <= vals[:, 0]) and np.all(vals[:, 0] <= vals[:, 2])
    assert main(["predict", str(fitted["reg"]), str(files["reg"]), "--no-interval"]) == 0
    lines = _lines(capsys.readouterr().out)
    assert lines[0] == "mean"
    np.testing.assert_array_equal(np.array(lines[1:], dtype=float), vals[:, 0])
    assert main(["predict", str(fitted["reg"]), str(files["reg"]), "--level", "0.8", "--kind", "mean"]) == 0
    lines = _lines(capsys.readouterr().out)
    assert lines[0] == "mean,mean_lower_80,mean_upper_80"  # a credible interval of f: inside the predictive one
    band = np.array([l.split(",") for l in lines[1:]], dtype=float)
    np.testing.assert_array_equal(band[:, 0], vals[:, 0])
    assert np.all(vals[:, 1] < band[:, 1]) and np.all(band[:, 2] < vals[:, 2])


def test_predict_wrong_columns_is_a_user_error(fitted, tmp_path, capsys):
    path = _write(tmp_path / "two.csv", ["a", "b"], [[0.1, 0.2]])
    assert main(["predict", str(fitted["cls"]), str(path)]) == 2
    err = capsys.readouterr().err
    assert err.startswith("torchtree: error:") and "only some of the model's feature columns are present: missing 'c'" in err
    path = _write(tmp_path / "other.csv", ["u", "v"], [[0.1, 0.2]])  # none of the names: matched by count
    assert main(["predict", str(fitted["cls"]), str(path)]) == 2
    assert "has 2 columns but the model takes 3 features" in capsys.readouterr().err


def test_posterior_saved_from_python_api(files, tmp_path, capsys):
    """No CLI metadata: features are matched by count and named x0, x1, ..."""
    from torchtree.estimators import BayesianTreeClassifier

    clf = BayesianTreeClassifier(n_particles=10, random_state=0).fit(files["X"], files["labels"])
    path = tmp_path / "api.pt"
    clf.posterior_.save(str(path))
    data = _write(tmp_path / "rows.csv", ["p", "q", "r"], files["X"][:3].tolist())
    assert main(["predict", str(path), str(data), "--proba"]) == 0
    assert _lines(capsys.readouterr().out)[0] == "prediction,p_bird,p_cat,p_dog"
    assert main(["summary", str(path)]) == 0
    out = capsys.readouterr().out
    assert "MAP tree" in out and "x0" in out


# ----------------------------------------------------------------------------- summary
def test_summary_text_and_dot(fitted, capsys):
    assert main(["summary", str(fitted["cls"])]) == 0
    text = capsys.readouterr().out
    assert "classification, 3 classes (bird, cat, dog), 3 features, target 'animal'" in text
    for key in ("sampler", "log evidence", "leaves", "depth", "feature usage", "MAP tree"):
        assert key in text
    assert main(["summary", str(fitted["cls"]), "--dot"]) == 0
    dot = capsys.readouterr().out
    assert dot.startswith("digraph") and dot.rstrip().endswith("}")
    assert main(["summary", str(fitted["cls"]), "--dot", "--tree", "0"]) == 0
    assert capsys.readouterr().out.startswith("digraph")


def test_summary_tree_out_of_range_is_a_user_error(fitted, capsys):
    """It used to end in an IndexError traceback and exit status 1."""
    assert main(["summary", str(fitted["cls"]), "--dot", "--tree", "999"]) == 2
    assert "torchtree: error: --tree 999: tree index 999 out of range" in capsys.readouterr().err


def test_dcc_lists_only_the_model_options_it_uses(files, tmp_path, capsys):
    """DCC builds its own soft-tree priors: the estimators' --prior / --mu0 / ... are not
    its options (they used to be listed, accepted and ignored), and the structure-prior
    and leaf settings it takes by name show DCC's own defaults."""
    with pytest.raises(SystemExit) as exc:
        main(["fit", "--method", "dcc", "--help"])
    assert exc.value.code == 0
    text = capsys.readouterr().out
    assert "model options (prior and leaf likelihood)" not in text
    for flag in ("--prior", "--mu0", "--kappa0", "--a0", "--b0", "--poisson-lambda"):
        assert f"{flag} " not in text, flag
    flat = " ".join(text.split())
    # the help comes from DCCConfig's option(help=...): no raw types ("float, ...") any more
    assert "--alpha-split X Chipman structure prior: split probability alpha at the root (paper: 0.95) (default: 0.95)" in flat
    assert "(default: 1.0)" in flat.split("--beta-split X", 1)[1][:120]
    assert "--alpha X Dirichlet-multinomial total concentration (default: the number of classes" in flat
    assert main(["fit", str(files["reg"]), "--method", "dcc", "--mu0", "100", "--out", str(tmp_path / "p.pt"), "--quiet"]) == 2
    err = capsys.readouterr().err
    assert "--mu0: not an option of torchtree fit --method dcc (DCC)" in err and "--help" in err
    assert "usage:" not in err  # the method's options are named, not the top-level usage
    # smc keeps them
    with pytest.raises(SystemExit):
        main(["fit", "--method", "smc", "--help"])
    text = capsys.readouterr().out
    assert "--mu0 X" in text and "--prior {chipman,poisson}" in text


def test_summary_regression(fitted, capsys):
    assert main(["summary", str(fitted["reg"])]) == 0
    text = capsys.readouterr().out
    assert "regression" in text and "leaf n=" in text and "mean" in text


# ----------------------------------------------------------------------------- errors
def test_malformed_csv_reports_line_numbers(files, tmp_path, capsys):
    src = open(files["cls"]).read().splitlines()
    bad = src[:4] + ["0.1,0.2,cat", "0.1,inf,0.3,dog", "0.2,-inf,0.3,dog"] + src[4:8]
    path = tmp_path / "bad.csv"
    path.write_text("\n".join(bad) + "\n")
    assert main(["fit", str(path), *SMALL]) == 2
    err = capsys.readouterr().err
    assert err.startswith("torchtree: error:")
    assert "3 malformed rows" in err
    assert "line 5: expected 4 fields, got 3" in err
    assert "line 6: column 'b': 'inf' is not a finite number" in err
    assert "line 7: column 'b': '-inf' is not a finite number" in err
    assert "Traceback" not in err


def test_unknown_method_clear_error(files, capsys):
    with pytest.raises(SystemExit) as exc:
        main(["fit", str(files["cls"]), "--method", "nope"])
    assert exc.value.code == 2
    assert "invalid choice: 'nope'" in capsys.readouterr().err


def test_unavailable_method_clear_error(files, monkeypatch, capsys):
    from torchtree.estimators import METHODS

    monkeypatch.setitem(METHODS, "ghost", "torchtree.no_such_module:Ghost")
    assert main(["fit", str(files["cls"]), "--method", "ghost", "--quiet"]) == 2
    err = capsys.readouterr().err
    assert "torchtree: error: method 'ghost' is not available" in err


def test_user_errors_exit_2_and_debug_shows_traceback(files, tmp_path, capsys):
    assert main(["fit", str(tmp_path / "missing.csv")]) == 2
    assert "missing.csv: no such file" in capsys.readouterr().err
    assert main(["fit", str(files["cls"]), "--n-particles", "10", "--n-islands", "3", "--quiet"]) == 2
    assert "must be >= 1 and divide n_particles" in capsys.readouterr().err
    assert main(["fit", str(files["reg"]), "--alpha", "2", "--quiet"]) == 2
    assert "--alpha applies to classification only" in capsys.readouterr().err
    assert main(["fit", str(files["cls"]), "--target", "zzz"]) == 2
    assert "no column named 'zzz'" in capsys.readouterr().err
    assert main(["summary", str(files["cls"])]) == 2
    assert "not a torchtree posterior file" in capsys.readouterr().err
    with pytest.raises(ValueError, match="divide n_particles"):
        main(["fit", str(files["cls"]), "--n-particles", "10", "--n-islands", "3", "--quiet", "--debug"])


def test_no_command_prints_help(capsys):
    assert main([]) == 2
    assert "usage: torchtree" in capsys.readouterr().err


def test_python_m_torchtree_help():
    r = subprocess.run([sys.executable, "-m", "torchtree", "--help"], capture_output=True, text=True, timeout=300, cwd=ROOT)
    assert r.returncode == 0, r.stderr
    for cmd in ("fit", "predict", "summary", "demo", "bench"):
        assert cmd in r.stdout


# ----------------------------------------------------------------------------- bench
def test_bench_list_and_run(tmp_path, monkeypatch, capsys):
    script = tmp_path / "bench_fake.py"
    script.write_text(
        '"""A fake benchmark for the tests."""\n'
        "import argparse, json\n"
        "p = argparse.ArgumentParser(); p.add_argument('--out', default='fake.json'); p.add_argument('--n', type=int, default=1)\n"
        "a = p.parse_args(); json.dump({'n': a.n}, open(a.out, 'w'))\n"
    )
    monkeypatch.setenv("TORCHTREE_BENCHMARKS", str(tmp_path))
    assert main(["bench", "--list"]) == 0
    out = capsys.readouterr().out
    assert "fake" in out and "A fake benchmark for the tests." in out
    res = tmp_path / "res.json"
    assert main(["bench", "--quiet", "--out", str(res), "fake", "--n", "3"]) == 0
    assert json.loads(res.read_text()) == {"n": 3}
    res2 = tmp_path / "res2.json"
    assert main(["bench", "fake", "--out", str(res2), "--n", "4"]) == 0
    assert json.loads(res2.read_text()) == {"n": 4}
    assert main(["bench", "nothing"]) == 2
    assert "no benchmark named 'nothing'" in capsys.readouterr().err


def test_bench_list_finds_repository_benchmarks(monkeypatch, capsys):
    monkeypatch.delenv("TORCHTREE_BENCHMARKS", raising=False)
    assert main(["bench", "--list"]) == 0
    found = sorted(p.stem[len("bench_"):] for p in (ROOT / "benchmarks").glob("bench_*.py"))
    assert "paper001" in found and "bart_peers" in found
    assert not list((ROOT / "examples").glob("bench_*.py")), "benchmark scripts belong in benchmarks/"
    out = capsys.readouterr().out
    assert f"benchmarks in {ROOT / 'benchmarks'}:" in out
    for name in found:
        assert name in out


# ----------------------------------------------------------------------------- csvio
def test_read_csv_basics(tmp_path):
    path = tmp_path / "d.csv"
    path.write_text("\ufeffx, y ,label\n1,2,a\n\n3,4,b\n")
    t = read_csv(str(path))
    assert t.feature_names == ["x", "y"] and t.target_name == "label"
    np.testing.assert_array_equal(t.X, [[1, 2], [3, 4]])
    assert list(t.y) == ["a", "b"] and list(t.lines) == [2, 4]
    num = tmp_path / "n.csv"
    num.write_text("x,Y,z\n1,2,3\n")
    t2 = read_csv(str(num), target="y")  # case-insensitive when unambiguous
    assert t2.target_name == "Y" and t2.feature_names == ["x", "z"]


def test_read_csv_gzip_semicolon_and_index_target(tmp_path):
    path = tmp_path / "d.csv.gz"
    with gzip.open(path, "wt") as fh:
        fh.write("t;a;b\n1;0.5;2\n0;0.25;3\n")
    t = read_csv(str(path), target=0)
    assert t.target_name == "t" and t.feature_names == ["a", "b"]
    np.testing.assert_array_equal(parse_target(t.y, "classification"), [1, 0])


def test_read_csv_errors(tmp_path):
    empty = tmp_path / "e.csv"
    empty.write_text("")
    with pytest.raises(ValueError, match="empty"):
        read_csv(str(empty))
    only_header = tmp_path / "h.csv"
    only_header.write_text("a,b\n")
    with pytest.raises(ValueError, match="no data rows"):
        read_csv(str(only_header))
    dup = tmp_path / "dup.csv"
    dup.write_text("a,a,y\n1,2,3\n")
    with pytest.raises(ValueError, match="duplicate column"):
        read_csv(str(dup))
    many = tmp_path / "many.csv"
    many.write_text("a,y\n" + "".join(f"{'-' * (i % 2)}inf,1\n" for i in range(15)))
    with pytest.raises(ValueError, match=r"15 malformed rows:(.|\n)*line 11:(.|\n)*and 5 more"):
        read_csv(str(many))
    inf = tmp_path / "inf.csv"
    inf.write_text("a,y\ninf,1\n")
    with pytest.raises(ValueError, match="line 2: column 'a': 'inf' is not a finite number"):
        read_csv(str(inf))
    with pytest.raises(FileNotFoundError):
        read_csv(str(tmp_path / "nope.csv"))


def test_infer_and_parse_target():
    assert infer_task(np.array(["1", "2", "3"])) == "classification"
    assert infer_task(np.array(["1.0", "2.0"])) == "classification"
    assert infer_task(np.array(["1.5", "2"])) == "regression"
    assert infer_task(np.array(["a", "2.5"])) == "classification"
    assert parse_target(np.array(["2.0", "1"]), "classification").dtype.kind == "i"
    assert parse_target(np.array(["a", "1"]), "classification").tolist() == ["a", "1"]
    with pytest.raises(ValueError, match="line 9: .*'a' is not a number"):
        parse_target(np.array(["1", "a"]), "regression", lines=np.array([8, 9]))


def test_read_features_by_name_ignores_target(tmp_path):
    path = _write(tmp_path / "p.csv", ["c", "label", "a", "b"], [[3, "dog", 1, 2]])
    t = read_features(str(path), 3, ["a", "b", "c"], "label")
    np.testing.assert_array_equal(t.X, [[1, 2, 3]])
    assert list(t.y) == ["dog"]


def test_predict_out_in_a_missing_directory_names_the_users_path(fitted, files, tmp_path, capsys):
    out = tmp_path / "nodir" / "p.csv"
    assert main(["predict", str(fitted["cls"]), str(files["cls"]), "--out", str(out)]) == 2
    err = capsys.readouterr().err
    assert f"{out}: directory {out.parent} does not exist" in err and ".tmp-" not in err


def test_demo_reports_the_one_time_start_up_on_its_own_line():
    """The demo pays one-time costs before its table (issue #22, item 4): a start-up line comes
    first, then one row per configuration plus CART."""
    import io

    from torchtree.cli.bench import demo

    buf = io.StringIO()
    rows = demo(seed=0, out=buf)
    text = buf.getvalue().splitlines()
    assert text[1].startswith("one-time start-up")
    assert len(rows) in (3, 4) and all(r[2] >= 0 for r in rows)


# ------------------------------------------------------------- findings of the QA pass
def test_predict_into_a_directory_is_refused_and_leaves_nothing(fitted, files, tmp_path, capsys):
    out = tmp_path / "preds"
    out.mkdir()
    assert main(["predict", str(fitted["cls"]), str(files["cls"]), "--out", str(out), "--quiet"]) == 2
    assert "is a directory" in capsys.readouterr().err
    assert sorted(p.name for p in tmp_path.iterdir()) == ["preds"] and not any(out.iterdir())  # no .tmp-PID left


def test_a_file_without_a_header_row_is_refused_not_read_as_names(fitted, files, tmp_path, capsys):
    body = (files["dir"] / "animals.csv").read_text().splitlines()[1:]
    headless = tmp_path / "rows.csv"
    headless.write_text("\n".join(",".join(line.split(",")[:3]) for line in body) + "\n")
    assert main(["predict", str(fitted["cls"]), str(headless), "--quiet"]) == 2
    assert "line 1 holds only numbers" in capsys.readouterr().err  # it used to predict one row too few
    numeric = tmp_path / "num.csv"
    numeric.write_text("\n".join(",".join(line.split(",")[:3] + ["1"]) for line in body) + "\n")
    assert main(["fit", str(numeric), "--quiet"]) == 2
    assert "header row" in capsys.readouterr().err


def test_an_integer_target_with_many_values_asks_for_the_task(files, tmp_path, capsys):
    X = files["X"]
    path = _write(tmp_path / "counts.csv", ["a", "b", "c", "count"], [[*x, int(40 * x[0] + 40)] for x in X])
    assert main(["fit", str(path), "--quiet"]) == 2
    err = capsys.readouterr().err
    assert "distinct integers: give --task classification" in err and "--task regression" in err
    assert main(["fit", str(path), "--task", "regression", "--n-particles", "20", "--out", str(tmp_path / "p.pt"),
                 "--quiet"]) == 0


def test_an_option_of_another_method_is_named_not_the_top_level_usage(files, capsys):
    assert main(["fit", str(files["cls"]), "--method", "mcmc", "--n-particles", "5", "--quiet"]) == 2
    err = capsys.readouterr().err
    assert "--n-particles: not an option of torchtree fit --method mcmc (MCMC)" in err and "usage:" not in err


def test_warnings_print_in_the_command_lines_words(files, tmp_path):
    r = subprocess.run([sys.executable, "-m", "torchtree", "fit", str(files["cls"]), "--method", "mcmc", "--n-chains", "2",
                        "--n-samples", "10", "--n-warmup", "10", "--quiet", "--out", str(tmp_path / "m.pt")],
                       capture_output=True, text=True, timeout=300)
    assert r.returncode == 0, r.stderr
    assert "torchtree: warning: MCMC chains look unconverged" in r.stderr
    assert "UserWarning" not in r.stderr and ".py:" not in r.stderr


def test_bart_reports_sums_of_trees_not_distinct_trees_or_a_map_tree(files, tmp_path, capsys):
    out = tmp_path / "bart.pt"
    assert main(["fit", str(files["reg"]), "--method", "bart", "--n-trees", "5", "--n-samples", "5", "--n-warmup", "5",
                 "--out", str(out)]) == 0
    text = capsys.readouterr().out
    assert "draws of a sum of 5 trees" in text and "?" not in text
    assert main(["summary", str(out)]) == 0
    text = capsys.readouterr().out
    assert "no single MAP tree" in text and "MAP tree (tree" not in text and "share of all splits" in text
    assert main(["report", str(out)]) == 0
    text = capsys.readouterr().out
    assert "BART (bart), 20 draws of a sum of 5 trees" in text and "?" not in text  # 4 chains x 5 kept sweeps
    assert "sigma " in text and "converged" not in text  # a fixed-length run


def test_bart_run_until_converged_reports_its_verdict(files, tmp_path, capsys):
    """--min-ess: fit and report show whether the run converged, its window and its length, and sigma's R-hat."""
    out = tmp_path / "bart.pt"
    assert main(["fit", str(files["reg"]), "--method", "bart", "--n-trees", "5", "--n-samples", "5", "--n-warmup", "5",
                 "--min-ess", "1e6", "--max-samples", "10", "--out", str(out), "--quiet"]) == 0
    fit_text = capsys.readouterr().out
    assert main(["report", str(out)]) == 0
    report_text = capsys.readouterr().out
    for text in (fit_text, report_text):
        assert re.search(r"^converged +no \(min_ess\): (5|10) kept sweeps per chain after (5|10) warm-up, 15 run$", text,
                         re.M), text
        assert re.search(r"^sigma +R-hat \d+\.\d{3}, ESS \d+\.\d$", text, re.M), text


def test_a_negative_seed_is_refused_naming_the_option(tmp_path, capsys):
    tr = _write(tmp_path / "tr.csv", ["x", "y"], [[i / 10, i % 2] for i in range(20)])
    for bad in ("-1", "x"):
        with pytest.raises(SystemExit) as e:
            main(["fit", str(tr), "--seed", bad])
        assert e.value.code == 2 and f"argument --seed: must be an integer >= 0, got '{bad}'" in capsys.readouterr().err
