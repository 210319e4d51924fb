"""Monitors that write: TensorBoard event files and progress bars (see :mod:`torchtree.monitor`)."""
from __future__ import annotations

import math
import os
import sys
import time
from typing import Any, Mapping, Sequence

import numpy as np
import torch
from torch import Tensor


from torchtree.monitor.base import Monitor, flatten_info, is_scalar, is_vector, markdown_table, scalar_values

__all__ = ["TensorBoardMonitor", "ProgressMonitor", "DEFAULT_PROGRESS_KEYS"]

# ----------------------------------------------------------------------------


def _unwritable_dir(path: str) -> str:
    """Why the directory ``path`` cannot be used or created (``""`` when it can): a file in its place or on its
    way, or no write permission where it would be created. Nothing is created."""
    here = os.path.abspath(path)
    while not os.path.exists(here):
        parent = os.path.dirname(here)
        if parent == here:
            break
        here = parent
    if not os.path.isdir(here):
        return f"cannot be created: {here!r} is a file" if here != os.path.abspath(path) else "is a file"
    if here != os.path.abspath(path) and not os.access(here, os.W_OK | os.X_OK):
        return f"cannot be created: no permission to write in {here!r}"
    if here == os.path.abspath(path) and not os.access(here, os.W_OK | os.X_OK):
        return "is not writable"
    return ""


