"""Input handling for the soft-tree samplers: plain tensors or ``torchtree.Data``.

Soft splits act on inputs min-max scaled to [0, 1] with the *training* ranges
(paper 004, Sec. 2.3; thresholds have a Beta(1, 1) prior on (0, 1)). This module
turns whatever the user passed into a :class:`SoftData` record: scaled float inputs,
labels, task, class count and the ranges needed to scale test inputs the same way.
It does not validate beyond what the soft samplers need; full validation lives in
``torchtree.Data``, which is accepted as is.

Signed splits (``signed=True``, not in the paper): the scaled inputs ``x`` are followed
by their mirror images ``1 - x``, so a split's weights on the simplex over the ``2 D``
columns give ``x . (w+ - w-) + sum(w-)``: any direction in the L1 ball, with the
projection still in [0, 1] where the Beta threshold prior lives. The paper's simplex
weights alone only reach directions with non-negative coefficients.
"""
from __future__ import annotations

import math
from dataclasses import dataclass, replace
from typing import Any, Optional, Tuple

import numpy as np
import torch

from torchtree.model.data import as_feature_matrix, encode_class_labels, resolve_device
from torchtree.model.inputs import to_numpy
from torchtree.core.validate import check_choice

__all__ = ["SoftData", "as_soft_data", "mirror_columns", "scale_inputs", "FLOAT_DTYPES", "FLOAT32_TARGET_LIMIT",
           "run_dtype", "target_standardization", "squeezed_columns"]

# the float dtypes the soft-tree kernels and samplers run in
FLOAT_DTYPES = (torch.float32, torch.float64)

#: Regression targets larger than this in magnitude make a float32 run switch to float64:
#: the leaf means sit at the targets' scale and the Gaussian likelihood squares them, and
#: float32 overflows beyond 3.4e38 (a 1e39 target, or the prior variance of a 1e150 one).
#: Below it (every ordinary data set) nothing changes.
FLOAT32_TARGET_LIMIT = 1e15


#: why soft trees refuse missing values and categories, and what to do instead (fit and predict say it)
_NUMERIC_ONLY = ("soft trees take numeric tables without missing values. Use a hard-tree method ('smc', 'mcmc', "
                 "'smc-moves', 'bart'), which model missing values and split categories by subsets of their levels, "
                 "or impute and one-hot encode the table first")


def run_dtype(y: torch.Tensor, task: str, dtype: torch.dtype) -> torch.dtype:
    """The float dtype a soft-tree run on targets ``y [N]`` uses: ``dtype``, or float64 for a
    float32 regression whose targets exceed :data:`FLOAT32_TARGET_LIMIT` in magnitude."""
    if task == "regression" and dtype == torch.float32 and y.numel() > 0:
        if float(y.to(torch.float64).abs().max()) > FLOAT32_TARGET_LIMIT:
            return torch.float64
    return dtype


