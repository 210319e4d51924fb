"""What every plot of :mod:`torchtree.plot` shares: the lazy matplotlib import, the posterior behind an
estimator, feature names, credible-band quantiles over weighted draws and the Axes to draw on."""
from __future__ import annotations

from typing import Any, List, Optional, Sequence, Tuple

import numpy as np
import torch

from torchtree.model.bart_posterior import BARTPosterior
from torchtree.model.posterior import TreePosterior
from torchtree.model.posterior_base import Posterior
from torchtree.model.soft_posterior import SoftTreePosterior

__all__ = ["MATPLOTLIB_MISSING", "require_matplotlib", "posterior_of", "kind_of", "input_names", "n_inputs",
           "band_quantiles", "weighted_quantiles", "wilson_interval", "new_axes", "as_numpy", "class_index"]

MATPLOTLIB_MISSING = "torchtree.plot needs matplotlib, which is not installed: pip install matplotlib"

#: the names of the three kinds of posterior, by class
KINDS = ((TreePosterior, "hard"), (BARTPosterior, "bart"), (SoftTreePosterior, "soft"))


def require_matplotlib():
    """The ``matplotlib`` module; ImportError naming the ``plot`` extra when it is not installed."""
    try:
        import matplotlib
    except ImportError as exc:
        raise ImportError(MATPLOTLIB_MISSING) from exc
    return matplotlib


def posterior_of(obj: Any) -> Posterior:
    """The posterior of a fitted estimator (its ``posterior_``), or ``obj`` itself when it is one.

    Raises
    ------
    ValueError
        ``obj`` is an estimator that is not fitted.
    TypeError
        ``obj`` is neither a posterior nor an estimator.
    """
    if isinstance(obj, Posterior):
        return obj
    post = getattr(obj, "posterior_", None)
    if isinstance(post, Posterior):
        return post
    if hasattr(obj, "fit"):
        raise ValueError(f"this {type(obj).__name__} is not fitted yet; call fit(X, y) before plotting")
    raise TypeError(f"expected a torchtree posterior or a fitted torchtree estimator, got {type(obj).__name__}")


def kind_of(post: Posterior) -> str:
    """``"hard"`` (TreePosterior), ``"bart"`` (BARTPosterior) or ``"soft"`` (SoftTreePosterior)."""
    for cls, name in KINDS:
        if isinstance(post, cls):
            return name
    raise TypeError(f"torchtree.plot does not know posteriors of type {type(post).__name__}")


def n_inputs(post: Posterior) -> int:
    """Input columns the posterior takes (a coded table's inputs, not its split columns)."""
    enc = getattr(post, "encoder", None)
    return int(enc.n_inputs) if enc is not None else int(post.n_features)


def input_names(post: Posterior, X: Any = None, feature_names: Optional[Sequence[str]] = None) -> List[str]:
    """Names of ``X``'s input columns, in ``X``'s order (what partial dependence and ICE index): ``feature_names``
    when given (ValueError unless one per input), else ``X``'s string column names when it is a table that has
    them, else the names the posterior keeps (training table, command line), else ``x0, x1, ...``."""
    n = n_inputs(post)
    if feature_names is not None:
        names = [str(v) for v in feature_names]
        if len(names) != n:
            raise ValueError(f"feature_names has {len(names)} names; the posterior takes {n} input columns")
        return names
    cols = getattr(X, "columns", None)
    if cols is not None:
        names = list(cols)
        if len(names) == n and all(isinstance(c, str) for c in names):
            return names
    kept = getattr(post, "feature_names", None)
    if kept is not None and len(kept) == n:
        return [str(v) for v in kept]
    enc = getattr(post, "encoder", None)
    if enc is not None:
        return [str(v) for v in enc.names]
    return [f"x{d}" for d in range(n)]


def training_names(post: Posterior, X: Any = None, feature_names: Optional[Sequence[str]] = None) -> List[str]:
    """Names of the input columns in the training order (what a tree's splits and the importances index):
    :func:`input_names`, except that a table holding the posterior's kept names in another order (read by
    name) gives them in the training order."""
    names = input_names(post, X, feature_names)
    kept = getattr(post, "feature_names", None)
    if feature_names is None and kept is not None and sorted(str(v) for v in kept) == sorted(names):
        return [str(v) for v in kept]
    return names


