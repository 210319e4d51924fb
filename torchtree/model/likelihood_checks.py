"""Conformance of a leaf likelihood to its contract, hook by hook (:func:`check_likelihood`).

Exported as :func:`torchtree.testing.check_likelihood`. The contract is
:class:`~torchtree.model.likelihood_protocol.LeafLikelihood`; this module exercises every hook, the
optional ones where present, on the statistics of a few points added one at a time.
"""
from __future__ import annotations

import io
import math
from typing import Any, Callable, Optional

import torch

from torchtree.model.data import Data
from torchtree.model.likelihood_protocol import (LIKELIHOODS, TASKS, counts_hook, likelihood_from_config,
                                                  missing_hooks)

__all__ = ["check_likelihood"]


def _synthetic(task: str, n_points: int, n_classes: int, seed: int) -> Data:
    """``n_points`` rows of two features; classification: ``n_classes`` classes of which the last holds no
    point (when there are 3 or more), regression: targets around 1 with spread 2."""
    g = torch.Generator().manual_seed(seed)
    X = torch.rand(n_points, 2, generator=g, dtype=torch.float64)
    if task == "classification":
        y = torch.arange(n_points) % max(n_classes - 1, 2)  # the last class empty: Data(..., n_classes=K)
        return Data(X, y[torch.randperm(n_points, generator=g)], n_classes=n_classes)
    return Data(X, 1.0 + 2.0 * torch.randn(n_points, generator=g, dtype=torch.float64), task="regression")


