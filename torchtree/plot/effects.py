"""Feature effects from posterior draws: importance per feature, partial dependence and ICE curves.

Every quantity is computed per draw (:mod:`torchtree.plot.draws`) and then summarised over the
draws with their weights: the line is the posterior mean, the band the weighted quantiles of the
per-draw values.
"""
from __future__ import annotations

from typing import Any, Dict, Optional, Sequence

import numpy as np
import torch

from torchtree.core.validate import check_int
from torchtree.model.diagnostics import ess_columns
from torchtree.model.encoding import is_missing_cell
from torchtree.plot.common import (as_numpy, band_quantiles, class_index, input_names, kind_of, new_axes, posterior_of,
                                   require_matplotlib, weighted_quantiles, wilson_interval)
from torchtree.plot.draws import prediction_draws, split_counts, tree_inclusion

__all__ = ["feature_importance", "plot_importance", "partial_dependence", "partial_dependence_importance", "plot_pdp",
           "plot_ice"]

METRICS = ("share", "inclusion")


def feature_importance(posterior: Any, metric: str = "share", interval: Any = (0.05, 0.95)) -> Dict[str, np.ndarray]:
    """Importance of each input feature over the posterior's draws (what :func:`plot_importance` draws).

    Parameters
    ----------
    posterior : a posterior or a fitted estimator
    metric : {"share", "inclusion"}
        ``"share"``: each draw's share of its splits that use the feature; the value is the posterior
        mean share and the interval the weighted quantiles of the per-draw shares. A draw without
        splits (a single leaf) has a share of 0 for every feature, so the values sum to the posterior
        probability of a split, not to 1. (The estimators' ``feature_importances_`` is another
        estimator: the ratio of the mean numbers of splits, which sums to 1.) For soft trees a
        draw here is a topology (its share of the mean gate weight, the topologies weighted as in the
        posterior). ``"inclusion"``: the posterior probability that a tree splits on the feature at
        all (hard trees and BART, :func:`~torchtree.plot.draws.tree_inclusion`): for hard trees the
        weight of the trees that use it; for BART the posterior mean share of a forest's trees that
        use it (a forest of many trees splits on nearly every feature somewhere, so the probability
        that a *draw* uses a feature is about 1 for all of them). Its interval is the Monte Carlo
        uncertainty of the estimate, not a credible interval: for hard trees the Wilson score interval
        of the probability given the posterior's ESS; for BART the normal interval
        ``value -+ z sd / sqrt(ESS)`` of the per-draw shares, with their multi-chain ESS (correlated
        sweeps count for less), clipped to [0, 1].
    interval : pair of quantiles or a central level, default ``(0.05, 0.95)``

    Returns
    -------
    dict with ``value``, ``lower``, ``upper`` (``[D_in]`` float64 each) and ``per_draw`` ``[S, D_in]``
    with its ``weights`` ``[S]``.
    """
    post = posterior_of(posterior)
    if metric not in METRICS:
        raise ValueError(f"metric must be one of {METRICS}, got {metric!r}")
    lo, hi = band_quantiles(interval)
    if metric == "share":
        counts, w = split_counts(post)
        total = counts.sum(1, keepdims=True)
        per = np.divide(counts, total, out=np.zeros_like(counts), where=total > 0)
        value = w @ per
        lower, upper = weighted_quantiles(per, w, (lo, hi))
        return {"value": value, "lower": lower, "upper": upper, "per_draw": per, "weights": w}
    if kind_of(post) == "soft":
        raise ValueError("metric='inclusion' applies to hard trees and BART: a soft tree's gates give every feature "
                         "some weight; use metric='share'")
    per, w = tree_inclusion(post)
    value = w @ per
    if kind_of(post) == "hard":
        ess = float(getattr(post, "ess", 0.0))
        n_eff = np.full_like(value, max(ess, 1.0) if np.isfinite(ess) else 1.0)  # NaN: traces that never moved
        lower, upper = wilson_interval(value, n_eff, lo, hi)
    else:
        chain_of = post.chain_of.cpu().numpy()  # [S U] with U class utilities: a draw's forests are consecutive
        n_eff = _chain_ess_per_column(per, chain_of.reshape(per.shape[0], -1)[:, 0])
        se = per.std(0) / np.sqrt(n_eff)
        z_lo, z_hi = (float(torch.special.ndtri(torch.tensor(q, dtype=torch.float64))) for q in (1.0 - lo, hi))
        lower, upper = np.clip(value - z_lo * se, 0, 1), np.clip(value + z_hi * se, 0, 1)
    return {"value": value, "lower": lower, "upper": upper, "per_draw": per, "weights": w}


