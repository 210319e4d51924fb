"""torchtree's compiled CPU kernels: C++ sources in ``csrc/`` built on first use and cached.

:func:`op` returns a ``torch.ops.torchtree`` operator, building the extension the first time any is
asked for in a process (``torch.utils.cpp_extension.load``: g++ and ninja, about a minute cold; the
build is cached under ``TORCH_EXTENSIONS_DIR``, default ``~/.cache/torch_extensions``, and reused by
later processes until the sources change). Nothing is installed beyond the package itself. When the
build fails (no compiler, an unsupported platform) or ``TORCHTREE_NATIVE=0`` is set, :func:`op`
returns None and the callers run their plain-torch reference; a failed build warns once.

Operators
---------
``bart_tree_update``: one BART tree update per chain (:func:`torchtree.steps.bart_moves.tree_update`
is its reference and documents it).

Layer: base (no torchtree imports).
"""
from __future__ import annotations

import os
import threading
import warnings
from pathlib import Path
from typing import Callable, Optional

import torch

__all__ = ["op", "available", "SOURCES"]

SOURCES = [Path(__file__).resolve().parent / "csrc" / "bart_update.cpp"]
_STATE: dict = {}
_LOCK = threading.Lock()


def _build() -> bool:
    from torch.utils.cpp_extension import load

    load(name="torchtree_native", sources=[str(p) for p in SOURCES], extra_cflags=["-O3", "-ffp-contract=off"],
         is_python_module=False, verbose=False)
    return hasattr(torch.ops.torchtree, "bart_tree_update")


def available() -> bool:
    """Whether the compiled kernels can be used in this process (building them if need be)."""
    if os.environ.get("TORCHTREE_NATIVE", "1") == "0":
        return False
    with _LOCK:
        if "ok" not in _STATE:
            try:
                _STATE["ok"] = _build()
            except Exception as exc:  # compiler missing or failing: the reference runs instead
                _STATE["ok"] = False
                warnings.warn(f"torchtree: the compiled CPU kernels could not be built ({type(exc).__name__}: "
                              f"{str(exc)[:300]}); running the plain-torch reference instead", RuntimeWarning)
        return _STATE["ok"]


def op(name: str) -> Optional[Callable]:
    """``torch.ops.torchtree.<name>``, or None where the kernels are unavailable (see the module notes)."""
    return getattr(torch.ops.torchtree, name) if available() else None
