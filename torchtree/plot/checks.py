"""Checks of a fit: MCMC traces with R-hat and ESS, calibration against held-out data, and the
evidence curves of the hyperparameter search."""
from __future__ import annotations

from typing import Any, Dict, List, Optional, Sequence

import numpy as np

from torchtree.model.diagnostics import RHAT_LIMIT, chain_ess, posterior_traces, rhat
from torchtree.plot.common import (as_numpy, band_quantiles, class_index, new_axes, posterior_of, require_matplotlib,
                                   wilson_interval)
from torchtree.plot.draws import predictive_cdf

__all__ = ["trace_quantities", "plot_trace", "plot_calibration", "evidence_curves", "plot_evidence"]

#: quantity -> (keys of ``info["trace"]`` that hold it, panel title)
TRACES = {
    "sigma": (("sigma",), "sigma (noise sd)"),
    "leaves": (("leaves_mean", "n_leaves"), "leaves per tree"),
    "log_posterior": (("log_posterior", "log_likelihood"), "log posterior"),
}


def trace_quantities(posterior: Any) -> Dict[str, str]:
    """The quantities :func:`plot_trace` can draw for this posterior: name -> key of ``info["trace"]``
    (``sigma`` for BART regression only: a probit classifier's noise sd is fixed at 1)."""
    post = posterior_of(posterior)
    traces = posterior_traces(post) or {}
    out = {}
    for name, (keys, _) in TRACES.items():
        key = next((k for k in keys if k in traces), None)
        if key is None or (name == "sigma" and post.task != "regression"):
            continue
        out[name] = key
    return out


def _warmup(post, length: int) -> int:
    """Iterations of warm-up at the start of a trace longer than the kept draws (BART's leaves trace
    holds every sweep); 0 when the trace holds the kept draws only."""
    info = getattr(post, "info", {}) or {}
    kept, warm = info.get("n_samples"), info.get("n_warmup")
    if isinstance(kept, int) and isinstance(warm, int) and length > kept and 0 < warm < length:
        return warm
    return 0


def plot_trace(posterior: Any, quantities: Optional[Sequence[str]] = None, *, ax: Any = None):
    """Per-chain traces of the sampler with split R-hat and ESS in the titles.

    Parameters
    ----------
    posterior : a posterior with per-chain traces (``info["trace"]``: methods mcmc and bart), or a
        fitted estimator
    quantities : sequence of {"sigma", "leaves", "log_posterior"}, optional
        Default: every one the posterior keeps. ``sigma``: BART's noise sd (regression);
        ``leaves``: the mean leaves per tree of a BART forest, the leaves of the MCMC chain's tree;
        ``log_posterior``: the MCMC chain's log posterior (log likelihood plus log prior).
    ax : sequence of matplotlib Axes, optional, one per quantity

    Returns
    -------
    numpy array of Axes, one per quantity, each with one line per chain labelled ``"chain C"`` (its y
    data the chain's trace, x data the iteration) and, where the trace includes the warm-up, a dashed
    line where it ends. R-hat (:func:`torchtree.model.diagnostics.rhat`) and ESS
    (:func:`~torchtree.model.diagnostics.chain_ess`) are of the draws after the warm-up.

    Raises
    ------
    ValueError
        The posterior keeps no traces (top-down SMC, soft trees), or a quantity it does not keep.
    """
    require_matplotlib()
    post = posterior_of(posterior)
    have = trace_quantities(post)
    if not have:
        sampler = (getattr(post, "info", {}) or {}).get("sampler", type(post).__name__)
        raise ValueError(f"plot_trace applies to posteriors with per-chain traces (methods mcmc and bart); this "
                         f"{type(post).__name__} ({sampler}) keeps none")
    names = list(have) if quantities is None else [str(q) for q in quantities]
    for q in names:
        if q not in have:
            why = " (sigma applies to BART regression: a probit classifier's noise sd is fixed at 1)" if q == "sigma" else ""
            raise ValueError(f"no trace of {q!r} in this posterior{why}; it has: {', '.join(have)}")
    traces = posterior_traces(post)
    axes = new_axes(ax, len(names), (5.0 * len(names), 3.4))
    axes_list = [axes] if len(names) == 1 else list(axes)
    series = {}
    for q in names:
        tr = traces[have[q]]
        series[q] = tr.reshape(tr.shape[0], tr.shape[1], -1).mean(-1) if tr.ndim > 2 else tr
    warms = {q: _warmup(post, tr.shape[1]) for q, tr in series.items()}
    # a trace of kept draws only sits after the warm-up another panel shows, on one iteration axis
    shift = max(warms.values())
    for a, q in zip(axes_list, names):
        tr, warm = series[q], warms[q]
        x = np.arange(tr.shape[1]) + (0 if warm else shift)
        for c in range(tr.shape[0]):
            a.plot(x, tr[c], lw=0.7, alpha=0.8, label=f"chain {c}")
        if warm:
            a.axvline(warm - 0.5, color="0.3", ls="--", lw=1, label="end of warm-up")
        kept = tr[:, warm:]
        r = rhat(kept)
        a.set_title(f"{TRACES[q][1]}\nR-hat {r:.3f}, ESS {chain_ess(kept):.0f} ({kept.shape[0]} chains)",
                    color="C3" if r > RHAT_LIMIT else "black")
        a.set_xlabel("iteration (warm-up, then kept draws)" if shift else "kept draw")
        a.set_ylabel(TRACES[q][1].split(" (")[0])
        if tr.shape[0] <= 8:
            a.legend(loc="upper right", fontsize="x-small", ncol=2)
    return np.asarray(axes_list, dtype=object)