def class_index(post: Posterior, target_class: Any, n_classes: int) -> int:
    """Index of ``target_class`` among the posterior's classes (an original label; a code when the
    posterior keeps no labels); None: the last class (the positive class of a binary task)."""
    if target_class is None:
        return n_classes - 1
    classes = getattr(post, "classes_", None)
    if classes is not None:
        hits = [k for k, c in enumerate(np.asarray(classes).tolist()) if c == target_class or str(c) == str(target_class)]
        if hits:
            return hits[0]
        raise ValueError(f"target_class {target_class!r} is not one of the classes {list(np.asarray(classes).tolist())}")
    if isinstance(target_class, (int, np.integer)) and 0 <= int(target_class) < n_classes:
        return int(target_class)
    raise ValueError(f"target_class {target_class!r}: the posterior has {n_classes} classes coded 0..{n_classes - 1}")


def band_quantiles(interval: Any) -> Tuple[float, float]:
    """``(lower, upper)`` quantiles of a credible band: ``interval`` is a pair of quantiles or a
    central level (``0.9`` = ``(0.05, 0.95)``)."""
    if isinstance(interval, (int, float)) and not isinstance(interval, bool):
        level = float(interval)
        if not 0 < level < 1:
            raise ValueError(f"interval: a central level must lie in (0, 1), got {interval}")
        return (1 - level) / 2, (1 + level) / 2
    try:
        lo, hi = (float(v) for v in interval)
    except (TypeError, ValueError):
        raise ValueError(f"interval must be a level in (0, 1) or a pair of quantiles (lo, hi), got {interval!r}") from None
    if not 0 <= lo < hi <= 1:
        raise ValueError(f"interval quantiles must satisfy 0 <= lo < hi <= 1, got {interval!r}")
    return lo, hi


def weighted_quantiles(values: np.ndarray, weights: np.ndarray, qs: Sequence[float]) -> np.ndarray:
    """Quantiles over the draws (axis 0) of ``values [S, ...]`` weighted by ``weights [S]``:
    ``[len(qs), ...]``; the smallest value whose cumulative weight reaches ``q`` (the inverse of
    the weighted empirical distribution function)."""
    v = np.asarray(values, dtype=np.float64)
    w = np.asarray(weights, dtype=np.float64)
    w = w / w.sum()
    order = np.argsort(v, axis=0, kind="stable")
    sv = np.take_along_axis(v, order, 0)
    cw = np.cumsum(w[order], axis=0)
    out = []
    for q in qs:
        idx = np.minimum((cw < q - 1e-12).sum(0), v.shape[0] - 1)
        out.append(np.take_along_axis(sv, idx[None], 0)[0])
    return np.stack(out)


def wilson_interval(p: np.ndarray, n: np.ndarray, lo: float, hi: float) -> Tuple[np.ndarray, np.ndarray]:
    """The Wilson score interval of proportions ``p`` out of ``n`` trials, between the quantiles
    ``lo`` and ``hi`` of its normal approximation (``(0.05, 0.95)``: a 90% interval): each bound is
    Wilson's with its own ``z`` (``z = Phi^{-1}(1 - lo)`` below, ``Phi^{-1}(hi)`` above), so an
    asymmetric pair gives its one-sided bounds. A NaN ``n`` (the ESS of traces that never moved)
    counts as one trial."""
    p = np.asarray(p, dtype=np.float64)
    n = np.asarray(n, dtype=np.float64)
    n = np.maximum(np.where(np.isnan(n), 1.0, n), 1e-12)

    def bound(q: float, sign: float) -> np.ndarray:
        z = float(torch.special.ndtri(torch.tensor(q, dtype=torch.float64)))
        centre = (p + z * z / (2 * n)) / (1 + z * z / n)
        half = z / (1 + z * z / n) * np.sqrt(np.maximum(p * (1 - p) / n + z * z / (4 * n * n), 0.0))
        return np.clip(centre + sign * half, 0, 1)

    return bound(1.0 - lo, -1.0), bound(hi, 1.0)


def new_axes(ax: Any, n: int, figsize: Optional[Tuple[float, float]] = None):
    """``n`` Axes to draw on: ``ax`` as given (one Axes, or a sequence of ``n``), else a new pyplot
    figure of ``n`` panels in a row. One Axes when ``n`` is 1, else a numpy array of them."""
    require_matplotlib()
    if ax is None:
        import matplotlib.pyplot as plt

        fig, axes = plt.subplots(1, n, figsize=figsize or (4.5 * n, 3.6), squeeze=False)
        axes = axes[0]
    else:
        axes = np.asarray(ax, dtype=object).reshape(-1)
        if axes.size != n:
            raise ValueError(f"ax: this plot draws {n} panel(s); give {n} Axes, got {axes.size}")
    return axes[0] if n == 1 else np.asarray(list(axes), dtype=object)


def as_numpy(v: Any) -> np.ndarray:
    """A tensor, list or array as a numpy array (tensors moved to the CPU)."""
    if isinstance(v, torch.Tensor):
        return v.detach().cpu().numpy()
    return np.asarray(v)
