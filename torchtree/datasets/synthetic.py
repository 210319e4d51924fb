"""Synthetic regression data with a known tree: CGM and WU (paper 004, App. C).

* **CGM** -- Chipman, George & McCulloch (1998), adapted as in Cochrane et al. (2023):
  two numerical inputs, 800 training and 800 test points, noise variance ``0.2**2``.
  The true tree (heap node ids; "x0" is the first column)::

      node 0: x1 <= 2 ?
        yes -> node 1: x0 <= 3 ?  yes -> mean 1
                                  no  -> node 4: x0 <= 7 ?  yes -> mean 5,  no -> mean 8
        no  -> node 2: x0 <= 5 ?  yes -> mean 8,  no -> mean 2

  which is the Chipman et al. partition (x0 splits at 3 and 7 on one side of the
  x1 split, at 5 on the other; leaf means 1, 5, 8 and 8, 2). Chipman's design is
  kept: ``x0`` is uniform on the integers 1..10 and ``x1`` on 1..4, the codes of
  Chipman's categories A, B, C, D. Paper 004 (App. C) changes only how the first
  split is defined, by the numerical input ``x1 <= 2`` instead of the category set
  {A, B}; its train MSE (0.043) and test MSE (0.040) both sit at the noise
  variance, which this design allows.

  An earlier version drew both inputs uniformly on [0, 10] (root split at 4). Then
  test points fall between the training points nearest a threshold, where no
  training data says which side they belong to, and a soft split of sharpness
  ``h = 0.001`` (Table 5) also blends neighbouring leaves near every threshold:
  the true tree itself scored train MSE 0.087 there, and a posterior in the true
  partition test MSE 0.074 against a noise floor of 0.040.

* **WU** -- Wu, Tjelmeland & West (2007), Sec. 5.1: three inputs in three blocks of
  100 points (App. C), outputs ``1, 3, 5`` plus ``N(0, 0.25**2)`` noise (standard
  deviation 0.25, which matches the paper's test MSE of about 0.06), 300 training
  points and an independent test set of the same design.

Generators are seeded (``torch.Generator``), return float64 tensors, and do not
touch global random state.
"""
from __future__ import annotations

from typing import Tuple

import torch

__all__ = ["cgm_mean", "cgm", "wu_mean", "wu", "make_dataset"]

Split = Tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]


def cgm_mean(X: torch.Tensor) -> torch.Tensor:
    """Noise-free output of the CGM tree.

    Parameters
    ----------
    X : Tensor [N, 2], columns (x0, x1)

    Returns
    -------
    Tensor [N]
    """
    x0, x1 = X[:, 0], X[:, 1]
    left = torch.where(x0 <= 3, 1.0, torch.where(x0 <= 7, 5.0, 8.0))
    right = torch.where(x0 <= 5, 8.0, 2.0)
    return torch.where(x1 <= 2, left, right).to(X.dtype)


def _cgm_draw(n: int, noise: float, g: torch.Generator) -> Tuple[torch.Tensor, torch.Tensor]:
    x0 = torch.randint(1, 11, (n,), generator=g).to(torch.float64)
    x1 = torch.randint(1, 5, (n,), generator=g).to(torch.float64)
    X = torch.stack((x0, x1), 1)
    y = cgm_mean(X) + noise * torch.randn(n, generator=g, dtype=torch.float64)
    return X, y


def cgm(n_train: int = 800, n_test: int = 800, noise: float = 0.2, seed: int = 0) -> Split:
    """CGM data set (paper 004, App. C, Fig. 4).

    Parameters
    ----------
    n_train, n_test : int
    noise : float, noise standard deviation (0.2)
    seed : int

    Returns
    -------
    X_train [n_train, 2], y_train [n_train], X_test [n_test, 2], y_test [n_test]
    """
    g = torch.Generator().manual_seed(int(seed))
    Xtr, ytr = _cgm_draw(n_train, noise, g)
    Xte, yte = _cgm_draw(n_test, noise, g)
    return Xtr, ytr, Xte, yte


def wu_mean(X: torch.Tensor) -> torch.Tensor:
    """Noise-free output of the WU tree: 1 (x0 <= .5, x1 <= .5), 3 (x0 <= .5, x1 > .5), 5.

    Parameters
    ----------
    X : Tensor [N, 3]

    Returns
    -------
    Tensor [N]
    """
    x0, x1 = X[:, 0], X[:, 1]
    return torch.where(x0 <= 0.5, torch.where(x1 <= 0.5, 1.0, 3.0), 5.0).to(X.dtype)


def _wu_draw(n_per_group: int, noise: float, g: torch.Generator) -> Tuple[torch.Tensor, torch.Tensor]:
    def U(lo: float, hi: float) -> torch.Tensor:
        return lo + (hi - lo) * torch.rand(n_per_group, generator=g, dtype=torch.float64)

    # three blocks of App. C: (x0, x1, x2) ranges
    blocks = [
        ((0.1, 0.4), (0.1, 0.4), (0.6, 0.9)),
        ((0.1, 0.4), (0.6, 0.9), (0.6, 0.9)),
        ((0.6, 0.9), (0.1, 0.9), (0.1, 0.4)),
    ]
    X = torch.cat([torch.stack([U(*r) for r in b], dim=1) for b in blocks])
    y = wu_mean(X) + noise * torch.randn(X.shape[0], generator=g, dtype=torch.float64)
    return X, y


def wu(n_per_group: int = 100, noise: float = 0.25, seed: int = 0) -> Split:
    """WU data set (paper 004, App. C, Fig. 3): 3 x ``n_per_group`` training points
    and an independent test set of the same size.

    Parameters
    ----------
    n_per_group : int (100 gives the paper's 300 points)
    noise : float, noise standard deviation (0.25)
    seed : int

    Returns
    -------
    X_train [3n, 3], y_train [3n], X_test [3n, 3], y_test [3n]
    """
    g = torch.Generator().manual_seed(int(seed))
    Xtr, ytr = _wu_draw(n_per_group, noise, g)
    Xte, yte = _wu_draw(n_per_group, noise, g)
    return Xtr, ytr, Xte, yte


def make_dataset(name: str, seed: int = 0) -> Split:
    """``"cgm"`` or ``"wu"`` with the paper's sizes.

    Returns
    -------
    X_train, y_train, X_test, y_test
    """
    name = name.lower()
    if name == "cgm":
        return cgm(seed=seed)
    if name == "wu":
        return wu(seed=seed)
    raise ValueError(f"unknown synthetic data set {name!r} (expected 'cgm' or 'wu')")