def _chain_ess_per_column(per: np.ndarray, chain_of: np.ndarray) -> np.ndarray:
    """Each column's multi-chain ESS (:func:`~torchtree.model.diagnostics.chain_ess`) of the draws
    ``per [S, D]`` whose chains ``chain_of [S]`` says; a constant column, or one too short for an
    estimate, counts every draw."""
    chains = [per[chain_of == c] for c in np.unique(chain_of)]
    n = min(len(c) for c in chains)
    e = ess_columns(np.stack([c[:n] for c in chains]))  # [chains, n, D]
    varies = per.min(0) < per.max(0)
    S = float(per.shape[0])
    return np.where(varies & np.isfinite(e), np.clip(np.nan_to_num(e), 1.0, S), S)


def plot_importance(posterior: Any, metric: str = "share", *, interval: Any = (0.05, 0.95), top: Optional[int] = None,
                    feature_names: Optional[Sequence[str]] = None, ax: Any = None):
    """Horizontal bars of each input feature's importance with credible intervals, most important on top.

    Parameters
    ----------
    posterior : TreePosterior, BARTPosterior, SoftTreePosterior, or a fitted estimator
    metric : {"share", "inclusion"}, default "share"
        See :func:`feature_importance`.
    interval : pair of quantiles or a central level, default ``(0.05, 0.95)``
    top : int, optional
        Show only the ``top`` most important features.
    feature_names : sequence of str, optional
        Default: the names the posterior keeps (training table's columns), else ``x0, x1, ...``.
    ax : matplotlib Axes, optional

    Returns
    -------
    matplotlib Axes; one bar (a ``Rectangle`` in ``ax.patches``) per feature shown, labelled by the
    y tick labels.
    """
    require_matplotlib()
    post = posterior_of(posterior)
    imp = feature_importance(post, metric, interval)
    names = list(feature_names) if feature_names is not None else input_names(post)
    if len(names) != len(imp["value"]):
        raise ValueError(f"feature_names has {len(names)} names; the posterior has {len(imp['value'])} features")
    order = np.argsort(-imp["value"], kind="stable")
    if top is not None:
        order = order[: max(int(top), 1)]
    ax = new_axes(ax, 1, (5.5, 0.35 * len(order) + 1.5))
    pos = np.arange(len(order))[::-1]
    v = imp["value"][order]
    err = np.stack([v - imp["lower"][order], imp["upper"][order] - v]).clip(min=0)
    ax.barh(pos, v, xerr=err, color="C0", alpha=0.8, ecolor="0.2", capsize=3)
    ax.set_yticks(pos)
    ax.set_yticklabels([names[j] for j in order])
    lo, hi = band_quantiles(interval)
    what = "posterior inclusion probability" if metric == "inclusion" else "posterior share of splits"
    ax.set_xlabel(what)
    band = "Monte Carlo" if metric == "inclusion" else "credible"
    ax.set_title(f"Feature importance ({100 * (hi - lo):.0f}% {band} interval)")
    ax.set_xlim(0, max(1e-9, float(np.max(imp["upper"][order], initial=0))) * 1.05)
    return ax


# ------------------------------------------------------------------ partial dependence
def _column(X: Any, j: int) -> np.ndarray:
    if hasattr(X, "iloc"):
        return np.asarray(X.iloc[:, j].to_numpy())
    arr = as_numpy(X)
    if arr.ndim != 2:
        raise ValueError(f"X must be 2-D [rows, features], got shape {arr.shape}")
    return arr[:, j]


