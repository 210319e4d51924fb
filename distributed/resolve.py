"""Backends by name: ``get_backend("gloo")`` and friends.

Apart from :mod:`.backend` so that the protocol module does not import its implementations
(they import it).
"""
from __future__ import annotations

from .backend import Backend, LocalBackend
from .mpi_backend import MPIBackend
from .torch_backend import TorchDistBackend

__all__ = ["get_backend"]


def get_backend(name_or_obj: "str | Backend | None" = None, **kwargs) -> Backend:
    """Resolve a backend from a name or pass an existing one through.

    Parameters
    ----------
    name_or_obj : str, Backend or None
        ``None`` or ``"local"`` -> :class:`LocalBackend`;
        ``"torch"``, ``"gloo"``, ``"nccl"`` -> :class:`TorchDistBackend` on the default
        process group, initialising it from the ``torchrun`` environment if needed (with that
        transport; ``"torch"`` picks nccl when CUDA is available, else gloo);
        ``"mpi"`` -> :class:`MPIBackend` on ``MPI.COMM_WORLD`` (imports mpi4py lazily);
        an object with ``rank``, ``world_size`` and the collectives -> returned unchanged.
    **kwargs
        Forwarded to the constructor (e.g. ``timeout=30``).

    Returns
    -------
    Backend
    """
    if name_or_obj is None:
        return LocalBackend(**kwargs)
    if not isinstance(name_or_obj, str):
        if isinstance(name_or_obj, Backend):
            return name_or_obj
        raise TypeError(f"not a Backend: {name_or_obj!r}")
    name = name_or_obj.lower()
    if name == "local":
        return LocalBackend(**kwargs)
    if name in ("torch", "gloo", "nccl"):
        return TorchDistBackend.from_env(None if name == "torch" else name, **kwargs)
    if name == "mpi":
        return MPIBackend(**kwargs)
    raise ValueError(f"unknown backend {name_or_obj!r}: expected local, torch, gloo, nccl or mpi")
