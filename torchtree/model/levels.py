"""Level labels of categorical columns: how a cell finds its training level (by value, text, number or
truth value), how categories that are not plain labels are kept, the warnings about levels, and the order
of the levels of a many-level column (by mean response, pooling the levels that are more noise than
signal)."""
from __future__ import annotations

import math
import re
from typing import Optional

import numpy as np

from torchtree.core.warn import warn
from torchtree.io.cells import is_missing_token, is_number
from torchtree.model.inputs import is_missing_cell

#: categorical columns with at most this many levels get exact subset splits (2^(L-1) - 1 columns)
MAX_SUBSET_LEVELS = 8


def distinct_cells(cells: list):
    """The distinct cells of a column in order of first appearance, each cell's index among them and how many
    cells each stands for: ``(values, index [N] int64, counts [U] int64)``. Cells are one when they are equal
    and of one type (``1`` and ``1.0`` stay apart, as a label looked up cell by cell would find them apart; a
    NaN is one only with itself). Work per cell is done in C (hashing), so a column of N cells with U
    distinct values costs about N hash lookups plus U calls of whatever is then done per value.

    Raises
    ------
    TypeError
        A cell that cannot be hashed (a list, a dict).
    """
    keys = list(zip(map(type, cells), cells))
    seen = dict.fromkeys(keys)
    for i, key in enumerate(seen):
        seen[key] = i
    index = np.fromiter(map(seen.__getitem__, keys), dtype=np.int64, count=len(keys))
    return [v for _, v in seen], index, np.bincount(index, minlength=len(seen))


def label_of(v):
    """A category as a level label: numbers, text and booleans as they are; other objects (pandas
    ``Interval`` of ``pd.cut``, ``Timestamp``, ...) as their text, which is also how a saved model keeps
    them."""
    if isinstance(v, (str, bool, int, float, np.bool_, np.integer, np.floating)):
        return v
    return str(v)


def find_level(lookup: dict, v) -> Optional[int]:
    """The code of label ``v``: itself, else its text (``1`` for ``"1"``; an integral float, as a numeric
    column of a table arrives, also as its integer's text: ``1.0`` for ``"1"``), its number (``"1"`` for
    ``1.0``) or its truth value (``"True"`` for ``True``, as a CSV read as text spells it; ``True``, ``1`` or
    ``1.0``, or ``"True"``, for a level spelt ``true`` in any case, where no level is the number itself)."""
    k = lookup.get(v)
    if k is not None:
        return k
    if not isinstance(v, str):
        k = lookup.get(str(v))
        if k is None and isinstance(v, (float, np.floating)) and math.isfinite(v) and float(v).is_integer():
            k = lookup.get(str(int(v)))
        if k is None and isinstance(v, (bool, np.bool_, int, np.integer, float, np.floating)) and v in (0, 1):
            k = _truth_level(lookup, bool(v))
        return k
    if is_number(v):
        return lookup.get(float(v))
    t = v.strip().lower()
    if t in ("true", "false"):
        k = lookup.get(t == "true")
        if k is not None and any(isinstance(u, (bool, np.bool_)) for u in lookup):
            return k
        return _truth_level(lookup, t == "true")
    return None


def _truth_level(lookup: dict, b: bool) -> Optional[int]:
    """The code of the level spelt ``true`` (``b``) or ``false`` in any case, if there is one."""
    want = "true" if b else "false"
    for key, code in lookup.items():
        if isinstance(key, str) and key.strip().lower() == want:
            return code
    return None


def warn_unseen(where: str, unseen: int, present: int, first, levels: list, has_missing: bool) -> None:
    """Warn where more than half of a column's present cells hold levels not seen in training."""
    if unseen * 2 <= present:
        return
    seen = ", ".join(repr(v) for v in levels[:5] if v is not None) + (", ..." if len(levels) > 5 else "")
    if isinstance(first, float) and first.is_integer():  # a numeric column's cell, as it was written: 7, not 7.0
        first = int(first)
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



_LEADING_ZERO = re.compile(r"\s*[-+]?0\d")