def _take_rows(X: Any, rows: np.ndarray):
    return X.iloc[rows] if hasattr(X, "iloc") else as_numpy(X)[rows]


def _averaged_rows(X: Any, max_rows: Optional[int], seed: int):
    """``(rows, X[rows])``: every row of ``X``, or ``max_rows`` of them drawn with ``seed`` (sorted)."""
    M = len(X) if hasattr(X, "iloc") else as_numpy(X).shape[0]
    if M == 0:
        raise ValueError("X has no rows to average over")
    if max_rows is not None:
        max_rows = check_int("max_rows", max_rows, 1)
    rows = np.arange(M)
    if max_rows is not None and M > int(max_rows):
        rows = np.sort(np.random.default_rng(seed).choice(M, int(max_rows), replace=False))
    return rows, (_take_rows(X, rows) if rows.size < M else X)


#: a numeric feature with at most this many distinct values is drawn at its values (points and a
#: bar of the band each), not as a line: a tree's prediction between two such values is no reading
DISCRETE_LEVELS = 10


def _grid_of(col: np.ndarray, grid_size: int):
    """``(grid values, categorical)`` of a column: its distinct values when there are at most
    ``grid_size``, else ``grid_size`` evenly spaced values from its minimum to its maximum; a column
    holding text gives its distinct levels."""
    seen = [v for v in col.tolist() if not is_missing_cell(v)]
    if not seen:
        raise ValueError("the feature has no observed (non-missing) values to build a grid from")
    try:
        num = np.asarray([float(v) for v in seen], dtype=np.float64)
    except (TypeError, ValueError):
        return np.asarray(sorted(set(seen), key=str), dtype=object), True
    uniq = np.unique(num[np.isfinite(num)])
    if uniq.size <= grid_size:
        return uniq, False
    return np.linspace(uniq[0], uniq[-1], int(grid_size)), False


def _with_grid(X: Any, j: int, grid: np.ndarray, categorical: bool):
    """The rows of ``X`` repeated once per grid value with column ``j`` set to it: grid-major, ``[G M, D]``."""
    G = len(grid)
    M = len(X) if hasattr(X, "iloc") else as_numpy(X).shape[0]
    rep = np.repeat(np.asarray(grid, dtype=object if categorical else np.float64), M)
    if hasattr(X, "iloc"):
        import pandas as pd

        big = X.iloc[np.tile(np.arange(M), G)].reset_index(drop=True)
        dtype = X.dtypes.iloc[j]
        big[big.columns[j]] = pd.Series(rep).astype(dtype) if isinstance(dtype, pd.CategoricalDtype) else rep
        return big
    arr = as_numpy(X)
    big = np.tile(arr.astype(object) if categorical and arr.dtype != object else arr, (G, 1))
    big[:, j] = rep
    return big


def _feature_index(post, X, feature, feature_names=None) -> int:
    names = input_names(post, X, feature_names)
    if isinstance(feature, str):
        if feature not in names:
            raise ValueError(f"feature {feature!r} is not one of the features {names}")
        return names.index(feature)
    j = int(feature)
    if not 0 <= j < len(names):
        raise ValueError(f"feature index {j} out of range [0, {len(names)})")
    return j


