"""One run per checkpoint: an advisory lock held for the whole run.

Two runs given the same ``checkpoint`` path (a run started twice by mistake, or the workers of a
``torchrun`` whose launcher was killed with ``SIGKILL`` and who are still sampling) would each read
and replace the other's files: the checkpoint then holds either run's state at any moment, a
multi-rank save finds another run's ``.new`` file gone, or a barrier waits for ranks that are not
there. :func:`run_lock` makes the second run refuse at its start instead.

The lock is ``flock`` on ``<path>.lock`` (POSIX; released by the kernel when its process ends, so a
crashed or killed run never leaves a stale lock). The file holds the holder's host name and process
id, which the refusal names, and is removed when the run ends. A checkpoint in a directory this process
cannot write (a read-only mount, a shared results folder) can still be read: when the caller says the
checkpoint exists, the run goes on without the lock and is told it must not write (a finished run is
then only read back). On a platform without ``fcntl``
(Windows) no lock is taken. File systems that do not support ``flock`` (some network mounts) make
the lock a no-op there as well; the run goes on.
"""
from __future__ import annotations

import contextlib
import errno
import os
import socket
from typing import Callable, Iterator, Optional

from torchtree.io.integrity import CheckpointError

try:
    import fcntl
except ImportError:  # pragma: no cover - Windows
    fcntl = None

__all__ = ["CheckpointInUse", "lock_path", "run_lock"]


class CheckpointInUse(CheckpointError):
    """Another live process holds the checkpoint's lock (see :func:`run_lock`)."""


def lock_path(path: str) -> str:
    """``<path>.lock``: the file :func:`run_lock` locks."""
    return os.fspath(path) + ".lock"


def _holder(fd: int) -> str:
    try:
        text = os.pread(fd, 200, 0).decode("utf-8", "replace").strip()
    except OSError:
        text = ""
    return text or "a process that has not written its id yet"


#: what :func:`_open_locked` returns for a directory the run may only read
_READ_ONLY = -1


def _cannot_write(exc: OSError) -> bool:
    return isinstance(exc, PermissionError) or exc.errno in (errno.EROFS, errno.EACCES, errno.EPERM)


def _open_locked(path: str, readable: Callable[[], bool]) -> Optional[int]:
    """A descriptor of ``<path>.lock`` holding its exclusive lock, None where locks are unsupported, or
    ``_READ_ONLY`` where the directory cannot be written and ``readable()`` says the checkpoint is there."""
    name = lock_path(path)
    directory = os.path.dirname(os.path.abspath(name))
    if not os.path.isdir(directory):
        raise FileNotFoundError(f"checkpoint {path}: directory {directory} does not exist")
    while True:
        try:
            # never through a symbolic link: one planted at the lock's name would have the run truncate its target
            fd = os.open(name, os.O_RDWR | os.O_CREAT | getattr(os, "O_NOFOLLOW", 0), 0o644)
        except OSError as exc:
            if exc.errno == errno.ELOOP or os.path.islink(name):
                raise PermissionError(f"checkpoint {path}: its lock file {name} is a symbolic link, which torchtree "
                                      "does not follow (it would overwrite the link's target); remove it") from None
            if not _cannot_write(exc):
                raise
            if readable():
                return _READ_ONLY
            raise PermissionError(f"checkpoint {path}: cannot write in {directory} ({exc.strerror}); give a "
                                  "checkpoint path in a writable directory") from None
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except OSError as exc:
            if exc.errno in (errno.EWOULDBLOCK, errno.EAGAIN, errno.EACCES):
                who = _holder(fd)
                os.close(fd)
                if who == f"process {os.getpid()} on host {socket.gethostname()}":  # a thread of this very process
                    raise CheckpointInUse(f"checkpoint {path} is in use by another run in this process (another "
                                          "thread's fit); give each concurrent fit its own checkpoint path") from None
                raise CheckpointInUse(
                    f"checkpoint {path} is in use by another run ({who}); wait for it to end or stop it, or give "
                    "this run another checkpoint path. (Workers of a launcher killed with SIGKILL may still be "
                    "running.)") from None
            os.close(fd)
            if exc.errno in (errno.ENOLCK, errno.EOPNOTSUPP, errno.ENOSYS, errno.EINVAL):
                return None  # the file system has no flock: run unlocked
            raise
        # the holder before us may have removed the file between our open and our lock: then the lock we hold
        # is on a file nobody else will open, and a third run could lock a new one; start again
        try:
            here, there = os.fstat(fd), os.stat(name)
            same = (here.st_ino, here.st_dev) == (there.st_ino, there.st_dev)
        except FileNotFoundError:
            same = False
        if same:
            return fd
        os.close(fd)


@contextlib.contextmanager
def run_lock(path: Optional[str], readable: Callable[[], bool] = lambda: False) -> Iterator[bool]:
    """Hold ``<path>.lock`` exclusively while the block runs (``path`` None: no lock).

    Yields whether the run may write its checkpoint: True, except where the directory cannot be
    written and ``readable()`` (asked only then) says the checkpoint exists; then no lock is taken
    and the block gets False (it may read the checkpoint, and must refuse to write it).

    Raises
    ------
    CheckpointInUse
        Another live process holds it: a second run on the same checkpoint path.
    FileNotFoundError, PermissionError
        The checkpoint's directory does not exist, or is not writable and ``readable()`` is False (said
        now, not at the first save).
    """
    if path is None or fcntl is None:
        yield True
        return
    fd = _open_locked(os.fspath(path), readable)
    if fd is None or fd == _READ_ONLY:
        yield fd is None
        return
    try:
        os.ftruncate(fd, 0)
        os.pwrite(fd, f"process {os.getpid()} on host {socket.gethostname()}\n".encode(), 0)
        yield True
    finally:
        try:
            os.unlink(lock_path(path))  # while still locked, so no one holds a lock on the removed file for long
        except OSError:
            pass
        os.close(fd)
