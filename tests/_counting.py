"""Counters that replace the machine's clock in tests: a test never depends on how fast or how
busy the machine is. Wall-clock speed belongs in benchmarks (benchmarks/).

* :class:`TickClock`: a budget clock that advances a fixed step per reading, for
  ``driver.CLOCKS`` (``monkeypatch.setitem(driver.CLOCKS, "cpu", TickClock(0.01))``): what a
  budget cuts is then a function of the number of budget checks, not of speed.
* :class:`Allocations`: the bytes of every tensor that torch operators produce inside the
  block (a ``TorchDispatchMode``), for "refused before it allocates" claims.
"""
from __future__ import annotations

import torch
from torch.utils._python_dispatch import TorchDispatchMode
from torch.utils._pytree import tree_leaves

MiB = 1 << 20


class TickClock:
    """``step`` seconds per reading; ``readings`` counts them."""

    def __init__(self, step: float = 1.0):
        self.step, self.t, self.readings = float(step), 0.0, 0

    def __call__(self) -> float:
        self.readings += 1
        self.t += self.step
        return self.t


class Allocations(TorchDispatchMode):
    """Inside ``with Allocations() as a:``, ``a.largest`` / ``a.total`` are the bytes of the largest
    tensor and of all tensors produced by torch operators (views counted as their size: an
    upper bound), and ``a.ops`` the operators called."""

    def __init__(self):
        super().__init__()
        self.largest, self.total, self.ops = 0, 0, 0

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        out = func(*args, **(kwargs or {}))
        self.ops += 1
        for t in tree_leaves(out):
            if isinstance(t, torch.Tensor):
                n = t.numel() * t.element_size()
                self.total += n
                self.largest = max(self.largest, n)
        return out


class Calls:
    """Inside ``with Calls() as c:``, ``c.n`` counts Python and C function calls (``sys.setprofile``
    events): a work counter for "no per-row / per-class Python loop" claims."""

    def __enter__(self):
        import sys

        self.n, self._prev = 0, sys.getprofile()

        def count(frame, event, arg):
            if event in ("call", "c_call"):
                self.n += 1

        sys.setprofile(count)
        return self

    def __exit__(self, *exc):
        import sys

        sys.setprofile(self._prev)
        return False
