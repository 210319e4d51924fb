"""Convergence diagnostics and export to ArviZ.

* :func:`rhat`, :func:`chain_ess` — split R-hat and multi-chain effective sample
  size of ``draws [chains, n]`` (the estimators ``torchtree.samplers.mcmc`` reports);
  :func:`rhat_columns`, :func:`ess_columns` — the same for each column of ``[chains, n, P]`` at once;
* :func:`unconverged`, :func:`warn_if_unconverged` — the diagnostics off their limits, and the ``UserWarning``
  MCMC and BART raise then;
* :func:`weighted_ess` — Kish's effective sample size of importance weights;
* :func:`tree_sizes` — leaves and depth of each tree in a posterior with weights;
* :func:`to_arviz` — an ArviZ ``InferenceData`` of a posterior (ArviZ is optional:
  ``pip install arviz``).

What goes where in :func:`to_arviz`:

* a posterior whose ``info["trace"]`` holds per-chain traces (MCMC:
  ``{"n_leaves": [chains, draws], "log_posterior": [chains, draws], ...}``) gives
  them as the ``posterior`` group, ``log_posterior`` also as ``sample_stats.lp``;
  R-hat / ESS / trace plots then work as for any MCMC run; a BART posterior so too
  (``leaves_mean``, ``sigma``, ``f``), with ``observed_data``, ``log_likelihood`` and
  ``posterior_predictive`` when ``X, y`` are given;
* a weighted posterior (SMC, DCC) gives one chain over its distinct trees (or
  topologies): ``posterior.n_leaves`` and ``posterior.depth`` with
  ``sample_stats.weight`` / ``sample_stats.log_weight`` (normalised). ArviZ's
  MCMC diagnostics do not apply to weighted draws: use the weights (e.g.
  ``numpy.average(n_leaves, weights=weight)``) or resample first.

``attrs`` carry the sampler name, task, log evidence, ESS and particle count.
"""
from __future__ import annotations

import inspect
import math
from typing import Any, Dict, List, Optional

import numpy as np
import torch

from torchtree.core.warn import ConvergenceWarning, warn
from torchtree.model.inputs import ArrayLike
from torchtree.model.posterior_base import Posterior

__all__ = ["rhat", "chain_ess", "rhat_columns", "ess_columns", "unconverged", "warn_if_unconverged", "RHAT_LIMIT", "ESS_LIMIT", "weighted_ess", "tree_sizes", "posterior_traces", "to_arviz"]

ARVIZ_MISSING = "torchtree.model.diagnostics.to_arviz needs ArviZ, which is not installed: pip install arviz"


def _as_draws(x) -> np.ndarray:
    a = np.asarray(x.detach().cpu() if isinstance(x, torch.Tensor) else x, dtype=np.float64)
    if a.ndim == 1:
        a = a[None, :]
    if a.ndim != 2:
        raise ValueError(f"draws must be [chains, draws], got shape {a.shape}")
    return a


def rhat(draws: ArrayLike) -> float:
    """Split R-hat (Gelman et al., BDA3 sec. 11.4) of ``draws [chains, n]`` (or ``[n]``).

    Each chain is split in halves, so one chain gives a usable value. ``nan`` for
    fewer than 4 draws per chain or constant draws; ``inf`` for half-chains each constant
    but not all at one value (no within-chain variance: chains stuck apart, as ArviZ says).
    Values above about 1.01 say the chains have not mixed.
    """
    return float(rhat_columns(_as_draws(draws)[:, :, None])[0])


def rhat_columns(draws: ArrayLike) -> np.ndarray:
    """:func:`rhat` of each column of ``draws [chains, n, P]``: ``[P]`` float64 (``nan`` where a column is
    constant or the chains hold fewer than 4 draws, ``inf`` where its half-chains are each constant, not all
    alike). Each column's arithmetic is :func:`rhat`'s, in the same
    order (the reductions run over contiguous rows), so the values are the same to the last bit."""
    a = np.ascontiguousarray(np.moveaxis(np.asarray(draws, dtype=np.float64), 2, 0))  # [P, chains, n]
    n = a.shape[2] // 2
    if n < 2:
        return np.full(a.shape[0], np.nan)
    s = np.concatenate([a[:, :, :n], a[:, :, a.shape[2] - n:]], 1)  # [P, 2 chains, n]
    w = s.var(2, ddof=1).mean(1)
    b = n * s.mean(2).var(1, ddof=1)
    with np.errstate(divide="ignore", invalid="ignore"):
        out = np.sqrt(((n - 1) / n * w + b / n) / w)
    return np.where(w > 0, out, np.where(b > 0, np.inf, np.nan))


