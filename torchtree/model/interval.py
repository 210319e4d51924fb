"""Equal-tailed predictive intervals from Monte Carlo draws, in blocks of rows."""
from __future__ import annotations

import numpy as np
import torch

from torchtree.core.validate import check_int, check_real

__all__ = ["INTERVAL_BLOCK", "block_seed", "check_interval", "equal_tailed"]

# Rows per random-number block of predict_interval: a block's draws come from one stream
# (the first block's from ``seed`` exactly as before blocks existed), so intervals do not
# depend on the memory budget; a block is computed at once.
INTERVAL_BLOCK = 1024


def check_interval(task: str, level, n_draws) -> tuple:
    """The arguments of a ``predict_interval``, checked: ``(level, n_draws)``."""
    if task != "regression":
        raise ValueError("predict_interval applies to regression")
    return check_real("level", level, 0.0, 1.0, high_open=True), check_int("n_draws", n_draws, 1)


def block_seed(seed: int, block: int) -> int:
    """Seed of the random stream of interval block ``block >= 1`` (distinct from every
    plain seed's first block, and from other blocks)."""
    return int(np.random.SeedSequence([int(seed) & ((1 << 63) - 1), int(block), 0x7EE]).generate_state(1, np.uint64)[0] >> 1)


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
