"""Equal-tailed predictive intervals from Monte Carlo draws, in blocks of rows.

Every posterior's ``predict_interval`` draws its Monte Carlo noise once per call, one variate per
draw index and shared by all rows (common random numbers): a row's interval is a function of the
row, ``level``, ``n_draws`` and ``seed`` only, the same alone as among any other rows, in any
block. Each row's draws still follow its own posterior predictive exactly; only the Monte Carlo
errors of different rows are correlated, which keeps interval curves smooth in ``x``.
"""
from __future__ import annotations

import math
from typing import Tuple

import numpy as np
import torch

from torchtree.core.validate import check_int, check_real
from torchtree.core.warn import warn

__all__ = ["INTERVAL_BLOCK", "KINDS", "check_interval", "equal_tailed", "polar_pairs", "polar_normal", "polar_student_t"]

# Rows of predict_interval computed at once (the memory of ``n_draws`` draws per row); the
# random numbers do not depend on it. At the default 4000 draws a block's arrays are about 8 MB each,
# under glibc's largest mmap threshold (32 MB), so the heap reuses them block after block instead of
# mapping fresh pages for each (1024 rows: 30-40% of the call went to page faults).
INTERVAL_BLOCK = 256

#: What ``predict_interval(kind=...)`` bounds: ``"predictive"``, a new observation ``y`` at ``x``
#: (the posterior predictive: the function's uncertainty plus the noise); ``"mean"``, the regression
#: function ``f(x) = E[y | x]`` itself (a credible interval of the function, narrower: no noise).
KINDS = ("predictive", "mean")


def check_interval(task: str, level, n_draws, seed=0, kind="predictive") -> tuple:
    """The arguments of a ``predict_interval``, checked: ``(level, n_draws)`` (``seed``: an integer in
    ``[0, 2^63)``; ``kind``: one of :data:`KINDS`; else ``ValueError``)."""
    check_int("seed", seed, 0, (1 << 63) - 1)
    if kind not in KINDS:
        raise ValueError(f"kind={kind!r}: one of {', '.join(map(repr, KINDS))} (an interval of a new y, or of "
                         f"the regression function f(x), its mean)")
    if task != "regression":
        raise ValueError("predict_interval applies to regression")
    level, n_draws = check_real("level", level, 0.0, 1.0, high_open=True), check_int("n_draws", n_draws, 1)
    tail = (1.0 - level) / 2 * n_draws
    if tail < 1.0:
        warn(f"predict_interval: level={level!r} leaves {tail:.2g} of the n_draws={n_draws} Monte Carlo draws in "
             f"each tail, so the bounds are about the smallest and largest draws, not the level's quantiles; raise "
             f"n_draws to at least {math.ceil(round(20 / (1.0 - level), 6)):,} for 10 draws per tail", UserWarning)
    return level, n_draws


def polar_pairs(generator: torch.Generator, n: int) -> Tuple[torch.Tensor, torch.Tensor]:
    """``n`` points uniform in the unit disc, by rejection from the square (Marsaglia's polar
    method): ``(U, W)`` with ``W = U^2 + V^2`` in (0, 1), float64 ``[n]`` on the CPU. Candidates
    are drawn in rounds from ``generator``, so the result depends on it and ``n`` only."""
    us, ws, have = [], [], 0
    while have < n:
        m = int((n - have) * 1.3) + 16  # acceptance is pi / 4
        uv = torch.rand(2, m, generator=generator, dtype=torch.float64).mul_(2).sub_(1)
        w = uv[0] * uv[0] + uv[1] * uv[1]
        ok = (w > 0) & (w < 1)
        us.append(uv[0][ok])
        ws.append(w[ok])
        have += int(ok.sum())
    return torch.cat(us)[:n], torch.cat(ws)[:n]


def polar_normal(u: torch.Tensor, w: torch.Tensor) -> torch.Tensor:
    """Standard normal variates from :func:`polar_pairs`: ``U sqrt(-2 log W / W)``."""
    return u * torch.sqrt(-2 * torch.log(w) / w)


def polar_student_t(u: torch.Tensor, w: torch.Tensor, df: torch.Tensor) -> torch.Tensor:
    """Student-t variates with ``df`` (finite, > 0) degrees of freedom from :func:`polar_pairs`,
    by Bailey's polar method: ``U sqrt(df (W^(-2/df) - 1) / W)``, exact for every ``df``
    (Bailey 1994, Math. Comp. 62, 779-781). ``u``, ``w`` broadcast against ``df``; the same pair
    gives a variate of every ``df``, so rows with different degrees of freedom can share one
    pair per draw."""
    return torch.log(w).mul(-2.0).div(df).expm1_().mul_(df).div_(w).sqrt_().mul_(u)


def equal_tailed(draws: torch.Tensor, level: float) -> np.ndarray:
    """Equal-tailed interval of predictive draws ``[S, M]`` float64: ``[M, 2]`` (lower, upper).

    ``torch.quantile``'s linear interpolation between the two order statistics around
    each rank, bit for bit, but the order statistics come from a partial sort (``topk``
    of the shorter tail), which costs less than a full sort of the draws.
    """
    q = torch.tensor([(1 - level) / 2, 1 - (1 - level) / 2], dtype=torch.float64, device=draws.device)
    if bool(torch.isnan(draws).any()):
        return torch.quantile(draws, q, dim=0).T.cpu().numpy()
    n = draws.shape[0]
    ranks = q * (n - 1)
    below, above, frac = ranks.long().tolist(), ranks.ceil().long().tolist(), ranks - ranks.long()
    d = draws.T.contiguous()
    cols = []
    for i in range(2):
        b, a = below[i], above[i]
        if b < n - 1 - b:
            v = torch.topk(d, a + 1, dim=1, largest=False, sorted=True).values
            lo, hi = v[:, b], v[:, a]
        else:
            v = torch.topk(d, n - b, dim=1, largest=True, sorted=True).values
            lo, hi = v[:, n - 1 - b], v[:, n - 1 - a]
        cols.append(torch.lerp(lo, hi, frac[i]))
    return torch.stack(cols, 1).cpu().numpy()
