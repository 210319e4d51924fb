"""Real tables with their missing values and string categories left in (``data/raw/``).

The tables of :mod:`torchtree.datasets.tables` are all-numeric, with the rows that had
missing values dropped or the categories coded. The tables here are the opposite: each
file keeps the source's values as they were, so that a method that handles missing values
and categorical columns itself (as scikit-learn's HistGradientBoosting does) can be
compared with one that needs imputation and one-hot encoding first.

Every file is a gzip-compressed CSV (``data/raw/NAME.csv.gz``; sources, licences,
transformations and hashes in ``data/README.md``, section "Raw tables"):

* one header row, then one row per instance, **the label in the last column**, kept as the
  source wrote it (a string such as ``'>50K'`` or ``'e'``, or a number);
* a missing cell is an empty cell (the sources' markers, such as UCI's ``?``, were
  replaced by nothing);
* a string column holds the source's category names, a numeric column numbers.

Lookup order for a file: the repository's ``data/raw/`` folder (a source checkout or an
editable install), then ``$TORCHTREE_DATA/raw/``, then ``$TORCHTREE_DATA``. Every load
checks the SHA-256 of the decompressed CSV text against :data:`RAW_TABLES`, so a damaged
or different copy is refused.

pandas is needed to load a table (it is not a dependency of torchtree); it is imported
when :func:`load_raw_table` is called.

Example
-------
>>> from torchtree.datasets import load_raw_table
>>> t = load_raw_table("titanic")                        # doctest: +SKIP
>>> t.frame.shape, t.y.shape, t.task                     # doctest: +SKIP
((1309, 7), (1309,), 'classification')
>>> int(t.frame["age"].isna().sum()), t.frame["sex"].dtype  # doctest: +SKIP
(263, dtype('O'))
"""
from __future__ import annotations

import io
import os
from pathlib import Path
from typing import Any, List, NamedTuple

import numpy as np

from torchtree.datasets.tables import checked_text, find_file

__all__ = ["RAW_TABLES", "RawTable", "raw_table_path", "read_raw_table_text", "load_raw_table",
           "raw_string_columns"]

# name -> (SHA-256 of the CSV text, task). Classification labels are returned as the
# source wrote them (strings, or integers for titanic); regression targets as float64.
RAW_TABLES = {
    "adult": ("5138b5b5c98caed85f1d168fa268339cfe6e9d033c3957515ab3a00396877174", "classification"),
    "auto_mpg": ("b9a586ebd5e867a3d707ed8d9d8b02a562cf8fb22dc1a29206341111f574bf29", "regression"),
    "automobile": ("79f7ab38198bb6a2d1870211616744f1e361a42a8d84d9acf8de3262e9818a74", "regression"),
    "breast_cancer_ljubljana": ("68548cc45d3142523163743cb6d08a811950884cc2fbe83dc3f1acdb4b297491", "classification"),
    "mushroom": ("02c1173e22944692a200fe4bc4356694cdc3906396fccf4b1e043c96a7d0a9d3", "classification"),
    "soybean": ("5b8bde322774734e6d5acf755b85b845cffbff26434dea5a7bb5d6ca96a27f9c", "classification"),
    "titanic": ("f19cad7c1aae556be1e3db83520698ff57bb615bc179a5c3f97a209786fa3f1e", "classification"),
}

_REPO = Path(__file__).resolve().parents[2]
# as in tables.py: only a source checkout (pyproject.toml beside data/) has a repository data folder
_REPO_RAW = _REPO / "data" / "raw" if (_REPO / "pyproject.toml").is_file() else None


class RawTable(NamedTuple):
    """One loaded raw table.

    frame : pandas.DataFrame
        The features, in the file's column order: numeric columns as float64 or int64,
        string columns as ``object`` columns of ``str``; a missing cell is ``NaN`` in both.
    y : numpy.ndarray [n]
        The label: the source's class names (``object`` array of ``str``, or int64 where
        the source codes the classes as integers) or, for regression, a float64 target.
    task : str
        ``"classification"`` or ``"regression"``.
    name : str
        The table's key in :data:`RAW_TABLES`.
    target_name : str
        The header of the label column.
    sha256 : str
        SHA-256 of the CSV text (checked at load).
    """

    frame: Any
    y: np.ndarray
    task: str
    name: str
    target_name: str
    sha256: str


