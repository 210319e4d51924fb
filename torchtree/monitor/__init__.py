"""Monitors: watch a sampler run through ``on_start / on_step / on_end`` hooks.

Every sampler takes ``monitor=`` (a ``Monitor``, a list of them, or ``None``)
and turns it into one object with ``as_monitor(monitor, rank=backend.rank)``.
It then calls

* ``on_start(info)`` once, with the run's configuration (``info["total"]``,
  when given, is the number of steps to expect);
* ``on_step(step, info)`` after each step, with tags chosen by the sampler
  (``"smc/ess"``, ``"smc/log_evidence"``, ``"trees/leaves_mean"``, ...) mapped
  to python scalars, strings, 0-d tensors or 1-D tensors (histograms);
  nested dicts are flattened with ``/``;
* ``on_end(info)`` once, with the final results.

Monitors must not modify ``info`` (one dict is passed to all of them) and must
not keep references to tensors they are given (the sampler may reuse them):
``TraceMonitor`` stores copies.

In a multi-rank run only rank 0's monitors act, unless a monitor was created
with ``all_ranks=True``: ``as_monitor(obj, rank=r)`` replaces the others with a
no-op on ranks ``r != 0``. Files and bars are opened lazily on the first hook,
so a gated monitor never creates an event file or a progress bar. An exception raised
by a monitor to stop a multi-rank run stops only the ranks it is raised on: it must be
raised on every rank (``all_ranks=True``) after the same step.
"""
from torchtree.monitor.base import (CallbackMonitor, Monitor, MonitorList, NullMonitor, TraceMonitor, as_monitor,
                                    closed_on_error, notify_checkpoint)
from torchtree.monitor.writers import DEFAULT_PROGRESS_KEYS, ProgressMonitor, TensorBoardMonitor
from torchtree.monitor.progress import PROGRESS_DELAY, progress_bars, progress_monitor

__all__ = ["Monitor", "NullMonitor", "TraceMonitor", "TensorBoardMonitor", "ProgressMonitor", "MonitorList",
           "CallbackMonitor", "as_monitor", "closed_on_error", "notify_checkpoint", "DEFAULT_PROGRESS_KEYS", "PROGRESS_DELAY",
           "progress_bars", "progress_monitor"]