@dataclass
class SoftData:
    """Training data prepared for soft trees.

    Attributes
    ----------
    X : Tensor [N, D'] float, scaled to [0, 1] with ``feature_min`` / ``feature_max``;
        ``D' = D``, or ``2 D`` with ``signed`` (columns ``x`` then ``1 - x``)
    y : Tensor [N]: long class codes (classification) or float (regression)
    task : str, "classification" or "regression"
    n_classes : int or None
    feature_min, feature_max : Tensor [D]
    classes : numpy array [K] or None, original labels of codes 0..K-1 (from ``Data``)
    signed : bool, whether ``X`` carries the mirrored columns (signed splits)
    y_offset, y_scale : float
        Regression: ``y`` holds the standardised targets ``(y_raw - y_offset) / y_scale``
        (``as_soft_data(..., standardize=True)``); the defaults 0 and 1 mean ``y`` is the
        raw target. A posterior maps its outputs back with ``y_offset + y_scale * value``.
    """

    X: torch.Tensor
    y: torch.Tensor
    task: str
    n_classes: Optional[int]
    feature_min: torch.Tensor
    feature_max: torch.Tensor
    classes: Optional[Any] = None
    signed: bool = False
    y_offset: float = 0.0
    y_scale: float = 1.0

    @property
    def standardized(self) -> bool:
        """Whether ``y`` holds standardised targets (``y_offset != 0`` or ``y_scale != 1``)."""
        return self.y_offset != 0.0 or self.y_scale != 1.0

    @property
    def target_log_jacobian(self) -> float:
        """``-N log(y_scale)``: ``log p(y_raw) = log p(y) + target_log_jacobian`` for a density
        of the ``N`` targets (0 when ``y`` is the raw target)."""
        return -int(self.y.shape[0]) * math.log(self.y_scale) if self.standardized else 0.0

    @property
    def device(self) -> torch.device:
        """Where the data (and so a run on it) lives."""
        return self.X.device

    @property
    def n_features(self) -> int:
        """D', the columns the splits weigh (``2 D`` with signed splits)."""
        return int(self.X.shape[1])

    @property
    def n_input_features(self) -> int:
        """D, the columns of the raw inputs."""
        return int(self.feature_min.numel())

    def check_X(self, X: Any) -> torch.Tensor:
        """Validate raw test inputs against the training features.

        Parameters
        ----------
        X : array-like [M, D], same ``D`` as the training data, finite numbers

        Returns
        -------
        Tensor [M, D] (raw, not scaled)

        Raises
        ------
        ValueError
            Missing values (NaN; the message says what to do instead), other non-finite or
            non-numeric values, or another number of columns.
        """
        D = self.n_input_features
        if isinstance(X, torch.Tensor) and X.dim() == 2 and X.shape[1] == D:
            if X.is_floating_point() and torch.isfinite(X).all():
                return X
        try:
            return torch.as_tensor(as_feature_matrix(X.cpu() if isinstance(X, torch.Tensor) else X, D))
        except ValueError as refused:  # for missing values, say what to do instead
            try:
                values = np.asarray(to_numpy(X, "X"), dtype=np.float64)  # pandas' pd.NA as NaN
            except (TypeError, ValueError):  # text and the like: as_feature_matrix's message stands
                values = None
            if values is not None and values.ndim == 2 and np.isnan(values).any():
                r, c = (int(v[0]) for v in np.nonzero(np.isnan(values)))
                raise ValueError(f"X has {int(np.isnan(values).sum())} missing value(s) (NaN; the first at row {r}, "
                                 f"column {c}), and {_NUMERIC_ONLY}") from None
            raise refused

    def scale(self, X: torch.Tensor) -> torch.Tensor:
        """Scale new raw inputs [M, D] with the training ranges, [M, D']."""
        Xs = scale_inputs(X, self.feature_min, self.feature_max, self.X.dtype)
        return mirror_columns(Xs) if self.signed else Xs


def scale_inputs(
    X: torch.Tensor, feature_min: torch.Tensor, feature_max: torch.Tensor, dtype=torch.float32
) -> torch.Tensor:
    """Min-max scale ``X [M, D]`` to the training range; constant features map to 0.5.

    Test points outside the training range fall outside [0, 1]; soft splits handle
    that without clipping, up to ``1e-8`` of ``dtype``'s largest number (3.4e30 for
    float32): a scaled value beyond it is clamped there, so that it stays finite after
    the cast and routes like the most extreme representable value (as a hard tree routes
    any value beyond its training range like the range's end). Returns [M, D] ``dtype``.
    """
    X = torch.as_tensor(X)
    lo = feature_min.to(device=X.device, dtype=torch.float64)
    span = feature_max.to(device=X.device, dtype=torch.float64) - lo
    Xs = (X.to(torch.float64) - lo) / torch.where(span > 0, span, torch.ones_like(span))
    Xs = torch.where(span > 0, Xs, torch.full_like(Xs, 0.5))
    # a margin below the dtype's maximum: the routing sums weighted columns and divides
    # by the sharpness, which must not overflow to inf - inf = NaN either
    bound = torch.finfo(dtype).max * 1e-8
    if bool((Xs.abs() > bound).any()):
        Xs = Xs.clamp(-bound, bound)
    return Xs.to(dtype)


def target_standardization(y: torch.Tensor) -> Tuple[torch.Tensor, float, float]:
    """Standardise regression targets: ``z = (y - offset) / scale`` with the mean and the
    (unbiased) standard deviation of ``y``.

    Computed on ``y / u`` with ``u`` the power of two at or below ``max |y|`` (an exact
    scaling), so that targets of any magnitude (1e-300 as 1e300) give the same ``z``, up to
    rounding, as ``y`` itself. A constant target (or one value) has ``scale = |offset|``
    (1 when it is 0) and ``z = 0``.

    Parameters
    ----------
    y : Tensor [N] float, finite

    Returns
    -------
    (z : Tensor [N] float64, offset : float, scale : float > 0)
    """
    y = y.to(torch.float64)
    c = float(y.abs().max()) if y.numel() else 0.0
    if c == 0.0:
        return y.clone(), 0.0, 1.0
    u = math.ldexp(1.0, math.frexp(c)[1] - 1)
    v = y / u
    m = float(v.mean())
    sd = float(v.std()) if v.numel() > 1 else 0.0
    if not sd > 0.0:
        sd = abs(m) if m != 0.0 else 1.0
    return (v - m) / sd, m * u, sd * u


