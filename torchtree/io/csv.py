"""Reading CSV files for the command line (no pandas: the ``csv`` module and numpy).

A file has one header row and one row per instance. Feature cells are numbers,
text (a categorical column's labels) or empty (a missing value); in a column of
numbers, text spelling a missing value (``n/a``, ``NA``, ``?``, ...:
``torchtree.io.cells.MISSING_TOKENS``) is a missing value too; the target
column (named, or the last one) may hold numbers or strings (class labels such
as ``setosa``). Problems are reported with their line numbers, all
of them up to a limit, in one ``ValueError``::

    data.csv: 2 malformed rows:
      line 7: expected 5 fields, got 4
      line 9: column 'x2': 'inf' is not a finite number

``.gz`` files are read through gzip. Blank lines are skipped (a line of separators
only, ``,,,``, is a row of empty cells, as pandas reads it); a UTF-8 byte
order mark and whitespace around fields are ignored; the delimiter is a comma
unless the header has none and has semicolons or tabs instead, or a first line
``sep=;`` (as Excel writes) names it. The decimal mark is ``.``.

The target column may not miss a value: an empty cell or ``nan`` is refused with
its line, and so is a cell spelling a missing value (``NA``, ``?``, ...) in a
target whose other cells are numbers; among text labels such a cell is a class,
with a warning.

A file whose data rows are all plain (as many fields as the header, no quote, no
blank line, every feature cell a finite number) is read by numpy's C parser, with
the same result as the general reader (the CLI page gives the speed).
"""
from __future__ import annotations

import csv
import gzip
import io
import math
import os
import re
import stat
import zlib
from dataclasses import dataclass, field
from typing import Any, Iterator, List, Optional, Sequence, Tuple, Union

import numpy as np

from torchtree.core.warn import warn
from torchtree.io.cells import is_missing_token, is_number
from torchtree.io.checkpoint import atomic_write

__all__ = ["Table", "read_csv", "read_header", "parse_target", "infer_task", "write_csv", "all_numbers", "read_once",
           "InputBytes"]

#: How many malformed rows one error message lists.
MAX_REPORTED = 10


@dataclass
class Table:
    """A CSV file split into a numeric feature matrix and an optional target column.

    Attributes
    ----------
    X : numpy.ndarray [N, D]: float64, or object when a cell is empty (a missing value, NaN) or
        holds text (a categorical column's label, kept as the string)
    y : numpy.ndarray [N] of str or None
        The target column as read (strings); see :func:`parse_target`.
    feature_names : list of str
    target_name : str or None
    lines : numpy.ndarray [N] int
        1-based line number in the file of each row (for error messages).
    path : str
    """

    X: np.ndarray
    y: Optional[np.ndarray]
    feature_names: List[str]
    target_name: Optional[str]
    lines: np.ndarray
    path: str
    header: List[str] = field(default_factory=list)
    #: feature columns holding text: name -> (its first text cell, that cell's line)
    text_columns: dict = field(default_factory=dict)
    #: numeric feature columns with cells spelling a missing value (``n/a``, ``?``, ... :
    #: ``torchtree.io.cells.MISSING_TOKENS``), read as NaN: name -> (the first such cell, its line, how many)
    missing_tokens: dict = field(default_factory=dict)
    #: :func:`torchtree.io.features.read_features`: the model's feature names, when none of them is in the file
    #: and its columns were taken by position instead (else None)
    by_position: Optional[List[str]] = None

    @property
    def n_rows(self) -> int:
        """Number of data rows read (header excluded)."""
        return int(self.X.shape[0])

    @property
    def n_features(self) -> int:
        """Number of feature columns (the target column excluded)."""
        return int(self.X.shape[1])


class InputBytes(str):
    """The name of an input (a pipe, standard input) whose content was read once into memory: the
    readers of this module open the bytes (a pipe cannot be read twice) and name the input in messages."""

    data: bytes = b""

    def __new__(cls, name: str, data: bytes) -> "InputBytes":
        self = super().__new__(cls, name)
        self.data = data
        return self


def read_once(path: str) -> str:
    """``path`` unchanged when it names a regular file (or nothing: the readers then say so); the content
    of anything else (a pipe such as ``/dev/stdin`` fed by ``cat``, a FIFO) read once, as
    :class:`InputBytes`, since the readers look at a file more than once."""
    if isinstance(path, InputBytes):
        return path
    path = os.fspath(path)
    try:
        st = os.stat(path)
    except OSError:
        return path
    if stat.S_ISREG(st.st_mode) or stat.S_ISDIR(st.st_mode):
        return path
    with open(path, "rb") as fh:
        return InputBytes(path, fh.read())