class TensorBoardMonitor(Monitor):
    """Write a run to TensorBoard event files.

    Scalars (python numbers, 0-d / one-element tensors) become scalar
    summaries, 1-D tensors and arrays histograms, strings text. A NaN scalar (a
    quantity undefined at that step: an acceptance rate of a move no step
    proposed, the R-hat of a noise variance the model fixes) is not written, so
    charts have no NaN points. Tags are
    written as the sampler names them, behind ``prefix`` if given. ``on_start``
    writes the configuration as a text table (tag ``start``); ``on_end``
    writes the final scalars at the last step and a text table (tag ``summary``),
    and flushes. One event file per monitor: the writer stays open for what
    follows the run (the evidence curves of ``hyper="evidence"``, a next run
    given the same monitor) until :meth:`close` or the monitor's deletion.

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

    Raises
    ------
    ValueError
        ``logdir`` is a file, or a file stands on its path, or it cannot be created or written there.
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
        problem = _unwritable_dir(self.logdir)
        if problem:  # said now, not when the first event is written (after an estimator's evidence pilots)
            raise ValueError(f"TensorBoardMonitor: log directory {self.logdir!r} {problem}; give a directory path "
                             "in a writable place")
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
        scalars = [(t, v) for t, v in items if is_scalar(v)]
        for tag, value in scalar_values(scalars).items():
            if value == value:  # NaN: undefined at this step, left out
                w.add_scalar(self._tag(tag), value, global_step=step)
        for tag, value in items:
            if isinstance(value, str):
                w.add_text(self._tag(tag), value, global_step=step)
            elif self.histograms and is_vector(value):
                if isinstance(value, Tensor):
                    arr = value.detach().to("cpu", torch.float64).reshape(-1).numpy()
                else:
                    arr = np.asarray(value, dtype=np.float64).reshape(-1)
                # numpy's histogram rejects non-finite ranges and empty input.
                arr = arr[np.isfinite(arr)]
                if arr.size:
                    w.add_histogram(self._tag(tag), arr, global_step=step)

    def on_start(self, info: Mapping[str, Any]) -> None:
        """Write the run configuration as a text table under ``start`` (its 1-D values as histograms, step 0)."""
        items = list(flatten_info(info))
        self.writer.add_text(self._tag("start"), markdown_table(items), global_step=0)
        vectors = [(t, v) for t, v in items if is_vector(v)]
        if vectors:
            self._write(vectors, 0)

    def on_step(self, step: int, info: Mapping[str, Any]) -> None:
        """Write the report at ``step``: scalars (NaN left out), strings as text, 1-D values as histograms."""
        self._last_step = int(step)
        self._write(list(flatten_info(info)), self._last_step)

    def on_end(self, info: Mapping[str, Any]) -> None:
        """Write the results at the last step, as values and as a text table under ``summary``; flush."""
        items = list(flatten_info(info))
        self._write(items, self._last_step)
        self.writer.add_text(self._tag("summary"), markdown_table(items), global_step=self._last_step)
        self.flush()

    def add_curve(self, tag: str, xs: Sequence[float], ys: Sequence[float]) -> None:
        """Write a curve ``ys`` over a grid ``xs`` (e.g. log evidence over a hyperparameter grid).

        TensorBoard's scalars have integer steps, so point ``i`` is written at step ``i``
        under ``tag`` (NaN points left out), and the grid as text under ``tag/grid`` (``step i: x``). Usable
        after ``on_end``: the events go to the same file, and are flushed.

        Parameters
        ----------
        tag : str
        xs, ys : sequences of float [n]
        """
        w = self.writer
        for i, y in enumerate(ys):
            if float(y) == float(y):  # a NaN point (undefined there) is left out, as in on_step
                w.add_scalar(self._tag(tag), float(y), global_step=i)
        w.add_text(self._tag(f"{tag}/grid"), "  \n".join(f"step {i}: {float(x):.6g}" for i, x in enumerate(xs)))
        self.flush()

    def flush(self) -> None:
        """Push pending events to disk."""
        if self._writer is not None:
            self._writer.flush()

    def close(self) -> None:
        """Flush and close the event file; a later write opens a new one."""
        if self._writer is not None:
            self._writer.close()
            self._writer = None

    def __getstate__(self) -> dict:
        """Copies and pickles leave the open writer (a thread and a file) behind; they open their own."""
        return {**self.__dict__, "_writer": None}

    def __del__(self) -> None:
        try:
            self.close()
        except Exception:  # interpreter shutdown: the writer's modules may be gone
            pass

    def __repr__(self) -> str:
        return f"TensorBoardMonitor(logdir={self.logdir!r}, prefix={self.prefix!r})"


# ----------------------------------------------------------------------------
# ProgressMonitor
# ----------------------------------------------------------------------------

def in_notebook() -> bool:
    """Whether this process is a Jupyter kernel (IPython's ZMQ shell), where progress goes to a widget."""
    ipython = sys.modules.get("IPython")
    try:
        shell = ipython.get_ipython() if ipython is not None else None
    except Exception:  # an IPython too old or half imported
        return False
    return shell is not None and type(shell).__name__ == "ZMQInteractiveShell"


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
        None: shown when the output stream is a terminal or the process is a Jupyter
        kernel (where ``tqdm.auto`` draws the notebook widget), else disabled; True /
        False force it off / on.
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
    delay : float
        Seconds before the bar appears (tqdm's ``delay``): a run that ends sooner shows nothing.
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
        delay: float = 0.0,
    ) -> None:
        super().__init__(all_ranks=all_ranks)
        self.total = total
        self.desc = desc
        self.keys = list(keys) if keys is not None else None
        self.max_keys = max_keys
        self.file = file
        self.leave = leave
        self.mininterval = mininterval
        self.delay = float(delay)
        self.disable = self._resolve_disable(disable)
        self.bar = None
        self._total = None
        self._last_postfix = -math.inf

    @property
    def wants_steps(self) -> bool:
        """A disabled bar shows nothing: the samplers then skip their per-step reports (which cost
        as much as the run itself on large tables)."""
        return not self.disable

    def _resolve_disable(self, disable: bool | None) -> bool:
        if disable is not None:
            return bool(disable)
        stream = self.file if self.file is not None else sys.stderr
        if self.file is None and in_notebook():
            return False
        try:
            return not stream.isatty()
        except (AttributeError, ValueError):
            return True

    def _choose_keys(self, items: Sequence[tuple[str, Any]]) -> list[str]:
        if self.keys is not None:
            return self.keys
        scalar_tags = [t for t, v in items if is_scalar(v)]
        chosen = [t for t in scalar_tags if t.rsplit("/", 1)[-1] in DEFAULT_PROGRESS_KEYS]
        return (chosen or scalar_tags)[: self.max_keys]

    def _postfix(self, items: Sequence[tuple[str, Any]]) -> dict[str, str]:
        wanted = set(self._choose_keys(items))
        picked = [(t, v) for t, v in items if t in wanted and is_scalar(v)]
        return {t.rsplit("/", 1)[-1]: f"{v:.4g}" for t, v in scalar_values(picked).items()}

    def on_start(self, info: Mapping[str, Any]) -> None:
        """Open the tqdm bar (total: ``total``, else ``info["total"]`` or ``info["n_steps"]``); a disabled bar
        opens nothing (and needs no tqdm)."""
        if self.disable:
            return
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
            delay=self.delay,
        )
        self._last_postfix = -math.inf

    def on_step(self, step: int, info: Mapping[str, Any]) -> None:
        """Advance the bar to ``step + 1`` (by one without a total) and show the chosen scalars as its postfix."""
        if self.disable:
            return
        if self.bar is None:
            self.on_start({})
        now = time.monotonic()
        if now - self._last_postfix >= self.mininterval:
            self._last_postfix = now
            self.bar.set_postfix(self._postfix(list(flatten_info(info))), refresh=False)
        if self._total is None:
            self.bar.update(1)
        else:
            # never backwards, never past the total (nested samplers report their own steps)
            self.bar.update(max(0, min(int(step) + 1, self._total) - self.bar.n))

    def on_end(self, info: Mapping[str, Any]) -> None:
        """Show the results' chosen scalars as the postfix, then close the bar."""
        if self.bar is not None and not self.disable:
            post = self._postfix(list(flatten_info(info)))
            if post:
                self.bar.set_postfix(post, refresh=False)
        self.close()

    def close(self) -> None:
        """Close the bar (a later ``on_step`` opens a new one); safe to call more than once."""
        if self.bar is not None:
            self.bar.close()
            self.bar = None

    def __repr__(self) -> str:
        return f"ProgressMonitor(total={self.total!r}, desc={self.desc!r}, disable={self.disable})"


# ----------------------------------------------------------------------------
# composition and coercion
