"""Level labels of categorical columns: how a cell finds its training level (by value, text, number or
truth value), how categories that are not plain labels are kept, the warnings about levels, and the order
of the levels of a many-level column (by mean response, pooling the levels that are more noise than
signal)."""
from __future__ import annotations

import math
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


def level_order(codes: np.ndarray, L: int, y: Optional[np.ndarray]) -> np.ndarray:
    """Rank of each of ``L`` levels in the ordinal coding of a many-level column ([L] int64): levels by
    their smoothed mean response (:func:`level_scores`), ties in label order; without ``y``, the labels'
    order.

    The order is made from the training labels and the posterior takes it as given, so a level whose
    mean is more noise than signal would be placed by its own labels, and rules on the order would fit
    that noise. Such levels share one rank, that of their pooled rows' score, and no rule separates
    them: in the one-way random-effects model ``t_i = m + u_level + e_i``, ``u ~ (0, tau2)``,
    ``e ~ (0, sigma2)``, a level of ``n`` rows is pooled when its mean's reliability
    ``n tau2 / (n tau2 + sigma2)`` is below 1/2, i.e. ``n < sigma2 / tau2``, with ``sigma2`` the pooled
    within-level variance and ``tau2`` a moment estimate of the between-level variance
    (:func:`pooling_rows`; clipped at 0: a column without signal pools every level and is never split). ``t`` is the
    regression target, or the indicator of the most frequent class.
    """
    n = np.bincount(codes, minlength=L)
    rare = np.zeros(L, dtype=bool)
    if y is not None:
        rare = n < pooling_rows(codes, L, level_target(y))
    unit = np.arange(L)
    if rare.sum() > 1:
        unit[rare] = np.flatnonzero(rare)[0]  # the pooled levels are one unit, named by its first level
        codes = unit[codes]
    score = level_scores(codes, L, y)
    ids = np.unique(unit)
    rank = np.empty(ids.size, dtype=np.int64)
    rank[np.lexsort((ids, score[ids]))] = np.arange(ids.size)
    return rank[np.searchsorted(ids, unit)]


def level_target(y: np.ndarray) -> np.ndarray:
    """The response a level's score averages: the regression target, or the indicator of the most
    frequent class (float64 [N])."""
    y = np.asarray(y)
    if y.dtype.kind in "iub":
        return (y == np.bincount(y.astype(np.int64)).argmax()).astype(np.float64)
    return y.astype(np.float64)


def pooling_rows(codes: np.ndarray, L: int, t: np.ndarray) -> float:
    """``sigma2 / tau2`` of the one-way random-effects model of ``t`` by level (see :func:`level_order`):
    levels with fewer rows are pooled; ``inf`` when the levels show no between-level variance, 0 when the
    response does not vary within levels. ``sigma2`` is the pooled within-level variance and ``tau2`` the
    unweighted-means moment estimate, ``var(level means) - mean(sigma2 / n_level)``, which counts every
    level once (the ANOVA estimate weighs levels by their rows, and a few large levels of clear effects
    would make it attribute signal to every small one)."""
    n = np.bincount(codes, minlength=L).astype(np.float64)
    present = n > 0
    k, N = int(present.sum()), float(n.sum())
    if k < 2:
        return 0.0
    sums = np.bincount(codes, weights=t, minlength=L)
    sigma2 = float(((t - sums[codes] / n[codes]) ** 2).sum()) / max(N - k, 1.0)
    if sigma2 <= 0.0:
        return 0.0
    means = sums[present] / n[present]
    tau2 = float(means.var(ddof=1)) - sigma2 * float((1.0 / n[present]).mean())
    return sigma2 / tau2 if tau2 > 0.0 else math.inf


def level_scores(codes: np.ndarray, L: int, y: Optional[np.ndarray]) -> np.ndarray:
    """Mean response per level, smoothed by one pseudo-row at the overall mean (zeros without y)."""
    if y is None:
        return np.zeros(L)
    t = level_target(y)
    s = np.bincount(codes, weights=t, minlength=L)
    n = np.bincount(codes, minlength=L)
    return (s + t.mean()) / (n + 1.0)
