"""Text that spells a missing value ("n/a", "NA", "?", ...: MISSING_TOKENS) in a column of numbers is a missing
value, in the Python API and in the command line's CSV reader alike; in a column of text it stays a level. A stray
word among numbers is still read as categorical (it may be one), with a warning naming the column."""
import csv
import warnings

import numpy as np
import pandas as pd
import pytest

import torchtree as tt
from torchtree.cli import main
from torchtree.io.csv import read_csv
from torchtree.model.encoding import TableEncoder
from torchtree.io.cells import MISSING_TOKENS, is_missing_token

SMALL = ["--n-particles", "20", "--seed", "0"]


def _frame(n=240, seed=2):
    rng = np.random.default_rng(seed)
    df = pd.DataFrame({"num": rng.normal(size=n), "few": rng.choice(["a", "b", "c"], n)})
    y = ((df.num > 0).to_numpy() ^ (df.few == "a").to_numpy()).astype(int)
    return df, y


def _caught(fn):
    with warnings.catch_warnings(record=True) as w:
        warnings.simplefilter("always")
        out = fn()
    return out, [str(x.message) for x in w if issubclass(x.category, UserWarning)]


def test_the_tokens_are_matched_without_case_or_blanks():
    assert all(is_missing_token(t) and is_missing_token(f" {t.upper()} ") for t in MISSING_TOKENS)
    assert not any(is_missing_token(v) for v in ("nana", "0", "a", "", None, float("nan"), 3.0))


def test_tokens_among_numbers_are_missing_values_coded_as_nan():
    """The column with tokens is coded exactly as the same column with NaN in their cells (MIA), with one warning
    naming the column and the tokens; predict takes tokens as missing too."""
    df, y = _frame()
    with_nan = df.copy()
    with_nan.loc[[0, 7, 11], "num"] = np.nan
    tokens = df.assign(num=df.num.astype(object))
    tokens.loc[0, "num"], tokens.loc[7, "num"], tokens.loc[11, "num"] = "n/a", " NA", "?"
    enc, msgs = _caught(lambda: TableEncoder.fit(tokens, y))
    ref = TableEncoder.fit(with_nan, y)
    np.testing.assert_array_equal(enc.transform(tokens), ref.transform(with_nan))
    assert len(msgs) == 1 and "'num'" in msgs[0] and "3 text cell(s)" in msgs[0] and "'n/a'" in msgs[0]
    fit_tok = tt.BayesianTreeClassifier(n_particles=30, random_state=0)
    _caught(lambda: fit_tok.fit(tokens, y))
    fit_nan = tt.BayesianTreeClassifier(n_particles=30, random_state=0).fit(with_nan, y)
    np.testing.assert_array_equal(fit_tok.predict_proba(tokens), fit_nan.predict_proba(with_nan))
    assert fit_tok.score(tokens, y) > 0.9  # the column stays numeric: the signal is found


def test_a_token_in_a_text_column_is_a_level_and_a_stray_word_among_numbers_warns():
    df, y = _frame()
    text = df.copy()
    text.loc[3, "few"] = "NA"
    enc = TableEncoder.fit(text, y)
    assert "NA" in enc.columns[1].levels  # a category may be called NA
    stray = df.assign(num=df.num.astype(object))
    stray.loc[0, "num"] = "abc"
    enc, msgs = _caught(lambda: TableEncoder.fit(stray, y))
    assert enc.columns[0].source == "categorical"
    assert len(msgs) == 1 and "'num'" in msgs[0] and "'abc'" in msgs[0] and f"{len(df) - 1} of its {len(df)} levels" in msgs[0]
    _, quiet = _caught(lambda: TableEncoder.fit(df, y))  # a real text column with few levels: no warning
    assert quiet == []


def _write(path, header, rows):
    with open(path, "w", newline="") as fh:
        w = csv.writer(fh)
        w.writerow(header)
        w.writerows(rows)
    return path


def test_the_csv_reader_reads_tokens_among_numbers_as_nan(tmp_path):
    rows = [["0.5", "a", "1"], ["n/a", "b", "0"], ["?", "NA", "1"], ["0.1", "b", "0"]]
    t = read_csv(_write(tmp_path / "t.csv", ["x", "c", "y"], rows))
    assert np.isnan(t.X[1, 0]) and np.isnan(t.X[2, 0]) and t.X[0, 0] == 0.5
    assert t.X[2, 1] == "NA"  # a level of the text column
    assert t.missing_tokens == {"x": ("n/a", 3, 2)} and t.text_columns == {"c": ("a", 2)}


def test_fit_says_what_it_read_and_takes_a_reordered_test_file_by_name(tmp_path, capsys):
    rng = np.random.default_rng(0)
    x, z = rng.normal(size=120), rng.normal(size=120)
    y = (x > 0).astype(int)
    cells = [["n/a" if i == 3 else f"{x[i]:.4f}", "abc" if i == 5 else f"{z[i]:.4f}", y[i]] for i in range(120)]
    tr = _write(tmp_path / "tr.csv", ["x", "z", "y"], cells[:90])
    te = _write(tmp_path / "te.csv", ["z", "y", "x"], [[c[1], c[2], c[0]] for c in cells[90:]])
    assert main(["fit", str(tr), "--test", str(te), "--out", str(tmp_path / "m.pt"), "-q", *SMALL]) == 0
    out, err = capsys.readouterr()
    assert "test 30 (" in out and "test accuracy" in out and err == ""  # --quiet: errors only
    assert main(["fit", str(tr), "--out", str(tmp_path / "m.pt"), *SMALL]) == 0
    err = capsys.readouterr().err
    assert "column 'x': 1 cell(s) such as 'n/a' (line 5) read as missing values" in err
    # a word among numbers, which makes every number a level of its own
    assert "'z' holds text ('abc'" in err and "89 of its 90 cells are numbers" in err
    bad = _write(tmp_path / "bad.csv", ["z", "w", "y"], [[c[1], c[0], c[2]] for c in cells[90:]])
    assert main(["fit", str(tr), "--test", str(bad), "--out", str(tmp_path / "m.pt"), "-q", *SMALL]) == 2
    assert "differ from" in capsys.readouterr().err


@pytest.mark.parametrize("token", sorted(MISSING_TOKENS))
def test_every_token_is_missing_at_prediction(token):
    df, y = _frame(60)
    est = tt.BayesianTreeRegressor(n_particles=10, random_state=0).fit(df, df.num.to_numpy())
    q = df.iloc[[0, 0]].assign(num=[token, np.nan])
    p = est.predict(q)
    assert p[0] == p[1]
