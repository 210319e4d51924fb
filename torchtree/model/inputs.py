"""Checks of what users pass as features and labels: arrays, frames and tensors turned into clean
numpy arrays, or one ``ValueError`` naming the problem (the row, the column, what to do), so that no
stack trace from deep inside a kernel reaches a user. :class:`~torchtree.model.data.Data` builds on them.
"""
from __future__ import annotations

from typing import Any, Optional, Sequence

import numpy as np
import torch

__all__ = ["InputTypeError", "is_missing_cell", "refuse_unordered_dtype", "check_integer_precision", "as_feature_matrix", "encode_class_labels", "check_class_count", "check_no_missing_labels",
           "in_training_order", "check_name_types", "ArrayLike"]

#: what ``X`` and ``y`` may be: a numpy array, a pandas DataFrame or Series, a torch tensor, nested lists
#: (``Any`` to type checkers: the checks at run time say what is refused, and why)
ArrayLike = Any


class InputTypeError(TypeError, ValueError):
    """Input of a kind torchtree does not take (a sparse matrix, a cell that is no number): a
    TypeError, as numpy's conversions raise, and a ValueError, as torchtree's other input refusals."""


def to_numpy(obj: Any, name: str) -> np.ndarray:
    """Convert numpy arrays, torch tensors (any device) and pandas-like objects."""
    if isinstance(obj, torch.Tensor):
        if obj.layout != torch.strided:
            raise InputTypeError(f"{name}: sparse input is not supported; use {name}.to_dense()")
        obj = obj.detach().cpu()
        if obj.dtype == torch.bfloat16:  # numpy has no bfloat16; float32 holds every value exactly
            obj = obj.float()
        return obj.numpy()
    if hasattr(obj, "toarray") and hasattr(obj, "nnz"):  # scipy.sparse matrices and arrays
        raise InputTypeError(f"{name}: sparse input is not supported; use {name}.toarray() (in a Pipeline, make the "
                             "step before dense: OneHotEncoder(sparse_output=False), or no encoder at all, since text "
                             "columns are categorical here)")
    if obj is None:
        raise ValueError(f"this estimator requires {name} to be passed, but the target {name} is None"
                         if name == "y" else f"{name} is None; expected an array-like")
    if isinstance(obj, np.ma.MaskedArray):
        # masked cells are missing values (np.asarray would read the values under the mask)
        if not np.ma.getmaskarray(obj).any():
            return np.asarray(obj.data)
        if obj.dtype.kind in "biuf":
            return obj.astype(np.float64).filled(np.nan)
        return obj.astype(object).filled(None)
    dtypes = list(getattr(obj, "dtypes", [])) if frame_columns(obj) is not None else []
    if dtypes and all(getattr(dt, "kind", "O") in "biuf" for dt in dtypes) and \
            any(not isinstance(dt, np.dtype) for dt in dtypes):
        # pandas' nullable numbers (Float64, Int64, boolean): pd.NA is a missing value, as NaN is
        return obj.to_numpy(dtype=np.float64, na_value=np.nan)
    try:
        arr = np.asarray(obj)
    except Exception as exc:  # pragma: no cover - exotic inputs
        raise ValueError(f"{name} could not be converted to an array: {exc}") from exc
    return arr


def frame_columns(obj: Any) -> Optional[list]:
    """Column names of a pandas-like frame (an object with ``columns`` and ``dtypes``), else None."""
    cols = getattr(obj, "columns", None)
    if cols is None or not hasattr(obj, "dtypes") or isinstance(obj, (np.ndarray, torch.Tensor)):
        return None
    try:
        return list(cols)
    except TypeError:  # pragma: no cover - exotic frames
        return None


def check_name_types(names: Optional[Sequence[Any]]) -> None:
    """TypeError for a frame whose column names mix text and other types, as scikit-learn: such
    columns could be matched neither by name (not all are names) nor safely by position."""
    if names is None:
        return
    kinds = sorted({type(c).__name__ for c in names})
    if len(kinds) > 1 and any(isinstance(c, str) for c in names):
        raise TypeError(f"X's column names mix types {kinds}: columns are matched by name only when every name is "
                        "text. Convert them, X.columns = X.columns.astype(str), or pass X.to_numpy() to match them by "
                        "position")