def partial_dependence(posterior: Any, X: Any, feature: Any, *, grid: Optional[Sequence] = None, grid_size: int = 20,
                       target_class: Any = None, max_draws: Optional[int] = 500, max_rows: Optional[int] = 500,
                       seed: int = 0, feature_names: Optional[Sequence[str]] = None) -> Dict[str, Any]:
    """Partial dependence of the prediction on one feature, per posterior draw.

    For each grid value ``v`` every row of ``X`` gets ``feature = v``; each draw's prediction
    (:func:`~torchtree.plot.draws.prediction_draws`: the mean of ``y``, or the probability of
    ``target_class``) is averaged over the rows, giving that draw's partial-dependence curve.

    Parameters
    ----------
    posterior : a posterior or a fitted estimator
    X : array-like or DataFrame [M, D], the rows to average over
    feature : int or str, the feature's index or name
    grid : sequence, optional
        Values of the feature (default: its distinct values in ``X`` when there are at most
        ``grid_size``, else ``grid_size`` evenly spaced values between the observed minimum and
        maximum; the levels of a text column).
    grid_size : int, default 20
    target_class : label, optional (classification; default the last class)
    max_draws : int or None, default 500 (see :func:`~torchtree.plot.draws.prediction_draws`)
    max_rows : int or None, default 500
        Average over at most this many rows of ``X`` (a random subset drawn with ``seed``).
    seed : int
    feature_names : sequence of str, optional
        One name per input column (default: ``X``'s column names, else the names the posterior
        keeps, else ``x0, x1, ...``); ``feature`` may be one of them.

    Returns
    -------
    dict with ``grid`` ``[G]``, ``categorical`` (bool), ``discrete`` (bool: a numeric feature whose
    grid is all of its at most :data:`DISCRETE_LEVELS` distinct values), ``draws`` ``[S, G]`` (each draw's curve),
    ``weights`` ``[S]``, ``mean`` ``[G]`` (the posterior mean curve), ``ice`` ``[G, M']`` (the posterior
    mean prediction of each averaged row), ``rows`` ``[M']`` (their indices in ``X``), ``name`` and
    ``missing``: where the averaged rows hold missing cells in the feature (and the grid is the
    default, on a hard-tree or BART posterior), the partial dependence at "missing" as a dict of
    ``draws`` ``[S]``, ``mean`` and ``share`` (the fraction of the rows missing it); else None.
    """
    post = posterior_of(posterior)
    if target_class is not None and post.task != "classification":
        raise ValueError("target_class applies to classification; this posterior is a regression")
    j = _feature_index(post, X, feature, feature_names)
    name = input_names(post, X, feature_names)[j]
    rows, Xs = _averaged_rows(X, max_rows, seed)
    if grid is None:
        values, categorical = _grid_of(_column(Xs, j), check_int("grid_size", grid_size, 1))
        enc = getattr(post, "encoder", None)
        column = enc.columns[j] if enc is not None and categorical else None
        if column is not None and column.source == "ordered":  # an ordered category keeps its declared order
            at = {str(v): k for k, v in enumerate(column.levels)}
            values = np.asarray(sorted(values, key=lambda v: at.get(str(v), len(at))), dtype=object)
    else:
        values = np.asarray(list(grid), dtype=object)
        if values.size == 0:
            raise ValueError("grid is empty; give the feature values to evaluate at, or leave it None")
        try:
            values, categorical = values.astype(np.float64), False
        except (TypeError, ValueError):
            categorical = True
    discrete = bool(grid is None and not categorical and len(values) <= DISCRETE_LEVELS
                    and np.unique(values).size == np.unique(_numbers(_column(Xs, j))).size)
    col = _column(Xs, j)
    n_missing = sum(1 for v in col.tolist() if is_missing_cell(v)) if grid is None and kind_of(post) != "soft" else 0
    evaluated = values
    if n_missing:  # one more point: the feature missing in every row (its learnt side, or the imputation)
        evaluated = np.append(np.asarray(values, dtype=object if categorical else np.float64),
                              None if categorical else np.nan)
    F, w = prediction_draws(post, _with_grid(Xs, j, evaluated, categorical), target_class, max_draws)
    G, m = len(values), rows.size
    per_row = F.reshape(F.shape[0], len(evaluated), m)
    curves = per_row[:, :G].mean(2)
    missing = None
    if n_missing:
        miss = per_row[:, G].mean(1)
        missing = {"draws": miss, "mean": float(w @ miss), "share": n_missing / m}
    return {"grid": values, "categorical": categorical, "discrete": discrete, "draws": curves, "weights": w,
            "mean": w @ curves, "ice": np.tensordot(w, per_row[:, :G], axes=(0, 0)), "rows": rows, "name": name,
            "missing": missing}


