"""The raw tables (torchtree.datasets.raw_tables: missing values and string categories kept) and
the synthetic missing-value table (torchtree.datasets.missing)."""
import gzip
from pathlib import Path

import numpy as np
import pytest

pd = pytest.importorskip("pandas")

from torchtree.datasets import (RAW_TABLES, load_raw_table, missing_table, raw_string_columns,  # noqa: E402
                                raw_table_path, read_raw_table_text)
from torchtree.datasets import raw_tables as raw_mod  # noqa: E402

ROOT = Path(__file__).resolve().parents[1]

# name -> (rows, features, missing cells, string columns, classes or None), as in data/README.md
DOCUMENTED = {
    "adult": (32561, 14, 4262, 8, 2),
    "auto_mpg": (398, 7, 6, 1, None),
    "automobile": (201, 25, 51, 10, None),
    "breast_cancer_ljubljana": (286, 9, 9, 8, 2),
    "mushroom": (8124, 22, 2480, 22, 2),
    "soybean": (683, 35, 2337, 35, 19),
    "titanic": (1309, 7, 266, 2, 2),
}


@pytest.fixture(scope="module")
def loaded():
    return {name: load_raw_table(name) for name in RAW_TABLES}


def test_every_raw_table_is_in_the_repository_and_documented():
    readme = (ROOT / "data" / "README.md").read_text()
    assert set(DOCUMENTED) == set(RAW_TABLES)
    for name, (sha, _) in RAW_TABLES.items():
        path = raw_table_path(name)
        assert path.parent == ROOT / "data" / "raw" and path.name == f"{name}.csv.gz"
        assert f"`raw/{name}.csv.gz`" in readme and sha in readme, f"{name}: row or hash missing from data/README.md"
        raw = path.read_bytes()
        assert raw[4:8] == b"\0\0\0\0", f"{name}: the gzip header's mtime is not 0"


@pytest.mark.parametrize("name", sorted(DOCUMENTED))
def test_each_raw_table_loads_as_documented(loaded, name):
    t = loaded[name]
    rows, d, n_missing, n_strings, n_classes = DOCUMENTED[name]
    assert t.name == name and t.task == RAW_TABLES[name][1] and t.sha256 == RAW_TABLES[name][0]
    assert t.frame.shape == (rows, d) and t.y.shape == (rows,)
    assert int(t.frame.isna().to_numpy().sum()) == n_missing > 0
    strings = raw_string_columns(t.frame)
    assert len(strings) == n_strings > 0
    for c in strings:  # object columns of str, NaN for a missing cell
        col = t.frame[c]
        assert col.dtype == object
        assert all(isinstance(v, str) for v in col[col.notna()])
        assert all(isinstance(v, float) and np.isnan(v) for v in col[col.isna()])
    for c in set(t.frame.columns) - set(strings):
        assert t.frame[c].dtype.kind in "if"
    if n_classes is None:
        assert t.task == "regression" and t.y.dtype == np.float64 and np.isfinite(t.y).all()
    else:
        assert t.task == "classification" and len(np.unique(t.y)) == n_classes
        assert not pd.isna(t.y).any()


def test_source_values_are_kept(loaded):
    adult = loaded["adult"]
    assert set(np.unique(adult.y)) == {"<=50K", ">50K"} and (adult.y == ">50K").sum() == 7841
    assert adult.frame["workclass"].isna().sum() == 1836 and not (adult.frame["workclass"] == "?").any()
    assert adult.frame["native-country"].str.startswith(" ").sum() == 0  # the source's ", " separators
    mush = loaded["mushroom"]
    assert mush.frame["stalk-root"].isna().sum() == 2480 and set(np.unique(mush.y)) == {"e", "p"}
    soy = loaded["soybean"]
    assert (soy.frame["seed-tmt"] == "none").sum() > 0  # 'none' is a category, not a missing value
    assert loaded["titanic"].y.dtype == np.int64 and loaded["titanic"].frame["age"].isna().sum() == 263
    assert set(loaded["auto_mpg"].frame["origin"]) == {"usa", "europe", "japan"}


def test_suffixes_are_accepted_and_unknown_names_refused():
    assert raw_table_path("titanic.csv") == raw_table_path("titanic.csv.gz") == raw_table_path("titanic")
    with pytest.raises(ValueError, match="unknown raw table 'titanik'.*titanic"):
        load_raw_table("titanik")


