"""The monitor protocol, its combinators (lists, callbacks, rank gating) and TraceMonitor."""
from __future__ import annotations

import contextlib
import numbers
from typing import Any, Callable, Iterable, Iterator, Mapping, Optional, Sequence

import numpy as np
import torch
from torch import Tensor

__all__ = [
    "Monitor",
    "NullMonitor",
    "TraceMonitor",
    "MonitorList",
    "CallbackMonitor",
    "as_monitor",
    "closed_on_error",
    "notify_checkpoint",
]


class Monitor:
    """Base class (and protocol) of run monitors; every hook is a no-op.

    Any object with callable ``on_start``, ``on_step`` and ``on_end`` is
    accepted by ``as_monitor``; subclassing ``Monitor`` is a convenience.

    Parameters
    ----------
    all_ranks : bool
        Act on every rank of a multi-rank run, not only on rank 0.

    Attributes
    ----------
    all_ranks : bool
    rank : int or None
        Set by ``as_monitor(obj, rank=r)`` for monitors with ``all_ranks``.
    """

    all_ranks: bool = False
    rank: int | None = None
    #: False when ``on_step`` ignores its reports: samplers then skip computing them
    wants_steps: bool = True

    def __init__(self, *, all_ranks: bool = False) -> None:
        self.all_ranks = bool(all_ranks)
        self.rank = None

    def on_start(self, info: Mapping[str, Any]) -> None:
        """Called once before the first step with the run configuration."""

    def on_step(self, step: int, info: Mapping[str, Any]) -> None:
        """Called after step ``step`` with scalars / 0-d / 1-D tensors."""

    def on_end(self, info: Mapping[str, Any]) -> None:
        """Called once after the last step with the run's results."""

    def on_checkpoint(self, step: int) -> None:
        """Called after the checkpoint of step ``step`` is safely on disk (optional hook).

        Raising here stops the run with that checkpoint intact; monitors without this
        method are skipped.
        """

    def close(self) -> None:
        """Release files or bars; safe to call more than once."""


class NullMonitor(Monitor):
    """A monitor that does nothing (what ``as_monitor(None)`` returns).

    Parameters
    ----------
    all_ranks : bool
        As for :class:`Monitor` (no effect: every hook is a no-op).
    """

    def __repr__(self) -> str:
        return "NullMonitor()"


# ----------------------------------------------------------------------------
# value helpers
# ----------------------------------------------------------------------------


def flatten_info(info: Mapping[str, Any], prefix: str = "") -> Iterator[tuple[str, Any]]:
    """(tag, value) pairs, nested mappings joined with ``/``."""
    for key, value in info.items():
        tag = f"{prefix}{key}"
        if isinstance(value, Mapping):
            yield from flatten_info(value, tag + "/")
        else:
            yield tag, value


def is_scalar(value: Any) -> bool:
    """Python / numpy real number, or a 0-d tensor / array (1-D ones are histograms)."""
    if isinstance(value, (numbers.Real, np.bool_)):
        return True
    if isinstance(value, (Tensor, np.ndarray)):
        return value.ndim == 0
    return False


def is_vector(value: Any) -> bool:
    """A tensor or array with at least one dimension (written as a histogram)."""
    return isinstance(value, (Tensor, np.ndarray)) and value.ndim >= 1


def scalar_values(items: Sequence[tuple[str, Any]]) -> dict[str, float]:
    """Float values of scalar entries; tensors are fetched with one sync per device."""
    out: dict[str, float] = {}
    by_device: dict[torch.device, list[tuple[str, Tensor]]] = {}
    for tag, value in items:
        if isinstance(value, Tensor):
            by_device.setdefault(value.device, []).append((tag, value))
        elif isinstance(value, np.ndarray):
            out[tag] = float(value)
        else:
            out[tag] = float(value)
    for group in by_device.values():
        stacked = torch.stack([t.detach().reshape(()).to(torch.float64) for _, t in group])
        for (tag, _), v in zip(group, stacked.tolist()):
            out[tag] = v
    return out


def _copy_value(value: Any) -> Any:
    """A CPU, detached, independent copy of tensors and arrays; other values as given."""
    if isinstance(value, Tensor):
        return value.detach().to("cpu", copy=True)
    if isinstance(value, np.ndarray):
        return value.copy()
    if isinstance(value, Mapping):
        return {k: _copy_value(v) for k, v in value.items()}
    return value


def markdown_table(pairs: Iterable[tuple[str, Any]]) -> str:
    """Two-column markdown table of printable values (TensorBoard renders it)."""
    rows = ["| key | value |", "|---|---|"]
    for key, value in pairs:
        if isinstance(value, (Tensor, np.ndarray)):
            value = value.item() if value.ndim == 0 else f"{type(value).__name__}{tuple(value.shape)}"
        text = str(value).replace("|", "\\|").replace("\n", " ")
        rows.append(f"| {key} | {text} |")
    return "\n".join(rows)


