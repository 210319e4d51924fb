"""Progress bars for the work a fit starts besides its run: the evidence pilots, the nested runs
(top-down starts) and, through :func:`progress_monitor`, the run itself.

An estimator's ``fit`` (and ``torchtree fit``) enters :func:`progress_bars` with its ``verbose``
level; code anywhere below asks :func:`progress_monitor` for a bar, which is None when no fit asked for
bars. Levels: 0 none; 1 a bar per phase that runs longer than ``PROGRESS_DELAY`` seconds, when standard
error is a terminal or the process is a Jupyter kernel (tqdm's notebook widget there); 2 or more every
bar, at once, on any stream.
"""
from __future__ import annotations

import contextlib
import contextvars
from typing import Iterator, Optional

from torchtree.monitor.writers import ProgressMonitor

__all__ = ["PROGRESS_DELAY", "progress_bars", "progress_monitor"]

#: seconds a phase runs before its bar appears (``verbose=1``)
PROGRESS_DELAY = 2.0

_LEVEL: contextvars.ContextVar = contextvars.ContextVar("torchtree_progress_level", default=0)


@contextlib.contextmanager
def progress_bars(verbose: int) -> Iterator[None]:
    """Within the block, :func:`progress_monitor` gives bars at level ``verbose`` (see the module notes)."""
    token = _LEVEL.set(int(verbose or 0))
    try:
        yield
    finally:
        _LEVEL.reset(token)


def progress_monitor(desc: str, total: Optional[int] = None) -> Optional[ProgressMonitor]:
    """A progress bar labelled ``desc`` for one phase of a fit, or None when no bars were asked for.

    Parameters
    ----------
    desc : str, the bar's label
    total : int, optional, the phase's number of steps (else the run's ``info["total"]``)
    """
    level = _LEVEL.get()
    if level <= 0:
        return None
    if level >= 2:
        return ProgressMonitor(total=total, desc=desc, disable=False)
    return ProgressMonitor(total=total, desc=desc, disable=None, delay=PROGRESS_DELAY)
