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
so a gated monitor never creates an event file or a progress bar.
"""
from __future__ import annotations

import math
import numbers
import os
import sys
import time
from typing import Any, Callable, Iterable, Iterator, Mapping, Optional, Sequence

import numpy as np
import torch
from torch import Tensor

__all__ = [
    "Monitor",
    "NullMonitor",
    "TraceMonitor",
    "TensorBoardMonitor",
    "ProgressMonitor",
    "MonitorList",
    "CallbackMonitor",
    "as_monitor",
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

        Raising here stops the run with that checkpoint intact, which is how the tests
        simulate a crash; monitors without this method are skipped.
        """

    def close(self) -> None:
        """Release files or bars; safe to call more than once."""


class NullMonitor(Monitor):
    """A monitor that does nothing (what ``as_monitor(None)`` returns)."""

    def __repr__(self) -> str:
        return "NullMonitor()"


# ----------------------------------------------------------------------------
# value helpers
# ----------------------------------------------------------------------------


def _flatten(info: Mapping[str, Any], prefix: str = "") -> Iterator[tuple[str, Any]]:
    """(tag, value) pairs, nested mappings joined with ``/``."""
    for key, value in info.items():
        tag = f"{prefix}{key}"
        if isinstance(value, Mapping):
            yield from _flatten(value, tag + "/")
        else:
            yield tag, value


def _is_scalar(value: Any) -> bool:
    """Python / numpy real number, or a 0-d tensor / array (1-D ones are histograms)."""
    if isinstance(value, (numbers.Real, np.bool_)):
        return True
    if isinstance(value, (Tensor, np.ndarray)):
        return value.ndim == 0
    return False


def _is_vector(value: Any) -> bool:
    """A tensor or array with at least one dimension (written as a histogram)."""
    return isinstance(value, (Tensor, np.ndarray)) and value.ndim >= 1


def _scalar_values(items: Sequence[tuple[str, Any]]) -> dict[str, float]:
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


def _markdown_table(pairs: Iterable[tuple[str, Any]]) -> str:
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
        self.start_info = {k: _copy_value(v) for k, v in info.items()}

    def on_step(self, step: int, info: Mapping[str, Any]) -> None:
        step = int(step)
        self.steps.append(step)
        for tag, value in _flatten(info):
            self.trace.setdefault(tag, []).append(_copy_value(value))
            self.trace_steps.setdefault(tag, []).append(step)

    def on_end(self, info: Mapping[str, Any]) -> None:
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
            if not all(_is_scalar(v) for v in values):
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


class TensorBoardMonitor(Monitor):
    """Write a run to TensorBoard event files.

    Scalars (python numbers, 0-d / one-element tensors) become scalar
    summaries, 1-D tensors and arrays histograms, strings text. Tags are
    written as the sampler names them, behind ``prefix`` if given. ``on_start``
    writes the configuration as a text table (tag ``start``); ``on_end``
    writes the final scalars at the last step, a text table (tag ``summary``)
    and closes the file.

    Parameters
    ----------
    logdir : str or os.PathLike
        Directory of the event files; with ``all_ranks=True`` each rank writes
        to ``logdir/rank{r}`` (TensorBoard shows them as separate runs).
    prefix : str, optional
        Prepended to every tag as ``prefix/tag``.
    histograms : bool
        Write 1-D tensors as histograms (they can be large); otherwise skip them.
    flush_secs : float
        How often the writer flushes to disk.
    all_ranks : bool
        Write on every rank, not only on rank 0.
    """

    def __init__(
        self,
        logdir: str | os.PathLike,
        prefix: str | None = None,
        histograms: bool = True,
        flush_secs: float = 30,
        *,
        all_ranks: bool = False,
    ) -> None:
        super().__init__(all_ranks=all_ranks)
        self.logdir = os.fspath(logdir)
        self.prefix = prefix.strip("/") if prefix else None
        self.histograms = bool(histograms)
        self.flush_secs = flush_secs
        self._writer = None
        self._last_step = 0

    @property
    def run_dir(self) -> str:
        """The directory this monitor writes to (depends on the bound rank)."""
        if self.all_ranks and self.rank is not None:
            return os.path.join(self.logdir, f"rank{self.rank}")
        return self.logdir

    @property
    def writer(self):
        """The ``SummaryWriter``, created on first use (lazily: gated ranks never create files)."""
        if self._writer is None:
            # Imported here: tensorboard takes seconds to import and most runs do not need it.
            from torch.utils.tensorboard import SummaryWriter

            self._writer = SummaryWriter(log_dir=self.run_dir, flush_secs=self.flush_secs)
        return self._writer

    def _tag(self, name: str) -> str:
        return f"{self.prefix}/{name}" if self.prefix else name

    def _write(self, items: Sequence[tuple[str, Any]], step: int) -> None:
        w = self.writer
        scalars = [(t, v) for t, v in items if _is_scalar(v)]
        for tag, value in _scalar_values(scalars).items():
            w.add_scalar(self._tag(tag), value, global_step=step)
        for tag, value in items:
            if isinstance(value, str):
                w.add_text(self._tag(tag), value, global_step=step)
            elif self.histograms and _is_vector(value):
                if isinstance(value, Tensor):
                    arr = value.detach().to("cpu", torch.float64).reshape(-1).numpy()
                else:
                    arr = np.asarray(value, dtype=np.float64).reshape(-1)
                # numpy's histogram rejects non-finite ranges and empty input.
                arr = arr[np.isfinite(arr)]
                if arr.size:
                    w.add_histogram(self._tag(tag), arr, global_step=step)

    def on_start(self, info: Mapping[str, Any]) -> None:
        items = list(_flatten(info))
        self.writer.add_text(self._tag("start"), _markdown_table(items), global_step=0)
        vectors = [(t, v) for t, v in items if _is_vector(v)]
        if vectors:
            self._write(vectors, 0)

    def on_step(self, step: int, info: Mapping[str, Any]) -> None:
        self._last_step = int(step)
        self._write(list(_flatten(info)), self._last_step)

    def on_end(self, info: Mapping[str, Any]) -> None:
        items = list(_flatten(info))
        self._write(items, self._last_step)
        self.writer.add_text(self._tag("summary"), _markdown_table(items), global_step=self._last_step)
        self.close()

    def flush(self) -> None:
        """Push pending events to disk."""
        if self._writer is not None:
            self._writer.flush()

    def close(self) -> None:
        if self._writer is not None:
            self._writer.close()
            self._writer = None

    def __repr__(self) -> str:
        return f"TensorBoardMonitor(logdir={self.logdir!r}, prefix={self.prefix!r})"


