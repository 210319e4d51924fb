"""How many intra-op threads a run uses: the ``n_threads`` policy and a scope that applies it.

torch's default (one thread per core) hurts the samplers: they run many small tensor ops, and
an OpenMP team's threads spin while they wait for each other, so on a machine whose cores are
shared every op waits for a descheduled sibling (the documentation's threads benchmark has the
measurements). ``"auto"`` therefore gives one thread unless the work is large.

The rule of ``"auto"`` (:func:`choose_threads`):

* the cores this process may run on (``os.sched_getaffinity``, else ``os.cpu_count()``) less
  those the one-minute load average (``os.getloadavg``) says are busy, so that a busy machine
  gets one thread, divided by the ranks on this node (``LOCAL_WORLD_SIZE`` from ``torchrun``,
  ``OMPI_COMM_WORLD_LOCAL_SIZE`` from Open MPI, ``MPI_LOCALNRANKS`` from MPICH's hydra and
  Intel MPI, ``PMIX_LOCAL_SIZE`` / ``PMI_LOCAL_SIZE``, ``SLURM_NTASKS_PER_NODE``);
* at most one thread per :data:`WORK_PER_THREAD` units of work (data rows x particles or
  chains on this rank), so that small runs use one thread;
* never more than torch is set to when the run starts (``torch.get_num_threads()``, which
  follows ``OMP_NUM_THREADS``) nor more than ``OMP_NUM_THREADS``: the environment is a cap.

An explicit ``n_threads=k`` is used as given (it wins over ``OMP_NUM_THREADS``).
"""
from __future__ import annotations

import contextlib
import os
from typing import Iterator, Mapping, Optional, Union

import torch

from torchtree.core.warn import warn

__all__ = ["AUTO", "WORK_PER_THREAD", "LOCAL_SIZE_VARS", "check_threads", "available_cpus", "local_world_size",
           "env_thread_cap", "choose_threads", "resolve_threads", "using_threads", "forked_after_threads"]

AUTO = "auto"

#: Units of work (data rows x particles or chains on one rank) per intra-op thread under
#: ``"auto"``: a second thread is used from twice this. Chosen above the sizes where two
#: threads did not pay on a busy machine (the documentation's threads benchmark).
WORK_PER_THREAD = 100_000_000

#: Environment variables that launchers set to the number of ranks on this node, in the
#: order they are read.
LOCAL_SIZE_VARS = ("LOCAL_WORLD_SIZE", "OMPI_COMM_WORLD_LOCAL_SIZE", "MPI_LOCALNRANKS", "PMIX_LOCAL_SIZE",
                   "PMI_LOCAL_SIZE", "SLURM_NTASKS_PER_NODE")

ThreadSetting = Union[str, int]


def check_threads(value, name: str = "n_threads") -> ThreadSetting:
    """``value`` as a thread setting: ``"auto"`` or an int >= 1.

    Raises
    ------
    ValueError
        Anything else (0, -1, 1.5, True, "many"), naming ``name``.
    """
    if isinstance(value, str) and value.strip().lower() == AUTO:
        return AUTO
    ok = isinstance(value, int) and not isinstance(value, bool)
    if not ok and hasattr(value, "__index__") and not isinstance(value, (bool, float)):
        try:  # numpy / torch integers
            value, ok = int(value.__index__()), True
        except TypeError:
            ok = False
    if not ok or value < 1:
        raise ValueError(f"{name} must be 'auto' or an integer >= 1, got {value!r}")
    return int(value)


def available_cpus() -> int:
    """Cores this process may run on: its CPU affinity where the OS reports one, else ``os.cpu_count()``."""
    try:
        return max(1, len(os.sched_getaffinity(0)))
    except (AttributeError, OSError):  # pragma: no cover - macOS, Windows
        return max(1, os.cpu_count() or 1)


def _positive_int(text: Optional[str]) -> Optional[int]:
    if text is None:
        return None
    # OMP_NUM_THREADS may list nested levels ("4,2"); SLURM_NTASKS_PER_NODE may read "2(x3)"
    head = text.strip().split(",")[0].split("(")[0].strip()
    try:
        n = int(head)
    except ValueError:
        return None
    return n if n >= 1 else None


def local_world_size(environ: Optional[Mapping[str, str]] = None) -> Optional[int]:
    """Ranks on this node as a launcher reports them (:data:`LOCAL_SIZE_VARS`), or None."""
    env = os.environ if environ is None else environ
    for var in LOCAL_SIZE_VARS:
        n = _positive_int(env.get(var))
        if n is not None:
            return n
    return None


