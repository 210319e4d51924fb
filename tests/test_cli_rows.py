"""The command line keeps every input row in its place and refuses what would shift or mislabel them:
rows of empty cells, files without their header row, labels never seen, a checkpoint that is the output
file, a repeated ``--method``; a DCC posterior's summary is text. Each case is one a QA pass found."""
from __future__ import annotations

import csv
from pathlib import Path

import numpy as np
import pytest

from torchtree.cli import main

SMALL = ["--n-particles", "10", "--n-islands", "1", "--quiet", "--hyper", "fixed"]


def _write(path: Path, header, rows) -> Path:
    with open(path, "w", newline="") as fh:
        w = csv.writer(fh)
        if header is not None:
            w.writerow(header)
        w.writerows(rows)
    return path


@pytest.fixture(scope="module")
def model(tmp_path_factory):
    d = tmp_path_factory.mktemp("rows")
    rng = np.random.default_rng(0)
    X = np.round(rng.uniform(size=(80, 3)), 3)
    lab = np.where(X[:, 0] > 0.5, "hi", "lo")
    train = _write(d / "train.csv", ["a", "b", "c", "label"], [[*x, l] for x, l in zip(X, lab)])
    out = d / "m.pt"
    assert main(["fit", str(train), "--out", str(out), "--seed", "0", *SMALL]) == 0
    return d, out, X, lab


def _predictions(capsys):
    lines = capsys.readouterr().out.strip().splitlines()
    return lines[1:]  # after the header


def test_a_row_of_empty_cells_is_predicted_not_dropped(model, capsys):
    """``,,,`` is a row whose cells are all missing (as pandas reads it): 3 rows in, 3 predictions out, the
    middle one from the missing-value rule; before, it was skipped as a blank line and the rows after it
    shifted."""
    d, out, X, _ = model
    f = d / "pred.csv"
    f.write_text("a,b,c\n0.9,0.5,0.5\n,,\n0.1,0.5,0.5\n")
    assert main(["predict", str(out), str(f)]) == 0
    rows = _predictions(capsys)
    assert len(rows) == 3 and rows[0].startswith("hi") and rows[2].startswith("lo")
    f.write_text("a,b,c\n0.9,0.5,0.5\n\n0.1,0.5,0.5\n")  # a blank line is still no row
    assert main(["predict", str(out), str(f)]) == 0
    assert len(_predictions(capsys)) == 2


def test_a_training_row_of_empty_cells_is_refused_for_its_empty_target(model, capsys):
    d, _, X, lab = model
    f = d / "train_gap.csv"
    f.write_text("a,b,c,label\n" + "\n".join(f"{x[0]},{x[1]},{x[2]},{l}" for x, l in zip(X[:40], lab)) + "\n,,,\n")
    assert main(["fit", str(f), "--out", str(d / "gap.pt"), *SMALL]) == 2
    assert "line 42" in capsys.readouterr().err


def test_predict_refuses_a_file_without_its_header_row(model, capsys):
    """The first data row would be read as the header and dropped, and the predictions shifted: refused, naming
    the model's columns."""
    d, out, X, lab = model
    f = _write(d / "nohdr.csv", None, [[*x, l] for x, l in zip(X[:4], lab)])
    assert main(["predict", str(out), str(f)]) == 2
    assert "line 1 holds only numbers in the feature columns" in capsys.readouterr().err


def test_predict_says_when_labels_were_not_seen_in_training(model, capsys):
    d, out, X, lab = model
    f = _write(d / "newlab.csv", ["a", "b", "c", "label"], [[*X[0], "hi"], [*X[1], "mid"], [*X[2], "mid"]])
    assert main(["predict", str(out), str(f)]) == 0
    err = capsys.readouterr().err
    assert "2 rows have labels not seen in training ('mid'); the accuracy counts them as errors" in err


def test_the_checkpoint_may_not_be_the_output_file(model, capsys):
    d, _, _, _ = model
    same = d / "same.pt"
    assert main(["fit", str(d / "train.csv"), "--method", "mcmc", "--n-samples", "5", "--quiet", "--out", str(same),
                 "--checkpoint", str(same)]) == 2
    assert "is the --out file" in capsys.readouterr().err and not same.exists()


def test_a_repeated_method_checks_the_options_of_the_one_that_runs(model, capsys):
    """argparse keeps the last ``--method``: its options are accepted, the first one's refused; a misspelt
    option is answered with the closest one."""
    d, _, _, _ = model
    train = str(d / "train.csv")
    assert main(["fit", train, "--method", "mcmc", "--method", "smc", "--out", str(d / "r.pt"), *SMALL]) == 0
    capsys.readouterr()
    assert main(["fit", train, "--method", "smc", "--method", "mcmc", "--n-particles", "10", "--quiet"]) == 2
    assert "not an option of torchtree fit --method mcmc" in capsys.readouterr().err
    assert main(["fit", train, "--n-threads", "1", "--quiet"]) == 2
    assert "(did you mean --threads?)" in capsys.readouterr().err


def test_the_summary_of_a_soft_tree_posterior_is_text(model, capsys):
    """A DCC posterior's MAP topology is printed as an indented tree of its gates (weights and thresholds on the
    scaled inputs) and leaves, not as Graphviz DOT."""
    d, _, _, _ = model
    out = d / "dcc.pt"
    assert main(["fit", str(d / "train.csv"), "--method", "dcc", "--n-iterations", "1", "--n-warmup", "20",
                 "--n-samples", "5", "--n-chains", "2", "--max-seconds", "none", "--quiet", "--out", str(out)]) == 0
    capsys.readouterr()
    assert main(["summary", str(out)]) == 0
    text = capsys.readouterr().out
    assert "digraph" not in text and "soft oblique splits on the inputs scaled to [0, 1]" in text
    gate = next(line for line in text.splitlines() if " <= " in line)
    weights = [float(w) for w in __import__("re").findall(r"(\d\.\d\d) (?:[abc]|\()", gate)]
    assert weights and abs(sum(weights) - 1.0) < 0.03  # a gate's weights sum to one (rounded to 2 places)
    assert "leaf: hi" in text or "leaf: lo" in text


def test_a_posterior_saved_from_python_reads_the_file_by_its_column_names(tmp_path, capsys):
    """A posterior fitted on a DataFrame in Python and saved keeps ``feature_names``; ``torchtree predict`` read the
    file by position instead (wrong predictions, exit 0, no warning, on a file with the columns reordered) and
    ``summary`` printed x0, x1, ... Now both use the saved names, as Python's predict does."""
    import pandas as pd

    from torchtree import BayesianTreeRegressor

    rng = np.random.default_rng(3)
    frame = pd.DataFrame({"w": rng.uniform(size=120), "v": rng.uniform(size=120), "u": rng.uniform(size=120)})
    est = BayesianTreeRegressor(n_particles=30, random_state=0).fit(frame, 10 * frame.w + rng.normal(size=120) * 0.1)
    est.posterior_.save(tmp_path / "py.pt")
    test = frame.iloc[:6][["u", "w", "v"]]  # reordered columns
    f = _write(tmp_path / "new.csv", list(test.columns), test.to_numpy().tolist())
    assert main(["predict", str(tmp_path / "py.pt"), str(f)]) == 0
    got = np.array([float(v.split(",")[0]) for v in _predictions(capsys)])
    np.testing.assert_allclose(got, est.predict(test), rtol=1e-12)
    assert main(["summary", str(tmp_path / "py.pt")]) == 0
    text = capsys.readouterr().out
    assert "w <= " in text and "x0" not in text
