"""Reading a prediction file's features for a fitted model: its columns matched to the model's.

By name when the file's header has the model's feature columns (in another case where that is
unambiguous), else by count; the target column may stay. A file without its header row, whose first
data row would be taken for the names, is refused.
"""
from __future__ import annotations

from typing import Optional, Sequence

from torchtree.io.csv import Table, all_numbers, read_csv, read_header, read_once

__all__ = ["read_features"]


def read_features(path: str, n_features: int, feature_names: Optional[Sequence[str]] = None,
                  target_name: Optional[str] = None) -> Table:
    """Read the features a fitted model takes from a CSV file, ignoring its target column.

    By name when the file has every training feature column (a name in another case
    matches where that is unambiguous; the target column may stay and may hold
    anything); an error when it has only some of them; when it has none of them, by count:
    ``n_features`` columns are all features, ``n_features + 1`` columns are the
    features and the target (the column named ``target_name``, else the last).
    When the target column is present, ``Table.y`` holds it (as strings). A file read by count where the
    model has feature names sets ``Table.by_position`` to them.

    Raises
    ------
    ValueError
        The columns match neither by name nor by count, or rows are malformed.
    """
    path = read_once(path)
    header = read_header(path)
    dup = sorted({h for h in header if header.count(h) > 1})
    if dup:  # before matching names: a duplicate would read as a missing feature column
        raise ValueError(f"{path}: duplicate column name(s) in the header: {', '.join(dup)}")
    names = list(feature_names) if feature_names else None
    lowered = [h.lower() for h in header]
    twins = [n for n in (names or []) if n not in header and lowered.count(n.lower()) > 1]
    if twins:  # a feature missing by its name that two columns spell in other cases: which one is meant?
        spelt = [h for h in header if h.lower() == twins[0].lower()]
        raise ValueError(f"{path}: columns {', '.join(map(repr, spelt))} all match the model's feature {twins[0]!r} "
                         "in another case; rename the file's columns as in training")
    found = _match_names(names, header) if names else {}
    if names and found and len(found) < len(names):
        # taking the columns by position would pair some features with other columns' values
        missing = [n for n in names if n not in found]
        extra = [h for h in header if h not in found.values() and not _same_name(h, target_name)]
        raise ValueError(
            f"{path}: only some of the model's feature columns are present: missing {', '.join(map(repr, missing))}"
            + (f"; not used in training: {', '.join(map(repr, extra))}" if extra else "")
            + f" (the model takes {', '.join(map(repr, names))})")
    if names and found:
        extra = [h for h in header if h not in found.values() and not _same_name(h, target_name)]
        if extra:  # a column the model never saw: dropping it in silence could hide a wrong file
            raise ValueError(f"{path}: column(s) {', '.join(map(repr, extra))} were not used in training; remove them "
                             f"(the model takes {', '.join(map(repr, names))}"
                             + (f", and the target {target_name!r} may stay)" if target_name else ")"))
        in_file = [found[n] for n in names]
        target = next((h for h in header if _same_name(h, target_name)), None)
        table = None
        if target is not None:  # one read keeps the target for evaluation, when its cells parse
            try:
                table = read_csv(path, target=target, features=in_file)
                table.target_name = target_name
            except ValueError:
                table = None
        if table is None:
            table = read_csv(path, has_target=False, features=in_file)
        table.feature_names = names
        return table
    D = len(header)
    if names and D in (n_features, n_features + 1) and all_numbers(header[:n_features]):
        # a file without its header row: read by count, its first data row would be taken for the header and
        # dropped, and every prediction after it would sit one row off its input
        raise ValueError(f"{path}: line 1 holds only numbers in the feature columns ({','.join(header[:4])}"
                         f"{',...' if D > 4 else ''}): the first line must be a header row naming the columns; add "
                         f"one (the model takes {', '.join(map(repr, names))})")
    if D == n_features:
        table = read_csv(path, has_target=False)
    elif D == n_features + 1:
        table = read_csv(path, target=target_name if target_name in header else D - 1)
    else:
        table = None
    if table is not None:
        table.by_position = names  # the caller says so: a file of other names in another order reads wrong
        return table
    expect = f" ({', '.join(names)})" if names else ""
    raise ValueError(
        f"{path}: has {D} columns but the model takes {n_features} features{expect}, "
        f"optionally followed by the target column"
    )


def _same_name(a: Optional[str], b: Optional[str]) -> bool:
    return a is not None and b is not None and a.lower() == b.lower()


def _match_names(names: Sequence[str], header: Sequence[str]) -> dict:
    """The header column of each model feature found in it: by its exact name, else by its name in
    another case where that is unambiguous (``Age`` for ``age``), as the target is matched."""
    lowered = [h.lower() for h in header]
    out = {}
    for n in names:
        if n in header:
            out[n] = n
        elif lowered.count(n.lower()) == 1 and sum(1 for m in names if m.lower() == n.lower()) == 1:
            out[n] = header[lowered.index(n.lower())]
    return out
