"""Level labels of categorical columns: how a cell finds its training level (by value, text, number or
truth value), how categories that are not plain labels are kept, and the warnings about levels."""
from __future__ import annotations

from typing import Optional

import numpy as np

from torchtree.core.warn import warn
from torchtree.io.cells import is_missing_token, is_number
from torchtree.model.inputs import is_missing_cell

#: categorical columns with at most this many levels get exact subset splits (2^(L-1) - 1 columns)
MAX_SUBSET_LEVELS = 8


def distinct_cells(cells: list):
    """The distinct cells of a column in order of first appearance, each cell's index among them and how many
    cells each stands for: ``(values, index [N] int64, counts [U] int64)``. Cells that are equal dict keys are
    one (``1``, ``1.0`` and ``True``; a NaN only with itself). Work per cell is done in C (hashing), so a column
    of N cells with U levels costs about N hash lookups plus U calls of whatever is then done per level.

    Raises
    ------
    TypeError
        A cell that cannot be hashed (a list, a dict).
    """
    seen = dict.fromkeys(cells)
    for i, v in enumerate(seen):
        seen[v] = i
    index = np.fromiter(map(seen.__getitem__, cells), dtype=np.int64, count=len(cells))
    return list(seen), index, np.bincount(index, minlength=len(seen))


def label_of(v):
    """A category as a level label: numbers, text and booleans as they are; other objects (pandas
    ``Interval`` of ``pd.cut``, ``Timestamp``, ...) as their text, which is also how a saved model keeps
    them."""
    if isinstance(v, (str, bool, int, float, np.bool_, np.integer, np.floating)):
        return v
    return str(v)


def find_level(lookup: dict, v) -> Optional[int]:
    """The code of label ``v``: itself, else its text (``1`` for ``"1"``), its number (``"1"`` for ``1.0``)
    or its truth value (``"True"`` for ``True``, as a CSV read as text spells it)."""
    k = lookup.get(v)
    if k is not None:
        return k
    if not isinstance(v, str):
        return lookup.get(str(v))
    if is_number(v):
        return lookup.get(float(v))
    t = v.strip().lower()
    if t in ("true", "false"):
        k = lookup.get(t == "true")
        return k if k is not None and any(isinstance(u, (bool, np.bool_)) for u in lookup) else None
    return None


def warn_unseen(where: str, unseen: int, present: int, first, levels: list, has_missing: bool) -> None:
    """Warn where more than half of a column's present cells hold levels not seen in training."""
    if unseen * 2 <= present:
        return
    seen = ", ".join(repr(v) for v in levels[:5] if v is not None) + (", ..." if len(levels) > 5 else "")
    warn(f"X {where}: {unseen} of {present} cells hold levels not seen in fit (such as {first!r}; fit "
         f"saw {seen}); they predict as {'missing values' if has_missing else 'the most frequent level'}",
         UserWarning)


def warn_mostly_numbers(col: np.ndarray, where: str) -> None:
    """Warn where a column read as categorical (it holds text) has more levels than subset splits take and most
    of them are numbers: a stray word in a numeric column, which would make every number a level of its own."""
    try:
        distinct = dict.fromkeys(col.tolist())
    except TypeError:  # cells that are not labels (lists, dicts): refused when the levels are made
        return
    if len(distinct) <= MAX_SUBSET_LEVELS:
        return
    levels = [v for v in distinct if not (is_missing_cell(v) or is_missing_token(v))]
    numbers = sum(1 for v in levels if is_number(v))
    if len(levels) > MAX_SUBSET_LEVELS and numbers * 2 > len(levels):
        warn(f"X {where} holds text ({first_text(col)!r}) among numbers ({numbers} of its {len(levels)} "
             "levels): read as categorical. If the text marks a missing value, replace it with NaN; "
             "categorical_features=None refuses text columns", UserWarning)



def first_text(col: np.ndarray):
    """The first cell that is neither missing nor a number."""
    for v in col.tolist():
        if not (is_missing_cell(v) or is_missing_token(v) or is_number(v)):
            return v
    return None
