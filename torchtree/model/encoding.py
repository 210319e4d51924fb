"""Tables with missing values and categorical columns, as the numeric columns hard trees split on.

:class:`TableEncoder` turns a user's table (NaN cells, string or pandas ``category`` columns) into
numeric split columns, each belonging to one input column (its *group*), such that the hard-tree
prior over split rules on the encoded columns is the model below. The samplers draw a rule's column
group by group (:mod:`torchtree.model.feature_groups`): an input column uniformly among those with a
possible split in the node, then a split column uniformly among its group's possible ones.

**Missing values** (MIA, "missingness incorporated in attributes", Twala, Jones & Hand 2008;
Kapelner & Bleich 2015 for BART). A numeric column ``x_d`` that has missing values in training
becomes two split columns, ``x_d`` with a missing value standing at ``hi_d = max_d + delta_d`` (rows
missing ``x_d`` go right of every cut inside the observed values) and at ``lo_d = min_d - delta_d``
(they go left), where ``max_d, min_d`` are the observed extremes and ``delta_d`` the mean gap
between consecutive distinct observed values (1 for a column with one observed value). So a rule on
``x_d`` carries its missing side, each side with prior 1/2; the cut is uniform on the node's range
of the column as encoded, and a cut between the node's observed values and the stand-in is the rule
"is ``x_d`` missing". In a node without missing values in ``x_d`` the two columns are the same
column, so the side contributes no factor. Rules on the encoded columns therefore read, on the
input: ``x_d <= t, missing right`` / ``x_d <= t or missing`` / ``x_d is missing``.

**Categorical columns** (Chipman, George & McCulloch 1998). A column of ``L`` levels (sorted
labels; a missing value is one more level, the last, when training has any) becomes the
``2^(L-1) - 1`` indicator columns of the subsets ``S`` of levels that contain the first level and
not all of them (value 0 on ``S``, which goes left). In a node holding ``k`` of the levels, each
non-trivial partition of those ``k`` levels is the restriction of exactly ``2^(L-k)`` of these
subsets, so the draw "column uniform among the group's splitting ones" is uniform over the node's
non-trivial partitions: the CGM prior. This costs ``2^(L-1) - 1`` columns, so columns of more than
``max_subset_levels`` levels (default 8: at most 127 columns) are instead one ordinal column, the
levels ordered by their mean training response (two classes: the share of the most frequent class;
three or more: the first principal component of the levels' class distributions, Coppersmith, Hong &
Hosking 1999), smoothed by one pseudo-row at the overall mean: rules then send a contiguous run of that
order left (as CART orders levels for binary and regression targets). Levels whose mean is more noise
than signal share one place in that order, their pooled rows' score (every level when the column shows
no signal; :func:`~torchtree.model.levels.level_order`): an order drawn from a few labels per level is
made by those labels, and rules on it would fit their noise (the posterior takes the order as given). Ordered pandas categoricals
are ordinal in their category order (with MIA for missing values).

**Prediction.** Missing values follow the learnt rules as above; observed values beyond the training range of an
MIA column are clipped to it (an "is missing" rule sends every observed value left). A value training gives no
rule for (a missing value in a column that had none, which warns; a level not seen in training) is replaced by
the training column's median (numeric) or most frequent level (categorical). Everything about a table's coding
lives in the encoder and is saved with the posterior, so prediction takes the same raw frames as ``fit``;
labels, not codes, define levels, so frames with the same labels in another category order give the same fit.
"""
from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any, List, Optional, Sequence

import numpy as np
import torch

from torchtree.io.cells import is_missing_token
from torchtree.model.inputs import (InputTypeError, check_integer_precision, column_label, frame_columns, is_missing_cell,
                                    refuse_unordered_dtype, to_numpy)
from torchtree.model.levels import (MAX_SUBSET_LEVELS, distinct_cells, find_levels, first_text, label_of,
                                    level_order, text_numbers, warn_mostly_numbers)
from torchtree.core.warn import warn

