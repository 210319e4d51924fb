"""Validated training data.

All input checking of the library lives here, so that every sampler and estimator
sees clean tensors and a user sees one clear ``ValueError`` naming the problem
instead of a stack trace from deep inside a kernel.
"""
from __future__ import annotations

import os
from typing import Any, Optional, Sequence

import numpy as np
import torch

from torchtree.core.validate import check_choice

__all__ = ["Data", "as_feature_matrix", "encode_class_labels", "check_class_count", "resolve_device"]

_TASKS = ("classification", "regression")


class InputTypeError(TypeError, ValueError):
    """Input of a kind torchtree does not take (a sparse matrix, a cell that is no number): a
    TypeError, as numpy's conversions raise, and a ValueError, as torchtree's other input refusals."""


def _to_numpy(obj: Any, name: str) -> np.ndarray:
    """Convert numpy arrays, torch tensors (any device) and pandas-like objects."""
    if isinstance(obj, torch.Tensor):
        if obj.layout != torch.strided:
            raise InputTypeError(f"{name}: sparse input is not supported; use {name}.to_dense()")
        return obj.detach().cpu().numpy()
    if hasattr(obj, "toarray") and hasattr(obj, "nnz"):  # scipy.sparse matrices and arrays
        raise InputTypeError(f"{name}: sparse input is not supported; use {name}.toarray()")
    if obj is None:
        raise ValueError(f"this estimator requires {name} to be passed, but the target {name} is None"
                         if name == "y" else f"{name} is None; expected an array-like")
    try:
        arr = np.asarray(obj)
    except Exception as exc:  # pragma: no cover - exotic inputs
        raise ValueError(f"{name} could not be converted to an array: {exc}") from exc
    return arr


def _frame_columns(obj: Any) -> Optional[list]:
    """Column names of a pandas-like frame (an object with ``columns`` and ``dtypes``), else None."""
    cols = getattr(obj, "columns", None)
    if cols is None or not hasattr(obj, "dtypes") or isinstance(obj, (np.ndarray, torch.Tensor)):
        return None
    try:
        return list(cols)
    except TypeError:  # pragma: no cover - exotic frames
        return None


def _column(j: int, names: Optional[Sequence] = None) -> str:
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
    names = _frame_columns(obj)
    if names is None:
        return
    for j, dt in enumerate(obj.dtypes):
        if getattr(dt, "name", None) == "category":
            raise ValueError(
                f"{name} {_column(j, names)} is a pandas categorical: trees would split on its category codes, "
                "which mean nothing as numbers; convert it first: .astype(float) when its categories are "
                "meaningful numbers, .cat.codes for an ordered scale coded the same way at training and prediction"
            )


def _is_missing(v) -> bool:
    """None, NaN or a pandas NA among labels of any type."""
    if v is None:
        return True
    try:
        return bool(v != v)  # NaN (float or numpy)
    except TypeError:  # pandas.NA: its comparisons are NA, whose truth value is undefined
        return True


def check_no_missing_labels(yn: np.ndarray, name: str = "y") -> None:
    """ValueError naming the first missing label (None / NaN / NA) of an object label array."""
    if yn.dtype.kind != "O":
        return  # float labels: NaN is refused with the other non-finite values
    bad = [i for i, v in enumerate(yn.tolist()) if _is_missing(v)]
    if len(bad):
        raise ValueError(f"{name} has {len(bad)} missing label(s) (None / NaN); the first is at row {int(bad[0])}")


