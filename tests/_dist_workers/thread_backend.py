"""An in-process Backend for tests: P threads act as P ranks over shared memory.

Not a transport anyone should use; it lets the unit tests drive the distributed algorithms
through many world sizes and random cases in milliseconds, while the real-process tests
(gloo, MPI) check the same algorithms over real transports.
"""

from __future__ import annotations

import threading

import torch


class _World:
    def __init__(self, size: int, timeout: float):
        self.size = size
        self.timeout = timeout
        self.barrier = threading.Barrier(size, timeout=timeout)
        self.slots: list = [None] * size
        self.mail: dict = {}
        self.cond = threading.Condition()


class ThreadBackend:
    """Rank ``rank`` of a thread world; build all ranks with :func:`run_threads`."""

    def __init__(self, world: _World, rank: int):
        self.world = world
        self.rank = rank
        self.world_size = world.size
        self.timeout = world.timeout

    def _exchange(self, value):
        """Every rank deposits ``value``; returns the list of all ranks' values."""
        w = self.world
        w.barrier.wait()
        w.slots[self.rank] = value
        w.barrier.wait()
        values = list(w.slots)
        w.barrier.wait()
        return values

    def all_reduce(self, t, op="sum"):
        vals = torch.stack([v.clone() for v in self._exchange(t)])
        if op == "sum":
            return vals.sum(0).to(t.dtype)
        if op == "max":
            return vals.max(0).values
        if op == "min":
            return vals.min(0).values
        raise ValueError(op)

    def exclusive_scan(self, t):
        vals = self._exchange(t)
        out = torch.zeros_like(t)
        for v in vals[: self.rank]:
            out = out + v
        return out

    def all_gather(self, t):
        return torch.cat([v.clone() for v in self._exchange(t.reshape(1) if t.dim() == 0 else t)])

    def sendrecv(self, send_tensor, dest, source, out=None):
        # Messages between a pair of ranks are matched in order, as MPI and gloo do.
        w = self.world
        if dest is not None:
            with w.cond:
                w.mail.setdefault((self.rank, dest), []).append(send_tensor.clone())
                w.cond.notify_all()
        if source is None:
            return None
        key = (source, self.rank)
        with w.cond:
            if not w.cond.wait_for(lambda: w.mail.get(key), timeout=self.timeout):
                raise TimeoutError("thread sendrecv timed out")
            got = w.mail[key].pop(0)
        return got if out is None else out.copy_(got)

    def all_to_all(self, tensors):
        table = self._exchange([t.clone() for t in tensors])
        return [table[s][self.rank] for s in range(self.world_size)]

    def broadcast(self, t, src=0):
        return self._exchange(t)[src].clone()

    def barrier(self):
        self.world.barrier.wait()


def run_threads(world_size: int, fn, timeout: float = 30.0):
    """Run ``fn(backend)`` on ``world_size`` thread-ranks; return the per-rank results."""
    world = _World(world_size, timeout)
    results: list = [None] * world_size
    errors: list = [None] * world_size

    def target(r):
        try:
            results[r] = fn(ThreadBackend(world, r))
        except BaseException as exc:  # reported to the caller below
            errors[r] = exc
            world.barrier.abort()

    threads = [threading.Thread(target=target, args=(r,)) for r in range(world_size)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    for e in errors:
        if e is not None and not isinstance(e, threading.BrokenBarrierError):
            raise e
    for e in errors:
        if e is not None:
            raise e
    return results