def squeezed_columns(data: SoftData, width: float) -> list:
    """Input columns whose training range is set by a few extreme values: the central 98% of the
    values (all but the ``max(1, N // 100)`` smallest and largest) span less than ``width`` of
    the [0, 1]-scaled range, yet more than 0 (not all equal).

    With ``width`` the soft gate's transition width (``4 h``: the gate goes from 0.12 to 0.88
    over it), such a column's bulk sits inside one split's soft transition, so splits barely
    separate its values.

    Parameters
    ----------
    data : SoftData (at least 4 rows to look at)
    width : float in (0, 1]

    Returns
    -------
    list of (column index, central span as a fraction of the range), in column order
    """
    X = data.X[:, : data.n_input_features]
    n = int(X.shape[0])
    k = max(1, n // 100)
    if n < 2 * k + 2:
        return []
    xs = X.to(torch.float64).sort(0).values
    span = (xs[n - 1 - k] - xs[k]).cpu()
    ranged = (data.feature_max - data.feature_min).cpu() > 0
    return [(j, float(span[j])) for j in range(span.numel()) if ranged[j] and 0 < float(span[j]) < width]


def mirror_columns(Xs: torch.Tensor) -> torch.Tensor:
    """``[Xs, 1 - Xs]``: scaled inputs [M, D] and their mirror images, [M, 2 D]."""
    return torch.cat([Xs, 1 - Xs], dim=1)


def _infer_task(y: torch.Tensor) -> str:
    if y.dtype in (torch.int64, torch.int32, torch.int16, torch.int8, torch.uint8, torch.bool):
        return "classification"
    return "regression"


def as_soft_data(
    data: Any,
    y: Any = None,
    *,
    task: Optional[str] = None,
    n_classes: Optional[int] = None,
    dtype: torch.dtype = torch.float32,
    device: Optional[torch.device] = None,
    signed: bool = False,
    standardize: bool = False,
) -> SoftData:
    """Coerce ``data`` (and ``y``) into :class:`SoftData`.

    Parameters
    ----------
    data : torchtree.Data, SoftData, tuple (X, y), or Tensor/array/DataFrame X [N, D]
        Anything with ``.X`` and ``.y`` attributes is read as a ``torchtree.Data``
        (its ``task``, ``n_classes``, ``feature_min`` and ``feature_max`` are used
        when present).
    y : Tensor/array [N], optional
        Labels when ``data`` is a bare feature matrix. Integer, boolean or string
        labels mean classification, floating labels regression, unless ``task`` says
        otherwise. Bare class labels are coded as ``torchtree.Data`` codes them (the
        sorted distinct labels, or ``0..n_classes-1`` when ``n_classes`` is given);
        ``SoftData.classes`` maps the codes back.
    task : {"classification", "regression"}, optional
    n_classes : int, optional
    dtype : torch.dtype, float dtype of the scaled inputs (float64 instead of float32
        for regression targets beyond :data:`FLOAT32_TARGET_LIMIT`, see :func:`run_dtype`)
    device : torch.device or str, optional; None keeps the inputs' own device, ``"auto"`` is CUDA when
        present (:func:`torchtree.model.data.resolve_device`)
    signed : bool
        Append the mirrored columns ``1 - x`` for signed splits (see the module
        docstring).
    standardize : bool
        Regression: store the standardised targets ``(y - mean) / sd`` (computed in float64
        from the targets as given, :func:`target_standardization`) with their ``y_offset`` and
        ``y_scale``; a ``SoftData`` already standardised is kept. No effect on classification.

    Returns
    -------
    SoftData

    Raises
    ------
    ValueError
        Bad inputs, a ``SoftData`` prepared with the other ``signed`` setting, or a ``Data`` coded
        from a table with missing values or categorical columns (no soft-tree model of them).
    """
    check_choice("dtype", dtype, FLOAT_DTYPES)
    device = None if device is None else resolve_device(device)
    if isinstance(data, SoftData):
        if data.signed != bool(signed):
            raise ValueError(f"this SoftData was prepared with signed={data.signed}, the model asks for "
                             f"signed_splits={bool(signed)}")
        if standardize and data.task == "regression" and not data.standardized:
            z, offset, scale = target_standardization(data.y)
            return replace(data, y=z.to(data.y.dtype), y_offset=offset, y_scale=scale)
        return data
    fmin = fmax = classes = None
    y_offset, y_scale = 0.0, 1.0
    if getattr(data, "encoder", None) is not None and data.encoder.is_coded:
        raise ValueError(
            f"X has missing values (NaN) or categorical columns (coded as {data.encoder!r}), and {_NUMERIC_ONLY}")
    if hasattr(data, "X") and hasattr(data, "y"):
        classes = getattr(data, "classes_", None)
        X, yy = data.X, data.y
        task = task or getattr(data, "task", None)
        n_classes = n_classes or getattr(data, "n_classes", None)
        fmin = getattr(data, "feature_min", None)
        fmax = getattr(data, "feature_max", None)
    elif isinstance(data, (tuple, list)) and len(data) == 2 and y is None:
        X, yy = data
    else:
        X, yy = data, y
    if yy is None:
        raise ValueError("labels y are required (pass torchtree.Data, (X, y) or X and y)")
    if not isinstance(X, torch.Tensor):
        # pandas frames, lists, numpy arrays of any numeric dtype: validated as Data does.
        # A C-ordered copy: a frame's values are column-major (and may be read-only), and
        # strides change the rounding of the routing matmuls, so the draws
        X = torch.from_numpy(np.array(as_feature_matrix(X), order="C"))
    if not isinstance(yy, torch.Tensor):
        yn = np.asarray(yy)
        if yn.dtype.kind in "USO":  # labels that are not numbers (strings, objects): classes
            if task == "regression":
                raise ValueError(f"regression needs numeric y, got dtype {yn.dtype}")
            task = "classification"
            if classes is None:
                codes, classes = encode_class_labels(yn, n_classes)
                yn, n_classes = codes, len(classes)
        yy = torch.as_tensor(np.array(yn))  # a copy: a pandas Series' values may be read-only
    if device is not None:
        X, yy = X.to(device), yy.to(device)
    if X.dim() != 2:
        raise ValueError(f"X must be 2-D [N, D], got shape {tuple(X.shape)}")
    if yy.dim() != 1 or yy.shape[0] != X.shape[0]:
        raise ValueError(f"y must be 1-D with {X.shape[0]} entries, got shape {tuple(yy.shape)}")
    if not torch.isfinite(X.to(torch.float64)).all():
        raise ValueError("X contains NaN or infinite values")
    task = task or _infer_task(yy)
    check_choice("task", task, ("classification", "regression"))
    if task == "classification":
        if classes is None:
            # bare labels ({2, 4}, {-1, 1}, ...) get the coding torchtree.Data uses:
            # codes of the sorted distinct labels, which predict() maps back
            codes, classes = encode_class_labels(yy.cpu().numpy(), n_classes)
            yy = torch.as_tensor(codes, device=yy.device)
            n_classes = len(classes)
        yy = yy.long()
        if yy.min() < 0:
            raise ValueError("class labels must be codes 0..K-1")
        n_classes = int(n_classes) if n_classes else int(yy.max().item()) + 1
    else:
        y_dtype = torch.float64 if yy.dtype == torch.float64 else dtype
        if standardize:
            if not torch.isfinite(yy.to(torch.float64)).all():
                raise ValueError("y contains NaN or infinite values")
            yy, y_offset, y_scale = target_standardization(yy)
        yy = yy.to(y_dtype)
        if not torch.isfinite(yy).all():
            raise ValueError("y contains NaN or infinite values")
        n_classes = None
    dtype = run_dtype(yy, task, dtype)
    if task == "regression" and yy.dtype != torch.float64:
        yy = yy.to(dtype)
    Xd = X.to(torch.float64)
    fmin = torch.as_tensor(fmin, device=X.device).to(torch.float64) if fmin is not None else Xd.min(0).values
    fmax = torch.as_tensor(fmax, device=X.device).to(torch.float64) if fmax is not None else Xd.max(0).values
    Xs = scale_inputs(X, fmin, fmax, dtype)
    return SoftData(
        X=mirror_columns(Xs) if signed else Xs,
        y=yy,
        task=task,
        n_classes=n_classes,
        feature_min=fmin,
        feature_max=fmax,
        classes=classes,
        signed=bool(signed),
        y_offset=y_offset,
        y_scale=y_scale,
    )


def train_test_split(
    X: torch.Tensor, y: torch.Tensor, test_fraction: float = 0.3, seed: int = 0
) -> Tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
    """Shuffle with a fixed seed and split ``(X, y)`` into train and test parts.

    One random permutation of the rows (torch's CPU generator seeded with ``seed``); its first
    ``M`` rows are the test part, the others the training part. No stratification.

    Parameters
    ----------
    X : Tensor [N, D]
    y : Tensor [N]
    test_fraction : float, default 0.3
        Share of the rows in the test part, in [0, 1].
    seed : int, default 0

    Returns
    -------
    X_train : Tensor [N - M, D]
    y_train : Tensor [N - M]
    X_test : Tensor [M, D]
    y_test : Tensor [M]
        With ``M = round(test_fraction N)``.
    """
    g = torch.Generator().manual_seed(int(seed))
    perm = torch.randperm(X.shape[0], generator=g)
    n_test = int(round(test_fraction * X.shape[0]))
    te, tr = perm[:n_test], perm[n_test:]
    return X[tr], y[tr], X[te], y[te]