def encode_class_labels(yn: np.ndarray, n_classes: Optional[int] = None, classes: Optional[Sequence] = None):
    """Class labels to codes ``0..K-1``.

    Parameters
    ----------
    yn : numpy.ndarray [N], labels of any type (strings, ints, integral floats)
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
        if not np.isfinite(yn).all():
            raise ValueError("y contains NaN or infinite labels")
        if not np.all(yn == np.round(yn)):
            raise ValueError(
                "y has continuous (non-integer) labels, given for classification; "
                "use task='regression' (BayesianTreeRegressor) for real-valued targets"
            )
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
            "y has a single class (1 class); pass n_classes (or classes) to fit a classifier anyway, "
            "e.g. torchtree.Data(X, y, n_classes=K) to a sampler's run()"
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


def _check_target_magnitude(yf: np.ndarray) -> None:
    """ValueError for regression targets too large for float64 sums of squares.

    The leaf statistics are sums of squared deviations from the mean, and squares of sums
    of them; the mean itself is rounded, so even equal targets deviate by up to
    ``eps * |y|``. All of it stays finite while ``(N * max|y|)^2`` does (``|y|`` up to about
    ``1e154 / N``); beyond, the default leaf prior and the marginal likelihoods overflow.
    """
    big = float(np.abs(yf).max())
    with np.errstate(over="ignore"):
        ok = np.isfinite(np.square(np.float64(len(yf)) * big))  # numpy: inf, not OverflowError
    if not ok:
        raise ValueError(f"y is too large for float64 sums of squares (max |y| = {big:.3g} over {len(yf)} targets); "
                         "rescale y (e.g. divide it by a power of ten)")


def _memory_bytes(device: Optional[torch.device] = None) -> Optional[int]:
    """Total memory of ``device`` (physical RAM for the CPU) in bytes, or None if unknown."""
    if device is not None and device.type == "cuda":
        return int(torch.cuda.mem_get_info(device)[1])
    try:
        return int(os.sysconf("SC_PAGE_SIZE")) * int(os.sysconf("SC_PHYS_PAGES"))
    except (AttributeError, ValueError, OSError):  # pragma: no cover - not a POSIX system
        return None


def _float_storage_problem(uniq: Sequence[np.ndarray], dtype: torch.dtype, Xn: np.ndarray,
                           names: Optional[Sequence] = None) -> Optional[str]:
    """What makes ``dtype`` unable to hold the feature columns faithfully (None: nothing).

    The hard-tree samplers compare ``X`` in ``dtype`` with thresholds taken from its
    values, so a value beyond the dtype's range (it becomes inf) or distinct values that
    round to the same number (no split can separate them: 1e8 and 1e8 + 1 in float32)
    would change the answer in silence. Values that merge only below the resolution the
    column would have after centring (differences under ``eps * (max - min)``, e.g.
    0.3 and 0.1 + 0.2) are left alone: centring could not separate them either.

    Parameters
    ----------
    uniq : sequence [D] of sorted distinct float64 values per column
    dtype : torch floating dtype ``X`` is stored in
    Xn : numpy.ndarray [N, D] float64 (to locate a value out of range)
    names : column names, optional (for the message)
    """
    if dtype == torch.float64:
        return None
    fi = torch.finfo(dtype)
    for j, u in enumerate(uniq):
        c = torch.as_tensor(u).to(dtype).double().numpy()
        if np.isinf(c[0]) or np.isinf(c[-1]):
            row = int(np.argmax(np.isinf(torch.as_tensor(Xn[:, j]).to(dtype).numpy())))
            return (
                f"X {_column(j, names)} has a value at row {row} ({Xn[row, j]:.6g}) beyond the {str(dtype)[6:]} "
                f"range (+-{fi.max:.3g}) the trees store features in; rescale the column"
            )
        if len(u) < 2:
            continue
        starts = np.flatnonzero(np.r_[True, c[1:] != c[:-1]])
        if len(starts) == len(u):
            continue
        ends = np.r_[starts[1:], len(u)] - 1
        span = u[ends] - u[starts]
        bad = span > fi.eps * (u[-1] - u[0])
        if bad.any():
            g = int(np.flatnonzero(bad)[0])
            return (
                f"X {_column(j, names)} has {len(u)} distinct values but only {len(starts)} remain in "
                f"{str(dtype)[6:]}, the precision the trees store features in ({float(u[starts[g]])!r} and "
                f"{float(u[ends[g]])!r} become equal, so no split could separate them); centre or scale the column "
                f"(e.g. subtract its median {float(np.median(Xn[:, j]))!r}) before fitting, or leave dtype "
                f"at its default"
            )
    return None


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
                return f"row {i}, {_column(j, names)} holds {v!r}: "
    return ""


def as_feature_matrix(X: Any, n_features: Optional[int] = None, name: str = "X") -> np.ndarray:
    """Validate a feature matrix and return it as a float64 numpy array.

    Parameters
    ----------
    X : array-like [N, D]
        Numbers only; a 1-D input is refused (ambiguous) rather than guessed.
    n_features : int, optional
        If given, ``D`` must equal it (test data vs. training data).
    name : str
        Name used in error messages.

    Returns
    -------
    numpy.ndarray [N, D], float64
    """
    _check_no_categoricals(X, name)
    arr = _to_numpy(X, name)
    if arr.dtype == object or arr.dtype.kind in "US":
        try:
            arr = arr.astype(np.float64)
        except (TypeError, ValueError) as exc:
            raise InputTypeError(f"{name} must be numeric; {_first_non_number(arr, _frame_columns(X))}could not "
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
    arr = arr.astype(np.float64, copy=False)
    if not arr.flags.writeable:
        # a pandas frame's values may be read-only; torch warns about (and would share) them
        arr = arr.copy()
    bad = ~np.isfinite(arr)
    if bad.any():
        r, c = np.argwhere(bad)[0]
        kind = "NaN" if np.isnan(arr[r, c]) else "infinite"
        raise ValueError(
            f"{name} contains {int(bad.sum())} non-finite value(s); first is {kind} at row {r}, column {c}"
        )
    if n_features is not None and arr.shape[1] != n_features:
        raise ValueError(f"{name} has {arr.shape[1]} features, but the model is expecting {n_features} features as "
                         f"input (the model was fitted with {n_features})")
    return arr


class Data:
    """Validated training data for Bayesian trees.

    Parameters
    ----------
    X : array-like [N, D]
        Features (numpy, torch on any device, pandas, nested lists). NaN/inf are errors;
        constant features are allowed (they are never split on). Pandas categorical
        columns, ordered or not, are refused (their codes follow each frame's category
        list; convert them explicitly). With an explicit ``dtype``, a value beyond its
        range and a column whose distinct values it cannot tell apart (1e8 and 1e8 + 1 in
        float32) are refused with the column named, since the trees compare features in
        ``dtype``.
    y : array-like [N]
        Labels. Classification: any discrete labels (ints with gaps, strings, bools),
        mapped to ``0..K-1`` (``classes_`` maps back); more than half as many inferred
        classes as rows (and over 100) is refused as a likely regression target, and so
        are class counts whose one-hot leaf statistics would not fit in the device's
        memory. Labels of types that cannot be sorted together (an int among strings) are
        refused. Regression: finite floats whose sums of squares fit in float64
        (``(N * max|y|)^2`` finite).
    task : {"classification", "regression"}, optional
        Inferred when omitted: float labels with non-integer values mean regression
        only if ``task="regression"`` is given; otherwise they are refused, as
        scikit-learn refuses continuous labels for a classifier.
    n_classes : int, optional
        Number of classes when labels are already ``0..K-1`` ints; allows a single
        observed class and classes absent from the training data.
    classes : sequence, optional
        Explicit class list (its order defines the codes).
    dtype : torch.dtype, optional
        Floating dtype of ``X``. Default (None): float32 when it keeps every column's
        distinct values distinct and in range (what a split can tell apart depends only on
        the order of the values; values closer than float32's resolution over the column's
        range, such as 0.3 and 0.1 + 0.2, are one value to every split), else float64, so
        every finite column is accepted: latitudes with six decimals, N(1000, 10) draws,
        1e8 and 1e8 + 1, 1e39. Given explicitly, it is used as it is (and checked as above).
    device : str or torch.device, optional

    Attributes
    ----------
    X : Tensor [N, D] float
    y : Tensor [N] long (classification) or float64 (regression)
    n_classes : int or None
    classes_ : numpy.ndarray [K] or None
    task : str
    feature_min, feature_max : Tensor [D]
    sorted_values : Tensor [D, U] float, distinct values per feature, padded with +inf
    n_unique : Tensor [D] long
    X_rank : Tensor [N, D] long, rank of ``X[n, d]`` among ``sorted_values[d]``
    """

    def __init__(
        self,
        X: Any,
        y: Any,
        *,
        task: Optional[str] = None,
        n_classes: Optional[int] = None,
        classes: Optional[Sequence] = None,
        dtype: Optional[torch.dtype] = None,
        device: Optional[str | torch.device] = None,
    ) -> None:
        if task is not None:
            check_choice("task", task, _TASKS)
        Xn = as_feature_matrix(X, name="X")
        yn = _to_numpy(y, "y")
        if yn.ndim == 2 and yn.shape[1] == 1:
            yn = yn[:, 0]
        if yn.ndim != 1:
            raise ValueError(f"y must be 1-D [n_samples], got shape {tuple(yn.shape)}")
        if yn.shape[0] != Xn.shape[0]:
            raise ValueError(f"X has {Xn.shape[0]} rows but y has {yn.shape[0]} labels")
        if task is None:
            task = "classification"
        self.task = task
        dev = torch.device(device) if device is not None else None
        if task == "classification":
            codes, self.classes_ = encode_class_labels(yn, n_classes, classes)
            self.n_classes = len(self.classes_)
            self.y = torch.as_tensor(codes, dtype=torch.long, device=dev)
        else:
            if n_classes is not None or classes is not None:
                raise ValueError("n_classes/classes only apply to classification")
            try:
                yf = yn.astype(np.float64)
            except (TypeError, ValueError) as exc:
                raise ValueError(f"y must be numeric for regression: {exc}") from exc
            if not np.isfinite(yf).all():
                raise ValueError(f"y contains {int((~np.isfinite(yf)).sum())} non-finite regression target(s)")
            _check_target_magnitude(yf)
            self.classes_ = None
            self.n_classes = None
            self.y = torch.as_tensor(yf, dtype=torch.float64, device=dev)
        if task == "classification":
            need = 12 * Xn.shape[0] * self.n_classes  # one-hot int64 rows, then their float32 copy
            have = _memory_bytes(dev)
            if have is not None and need > have:
                raise ValueError(
                    f"y has {self.n_classes} classes: the leaves' class counts of {Xn.shape[0]} rows would need "
                    f"about {need:.3g} bytes, more than the {have:.3g} bytes of memory of {dev or 'the CPU'}"
                )
        names = _frame_columns(X)
        # one sort per column gives both the distinct values and every point's rank
        uniq, inverse = zip(*(np.unique(Xn[:, j], return_inverse=True) for j in range(Xn.shape[1]))) \
            if Xn.shape[1] else ((), ())
        if dtype is None:  # float32 unless it would lose a column's order (then float64)
            dtype = torch.float64 if _float_storage_problem(uniq, torch.float32, Xn) else torch.float32
        self.X = torch.as_tensor(Xn, dtype=dtype, device=dev)
        self._build_ranks(Xn, dev, names, uniq, inverse)

    # ------------------------------------------------------------------ labels
    def decode_labels(self, codes: Any) -> np.ndarray:
        """Map class codes ``0..K-1`` back to the original labels.

        Parameters
        ----------
        codes : array-like [M] of int

        Returns
        -------
        numpy.ndarray [M]
        """
        if self.classes_ is None:
            raise ValueError("decode_labels only applies to classification data")
        return self.classes_[_to_numpy(codes, "codes").astype(np.int64)]

    # ---------------------------------------------------------------- features
    def _build_ranks(self, Xn: np.ndarray, dev, names: Optional[Sequence], uniq, inverse) -> None:
        n, d = Xn.shape
        # Dense ranks let the samplers compare in integer space and enumerate the
        # intervals between consecutive distinct values (the optimal proposal and
        # the exact evidence both need them).
        # The samplers compare X and thresholds in X's dtype, not through these float64
        # ranks; splitting on ranks would change every sampler and every prediction, so
        # data the dtype cannot hold is refused instead.
        problem = _float_storage_problem(uniq, self.X.dtype, Xn, names)
        if problem:
            raise ValueError(problem)
        if self.X.dtype != torch.float64:
            uniq, inverse = list(uniq), list(inverse)
            for j, u in enumerate(uniq):
                stored = torch.as_tensor(u).to(self.X.dtype).numpy()
                if len(u) > 1 and bool((stored[1:] == stored[:-1]).any()):
                    # values that merge in the stored dtype (below the column's resolution) are one value to
                    # every sampler's comparison, so they must share a rank (else node counts from ranks and
                    # from X disagree)
                    uniq[j], inverse[j] = np.unique(self.X[:, j].cpu().numpy(), return_inverse=True)
        n_unique = np.array([len(u) for u in uniq], dtype=np.int64)
        umax = int(n_unique.max())
        sv = np.full((d, umax), np.inf, dtype=np.float64)
        ranks = np.empty((n, d), dtype=np.int64)
        for j, u in enumerate(uniq):
            sv[j, : len(u)] = u
            ranks[:, j] = inverse[j].reshape(-1)
        self.sorted_values = torch.as_tensor(sv, dtype=self.X.dtype, device=dev)
        self.n_unique = torch.as_tensor(n_unique, device=dev)
        self.X_rank = torch.as_tensor(ranks, device=dev)
        self.feature_min = self.X.min(0).values
        self.feature_max = self.X.max(0).values

    @property
    def n(self) -> int:
        """Number of data points ``N``."""
        return self.X.shape[0]

    @property
    def d(self) -> int:
        """Number of features ``D``."""
        return self.X.shape[1]

    @property
    def device(self) -> torch.device:
        """Device of the tensors."""
        return self.X.device

    @property
    def is_classification(self) -> bool:
        """True for classification data."""
        return self.task == "classification"

    def check_X(self, X: Any) -> torch.Tensor:
        """Validate test features against this training data.

        Parameters
        ----------
        X : array-like [M, D]

        Returns
        -------
        Tensor [M, D] on this data's device and dtype.
        """
        if isinstance(X, torch.Tensor) and X.dim() == 2 and X.shape[1] == self.d and X.shape[0] > 0:
            if not torch.isfinite(X).all():
                as_feature_matrix(X, self.d)  # raises with the location of the bad value
            return X.to(device=self.device, dtype=self.X.dtype)
        arr = as_feature_matrix(X, self.d)
        return torch.as_tensor(arr, dtype=self.X.dtype, device=self.device)

    def encode_y(self, y: Any) -> torch.Tensor:
        """Encode test labels with the training coding.

        Parameters
        ----------
        y : array-like [M]

        Returns
        -------
        Tensor [M]: long codes (classification) or float64 (regression).
        """
        yn = _to_numpy(y, "y")
        if yn.ndim != 1:
            raise ValueError(f"y must be 1-D, got shape {tuple(yn.shape)}")
        if self.task == "regression":
            yf = yn.astype(np.float64)
            if not np.isfinite(yf).all():
                raise ValueError("y contains non-finite regression targets")
            return torch.as_tensor(yf, dtype=torch.float64, device=self.device)
        lookup = {c: i for i, c in enumerate(self.classes_.tolist())}
        try:
            codes = [lookup[v] for v in yn.tolist()]
        except KeyError as exc:
            raise ValueError(f"label {exc.args[0]!r} was not seen in training (classes: {self.classes_.tolist()})") from exc
        return torch.as_tensor(codes, dtype=torch.long, device=self.device)

    def to(self, device) -> "Data":
        """Return a copy of this data on ``device`` (tensors moved, metadata shared)."""
        out = object.__new__(Data)
        out.__dict__.update(self.__dict__)
        for name in ("X", "y", "sorted_values", "n_unique", "X_rank", "feature_min", "feature_max"):
            setattr(out, name, getattr(self, name).to(device))
        return out

    def subset(self, index: Any) -> "Data":
        """Rows ``index`` of this data, keeping the class coding (K and classes_).

        Parameters
        ----------
        index : LongTensor [M] or boolean mask [N]
        """
        idx = torch.as_tensor(index, device=self.device)
        y = self.y[idx].cpu().numpy()
        if self.task == "classification":
            return Data(self.X[idx], y, n_classes=self.n_classes, dtype=self.X.dtype, device=self.device)._with_classes(self.classes_)
        return Data(self.X[idx], y, task="regression", dtype=self.X.dtype, device=self.device)

    def _with_classes(self, classes_: np.ndarray) -> "Data":
        self.classes_ = classes_
        return self

    def __repr__(self) -> str:
        extra = f", n_classes={self.n_classes}" if self.n_classes else ""
        return f"Data(n={self.n}, d={self.d}, task={self.task!r}{extra}, device={self.device})"


def coerce_data(data) -> "Data":
    """A sampler's ``data`` argument as :class:`Data`.

    Parameters
    ----------
    data : Data, or a pair ``(X, y)`` of array-likes (validated as ``Data(X, y)`` does)

    Returns
    -------
    Data

    Raises
    ------
    TypeError
        Anything else.
    """
    if isinstance(data, Data):
        return data
    if isinstance(data, (tuple, list)) and len(data) == 2:
        return Data(*data)
    raise TypeError(f"data must be a torchtree.Data or a pair (X, y), got {type(data).__name__}")


def resolve_device(device) -> torch.device:
    """The device a sampler runs on.

    Parameters
    ----------
    device : str, torch.device or None
        ``"auto"`` or None: CUDA when available, else CPU.

    Returns
    -------
    torch.device

    Raises
    ------
    ValueError
        CUDA was asked for but is not available.
    """
    if device is None or device == "auto":
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    dev = torch.device(device)
    if dev.type == "cuda" and not torch.cuda.is_available():
        raise ValueError("device='cuda' was requested but CUDA is not available")
    return dev