def _open_text(path: str):
    if isinstance(path, InputBytes):
        raw = io.BytesIO(path.data)
        return io.TextIOWrapper(gzip.GzipFile(fileobj=raw) if path.endswith(".gz") else raw, encoding="utf-8-sig",
                                newline="")
    if not os.path.exists(path):
        raise FileNotFoundError(f"{path}: no such file")
    if os.path.isdir(path):
        raise IsADirectoryError(f"{path}: is a directory, not a CSV file")
    raw = gzip.open(path, "rb") if path.endswith(".gz") else open(path, "rb")
    return io.TextIOWrapper(raw, encoding="utf-8-sig", newline="")


def _rows(path: str) -> Iterator[Tuple[int, List[str]]]:
    """(line number, stripped fields) of every non-blank row, header included.

    A ``.gz`` file that is cut short or is not gzip data is a ``ValueError`` naming
    the path (gzip raises EOFError / BadGzipFile / zlib.error part-way through).
    """
    try:
        yield from _rows_of(path)
    except (EOFError, gzip.BadGzipFile, zlib.error) as exc:
        raise ValueError(f"{path}: damaged/truncated gzip file ({exc})") from None


def _preamble(fh, path: str) -> Tuple[int, str, List[str]]:
    """(line number of the header row, delimiter, header fields) of an open file, read up to its header row:
    leading blank lines skipped, Excel's ``sep=`` line obeyed, else a comma unless the header has none and
    has semicolons or tabs."""
    try:
        first = fh.readline()
    except UnicodeDecodeError as exc:
        raise ValueError(f"{path}: not a UTF-8 text file ({exc.reason})") from None
    line_no = 1
    while first and not first.strip():  # leading blank lines
        first = fh.readline()
        line_no += 1
    if not first:
        raise ValueError(f"{path}: the file is empty (expected a header row)")
    delim = ","
    hint = re.fullmatch(r'\s*"?sep=([^"])"?\s*', first.rstrip("\r\n"))
    if hint:  # Excel's first line naming the separator: the header is the next line
        delim = hint.group(1)
        first = fh.readline()
        line_no += 1
        if not first.strip():
            raise ValueError(f"{path}: no header row after the line {hint.group(0).strip()!r}")
    elif "," not in first:
        if ";" in first:
            delim = ";"
        elif "\t" in first:
            delim = "\t"
    return line_no, delim, [f.strip() for f in next(csv.reader([first], delimiter=delim))]


def _rows_of(path: str) -> Iterator[Tuple[int, List[str]]]:
    with _open_text(path) as fh:
        line_no, delim, header = _preamble(fh, path)
        yield line_no, header
        reader = csv.reader(fh, delimiter=delim)
        try:
            for fields in reader:
                # reader.line_num counts physical lines read from fh (quoted newlines included).
                n = line_no + reader.line_num
                if not fields or (len(fields) == 1 and not fields[0].strip()):
                    continue  # a blank line (as pandas skips it); ",,," is a row of empty cells
                yield n, [f.strip() for f in fields]
        except csv.Error as exc:
            raise ValueError(f"{path}: line {line_no + reader.line_num}: {exc}") from None
        except UnicodeDecodeError as exc:
            raise ValueError(f"{path}: not a UTF-8 text file ({exc.reason})") from None


