"""Collective-communication backends: the only door from torchtree to other ranks.

Samplers and the redistribution code never call ``torch.distributed`` or ``mpi4py``
directly; they call a :class:`Backend`. Three implementations exist:

* :class:`LocalBackend` -- one rank, every collective is the identity (or a copy);
* :class:`~torchtree.distributed.torch_backend.TorchDistBackend` -- an initialised
  ``torch.distributed`` process group (gloo on CPU, nccl on CUDA; works under ``torchrun``);
* :class:`~torchtree.distributed.mpi_backend.MPIBackend` -- an mpi4py communicator
  (works under ``mpiexec``).

Conventions shared by every backend
-----------------------------------
* Collectives are *functional*: they return new tensors and leave their inputs untouched.
* Results come back on the device and with the dtype of the input tensor.
* Every call that waits on another rank honours the backend's ``timeout`` (seconds). A rank
  that died, raised before reaching the collective, or hangs makes the others fail with
  :class:`CollectiveTimeout` (a :class:`TimeoutError`) or :class:`CollectiveError`
  (a :class:`RuntimeError`) instead of blocking forever. After such an error the
  communicator is in an undefined state: abort the job, do not retry on it.
* Point-to-point and all-to-all messages are matched by call order, so every rank must issue
  the same sequence of collectives (the usual SPMD rule).
"""

from __future__ import annotations

from datetime import timedelta
from typing import Protocol, Sequence, runtime_checkable

import torch

__all__ = [
    "Backend",
    "LocalBackend",
    "CollectiveError",
    "CollectiveTimeout",
    "DEFAULT_TIMEOUT",
]

DEFAULT_TIMEOUT = 300.0
"""Default seconds a collective may wait for the other ranks before it raises
:class:`CollectiveTimeout` (the ``timeout`` of every backend, and of :func:`get_backend`)."""

_REDUCE_OPS = ("sum", "max", "min")


class CollectiveError(RuntimeError):
    """A collective failed on this rank: a peer died or raised, or the transport broke."""


class CollectiveTimeout(CollectiveError, TimeoutError):
    """A collective did not complete within the backend's ``timeout``.

    Subclasses both :class:`RuntimeError` (via :class:`CollectiveError`) and
    :class:`TimeoutError`, so either ``except`` clause catches it.
    """


def timeout_seconds(timeout: float | timedelta) -> float:
    """Normalise a timeout given as seconds or :class:`datetime.timedelta` to seconds."""
    if isinstance(timeout, timedelta):
        timeout = timeout.total_seconds()
    timeout = float(timeout)
    if not timeout > 0:
        raise ValueError(f"timeout must be positive seconds, got {timeout!r}")
    return timeout


def check_op(op: str) -> str:
    if op not in _REDUCE_OPS:
        raise ValueError(f"reduce op must be one of {_REDUCE_OPS}, got {op!r}")
    return op


