"""Backend over an mpi4py communicator (launch with ``mpiexec -n K python script.py``).

mpi4py is imported lazily, on construction, so ``import torchtree.distributed`` works
without it.

Timeouts
--------
MPI itself has no timeouts. Every operation here is the *non-blocking* variant (``Iallreduce``,
``Iexscan``, ``Iallgather``, ``Isend``/``Irecv``, ``Ialltoall``/``Ialltoallv``, ``Ibcast``,
``Ibarrier``) polled with ``Request.Testall`` against a deadline; past it a
:class:`~torchtree.distributed.backend.CollectiveTimeout` is raised. The pending requests cannot
be withdrawn from a collective, so the communicator must not be used again after a timeout:
report and abort (``comm.Abort()`` or exit). The communicator is duplicated at construction
(so our messages never match the caller's) and set to ``MPI.ERRORS_RETURN`` so transport errors
surface as :class:`~torchtree.distributed.backend.CollectiveError` rather than killing the
process. Note that by default ``mpiexec`` (MPICH hydra, Open MPI) itself kills every rank as soon
as one exits abnormally; pass ``-disable-auto-cleanup`` (hydra) to let the survivors report.

Polling yields the core (sched_yield for 50 ms, then 100 us naps), which matters when ranks
are oversubscribed on few cores; it adds at most about a millisecond of latency per call.

Data movement
-------------
CPU tensors are passed to MPI as numpy views (no copy for contiguous tensors); CUDA tensors are
copied to the host around the call. Pure data movement (gather, send, all-to-all, broadcast)
travels as bytes in a contiguous derived datatype of one *row*, so any torch dtype works and
counts are in rows (large buffers do not overflow MPI's int counts). Reductions use the numpy
dtype; float16/bfloat16 are reduced in float32 and bools as integers (sum/max = any, min = all).
"""

from __future__ import annotations

import os
import time
from datetime import timedelta
from typing import Sequence

import torch

from .backend import DEFAULT_TIMEOUT, CollectiveError, CollectiveTimeout, check_op, timeout_seconds

__all__ = ["MPIBackend"]


def _import_mpi():
    try:
        from mpi4py import MPI
    except ImportError as exc:  # pragma: no cover - exercised only without mpi4py
        raise ImportError(
            "MPIBackend needs mpi4py: pip install mpi4py mpich"
        ) from exc
    return MPI


def _bytes_view(t: torch.Tensor):
    """Numpy uint8 view of a contiguous CPU tensor's memory (any dtype)."""
    return t.reshape(-1).view(torch.uint8).numpy()