def _plain_numbers(path: str, n_cols: int, f_idx: Sequence[int], t_idx: Optional[int]):
    """``(X, y, lines)`` of a file whose data rows are all plain, read by numpy's C parser (faster
    than the general reader and without its per-cell Python objects), else None, and the general reader
    reads the file with its messages. Plain: every line after the header has ``n_cols`` fields, no quote,
    no blank line, every feature cell a finite number and every target cell non-empty; the results are
    then those of the general reader (Python's ``float`` of each stripped cell; target cells stripped)."""
    try:
        with _open_text(path) as fh:
            line_no, delim, _ = _preamble(fh, path)
            text = fh.read()
    except (ValueError, UnicodeDecodeError, EOFError, OSError, zlib.error):
        return None
    if '"' in text or "\x00" in text or len(delim.encode()) != 1 or not text.strip():
        return None  # NUL: numpy strips it from text cells; quotes: csv's quoting
    raw = np.frombuffer(text.encode(), dtype=np.uint8)
    ends = np.flatnonzero(raw == 10)
    if not text.endswith("\n"):
        ends = np.append(ends, raw.size)
    per_line = np.diff(np.searchsorted(np.flatnonzero(raw == ord(delim)), ends), prepend=0)
    del raw
    if np.diff(ends, prepend=-1).max() > csv.field_size_limit():  # a line that may hold a field csv refuses
        return None
    if not (per_line == n_cols - 1).all():  # a short or long row, or a blank line: the general reader says which
        return None
    try:
        X = np.loadtxt(io.StringIO(text), delimiter=delim, comments=None, usecols=list(f_idx), dtype=np.float64,
                       ndmin=2, encoding=None)
        y = None
        if t_idx is not None:
            y = np.char.strip(np.loadtxt(io.StringIO(text), delimiter=delim, comments=None, usecols=[t_idx],
                                         dtype=str, ndmin=1, encoding=None))
    except ValueError:  # a cell that is not a number: text, an empty cell, a missing-value token
        return None
    if X.shape[0] != ends.size or not np.isfinite(X).all() or (y is not None and (y == "").any()):
        return None
    return X, (y.astype(object) if y is not None else None), line_no + 1 + np.arange(X.shape[0], dtype=np.int64)


def all_numbers(cells: Sequence[str]) -> bool:
    """Every cell of a row is a finite number (a header row names columns; data rows are numbers)."""
    try:
        return bool(cells) and all(math.isfinite(float(c)) for c in cells)
    except ValueError:
        return False


def _to_float(s: str) -> float:
    v = float(s)
    if not math.isfinite(v):
        raise ValueError(s)
    return v


def _resolve_column(header: Sequence[str], column: Union[str, int], path: str, what: str) -> int:
    if isinstance(column, int) or (isinstance(column, str) and column.lstrip("-").isdigit() and column not in header):
        idx = int(column)
        if not -len(header) <= idx < len(header):
            raise ValueError(f"{path}: {what} column index {idx} is out of range (the file has {len(header)} columns)")
        return idx % len(header)
    if column in header:
        return list(header).index(column)
    lowered = [h.lower() for h in header]
    if column.lower() in lowered:
        return lowered.index(column.lower())
    raise ValueError(f"{path}: no column named {column!r}; the columns are: {', '.join(header)}")