# ----------------------------------------------------------------------------
# ProgressMonitor
# ----------------------------------------------------------------------------

#: Tags whose last path component is one of these are shown by default.
DEFAULT_PROGRESS_KEYS = ("ess", "log_evidence", "accept_rate", "acceptance_rate", "step_size", "log_likelihood", "leaves_mean")


class ProgressMonitor(Monitor):
    """A tqdm progress bar with a few scalars in its postfix.

    Parameters
    ----------
    total : int, optional
        Number of steps; if None, ``on_start``'s ``info["total"]`` is used (the
        samplers that know their number of steps in advance send it). With a total,
        the bar follows the ``step`` argument of ``on_step`` (position ``step + 1``),
        so a sampler that reports every ``monitor_every`` steps still shows
        "6000/6000" and an ETA; without one it counts ``on_step`` calls.
    desc : str
        Bar label.
    disable : bool, optional
        None: disabled when the output stream is not a terminal; True / False
        force it off / on.
    keys : sequence of str, optional
        Tags to show in the postfix (displayed by their last ``/`` component).
        None shows up to ``max_keys`` tags whose last component is in
        ``DEFAULT_PROGRESS_KEYS``, or else the first scalar tags of the step.
    max_keys : int
        At most this many postfix entries when ``keys`` is None.
    file : file-like, optional
        Output stream (default ``sys.stderr``).
    leave : bool
        Keep the bar on screen after the run.
    mininterval : float
        Seconds between postfix refreshes (fetching tensor values syncs CUDA).
    all_ranks : bool
        Show a bar on every rank (labelled with the rank).
    """

    def __init__(
        self,
        total: int | None = None,
        desc: str = "torchtree",
        disable: bool | None = None,
        keys: Sequence[str] | None = None,
        *,
        max_keys: int = 4,
        file=None,
        leave: bool = True,
        mininterval: float = 0.5,
        all_ranks: bool = False,
    ) -> None:
        super().__init__(all_ranks=all_ranks)
        self.total = total
        self.desc = desc
        self.keys = list(keys) if keys is not None else None
        self.max_keys = max_keys
        self.file = file
        self.leave = leave
        self.mininterval = mininterval
        self.disable = self._resolve_disable(disable)
        self.bar = None
        self._total = None
        self._last_postfix = -math.inf

    def _resolve_disable(self, disable: bool | None) -> bool:
        if disable is not None:
            return bool(disable)
        stream = self.file if self.file is not None else sys.stderr
        try:
            return not stream.isatty()
        except (AttributeError, ValueError):
            return True

    def _choose_keys(self, items: Sequence[tuple[str, Any]]) -> list[str]:
        if self.keys is not None:
            return self.keys
        scalar_tags = [t for t, v in items if _is_scalar(v)]
        chosen = [t for t in scalar_tags if t.rsplit("/", 1)[-1] in DEFAULT_PROGRESS_KEYS]
        return (chosen or scalar_tags)[: self.max_keys]

    def _postfix(self, items: Sequence[tuple[str, Any]]) -> dict[str, str]:
        wanted = set(self._choose_keys(items))
        picked = [(t, v) for t, v in items if t in wanted and _is_scalar(v)]
        return {t.rsplit("/", 1)[-1]: f"{v:.4g}" for t, v in _scalar_values(picked).items()}

    def on_start(self, info: Mapping[str, Any]) -> None:
        from tqdm.auto import tqdm

        total = self.total if self.total is not None else info.get("total", info.get("n_steps"))
        self._total = int(total) if isinstance(total, (int, float)) and total > 0 else None
        desc = self.desc if not (self.all_ranks and self.rank is not None) else f"{self.desc} [rank {self.rank}]"
        self.bar = tqdm(
            total=total,
            desc=desc,
            disable=self.disable,
            file=self.file if self.file is not None else sys.stderr,
            leave=self.leave,
            dynamic_ncols=True,
            position=self.rank if (self.all_ranks and self.rank) else None,
        )
        self._last_postfix = -math.inf

    def on_step(self, step: int, info: Mapping[str, Any]) -> None:
        if self.bar is None:
            self.on_start({})
        if self.disable:
            return
        now = time.monotonic()
        if now - self._last_postfix >= self.mininterval:
            self._last_postfix = now
            self.bar.set_postfix(self._postfix(list(_flatten(info))), refresh=False)
        if self._total is None:
            self.bar.update(1)
        else:
            # never backwards, never past the total (nested samplers report their own steps)
            self.bar.update(max(0, min(int(step) + 1, self._total) - self.bar.n))

    def on_end(self, info: Mapping[str, Any]) -> None:
        if self.bar is not None and not self.disable:
            post = self._postfix(list(_flatten(info)))
            if post:
                self.bar.set_postfix(post, refresh=False)
        self.close()

    def close(self) -> None:
        if self.bar is not None:
            self.bar.close()
            self.bar = None

    def __repr__(self) -> str:
        return f"ProgressMonitor(total={self.total!r}, desc={self.desc!r}, disable={self.disable})"


