"""Counting the torch calls that read a device value back to the host.

On a GPU such a call waits for every queued kernel: the host stops running ahead, and a sweep that
makes one cannot be captured in a CUDA graph. On the CPU the same calls cost nothing extra, so they
are counted there: :class:`HostReads` is a ``TorchFunctionMode`` that sees every torch call made
inside it and counts

* the reads: ``item``, ``tolist``, ``__bool__`` / ``__int__`` / ``__float__`` / ``__index__``,
  ``numpy``, ``cpu``, ``.to("cpu")``;
* the operations whose output shape depends on values: ``nonzero``, ``argwhere``,
  ``masked_select``, ``unique``, ``unique_consecutive``, boolean-mask indexing, and
  ``repeat_interleave`` by a tensor without ``output_size``;
* the copies of host values to a device, ``torch.tensor`` / ``torch.as_tensor`` of Python numbers or
  sequences given a ``device`` (``"host copy"``; counted whatever the device, since on the CPU the
  run's device is the CPU): on a GPU a copy from host memory, which synchronises (``torch.full`` of a
  Python number does not: it launches a fill). Without ``device`` the tensor stays on the host.

With ``where=True`` it also records the call site of each (the innermost frame in the
``torchtree`` package), for finding them.

Where nothing reads back, a step's cost on a GPU is its kernel launches (eager, or the nodes of a
recorded CUDA graph). :class:`DeviceOps` counts them on the CPU: every operation that reaches torch's
dispatcher, less the views and host scalars, which launch no kernel.
"""
from __future__ import annotations

import collections
import os
import traceback
from typing import Counter, Tuple

import torch
from torch.overrides import TorchFunctionMode
from torch.utils._python_dispatch import TorchDispatchMode

__all__ = ["DeviceOps", "HostReads", "READS", "NO_KERNEL"]

#: names of the torch functions and methods counted as host reads (besides the cases in :class:`HostReads`)
READS = frozenset({"item", "tolist", "__bool__", "__int__", "__float__", "__index__", "numpy", "cpu", "nonzero",
                   "masked_select", "unique", "unique_consecutive", "argwhere"})


#: dispatched operations that launch no kernel (views, and host scalars wrapped as tensors)
NO_KERNEL = frozenset({"aten.view", "aten._unsafe_view", "aten.unsqueeze", "aten.squeeze", "aten.select", "aten.slice",
                       "aten.expand", "aten.alias", "aten.as_strided", "aten.t", "aten.transpose", "aten.permute",
                       "aten.scalar_tensor", "aten.lift_fresh", "aten.detach"})


def _is_cpu(a) -> bool:
    return a == "cpu" or (isinstance(a, torch.device) and a.type == "cpu")


class HostReads(TorchFunctionMode):
    """Counts the torch calls that would synchronise with a device (see the module doc).

    Parameters
    ----------
    where : bool
        Also count by call site (``sites``: ``(name, "file:line")``).

    Attributes
    ----------
    reads : Counter of the call names (``"bool-mask index"``, ``"to(cpu)"`` for those cases)
    sites : Counter of ``(name, site)`` (with ``where=True``)
    """

    def __init__(self, where: bool = False) -> None:
        super().__init__()
        self.where = where
        self.reads: Counter[str] = collections.Counter()
        self.sites: Counter[Tuple[str, str]] = collections.Counter()

    @property
    def total(self) -> int:
        """All reads counted so far."""
        return sum(self.reads.values())

    def _kind(self, func, args, kwargs) -> str:
        name = getattr(func, "__name__", str(func))
        if name in READS:
            return name
        if name == "repeat_interleave":
            repeats = kwargs.get("repeats", args[1] if len(args) > 1 else None)
            if isinstance(repeats, torch.Tensor) and kwargs.get("output_size") is None:
                return name  # repeats given as a tensor: the output length is read back
        elif name == "to" and any(_is_cpu(a) for a in (*args[1:], *kwargs.values())):
            return "to(cpu)"
        elif (name in ("tensor", "as_tensor") and args and not isinstance(args[0], torch.Tensor)
              and kwargs.get("device") is not None):
            return "host copy"
        elif name == "__getitem__" and len(args) > 1:
            idx = args[1] if isinstance(args[1], tuple) else (args[1],)
            if any(isinstance(i, torch.Tensor) and i.dtype == torch.bool for i in idx):
                return "bool-mask index"
        return ""

    def __torch_function__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        kind = self._kind(func, args, kwargs)
        if kind:
            self.reads[kind] += 1
            if self.where:
                sites = [s for s in map(_package_site, traceback.extract_stack()[:-1]) if s]
                self.sites[(kind, sites[-1] if sites else "?")] += 1
        return func(*args, **kwargs)


def _package_roots() -> Tuple[Tuple[str, str], ...]:
    """(folder + separator, prefix) of torchtree's own source folders: ``kernels`` and ``distributed`` (which
    may live beside the package) before the package itself, each as imported and as resolved."""
    import torchtree.distributed
    import torchtree.kernels

    package = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))  # this file is package/core/syncs.py
    out = []
    for folder, prefix in ((os.path.dirname(os.path.abspath(torchtree.kernels.__file__)), "kernels/"),
                           (os.path.dirname(os.path.abspath(torchtree.distributed.__file__)), "distributed/"),
                           (package, "")):
        for f in dict.fromkeys((folder, os.path.realpath(folder))):
            out.append((f + os.sep, prefix))
    return tuple(out)


def _package_site(frame: traceback.FrameSummary) -> str:
    """``path:line`` of a frame in torchtree's own source, relative to the package (``model/data.py:12``,
    ``kernels/segments.py:40``), else ``""``: decided by the source folders, not by a folder's name, which
    a checkout called ``torchtree`` shares with every file in it."""
    for folder, prefix in _ROOTS or _ROOTS.extend(_package_roots()) or _ROOTS:
        if frame.filename.startswith(folder):
            return f"{prefix}{frame.filename[len(folder):]}:{frame.lineno}"
    return ""


_ROOTS: list = []


class DeviceOps(TorchDispatchMode):
    """Counts the operations that would launch a device kernel (see the module doc): ``total``, and
    ``ops``, a Counter by operator name (``"aten.add"``, ...)."""

    def __init__(self) -> None:
        super().__init__()
        self.ops: Counter[str] = collections.Counter()

    @property
    def total(self) -> int:
        """All kernel-launching operations counted so far."""
        return sum(self.ops.values())

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        name = str(func.overloadpacket)
        if name not in NO_KERNEL:
            self.ops[name] += 1
        return func(*args, **(kwargs or {}))