def read_csv(
    path: str,
    target: Union[str, int, None] = None,
    *,
    has_target: bool = True,
    features: Optional[Sequence[str]] = None,
    max_reported: int = MAX_REPORTED,
) -> Table:
    """Read a CSV file into features and (optionally) a target column.

    Parameters
    ----------
    path : str
        A ``.csv`` file (or ``.csv.gz``) with a header row.
    target : str or int, optional
        The target column, by name (case-insensitive when unambiguous) or by index
        (negative from the end). Default: the last column.
    has_target : bool
        False reads every column (or those in ``features``) as a feature.
    features : sequence of str, optional
        Read these columns as the features, in this order (prediction on a file
        whose columns were named at training time); other columns are ignored.
    max_reported : int
        At most this many malformed rows are listed in the error.

    Returns
    -------
    Table

    Raises
    ------
    FileNotFoundError
        If ``path`` does not exist.
    ValueError
        Empty file, no data rows, duplicate or unknown column names, or malformed
        rows (wrong number of fields, an infinite feature value, an empty target),
        each listed with its line number.
    """
    path = read_once(path)
    it = _rows(path)
    _, header = next(it)
    if not any(header):
        raise ValueError(f"{path}: line 1: the header row is empty")
    if all_numbers(header):
        # a file without a header row: its first row of data would silently become the column names
        raise ValueError(f"{path}: line 1 holds only numbers ({','.join(header[:4])}{',...' if len(header) > 4 else ''}): "
                         "the first line must be a header row naming the columns; add one")
    numbers = [h for h in header if all_numbers([h])]
    if 2 * len(numbers) > len(header):
        warn(f"{path}: line 1 is read as the header row, but {len(numbers)} of its {len(header)} cells are numbers "
             f"({', '.join(numbers[:3])}{', ...' if len(numbers) > 3 else ''}): if the file has no header row, add "
             "one naming the columns (its first row of data is taken as the column names)")
    header = [h if h else f"column{i + 1}" for i, h in enumerate(header)]
    dup = sorted({h for h in header if header.count(h) > 1})
    if dup:
        raise ValueError(f"{path}: duplicate column name(s) in the header: {', '.join(dup)}")
    n_cols = len(header)
    t_idx: Optional[int] = None
    if features is not None:
        missing = [f for f in features if f not in header]
        if missing:
            raise ValueError(f"{path}: missing feature column(s) {', '.join(map(repr, missing))}; the columns are: {', '.join(header)}")
        f_idx = [header.index(f) for f in features]
        if has_target and target is not None and target in header:
            t_idx = header.index(target)
    else:
        if has_target:
            if n_cols < 2:
                raise ValueError(f"{path}: needs at least two columns (features and a target), found {n_cols}")
            t_idx = n_cols - 1 if target is None else _resolve_column(header, target, path, "target")
        f_idx = [i for i in range(n_cols) if i != t_idx]
    plain = _plain_numbers(path, n_cols, f_idx, t_idx) if f_idx else None
    if plain is not None:
        it.close()
        X, y, lines = plain
        return Table(X=X, y=y, feature_names=[header[j] for j in f_idx],
                     target_name=header[t_idx] if t_idx is not None else None, lines=lines, path=str(path), header=header)
    errors: List[str] = []
    n_errors = 0
    coded = False  # a missing cell or a text cell: X is then an object array
    text: dict = {}  # text column -> (first text cell, its line)
    tokens: dict = {}  # column -> [first cell spelling a missing value, its line, how many]
    X_rows: List[List[Any]] = []
    y_vals: List[str] = []
    lines: List[int] = []

    def err(msg: str) -> None:
        nonlocal n_errors
        n_errors += 1
        if len(errors) < max_reported:
            errors.append(msg)

    for line, fields in it:
        if len(fields) != n_cols:
            err(f"line {line}: expected {n_cols} fields, got {len(fields)}")
            continue
        row: List[Any] = []
        bad = False
        for j in f_idx:
            s = fields[j]
            try:
                v = float(s)
            except ValueError:  # a text label (a categorical column), or an empty cell (a missing value)
                coded = True
                row.append(math.nan if s == "" else s)
                if s == "":
                    pass
                elif is_missing_token(s):  # missing, unless the column turns out to hold text (then a level)
                    first = tokens.setdefault(header[j], [s, line, 0])
                    first[2] += 1
                elif header[j] not in text:
                    text[header[j]] = (s, line)
                continue
            if math.isinf(v):
                err(f"line {line}: column {header[j]!r}: {s!r} is not a finite number")
                bad = True
                break
            coded = coded or math.isnan(v)
            row.append(v)
        if bad:
            continue
        if t_idx is not None:
            if fields[t_idx] == "":
                err(f"line {line}: target column {header[t_idx]!r} is empty")
                continue
            y_vals.append(fields[t_idx])
        X_rows.append(row)
        lines.append(line)
    if n_errors:
        more = f"\n  ... and {n_errors - len(errors)} more" if n_errors > len(errors) else ""
        raise ValueError(f"{path}: {n_errors} malformed row{'s' if n_errors > 1 else ''}:\n  " + "\n  ".join(errors) + more)
    if not X_rows:
        raise ValueError(f"{path}: no data rows after the header")
    if not f_idx:
        raise ValueError(f"{path}: no feature columns")
    tokens = {name: tuple(v) for name, v in tokens.items() if name not in text}
    for name in tokens:  # a column of numbers: its cells spelling a missing value are missing
        k = [header[j] for j in f_idx].index(name)
        for row in X_rows:
            if isinstance(row[k], str):
                row[k] = math.nan
    return Table(
        X=np.asarray(X_rows, dtype=object if coded else np.float64).reshape(len(X_rows), len(f_idx)),
        y=np.asarray(y_vals, dtype=object) if t_idx is not None else None,
        feature_names=[header[j] for j in f_idx],
        target_name=header[t_idx] if t_idx is not None else None,
        lines=np.asarray(lines, dtype=np.int64),
        path=str(path),
        header=header,
        text_columns=text,
        missing_tokens=tokens,
    )


def _is_missing_cell(s) -> bool:
    """An empty cell or a NaN (``nan``, ``NaN``, ...): a missing value, never a label."""
    s = str(s).strip()
    if s == "":
        return True
    try:
        return math.isnan(float(s))
    except ValueError:
        return False


def infer_task(y: np.ndarray) -> str:
    """``"regression"`` for a numeric target with a non-integer value, else ``"classification"``.

    Missing cells (empty, ``nan``) do not count: :func:`parse_target` refuses them.

    Parameters
    ----------
    y : numpy.ndarray [N] of str (as read by :func:`read_csv`)
    """
    y = [s for s in y if not (_is_missing_cell(s) or is_missing_token(s))]
    try:
        v = np.asarray([float(s) for s in y], dtype=np.float64)
    except ValueError:
        return "classification"
    if not np.isfinite(v).all():
        return "classification"
    return "classification" if np.all(v == np.round(v)) else "regression"