def _known(name: str) -> str:
    stem = name.removesuffix(".gz").removesuffix(".csv")
    if stem not in RAW_TABLES:
        raise ValueError(f"unknown raw table {name!r}; the raw tables are: {', '.join(sorted(RAW_TABLES))}")
    return stem


def _folders() -> List[Path]:
    out = [] if _REPO_RAW is None else [_REPO_RAW]
    env = os.environ.get("TORCHTREE_DATA", "").strip()
    if env:
        out += [Path(env) / "raw", Path(env)]
    return out


def raw_table_path(name: str) -> Path:
    """Path of a raw table's file (``NAME.csv.gz`` or ``NAME.csv``), in lookup order.

    Parameters
    ----------
    name : str
        A key of :data:`RAW_TABLES` (a ``.csv`` / ``.csv.gz`` suffix is accepted).

    Raises
    ------
    ValueError
        ``name`` is not a key of :data:`RAW_TABLES`.
    FileNotFoundError
        In none of the folders, with the folders searched and what to do.
    """
    stem = _known(name)
    return find_file(stem, _folders(), f"raw table {stem!r}",
                     "The raw tables ship with torchtree's source repository (its data/raw/ folder), not with the "
                     f"installed package: set TORCHTREE_DATA to a folder holding raw/{stem}.csv.gz (or {stem}.csv.gz)")


def read_raw_table_text(name: str) -> str:
    """The CSV text of a raw table, after checking its SHA-256.

    Parameters
    ----------
    name : str
        A key of :data:`RAW_TABLES` (a ``.csv`` / ``.csv.gz`` suffix is accepted).

    Raises
    ------
    ValueError
        ``name`` is not a key of :data:`RAW_TABLES` ("unknown raw table ..."), or the file's
        content is not the recorded one.
    FileNotFoundError
        The file is in none of the folders searched (see :func:`raw_table_path`).
    """
    stem = _known(name)
    return checked_text(raw_table_path(stem), RAW_TABLES[stem][0])


def _pandas():
    try:
        import pandas
    except ImportError as exc:  # pragma: no cover - pandas is in the development environment
        raise ImportError("load_raw_table needs pandas, which torchtree does not install: "
                          "pip install pandas") from exc
    return pandas


def raw_string_columns(frame) -> List[str]:
    """The names of a frame's string (non-numeric, non-boolean) columns, in order."""
    return [c for c in frame.columns if frame[c].dtype.kind not in "biufc"]


def load_raw_table(name: str) -> RawTable:
    """Load one raw table: the features as a DataFrame with ``NaN`` for missing cells.

    Parameters
    ----------
    name : str
        A key of :data:`RAW_TABLES` (``"adult"``, ``"titanic"``, ...; a ``.csv`` /
        ``.csv.gz`` suffix is accepted).

    Returns
    -------
    RawTable
        ``frame`` (string columns as ``object`` columns of ``str``, whatever pandas'
        default string type), ``y``, ``task``, ``name``, ``target_name``, ``sha256``.

    Raises
    ------
    ImportError
        pandas is not installed.
    ValueError
        Unknown name, or the file's hash is not the recorded one.
    FileNotFoundError
        The file is in none of the folders searched.

    Notes
    -----
    Only an empty cell is read as missing: the strings that pandas would otherwise take for
    missing (``"NA"``, ``"None"``, ``"nan"``, ...) are category names like any other.
    """
    pd = _pandas()
    stem = _known(name)
    text = read_raw_table_text(stem)
    df = pd.read_csv(io.StringIO(text), keep_default_na=False, na_values=[""])
    target = df.columns[-1]
    frame = df.iloc[:, :-1].copy()
    for c in raw_string_columns(frame):
        col = frame[c].astype(object)
        frame[c] = col.where(col.notna(), np.nan)
    task = RAW_TABLES[stem][1]
    ycol = df[target]
    if task == "regression":
        y = ycol.to_numpy(dtype=np.float64)
    elif ycol.dtype.kind in "iu":
        y = ycol.to_numpy(dtype=np.int64)
    else:
        y = np.asarray(ycol.astype(object).to_numpy(), dtype=object)
    return RawTable(frame, y, task, stem, str(target), RAW_TABLES[stem][0])