#: convergence limits of :func:`warn_if_unconverged`: split-R-hat above RHAT_LIMIT, or an effective
#: sample size (pooled over chains) below ESS_LIMIT
RHAT_LIMIT, ESS_LIMIT = 1.1, 100.0


def unconverged(info: Dict[str, Any], rhat_limit: float = RHAT_LIMIT, ess_limit: float = ESS_LIMIT) -> List[str]:
    """The diagnostics of a run's ``info`` outside their limits, as ``"<key> <value>"`` strings: every
    ``rhat_*`` above ``rhat_limit`` (``inf`` included) and every finite ``ess_*`` below ``ess_limit`` (empty: all
    within; NaN entries, e.g. sigma's in classification, are skipped).

    Parameters
    ----------
    info : dict, the run's diagnostics (``rhat_<quantity>``, ``ess_<quantity>`` floats)
    rhat_limit, ess_limit : float
    """
    def finite(k):
        return isinstance(info.get(k), (int, float)) and np.isfinite(info[k])

    def number(k):  # an infinite R-hat: chains stuck apart, the worst case, not a missing value
        return isinstance(info.get(k), (int, float)) and not np.isnan(info[k])

    bad = [f"{k} {info[k]:.2f}" for k in info if k.startswith("rhat_") and number(k) and info[k] > rhat_limit]
    return bad + [f"{k} {info[k]:.1f}" for k in info if k.startswith("ess_") and finite(k) and info[k] < ess_limit]


def warn_if_unconverged(info: Dict[str, Any], draws_per_chain: int, advice: str, rhat_limit: float = RHAT_LIMIT,
                        ess_limit: float = ESS_LIMIT) -> None:
    """A :class:`~torchtree.ConvergenceWarning` (a ``UserWarning``) naming every diagnostic of :func:`unconverged`
    (skipped for runs of fewer than 4 draws per chain).

    Parameters
    ----------
    info : dict, the run's diagnostics (``rhat_<quantity>``, ``ess_<quantity>`` floats)
    draws_per_chain : int
    advice : str, what to change, appended to the message
    rhat_limit, ess_limit : float, the limits (default ``RHAT_LIMIT``, ``ESS_LIMIT``)
    """
    bad = unconverged(info, rhat_limit, ess_limit)
    if bad and draws_per_chain >= 4:
        warn(f"MCMC chains look unconverged ({', '.join(bad)}; limits R-hat <= {rhat_limit}, "
             f"ESS >= {ess_limit:.0f}): predictions may depend on the seed. {advice}", ConvergenceWarning)


def chain_ess(draws: ArrayLike) -> float:
    """Effective sample size of ``draws [chains, n]`` pooled over chains.

    Multi-chain autocorrelation (Stan's estimator) truncated with Geyer's initial
    monotone positive-pair sequence; ``nan`` for fewer than 4 draws or constant draws.
    The chains are not split (ArviZ's ``az.ess(method="mean")`` splits them; on short chains the two
    differ by tens of percent), while :func:`rhat` is split-R-hat (``az.rhat(method="split")``).
    """
    return float(ess_columns(_as_draws(draws)[:, :, None])[0])