def partial_dependence_importance(posterior: Any, X: Any, *, n_points: int = 10, target_class: Any = None,
                                  max_draws: Optional[int] = 50, max_rows: Optional[int] = 100, seed: int = 0,
                                  feature_names: Optional[Sequence[str]] = None) -> Dict[str, np.ndarray]:
    """How much the prediction moves with each feature: the spread of its partial dependence over the
    feature's own distribution in ``X``.

    For feature ``j`` with posterior mean partial dependence ``PD_j`` (:func:`partial_dependence`),
    the importance is the standard deviation of ``PD_j(x_j)`` when ``x_j`` follows the feature's
    observed values in ``X`` (a model-based importance in the manner of Greenwell, Boehmke &
    McCarthy 2018, weighted by the data rather than by an even grid, so a feature's importance does
    not depend on its range or its outliers). A numeric feature is evaluated at ``n_points``
    quantiles of its values (equal weights; repeated quantiles weigh more), a text or categorical one
    at its levels weighted by their frequencies; missing cells are left out.

    Unlike :func:`feature_importance` (how often the trees split on a feature), this measures the
    effect on the prediction: a feature split once at the root of every tree, like titanic's ``sex``,
    ranks high, and one split often for small refinements ranks low.

    Parameters
    ----------
    posterior : a posterior or a fitted estimator
    X : array-like or DataFrame [M, D], the rows to average over and to take the features' values from
    n_points : int, default 10
    target_class : label, optional (classification; default the last class, as :func:`plot_pdp`)
    max_draws : int or None, default 50
    max_rows : int or None, default 100
        Average over at most this many rows (a random subset drawn with ``seed``).
    seed : int
    feature_names : sequence of str, optional (as in :func:`partial_dependence`)

    Returns
    -------
    dict with ``value`` ``[D]`` (the spreads, in the prediction's units: of ``y``, or of the class
    probability) and ``names`` ``[D]``; a feature without observed values gets 0.
    """
    post = posterior_of(posterior)
    names = input_names(post, X, feature_names)
    _, Xs = _averaged_rows(X, max_rows, seed)
    q = (np.arange(int(n_points)) + 0.5) / int(n_points)
    out = np.zeros(len(names))
    for j in range(len(names)):
        seen = [v for v in _column(Xs, j).tolist() if not is_missing_cell(v)]
        if not seen:
            continue
        try:
            num = np.asarray([float(v) for v in seen], dtype=np.float64)
        except (TypeError, ValueError):
            levels, counts = np.unique(np.asarray([str(v) for v in seen], dtype=object), return_counts=True)
            first = {}
            for v in seen:
                first.setdefault(str(v), v)
            grid = [first[v] for v in levels]
        else:
            num = num[np.isfinite(num)]
            if num.size == 0:
                continue
            grid, counts = np.unique(np.quantile(num, q, method="inverted_cdf"), return_counts=True)
        w = counts / counts.sum()
        mean = partial_dependence(post, Xs, j, grid=grid, target_class=target_class, max_draws=max_draws,
                                  max_rows=None, feature_names=names)["mean"]
        out[j] = float(np.sqrt(w @ (mean - w @ mean) ** 2))
    return {"value": out, "names": np.asarray(names, dtype=object)}


def _numbers(col: np.ndarray) -> np.ndarray:
    """The finite numbers of a numeric column (missing cells dropped)."""
    num = np.asarray([float(v) for v in col.tolist() if not is_missing_cell(v)], dtype=np.float64)
    return num[np.isfinite(num)]


def _y_label(post, target_class) -> str:
    if post.task == "regression":
        return "partial dependence (mean of y)"
    classes = getattr(post, "classes_", None)
    K = len(classes) if classes is not None else None
    if K is None:
        return f"P(class {target_class if target_class is not None else 'last'})"
    return f"P(y = {classes[class_index(post, target_class, K)]})"