def in_training_order(X: Any, fitted: Optional[Sequence[str]]) -> Any:
    """``X`` with its columns in the training order ``fitted`` when ``X`` is a frame whose column names
    are all text (taken by name, as scikit-learn matches ``feature_names_in_``); any other ``X``, or
    ``fitted`` None, is returned as it is (taken by position).

    Raises
    ------
    ValueError
        A frame whose text column names are not ``fitted`` (some unknown, missing or repeated).
    """
    names = frame_columns(X)
    if fitted is None or names is None or not all(isinstance(c, str) for c in names):
        return X
    fitted = list(fitted)
    if names == fitted:
        return X
    unknown = [c for c in names if c not in fitted]
    missing = [c for c in fitted if c not in names]
    dup = sorted({c for c in names if names.count(c) > 1})
    if unknown or missing or dup:
        raise ValueError(
            "X's columns do not match the feature names seen at fit"
            + (f"; unknown: {unknown}" if unknown else "") + (f"; missing: {missing}" if missing else "")
            + (f"; duplicated: {dup}" if dup else "") + f" (fitted on {fitted})")
    return X[fitted]


def refuse_unordered_dtype(dt, where: str, name: str = "X") -> None:
    """ValueError for a frame column of dates, durations or complex numbers (``dt.kind`` in ``cMm``): no order a
    split could use, and what to convert them to."""
    if getattr(dt, "kind", "O") in "cMm":
        raise ValueError(f"{name} must be numeric, got dtype {dt} in {where}: dates, durations and complex numbers "
                         "have no order a split could use; convert them (e.g. dates to seconds since an origin, "
                         "with missing dates as NaN)")


def column_label(j: int, names: Optional[Sequence] = None) -> str:
    """``column j`` or ``column j ('name')`` for error messages."""
    if names is not None and j < len(names):
        return f"column {j} ({names[j]!r})"
    return f"column {j}"


def _check_no_categoricals(obj: Any, name: str) -> None:
    """ValueError for pandas categorical columns.

    A tree would split on the category codes, whose order follows each frame's own
    category list: meaningless for unordered categories, and for ordered ones the
    codes of a test frame need not match those of the training frame. So every
    categorical column is refused, ordered or not, and the user converts it.
    """
    names = frame_columns(obj)
    if names is None:
        return
    for j, dt in enumerate(obj.dtypes):
        if getattr(dt, "name", None) == "category":
            raise ValueError(
                f"{name} {column_label(j, names)} is a pandas categorical: trees would split on its category codes, "
                "which mean nothing as numbers; convert it first: .astype(float) when its categories are "
                "meaningful numbers, .cat.codes for an ordered scale coded the same way at training and prediction"
            )


def is_missing_cell(v) -> bool:
    """None, NaN or a pandas NA among labels or cells of any type."""
    if v is None:
        return True
    try:
        return bool(v != v)  # NaN (float or numpy)
    except TypeError:  # pandas.NA: its comparisons are NA, whose truth value is undefined
        return True


def check_no_missing_labels(yn: np.ndarray, name: str = "y", what: str = "label") -> None:
    """ValueError naming the count and the first row of missing labels or targets (None / NaN / NA), and
    of infinite ones, in one wording for object and float arrays."""
    if yn.dtype.kind == "O":
        bad = [i for i, v in enumerate(yn.tolist()) if is_missing_cell(v)]
    elif yn.dtype.kind == "f":
        bad = np.flatnonzero(np.isnan(yn)).tolist()
    else:
        return
    if len(bad):
        raise ValueError(f"{name} has {len(bad)} missing {what}(s) (None / NaN); the first is at row {int(bad[0])}. "
                         "Drop those rows: a row without its target can be neither fitted nor scored")
    if yn.dtype.kind == "f" and not np.isfinite(yn).all():
        inf = np.flatnonzero(~np.isfinite(yn))
        raise ValueError(f"{name} has {len(inf)} infinite {what}(s); the first is at row {int(inf[0])}")