def ess_columns(draws: ArrayLike) -> np.ndarray:
    """:func:`chain_ess` of each column of ``draws [chains, n, P]``: ``[P]`` float64 (``nan`` where a column
    is constant or the chains hold fewer than 4 draws). Each column's arithmetic is :func:`chain_ess`'s, in the
    same order (reductions over contiguous rows; the truncated sums taken per truncation length), so the
    values are the same to the last bit."""
    a = np.ascontiguousarray(np.moveaxis(np.asarray(draws, dtype=np.float64), 2, 0))  # [P, m, n]
    P, m, n = a.shape
    if n < 4:
        return np.full(P, np.nan)
    x = a - a.mean(2, keepdims=True)
    nfft = 1 << (2 * n - 1).bit_length()
    f = np.fft.rfft(x, nfft, axis=2)
    acov = np.fft.irfft(f * np.conj(f), nfft, axis=2)[:, :, :n] / n  # [P, m, n]
    w = (acov[:, :, 0] * n / (n - 1)).mean(1)  # [P]
    var_hat = (n - 1) / n * w + (a.mean(2).var(1, ddof=1) if m > 1 else 0.0)
    ok = var_hat > 0
    with np.errstate(divide="ignore", invalid="ignore"):
        rho = 1.0 - (w[:, None] - acov.mean(1)) / var_hat[:, None]  # [P, n]
    rho[:, 0] = 1.0
    npair = n // 2
    pairs = rho[:, : 2 * npair].reshape(P, npair, 2).sum(2)  # [P, npair]
    # Geyer: the pairs before the first non-positive one, made monotone non-increasing
    first = np.where((pairs <= 0).any(1), (pairs <= 0).argmax(1), npair)
    pairs = np.minimum.accumulate(pairs, 1)
    total = np.zeros(P)
    for k in np.unique(first):  # one sum per truncation length, as chain_ess sums its k pairs
        cols = first == k
        total[cols] = pairs[cols, :k].sum(1)
    tau = np.maximum(-1.0 + 2.0 * total, 1.0 / math.log10(max(m * n, 10)))
    with np.errstate(invalid="ignore"):
        return np.where(ok, m * n / tau, np.nan)


def weighted_ess(weights: ArrayLike) -> float:
    """Kish's effective sample size ``(sum w)^2 / sum w^2`` of non-negative weights."""
    w = np.asarray(weights.detach().cpu() if isinstance(weights, torch.Tensor) else weights, dtype=np.float64).reshape(-1)
    if w.size == 0 or not np.all(np.isfinite(w)) or np.any(w < 0) or not w.sum() > 0:
        raise ValueError("weights must be finite, non-negative and not all zero")
    return float(w.sum() ** 2 / (w ** 2).sum())


def tree_sizes(posterior) -> Dict[str, np.ndarray]:
    """Leaves, depth and normalised weight of each (distinct) tree of a posterior.

    Works for ``TreePosterior`` (hard trees) and for posteriors over soft-tree
    topologies (``SoftTreePosterior``: one row per topology).

    Returns
    -------
    dict with ``n_leaves`` [Q], ``depth`` [Q] (float64) and ``weight`` [Q] (sums to 1).
    """
    w = posterior.weights
    w = np.asarray(w.detach().cpu() if isinstance(w, torch.Tensor) else w, dtype=np.float64)
    trees = getattr(posterior, "trees", None)
    if trees is not None and hasattr(trees, "n_leaves"):
        leaves = trees.n_leaves().double().cpu().numpy()
        depth = trees.max_depth().double().cpu().numpy()
    elif hasattr(posterior, "topologies"):
        leaves = np.asarray([t.n_leaves for t in posterior.topologies], dtype=np.float64)
        depth = np.asarray([t.depth for t in posterior.topologies], dtype=np.float64)
    else:
        raise TypeError(f"cannot read tree sizes from {type(posterior).__name__}")
    return {"n_leaves": leaves, "depth": depth, "weight": w / w.sum()}


def posterior_traces(posterior: Posterior) -> Optional[Dict[str, np.ndarray]]:
    """Per-chain traces ``{name: [chains, draws, ...]}`` from ``posterior.info["trace"]`` (MCMC, BART), or a
    soft-tree posterior's :meth:`~torchtree.soft.SoftTreePosterior.chain_draws` (NUTS), or None."""
    trace = getattr(posterior, "info", {}).get("trace")
    chain_draws = getattr(posterior, "chain_draws", None)  # soft-tree posteriors only
    if (not isinstance(trace, dict) or not trace) and callable(chain_draws):
        trace = chain_draws()
    if not isinstance(trace, dict) or not trace:
        return None
    out = {}
    for k, v in trace.items():
        a = np.asarray(v.detach().cpu() if isinstance(v, torch.Tensor) else v, dtype=np.float64)
        if a.ndim == 1:
            a = a[None, :]
        if a.ndim < 2:
            raise ValueError(f"info['trace'][{k!r}] must be [chains, draws, ...], got shape {a.shape}")
        out[str(k)] = a
    return out