# ------------------------------------------------------------------ calibration
#: axis limits of a probability axis: a little past [0, 1], so that markers at 0 and 1 show whole
EDGE = (-0.03, 1.03)


def _labels_equal(y: np.ndarray, labels: np.ndarray) -> np.ndarray:
    """``y == labels`` elementwise, also when one holds text and the other numbers (labels read from a file)."""
    return (y == labels) | (y.astype(str) == np.asarray(labels).astype(str))


def plot_calibration(posterior: Any, X: Any, y: Any, *, n_bins: int = 10, interval: Any = (0.05, 0.95),
                     target_class: Any = None, levels: Optional[Sequence[float]] = None,
                     max_rows: Optional[int] = 10000, seed: int = 0, ax: Any = None):
    """Calibration of the posterior predictive on data ``(X, y)`` (best held out).

    Classification: a reliability diagram (observed frequency of the event against the mean predicted
    probability, per bin of ``n_bins`` equal-width probability bins, with Wilson intervals) above a
    histogram of the predicted probabilities. The event is ``y = target_class`` with probability
    ``predict_proba[:, target_class]``; by default the last class of a binary task, and for three or
    more classes the top label (confidence: the largest probability; event: that class is right).

    Regression: the histogram of the PIT values ``P(Y <= y_i | x_i, data)``
    (:func:`~torchtree.plot.draws.predictive_cdf`; flat at density 1 when calibrated, the band is where
    a calibrated bin's height falls with the chosen probability) and the empirical coverage of the
    central predictive intervals at the nominal ``levels`` (default 0.1, ..., 0.9, 0.95), read from the
    PIT: ``y_i`` lies in the central ``L`` interval when ``|PIT_i - 1/2| <= L / 2``.

    Parameters
    ----------
    posterior : a posterior or a fitted estimator
    X : array-like [M, D]
    y : array-like [M] (original labels for classification; a label not seen in training is refused)
    n_bins : int, default 10
    interval : pair of quantiles or a central level, default ``(0.05, 0.95)``, of the Wilson intervals
    target_class : label, optional (classification)
    levels : sequence of floats in (0, 1), optional (regression)
    max_rows : int or None, default 10000
        Regression: the PIT of at most this many rows, a random subset drawn with ``seed`` (a row's
        PIT integrates its predictive over every tree: about a millisecond each); None: every row.
    seed : int, default 0
    ax : sequence of two matplotlib Axes, optional

    Returns
    -------
    numpy array of two Axes. Classification: the reliability diagram (a line labelled "observed") and
    the histogram (one ``Rectangle`` per bin in ``ax.patches``, its height the bin's count).
    Regression: the PIT histogram (one ``Rectangle`` per bin, height ``count * n_bins / M``) and the
    coverage plot (a line labelled "empirical coverage").
    """
    require_matplotlib()
    post = posterior_of(posterior)
    lo, hi = band_quantiles(interval)
    n_bins = int(n_bins)
    if n_bins < 1:
        raise ValueError(f"n_bins must be >= 1, got {n_bins}")
    if target_class is not None and post.task != "classification":
        raise ValueError("target_class applies to classification; this posterior is a regression")
    yn = as_numpy(y).reshape(-1)
    edges = np.linspace(0.0, 1.0, n_bins + 1)
    axes = new_axes(ax, 2, (9.5, 3.8))
    if post.task == "classification":
        proba = np.asarray(post.predict_proba(X), dtype=np.float64)
        if proba.shape[0] != yn.shape[0]:
            raise ValueError(f"X has {proba.shape[0]} rows but y has {yn.shape[0]}")
        K = proba.shape[1]
        classes = getattr(post, "classes_", None)
        labels = np.asarray(classes) if classes is not None else np.arange(K)
        seen = np.zeros(yn.shape, dtype=bool)
        for label in labels:
            seen |= _labels_equal(yn, np.full(yn.shape, label, dtype=labels.dtype))
        if not seen.all():
            unseen = sorted({str(v) for v in yn[~seen].tolist()})
            raise ValueError(f"y holds label(s) {unseen[:5]} not seen in training (classes: {labels.tolist()})")
        if target_class is None and K > 2:
            score = proba.max(1)
            event = _labels_equal(yn, labels[proba.argmax(1)])
            what = "confidence (largest class probability)"
        else:
            k = class_index(post, target_class, K)
            score, event = proba[:, k], _labels_equal(yn, np.full(yn.shape, labels[k], dtype=labels.dtype))
            what = f"predicted P(y = {labels[k]})"
        counts = np.histogram(score, edges)[0]
        hits = np.histogram(score, edges, weights=event.astype(np.float64))[0]
        sum_p = np.histogram(score, edges, weights=score)[0]
        full = counts > 0
        freq, mean_p = hits[full] / counts[full], sum_p[full] / counts[full]
        flo, fhi = wilson_interval(freq, counts[full], lo, hi)
        a, b = axes
        a.plot([0, 1], [0, 1], ls="--", color="0.5", lw=1, label="calibrated")
        a.errorbar(mean_p, freq, yerr=np.stack([freq - flo, fhi - freq]).clip(min=0), fmt="none", ecolor="C0",
                   capsize=3)
        a.plot(mean_p, freq, marker="o", color="C0", label="observed")
        a.set(xlim=EDGE, ylim=EDGE, xlabel=what, ylabel="observed frequency",
              title=f"Reliability ({100 * (hi - lo):.0f}% intervals)")
        a.legend(loc="upper left", fontsize="small")
        b.bar(edges[:-1], counts, width=np.diff(edges), align="edge", color="C0", alpha=0.7, edgecolor="white")
        b.set(xlim=EDGE, xlabel=what, ylabel="rows", title=f"Predicted probabilities ({yn.shape[0]} rows)")
        return axes
    n_all = yn.shape[0]
    if max_rows is not None and n_all > int(max_rows):
        rows = np.sort(np.random.default_rng(seed).choice(n_all, int(max_rows), replace=False))
        X, yn = (X.iloc[rows] if hasattr(X, "iloc") else as_numpy(X)[rows]), yn[rows]
    pit = predictive_cdf(post, X, yn)
    M = pit.shape[0]
    counts = np.histogram(pit, edges)[0]
    a, b = axes
    share = 1.0 / n_bins
    blo, bhi = wilson_interval(np.array([share]), np.array([M]), lo, hi)
    a.fill_between([0.0, 1.0], blo[0] * n_bins, bhi[0] * n_bins, color="0.88", lw=0,
                   label=f"calibrated ({100 * (hi - lo):.0f}% of bins)")
    a.bar(edges[:-1], counts * n_bins / max(M, 1), width=np.diff(edges), align="edge", color="C0", alpha=0.75,
          edgecolor="white")
    a.axhline(1.0, color="0.4", ls="--", lw=1, label="uniform")
    a.set(xlim=(0, 1), xlabel="PIT = P(Y <= y | x, data)", ylabel="density", title=f"PIT histogram ({M} rows{'' if M == n_all else f' of {n_all}'})")
    a.legend(loc="lower center", fontsize="small")
    lv = np.asarray([0.1, 0.2, 0.3, 0.4, 0.5, 0.6, 0.7, 0.8, 0.9, 0.95] if levels is None else list(levels), np.float64)
    if lv.size == 0 or not np.all((lv > 0) & (lv < 1)):
        raise ValueError(f"levels must lie in (0, 1), got {list(lv)}")
    cover = (np.abs(pit[None, :] - 0.5) <= lv[:, None] / 2).mean(1)
    clo, chi = wilson_interval(cover, np.full(lv.shape, M), lo, hi)
    b.plot([0, 1], [0, 1], ls="--", color="0.5", lw=1, label="nominal")
    b.errorbar(lv, cover, yerr=np.stack([cover - clo, chi - cover]).clip(min=0), fmt="none", ecolor="C0", capsize=3)
    b.plot(lv, cover, marker="o", color="C0", label="empirical coverage")
    b.set(xlim=EDGE, ylim=EDGE, xlabel="nominal level of the central interval", ylabel="share of y inside",
          title="Interval coverage")
    b.legend(loc="upper left", fontsize="small")
    return axes


