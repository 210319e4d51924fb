"""Validated training data: :class:`Data` (features stored in an order-faithful dtype, dense ranks,
labels coded) on top of the input checks of :mod:`torchtree.model.inputs`."""
from __future__ import annotations

import os
from typing import Any, Optional, Sequence

import numpy as np
import torch

from torchtree.core.validate import check_choice
from torchtree.core.warn import warn
from torchtree.model.encoding import TableEncoder, needs_encoding
from torchtree.model.inputs import (  # as_feature_matrix, encode_class_labels, check_class_count: re-exported
    as_feature_matrix,
    check_class_count,
    check_no_missing_labels,
    check_target_magnitude,
    column_label,
    encode_class_labels,
    frame_columns,
    to_numpy,
)

__all__ = ["Data", "as_feature_matrix", "encode_class_labels", "check_class_count", "resolve_device"]

_TASKS = ("classification", "regression")
#: Integer labels with more distinct values than this, and no ``task`` given, may be a quantity (a count,
#: an age) as well as classes: ``Data`` warns (the command line asks for ``--task``)
ASK_CLASSES = 20


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
                f"X {column_label(j, names)} has a value at row {row} ({Xn[row, j]:.6g}) beyond the {str(dtype)[6:]} "
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
                f"X {column_label(j, names)} has {len(u)} distinct values but only {len(starts)} remain in "
                f"{str(dtype)[6:]}, the precision the trees store features in ({float(u[starts[g]])!r} and "
                f"{float(u[ends[g]])!r} become equal, so no split could separate them); centre or scale the column "
                f"(e.g. subtract its median {float(np.median(Xn[:, j]))!r}) before fitting, or leave dtype "
                f"at its default"
            )
    return None