def check_likelihood(likelihood: Any, data: Optional[Data] = None, *, n_points: int = 12, n_classes: int = 3,
                     seed: int = 0) -> None:
    """Check that ``likelihood`` meets the leaf-likelihood contract, hook by hook.

    With the statistics ``s_0 = 0, s_1, ..., s_N`` of the first ``0, 1, ..., N`` points (sums of
    ``point_stats`` rows), it checks:

    * the required hooks are there (:data:`~torchtree.model.likelihood_protocol.REQUIRED_HOOKS`),
      ``task`` is one of ``"classification"`` / ``"regression"`` and ``stats_dtype`` a floating dtype;
    * ``n_stats(data)`` is the width ``S`` of ``point_stats(y, n_classes) [N, S]``, whose rows depend on
      their own label only and are finite: one-hot rows for classification (exact in ``stats_dtype``),
      a first column of ones for regression;
    * ``log_marginal``: ``[..., S] -> [...]`` float64, finite, broadcasting over leading dimensions,
      0 at ``s_0`` (an empty node), and consistent with the predictive: ``log_marginal(s_i) -
      log_marginal(s_{i-1}) = log_prob_rows(predictive_table(s_{i-1}), y_i)`` (the chain rule of a
      marginal likelihood);
    * ``predictive_table``: ``[..., S] -> [..., T]``, finite, broadcasting; classification rows are
      probabilities over the ``K`` classes (non-negative, summing to 1); regression rows are
      Student-t ``(df, loc, scale)`` with ``df > 0`` and ``scale > 0``, and ``log_prob_rows`` is
      their Student-t log density;
    * ``log_prob_rows``: ``[T_rows]`` float64, finite;
    * the optional hooks where present: ``log_predictive_point`` equals ``log_prob_rows``;
      ``mean_table`` (regression) is a Student-t with the predictive's ``loc``, ``df > 0`` and
      ``0 < scale``; ``log_marginal_counts`` (classification only) equals ``log_marginal``;
    * ``config()`` is a dict whose ``"name"`` is registered for this class
      (:func:`~torchtree.model.likelihood_protocol.register_likelihood`), survives
      ``torch.save`` / ``torch.load(weights_only=True)`` as a posterior file stores it, and rebuilds
      an equal likelihood (same class, same ``config()``, same ``log_marginal``).

    Parameters
    ----------
    likelihood : the object to check
    data : Data, optional
        The labels to use (the likelihood's task); default: ``n_points`` synthetic ones
        (classification: ``n_classes`` classes, the last one without points when there are 3 or more).
    n_points : int, the number of synthetic points (default 12)
    n_classes : int, the number of synthetic classes (default 3; classification)
    seed : int, of the synthetic data (default 0)

    Raises
    ------
    AssertionError
        The first violation, its message naming the hook (``ClassName.hook: what is wrong``).
    """
    cls = type(likelihood).__qualname__

    def need(ok: Any, hook: str, what: str) -> None:
        if not bool(ok):
            raise AssertionError(f"{cls}.{hook}: {what}")

    def call(hook: str, fn: Callable[..., Any], *args: Any) -> Any:
        try:
            return fn(*args)
        except AssertionError:
            raise
        except Exception as exc:  # a hook that raises fails the check, named
            raise AssertionError(f"{cls}.{hook} raised {type(exc).__name__}: {exc}") from exc

    def close(a: torch.Tensor, b: torch.Tensor, tol: float) -> bool:
        return a.shape == b.shape and bool(torch.allclose(a.double(), b.double(), rtol=tol, atol=tol))

    missing = missing_hooks(likelihood)
    need(not missing, missing[0] if missing else "", f"missing required hook(s) {', '.join(missing)}")
    task = likelihood.task
    need(task in TASKS, "task", f"must be one of {TASKS}, got {task!r}")
    sdt = likelihood.stats_dtype
    need(isinstance(sdt, torch.dtype) and sdt.is_floating_point, "stats_dtype", f"must be a floating torch.dtype, got {sdt!r}")
    data = _synthetic(task, int(n_points), int(n_classes), int(seed)) if data is None else data
    need(data.task == task, "task", f"is {task!r} but the data is {data.task!r}")
    y, K = data.y.cpu(), data.n_classes
    N = int(y.shape[0])

    # point_stats and n_stats
    S = call("n_stats", likelihood.n_stats, data)
    need(isinstance(S, int) and not isinstance(S, bool) and S >= 1, "n_stats", f"must be a positive int, got {S!r}")
    ps = call("point_stats", likelihood.point_stats, y, K)
    need(isinstance(ps, torch.Tensor) and tuple(ps.shape) == (N, S), "point_stats",
         f"must be a tensor [N, n_stats(data)] = [{N}, {S}], got {getattr(ps, 'shape', type(ps).__name__)}")
    need(torch.isfinite(ps.double()).all(), "point_stats", "holds NaN or infinite values")
    head = call("point_stats", likelihood.point_stats, y[: N // 2], K)
    need(isinstance(head, torch.Tensor) and torch.equal(head.double(), ps[: N // 2].double()), "point_stats",
         "row n must depend on y[n] only (the rows of a slice of y differ)")
    if task == "classification":
        onehot = torch.nn.functional.one_hot(y.long(), K).double()
        need(torch.equal(ps.double(), onehot), "point_stats", f"must be the one-hot rows [N, K={K}] of the labels "
             "(the samplers count classes from the labels)")
        need(torch.equal(ps.to(sdt).double(), onehot), "stats_dtype", "does not hold the class counts exactly")
    else:
        need(torch.equal(ps[:, 0].double(), torch.ones(N, dtype=torch.float64)), "point_stats",
             "column 0 must be 1 for every point (a node's column 0 is its number of points)")
    cum = torch.cat([torch.zeros(1, S, dtype=torch.float64), ps.double().cumsum(0)]).to(sdt)  # [N + 1, S]

    # log_marginal
    lm = call("log_marginal", likelihood.log_marginal, cum)
    need(isinstance(lm, torch.Tensor) and tuple(lm.shape) == (N + 1,), "log_marginal",
         f"stats [{N + 1}, {S}] must give [{N + 1}], got {getattr(lm, 'shape', type(lm).__name__)}")
    need(lm.dtype == torch.float64, "log_marginal", f"must return float64, got {lm.dtype}")
    need(torch.isfinite(lm).all(), "log_marginal", "holds NaN or infinite values")
    need(abs(float(lm[0])) <= 1e-9, "log_marginal", f"must be 0 for empty statistics (an empty node), got {float(lm[0])}")
    batched = call("log_marginal", likelihood.log_marginal, cum[None].expand(2, -1, -1))
    need(isinstance(batched, torch.Tensor) and close(batched, lm[None].expand(2, -1), 1e-12), "log_marginal",
         "must broadcast over leading dimensions ([2, N, S] -> [2, N], each row as alone)")

    # predictive_table and log_prob_rows
    tab = call("predictive_table", likelihood.predictive_table, cum)
    T = K if task == "classification" else 3
    need(isinstance(tab, torch.Tensor) and tuple(tab.shape) == (N + 1, T), "predictive_table",
         f"stats [{N + 1}, {S}] must give [{N + 1}, {T}], got {getattr(tab, 'shape', type(tab).__name__)}")
    need(tab.dtype.is_floating_point and torch.isfinite(tab).all(), "predictive_table", "must be finite floats")
    batched = call("predictive_table", likelihood.predictive_table, cum[None].expand(2, -1, -1))
    need(isinstance(batched, torch.Tensor) and close(batched, tab[None].expand(2, -1, -1), 1e-12), "predictive_table",
         "must broadcast over leading dimensions ([2, N, S] -> [2, N, T], each row as alone)")
    if task == "classification":
        need((tab >= 0).all() and close(tab.double().sum(-1), torch.ones(N + 1), 1e-5), "predictive_table",
             "rows must be class probabilities (non-negative, summing to 1)")
    else:
        need((tab[:, 0] > 0).all() and (tab[:, 2] > 0).all(), "predictive_table",
             "must be Student-t (df, loc, scale) rows with df > 0 and scale > 0")
    lp = call("log_prob_rows", likelihood.log_prob_rows, tab[:-1], y)
    need(isinstance(lp, torch.Tensor) and tuple(lp.shape) == (N,) and lp.dtype == torch.float64, "log_prob_rows",
         f"rows [{N}, {T}] and labels [{N}] must give [{N}] float64, got "
         f"{getattr(lp, 'shape', type(lp).__name__)} {getattr(lp, 'dtype', '')}")
    need(torch.isfinite(lp).all(), "log_prob_rows", "holds NaN or infinite values")
    if task == "regression":
        t = tab[:-1].double()
        ref = torch.distributions.StudentT(t[:, 0], t[:, 1], t[:, 2]).log_prob(y.double())
        need(close(lp, ref, 1e-9), "log_prob_rows", "must be the Student-t log density of the (df, loc, scale) rows "
             "(predict_interval and the plots read the rows so)")
    step = lm[1:] - lm[:-1]
    worst = float((step - lp).abs().max()) if N else 0.0
    need(worst <= 1e-5 * (1.0 + float(step.abs().max())), "log_marginal",
         "log_marginal(s + point) - log_marginal(s) must equal log_prob_rows(predictive_table(s), y) "
         f"(the log predictive of the point added); off by up to {worst:.3g}")

    # optional hooks
    if callable(getattr(likelihood, "log_predictive_point", None)):
        lpp = call("log_predictive_point", likelihood.log_predictive_point, tab[:-1][None], y)
        need(isinstance(lpp, torch.Tensor) and close(lpp, lp[None], 1e-9), "log_predictive_point",
             f"rows [1, {N}, {T}] must give [1, {N}], equal to log_prob_rows")
    if task == "regression" and callable(getattr(likelihood, "mean_table", None)):
        mt = call("mean_table", likelihood.mean_table, cum)
        need(isinstance(mt, torch.Tensor) and tuple(mt.shape) == (N + 1, 3) and torch.isfinite(mt).all(), "mean_table",
             f"stats [{N + 1}, {S}] must give finite [{N + 1}, 3] (df, loc, scale) rows")
        need((mt[:, 0] > 0).all() and (mt[:, 2] > 0).all(), "mean_table", "must have df > 0 and scale > 0")
        need(close(mt[:, 1], tab[:, 1], 1e-9), "mean_table", "loc must be the predictive's loc (the posterior mean)")
    lookup = counts_hook(likelihood)
    if lookup is not None:
        need(task == "classification", "log_marginal_counts", "applies to classification only (the samplers would "
             "read regression statistics as integer counts)")
        counts = cum.round().long()
        got = call("log_marginal_counts", lookup, counts, N)
        with_totals = call("log_marginal_counts", lookup, counts, N, counts.sum(-1))
        need(isinstance(got, torch.Tensor) and close(got, lm, 1e-9) and close(with_totals, lm, 1e-9),
             "log_marginal_counts", "must equal log_marginal on integral counts (with and without totals)")

    # config: registered, plain, rebuilds an equal likelihood
    cfg = call("config", likelihood.config)
    need(isinstance(cfg, dict) and isinstance(cfg.get("name"), str), "config", f"must be a dict with a str 'name', got {cfg!r}")
    try:
        LIKELIHOODS.check_saveable(likelihood)
    except ValueError as exc:
        raise AssertionError(f"{cls}.config: {exc}") from None
    buf = io.BytesIO()
    call("config", torch.save, cfg, buf)
    buf.seek(0)
    stored = call("config", lambda: torch.load(buf, weights_only=True))
    need(stored == cfg, "config", "must hold plain values (a posterior file reads it with weights_only=True)")
    back = call("config", likelihood_from_config, stored)
    need(type(back) is type(likelihood) and back.config() == cfg, "config",
         f"rebuilt {back!r} whose config() is {back.config()!r}, not {cfg!r}")
    again = call("config", back.log_marginal, cum)
    need(close(again, lm, 1e-12) and not math.isnan(float(again.sum())), "config",
         "the rebuilt likelihood's log_marginal differs: config() must hold every setting")
