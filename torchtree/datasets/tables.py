"""The real tables that torchtree's tests, examples and benchmarks use (UCI copies).

The files live in the source repository's ``data/`` folder (gzip-compressed CSV, one
header row, the label in the last column; sources, licences and hashes in
``data/README.md``). They are not installed with the wheel: an installed package finds
them through the environment variable ``TORCHTREE_DATA`` (a folder holding the same
files, ``.csv`` or ``.csv.gz``).

Lookup order for a file: the repository's ``data/`` folder (found next to the package
of a source checkout or an editable install), then ``$TORCHTREE_DATA``. Every load checks
the SHA-256 of the decompressed CSV text against :data:`TABLES`, so a damaged or
different copy is refused rather than silently benchmarked.

Example
-------
>>> from torchtree.datasets import load_table
>>> t = load_table("iris")
>>> t.X.shape, t.y.shape, t.task
((150, 4), (150,), 'classification')
"""
from __future__ import annotations

import gzip
import hashlib
import io
import os
from pathlib import Path
from typing import List, NamedTuple, Optional

import numpy as np

__all__ = ["TABLES", "Table", "data_dir", "table_path", "read_table_text", "load_table", "find_file", "checked_text"]

# name -> (SHA-256 of the CSV text, task). The task says how the last column is read:
# classification labels as int64 codes, regression targets as float64.
TABLES = {
    "abalone": ("2c6d03a9dc785246aa2801585edbc2dfe9dc2e96d1825949f6b8c07498578344", "regression"),
    "breast_cancer_wisconsin_original": ("999605937611ec0e3a71efac580bb7f2551ce600d62da711c3f8d52c28cb4d4b", "classification"),
    "heart_cleveland": ("9adac65247f576c4653bb802a3205bd277913abb2247ed5d70de01fc240f1fed", "classification"),
    "heart_statlog": ("be823610c140e500ca4b5f18db116ba71a6da19dae1a68c5cc7f18efd3259c68", "classification"),
    "iris": ("7b3e4d3006a59de48e65a78aa30f8dedfad71512cf7ebdc3e604a33730b0d2da", "classification"),
    "letter": ("8adc3aa60d496bf76c6cea3a3bb3ba7ea33f479d310d2a2efa5fe2deff07174e", "classification"),
    "madelon_train": ("a1bf4c5bd510bf2644daad64fa9c3299fb91a845dd324dd1599841198e4f52c0", "classification"),
    "madelon_valid": ("d9f2d78c0c8cd9acceadecf3440f658782253a33407cab4b126db443929f0b4d", "classification"),
    "magic04": ("61636fef5fe19a3f5c66f6a76f81650b0c28fff5a8ab700af9e385c00b2c4fef", "classification"),
    "pendigits_test": ("6bb015945288925e74b312be8edeb869b71559947eebfebe12214c9314b23c3a", "classification"),
    "pendigits_train": ("c0e8a55265827127789aae55250ef4a7e1e2efee2ca2f31da9f0a3349299b16c", "classification"),
    "pima_diabetes": ("c62fdc4685d8e47c2a80e2303f88caa99afaeeadea58873fcafffcf288c3c7be", "classification"),
    "raisin": ("d1c5fc79006444f371e5e0fefde769c384dc5c343ebeb85693c8c590ce87dfe5", "classification"),
    "students_dropout": ("b33910b5a5ad122eeffdb7756b49ad30c9d3c2f775b03c931d8085d2ecfb956d", "classification"),
    "wine": ("e0554974d8f620d5223caddfca4887522eee4dd812b575f20a9c5d5025c5101c", "classification"),
}

_REPO = Path(__file__).resolve().parents[2]
# a source checkout (or an editable install) has pyproject.toml beside data/; an installed
# wheel has neither, whatever folder happens to sit two levels above site-packages/torchtree
_REPO_DATA = _REPO / "data" if (_REPO / "pyproject.toml").is_file() else None


class Table(NamedTuple):
    """One loaded table.

    Attributes
    ----------
    X : numpy.ndarray [n, d] float64, the features
    y : numpy.ndarray [n], int64 class codes (classification) or float64 targets (regression)
    feature_names : list of str [d], the CSV header's names of the feature columns
    target_name : str, the name of the target column
    task : {"classification", "regression"}
    sha256 : str, of the CSV text, checked against the recorded one when the table is read
    """

    X: np.ndarray
    y: np.ndarray
    feature_names: List[str]
    target_name: str
    task: str
    sha256: str


