"""The CSV reader's first line: a header row, refused when it is all numbers, a warning when mostly."""
from __future__ import annotations

import warnings

import pytest

from torchtree.io.csv import read_csv


def _write(path, lines):
    path.write_text("\n".join(lines) + "\n")
    return str(path)


def test_a_first_line_of_mostly_numbers_warns_that_it_became_the_header(tmp_path):
    rows = ["5.1,3.5,1.4,0.2,setosa", "4.9,3.0,1.4,0.2,setosa", "7.0,3.2,4.7,1.4,versicolor"]
    with pytest.warns(UserWarning, match=r"line 1 is read as the header row, but 4 of its 5 cells are numbers "
                                         r"\(5\.1, 3\.5, 1\.4, \.\.\.\): if the file has no header row, add one"):
        t = read_csv(_write(tmp_path / "nohdr.csv", rows))
    assert t.feature_names == ["5.1", "3.5", "1.4", "0.2"] and t.n_rows == 2  # what the warning is about
    with pytest.raises(ValueError, match="line 1 holds only numbers"):
        read_csv(_write(tmp_path / "numbers.csv", [r.rsplit(",", 1)[0] + ",0" for r in rows]))


def test_a_header_with_a_few_numeric_names_is_read_in_silence(tmp_path):
    """Years as column names: two of five cells are numbers, no more than half."""
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        t = read_csv(_write(tmp_path / "years.csv", ["country,2019,2020,region,y", "fr,1.0,2.0,eu,0", "us,3.0,1.0,am,1"]))
    assert t.feature_names == ["country", "2019", "2020", "region"]