# ----------------------------------------------------------------------------
# composition and coercion
# ----------------------------------------------------------------------------


class CallbackMonitor(Monitor):
    """A monitor made of plain functions, for scripts and tests.

    Parameters
    ----------
    on_start, on_end : callable(info), optional
    on_step : callable(step, info), optional
    on_checkpoint : callable(step), optional
        Called after each checkpoint is on disk; raising there stops the run with that
        checkpoint intact (how the tests simulate a crash).
    all_ranks : bool
        Call the functions on every rank of a multi-rank run, not only on rank 0.
    """

    def __init__(self, *, on_start: Optional[Callable] = None, on_step: Optional[Callable] = None,
                 on_end: Optional[Callable] = None, on_checkpoint: Optional[Callable] = None,
                 all_ranks: bool = False) -> None:
        super().__init__(all_ranks=all_ranks)
        self._fns = {"on_start": on_start, "on_step": on_step, "on_end": on_end, "on_checkpoint": on_checkpoint}

    def on_start(self, info: Mapping[str, Any]) -> None:
        if self._fns["on_start"] is not None:
            self._fns["on_start"](info)

    def on_step(self, step: int, info: Mapping[str, Any]) -> None:
        if self._fns["on_step"] is not None:
            self._fns["on_step"](step, info)

    def on_end(self, info: Mapping[str, Any]) -> None:
        if self._fns["on_end"] is not None:
            self._fns["on_end"](info)

    def on_checkpoint(self, step: int) -> None:
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

    def append(self, monitor: Any) -> None:
        """Add a monitor (or a list of them) at the end."""
        m = as_monitor(monitor)
        if isinstance(m, MonitorList):
            self.monitors.extend(m.monitors)
        elif not isinstance(m, NullMonitor):
            self.monitors.append(m)

    def on_start(self, info: Mapping[str, Any]) -> None:
        for m in self.monitors:
            m.on_start(info)

    def on_step(self, step: int, info: Mapping[str, Any]) -> None:
        for m in self.monitors:
            m.on_step(step, info)

    def on_end(self, info: Mapping[str, Any]) -> None:
        for m in self.monitors:
            m.on_end(info)

    def on_checkpoint(self, step: int) -> None:
        for m in self.monitors:
            hook = getattr(m, "on_checkpoint", None)
            if callable(hook):
                hook(step)

    def close(self) -> None:
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