def parse_target(y: np.ndarray, task: str, lines: Optional[np.ndarray] = None, path: str = "", name: str = "target") -> np.ndarray:
    """Turn a target column read as strings into labels or numbers.

    Parameters
    ----------
    y : numpy.ndarray [N] of str
    task : {"classification", "regression"}
    lines, path, name : for error messages

    Returns
    -------
    numpy.ndarray [N]: float64 (regression); int64 when every label is an integer
    (``"3"`` or ``"3.0"``), else str (classification).

    Raises
    ------
    ValueError
        A missing target (an empty cell or ``nan``: it would otherwise become a class
        of its own), naming the line (or row) and the column.
    """
    # cells spelling a missing value (NA, ?, ...) but not NaN: missing among numbers (refused below), a class
    # among text labels; an empty or NaN cell is a missing target whatever the other cells hold
    tokens = [i for i, s in enumerate(y) if is_missing_token(s) and not _is_missing_cell(s)]
    if tokens:
        rest = [s for i, s in enumerate(y) if not is_missing_token(s) and not _is_missing_cell(s)]
        if not all(is_number(s) for s in rest):
            where = f" (line {int(lines[tokens[0]])})" if lines is not None else f" (row {tokens[0] + 1})"
            warn(f"{path + ': ' if path else ''}{name}: {len(tokens)} cell(s) such as {str(y[tokens[0]])!r}{where} are "
                 "read as a class of their own among the text labels; if they mark missing targets, drop those rows",
                 UserWarning)
            tokens = []
    for i, s in enumerate(y):
        if _is_missing_cell(s) or (tokens and is_missing_token(s)):
            where = f"line {int(lines[i])}: " if lines is not None else f"row {i + 1}: "
            where = f"{path}: {where}" if path else where
            raise ValueError(f"{where}{name} is missing ({str(s)!r}); drop the row or fill in its target")
    if task == "regression":
        out = np.empty(len(y), dtype=np.float64)
        for i, s in enumerate(y):
            try:
                out[i] = _to_float(s)
            except ValueError:
                where = f"line {int(lines[i])}: " if lines is not None else f"row {i + 1}: "
                where = f"{path}: {where}" if path else where
                raise ValueError(f"{where}{name} {str(s)!r} is not a number (a regression target must be numeric; use --task classification for class labels)") from None
        return out
    if task != "classification":
        raise ValueError(f"task must be 'classification' or 'regression', got {task!r}")
    try:
        v = np.asarray([float(s) for s in y], dtype=np.float64)
        if np.isfinite(v).all() and np.all(v == np.round(v)):
            return v.astype(np.int64)
    except ValueError:
        pass
    return np.asarray([str(s) for s in y])


def read_header(path: str) -> List[str]:
    """The column names of a CSV file (its first non-blank row)."""
    it = _rows(read_once(path))
    try:
        _, header = next(it)
    finally:
        it.close()
    return [h if h else f"column{i + 1}" for i, h in enumerate(header)]


def write_csv(path: Optional[str], header: Sequence[str], columns: Sequence[Sequence], out=None) -> None:
    """Write columns to ``path`` (or to the stream ``out`` when ``path`` is None or ``"-"``).

    Floats are written at full precision, as the shortest text that reads back to the same
    number (``repr``; a float32 value as the shortest text of the float32).
    """
    def fmt(v) -> str:
        if isinstance(v, np.floating):
            return str(v)  # numpy's shortest round-trip text of the value in its own precision
        if isinstance(v, float):
            return repr(v)
        return str(v)

    def write(fh) -> None:
        w = csv.writer(fh, lineterminator="\n")
        w.writerow(header)
        for r in zip(*columns):
            w.writerow([fmt(v) for v in r])

    if path is None or path == "-":
        write(out)
        return
    folder = os.path.dirname(os.path.abspath(path))
    if not os.path.isdir(folder):  # say so about the user's path, not the temporary file's
        raise FileNotFoundError(f"{path}: directory {folder} does not exist")
    if os.path.isdir(path):
        raise IsADirectoryError(f"{path}: is a directory; give the path of the CSV file to write")
    # an unpredictable temporary name, created exclusively: not one a planted link can wait at
    atomic_write(path, write, "w", newline="")