# ------------------------------------------------------------------ evidence
CURVE_TITLES = {"alpha": "Dirichlet concentration alpha", "b0": "leaf noise prior b0",
                "beta_split": "split prior depth decay beta_split"}


def evidence_curves(source: Any) -> Dict[str, Any]:
    """The hyperparameter search's record (``EvidenceSearch.as_dict()``: ``curves`` name -> list of
    ``(value, log evidence)``, ``chosen`` name -> value) from an ``EvidenceSearch``, its dict, a fitted
    estimator (``hyper_search_``) or a posterior (``info["hyper_search"]``, saved with it).

    Raises
    ------
    ValueError
        There is no record: the fit did not search (``hyper`` other than ``"evidence"``, or a method
        that builds its own prior, such as bart and dcc).
    """
    if hasattr(source, "curves") and hasattr(source, "as_dict"):
        return source.as_dict()
    if isinstance(source, dict) and "curves" in source:
        return source
    search = getattr(source, "hyper_search_", None)
    if search is not None:
        return search.as_dict()
    post = posterior_of(source)
    rec = (getattr(post, "info", {}) or {}).get("hyper_search")
    if isinstance(rec, dict) and rec.get("curves"):
        return rec
    raise ValueError("plot_evidence needs the hyperparameter search's curves, which this posterior lacks: fit with "
                     "hyper='evidence' (the default) and a method whose prior the estimator builds (smc, mcmc, "
                     "smc-moves); its record is kept in posterior.info['hyper_search']")


