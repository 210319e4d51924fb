"""A synthetic table of any size for scale benchmarks: thresholds, interactions, label noise.

``interactions(n, d)`` draws ``X ~ N(0, 1)^d`` and a latent score built from axis-aligned
steps, an interaction of two steps and a product term, so that a single tree needs depth to
fit it and no tree fits it exactly:

    f(x) = 1.2 [x0 > 0.5] - 0.8 [x1 < -0.3] + 1.0 [x2 > 0] [x3 > 0] + 0.6 x4 x5 + 0.4 x6

Classification: ``y = [f(x) + 0.5 e > 0.4]`` with ``e ~ N(0, 1)``, then a share ``flip`` of
labels flipped at random. Regression: ``y = f(x) + noise e``. Features beyond the seventh are
pure noise. Generation is vectorised and seeded (``torch.Generator``), float64.
"""
from __future__ import annotations

from typing import Tuple

import torch

__all__ = ["interactions", "interactions_mean"]


def interactions_mean(X: torch.Tensor) -> torch.Tensor:
    """The latent score ``f(x)`` of :func:`interactions`; ``X [n, d >= 7]`` -> ``[n]``."""
    if X.shape[1] < 7:
        raise ValueError(f"interactions needs d >= 7 features, got {X.shape[1]}")
    x = X.double()
    return (1.2 * (x[:, 0] > 0.5) - 0.8 * (x[:, 1] < -0.3) + 1.0 * ((x[:, 2] > 0) & (x[:, 3] > 0))
            + 0.6 * x[:, 4] * x[:, 5] + 0.4 * x[:, 6])


def interactions(n: int, d: int = 10, task: str = "classification", noise: float = 0.5, flip: float = 0.05,
                 seed: int = 0) -> Tuple[torch.Tensor, torch.Tensor]:
    """``n`` rows of the scale benchmark's table (see the module notes).

    Parameters
    ----------
    n : int >= 1, rows
    d : int >= 7, features (the first seven carry signal)
    task : {"classification", "regression"}
    noise : float >= 0, standard deviation of the Gaussian noise on the score
    flip : float in [0, 0.5], classification only: share of labels flipped at random
    seed : int

    Returns
    -------
    X : Tensor [n, d] float64
    y : Tensor [n], int64 labels in {0, 1} (classification) or float64 targets
    """
    if int(n) < 1:
        raise ValueError(f"n must be >= 1, got {n}")
    if task not in ("classification", "regression"):
        raise ValueError(f"task must be 'classification' or 'regression', got {task!r}")
    if not 0.0 <= flip <= 0.5 or noise < 0:
        raise ValueError(f"need noise >= 0 and 0 <= flip <= 0.5, got noise={noise}, flip={flip}")
    g = torch.Generator().manual_seed(int(seed))
    X = torch.randn(int(n), int(d), generator=g, dtype=torch.float64)
    score = interactions_mean(X) + noise * torch.randn(int(n), generator=g, dtype=torch.float64)
    if task == "regression":
        return X, score
    y = (score > 0.4).long()
    flipped = torch.rand(int(n), generator=g, dtype=torch.float64) < flip
    return X, torch.where(flipped, 1 - y, y)
