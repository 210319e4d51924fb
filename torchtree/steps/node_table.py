"""The node table of a top-down growth: node records and training-point lists, keyed by uid.

Copies of a particle made by resampling share node uids, so a node's data is stored once per uid,
not once per particle (see :mod:`torchtree.steps.growth`). A node's point list is materialised
lazily from its parent's, by the node's rule; the passes over the lists run as compiled kernels on
the CPU (:mod:`torchtree.kernels.node_points`).

Layer: a step's helpers; imports kernels and the model's status codes only.
"""
from __future__ import annotations

from typing import Optional

import torch

from torchtree.core.memory import format_bytes
from torchtree.kernels.node_points import gather_lists, partition_points
from torchtree.kernels.segments import exclusive_cumsum
from torchtree.model.trees import OPEN

__all__ = ["NodeTable"]


class NodeTable:
    """Node records and training-point lists, keyed by node uid, shared by all particles.

    A particle is a row of uids (see :class:`GrowthState`); copies made by
    resampling share uids, so resampling copies 4 bytes per node and a node's
    data is stored once however many particles hold it. An open node's uid
    carries its data rule (parent uid, feature, threshold, side); expanding it
    gives the expanding particle a new *decided* uid (split or stopped) while
    copies that have not expanded it yet keep the open one.

    Parameters
    ----------
    n_points : int
        N, the number of training points.
    root_stats : Tensor [S]
        Sufficient statistics of all the data.
    threshold_dtype : torch.dtype
        Dtype of cut locations (the data's).

    Attributes
    ----------
    native : bool
        Run the point-list passes as compiled kernels (CPU only; set by the grower).
    """

    _RECORDS = {
        "depth": (torch.int32, 0), "status": (torch.int8, OPEN), "feature": (torch.int32, -1),
        "left": (torch.int32, -1), "right": (torch.int32, -1), "pslot": (torch.int32, -1),
        "rparent": (torch.long, -1), "rfeat": (torch.long, 0), "rside": (torch.bool, False),
        "off": (torch.long, -1), "cnt": (torch.long, 0),
    }

    def __init__(self, n_points: int, root_stats: torch.Tensor, threshold_dtype: torch.dtype) -> None:
        dev = root_stats.device
        self.device = dev
        self.n_points = n_points
        self.buf = torch.arange(n_points, dtype=torch.int32, device=dev)
        self.size = n_points
        cap = 4096
        for name, (dt, fill) in self._RECORDS.items():
            setattr(self, name, torch.full((cap,), fill, dtype=dt, device=dev))
        self.threshold = torch.zeros(cap, dtype=threshold_dtype, device=dev)
        self.rthr = torch.zeros(cap, dtype=torch.float64, device=dev)
        self.stats = torch.zeros(cap, root_stats.shape[-1], dtype=root_stats.dtype, device=dev)
        self.off[0], self.cnt[0], self.stats[0] = 0, n_points, root_stats  # uid 0 = the root
        self.n_uids = 1
        self.live_after_gc = n_points
        self.limit_bytes: Optional[int] = None
        #: what set ``limit_bytes`` and how to raise it, as a refusal names it
        self.limit_source: str = "raise max_memory_bytes"
        self.native = False

    # ------------------------------------------------------------ checkpoints
    def state_dict(self) -> dict:
        """Everything the table holds, as plain tensors and ints (for checkpoints).

        Records are cut to the allocated uids and the point buffer to its used part
        (copies, so a checkpoint does not carry the spare capacity).
        """
        n = self.n_uids
        out = {"n_points": self.n_points, "size": self.size, "n_uids": n, "live_after_gc": self.live_after_gc,
               "buf": self.buf[: self.size].clone()}
        for name in tuple(self._RECORDS) + ("threshold", "rthr", "stats"):
            out[name] = getattr(self, name)[:n].clone()
        return out

    def load_state_dict(self, state: dict) -> None:
        """Restore :meth:`state_dict` (the same data); capacities are rebuilt, records past
        the allocated uids are at their defaults as :meth:`new` expects."""
        if int(state["n_points"]) != self.n_points:
            raise ValueError(f"node table of {state['n_points']} points cannot be restored on data of {self.n_points}")
        dev = self.device
        n = int(state["n_uids"])
        cap = max(4096, n)
        for name, (dt, fill) in self._RECORDS.items():
            a = torch.full((cap,), fill, dtype=dt, device=dev)
            a[:n] = state[name].to(device=dev, dtype=dt)
            setattr(self, name, a)
        for name in ("threshold", "rthr", "stats"):
            old = getattr(self, name)
            a = torch.zeros((cap,) + tuple(old.shape[1:]), dtype=old.dtype, device=dev)
            a[:n] = state[name].to(device=dev, dtype=old.dtype)
            setattr(self, name, a)
        self.n_uids = n
        self.size = int(state["size"])
        self.buf = state["buf"].to(device=dev, dtype=torch.int32).clone()
        self.live_after_gc = int(state["live_after_gc"])

    def row_bytes(self) -> int:
        """Bytes of one uid's records (with its statistics: 4 bytes per class for counts)."""
        per = sum(getattr(self, name).element_size() for name in self._RECORDS)
        return per + self.threshold.element_size() + self.rthr.element_size() + self.stats[0].numel() * self.stats.element_size()

    def _reserve(self, need: int) -> None:
        cap = self.depth.numel()
        if need <= cap:
            return
        new = cap
        while new < need:
            new *= 2
        if self.limit_bytes is not None:
            # old and new records coexist while they are copied
            peak = (cap + new) * self.row_bytes() + self.buf.numel() * self.buf.element_size()
            if peak > self.limit_bytes:
                raise MemoryError(
                    f"the node table would need {format_bytes(peak)} for {new} nodes of {self.row_bytes()} bytes "
                    f"each ({self.stats.shape[1]} statistics per node; limit {format_bytes(self.limit_bytes)}): "
                    f"reduce n_particles, use more islands or ranks, or {self.limit_source}")
        for name, (dt, fill) in self._RECORDS.items():
            old = getattr(self, name)
            setattr(self, name, torch.cat([old, torch.full((new - cap,), fill, dtype=dt, device=self.device)]))
        self.threshold = torch.cat([self.threshold, torch.zeros(new - cap, dtype=self.threshold.dtype, device=self.device)])
        self.rthr = torch.cat([self.rthr, torch.zeros(new - cap, dtype=torch.float64, device=self.device)])
        self.stats = torch.cat([self.stats, torch.zeros(new - cap, self.stats.shape[1], dtype=self.stats.dtype, device=self.device)])

    def new(self, k: int) -> torch.Tensor:
        """Allocate ``k`` fresh uids (records at their defaults); returns LongTensor [k]."""
        self._reserve(self.n_uids + k)
        uids = torch.arange(self.n_uids, self.n_uids + k, device=self.device)
        self.n_uids += k
        return uids

    def _append(self, idx: torch.Tensor) -> int:
        need = self.size + idx.numel()
        if need > self.buf.numel():
            new = max(need, 2 * self.buf.numel())
            if self.limit_bytes is not None and new * self.buf.element_size() > self.limit_bytes:
                new = need
                if new * self.buf.element_size() > self.limit_bytes:
                    raise MemoryError(
                        f"the node-data pool would need {format_bytes(new * self.buf.element_size())} (limit "
                        f"{format_bytes(self.limit_bytes)}): too many distinct particles x data points; "
                        f"reduce n_particles, use more islands or ranks, or {self.limit_source}"
                    )
            buf = torch.empty(new, dtype=self.buf.dtype, device=self.device)
            buf[: self.size] = self.buf[: self.size]
            self.buf = buf
        start = self.size
        self.buf[start:need] = idx
        self.size = need
        return start

    def materialise(self, uids: torch.Tensor, X: torch.Tensor) -> None:
        """Make sure the point lists of distinct open ``uids`` exist (their parents' must)."""
        todo = uids[self.off[uids] < 0]
        if todo.numel() == 0:
            return
        par = self.rparent[todo]
        if bool((self.off[par] < 0).any()):
            raise RuntimeError("internal error: a node's parent data was freed before the node was expanded")
        expected = self.cnt[todo]
        kept, counts = partition_points(self.buf, self.off[par], self.cnt[par], X, self.rfeat[todo], self.rthr[todo],
                                        self.rside[todo], expected, use_native=self.native)
        if not bool((counts == expected).all()):
            raise RuntimeError("internal error: node counts disagree with the data partition")
        start = self._append(kept.to(self.buf.dtype))
        self.off[todo] = start + exclusive_cumsum(counts)

    def gather(self, uids: torch.Tensor):
        """Flatten the point lists of materialised ``uids``: ``(seg [T], idx [T])``."""
        return gather_lists(self.buf, self.off[uids], self.cnt[uids])

    def needs_compaction(self, factor: float = 3.0) -> bool:
        """True once the buffer holds ``factor`` x the live size at the last compaction."""
        return self.size >= factor * max(self.live_after_gc, self.n_points)

    def compact(self, open_uids: torch.Tensor) -> None:
        """Drop the point lists that no open node needs.

        Parameters
        ----------
        open_uids : LongTensor [k] uids of all open nodes of all particles
        """
        open_u = torch.unique(open_uids)
        unmat = open_u[self.off[open_u] < 0]
        keep = torch.unique(torch.cat([open_u[self.off[open_u] >= 0], self.rparent[unmat]]))
        _, idx = self.gather(keep)
        counts = self.cnt[keep]
        self.off.fill_(-1)
        self.buf = idx.to(torch.int32)
        self.size = idx.numel()
        self.off[keep] = exclusive_cumsum(counts)
        self.live_after_gc = max(self.size, 1)