def plot_evidence(source: Any, *, ax: Any = None):
    """The evidence curves of the hyperparameter search (``hyper="evidence"``): the log evidence of each
    top-down SMC pilot against the value of the setting it tried, the chosen value marked.

    Parameters
    ----------
    source : a posterior, a fitted estimator, an ``EvidenceSearch`` or its dict (see :func:`evidence_curves`)
    ax : sequence of matplotlib Axes, optional, one per searched setting

    Returns
    -------
    numpy array of Axes, one per searched setting (leaf prior first, then ``beta_split``), each with a line
    labelled "log evidence" (x data the values tried, y data their log evidence) on a log x axis.
    """
    require_matplotlib()
    rec = evidence_curves(source)
    curves: Dict[str, List] = {k: [(float(v), float(z)) for v, z in c] for k, c in rec["curves"].items() if len(c)}
    if not curves:
        raise ValueError("the hyperparameter search's record holds no curve")
    chosen = rec.get("chosen", {}) or {}
    axes = new_axes(ax, len(curves), (4.5 * len(curves), 3.4))
    axes_list = [axes] if len(curves) == 1 else list(axes)
    for a, (name, pts) in zip(axes_list, curves.items()):
        x, z = np.asarray([p[0] for p in pts]), np.asarray([p[1] for p in pts])
        a.plot(x, z, marker="o", color="C0", label="log evidence")
        if name in chosen:
            a.axvline(float(chosen[name]), color="C3", ls="--", lw=1, label=f"chosen {float(chosen[name]):.3g}")
        if np.all(x > 0):
            from matplotlib.ticker import NullFormatter

            a.set_xscale("log")
            a.set_xticks(x)
            a.set_xticklabels([f"{v:.3g}" for v in x])
            a.xaxis.set_minor_formatter(NullFormatter())
        a.set(xlabel=name, ylabel="log evidence of the pilot", title=CURVE_TITLES.get(name, name))
        a.legend(loc="best", fontsize="small")
    n_rows = rec.get("n_rows")
    if n_rows and ax is None:
        axes_list[0].figure.suptitle(f"Evidence search: {rec.get('n_particles', '?')} particles per pilot on "
                                     f"{n_rows} rows", fontsize="medium")
    return np.asarray(axes_list, dtype=object)
