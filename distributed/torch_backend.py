"""Backend over an initialised ``torch.distributed`` process group (gloo on CPU, nccl on CUDA).

Timeouts
--------
Every operation is issued with ``async_op=True`` and waited on with
``Work.wait(timeout=self.timeout)``. On gloo that bounds the host-side wait of every
collective and every receive; a peer that died closes its TCP connections, which gloo reports
as an error well before the timeout. On nccl ``Work.wait`` only orders the CUDA stream; the
host-side bound there is the process group's own timeout (``init_process_group(timeout=...)``,
which :meth:`TorchDistBackend.from_env` sets to the same value) enforced by the NCCL watchdog,
which aborts the process.

Costs
-----
gloo and nccl have no scan primitive: :meth:`TorchDistBackend.exclusive_scan` is one
``all_gather`` of the ``world_size`` contributions followed by a local sum, i.e.
``O(world_size * numel)`` bytes moved and held per rank instead of ``O(numel log P)``; for the
handful of scalars a resampling step scans this is one latency-bound collective.
"""

from __future__ import annotations

import os
from datetime import timedelta
from typing import Sequence

import torch
import torch.distributed as dist

from .backend import DEFAULT_TIMEOUT, CollectiveError, CollectiveTimeout, check_op, timeout_seconds

__all__ = ["TorchDistBackend"]

_TORCHRUN_VARS = ("RANK", "WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT")
_DIST_OPS = {"sum": dist.ReduceOp.SUM, "max": dist.ReduceOp.MAX, "min": dist.ReduceOp.MIN}


