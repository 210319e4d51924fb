"""How well a BART run's chains mixed, and the rule of a run until converged (``min_ess``).

A run records three traces per chain (forest, with several class utilities):

* sigma, the noise sd, at each kept sweep (regression);
* the mean leaves per tree at every sweep;
* ``f``, the sum of trees, at each kept sweep on :data:`F_ROWS` training rows spread evenly over the data
  (:func:`traced_rows`): the function the predictions average, which mixes more slowly than sigma and the
  tree sizes.

:func:`diagnostics` reduces them to split-R-hat and ESS (:mod:`torchtree.model.diagnostics`); for ``f``, one
value per traced row (and class utility) summarised over the rows: ``rhat_f`` is their 90% quantile,
``ess_f`` their 10% quantile, so the limits hold at nine rows in ten. The run's convergence warning and the
rule of :func:`window` read every ``rhat_*`` and ``ess_*`` entry.
"""
from __future__ import annotations

from typing import Any, Dict, Tuple

import numpy as np
import torch

from torchtree.model.diagnostics import chain_ess, ess_columns, rhat, rhat_columns, unconverged

__all__ = ["F_ROWS", "F_QUANTILE", "traced_rows", "traced_f", "kept_sweeps", "diagnostics", "window", "cat_chains", "gather_traces",
           "run_traces", "traces_out", "f_trace"]

#: training rows whose ``f`` the run traces
F_ROWS = 100
#: ``rhat_f`` is the (1 - F_QUANTILE) quantile of the rows' R-hats, ``ess_f`` the F_QUANTILE quantile of their ESS
F_QUANTILE = 0.1


def traced_rows(n: int, device=None) -> torch.Tensor:
    """The training rows whose ``f`` a run of ``n`` points traces: ``min(n, F_ROWS)`` rows spread evenly,
    ``round(i (n - 1) / (F_ROWS - 1))``, LongTensor ascending."""
    if n <= F_ROWS:
        return torch.arange(n, device=device)
    return torch.linspace(0, n - 1, F_ROWS, dtype=torch.float64, device=device).round().long()


def traced_f(setup, latent: torch.Tensor, resid: torch.Tensor) -> torch.Tensor:
    """The forests' fit at the run's traced rows (``setup.f_rows`` of a
    :class:`~torchtree.samplers.bart.state.BARTSetup`), ``[C, R]``: ``target - resid`` (regression, on the
    range-scaled target) or ``latent - resid`` (probit: the latent's mean, offset included). No host read."""
    rows = setup.f_rows
    if setup.prior.task == "regression":
        return setup.target.index_select(0, rows)[None, :].to(resid.dtype) - resid.index_select(1, rows)
    return latent.index_select(1, rows) - resid.index_select(1, rows)


def kept_sweeps(n_warmup: int, thin: int, n_kept: int) -> np.ndarray:
    """The indices of the kept sweeps among all of a run's: every ``thin``-th after ``n_warmup``,
    ``n_warmup + thin - 1 + thin * j`` for ``j < n_kept`` (int64)."""
    return n_warmup + thin - 1 + thin * np.arange(int(n_kept), dtype=np.int64)