# ----------------------------------------------------------------------------
# TraceMonitor
# ----------------------------------------------------------------------------


class TraceMonitor(Monitor):
    """Keep everything in memory.

    Parameters
    ----------
    all_ranks : bool
        Record on every rank, not only on rank 0.

    Attributes
    ----------
    trace : dict[str, list]
        Tag -> values in step order (tensors detached, copied to CPU).
    trace_steps : dict[str, list[int]]
        Tag -> the steps at which it was recorded (tags may be intermittent).
    steps : list[int]
        Every step passed to ``on_step``.
    start_info, end_info : dict or None
        Copies of what ``on_start`` / ``on_end`` received.
    """

    def __init__(self, *, all_ranks: bool = False) -> None:
        super().__init__(all_ranks=all_ranks)
        self.trace: dict[str, list] = {}
        self.trace_steps: dict[str, list[int]] = {}
        self.steps: list[int] = []
        self.start_info: dict | None = None
        self.end_info: dict | None = None

    def on_start(self, info: Mapping[str, Any]) -> None:
        """Keep a copy of the run configuration as :attr:`start_info`."""
        self.start_info = {k: _copy_value(v) for k, v in info.items()}

    def on_step(self, step: int, info: Mapping[str, Any]) -> None:
        """Append each flattened tag's value (detached, on the CPU) to :attr:`trace`, and ``step`` to :attr:`steps`."""
        step = int(step)
        self.steps.append(step)
        for tag, value in flatten_info(info):
            self.trace.setdefault(tag, []).append(_copy_value(value))
            self.trace_steps.setdefault(tag, []).append(step)

    def on_end(self, info: Mapping[str, Any]) -> None:
        """Keep a copy of the run's results as :attr:`end_info`."""
        self.end_info = {k: _copy_value(v) for k, v in info.items()}

    def as_arrays(self) -> dict[str, np.ndarray]:
        """Scalar series as numpy arrays.

        Returns
        -------
        dict tag -> ndarray [T_tag] (float64, or int64 / bool where every value
        is one), for every tag whose values are all scalars; series of 1-D
        tensors and strings are left out (read them from ``trace``).
        """
        out: dict[str, np.ndarray] = {}
        for tag, values in self.trace.items():
            if not all(is_scalar(v) for v in values):
                continue
            py = [v.item() if isinstance(v, (Tensor, np.ndarray, np.generic)) else v for v in values]
            if all(isinstance(v, bool) for v in py):
                out[tag] = np.asarray(py, dtype=bool)
            elif all(isinstance(v, numbers.Integral) for v in py):
                out[tag] = np.asarray(py, dtype=np.int64)
            else:
                out[tag] = np.asarray(py, dtype=np.float64)
        return out

    def __repr__(self) -> str:
        return f"TraceMonitor(steps={len(self.steps)}, tags={sorted(self.trace)})"


# ----------------------------------------------------------------------------
# TensorBoardMonitor
# ----------------------------------------------------------------------------


class CallbackMonitor(Monitor):
    """A monitor made of plain functions, for scripts and tests.

    Parameters
    ----------
    on_start, on_end : callable(info), optional
    on_step : callable(step, info), optional
    on_checkpoint : callable(step), optional
        Called after each checkpoint is on disk; raising there stops the run with that
        checkpoint intact.
    all_ranks : bool
        Call the functions on every rank of a multi-rank run, not only on rank 0. A function
        that raises to stop a multi-rank run needs it, and must raise on every rank after the
        same step: a raise on some ranks ends their runs only, and the others wait in their
        next exchange until the backend's timeout.
    """

    def __init__(self, *, on_start: Optional[Callable] = None, on_step: Optional[Callable] = None,
                 on_end: Optional[Callable] = None, on_checkpoint: Optional[Callable] = None,
                 all_ranks: bool = False) -> None:
        super().__init__(all_ranks=all_ranks)
        self._fns = {"on_start": on_start, "on_step": on_step, "on_end": on_end, "on_checkpoint": on_checkpoint}
        self.wants_steps = on_step is not None

    def on_start(self, info: Mapping[str, Any]) -> None:
        """Call the ``on_start`` function, if given, with ``info``."""
        if self._fns["on_start"] is not None:
            self._fns["on_start"](info)

    def on_step(self, step: int, info: Mapping[str, Any]) -> None:
        """Call the ``on_step`` function, if given, with ``step`` and ``info``."""
        if self._fns["on_step"] is not None:
            self._fns["on_step"](step, info)

    def on_end(self, info: Mapping[str, Any]) -> None:
        """Call the ``on_end`` function, if given, with ``info``."""
        if self._fns["on_end"] is not None:
            self._fns["on_end"](info)

    def on_checkpoint(self, step: int) -> None:
        """Call the ``on_checkpoint`` function, if given, with ``step``."""
        if self._fns["on_checkpoint"] is not None:
            self._fns["on_checkpoint"](step)

    def __repr__(self) -> str:
        given = [k for k, v in self._fns.items() if v is not None]
        return f"CallbackMonitor({', '.join(given)})"


