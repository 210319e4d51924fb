"""Cases shared by the distributed tests and the worker processes they launch.

Everything here is a pure function of its arguments (seeded), so a worker and the test that
checks it build the same global inputs independently.
"""

from __future__ import annotations

import math

import torch

N_TOTAL = 120  # divisible by every world size tested (1..4) and by 5, 6, 8
GROUP_SIZES = (1, 2, 3, 4)
METHODS = ("rotational", "alltoall")
NODE_KEYS = ("feature", "threshold", "stats")


def make_block(n_particles: int, capacity: int = 5, seed: int = 0) -> dict[str, torch.Tensor]:
    """A tree-shaped particle block: node fields [N, C] / [N, C, 2], per-tree fields [N]."""
    g = torch.Generator().manual_seed(seed)
    return {
        "feature": torch.randint(-1, 9, (n_particles, capacity), generator=g, dtype=torch.int32),
        "threshold": torch.rand(n_particles, capacity, generator=g),
        "stats": torch.rand(n_particles, capacity, 2, generator=g, dtype=torch.float64),
        "n_nodes": torch.arange(n_particles, dtype=torch.int64) * 7 + seed,
        "alive": torch.rand(n_particles, generator=g) > 0.3,
    }


def ncopies_case(name: str, n_total: int, group_size: int, seed: int = 0) -> torch.Tensor:
    """Global ncopies [N] for a named case (sum N, non-negative)."""
    g = torch.Generator().manual_seed(seed)
    n = n_total // group_size
    nc = torch.zeros(n_total, dtype=torch.int64)
    if name == "random":  # heavy-tailed weights, many zeros and a few large counts
        w = torch.rand(n_total, generator=g, dtype=torch.float64) ** 6
        idx = torch.multinomial(w, n_total, replacement=True, generator=g)
        nc.index_add_(0, idx, torch.ones(n_total, dtype=torch.int64))
    elif name == "one_first":
        nc[0] = n_total
    elif name == "one_middle":
        nc[n_total // 2 + 1] = n_total
    elif name == "one_last":
        nc[-1] = n_total
    elif name == "all_ones":
        nc[:] = 1
    elif name == "last_rank_only":  # all mass on the last rank's particles
        idx = torch.randint(n_total - n, n_total, (n_total,), generator=g)
        nc.index_add_(0, idx, torch.ones(n_total, dtype=torch.int64))
    elif name == "alternating":
        nc[::2] = 2
    else:
        raise ValueError(name)
    assert int(nc.sum()) == n_total
    return nc


CASES = ("random", "one_first", "one_middle", "one_last", "all_ones", "last_rank_only", "alternating")


def log_weights(n_total: int, seed: int = 0) -> torch.Tensor:
    """Global log-weights with a wide range and some exact zeros (-inf)."""
    g = torch.Generator().manual_seed(seed)
    lw = torch.randn(n_total, generator=g, dtype=torch.float64) * 25.0
    lw[torch.rand(n_total, generator=g) < 0.2] = -math.inf
    return lw


def int_values(n_total: int, seed: int = 0) -> torch.Tensor:
    g = torch.Generator().manual_seed(seed)
    return torch.randint(-1000, 1000, (n_total, 3), generator=g, dtype=torch.int64)


SYSTEMATIC_U = 0.3141592653589793
MULTINOMIAL_SEED = 1234
