"""64-bit integer hashing on tensors (SplitMix64 finaliser).

Used for counter-based random numbers (``torchtree.core.random``) and for keying tree
regions (``kernels.forest``). int64 arithmetic wraps identically on CPU and CUDA.
"""
from __future__ import annotations

import torch

__all__ = ["GOLDEN", "srl", "mix"]

GOLDEN = -7046029254386353131  # 0x9E3779B97F4A7C15 as signed int64
_M1 = -4658895280553007687  # 0xBF58476D1CE4E5B9
_M2 = -7723592293110705685  # 0x94D049BB133111EB


def srl(x: torch.Tensor, s: int) -> torch.Tensor:
    """Logical right shift of int64 by ``s`` bits (torch's ``>>`` is arithmetic)."""
    return (x >> s) & ((1 << (64 - s)) - 1)


def mix(z: torch.Tensor) -> torch.Tensor:
    """SplitMix64 finaliser: a bijective avalanche mix of int64 ``z`` (same shape)."""
    z = (z ^ srl(z, 30)) * _M1
    z = (z ^ srl(z, 27)) * _M2
    return z ^ srl(z, 31)