def env_thread_cap(environ: Optional[Mapping[str, str]] = None) -> Optional[int]:
    """``OMP_NUM_THREADS`` as an int (its first level), or None when unset or unreadable."""
    env = os.environ if environ is None else environ
    return _positive_int(env.get("OMP_NUM_THREADS"))


def choose_threads(setting: ThreadSetting, work_size: int, local_world_size: int = 1, cpu_count: int = 1,
                   cap: Optional[int] = None, load: Optional[float] = None) -> int:
    """The intra-op thread count for a run (pure: reads nothing of the machine).

    Parameters
    ----------
    setting : "auto" or int >= 1
        An int is returned as it is.
    work_size : int
        Units of work on this rank (data rows x particles or chains).
    local_world_size : int
        Ranks sharing this node's cores.
    cpu_count : int
        Cores available to the process.
    cap : int, optional
        Upper bound for ``"auto"`` (``OMP_NUM_THREADS``, torch's current setting).
    load : float, optional
        The machine's load average: ``"auto"`` shares the ``cpu_count - load`` idle cores
        among the local ranks.

    Returns
    -------
    int >= 1
    """
    setting = check_threads(setting)
    if isinstance(setting, int):  # check_threads gives "auto" or an int >= 1
        return setting
    cores = int(cpu_count)
    if load is not None:
        cores = min(cores, cores - int(load))
    cores = max(1, cores // max(1, int(local_world_size)))
    by_work = max(1, int(work_size) // WORK_PER_THREAD)
    n = min(cores, by_work)
    if cap is not None:
        n = min(n, max(1, int(cap)))
    return n


def resolve_threads(setting: ThreadSetting, work_size: int, world_size: int = 1) -> int:
    """:func:`choose_threads` with this machine's cores, the launcher's local ranks and the caps.

    Parameters
    ----------
    setting : "auto" or int >= 1
    work_size : int, units of work on this rank
    world_size : int
        Ranks of the run's backend; used as the local ranks when no launcher variable says
        (all ranks assumed on this node: fewer threads, never too many).
    """
    local = local_world_size()
    if local is None:
        local = max(1, int(world_size))
    caps = [c for c in (env_thread_cap(), torch.get_num_threads()) if c is not None]
    try:
        load = os.getloadavg()[0]
    except (AttributeError, OSError):  # pragma: no cover - Windows
        load = None
    return choose_threads(setting, work_size, local, available_cpus(), min(caps) if caps else None, load)


#: set when this process has run torch on more than one thread (an OpenMP team may exist), and in a child
#: forked from such a process: :func:`forked_after_threads`
_THREADED = {"here": torch.get_num_threads() > 1, "forked_after": False}


def forked_after_threads() -> bool:
    """Whether this process was forked (``os.fork``, ``multiprocessing``'s default start method on Linux) from
    one that ran torch on several threads. GNU OpenMP, torch's thread pool on Linux, deadlocks in such a child
    at its first parallel region of more than one thread, so there torch is set to one thread at the fork and
    :func:`using_threads` runs every block on one thread (with a warning where more were asked for)."""
    return _THREADED["forked_after"]


def _after_fork_in_child() -> None:
    if _THREADED["here"] or torch.get_num_threads() > 1:
        _THREADED["forked_after"] = True
        torch.set_num_threads(1)


if hasattr(os, "register_at_fork"):
    os.register_at_fork(after_in_child=_after_fork_in_child)


@contextlib.contextmanager
def using_threads(n: int) -> Iterator[int]:
    """Run the block with ``torch.set_num_threads(n)``; the previous count is restored on exit,
    on an exception too. In a child forked after threads (:func:`forked_after_threads`) the block runs on
    one thread."""
    checked = check_threads(n)
    if not isinstance(checked, int):  # "auto"
        raise ValueError("using_threads takes a thread count; resolve 'auto' with resolve_threads first")
    n = checked
    if n > 1 and _THREADED["forked_after"]:
        warn(f"this process was forked from one that ran torch on several threads, and GNU OpenMP deadlocks in "
             f"such a child at its first parallel region: this run uses 1 thread, not {n}; start worker processes "
             "with the 'spawn' or 'forkserver' method (multiprocessing.get_context) to use more", RuntimeWarning)
        n = 1
    _THREADED["here"] = _THREADED["here"] or n > 1
    before = torch.get_num_threads()
    if n != before:
        torch.set_num_threads(n)
    try:
        yield n
    finally:
        if torch.get_num_threads() != before:
            torch.set_num_threads(before)