def _draw_curves(ax, pd: Dict[str, Any], draws: np.ndarray, interval, band: bool) -> np.ndarray:
    """The posterior mean of the curves ``draws [S, G]`` (a line labelled "posterior mean") and, with
    ``band``, their weighted quantiles as a band; returns the x positions. Over the levels of a
    categorical feature, which have no order, and the few values of a discrete one, the mean is
    points and the band a bar per level."""
    lo, hi = band_quantiles(interval)
    cat = pd["categorical"]
    points = cat or pd.get("discrete", False)
    pos = np.arange(len(pd["grid"]), dtype=np.float64) if cat else np.asarray(pd["grid"], np.float64)
    if band:
        qlo, qhi = weighted_quantiles(draws, pd["weights"], (lo, hi))
        label = f"{100 * (hi - lo):.0f}% credible band"
        if points:
            ax.vlines(pos, qlo, qhi, color="C1", alpha=0.35, lw=8, label=label)
        else:
            ax.fill_between(pos, qlo, qhi, color="C1", alpha=0.25, lw=0, label=label)
    ax.plot(pos, pd["weights"] @ draws, color="C1", lw=2.2, marker="o" if points else None,
            ls="none" if points else "-", label="posterior mean")
    if cat:
        ax.set_xticks(pos)
        ax.set_xticklabels([str(v) for v in pd["grid"]])
    elif points:
        ax.set_xticks(pos)
        ax.set_xticklabels([f"{v:g}" for v in pos])
    ax.set_xlabel(pd["name"])
    return pos


def plot_pdp(posterior: Any, X: Any, feature: Any, *, grid: Optional[Sequence] = None, grid_size: int = 20,
             interval: Any = (0.05, 0.95), target_class: Any = None, max_draws: Optional[int] = 500,
             max_rows: Optional[int] = 500, seed: int = 0, feature_names: Optional[Sequence[str]] = None,
             ax: Any = None):
    """Partial dependence on one feature: the posterior mean curve and a credible band over draws.

    Parameters
    ----------
    posterior : TreePosterior, BARTPosterior, SoftTreePosterior, or a fitted estimator
    X : array-like or DataFrame [M, D], the rows to average over (e.g. the training rows)
    feature : int or str
    grid, grid_size, target_class, max_draws, max_rows, seed, feature_names
        See :func:`partial_dependence`.
    interval : pair of quantiles or a central level, default ``(0.05, 0.95)``
        The band spans these weighted quantiles of the per-draw partial-dependence curves.
    ax : matplotlib Axes, optional

    Returns
    -------
    matplotlib Axes: a line labelled "posterior mean" whose y data is the posterior mean partial
    dependence at the grid (x data: the grid; the positions ``0..G-1`` for a text feature, its levels
    as tick labels; points without a line for a text feature) and the band (a ``PolyCollection``; a
    ``LineCollection`` of one bar per level for a text feature).
    """
    require_matplotlib()
    post = posterior_of(posterior)
    pd = partial_dependence(post, X, feature, grid=grid, grid_size=grid_size, target_class=target_class,
                            max_draws=max_draws, max_rows=max_rows, seed=seed, feature_names=feature_names)
    ax = new_axes(ax, 1)
    _draw_curves(ax, pd, pd["draws"], interval, True)
    if pd["missing"] is not None:
        _draw_missing(ax, pd, interval)
    ax.set_ylabel(_y_label(post, target_class))
    ax.set_title(f"Partial dependence on {pd['name']}")
    ax.legend(loc="best", fontsize="small")
    return ax