def diagnostics(sig: torch.Tensor, leaves: torch.Tensor, f: torch.Tensor, kept: np.ndarray, regression: bool,
                n_utilities: int) -> Dict[str, float]:
    """Split-R-hat and ESS of the run's traces at its kept sweeps, every chain's.

    Parameters
    ----------
    sig : Tensor [S, C], the kept sweeps' noise variances (range-scaled target)
    leaves : Tensor [C, sweeps], mean leaves per tree at every sweep; the sweeps ``kept`` count (those a
        checkpoint written before the trace lacks are left out)
    f : Tensor [S, C, R], the kept sweeps' :func:`traced_f`, or one with no sweeps (a checkpoint written
        before ``f`` was traced): then ``rhat_f`` and ``ess_f`` are NaN
    kept : int array [S], the kept sweeps' indices (:func:`kept_sweeps`)
    regression : bool, sigma's entries are NaN otherwise
    n_utilities : int, forests per chain (``C`` = chains x utilities, utility fastest)

    Returns
    -------
    dict: ``rhat_sigma``, ``ess_sigma``, ``rhat_leaves``, ``ess_leaves``, ``rhat_f``, ``ess_f``; with several
    class utilities, the leaf count's worst R-hat and ESS over the utilities (each over its chains)
    """
    sig_trace = sig.sqrt().T.cpu().numpy()  # [C, S] (regression: one forest per chain; classification has none)
    kept = np.asarray(kept, dtype=np.int64)
    kept = leaves.cpu().numpy()[:, kept[kept < leaves.shape[1]]]
    U = n_utilities
    per_utility = kept.reshape(kept.shape[0] // U, U, -1).transpose(0, 2, 1)  # [chains, sweeps, U]: a utility's
    r_leaves, e_leaves = rhat_columns(per_utility), ess_columns(per_utility)  # forests are not each other's chains
    out = {"rhat_sigma": rhat(sig_trace) if regression else float("nan"),
           "ess_sigma": chain_ess(sig_trace) if regression else float("nan"),
           "rhat_leaves": float(np.nanmax(r_leaves)) if (~np.isnan(r_leaves)).any() else float("nan"),
           "ess_leaves": float(np.nanmin(e_leaves)) if np.isfinite(e_leaves).any() else float("nan")}
    out["rhat_f"], out["ess_f"] = float("nan"), float("nan")
    if f.shape[0] == sig.shape[0] and f.shape[0] >= 4 and f.numel():
        S, C, R = f.shape
        U = n_utilities
        per = f.double().cpu().numpy().reshape(S, C // U, U * R).transpose(1, 0, 2)  # [chains, S, U R]
        rh, es = rhat_columns(per), ess_columns(per)
        if (~np.isnan(rh)).any():  # an inf R-hat (rows whose chains are stuck apart) stays inf in the quantile
            big = np.finfo(np.float64).max  # (numpy's interpolation would turn inf x 0 into NaN)
            q = float(np.nanquantile(np.where(np.isinf(rh), big, rh), 1.0 - F_QUANTILE))
            out["rhat_f"] = float("inf") if q > big / 4 else q
        if np.isfinite(es).any():
            out["ess_f"] = float(np.nanquantile(es, F_QUANTILE))
    return out


def window(sig: torch.Tensor, leaves: torch.Tensor, f: torch.Tensor, n_warmup: int, thin: int, n_samples: int,
           max_rhat: float, min_ess: float, regression: bool, n_utilities: int) -> Tuple[int, Dict[str, float], bool]:
    """``(drop, diagnostics, within)``: the kept sweeps a run with ``min_ess`` returns, as the number of its
    first kept sweeps moved to the warm-up, the :func:`diagnostics` of the rest and whether they are within
    ``max_rhat`` and ``min_ess`` (:func:`~torchtree.model.diagnostics.unconverged`).

    The windows tried, in order: every kept sweep, then, once the run has gone past ``n_samples``, the second
    half (the warm-up doubled, as where the chains were still drifting from their start). The first within
    the limits is taken; when none is (the cap or a time budget ended the run), the one whose largest R-hat is
    smaller, the first on a tie. A window of fewer than 4 sweeps per chain gives no R-hat and is never within.
    """
    S = sig.shape[0]
    tried = []
    kept = kept_sweeps(n_warmup, thin, S)
    for drop in (0, S // 2) if S > n_samples else (0,):
        d = diagnostics(sig[drop:], leaves, f[drop:], kept[drop:], regression, n_utilities)
        if S - drop >= 4 and not unconverged(d, max_rhat, min_ess):
            return drop, d, True
        worst = max((v for k, v in d.items() if k.startswith("rhat_") and v == v), default=float("inf"))
        tried.append((worst, drop, d))
    worst, drop, d = min(tried, key=lambda t: t[0])  # min keeps the first of equals
    return drop, d, False


def cat_chains(be, t: torch.Tensor) -> torch.Tensor:
    """``[S, C, ...]`` on each rank -> ``[S, W*C, ...]``, chains in global order (collective)."""
    g = be.all_gather(t.transpose(0, 1).contiguous().cpu())
    return g.transpose(0, 1).contiguous().to(t.device)


def gather_traces(be, sig: torch.Tensor, leaves: torch.Tensor, f: torch.Tensor):
    """Every rank's kept sigma draws ``[S, C]``, mean-leaves traces ``[C, sweeps]`` and traced fits
    ``[S, C, R]``, chains in global order (collective)."""
    return cat_chains(be, sig), be.all_gather(leaves.cpu().contiguous()), cat_chains(be, f)


def run_traces(state):
    """A ``BARTState``'s traces: kept sigma^2 ``[S, C]``, mean leaves ``[C, sweeps]``, traced fits ``[S, C, R]`` (no
    sweeps where a resumed checkpoint predates them)."""
    sig = torch.stack(state.kept_sigma)
    C = sig.shape[1]
    leaves = torch.stack(state.trace_leaves, 1) if state.trace_leaves else torch.zeros(C, 0)
    traced = len(state.kept_f) == len(state.kept_sigma)
    f = torch.stack(state.kept_f) if traced and state.kept_f else torch.zeros(0, C, 0, dtype=sig.dtype, device=sig.device)
    return sig, leaves, f


def traces_out(sig, leaves, f, prior, U: int) -> Dict[str, Any]:
    """``info["trace"]``, one row per chain: ``sigma`` ``[chains, S]`` (regression), ``leaves_mean`` ``[chains,
    sweeps]`` (``[chains, sweeps, U]`` with class utilities) and ``f`` (:func:`f_trace`)."""
    lv = leaves.cpu().numpy()
    out = {"leaves_mean": lv if U == 1 else lv.reshape(lv.shape[0] // U, U, -1).transpose(0, 2, 1)}
    if prior.task == "regression":
        out["sigma"] = sig.sqrt().T.cpu().numpy() * prior.scale
    out["f"] = f_trace(f, prior, U)
    return out


def f_trace(f, prior, U: int):
    """``info["trace"]["f"]``: the traced fits ``[S, C, R]`` as ``[chains, S, R]`` (``[chains, S, U, R]`` with
    class utilities) float64, on the target's scale (regression) or the probit latent's."""
    S, C, R = f.shape
    f = f.double().cpu().reshape(S, C // U, U, R).permute(1, 0, 2, 3)
    if prior.task == "regression":
        f = prior.offset + prior.scale * f
    return (f[:, :, 0] if U == 1 else f).numpy()