__all__ = ["TableEncoder", "needs_encoding", "rule_text", "cut_text", "MAX_SUBSET_LEVELS", "MAX_ENCODED_COLUMNS"]

#: more encoded columns than this is refused (the samplers' per-node work is linear in columns)
MAX_ENCODED_COLUMNS = 4096

_KINDS = ("numeric", "mia", "subsets", "ordinal", "constant")


def _frame_dtype_kind(dt) -> str:
    """'category', 'ordered', 'object' or 'numeric' for a pandas dtype."""
    name = getattr(dt, "name", "")
    if name == "category":
        return "ordered" if bool(getattr(dt, "ordered", False)) else "category"
    kind = getattr(dt, "kind", "O")
    if name in ("string", "str") or kind in "OUS":
        return "object"
    return "numeric"


def _raw_columns(X: Any, name: str = "X", training: bool = False):
    """The table's columns as a list of 1-D numpy arrays, their dtype kinds and names."""
    names = frame_columns(X)
    if names is not None:
        cols, kinds = [], []
        for j, dt in enumerate(X.dtypes):
            kind = _frame_dtype_kind(dt)
            s = X.iloc[:, j]
            refuse_unordered_dtype(dt, column_label(j, names), name)  # as the numeric path refuses them
            if kind in ("category", "ordered"):
                cats = [label_of(c) for c in s.cat.categories]
                codes = np.asarray(s.cat.codes)
                by_code = np.empty(len(cats) + 1, dtype=object)  # code -1 (missing) reads the last entry, None
                by_code[:-1] = cats
                col = by_code[codes]
                cols.append((col, cats if kind == "ordered" else None))
            elif kind == "object":
                cols.append((np.asarray(s.to_numpy(dtype=object), dtype=object), None))
            else:
                if training and getattr(dt, "kind", "") in "iu":
                    check_integer_precision(np.asarray(s.dropna().to_numpy()), f"{name} {column_label(j, names)}")
                cols.append((np.asarray(s.to_numpy(dtype=np.float64, na_value=np.nan)), None))
            kinds.append(kind)
        return cols, kinds, names
    arr = to_numpy(X, name)
    if arr.ndim != 2:
        raise ValueError(f"{name} must be 2-D [n_samples, n_features], got shape {tuple(arr.shape)}")
    cols, kinds = [], []
    for j in range(arr.shape[1]):
        c = arr[:, j]
        if training:
            check_integer_precision(c, f"{name} {column_label(j, None)}")
        if c.dtype.kind in "biuf":
            cols.append((c.astype(np.float64), None))
            kinds.append("numeric")
        else:
            cols.append((c.astype(object), None))
            kinds.append("object")
    return cols, kinds, None


def _as_numbers(col: np.ndarray, tokens: Optional[list] = None):
    """float64 of an object column, or None when some present cell is not a number. Cells spelling a missing
    value (``MISSING_TOKENS``: ``"n/a"``, ``"?"``, ...) are NaN, and are appended to ``tokens`` when given."""
    out = np.empty(len(col), dtype=np.float64)
    for i, v in enumerate(col.tolist()):
        if is_missing_cell(v):
            out[i] = np.nan
            continue
        if isinstance(v, (bool, np.bool_)):
            out[i] = float(v)
            continue
        try:
            out[i] = float(v)
        except (TypeError, ValueError):
            if not is_missing_token(v):
                return None
            out[i] = np.nan
            if tokens is not None:
                tokens.append(v)
            continue
        if tokens is not None and isinstance(v, str) and out[i] != out[i]:  # "nan", "NaN": a token float() reads
            tokens.append(v)
    return out


