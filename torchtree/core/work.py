"""Counted work: a clock that reads the same on every machine.

A time budget (``max_seconds``) read from the wall or CPU clock makes a run's length, and so its
result, depend on the machine's speed and load: the same seed gives other draws on a busy box.
The *work clock* advances instead by the modelled cost of each costly evaluation a sampler
makes, in **reference seconds**: the seconds the evaluation takes on one thread of the
reference CPU, by a cost model of its sizes (for soft trees,
:func:`torchtree.model.soft_trees.evaluation_cost`). A budget read from it stops a seeded run at
the same evaluation everywhere, so the run is reproducible; its real duration is the reference
duration scaled by how fast the machine is.

The count is per thread (two runs in two threads of one process do not see each other's work)
and only grows; a run reads differences (:class:`torchtree.samplers.driver.RunContext`'s
``c0``). ``CLOCKS["work"]`` (:mod:`torchtree.samplers.driver`) is :func:`work_seconds`.
"""
from __future__ import annotations

import threading

__all__ = ["add_work", "work_seconds"]

_count = threading.local()


def add_work(seconds: float) -> None:
    """Advance this thread's work clock by ``seconds`` reference seconds (>= 0)."""
    _count.total = getattr(_count, "total", 0.0) + seconds


def work_seconds() -> float:
    """Reference seconds of work counted in this thread so far (a clock: only differences mean
    anything)."""
    return getattr(_count, "total", 0.0)