def text_numbers(col: np.ndarray):
    """``(code, text)`` of a column whose present cells all read as numbers: ``code``, the first cell written as
    text with a leading zero before a digit (``"01"``, ``"02139"``: a code, which no number is written as), else
    None; ``text``, the first cell written as text (None where every cell is a number)."""
    text = None
    for v in dict.fromkeys(c for c in col.tolist() if isinstance(c, str) and not is_missing_token(c)):
        text = v if text is None else text
        if _LEADING_ZERO.match(v):
            return v, text
    return None, text


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
    them: in the one-way random-effects model ``t_i = m + u_level + e_i`` (``u`` of variance ``tau2``,
    ``e`` of variance ``sigma2``), a level of ``n`` rows is pooled when its mean's reliability
    ``n tau2 / (n tau2 + sigma2)`` is below 1/2, i.e. ``n < sigma2 / tau2`` (:func:`pooling_rows`).
    A column without between-level signal, or whose levels all hold one row (an identifier), pools
    every level and is never split.
    """
    n = np.bincount(codes, minlength=L)
    rare = np.zeros(L, dtype=bool)
    if y is not None:
        rare = n < pooling_rows(codes, L, y)
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


def _class_counts(codes: np.ndarray, L: int, y: np.ndarray) -> np.ndarray:
    """Rows of each level in each class: float64 [L, K] (``K = max(y) + 1``)."""
    K = int(y.max()) + 1
    return np.bincount(codes * K + y.astype(np.int64), minlength=L * K).reshape(L, K).astype(np.float64)


def find_levels(lookup: dict, col: np.ndarray, where: Optional[str], levels: list, missing_level: bool):
    """Each distinct cell's level code (:func:`find_level`; None where the cell is missing or its level was not
    seen), whether it is missing, and each cell's index among the distinct cells (:func:`distinct_cells`).
    With ``where``, warns (:func:`warn_unseen`) when most present cells hold unseen levels, which then
    predict as the missing level (``missing_level``) or the most frequent one."""
    uniq, index, counts = distinct_cells(col.tolist())
    miss = np.array([is_missing_cell(v) for v in uniq], dtype=bool)
    found = [None if m else find_level(lookup, v) for v, m in zip(uniq, miss)]
    if where is not None:
        unseen = np.array([k is None for k in found], dtype=bool) & ~miss
        first = uniq[int(np.argmax(unseen))] if unseen.any() else None
        warn_unseen(where, int(counts[unseen].sum()), int(counts[~miss].sum()), first, levels, missing_level)
    return found, miss, index


def _level_sums(codes: np.ndarray, L: int, y: np.ndarray):
    """Per-level rows ``n`` [L], response sums [L, C] and the within-level sum of squares of the responses
    whose between-level variance is signal: the regression target (C = 1), or the indicators of every class
    (C = K: signal in any class counts, not only in the most frequent), from the [L, K] count table (memory
    ``O(L K)``, not ``O(N K)``)."""
    y = np.asarray(y)
    n = np.bincount(codes, minlength=L).astype(np.float64)
    safe = np.maximum(n, 1.0)
    if y.dtype.kind in "iub":
        sums = _class_counts(codes, L, y)
        return n, sums, float(n.sum() - ((sums ** 2).sum(1) / safe).sum())  # sum_l n_l - sum_lc n_lc^2 / n_l
    t = y.astype(np.float64)
    sums = np.bincount(codes, weights=t, minlength=L)
    return n, sums[:, None], float(((t - (sums / safe)[codes]) ** 2).sum())


def pooling_rows(codes: np.ndarray, L: int, y: np.ndarray) -> float:
    """``sigma2 / tau2`` of the one-way random-effects model of the responses by level (see
    :func:`level_order` and :func:`_level_sums`; sums of squares summed over the responses): levels with
    fewer rows are pooled.

    ``inf`` (pool every level) unless the levels' means differ beyond noise: the one-way ANOVA's
    ``F = MS_between / MS_within`` must exceed the upper 5% point of ``F(k - 1, N - k)`` (Paulson's
    normal approximation to ``F^(1/3)``), and there must be within-level degrees of freedom (a column
    whose levels hold one row each is an identifier: nothing tells its signal from noise). Then
    ``sigma2 = MS_within`` and ``tau2 = var(level means) - sigma2 mean(1 / n_level)``, the
    unweighted-means estimate, which counts every level once (weighted by rows, a few large levels of
    clear effects would make every small level look like signal); 0 (pool none) when ``sigma2 = 0``.
    """
    n, sums, within_ss = _level_sums(codes, L, y)
    present = n > 0
    k, N = int(present.sum()), float(n.sum())
    if k < 2:
        return 0.0
    if N - k < 1:
        return math.inf
    within = within_ss / (N - k)
    if within <= 0.0:
        return 0.0
    means = sums[present] / n[present][:, None]
    grand = sums.sum(0) / N
    between = float((n[present][:, None] * (means - grand) ** 2).sum()) / (k - 1)
    if not _f_exceeds(between / within, k - 1, N - k):
        return math.inf
    tau2 = float(means.var(0, ddof=1).sum()) - within * float((1.0 / n[present]).mean())
    return within / tau2 if tau2 > 0.0 else math.inf


def _f_exceeds(F: float, d1: float, d2: float, z: float = 1.6448536269514722) -> bool:
    """Whether ``F`` exceeds the upper 5% point (``z``: the normal's) of the F distribution of ``(d1, d2)``
    degrees of freedom, by Paulson's (1942) normal approximation to ``F^(1/3)``."""
    a, b, c = 2.0 / (9.0 * d1), 2.0 / (9.0 * d2), F ** (1.0 / 3.0)
    return ((1.0 - b) * c - (1.0 - a)) / math.sqrt(b * c * c + a) > z


def level_scores(codes: np.ndarray, L: int, y: Optional[np.ndarray]) -> np.ndarray:
    """Each level's place on a line, from its training rows smoothed by one pseudo-row of the overall mean
    (zeros without y): the mean response (regression), the share of the most frequent class (two classes),
    or, with three classes or more, the projection of the level's class distribution on the first principal
    component of the levels' distributions weighted by their rows (Coppersmith, Hong & Hosking 1999: the
    order along which contiguous runs of levels best separate the classes; the component's sign makes its
    largest entry positive)."""
    if y is None:
        return np.zeros(L)
    y = np.asarray(y)
    n = np.bincount(codes, minlength=L).astype(np.float64)
    if y.dtype.kind in "iub" and int(y.max()) >= 2:
        counts = _class_counts(codes, L, y)
        p = counts.sum(0) / counts.sum()
        dev = (counts + p) / (n + 1.0)[:, None] - p  # [L, K] smoothed distributions about the overall one
        w, v = np.linalg.eigh((dev * n[:, None]).T @ dev)
        pc = v[:, -1] * (1.0 if v[np.argmax(np.abs(v[:, -1])), -1] >= 0 else -1.0)
        return dev @ pc
    t = level_target(y)
    s = np.bincount(codes, weights=t, minlength=L)
    return (s + t.mean()) / (n + 1.0)
