"""The repository's tables (torchtree.datasets.tables): every file present, hashed and loadable;
the TORCHTREE_DATA fallback; clear refusals; and nothing in the repository reading a folder
outside it."""
import gzip
import re
import subprocess
from pathlib import Path

import numpy as np
import pytest

from torchtree.datasets import TABLES, load_table, read_table_text, table_path
from torchtree.datasets import tables as tables_mod

ROOT = Path(__file__).resolve().parents[1]

# rows, features of each table (data/README.md)
SHAPES = {"abalone": (4177, 10), "breast_cancer_wisconsin_original": (683, 9), "heart_cleveland": (297, 13),
          "heart_statlog": (270, 13), "iris": (150, 4), "madelon_train": (2000, 500), "madelon_valid": (600, 500),
          "magic04": (19020, 10), "pendigits_test": (3498, 16), "pendigits_train": (7494, 16),
          "pima_diabetes": (768, 8), "raisin": (900, 7), "students_dropout": (4424, 36), "wine": (178, 13),
          "letter": (20000, 16)}


def test_every_table_is_in_the_repository_and_documented():
    readme = (ROOT / "data" / "README.md").read_text()
    assert set(SHAPES) == set(TABLES)
    for name, (sha, _) in TABLES.items():
        path = table_path(name)
        assert path.parent == ROOT / "data" and path.name == f"{name}.csv.gz"
        assert f"`{name}.csv.gz`" in readme and sha in readme, f"{name}: row or hash missing from data/README.md"


@pytest.mark.parametrize("name", sorted(SHAPES))
def test_each_table_loads_with_its_shape_and_label_type(name):
    t = load_table(name)
    assert t.X.shape == SHAPES[name] and t.y.shape == (SHAPES[name][0],)
    assert t.X.dtype == np.float64 and np.isfinite(t.X).all()
    assert len(t.feature_names) == SHAPES[name][1]
    if t.task == "classification":
        assert t.y.dtype == np.int64 and t.y.min() == 0
    else:
        assert name == "abalone" and t.y.dtype == np.float64 and t.y.min() == 1 and t.y.max() == 29


def test_suffixes_are_accepted_and_unknown_names_refused():
    assert load_table("iris.csv").X.shape == load_table("iris.csv.gz").X.shape == (150, 4)
    with pytest.raises(ValueError, match="unknown table 'irises'.*iris"):
        load_table("irises")


def test_a_changed_file_is_refused(tmp_path, monkeypatch):
    text = read_table_text("iris").replace("5.1,3.5", "5.2,3.5", 1)
    (tmp_path / "iris.csv").write_text(text)
    monkeypatch.setattr(tables_mod, "_REPO_DATA", None)
    monkeypatch.setenv("TORCHTREE_DATA", str(tmp_path))
    with pytest.raises(ValueError, match="differs from the recorded"):
        load_table("iris")


def test_torchtree_data_is_the_fallback_and_a_plain_csv_works(tmp_path, monkeypatch):
    (tmp_path / "wine.csv").write_bytes(gzip.decompress((ROOT / "data" / "wine.csv.gz").read_bytes()))
    monkeypatch.setattr(tables_mod, "_REPO_DATA", tmp_path / "absent")
    monkeypatch.setenv("TORCHTREE_DATA", str(tmp_path))
    assert table_path("wine") == tmp_path / "wine.csv"
    np.testing.assert_array_equal(load_table("wine").X, np.loadtxt(ROOT / "data" / "wine.csv.gz", delimiter=",",
                                                                    skiprows=1)[:, :-1])
    monkeypatch.delenv("TORCHTREE_DATA")
    with pytest.raises(FileNotFoundError, match="set TORCHTREE_DATA"):
        load_table("wine")


def test_nothing_in_the_repository_reads_a_folder_beside_it():
    """A user's clone has no neighbouring data folder: code, tests and examples find data in data/ only."""
    if not (ROOT / ".git").exists():
        pytest.skip("not a git checkout")
    files = subprocess.run(["git", "ls-files", "*.py", "*.toml", "*.cfg", "Makefile", ".ci/*"], cwd=ROOT,
                           capture_output=True, text=True, check=True).stdout.split()
    word = "sha" + "red"  # spelled apart so that this file does not match its own pattern
    pattern = re.compile(rf"\.\./{word}|{word}/data|/work/{word}|\"{word}\" */ *\"data\"|TORCHTREE_{word.upper()}")
    hits = [f"{f}:{i}" for f in files
            for i, line in enumerate((ROOT / f).read_text(errors="replace").splitlines(), 1) if pattern.search(line)]
    assert not hits, f"these lines read outside the repository: {hits}"