def encode_class_labels(yn: np.ndarray, n_classes: Optional[int] = None, classes: Optional[Sequence] = None):
    """Class labels to codes ``0..K-1``.

    Parameters
    ----------
    yn : numpy.ndarray [N], labels of any type (strings, ints, integral floats: classes keep the type)
    n_classes : int, optional, labels are already codes ``0..n_classes-1``
    classes : sequence [K], optional, the label of each code (fixes the coding)

    Returns
    -------
    (codes int64 [N], classes numpy.ndarray [K]); without ``n_classes`` or ``classes``
    the classes are the sorted distinct labels, at least two of them.
    """
    check_no_missing_labels(yn)
    if classes is not None:
        classes_arr = np.asarray(classes)
        lookup = {c: i for i, c in enumerate(classes_arr.tolist())}
        try:
            codes = np.array([lookup[v] for v in yn.tolist()], dtype=np.int64)
        except KeyError as exc:
            raise ValueError(f"label {exc.args[0]!r} is not in the given classes") from exc
        return codes, classes_arr
    if yn.dtype.kind == "f":
        if not np.all(yn == np.round(yn)):
            raise ValueError(
                "y has continuous (non-integer) labels, given for classification; "
                "use task='regression' (BayesianTreeRegressor) for real-valued targets"
            )
        if n_classes is not None:  # codes given as floats; otherwise the labels keep their type, as in scikit-learn
            yn = yn.astype(np.int64)
    if n_classes is not None:
        if yn.dtype.kind not in "iub":
            raise ValueError("n_classes requires integer labels 0..n_classes-1")
        yi = yn.astype(np.int64)
        if yi.min() < 0 or yi.max() >= n_classes:
            raise ValueError(f"labels must lie in 0..{n_classes - 1} when n_classes={n_classes}")
        return yi, np.arange(n_classes)
    try:
        classes_arr, codes = np.unique(yn, return_inverse=True)
    except TypeError:  # labels of types that cannot be sorted together (an int among strings)
        kinds = sorted({type(v).__name__ for v in yn.tolist()})
        raise ValueError(f"y mixes label types ({', '.join(kinds)}) that cannot be ordered as one set of classes; "
                         "give labels of one type (e.g. y.astype(str))") from None
    check_class_count(len(classes_arr), len(yn))
    if len(classes_arr) < 2:
        raise ValueError(
            f"y has a single class (1 class: {classes_arr.tolist()[0]!r}); a classifier needs at least two. (A sampler's run() "
            "fits one anyway from torchtree.Data(X, y, n_classes=K), which declares the classes not seen.)"
        )
    return codes.astype(np.int64), classes_arr


#: Below this many classes every class count is cheap, so toy data with one row per class stays allowed.
_FEW_CLASSES = 100


def check_class_count(n_classes: int, n_rows: int, name: str = "y",
                      advice: str = "use task='regression' (BayesianTreeRegressor; --task regression on the command line)") -> None:
    """ValueError for more classes than a classifier can learn from.

    More classes than half the rows means most classes have fewer than two examples:
    such labels are almost always a real-valued target read as classes (and the
    leaves' class counts grow as rows x classes, which is what ran out of memory).

    Parameters
    ----------
    n_classes : int, distinct labels inferred from the data
    n_rows : int
    name : str, the labels' name in the message
    advice : str, what to do instead, in the caller's words
    """
    if n_classes > _FEW_CLASSES and 2 * n_classes > n_rows:
        raise ValueError(
            f"{name} has {n_classes} classes for {n_rows} rows: most classes would have fewer than 2 examples, "
            f"nothing a classifier can learn from. This looks like a regression target? {advice}"
        )


#: regression targets that vary by less than this are refused: their squared deviations fall below
#: float64's normal range (2.2e-308), where sums of squares lose their digits
MIN_TARGET_SPREAD = 1e-150


def check_target_magnitude(yf: np.ndarray) -> None:
    """ValueError for regression targets too large or too finely spread for float64 sums of squares.

    The leaf statistics are sums of squared deviations from the mean, and squares of sums
    of them; the mean itself is rounded, so even equal targets deviate by up to
    ``eps * |y|``. All of it stays finite while ``(N * max|y|)^2`` does (``|y|`` up to about
    ``1e154 / N``); beyond, the default leaf prior and the marginal likelihoods overflow.
    Targets that vary, but by less than :data:`MIN_TARGET_SPREAD` (``max - min``), square into
    subnormal numbers and lose the signal; so does a constant target smaller than it in magnitude.
    """
    big = float(np.abs(yf).max())
    with np.errstate(over="ignore"):
        ok = np.isfinite(np.square(np.float64(len(yf)) * big))  # numpy: inf, not OverflowError
    if not ok:
        raise ValueError(f"y is too large for float64 sums of squares (max |y| = {big:.3g} over {len(yf)} targets); "
                         "rescale y (e.g. divide it by a power of ten)")
    spread = float(yf.max() - yf.min()) if len(yf) else 0.0
    if 0 < spread < MIN_TARGET_SPREAD:
        raise ValueError(f"y varies too finely for float64 sums of squares (max - min = {spread:.3g}; squares of "
                         f"deviations under {MIN_TARGET_SPREAD:.0e} lose their digits); rescale y (e.g. multiply it "
                         "by a power of ten)")
    if 0 < big < MIN_TARGET_SPREAD:  # a constant target: its square is the priors' scale, and underflows
        raise ValueError(f"y is too small for float64 sums of squares (max |y| = {big:.3g}: its square underflows); "
                         "rescale y (e.g. multiply it by a power of ten)")


def _first_non_number(arr: np.ndarray, names: Optional[Sequence] = None) -> str:
    """``"row i, column j ('name') holds 'abc': "`` for the first cell of a 2-D array that
    ``float()`` refuses (what a user must fix), else ``""``."""
    if arr.ndim != 2:
        return ""
    for j in range(arr.shape[1]):
        for i, v in enumerate(arr[:, j].tolist()):
            try:
                float(v)
            except (TypeError, ValueError):
                return f"row {i}, {column_label(j, names)} holds {v!r}: "
    return ""


