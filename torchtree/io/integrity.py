"""Integrity of the files torchtree writes: a content checksum sealed into every saved
payload and verified on load, errors that name a damaged file (without torch's advice to
load it with ``weights_only=False``), and SIGINT held back while a file is written.

:mod:`torchtree.io.checkpoint` uses these for checkpoints; the posteriors' ``save`` and
``load`` use them too.
"""
from __future__ import annotations

import contextlib
import hashlib
import os
import signal
import threading
from typing import Any, Dict

import numpy as np
import torch

__all__ = ["CheckpointError", "CHECKSUM_KEY", "content_checksum", "seal", "verify_checksum", "read_payload"]

CHECKSUM_KEY = "checksum"


class CheckpointError(ValueError):
    """A checkpoint that cannot be used: unreadable, incomplete, from another world size,
    or from a different run (other data, settings or seed)."""


def feed_hash(h, obj: Any) -> None:
    """Feed a canonical byte form of ``obj`` into the hash ``h``."""
    if isinstance(obj, torch.Tensor):
        t = obj.detach().to("cpu").contiguous()
        h.update(f"T{t.dtype}{tuple(t.shape)}".encode())
        # the array's own buffer (contiguous): the same bytes as tobytes() without a copy of the data
        h.update(t.numpy().reshape(-1).view(np.uint8) if t.dtype != torch.bfloat16 else t.float().numpy().tobytes())
    elif isinstance(obj, dict):
        h.update(b"{")
        for k in sorted(obj, key=repr):
            feed_hash(h, k)
            feed_hash(h, obj[k])
        h.update(b"}")
    elif isinstance(obj, (list, tuple)):
        h.update(b"[" if isinstance(obj, list) else b"(")
        for v in obj:
            feed_hash(h, v)
        h.update(b"]")
    elif hasattr(obj, "__array__") and hasattr(obj, "dtype"):  # numpy arrays
        feed_hash(h, torch.as_tensor(obj))
    else:
        h.update(repr(obj).encode())
    h.update(b";")


def content_checksum(payload: Dict[str, Any]) -> str:
    """sha256 of every field of ``payload`` except its own ``"checksum"`` entry.

    Parameters
    ----------
    payload : dict
        Tensors, numpy arrays, numbers, strings and (nested) lists, tuples, dicts.

    Returns
    -------
    str
        ``"sha256:<64 hex digits>"``.
    """
    h = hashlib.sha256()
    feed_hash(h, {k: v for k, v in payload.items() if k != CHECKSUM_KEY})
    return "sha256:" + h.hexdigest()


def seal(payload: Dict[str, Any]) -> Dict[str, Any]:
    """A copy of ``payload`` with its :func:`content_checksum` under ``"checksum"``.

    Parameters
    ----------
    payload : dict
        What is about to be saved (the exact objects: the checksum covers them
        as :func:`torch.load` gives them back).

    Returns
    -------
    dict
    """
    out = dict(payload)
    out[CHECKSUM_KEY] = content_checksum(out)
    return out


def verify_checksum(payload: Any, path: str, what: str = "checkpoint") -> bool:
    """Check the checksum that :func:`seal` stored in ``payload``.

    Parameters
    ----------
    payload : object
        What :func:`torch.load` read from ``path``.
    path : str
        Named in the error.
    what : str
        What the file is ("checkpoint", "posterior file", ...), for the error.

    Returns
    -------
    bool
        True when the checksum matched; False when ``payload`` has none (a file
        written before torchtree stored checksums, accepted as it was).

    Raises
    ------
    CheckpointError
        The stored checksum differs from the content: the file was damaged or edited.
    """
    if not isinstance(payload, dict) or CHECKSUM_KEY not in payload:
        return False
    stored = payload[CHECKSUM_KEY]
    if not isinstance(stored, str) or content_checksum(payload) != stored:
        raise CheckpointError(
            f"{path}: this {what} is damaged or edited: its content does not match the checksum stored "
            "when it was saved; use an intact copy or produce it again"
        )
    return True


@contextlib.contextmanager
def sigint_deferred():
    """Hold back SIGINT for the duration of the block, then raise it.

    A ``KeyboardInterrupt`` raised inside ``torch.save`` leaves torch's zip writer
    half-written and its ``__exit__`` replaces the interrupt with a ``RuntimeError``
    (the CLI then printed a traceback and exited 1). Deferring the signal lets the
    write and rename finish, so the interrupt arrives with a complete file in place.
    Python only lets the main thread install handlers; elsewhere, and when SIGINT is
    ignored or handled by someone else's handler, nothing changes.
    """
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    try:
        previous = signal.getsignal(signal.SIGINT)
    except (ValueError, OSError):
        previous = None
    if previous is not signal.default_int_handler:
        yield
        return
    caught = []

    def hold(signum, frame):
        caught.append(signum)

    signal.signal(signal.SIGINT, hold)
    try:
        yield
    finally:
        signal.signal(signal.SIGINT, previous)
    if caught:
        raise KeyboardInterrupt


def _reason(exc: BaseException) -> str:
    """A short cause for a failed ``torch.load``, without torch's advice to load with
    ``weights_only=False`` (wrong for a damaged file, unsafe for a foreign one)."""
    first = str(exc).splitlines()[0].strip() if str(exc).strip() else ""
    if "weights" in first.lower() or len(first) > 160:
        first = ""
    return f"{type(exc).__name__}: {first}" if first else type(exc).__name__


def read_payload(path: str | os.PathLike[str], what: str = "checkpoint", map_location: Any = "cpu") -> Any:
    """``torch.load(path, weights_only=True)`` with errors that name the file, and the
    content checksum verified (:func:`verify_checksum`).

    Parameters
    ----------
    path : str or os.PathLike
    what : str
        What the file should be ("checkpoint", "torchtree posterior file", ...), for errors.
    map_location : torch.device or str

    Returns
    -------
    The object that was saved.

    Raises
    ------
    FileNotFoundError
        No file at ``path``.
    CheckpointError
        Empty, truncated or damaged file, a file not written by ``torch.save``, one
        holding objects other than tensors and plain containers, or one whose content
        does not match its checksum.
    ValueError
        ``map_location`` names no device, or a CUDA device on a machine without CUDA (the file is not read).
    """
    path = os.fspath(path)
    if not os.path.exists(path):
        raise FileNotFoundError(f"{path}: no such {what}")
    if os.path.isfile(path) and os.path.getsize(path) == 0:
        raise CheckpointError(f"{path}: not a readable {what}: the file is empty (damaged or truncated)")
    _check_device(map_location)
    try:
        payload = torch.load(path, map_location=map_location, weights_only=True)
    except Exception as exc:  # torch raises RuntimeError, UnpicklingError, EOFError, OSError, ...
        # "from None": the chained torch error would advise weights_only=False.
        raise CheckpointError(
            f"{path}: not a readable {what}: the file is damaged, truncated or not written by torchtree ({_reason(exc)})"
        ) from None
    verify_checksum(payload, path, what)
    return payload


def _check_device(device: Any) -> None:
    """ValueError naming ``device`` where tensors cannot be placed on it here (not a file's fault)."""
    if device is None or callable(device) or isinstance(device, dict):
        return
    try:
        dev = torch.device(device)
    except (RuntimeError, TypeError) as exc:
        raise ValueError(f"device {device!r} is not a device torch knows ({exc}); use 'cpu' or 'cuda'") from None
    if dev.type == "cuda" and not torch.cuda.is_available():
        raise ValueError(f"device {device!r}: CUDA is not available on this machine (torch {torch.__version__}); "
                         "load onto the CPU, the default")