def _attrs(posterior) -> Dict[str, Any]:
    info = getattr(posterior, "info", {}) or {}
    attrs: Dict[str, Any] = {"inference_library": "torchtree"}
    try:
        from torchtree._version import __version__

        attrs["inference_library_version"] = __version__
    except ImportError:  # pragma: no cover
        pass
    for key in ("sampler", "method"):
        if isinstance(info.get(key), str):
            attrs["sampler"] = info[key]
            break
    for key in ("task", "log_evidence", "ess", "n_particles"):
        try:
            v = getattr(posterior, key, None)
        except Exception:  # a property that cannot be computed for this posterior
            v = None
        if isinstance(v, (int, float, str)) and not isinstance(v, bool):
            attrs[key] = v
    return attrs


def _kept_draws(posterior, traces: Dict[str, np.ndarray]):
    """``(kept, warmup)``: each trace at the kept draws, and the warm-up of the traces that record every sweep
    (BART's mean leaf count: the sweeps ``info["kept_sweeps"]`` are kept, those before ``n_warmup`` are the
    warm-up; a posterior saved before that entry: ``n_warmup + n_samples * thin`` sweeps per chain, of which
    every ``thin``-th after the warm-up is kept); traces of the kept draws only pass as they are."""
    info = getattr(posterior, "info", {}) or {}
    S, W, thin = info.get("n_samples"), info.get("n_warmup"), info.get("thin", 1)
    every_sweep = all(isinstance(v, int) for v in (S, W, thin)) and (W > 0 or thin > 1)
    at = info.get("kept_sweeps")
    kept, warmup = {}, {}
    for k, a in traces.items():
        if at is not None and isinstance(W, int) and a.ndim >= 2 and a.shape[1] > max(at, default=-1) and \
                a.shape[1] != len(at):
            at = np.asarray(at, dtype=np.int64)
            kept[k] = a[:, at]
            first = min(W, int(at[0])) if at.size else W  # a run stopped in warm-up keeps its last sweep
            if first:
                warmup[k] = a[:, :first]
        elif every_sweep and a.shape[1] == W + S * thin:
            kept[k] = a[:, W + thin - 1::thin]
            if W:
                warmup[k] = a[:, :W]
        else:
            kept[k] = a
    return kept, warmup


def _f_labels(posterior, kept: Dict[str, np.ndarray]) -> Dict[str, Any]:
    """ArviZ ``dims`` / ``coords`` naming the training rows of BART's traced ``f`` (``info["f_rows"]``), and its
    class utilities; empty for other traces."""
    rows = (getattr(posterior, "info", {}) or {}).get("f_rows")
    f = kept.get("f")
    if rows is None or f is None or f.shape[-1] != len(rows):
        return {}
    dims = ["f_row"] if f.ndim == 3 else ["utility", "f_row"]
    return {"dims": {"f": dims}, "coords": {"f_row": np.asarray(rows, dtype=np.int64)}}


def _from_dict(az, groups: Dict[str, Dict[str, np.ndarray]], attrs: Dict[str, Any], labels=None):
    params = inspect.signature(az.from_dict).parameters
    labels = labels or {}
    if "posterior" in params:  # ArviZ 0.x: one keyword per group
        warm = {"save_warmup": True} if "warmup_posterior" in groups and "save_warmup" in params else {}
        return az.from_dict(**groups, attrs=attrs, **warm, **labels)
    # ArviZ >= 1.0: a dict of groups, returns an xarray DataTree
    return az.from_dict(groups, attrs=attrs, **labels)  # pragma: no cover - depends on the installed ArviZ