def needs_encoding(X: Any, categorical_features="from_dtype") -> bool:
    """Whether ``X`` has missing cells, text or declared categorical columns (then :class:`TableEncoder`
    codes it; otherwise the numeric path takes it as it is, and refuses what it cannot take)."""
    if categorical_features is not None and not (isinstance(categorical_features, str)
                                                 and categorical_features == "from_dtype"):
        return True
    if hasattr(X, "toarray") and hasattr(X, "nnz"):
        return False  # refused on the numeric path with its message
    if isinstance(X, torch.Tensor) and X.layout == torch.strided and X.dim() == 2:
        return bool(torch.isnan(X).any()) if X.is_floating_point() else False  # on its device, no copy
    try:
        if frame_columns(X) is None:
            arr = to_numpy(X, "X")
            if arr.dtype.kind in "cMmbiu":
                return False  # numbers without NaN; complex numbers and dates the numeric path refuses
            if arr.dtype.kind == "f":
                return bool(np.isnan(arr).any())  # one pass, no copy (large numeric tables)
        cols, kinds, _ = _raw_columns(X)
    except Exception:
        return False  # the numeric path says what is wrong with it
    for (col, _), kind in zip(cols, kinds):
        if col.dtype.kind in "cMm":
            return False  # complex numbers, dates: the numeric path refuses them
        if kind in ("category", "ordered"):
            return True
        if kind == "numeric":
            if col.dtype.kind == "f" and bool(np.isnan(col).any()):
                return True
            continue
        nums = _as_numbers(col)
        if nums is None or bool(np.isnan(nums).any()) or any(isinstance(v, str) for v in col.tolist()):
            return True  # missing cells, text, or numbers written as text (a code, or numbers said to be text)
    return False


def _sorted_levels(values: Sequence) -> list:
    try:
        return sorted(set(values))
    except TypeError:  # labels of types that do not compare: order by type, then text
        return sorted(set(values), key=lambda v: (type(v).__name__, str(v)))


@dataclass
class _Column:
    """How one input column is coded: ``kind`` in ``_KINDS``; ``n_out`` split columns."""
    kind: str
    n_out: int
    source: str = "numeric"    # "numeric", "categorical" (unordered levels) or "ordered" (ordered levels)
    lo: float = 0.0            # numeric / mia: observed extremes (mia clips predictions to them)
    hi: float = 0.0
    delta: float = 1.0         # mia: distance of the stand-ins beyond the extremes
    fill: float = 0.0          # numeric value a rule-less missing cell becomes (training median)
    levels: list = field(default_factory=list)  # categorical: labels in code order (None: the missing level)
    fill_level: int = 0        # code a rule-less level becomes (the most frequent training level)
    order: list = field(default_factory=list)   # ordinal of many levels: rank of each code

    def state(self) -> dict:
        return {"kind": self.kind, "n_out": self.n_out, "source": self.source, "lo": self.lo, "hi": self.hi, "delta": self.delta,
                "fill": self.fill, "levels": [None if v is None else (v if isinstance(v, (int, float, bool)) else str(v))
                                              for v in self.levels],
                "fill_level": self.fill_level, "order": list(self.order)}