def _draw_missing(ax, pd: Dict[str, Any], interval) -> None:
    """The partial dependence at "missing": a point with its band's bar, right of the grid, on a tick
    labelled ``missing`` and the share of the averaged rows missing the feature."""
    lo, hi = band_quantiles(interval)
    m = pd["missing"]
    qlo, qhi = weighted_quantiles(m["draws"][:, None], pd["weights"], (lo, hi))
    if pd["categorical"]:
        x = float(len(pd["grid"]))
    else:
        g = np.asarray(pd["grid"], np.float64)
        x = float(g[-1] + max(0.18 * (g[-1] - g[0]), 1.0 if g[-1] == g[0] else 0.0))
    ax.vlines([x], qlo, qhi, color="C3", alpha=0.35, lw=8)
    ax.plot([x], [m["mean"]], color="C3", marker="D", ls="none", label="feature missing")
    ticks, labels = list(ax.get_xticks()), [t.get_text() for t in ax.get_xticklabels()]
    if not pd["categorical"] and not pd.get("discrete", False):
        lo_x, hi_x = ax.get_xlim()
        keep = [i for i, t in enumerate(ticks) if lo_x <= t <= float(np.max(pd["grid"]))]
        ticks, labels = [ticks[i] for i in keep], [f"{ticks[i]:g}" for i in keep]
    ax.set_xticks(ticks + [x])
    share = "<1" if 0 < m["share"] < 0.01 else f"{100 * m['share']:.0f}"
    ax.set_xticklabels(labels + [f"missing\n{share}%"])


def plot_ice(posterior: Any, X: Any, feature: Any, *, n_lines: int = 50, centered: bool = False, band: bool = True,
             grid: Optional[Sequence] = None, grid_size: int = 20, interval: Any = (0.05, 0.95),
             target_class: Any = None, max_draws: Optional[int] = 500, max_rows: Optional[int] = 500,
             seed: int = 0, feature_names: Optional[Sequence[str]] = None, ax: Any = None):
    """Individual conditional expectation: the posterior mean prediction of single rows as one feature
    moves over its grid, with the partial dependence (their average) and its credible band on top.

    Parameters
    ----------
    posterior : TreePosterior, BARTPosterior, SoftTreePosterior, or a fitted estimator
    X : array-like or DataFrame [M, D]
    feature : int or str
    n_lines : int, default 50
        ICE curves drawn: a random subset (drawn with ``seed``) of the averaged rows.
    centered : bool, default False
        Subtract each curve's value at the first grid point (c-ICE), the mean curve's and band's too.
    band : bool, default True
        Draw the partial dependence's credible band.
    grid, grid_size, interval, target_class, max_draws, max_rows, seed, feature_names
        As for :func:`plot_pdp`.
    ax : matplotlib Axes, optional

    Returns
    -------
    matplotlib Axes: one line per drawn row labelled ``"_row I"`` (``I`` its index in ``X``; y data its
    posterior mean prediction over the grid), the "posterior mean" partial-dependence line and the band.
    """
    require_matplotlib()
    post = posterior_of(posterior)
    pd = partial_dependence(post, X, feature, grid=grid, grid_size=grid_size, target_class=target_class,
                            max_draws=max_draws, max_rows=max_rows, seed=seed, feature_names=feature_names)
    ax = new_axes(ax, 1)
    ice, rows = pd["ice"], pd["rows"]
    pick = np.arange(rows.size)
    if rows.size > int(n_lines):
        pick = np.sort(np.random.default_rng(seed + 1).choice(rows.size, int(n_lines), replace=False))
    pos = np.arange(len(pd["grid"]), dtype=np.float64) if pd["categorical"] else np.asarray(pd["grid"], np.float64)
    lines = ice[:, pick] - (ice[:1, pick] if centered else 0.0)
    points = pd["categorical"] or pd["discrete"]
    style = dict(ls="none", marker=".") if points else dict(ls="-")
    drawn = ax.plot(pos, lines, color="C0", alpha=0.35, lw=0.8, **style)
    for line, r in zip(drawn, rows[pick]):
        line.set_label(f"_row {int(r)}")
    ax.plot([], [], color="C0", alpha=0.6, lw=0.8, label=f"single rows ({len(pick)})", **style)
    draws = pd["draws"] - pd["draws"][:, :1] if centered else pd["draws"]
    _draw_curves(ax, pd, draws, interval, band)
    ax.set_ylabel(("centred " if centered else "") + _y_label(post, target_class))
    ax.set_title(f"ICE curves of {pd['name']} ({len(pick)} rows)")
    ax.legend(loc="upper left", bbox_to_anchor=(1.01, 1.0), fontsize="small", borderaxespad=0.0)
    return ax
