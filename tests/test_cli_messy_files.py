"""The command line on files as spreadsheets write them (a QA pass): missing targets spelt as text,
Excel's separator line, decimal commas, headers in another case, files missing a feature column."""
from __future__ import annotations

import numpy as np
import pytest

from torchtree.cli import main

FIT = ["--n-particles", "30", "--n-islands", "1", "--hyper", "fixed", "-q"]


def _write(path, header, rows, sep=","):
    path.write_text(header + "\n" + "\n".join(sep.join(map(str, r)) for r in rows) + "\n")
    return str(path)


@pytest.fixture(scope="module")
def xs():
    rng = np.random.default_rng(0)
    return rng.normal(size=60).round(3), rng.integers(0, 4, 60)


def test_a_missing_value_token_in_a_numeric_target_is_a_missing_target(tmp_path, xs, capsys):
    """'NA' among numbers used to make the target text, so the task became classification with one
    class per row; now it is refused with its line, with or without --task."""
    x, k = xs
    y = [f"{2 * v:.3f}" for v in x]
    y[5] = "NA"
    path = _write(tmp_path / "reg.csv", "x,k,y", zip(x, k, y))
    for extra in ([], ["--task", "regression"]):
        assert main(["fit", path, *FIT, *extra]) == 2
        assert "line 7: target 'y' is missing ('NA'); drop the row" in capsys.readouterr().err


def test_a_missing_value_token_among_text_labels_is_a_class_with_a_warning(tmp_path, xs, capsys):
    x, k = xs
    lab = ["yes" if v > 0 else "no" for v in x]
    lab[5] = "NA"
    path = _write(tmp_path / "clf.csv", "x,k,label", zip(x, k, lab))
    with pytest.warns(UserWarning, match=r"1 cell\(s\) such as 'NA' \(line 7\) are read as a class of their own"):
        assert main(["fit", path, *FIT, "--out", str(tmp_path / "p.pt")]) == 0
    assert "3 classes: NA, no, yes" in capsys.readouterr().out


def test_a_nan_target_among_text_labels_is_refused_without_being_called_a_class(tmp_path, xs, capsys):
    """'nan' is a missing target whatever the other cells hold: refused with its line, and the warning
    about NA-like labels (a class among text labels) counts 'NA' alone, not the refused 'nan'."""
    import warnings

    x, k = xs
    lab = ["yes" if v > 0 else "no" for v in x]
    lab[3], lab[5] = "nan", "NA"
    path = _write(tmp_path / "clf.csv", "x,k,label", zip(x, k, lab))
    with warnings.catch_warnings(record=True) as seen:
        warnings.simplefilter("always")
        assert main(["fit", path, *FIT, "--out", str(tmp_path / "p.pt")]) == 2
    assert "line 5: target 'label' is missing ('nan'); drop the row" in capsys.readouterr().err
    told = [str(w.message) for w in seen if "class of their own" in str(w.message)]
    assert len(told) == 1 and "1 cell(s) such as 'NA' (line 7)" in told[0] and "'nan'" not in told[0]


def test_the_notice_of_a_text_column_names_its_cells_that_look_missing(tmp_path, capsys):
    """In a text column, 'NA' and '?' are levels (the column is categorical); the notice names them and says
    how to make them missing."""
    path = _write(tmp_path / "tok.csv", "x,c,y", [(1, "a", 0), (2, "NA", 1), (3, "b", 0), (4, "?", 1), (5, "a", 0),
                                                  (6, "b", 1)])
    assert main(["fit", path, *[a for a in FIT if a != "-q"], "--out", str(tmp_path / "p.pt")]) == 0
    out = "".join(capsys.readouterr())  # the notices go to stderr
    assert ("column 'c' holds text ('a' at line 2): categorical, 4 levels (--categorical to name categorical columns "
            "yourself); '?', 'NA' are levels of their own: if they mark missing values, leave those cells empty") in out


def test_excels_separator_line_names_the_delimiter(tmp_path, xs, capsys):
    x, _ = xs
    lab = ["yes" if v > 0 else "no" for v in x]
    path = tmp_path / "excel.csv"
    path.write_text("sep=;\nx;label\n" + "\n".join(f"{a};{b}" for a, b in zip(x, lab)) + "\n")
    assert main(["fit", str(path), *FIT, "--out", str(tmp_path / "p.pt")]) == 0
    assert "60 rows, 1 features, target 'label' (classification, 2 classes: no, yes)" in capsys.readouterr().out


def test_decimal_commas_are_named_as_the_likely_cause(tmp_path, xs, capsys):
    x, k = xs
    lab = ["yes" if v > 0 else "no" for v in x]
    path = _write(tmp_path / "comma.csv", "x;k;label", ([f"{a:.3f}".replace(".", ","), b, c] for a, b, c in zip(x, k, lab)),
                  sep=";")
    assert main(["fit", path, "--n-particles", "30", "--n-islands", "1", "--hyper", "fixed", "--out",
                 str(tmp_path / "p.pt")]) == 0
    assert "look like numbers written with a decimal comma" in capsys.readouterr().err


def test_predict_matches_headers_in_another_case_by_name_and_names_a_missing_column(tmp_path, capsys):
    """'K,X' for a model of 'x,k' used to be read by position, swapping the columns silently."""
    rng = np.random.default_rng(0)
    x, k = rng.normal(size=200).round(3), rng.integers(0, 10, 200)
    train = _write(tmp_path / "train.csv", "x,k,label", zip(x, k, np.where(x > 0, "yes", "no")))
    model = str(tmp_path / "m.pt")
    assert main(["fit", train, *FIT, "--out", model]) == 0
    capsys.readouterr()
    outs = []
    for header in ("k,x", "K,X"):
        assert main(["predict", model, _write(tmp_path / "new.csv", header, [(9, -2.0), (0, 2.0)])]) == 0
        outs.append(capsys.readouterr().out)
    assert outs[0] == outs[1] and outs[0].splitlines()[1].startswith("no") and outs[0].splitlines()[2].startswith("yes")
    assert main(["predict", model, _write(tmp_path / "only_x.csv", "x", [(0.1,), (0.2,)])]) == 2
    assert "only some of the model's feature columns are present: missing 'k'" in capsys.readouterr().err


def test_headers_that_match_a_feature_only_ambiguously_are_refused(tmp_path):
    """A model feature 'Age' and a file 'age,AGE': neither is 'Age', and both match it in another
    case; it used to fall through to matching by position, silently."""
    from torchtree.io.features import read_features

    path = _write(tmp_path / "twins.csv", "age,AGE", [(30, 40), (50, 60)])
    with pytest.raises(ValueError, match="columns 'age', 'AGE' all match the model's feature 'Age'"):
        read_features(path, 1, ["Age"], "y")
