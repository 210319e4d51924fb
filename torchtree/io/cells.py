"""What a table's cell means beside numbers and labels: the text that spells a missing value.

Shared by the CSV reader (:mod:`torchtree.io.csv`) and the table encoder (:mod:`torchtree.model.encoding`),
so that a file and a DataFrame holding the same cells are read alike.
"""
from __future__ import annotations

__all__ = ["MISSING_TOKENS", "is_missing_token", "is_number"]

#: text that spells a missing value, compared stripped and lower-cased: what spreadsheets, R, pandas and the UCI
#: files write for an empty cell. Such a cell is missing in a column whose other cells are numbers; in a column of
#: text it is a level like any other (a category may be called "NA" or "None").
MISSING_TOKENS = frozenset({"na", "n/a", "nan", "null", "none", "?", "-", "--", ".", "<na>", "#n/a", "missing"})


def is_missing_token(v) -> bool:
    """Whether ``v`` is a string in :data:`MISSING_TOKENS` (case and surrounding blanks ignored)."""
    return isinstance(v, str) and v.strip().lower() in MISSING_TOKENS


def is_number(v) -> bool:
    """Whether ``float(v)`` reads ``v`` (a number, or text spelling one; ``nan`` and ``inf`` included)."""
    try:
        float(v)
    except (TypeError, ValueError):
        return False
    return True