def check_integer_precision(values: np.ndarray, where: str) -> None:
    """Refuse a training column of 64-bit integers (1-D ``values``) whose distinct values float64, what the trees
    compare, cannot tell apart: integers beyond 2^53, such as IDs or nanosecond stamps, can round to one value,
    and no split could then separate them. ``where`` names the column (``X column 3 ('id')``)."""
    if values.dtype.kind not in "iu" or values.dtype.itemsize < 8 or values.size == 0:
        return
    if not (np.abs(values.astype(np.float64)) > 2.0 ** 53).any():
        return
    u = np.unique(values)
    f = np.unique(u.astype(np.float64))
    if len(f) < len(u):
        raise ValueError(
            f"{where} has {len(u)} distinct integers but only {len(f)} remain in float64, the precision the trees "
            "compare features in (integers beyond 2^53 round); subtract a base value from the column (e.g. its "
            f"minimum, {int(u[0])}) before fitting, or pass it as text to make it categorical")


def as_feature_matrix(X: Any, n_features: Optional[int] = None, name: str = "X", training: bool = False) -> np.ndarray:
    """Validate a feature matrix and return it as a float64 numpy array.

    Parameters
    ----------
    X : array-like [N, D]
        Numbers only; a 1-D input is refused (ambiguous) rather than guessed.
    n_features : int, optional
        If given, ``D`` must equal it (test data vs. training data).
    name : str
        Name used in error messages.
    training : bool
        Training data: a 64-bit integer column whose distinct values float64 cannot tell apart is
        refused (at prediction such values are only compared with the cuts).

    Returns
    -------
    numpy.ndarray [N, D], float64
    """
    _check_no_categoricals(X, name)
    names = frame_columns(X)
    for j, dt in enumerate(X.dtypes if names is not None else []):
        refuse_unordered_dtype(dt, column_label(j, names), name)
    if training and names is not None:  # a frame's integer columns, before numpy makes one float array of them
        for j, dt in enumerate(X.dtypes):
            if getattr(dt, "kind", "") in "iu":
                check_integer_precision(np.asarray(X.iloc[:, j].to_numpy()), f"{name} {column_label(j, names)}")
    arr = to_numpy(X, name)
    if arr.dtype == object or arr.dtype.kind in "US":
        try:
            arr = arr.astype(np.float64)
        except (TypeError, ValueError) as exc:
            raise InputTypeError(f"{name} must be numeric; {_first_non_number(arr, frame_columns(X))}could not "
                                 f"convert: {exc}") from exc
    if arr.dtype.kind == "c":
        raise ValueError(f"{name} must be numeric: Complex data not supported (dtype {arr.dtype})")
    if arr.dtype.kind not in "biuf":
        raise ValueError(f"{name} must be numeric, got dtype {arr.dtype}")
    if arr.ndim != 2:
        raise ValueError(
            f"{name} must be 2-D [n_samples, n_features], got shape {tuple(arr.shape)}"
            + (". Reshape your data: X.reshape(-1, 1) for a single feature, X.reshape(1, -1) for a single row"
               if arr.ndim == 1 else "")
        )
    if arr.shape[0] == 0:
        raise ValueError(f"{name} has zero rows: 0 sample(s) (shape={tuple(arr.shape)}) while a minimum of 1 is required.")
    if arr.shape[1] == 0:
        raise ValueError(f"{name} has zero features: 0 feature(s) (shape={tuple(arr.shape)}) while a minimum of 1 is "
                         "required.")
    if training and arr.dtype.kind in "iu":
        for j in range(arr.shape[1]):
            check_integer_precision(arr[:, j], f"{name} {column_label(j, names)}")
    arr = arr.astype(np.float64, copy=False)
    if not arr.flags.writeable or any(st < 0 for st in arr.strides):
        # a pandas frame's values may be read-only (torch warns about, and would share, them); a reversed view
        # (X[::-1], np.flip) has negative strides, which torch cannot view
        arr = arr.copy()
    bad = ~np.isfinite(arr)
    if bad.any():
        r, c = np.argwhere(bad)[0]
        kind = "NaN" if np.isnan(arr[r, c]) else "infinite"
        raise ValueError(
            f"{name} contains {int(bad.sum())} non-finite value(s); first is {kind} at row {r}, "
            f"{column_label(int(c), names)}"
        )
    if n_features is not None and arr.shape[1] != n_features:
        raise ValueError(f"{name} has {arr.shape[1]} features, but the model is expecting {n_features} features as "
                         f"input (the model was fitted with {n_features})")
    return arr