def _per_chain(posterior, a: np.ndarray) -> np.ndarray:
    """``[S, ...]`` draw-major rows (draw ``s`` of chain ``c`` at row ``s C + c``) as ``[chains, draws, ...]``."""
    C = int(posterior.chain_of.max()) + 1
    return a.reshape(a.shape[0] // C, C, *a.shape[1:]).swapaxes(0, 1)


def _data_groups(posterior, X, y) -> Dict[str, Dict[str, np.ndarray]]:
    """``observed_data``, ``log_likelihood`` and ``posterior_predictive`` of ``(X, y)`` (BART posteriors)."""
    if not (hasattr(posterior, "log_likelihood_draws") and hasattr(posterior, "chain_of")):
        raise TypeError(f"to_arviz(posterior, X, y) needs a posterior of equally weighted draws in chains (BART); "
                        f"a {type(posterior).__name__} has weighted or collapsed draws that PSIS-LOO and WAIC "
                        "cannot read")
    lp = posterior.log_likelihood_draws(X, y).cpu().numpy()
    obs = np.asarray(y)
    draws = posterior.predictive_draws(X)
    if posterior.task == "classification":  # labels as class codes, so that ArviZ gets numbers
        codes = {c: i for i, c in enumerate(np.asarray(posterior.classes_).tolist())} \
            if posterior.classes_ is not None else None
        if codes is not None:
            obs = np.asarray([codes[v] for v in obs.tolist()])
            draws = np.vectorize(codes.__getitem__, otypes=[np.int64])(draws)
    return {"observed_data": {"y": obs}, "log_likelihood": {"y": _per_chain(posterior, lp)},
            "posterior_predictive": {"y": _per_chain(posterior, np.asarray(draws))}}


def to_arviz(posterior: Posterior, X: Optional[ArrayLike] = None, y: Optional[ArrayLike] = None) -> Any:
    """The posterior as an ArviZ ``InferenceData`` (see the module docstring for the layout).

    Parameters
    ----------
    posterior : TreePosterior, BARTPosterior or SoftTreePosterior
    X, y : array-like [M, D] and [M], optional (BART posteriors): also the groups ``observed_data`` (``y``; class
        codes for a classifier), ``log_likelihood`` (``log p(y_m | x_m, draw)``, ``[chains, draws, M]``, what
        ``az.loo`` and ``az.waic`` read) and ``posterior_predictive`` (one ``y`` per draw, seed 0:
        :meth:`~torchtree.model.bart_posterior.BARTPosterior.predictive_draws`)

    Returns
    -------
    arviz.InferenceData (an ``xarray.DataTree`` with ArviZ >= 1.0)
        A posterior with per-chain traces (:func:`posterior_traces`: MCMC, BART, NUTS): ``posterior`` (the
        traces at the kept draws, ``[chain, draw, ...]``; for BART ``leaves_mean``, ``sigma`` (regression) and
        ``f``, the fit at the traced training rows, ``[chain, draw, f_row]``, ``[chain, draw, utility, f_row]``
        with ``K >= 3`` classes), ``warmup_posterior`` (the warm-up sweeps of the traces that record every
        sweep), ``sample_stats.lp`` (when ``log_posterior`` is traced) and, with ``X, y``, the three groups
        above. A weighted posterior (SMC, DCC): ``posterior.n_leaves`` / ``posterior.depth`` and
        ``sample_stats.weight`` / ``sample_stats.log_weight``, one chain over its distinct trees.

    Raises
    ------
    ImportError
        ArviZ is not installed.
    ValueError
        Only one of ``X`` and ``y`` is given.
    TypeError
        ``X, y`` are given with a posterior other than BART's (weighted or collapsed draws, which PSIS-LOO
        and WAIC cannot read).
    """
    try:
        import arviz as az
    except ImportError as exc:
        raise ImportError(ARVIZ_MISSING) from exc
    attrs = _attrs(posterior)
    traces = posterior_traces(posterior)
    if traces is not None:
        kept, warmup = _kept_draws(posterior, traces)
        groups: Dict[str, Dict[str, np.ndarray]] = {"posterior": kept}
        if warmup:
            groups["warmup_posterior"] = warmup
        if X is not None or y is not None:
            if X is None or y is None:
                raise ValueError("to_arviz takes X and y together (the data of the log-likelihood)")
            groups.update(_data_groups(posterior, X, y))
        if "log_posterior" in traces:
            groups["sample_stats"] = {"lp": traces["log_posterior"]}
        attrs["weighted"] = 0
        return _from_dict(az, groups, attrs, _f_labels(posterior, kept))
    if X is not None or y is not None:
        _data_groups(posterior, X, y)  # refuses: a weighted posterior
    sizes = tree_sizes(posterior)
    w = sizes["weight"]
    with np.errstate(divide="ignore"):
        lw = np.log(w)
    groups = {
        "posterior": {"n_leaves": sizes["n_leaves"][None, :], "depth": sizes["depth"][None, :]},
        "sample_stats": {"weight": w[None, :], "log_weight": lw[None, :]},
    }
    attrs["weighted"] = 1
    return _from_dict(az, groups, attrs)