class MPIBackend:
    """Collectives over an MPI communicator.

    Parameters
    ----------
    comm : mpi4py.MPI.Comm, optional
        Communicator (default ``MPI.COMM_WORLD``); it is duplicated (a collective call).
    timeout : float or timedelta
        Seconds any single operation may wait (default 300).
    abort_on_error : bool
        When a run (``torchtree.samplers.driver.run``) fails on this rank after the ranks agreed to start,
        :meth:`abort` ends every rank of the job at once (default True): ``mpiexec`` does not stop the others
        when one rank raises, so they would wait in their next collective until ``timeout``.
    """

    _TAG = 4242

    def __init__(self, comm=None, timeout: float | timedelta = DEFAULT_TIMEOUT, abort_on_error: bool = True):
        MPI = _import_mpi()
        self._MPI = MPI
        base = MPI.COMM_WORLD if comm is None else comm
        self.comm = base.Dup()
        self.comm.Set_errhandler(MPI.ERRORS_RETURN)
        self.rank = self.comm.Get_rank()
        self.world_size = self.comm.Get_size()
        self.timeout = timeout_seconds(timeout)
        self.abort_on_error = bool(abort_on_error)
        self._row_types: dict[int, object] = {}
        self._ops = {"sum": MPI.SUM, "max": MPI.MAX, "min": MPI.MIN}

    def __repr__(self) -> str:
        return f"MPIBackend(rank={self.rank}, world_size={self.world_size})"

    # ------------------------------------------------------------------ plumbing
    def _wait(self, reqs: list, what: str) -> None:
        MPI = self._MPI
        start = time.monotonic()
        deadline = start + self.timeout
        try:
            while not MPI.Request.Testall(reqs):
                now = time.monotonic()
                if now > deadline:
                    raise CollectiveTimeout(
                        f"rank {self.rank}: {what} did not complete within {self.timeout:g} s "
                        "(a peer died, raised before the call, or is stuck); the communicator is "
                        "now unusable"
                    )
                # MPICH moves a large message only inside MPI calls, so long naps between
                # tests stall it; but ranks are often oversubscribed, and a pure spin would
                # steal the cycles a peer needs to reach the collective. Yield the core for
                # the first 50 ms, then poll every 100 us.
                if now - start < 0.05 and hasattr(os, "sched_yield"):
                    os.sched_yield()
                else:
                    time.sleep(1e-4)
        except MPI.Exception as exc:
            raise CollectiveError(f"rank {self.rank}: {what} failed: {exc}") from exc

    def _row_type(self, row_bytes: int):
        dt = self._row_types.get(row_bytes)
        if dt is None:
            dt = self._MPI.BYTE.Create_contiguous(row_bytes)
            dt.Commit()
            self._row_types[row_bytes] = dt
        return dt

    @staticmethod
    def _host(t: torch.Tensor) -> torch.Tensor:
        return t.detach().to("cpu").contiguous()

    def _reduce_dtype(self, t: torch.Tensor) -> torch.dtype:
        if t.dtype == torch.bool:
            return torch.int64
        if t.dtype in (torch.float16, torch.bfloat16):
            return torch.float32
        return t.dtype

    def _finish_reduce(self, r: torch.Tensor, like: torch.Tensor) -> torch.Tensor:
        if like.dtype == torch.bool:
            r = r != 0
        return r.to(dtype=like.dtype, device=like.device)

    # ------------------------------------------------------------------ collectives
    def all_reduce(self, t: torch.Tensor, op: str = "sum") -> torch.Tensor:
        check_op(op)
        s = self._host(t).to(self._reduce_dtype(t))
        r = torch.empty_like(s)
        req = self.comm.Iallreduce(s.numpy(), r.numpy(), op=self._ops[op])
        self._wait([req], f"all_reduce({op})")
        return self._finish_reduce(r, t)

    def exclusive_scan(self, t: torch.Tensor) -> torch.Tensor:
        s = self._host(t).to(self._reduce_dtype(t))
        r = torch.zeros_like(s)
        req = self.comm.Iexscan(s.numpy(), r.numpy(), op=self._MPI.SUM)
        self._wait([req], "exclusive_scan")
        if self.rank == 0:
            r.zero_()  # MPI leaves rank 0's Exscan result undefined
        return self._finish_reduce(r, t)

    def all_gather(self, t: torch.Tensor) -> torch.Tensor:
        s = self._host(t.reshape(1) if t.dim() == 0 else t)
        m = s.shape[0]
        out = torch.empty((self.world_size * m,) + tuple(s.shape[1:]), dtype=s.dtype)
        row = s[0].numel() * s.element_size() if m else 0
        if m and row:
            dt = self._row_type(row)
            req = self.comm.Iallgather([_bytes_view(s), m, dt], [_bytes_view(out), m, dt])
        else:
            req = self.comm.Ibarrier()  # nothing to move, but keep the call collective
        self._wait([req], "all_gather")
        return out.to(t.device)

    def sendrecv(self, send_tensor, dest, source, out=None):
        me = self.rank
        if me in (dest, source) and dest != source:
            raise ValueError(f"rank {me}: a message to self needs dest == source == rank, got {dest}, {source}")
        for peer in (dest, source):
            if peer is not None and not 0 <= peer < self.world_size:
                raise ValueError(f"peer rank {peer} outside [0, {self.world_size})")
        if dest == me:
            return send_tensor.clone() if out is None else out.copy_(send_tensor)
        s = self._host(send_tensor)
        flat = s.reshape(-1)
        count = 1 if flat.numel() else 0
        dt = self._row_type(max(flat.numel() * s.element_size(), 1))
        direct = out is not None and out.device.type == "cpu" and out.is_contiguous() and out.dtype == s.dtype
        recv = None
        if source is not None:
            # Receive straight into the caller's buffer when MPI can write it in place.
            recv = out if direct else torch.empty_like(s)
        reqs = []
        if dest is not None:
            reqs.append(self.comm.Isend([_bytes_view(s), count, dt], dest=dest, tag=self._TAG))
        if source is not None:
            reqs.append(self.comm.Irecv([_bytes_view(recv), count, dt], source=source, tag=self._TAG))
        if reqs:
            self._wait(reqs, f"sendrecv(dest={dest}, source={source})")
        if recv is None:
            return None
        if direct:
            return out
        recv = recv.to(send_tensor.device)
        return recv if out is None else out.copy_(recv)

    def all_to_all(self, tensors: Sequence[torch.Tensor]) -> list[torch.Tensor]:
        from ._buffers import as_one_buffer, split_rows

        if len(tensors) != self.world_size:
            raise ValueError(f"all_to_all needs {self.world_size} tensors, got {len(tensors)}")
        flat, send_sizes, like = as_one_buffer(tensors)
        flat = self._host(flat)
        sizes = torch.tensor(send_sizes, dtype=torch.int64)
        recv_sizes = torch.empty_like(sizes)
        req = self.comm.Ialltoall(sizes.numpy(), recv_sizes.numpy())
        self._wait([req], "all_to_all(sizes)")
        rs = recv_sizes.tolist()
        out = torch.empty((sum(rs), flat.shape[1]), dtype=flat.dtype)
        row = flat.shape[1] * flat.element_size()
        if row:
            dt = self._row_type(row)
            sdispl = [0] + list(_cumsum(send_sizes))[:-1]
            rdispl = [0] + list(_cumsum(rs))[:-1]
            # Zero-length buffers still need a valid pointer for MPI: give it a 1-row scratch.
            sbuf = _bytes_view(flat) if flat.numel() else _bytes_view(torch.empty(row, dtype=torch.uint8))
            rbuf = _bytes_view(out) if out.numel() else _bytes_view(torch.empty(row, dtype=torch.uint8))
            req = self.comm.Ialltoallv([sbuf, (send_sizes, sdispl), dt], [rbuf, (rs, rdispl), dt])
        else:
            req = self.comm.Ibarrier()
        self._wait([req], "all_to_all")
        return split_rows(out.to(like.device), rs, like)

    def broadcast(self, t: torch.Tensor, src: int = 0) -> torch.Tensor:
        if not 0 <= src < self.world_size:
            raise ValueError(f"src rank {src} outside [0, {self.world_size})")
        s = self._host(t).clone()
        n = s.numel() * s.element_size()
        if n:
            req = self.comm.Ibcast([_bytes_view(s), 1, self._row_type(n)], root=src)
        else:
            req = self.comm.Ibarrier()
        self._wait([req], f"broadcast(src={src})")
        return s.to(t.device)

    def barrier(self) -> None:
        self._wait([self.comm.Ibarrier()], "barrier")

    def close(self, wait: bool = True) -> None:
        """Wait for every rank, or nothing with ``wait=False`` (MPI itself is finalised by mpi4py at exit)."""
        if wait:
            self.barrier()

    def abort(self, message: str, code: int = 1) -> None:
        """With ``abort_on_error``, write ``message`` and the traceback being handled to stderr, then end every
        rank of the communicator's job (``MPI_Abort``); otherwise nothing."""
        if not self.abort_on_error:
            return
        import sys
        import traceback

        traceback.print_exc(file=sys.stderr)
        sys.stderr.write(f"{message}; aborting every rank of the job (MPIBackend(abort_on_error=False) leaves them)\n")
        sys.stderr.flush()
        self.comm.Abort(code)


def _cumsum(xs):
    total = 0
    for x in xs:
        total += x
        yield total