class Data:
    """Validated training data for Bayesian trees.

    Parameters
    ----------
    X : array-like [N, D]
        Features (numpy, torch on any device, pandas, nested lists). Infinite values are
        errors; constant features are allowed (they are never split on). Missing values
        (NaN, None) and categorical columns (pandas ``category``, text) are coded by a
        :class:`~torchtree.model.encoding.TableEncoder` (``encoder``): missing values are
        modelled (MIA), categories split by level subsets; see that module for the model.
        With an explicit ``dtype``, a value beyond its range and a column whose distinct
        values it cannot tell apart (1e8 and 1e8 + 1 in float32) are refused with the
        column named, since the trees compare features in ``dtype``.
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
        Where ``X`` and ``y`` live: ``"cpu"``, ``"cuda"``, ``"cuda:1"``, or ``"auto"`` (CUDA when
        present). None (default): ``X``'s device when it is a tensor, else the CPU.
    categorical_features : "from_dtype" (default), None, or indices / names / boolean mask
        Which columns are categorical (:meth:`TableEncoder.fit`): by default pandas
        ``category`` columns and columns holding text.

    Raises
    ------
    ValueError
        Input refused as above (each message names the column, row or setting to fix: the
        documentation's refusals page lists them); a ``device`` that is not available.
    TypeError
        ``X`` or ``y`` that is not an array of numbers or labels (a dict, a string, ...; the error
        is also a ValueError, as scikit-learn raises).

    Attributes
    ----------
    X : Tensor [N, D] float, the split columns (the coded table when ``encoder`` is set)
    encoder : TableEncoder, the table's coding (``encoder.is_coded``: missing values or categories
        were coded; else the columns as they are, with medians that fill missing values at prediction)
    groups : LongTensor [D] or None, the input column of each split column (None: not coded)
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
        categorical_features: Any = "from_dtype",
    ) -> None:
        if task is not None:
            check_choice("task", task, _TASKS)
        encode = needs_encoding(X, categorical_features)
        Xn = None if encode else as_feature_matrix(X, name="X", training=True)
        n_rows = Xn.shape[0] if Xn is not None else len(X)
        yn = to_numpy(y, "y")
        if yn.ndim == 2 and yn.shape[1] == 1:
            yn = yn[:, 0]
        if yn.ndim != 1:
            raise ValueError(f"y must be 1-D [n_samples], got shape {tuple(yn.shape)}")
        if yn.shape[0] != n_rows:
            raise ValueError(f"X has {n_rows} rows but y has {yn.shape[0]} labels")
        if task is None:
            task = "classification"
            if yn.dtype.kind in "iu" and len(np.unique(yn)) > ASK_CLASSES:
                warn(f"y holds {len(np.unique(yn))} distinct integers, taken as that many classes (task omitted: "
                     "classification); for a quantity (a count, an age) pass Data(X, y, task='regression')",
                     UserWarning)
        self.task = task
        dev = resolve_device(device) if device is not None else None
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
            check_no_missing_labels(yf, what="target")
            check_target_magnitude(yf)
            self.classes_ = None
            self.n_classes = None
            self.y = torch.as_tensor(yf, dtype=torch.float64, device=dev)
        self.encoder: Optional[TableEncoder] = None
        self.groups: Optional[torch.Tensor] = None
        if encode:
            self.encoder = TableEncoder.fit(X, self.y.cpu().numpy(), categorical_features)
            Xn = self.encoder.transform(X)
            self.groups = torch.as_tensor(self.encoder.groups, device=dev)
        if task == "classification":
            need = 12 * Xn.shape[0] * self.n_classes  # one-hot int64 rows, then their float32 copy
            have = _memory_bytes(dev)
            if have is not None and need > have:
                raise ValueError(
                    f"y has {self.n_classes} classes: the leaves' class counts of {Xn.shape[0]} rows would need "
                    f"about {need:.3g} bytes, more than the {have:.3g} bytes of memory of {dev or 'the CPU'}"
                )
        names = frame_columns(X)
        # one sort per column gives both the distinct values and every point's rank
        uniq, inverse = zip(*(np.unique(Xn[:, j], return_inverse=True) for j in range(Xn.shape[1]))) \
            if Xn.shape[1] else ((), ())
        for j, u in enumerate(uniq):
            with np.errstate(over="ignore"):
                wide = len(u) > 1 and not np.isfinite(u[-1] - u[0])
            if wide:  # cuts between values, centring and the stand-ins of missing values need the span
                g = int(self.encoder.groups[j]) if self.encoder is not None else j
                raise ValueError(f"X {column_label(g, names)} spans more than float64 can hold (from {u[0]:.3g} to "
                                 f"{u[-1]:.3g}: max - min overflows); rescale the column (e.g. divide it by 1e10)")
        if self.encoder is None:  # a complete numeric table: its columns as they are, medians for prediction
            self.encoder = TableEncoder.plain(Xn, frame_columns(X))
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
        return self.classes_[to_numpy(codes, "codes").astype(np.int64)]

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
                    # from X disagree); rounding is monotone, so the merged values are runs of the sorted ones
                    first = np.r_[True, stored[1:] != stored[:-1]]
                    uniq[j], inverse[j] = stored[first], (np.cumsum(first) - 1)[inverse[j]]
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
        yn = to_numpy(y, "y")
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
        if self.groups is not None:
            out.groups = self.groups.to(device)
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
            out = Data(self.X[idx], y, n_classes=self.n_classes, dtype=self.X.dtype, device=self.device)
            out.classes_ = self.classes_
        else:
            out = Data(self.X[idx], y, task="regression", dtype=self.X.dtype, device=self.device)
        out.encoder, out.groups = self.encoder, self.groups  # the coded columns keep their input columns
        return out

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


def resolve_device(device, data_device=None) -> torch.device:
    """The device a run uses: the one resolution every method and face shares.

    Parameters
    ----------
    device : str, torch.device or None
        None: ``data_device`` (the data's own device; the CPU when it is None); ``"auto"``: CUDA
        when available, else the CPU; anything else names a device.
    data_device : torch.device, optional

    Returns
    -------
    torch.device

    Raises
    ------
    ValueError
        CUDA was asked for but is not available, or ``device`` names no device.
    """
    if device is None:
        return torch.device(data_device) if data_device is not None else torch.device("cpu")
    if isinstance(device, str) and device == "auto":
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    try:
        dev = torch.device(device)
    except (RuntimeError, TypeError) as exc:
        raise ValueError(f"device {device!r} is not a device: {exc}") from None
    if dev.type == "cuda" and not torch.cuda.is_available():
        raise ValueError("device='cuda' was requested but CUDA is not available")
    return dev