@runtime_checkable
class Backend(Protocol):
    """Collectives over ``world_size`` ranks (structural protocol; subclassing is optional).

    Attributes
    ----------
    rank : int
        This process's rank, ``0 <= rank < world_size``.
    world_size : int
        Number of ranks taking part.
    timeout : float
        Seconds any single call may wait on other ranks.
    """

    rank: int
    world_size: int
    timeout: float

    def all_reduce(self, t: torch.Tensor, op: str = "sum") -> torch.Tensor:
        """Elementwise reduction over ranks.

        Parameters
        ----------
        t : Tensor, any shape ``S`` (same shape and dtype on every rank)
        op : {"sum", "max", "min"}

        Returns
        -------
        Tensor, shape ``S``: the reduction, identical on every rank.
        """
        ...

    def exclusive_scan(self, t: torch.Tensor) -> torch.Tensor:
        """Elementwise exclusive prefix sum over ranks.

        Parameters
        ----------
        t : Tensor, shape ``S`` (same on every rank)

        Returns
        -------
        Tensor, shape ``S``: ``sum(t on ranks 0..rank-1)``; zeros on rank 0.
        """
        ...

    def all_gather(self, t: torch.Tensor) -> torch.Tensor:
        """Concatenate every rank's tensor along dim 0, in rank order.

        Parameters
        ----------
        t : Tensor, shape ``[m, *S]``; ``m`` and ``S`` must be equal on every rank
            (unequal sizes are not detected by every backend: exchange sizes first with
            :meth:`all_gather` of a length-1 tensor, or use :meth:`all_to_all`).

        Returns
        -------
        Tensor, shape ``[world_size * m, *S]``.
        """
        ...

    def sendrecv(
        self,
        send_tensor: torch.Tensor,
        dest: int | None,
        source: int | None,
        out: torch.Tensor | None = None,
    ) -> torch.Tensor | None:
        """Paired exchange: send to ``dest`` while receiving from ``source``.

        Both halves are posted before either waits, so rings and shifts cannot deadlock.
        The received tensor has the shape and dtype of ``send_tensor`` (the partner must send
        exactly that). ``dest=None`` skips the send (``send_tensor`` is then only the template
        of the receive); ``source=None`` skips the receive and returns ``None``.

        Parameters
        ----------
        send_tensor : Tensor, shape ``S``
        dest, source : int or None
            Ranks; may equal ``self.rank`` (a local copy).
        out : Tensor, shape ``S``, optional
            Receive buffer to fill (avoids an allocation in loops); must not alias
            ``send_tensor``.

        Returns
        -------
        Tensor, shape ``S``, or None when ``source`` is None.
        """
        ...

    def all_to_all(self, tensors: Sequence[torch.Tensor]) -> list[torch.Tensor]:
        """Personalised exchange with variable sizes.

        Parameters
        ----------
        tensors : sequence of ``world_size`` Tensors, shapes ``[m_d, *S]``
            ``tensors[d]`` goes to rank ``d``. ``m_d`` may differ (zero allowed); ``S`` and
            dtype must be the same for all entries and on all ranks. The sizes are exchanged
            first (one small extra collective).

        Returns
        -------
        list of ``world_size`` Tensors, shapes ``[m'_s, *S]``: entry ``s`` came from rank ``s``.
        """
        ...

    def broadcast(self, t: torch.Tensor, src: int = 0) -> torch.Tensor:
        """Return rank ``src``'s ``t`` on every rank.

        Parameters
        ----------
        t : Tensor, shape ``S`` (same on every rank; the values of non-``src`` ranks are ignored)
        src : int

        Returns
        -------
        Tensor, shape ``S``.
        """
        ...

    def barrier(self) -> None:
        """Block until every rank has arrived (with the timeout)."""
        ...

    def close(self, wait: bool = True) -> None:
        """Release what the backend set up (call before exiting).

        Parameters
        ----------
        wait : bool
            First wait for every rank (a barrier, with the timeout). ``False`` releases at once: for a rank
            leaving on an exception or an interrupt, whose peers may be in another collective and never
            reach the barrier (they then fail in theirs as soon as this rank's connections close).
        """
        ...


class LocalBackend:
    """A world of one rank: every collective is the identity.

    Parameters
    ----------
    timeout : float or timedelta
        Accepted for signature compatibility; nothing ever waits.

    Notes
    -----
    All results are copies (``clone``), so callers may mutate them exactly as they would the
    results of a real backend.
    """

    def __init__(self, timeout: float | timedelta = DEFAULT_TIMEOUT):
        self.rank = 0
        self.world_size = 1
        self.timeout = timeout_seconds(timeout)

    def __repr__(self) -> str:
        return "LocalBackend()"

    def all_reduce(self, t: torch.Tensor, op: str = "sum") -> torch.Tensor:
        check_op(op)
        return t.clone()

    def exclusive_scan(self, t: torch.Tensor) -> torch.Tensor:
        return torch.zeros_like(t)

    def all_gather(self, t: torch.Tensor) -> torch.Tensor:
        return t.clone()

    def sendrecv(self, send_tensor, dest, source, out=None):
        for peer in (dest, source):
            if peer is not None and peer != 0:
                raise ValueError(f"LocalBackend has only rank 0, got peer {peer}")
        if source is None:
            return None
        if out is None:
            return send_tensor.clone()
        return out.copy_(send_tensor)

    def all_to_all(self, tensors):
        if len(tensors) != 1:
            raise ValueError(f"all_to_all needs world_size=1 tensors, got {len(tensors)}")
        return [tensors[0].clone()]

    def broadcast(self, t: torch.Tensor, src: int = 0) -> torch.Tensor:
        if src != 0:
            raise ValueError(f"LocalBackend has only rank 0, got src={src}")
        return t.clone()

    def barrier(self) -> None:
        return None

    def close(self, wait: bool = True) -> None:
        return None
