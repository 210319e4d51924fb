"""Plain CSV files (every feature cell a finite number, no quotes, no blank lines) are read by numpy's C
parser; the result must equal the general reader's, and every other file must go to the general reader."""
from __future__ import annotations

import gzip

import numpy as np
import pytest

import torchtree.io.csv as csvmod
from torchtree.io.csv import read_csv

_PLAIN = csvmod._plain_numbers


def _read_both(monkeypatch, path, **kw):
    """(table read as the reader chooses, whether the plain path took it, table of the general reader)."""
    took = []
    monkeypatch.setattr(csvmod, "_plain_numbers", lambda *a: took.append(_PLAIN(*a)) or took[-1])
    fast = read_csv(path, **kw)
    monkeypatch.setattr(csvmod, "_plain_numbers", lambda *a: None)
    general = read_csv(path, **kw)
    return fast, bool(took) and took[-1] is not None, general


def _same(a, b):
    assert a.X.dtype == b.X.dtype and a.X.shape == b.X.shape
    assert [str(v) for v in a.X.ravel().tolist()] == [str(v) for v in b.X.ravel().tolist()]  # NaN, text
    assert (a.y is None and b.y is None) or (a.y.tolist() == b.y.tolist() and a.y.dtype == b.y.dtype)
    np.testing.assert_array_equal(a.lines, b.lines)
    assert (a.feature_names, a.target_name, a.header) == (b.feature_names, b.target_name, b.header)
    assert (a.text_columns, a.missing_tokens) == (b.text_columns, b.missing_tokens)


PLAIN = {
    "simple.csv": "a,b,y\n1.5,2,0\n-3e-2,4,1\n0.1,1e3,1\n",
    "crlf_spaces_no_final_newline.csv": "a, b ,y\r\n 1.25 ,2,  cat \r\n3,\t4 ,dog",
    "bom_blank_sep.csv": "\ufeff\n\nsep=;\na;b;y\n1,5;2;x\n3;4;y\n",
    "tabs.csv": "a\tb\ty\n1\t2\tsetosa\n3\t4\tversicolor\n",
}


@pytest.mark.parametrize("name", sorted(PLAIN))
@pytest.mark.parametrize("gz", [False, True])
def test_plain_files_take_the_c_parser_and_read_as_the_general_reader(tmp_path, monkeypatch, name, gz):
    text = PLAIN[name]
    if name == "bom_blank_sep.csv":
        text = text.replace("1,5;", "1.5;")
    path = tmp_path / (name + (".gz" if gz else ""))
    if gz:
        with gzip.open(path, "wt", newline="") as fh:
            fh.write(text)
    else:
        path.write_bytes(text.encode())
    numeric_target = name == "simple.csv"  # elsewhere the last column is text: a feature only when it is the target
    for kw in ({}, {"features": ["b", "a"]}) + (({"has_target": False}, {"target": "a"}) if numeric_target else ()):
        fast, took, general = _read_both(monkeypatch, str(path), **kw)
        assert took, (name, kw)
        _same(fast, general)
    assert fast.lines.tolist() == general.lines.tolist() == list(range(fast.lines[0], fast.lines[0] + fast.n_rows))


NOT_PLAIN = {
    "blank_line.csv": ("a,b,y\n1,2,0\n\n3,4,1\n", None),
    "blank_spaces.csv": ("a,b,y\n1,2,0\n  \n3,4,1\n", None),
    "quoted.csv": ('a,b,y\n"1",2,0\n3,4,1\n', None),
    "nan_cell.csv": ("a,b,y\n1,nan,0\n3,4,1\n", None),
    "empty_cell.csv": ("a,b,y\n1,,0\n3,4,1\n", None),
    "token.csv": ("a,b,y\n1,?,0\n3,4,1\n", None),
    "text.csv": ("a,b,y\n1,red,0\n3,blue,1\n", None),
    "underscores.csv": ("a,b,y\n1,1_000,0\n3,4,1\n", None),  # Python's float reads 1_000; numpy's parser does not
    "inf.csv": ("a,b,y\n1,inf,0\n3,4,1\n", "line 2: column 'b': 'inf' is not a finite number"),
    "long_row.csv": ("a,b,y\n1,2,0,9\n3,4,1\n", "line 2: expected 3 fields, got 4"),
    "short_and_long.csv": ("a,b,y\n1,2\n3,4,1,5\n", "line 2: expected 3 fields, got 2"),
    "empty_target.csv": ("a,b,y\n1,2,\n3,4,1\n", "line 2: target column 'y' is empty"),
    "long_field.csv": ("a,b,y\n" + "0" * 200000 + "1,2,0\n3,4,1\n", "field larger than field limit"),
    "nul_in_target.csv": ("a,b,y\n1,2,a\x00\n3,4,b\n", None),  # numpy would strip the NUL
}


@pytest.mark.parametrize("name", sorted(NOT_PLAIN))
def test_other_files_go_to_the_general_reader(tmp_path, monkeypatch, name):
    text, error = NOT_PLAIN[name]
    path = tmp_path / name
    path.write_text(text)
    if error is not None:
        with pytest.raises(ValueError, match=error):
            read_csv(str(path))
        assert _PLAIN(str(path), 3, [0, 1], 2) is None
        return
    fast, took, general = _read_both(monkeypatch, str(path))
    assert not took
    _same(fast, general)
