"""Backends by name: ``get_backend("gloo")`` and friends.

Apart from :mod:`.backend` so that the protocol module does not import its implementations
(they import it).
"""
from __future__ import annotations

import os
from typing import Mapping, Optional, Tuple

from .backend import Backend, LocalBackend
from .mpi_backend import MPIBackend
from .torch_backend import TorchDistBackend

__all__ = ["get_backend", "launcher", "launcher_backend"]

#: environment variables that mark a process started by mpiexec / mpirun / srun-with-PMI
MPI_RANK_VARS = ("PMI_RANK", "OMPI_COMM_WORLD_RANK", "PMIX_RANK")


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


def launcher(environ: Optional[Mapping[str, str]] = None) -> str:
    """Which launcher started this process, from its environment: ``"torchrun"`` (``RANK`` and
    ``MASTER_ADDR`` set, as ``torchrun`` and ``torch.distributed.launch`` do), ``"mpi"`` (one of
    :data:`MPI_RANK_VARS`), or ``"none"``."""
    env = os.environ if environ is None else environ
    if "RANK" in env and "MASTER_ADDR" in env:
        return "torchrun"
    if any(v in env for v in MPI_RANK_VARS):
        return "mpi"
    return "none"


def launcher_backend(name: str = "auto", device=None, **kwargs) -> Tuple[Backend, str]:
    """The backend a script or the command line runs on, and its name.

    Parameters
    ----------
    name : str
        ``"auto"``: under ``torchrun`` a :class:`TorchDistBackend` (nccl when ``device`` is a CUDA
        device, else gloo), under ``mpiexec`` an :class:`MPIBackend`, else one local rank; or any
        name :func:`get_backend` takes.
    device : torch.device or str, optional
        Where the run's tensors live (chooses nccl or gloo under ``torchrun``).
    **kwargs
        Forwarded to the backend's constructor.

    Returns
    -------
    (Backend, str): the backend and the name it was resolved from. Call its ``close()`` before
    the process exits (it destroys the process group only if it created it).
    """
    if name == "auto":
        where = launcher()
        if where == "torchrun":
            name = "nccl" if device is not None and str(device).startswith("cuda") else "gloo"
        else:
            name = "mpi" if where == "mpi" else "local"
    return get_backend(name, **kwargs), name