def test_a_changed_file_is_refused(tmp_path, monkeypatch):
    text = read_raw_table_text("breast_cancer_ljubljana").replace("premeno", "premenO", 1)
    (tmp_path / "raw").mkdir()
    (tmp_path / "raw" / "breast_cancer_ljubljana.csv").write_text(text)
    monkeypatch.setattr(raw_mod, "_REPO_RAW", None)
    monkeypatch.setenv("TORCHTREE_DATA", str(tmp_path))
    with pytest.raises(ValueError, match="differs from the recorded"):
        load_raw_table("breast_cancer_ljubljana")


def test_torchtree_data_is_the_fallback(tmp_path, monkeypatch):
    src = ROOT / "data" / "raw" / "auto_mpg.csv.gz"
    (tmp_path / "auto_mpg.csv").write_bytes(gzip.decompress(src.read_bytes()))
    monkeypatch.setattr(raw_mod, "_REPO_RAW", tmp_path / "absent")
    monkeypatch.setenv("TORCHTREE_DATA", str(tmp_path))
    assert raw_table_path("auto_mpg") == tmp_path / "auto_mpg.csv"
    assert load_raw_table("auto_mpg").frame.shape == (398, 7)
    monkeypatch.delenv("TORCHTREE_DATA")
    with pytest.raises(FileNotFoundError, match="set TORCHTREE_DATA"):
        load_raw_table("auto_mpg")


# ------------------------------------------------------------------ the synthetic table
@pytest.mark.parametrize("mechanism", ["mcar", "mar", "mnar"])
def test_missing_table_is_seeded_and_has_the_requested_rate(mechanism):
    X, y = missing_table(2000, mechanism, rate=0.2, seed=3)
    X2, y2 = missing_table(2000, mechanism, rate=0.2, seed=3)
    pd.testing.assert_frame_equal(X, X2)
    np.testing.assert_array_equal(y, y2)
    X3, _ = missing_table(2000, mechanism, rate=0.2, seed=4)
    assert not X3.equals(X)
    assert list(X.columns) == ["x1", "x2", "x3", "x4", "cat", "noise1", "noise2"]
    for c in ("x1", "x2", "x3", "cat"):  # binomial sd sqrt(0.2 * 0.8 / 2000) = 0.009: 0.03 is > 3 sd
        assert abs(X[c].isna().mean() - 0.2) < 0.03, (mechanism, c)
    for c in ("x4", "noise1", "noise2"):
        assert X[c].notna().all()
    assert X["cat"].dtype == object and X["cat"].nunique() == 100
    assert set(X["cat"].dropna()) == {f"L{i:03d}" for i in range(100)}
    assert y.dtype == np.int64 and set(np.unique(y)) == {0, 1}


def test_the_complete_values_do_not_depend_on_the_mechanism():
    full, y = missing_table(1000, "mcar", rate=0.0, seed=5)
    assert not full.isna().to_numpy().any()
    for mechanism in ("mcar", "mar", "mnar"):
        X, y2 = missing_table(1000, mechanism, rate=0.3, seed=5)
        np.testing.assert_array_equal(y, y2)
        seen = X["x1"].notna()
        np.testing.assert_array_equal(X.loc[seen, "x1"], full.loc[seen, "x1"])


def test_mnar_missingness_follows_the_hidden_value_and_mcar_does_not():
    full, y = missing_table(4000, "mnar", rate=0.0, seed=7)
    corr = {}
    for mechanism in ("mcar", "mar", "mnar"):
        X, _ = missing_table(4000, mechanism, rate=0.2, seed=7)
        miss = X["x1"].isna().to_numpy()
        corr[mechanism] = np.corrcoef(miss, full["x1"])[0, 1]
        if mechanism == "mar":  # driven by the observed x4
            assert np.corrcoef(miss, full["x4"])[0, 1] > 0.3
    assert corr["mnar"] > 0.4 and abs(corr["mcar"]) < 0.06 and abs(corr["mar"]) < 0.06
    X, _ = missing_table(4000, "mnar", rate=0.2, seed=7)
    miss = X["x1"].isna().to_numpy()
    assert y[miss].mean() - y[~miss].mean() > 0.15  # missingness is informative about the label


def test_missing_table_regression_and_refusals():
    X, y = missing_table(500, "mar", rate=0.1, n_levels=12, task="regression", seed=0)
    assert y.dtype == np.float64 and y.shape == (500,) and X["cat"].nunique() == 12
    with pytest.raises(ValueError, match="missing must be"):
        missing_table(100, "random")
    with pytest.raises(ValueError, match="rate"):
        missing_table(100, rate=1.0)
    with pytest.raises(ValueError, match="task"):
        missing_table(100, task="ranking")