def notify_checkpoint(monitor: Any, step: int) -> None:
    """Call ``monitor.on_checkpoint(step)`` when the monitor has that (optional) hook."""
    hook = getattr(monitor, "on_checkpoint", None)
    if callable(hook):
        hook(step)


def _is_monitor_like(obj: Any) -> bool:
    return isinstance(obj, Monitor) or all(callable(getattr(obj, h, None)) for h in ("on_start", "on_step", "on_end"))


class MonitorList(Monitor):
    """Several monitors called in order.

    Parameters
    ----------
    monitors : iterable of Monitor
        Monitors (or objects with the three hooks); ``None`` entries are
        dropped, nested lists are flattened.
    """

    def __init__(self, monitors: Iterable[Any] = ()) -> None:
        super().__init__(all_ranks=True)  # gating is decided per member
        self.monitors: list = []
        for m in monitors:
            self.append(m)

    @property
    def wants_steps(self) -> bool:
        """Whether any member reads the per-step reports."""
        return any(getattr(m, "wants_steps", True) for m in self.monitors)

    def append(self, monitor: Any) -> None:
        """Add a monitor (or a list of them) at the end."""
        m = as_monitor(monitor)
        if isinstance(m, MonitorList):
            self.monitors.extend(m.monitors)
        elif not isinstance(m, NullMonitor):
            self.monitors.append(m)

    def on_start(self, info: Mapping[str, Any]) -> None:
        """Call every member's ``on_start``, in order."""
        for m in self.monitors:
            m.on_start(info)

    def on_step(self, step: int, info: Mapping[str, Any]) -> None:
        """Call every member's ``on_step``, in order."""
        for m in self.monitors:
            m.on_step(step, info)

    def on_end(self, info: Mapping[str, Any]) -> None:
        """Call every member's ``on_end``, in order."""
        for m in self.monitors:
            m.on_end(info)

    def on_checkpoint(self, step: int) -> None:
        """Call ``on_checkpoint`` of every member that has that (optional) hook, in order."""
        for m in self.monitors:
            hook = getattr(m, "on_checkpoint", None)
            if callable(hook):
                hook(step)

    def close(self) -> None:
        """Close every member that has a ``close``, in order."""
        for m in self.monitors:
            close = getattr(m, "close", None)
            if callable(close):
                close()

    def __iter__(self) -> Iterator:
        return iter(self.monitors)

    def __len__(self) -> int:
        return len(self.monitors)

    def __getitem__(self, i: int):
        return self.monitors[i]

    def __repr__(self) -> str:
        return f"MonitorList({self.monitors!r})"


@contextlib.contextmanager
def closed_on_error(monitor):
    """Call ``monitor.close()`` (when it has one) if the block raises anything, KeyboardInterrupt included, then
    re-raise: a progress bar left open would stay registered with tqdm and garble every later bar."""
    try:
        yield
    except BaseException:
        close = getattr(monitor, "close", None)
        if callable(close):
            try:
                close()
            except Exception:  # the run's own error is the one to report
                pass
        raise


def as_monitor(obj: Any, rank: int | None = None) -> Monitor:
    """Turn ``monitor=`` into a single monitor, gated by rank.

    Parameters
    ----------
    obj : None, Monitor, or list / tuple of them
        None gives a ``NullMonitor``; a monitor (any object with callable
        ``on_start`` / ``on_step`` / ``on_end``) is returned as is; a list or
        tuple becomes a ``MonitorList``.
    rank : int, optional
        This process's rank. On ``rank != 0`` every monitor not created with
        ``all_ranks=True`` is replaced by a ``NullMonitor``; monitors with
        ``all_ranks=True`` are told their rank (``.rank``).

    Returns
    -------
    Monitor

    Raises
    ------
    TypeError
        For anything else.
    """
    if obj is None:
        return NullMonitor()
    if isinstance(obj, (list, tuple)):
        obj = MonitorList(obj)
    if isinstance(obj, MonitorList):
        if rank is None:
            return obj
        kept = [as_monitor(m, rank) for m in obj.monitors]
        return MonitorList([m for m in kept if not isinstance(m, NullMonitor)])
    if not _is_monitor_like(obj):
        raise TypeError(
            "monitor must be None, a torchtree Monitor (or any object with callable "
            "on_start/on_step/on_end), or a list/tuple of them; got "
            f"{type(obj).__name__}: {obj!r}"
        )
    if rank is None:
        return obj
    rank = int(rank)
    if getattr(obj, "all_ranks", False):
        try:
            obj.rank = rank
        except AttributeError:
            pass
        return obj
    return obj if rank == 0 else NullMonitor()