class TableEncoder:
    """Codes a table with missing values and categorical columns for the hard trees (module notes).

    Build with :meth:`fit`; :meth:`transform` codes a table with the same columns.

    Attributes
    ----------
    n_inputs : int, input columns ``D_in``
    n_columns : int, encoded split columns ``D``
    groups : numpy.ndarray [D] int64, the input column of each split column
    names : list [D_in] of str, the input columns' names
    """

    def __init__(self, columns: List[_Column], names: List[str], frame_names: Optional[list] = None):
        self.columns = columns
        self.names = names
        self.frame_names = frame_names
        self.groups = np.repeat(np.arange(len(columns)), [c.n_out for c in columns]).astype(np.int64)
        self.offsets = np.r_[0, np.cumsum([c.n_out for c in columns])].astype(np.int64)

    @classmethod
    def plain(cls, Xn: np.ndarray, names: Optional[Sequence] = None) -> "TableEncoder":
        """The coding of a complete numeric table ``Xn [N, D]`` float64: every column as it is, with its
        training median for a missing value at prediction (``is_coded`` False)."""
        if Xn.shape[0] == 0:
            raise ValueError("X has zero rows")
        lo, hi, med = Xn.min(0), Xn.max(0), np.median(Xn, axis=0)
        cols = [_Column("numeric", 1, lo=float(a), hi=float(b), fill=float(m)) for a, b, m in zip(lo, hi, med)]
        out_names = [str(v) for v in names] if names is not None else [f"x{j}" for j in range(Xn.shape[1])]
        return cls(cols, out_names, list(names) if names is not None else None)

    @property
    def is_coded(self) -> bool:
        """Whether some input column is coded (missing values modelled, categorical, ordered levels):
        False for a complete numeric table, whose split columns are its columns."""
        return any(c.kind != "numeric" or c.source != "numeric" for c in self.columns)

    @property
    def n_inputs(self) -> int:
        return len(self.columns)

    @property
    def n_columns(self) -> int:
        return int(self.offsets[-1])

    # ------------------------------------------------------------------ fit
    @classmethod
    def fit(cls, X: Any, y: Optional[np.ndarray] = None, categorical_features="from_dtype",
            max_subset_levels: int = MAX_SUBSET_LEVELS) -> "TableEncoder":
        """Learn the coding of ``X``.

        Parameters
        ----------
        X : array-like [N, D_in]; a pandas DataFrame (``category`` columns, string/object columns, NaN),
            a numpy array (float with NaN, or object with strings / None), a torch tensor, nested lists
        y : numpy.ndarray [N], optional
            Class codes (int) or regression targets (float): orders the levels of categorical columns
            with more than ``max_subset_levels`` levels. Without it those levels keep label order.
        categorical_features : "from_dtype" (default), None, or indices / names / boolean mask [D_in]
            ``"from_dtype"``: pandas ``category`` columns and columns holding text; None: no column
            is categorical (a text column is then an error); otherwise exactly the columns given
            (a text column not among them is an error).
        max_subset_levels : int
            Categorical columns with at most this many levels (the missing level included) get
            exact subset splits; larger ones an ordinal column of levels ordered by mean response.
        """
        cols, kinds, fnames = _raw_columns(X, training=True)
        if not cols:
            raise ValueError("X has zero features: 0 feature(s) while a minimum of 1 is required.")
        n = len(cols[0][0])
        if n == 0:
            raise ValueError("X has zero rows: 0 sample(s) while a minimum of 1 is required.")
        names = [str(v) for v in fnames] if fnames is not None else [f"x{j}" for j in range(len(cols))]
        declared = cls._declared(categorical_features, len(cols), fnames)
        out = []
        raw: dict = {}  # unordered categorical columns: their cells and label, for _fit_column_cap
        for j, ((col, ordered_cats), kind) in enumerate(zip(cols, kinds)):
            where = column_label(j, fnames)
            tokens: list = []
            nums = col if kind == "numeric" else (_as_numbers(col, tokens) if kind == "object" or
                                                  (declared is not None and not declared[j]) else None)
            if nums is not None and kind == "object" and declared is None:
                code, text = text_numbers(col)
                if code is not None:
                    warn(f"X {where} holds numbers written with a leading zero ({code!r}): read as categorical "
                         "labels (codes), not numbers; give it a numeric dtype to use it as numbers", UserWarning)
                    nums = None
                elif text is not None:
                    warn(f"X {where} holds numbers written as text ({text!r}): used as numbers; make it a "
                         "'category' column to use them as labels", UserWarning)
            is_cat = declared[j] if declared is not None else (kind in ("category", "ordered") or nums is None)
            if not is_cat:
                if nums is None:
                    held = (f"holds text ({first_text(col)!r})" if kind == "object" or first_text(col) is not None
                            else f"is a pandas {kind} column")
                    raise ValueError(f"X {where} {held} but categorical_features does not name it; list it in "
                                     "categorical_features, or use the default 'from_dtype'")
                if tokens:
                    warn(f"X {where}: {len(tokens)} text cell(s) among numbers read as missing values "
                         f"({', '.join(repr(t) for t in sorted(set(tokens))[:3])})", UserWarning)
                out.append(cls._numeric(nums, where))
            elif kind == "ordered":
                # the levels present in training, in the declared order (a declared level no row holds is unseen at
                # prediction, as any other); a dict: linear in the rows, not rows x levels
                position = {v: i for i, v in enumerate(ordered_cats)}
                uniq, index, _ = distinct_cells(col.tolist())
                present = sorted({position[v] for v in uniq if not is_missing_cell(v)})
                rank = {p: r for r, p in enumerate(present)}
                codes = np.array([np.nan if is_missing_cell(v) else float(rank[position[v]]) for v in uniq])[index]
                column = cls._numeric(codes, where, levels=[ordered_cats[p] for p in present], source="ordered")
                seen = codes[~np.isnan(codes)].astype(np.int64)
                if seen.size:  # a rule-less missing or unseen level becomes the most frequent level, as unordered
                    column.fill_level = int(np.argmax(np.bincount(seen)))
                    column.fill = float(column.fill_level)
                out.append(column)
            else:
                if declared is None and kind == "object":
                    warn_mostly_numbers(col, where)
                out.append(cls._categorical(col, y, max_subset_levels, where))
                raw[j] = (col, where)
        cls._fit_column_cap(out, raw, y)
        return cls(out, names, fnames)

    @classmethod
    def _fit_column_cap(cls, out: list, raw: dict, y: Optional[np.ndarray]) -> None:
        """Keep the coded table within ``MAX_ENCODED_COLUMNS`` columns: the subset-split columns with the most
        levels become ordinal columns, one at a time, until it fits (with a warning naming them); a table that
        still does not fit is refused."""
        total = sum(c.n_out for c in out)
        widest = sorted((j for j in raw if out[j].kind == "subsets"), key=lambda j: (-out[j].n_out, j))
        recoded = []
        for j in widest:
            if total <= MAX_ENCODED_COLUMNS:
                break
            col, where = raw[j]
            before = out[j].n_out
            out[j] = cls._categorical(col, y, 0, where)
            total += out[j].n_out - before
            recoded.append(where)
        if recoded:
            warn(f"the subset splits of {len(recoded)} categorical column(s) ({', '.join(recoded[:3])}"
                 f"{', ...' if len(recoded) > 3 else ''}) would make the coded table wider than "
                 f"{MAX_ENCODED_COLUMNS} columns: those columns are ordinal instead (levels ordered by mean "
                 "response, as columns of many levels are)", UserWarning)
        if total > MAX_ENCODED_COLUMNS:
            raise ValueError(f"X codes to {total} split columns (over {MAX_ENCODED_COLUMNS}; a categorical column "
                             "counts once): the samplers' work per node grows with the columns; select fewer")

    @staticmethod
    def _declared(spec, d: int, fnames) -> Optional[np.ndarray]:
        if spec is None:
            return np.zeros(d, dtype=bool)
        if isinstance(spec, str):
            if spec == "from_dtype":
                return None
            spec = [spec]
        arr = np.asarray(list(spec))
        if arr.dtype == bool:
            if arr.shape != (d,):
                raise ValueError(f"categorical_features as a mask must have {d} entries, got {arr.shape[0]}")
            return arr
        mask = np.zeros(d, dtype=bool)
        for v in arr.tolist():
            if isinstance(v, str):
                if fnames is None or v not in [str(c) for c in fnames]:
                    raise ValueError(f"categorical_features names {v!r}, which is not a column of X (the one text "
                                     "value it takes is 'from_dtype'; otherwise column names or indices, a boolean "
                                     "mask, or None)")
                mask[[str(c) for c in fnames].index(v)] = True
            else:
                if isinstance(v, (bool, np.bool_)) or not float(v).is_integer():
                    raise ValueError(f"categorical_features holds {v!r}: give column indices (integers), column "
                                     "names, a boolean mask, None or 'from_dtype'")
                k = int(v)
                if not -d <= k < d:
                    raise ValueError(f"categorical_features index {k} is out of range for {d} columns")
                mask[k] = True
        return mask

    @staticmethod
    def _numeric(x: np.ndarray, where: str, levels: Optional[list] = None, source: str = "numeric") -> _Column:
        if np.isinf(x).any():
            r = int(np.flatnonzero(np.isinf(x))[0])
            raise ValueError(f"X {where} holds an infinite value at row {r}; trees take finite values and NaN "
                             "(missing) only")
        miss = np.isnan(x)
        obs = np.unique(x[~miss])
        kind_levels = list(levels) if levels is not None else []
        if len(obs) == 0:
            if len(x):
                _warn_never_split(where)
            return _Column("constant", 1, source=source, levels=kind_levels)
        lo, hi, fill = float(obs[0]), float(obs[-1]), float(np.median(x[~miss]))
        if not miss.any():
            return _Column("numeric", 1, source=source, lo=lo, hi=hi, fill=fill, levels=kind_levels)
        # the mean gap between observed values; one value: a unit, or a millionth of its magnitude where a unit
        # is below its float32 (and float64) resolution
        delta = (hi - lo) / (len(obs) - 1) if len(obs) > 1 else max(1.0, 1e-6 * abs(hi))
        with np.errstate(over="ignore"):
            if not np.isfinite([hi - lo, hi + delta, lo - delta]).all():  # the missing values' stand-ins
                raise ValueError(f"X {where} spans more than float64 can hold with its missing values placed beyond "
                                 f"it (from {lo:.3g} to {hi:.3g}); rescale the column (e.g. divide it by 1e10)")
        return _Column("mia", 2, source=source, lo=lo, hi=hi, delta=float(delta), fill=fill, levels=kind_levels)

    @staticmethod
    def _categorical(col: np.ndarray, y: Optional[np.ndarray], max_levels: int, where: str = "column") -> _Column:
        cells = col.tolist()
        try:
            uniq, index, _ = distinct_cells(cells)
        except TypeError:  # an unhashable cell: found and named below
            uniq, index = cells, np.arange(len(cells))
        miss = [is_missing_cell(v) for v in uniq]
        for i, v in enumerate(uniq):
            if not miss[i] and (not isinstance(v, (str, bytes, int, float, bool, np.generic)) or
                                isinstance(v, (complex, np.complexfloating, np.datetime64, np.timedelta64))):
                row = int(np.argmax(index == i))
                raise InputTypeError(f"X {where} holds a {type(v).__name__} at row {row} ({v!r}): not a number, a "
                                     "text label or a missing value (float()'s argument must be a string or a real "
                                     "number)")
        labels = _sorted_levels([v for v, m in zip(uniq, miss) if not m])
        if labels and all(isinstance(v, float) and v.is_integer() and abs(v) < 2 ** 53 for v in labels):
            labels = [int(v) for v in labels]  # a numeric column's levels read as written: 3, not 3.0
        elif not labels and len(cells):
            _warn_never_split(where)
        levels = labels + ([None] if any(miss) else [])
        code = {v: i for i, v in enumerate(labels)}
        codes = np.array([len(labels) if m else code[v] for v, m in zip(uniq, miss)], dtype=np.int64)[index]
        counts = np.bincount(codes, minlength=len(levels))
        fill_level = int(np.argmax(counts))
        L = len(levels)
        if L <= 1:
            return _Column("constant", 1, source="categorical", levels=levels, fill_level=fill_level)
        if L <= max_levels:
            return _Column("subsets", 2 ** (L - 1) - 1, source="categorical", levels=levels, fill_level=fill_level)
        return _Column("ordinal", 1, source="categorical", levels=levels, fill_level=fill_level,
                       order=level_order(codes, L, y).tolist())

    # ------------------------------------------------------------ transform
    def transform(self, X: Any) -> np.ndarray:
        """Code a table with the training columns: float64 ``[M, D]`` (no NaN)."""
        cols, kinds, fnames = _raw_columns(X)
        if len(cols) != self.n_inputs:
            raise ValueError(f"X has {len(cols)} features, but the model is expecting {self.n_inputs} features as "
                             f"input (the model was fitted with {self.n_inputs})")
        m = len(cols[0][0])
        if m == 0:
            raise ValueError(f"X has zero rows: 0 sample(s) (shape=(0, {len(cols)})) while a minimum of 1 is required.")
        out = np.empty((m, self.n_columns), dtype=np.float64)
        for j, (c, (col, cats)) in enumerate(zip(self.columns, cols)):
            o = self.offsets[j]
            out[:, o:o + c.n_out] = self._code(c, col, cats, kinds[j], column_label(j, fnames or self.frame_names))
        return out

    def _code(self, c: _Column, col: np.ndarray, cats, kind: str, where: str) -> np.ndarray:
        if c.source == "categorical":
            codes = self._level_codes(c, col, where)
            if c.kind == "constant":
                return np.zeros((len(col), 1))
            if c.kind == "ordinal":
                return np.asarray(c.order, dtype=np.float64)[codes][:, None]
            masks = np.arange(c.n_out, dtype=np.int64)[None, :]
            shift = np.maximum(codes[:, None] - 1, 0)
            in_s = (codes[:, None] == 0) | ((masks >> shift) & 1 == 1)
            return np.where(in_s, 0.0, 1.0)
        if c.source == "ordered":  # codes in category order; an unseen level is a missing value
            lookup = {v: i for i, v in enumerate(c.levels)}
            found, _, index = find_levels(lookup, col, where, c.levels, c.kind == "mia")
            x = np.array([np.nan if k is None else float(k) for k in found], dtype=np.float64)[index]
        else:
            x = col if kind == "numeric" else _as_numbers(col)
            if x is None:
                raise ValueError(f"X {where} holds text ({first_text(col)!r}) but was numeric in training")
        if np.isinf(x).any():
            raise ValueError(f"X {where} holds an infinite value; trees take finite values and NaN (missing) only")
        if c.kind == "constant":
            return np.zeros((len(x), 1))
        miss = np.isnan(x)
        if c.kind == "numeric":
            if miss.any():  # no missing cell in training: nothing learnt what one means
                warn(f"X {where}: {int(miss.sum())} missing cell(s), none in training: read as the training median "
                     f"({c.fill:g}), so those rows' predictions and intervals are the ones at that value", UserWarning)
            return np.where(miss, c.fill, x)[:, None]
        xc = np.clip(x, c.lo, c.hi)
        return np.stack([np.where(miss, c.hi + c.delta, xc), np.where(miss, c.lo - c.delta, xc)], 1)

    def _level_codes(self, c: _Column, col: np.ndarray, where: Optional[str] = None) -> np.ndarray:
        """Each cell's level code; a label is also found as its text (``1`` for ``"1"``) or its number (``"1"``
        for ``1.0``). Where more than half of the present cells hold labels not seen in training, a warning
        names the column (``where``)."""
        has_missing = c.levels and c.levels[-1] is None
        lookup = {v: i for i, v in enumerate(c.levels) if v is not None}
        miss_code = len(c.levels) - 1 if has_missing else c.fill_level
        found, miss, index = find_levels(lookup, col, where, c.levels, has_missing)
        codes = np.array([miss_code if m or (k is None and has_missing) else (c.fill_level if k is None else k)
                          for k, m in zip(found, miss)], dtype=np.int64)
        return codes[index]

    # --------------------------------------------------------- description
    def describe(self, column: int, threshold: float, names: Optional[Sequence[str]] = None) -> str:
        """The rule "split column ``column`` <= ``threshold``" (the left branch) in the input's terms
        (``names``: the input columns' names, default the training table's)."""
        j = int(self.groups[column])
        c, k = self.columns[j], column - int(self.offsets[j])
        name = str(names[j]) if names is not None else self.names[j]
        if c.source == "numeric" and c.kind in ("numeric", "constant"):
            return f"{name} <= {cut_text(threshold)}"
        if c.kind == "subsets":
            L = len(c.levels)
            s = [0] + [i + 1 for i in range(L - 1) if (k >> i) & 1]
            return f"{name} in {{{', '.join(_level_text(c.levels[i]) for i in s)}}}"
        if c.kind == "ordinal":
            left = [c.levels[i] for i in range(len(c.levels)) if c.order[i] <= threshold]
            shown = ", ".join(_level_text(v) for v in left[:6]) + (f", ... ({len(left)} levels)" if len(left) > 6 else "")
            return f"{name} in {{{shown}}}"
        if c.source == "ordered":  # numeric or mia coding of the category codes
            top = int(math.floor(threshold))
            base = f"{name} <= {_level_text(c.levels[min(max(top, 0), len(c.levels) - 1)])}"
        else:
            base = f"{name} <= {cut_text(threshold)}"
        if c.kind == "numeric":
            return base
        if k == 0:
            return f"{name} is not missing" if threshold >= c.hi else f"{base}, missing right"
        return f"{name} is missing" if threshold < c.lo else f"{base} or missing"

    def missing_sides(self) -> np.ndarray:
        """Per split column: +1 where missing values stand above the observed ones, -1 below, 0 where the
        column has no missing values ``[D]`` int64 (grids and bins keep the "is missing" cut)."""
        out = np.zeros(self.n_columns, dtype=np.int64)
        for j, c in enumerate(self.columns):
            if c.kind == "mia":
                out[self.offsets[j]], out[self.offsets[j] + 1] = 1, -1
        return out

    def group_sums(self, per_column: np.ndarray) -> np.ndarray:
        """Sum ``per_column [..., D]`` over each input column's split columns: ``[..., D_in]``."""
        per_column = np.asarray(per_column, dtype=np.float64)
        out = np.zeros(per_column.shape[:-1] + (self.n_inputs,))
        np.add.at(out, (..., self.groups), per_column)
        return out

    # ---------------------------------------------------------- persistence
    def state(self) -> dict:
        """Plain-data form (lists, numbers, strings) saved with a posterior."""
        return {"columns": [c.state() for c in self.columns], "names": list(self.names),
                "frame_names": None if self.frame_names is None else [str(v) for v in self.frame_names]}

    @classmethod
    def from_state(cls, state: dict, n_columns: Optional[int] = None) -> "TableEncoder":
        try:  # ValueError for a malformed coding, or one not of ``n_columns`` split columns (the trees' features)
            enc = cls([_Column(**c) for c in state["columns"]], list(state["names"]), state.get("frame_names"))
        except (KeyError, TypeError) as exc:
            raise ValueError(f"a malformed table coding ({type(exc).__name__}: {exc})") from None
        if any(c.kind not in _KINDS for c in enc.columns) or n_columns not in (None, enc.n_columns):
            raise ValueError(f"a table coding of unknown kinds or of {enc.n_columns} split columns for {n_columns}")
        return enc

    def __repr__(self) -> str:
        kinds = {k: sum(c.kind == k for c in self.columns) for k in _KINDS}
        parts = ", ".join(f"{v} {k}" for k, v in kinds.items() if v)
        return f"TableEncoder({self.n_inputs} inputs -> {self.n_columns} split columns: {parts})"


def _warn_never_split(where: str) -> None:
    warn(f"X {where} holds no value in training (every cell is missing): it is never split on", UserWarning)


def _level_text(v) -> str:
    return "missing" if v is None else str(v)


def cut_text(threshold: float) -> str:
    """A cut as text that reads back to the stored cut: six significant digits where they do (in float32 for a
    cut float32 holds, as the trees store most), else the shortest text that does (``1600000382.55``, not
    ``1.6e+09``, whose rule would send rows to the other side)."""
    v = float(threshold)
    short = f"{v:.6g}"
    if float(short) == v:
        return short
    single = np.float32(v)
    if np.isfinite(single) and float(single) == v:  # a float32 cut
        return short if np.float32(float(short)) == single else str(single)
    return repr(v)


def rule_text(encoder: Optional[TableEncoder], names: Optional[Sequence[str]], column: int, threshold: float) -> str:
    """A split rule's left branch for summaries and DOT files: ``name <= t`` on a numeric table, else
    :meth:`TableEncoder.describe` (``names``: input column names, or None for the defaults)."""
    if encoder is not None:
        return encoder.describe(column, threshold, names)
    return f"{names[column] if names is not None else f'x{column}'} <= {cut_text(threshold)}"