class TorchDistBackend:
    """Collectives over a ``torch.distributed`` process group.

    Parameters
    ----------
    group : ProcessGroup, optional
        Group to communicate in (default: the world group). Ranks given to
        :meth:`sendrecv` and :meth:`broadcast` are ranks *within* this group.
    timeout : float or timedelta
        Seconds any single operation may wait (default 300).

    Raises
    ------
    RuntimeError
        If no default process group is initialised (use :meth:`from_env` under ``torchrun``).

    Notes
    -----
    Tensors are moved to the transport's device around each call (CPU for gloo, this rank's
    current CUDA device for nccl) and results are returned on the caller's device. Bool tensors
    travel as uint8; reductions of bools are integer reductions compared with zero
    (sum/max = any, min = all).
    """

    def __init__(self, group=None, timeout: float | timedelta = DEFAULT_TIMEOUT):
        if not (dist.is_available() and dist.is_initialized()):
            raise RuntimeError(
                "torch.distributed is not initialised: call TorchDistBackend.from_env() under "
                "torchrun, or torch.distributed.init_process_group(...) first"
            )
        self.group = group
        self._owns_process_group = False  # set by from_env when it initialised the default group
        self.timeout = timeout_seconds(timeout)
        self.rank = dist.get_rank(group)
        self.world_size = dist.get_world_size(group)
        self.transport = str(dist.get_backend(group)).lower()
        if "nccl" in self.transport:
            self.device = torch.device("cuda", torch.cuda.current_device())
        else:
            self.device = torch.device("cpu")

    @classmethod
    def from_env(
        cls, transport: str | None = None, timeout: float | timedelta = DEFAULT_TIMEOUT, group=None
    ) -> "TorchDistBackend":
        """Initialise the default process group from ``torchrun``'s environment if needed.

        Parameters
        ----------
        transport : {"gloo", "nccl"} or None
            None picks nccl when CUDA is available, else gloo. Ignored if a process group is
            already initialised.
        timeout : float or timedelta
            Used both for ``init_process_group(timeout=...)`` and for every later wait.
        group : ProcessGroup, optional
            Passed to the constructor.

        Returns
        -------
        TorchDistBackend

        Raises
        ------
        RuntimeError
            If the group is not initialised and ``RANK``, ``WORLD_SIZE``, ``MASTER_ADDR`` or
            ``MASTER_PORT`` is missing from the environment.
        """
        seconds = timeout_seconds(timeout)
        if not dist.is_initialized():
            missing = [v for v in _TORCHRUN_VARS if v not in os.environ]
            if missing:
                raise RuntimeError(
                    f"cannot initialise torch.distributed: environment variables {missing} are not "
                    "set (launch with `torchrun --nproc-per-node K script.py`)"
                )
            if transport is None:
                transport = "nccl" if torch.cuda.is_available() else "gloo"
            if transport == "nccl":
                # One GPU per local rank, as torchrun expects.
                torch.cuda.set_device(int(os.environ.get("LOCAL_RANK", "0")))
            dist.init_process_group(transport, timeout=timedelta(seconds=seconds))
            backend = cls(group=group, timeout=seconds)
            backend._owns_process_group = True
            return backend
        return cls(group=group, timeout=seconds)

    def __repr__(self) -> str:
        return f"TorchDistBackend({self.transport}, rank={self.rank}, world_size={self.world_size})"

    # ------------------------------------------------------------------ plumbing
    def _wait(self, work, what: str) -> None:
        try:
            work.wait(timeout=timedelta(seconds=self.timeout))
        except Exception as exc:  # gloo raises plain RuntimeError for both cases
            msg = str(exc)
            if "timed out" in msg.lower() or "timeout" in msg.lower():
                raise CollectiveTimeout(
                    f"rank {self.rank}: {what} did not complete within {self.timeout:g} s "
                    f"(a peer died, raised before the call, or is stuck): {msg}"
                ) from exc
            raise CollectiveError(
                f"rank {self.rank}: {what} failed (a peer probably died or raised): {msg}"
            ) from exc

    def _to_wire(self, t: torch.Tensor) -> torch.Tensor:
        if t.dtype == torch.bool:
            t = t.to(torch.uint8)
        return t.to(self.device).contiguous()

    @staticmethod
    def _from_wire(w: torch.Tensor, like: torch.Tensor) -> torch.Tensor:
        if like.dtype == torch.bool:
            w = w != 0
        return w.to(like.device)

    def _peer(self, r: int) -> int:
        if not 0 <= r < self.world_size:
            raise ValueError(f"peer rank {r} outside [0, {self.world_size})")
        return r if self.group is None else dist.get_global_rank(self.group, r)

    # ------------------------------------------------------------------ collectives
    def all_reduce(self, t: torch.Tensor, op: str = "sum") -> torch.Tensor:
        check_op(op)
        w = self._to_wire(t).clone()
        self._wait(dist.all_reduce(w, _DIST_OPS[op], group=self.group, async_op=True), f"all_reduce({op})")
        return self._from_wire(w, t)

    def all_gather(self, t: torch.Tensor) -> torch.Tensor:
        w = self._to_wire(t.reshape(1) if t.dim() == 0 else t)
        out = torch.empty((self.world_size * w.shape[0],) + tuple(w.shape[1:]), dtype=w.dtype, device=w.device)
        self._wait(dist.all_gather_single(out, w, group=self.group, async_op=True), "all_gather")
        return self._from_wire(out, t)

    def exclusive_scan(self, t: torch.Tensor) -> torch.Tensor:
        # No scan in gloo/nccl: gather all contributions, sum the earlier ranks' locally.
        w = self._to_wire(t).reshape(1, *t.shape)
        out = torch.empty((self.world_size,) + tuple(t.shape), dtype=w.dtype, device=w.device)
        self._wait(dist.all_gather_single(out, w, group=self.group, async_op=True), "exclusive_scan")
        res = out[: self.rank].sum(0, dtype=w.dtype) if self.rank else torch.zeros_like(w[0])
        return self._from_wire(res, t)

    def sendrecv(self, send_tensor, dest, source, out=None):
        me = self.rank
        if me in (dest, source) and dest != source:
            raise ValueError(f"rank {me}: a message to self needs dest == source == rank, got {dest}, {source}")
        if dest == me:
            if out is None:
                return send_tensor.clone()
            return out.copy_(send_tensor)
        wire_send = self._to_wire(send_tensor)
        recv = None
        direct = (
            out is not None
            and out.dtype == wire_send.dtype
            and out.device == wire_send.device
            and out.is_contiguous()
        )
        if source is not None:
            # Receive straight into the caller's buffer when it is already wire-ready.
            recv = out if direct else torch.empty_like(wire_send)
        ops = []
        if dest is not None:
            ops.append(dist.P2POp(dist.isend, wire_send, self._peer(dest), self.group))
        if source is not None:
            ops.append(dist.P2POp(dist.irecv, recv, self._peer(source), self.group))
        if ops:
            # batch_isend_irecv posts both halves together (needed by nccl to avoid deadlock).
            for work in dist.batch_isend_irecv(ops):
                self._wait(work, f"sendrecv(dest={dest}, source={source})")
        if recv is None:
            return None
        if direct:
            return out
        res = self._from_wire(recv, send_tensor)
        return res if out is None else out.copy_(res)

    def all_to_all(self, tensors: Sequence[torch.Tensor]) -> list[torch.Tensor]:
        from ._buffers import as_one_buffer, split_rows

        if len(tensors) != self.world_size:
            raise ValueError(f"all_to_all needs {self.world_size} tensors, got {len(tensors)}")
        flat, send_sizes, like = as_one_buffer(tensors)
        wire = self._to_wire(flat)
        sizes = torch.tensor(send_sizes, dtype=torch.int64, device=self.device)
        recv_sizes = torch.empty_like(sizes)
        self._wait(
            dist.all_to_all_single(recv_sizes, sizes, group=self.group, async_op=True), "all_to_all(sizes)"
        )
        recv_sizes = recv_sizes.tolist()
        out = torch.empty((sum(recv_sizes),) + tuple(wire.shape[1:]), dtype=wire.dtype, device=wire.device)
        self._wait(
            dist.all_to_all_single(out, wire, recv_sizes, list(send_sizes), group=self.group, async_op=True),
            "all_to_all",
        )
        return split_rows(self._from_wire(out, like), recv_sizes, like)

    def broadcast(self, t: torch.Tensor, src: int = 0) -> torch.Tensor:
        w = self._to_wire(t).clone()
        self._wait(dist.broadcast(w, self._peer(src), group=self.group, async_op=True), f"broadcast(src={src})")
        return self._from_wire(w, t)

    def barrier(self) -> None:
        # A one-element all_reduce rather than dist.barrier: same cost, and it honours our timeout
        # on every transport.
        self.all_reduce(torch.zeros(1, dtype=torch.int32))

    def close(self, wait: bool = True) -> None:
        """Wait for every rank (``wait=False``: do not; see the protocol), then destroy the default
        process group if :meth:`from_env` created it. Call it before a script exits: gloo's threads
        can otherwise outlive the interpreter and abort it (SIGABRT, "terminate called without an
        active exception")."""
        if wait:
            self.barrier()
        if self._owns_process_group and dist.is_initialized():
            dist.destroy_process_group()
            self._owns_process_group = False