def _known(name: str) -> str:
    stem = name.removesuffix(".gz").removesuffix(".csv")
    if stem not in TABLES:
        raise ValueError(f"unknown table {name!r}; the tables are: {', '.join(sorted(TABLES))}")
    return stem


def data_dir() -> Optional[Path]:
    """The folder the tables are read from: the repository's ``data/`` if present, else
    ``$TORCHTREE_DATA`` if set, else ``None``."""
    if _REPO_DATA is not None and _REPO_DATA.is_dir():
        return _REPO_DATA
    env = os.environ.get("TORCHTREE_DATA", "").strip()
    return Path(env) if env else None


def find_file(stem: str, folders: List[Path], what: str, hint: str) -> Path:
    """The first ``STEM.csv.gz`` or ``STEM.csv`` in ``folders``, in order.

    Raises
    ------
    FileNotFoundError
        In none of them, naming ``what`` (e.g. ``"table 'iris'"``), the folders searched and ``hint``.
    """
    for folder in folders:
        for fname in (f"{stem}.csv.gz", f"{stem}.csv"):
            if (folder / fname).is_file():
                return folder / fname
    searched = ", ".join(str(f) for f in folders) or "no folder: not a source checkout and TORCHTREE_DATA unset"
    raise FileNotFoundError(f"{what} not found (searched {searched}). {hint}")


def checked_text(path: Path, sha256: str) -> str:
    """The CSV text of ``path`` (gunzipped for ``.gz``), after checking its SHA-256 against ``sha256``.

    Raises
    ------
    ValueError
        The file's content is not the recorded one.
    """
    raw = path.read_bytes()
    if path.suffix == ".gz":
        raw = gzip.decompress(raw)
    digest = hashlib.sha256(raw).hexdigest()
    if digest != sha256:
        raise ValueError(f"{path}: SHA-256 {digest} differs from the recorded {sha256} "
                         "(a damaged or different copy; see data/README.md)")
    return raw.decode("ascii")


def table_path(name: str) -> Path:
    """Path of a table's file (``NAME.csv.gz`` or ``NAME.csv``), in lookup order.

    Parameters
    ----------
    name : str
        A key of :data:`TABLES` (a ``.csv`` / ``.csv.gz`` suffix is accepted).

    Raises
    ------
    ValueError
        ``name`` is not a key of :data:`TABLES` ("unknown table ..."; the message lists the tables).
    FileNotFoundError
        In neither folder, with the folders searched and what to do.
    """
    stem = _known(name)
    folders = [] if _REPO_DATA is None else [_REPO_DATA]
    env = os.environ.get("TORCHTREE_DATA", "").strip()
    if env:
        folders.append(Path(env))
    return find_file(stem, folders, f"table {stem!r}",
                     "The tables ship with torchtree's source repository (its data/ folder), not with the installed "
                     f"package: set TORCHTREE_DATA to a folder holding {stem}.csv.gz or {stem}.csv")


def read_table_text(name: str) -> str:
    """The CSV text of a table, after checking its SHA-256.

    Parameters
    ----------
    name : str
        A key of :data:`TABLES` (a ``.csv`` / ``.csv.gz`` suffix is accepted).

    Raises
    ------
    ValueError
        ``name`` is not a key of :data:`TABLES` ("unknown table ..."), or the file's content is
        not the recorded one.
    FileNotFoundError
        The file is in none of the folders searched (see :func:`table_path`).
    """
    stem = _known(name)
    return checked_text(table_path(stem), TABLES[stem][0])


def load_table(name: str) -> Table:
    """Load one table: features as float64, the last column as the label / target.

    Parameters
    ----------
    name : str
        A key of :data:`TABLES` (``"magic04"``, ``"iris"``, ...; a ``.csv`` / ``.csv.gz``
        suffix is accepted).

    Returns
    -------
    Table
        ``X [n, d]`` float64; ``y [n]`` int64 for classification tables, float64 for
        regression (``abalone``: the ring count); column names from the header.

    Raises
    ------
    ValueError, FileNotFoundError
        As :func:`read_table_text`: an unknown name or altered content; a file in none of the folders.
    """
    stem = _known(name)
    text = read_table_text(stem)
    header = text.split("\n", 1)[0].split(",")
    arr = np.loadtxt(io.StringIO(text), delimiter=",", skiprows=1, dtype=np.float64, ndmin=2)
    task = TABLES[stem][1]
    y = arr[:, -1].astype(np.int64) if task == "classification" else arr[:, -1].copy()
    return Table(np.ascontiguousarray(arr[:, :-1]), y, header[:-1], header[-1], task, TABLES[stem][0])
