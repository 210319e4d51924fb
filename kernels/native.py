"""torchtree's compiled CPU kernels: C++ sources in ``csrc/`` built on first use and cached.

:func:`op` returns a ``torch.ops.torchtree`` operator, building the extension the first time any is
asked for in a process (``torch.utils.cpp_extension.load``: g++ and ninja, about a minute cold). The
build is kept in :func:`build_directory` (one folder per source content under ``TORCH_EXTENSIONS_DIR``,
default ``~/.cache/torch_extensions``); later processes load the built library directly. Nothing is installed beyond the package itself. When the
build fails (no compiler, an unsupported platform) or ``TORCHTREE_NATIVE=0`` is set, :func:`op`
returns None and the callers run their plain-torch reference; a failed build warns once.

Operators
---------
``bart_tree_update``, ``bart_sweep``, ``bart_gfr_sweep``: BART tree updates and sweeps
(:func:`torchtree.steps.bart_moves.tree_update` is their reference and documents them).
``forest_sum``: sums of BART trees at new points (:func:`torchtree.model.bart.forest_sum` is its reference);
``forest_stats``: each chain's leaves per tree and the deepest node's depth (``torchtree.samplers.bart``).
``node_extents``, ``split_counts``, ``split_intervals``, ``all_intervals``, ``partition_points``: passes over the point lists of a top-down
growth stage (:mod:`torchtree.kernels.node_points` documents them and holds their references).
``bitset_counts``, ``split_bits``, ``extent_ranks``: popcounts, child bitsets and rank extents of the move samplers' nodes
(:mod:`torchtree.kernels.bitsets`).
``keyed_uniforms``: the counter-based uniforms of several streams in one pass (:func:`torchtree.core.random.keyed_uniforms`
is its reference).

Layer: base (no torchtree imports).
"""
from __future__ import annotations

import hashlib
import os
import sys
import threading
import warnings
from pathlib import Path
from typing import Callable, Optional

import torch

__all__ = ["op", "available", "usable", "SOURCES"]

CSRC = Path(__file__).resolve().parent / "csrc"
SOURCES = [CSRC / name for name in ("bart_update.cpp", "bart_gfr.cpp", "bart_predict.cpp", "node_points.cpp", "bitsets.cpp",
                                    "keyed.cpp")]
#: every file the build reads (the sources and their headers): the build folder is named by their content
BUILD_INPUTS = SOURCES + [CSRC / "bart_common.h", CSRC / "keyed.h"]
#: OpenMP where torch's CPU build uses GNU OpenMP (Linux): ``at::parallel_for`` spreads a kernel's tasks over
#: torch's threads only in code compiled with it, and the extension then shares torch's libgomp (same soname)
OPENMP = ["-fopenmp"] if sys.platform.startswith("linux") else []
FLAGS = ["-O3", "-ffp-contract=off"] + OPENMP
OPERATORS = ("bart_tree_update", "bart_sweep", "bart_gfr_sweep", "forest_sum", "forest_stats", "node_extents", "split_counts", "split_intervals", "all_intervals", "split_sums", "split_sum_intervals", "partition_points",
             "bitset_counts", "split_bits", "extent_ranks", "keyed_uniforms")
_STATE: dict = {}
_LOCK = threading.Lock()


def build_directory() -> Path:
    """Where the build of these sources lives: one folder per content (sources, flags, torch version) under
    ``TORCH_EXTENSIONS_DIR`` (default ``~/.cache/torch_extensions``), shared by every checkout of them."""
    h = hashlib.sha256()
    for p in BUILD_INPUTS:
        h.update(p.read_bytes())
    h.update(repr((FLAGS, torch.__version__)).encode())
    root = os.environ.get("TORCH_EXTENSIONS_DIR") or os.path.join(os.path.expanduser("~"), ".cache", "torch_extensions")
    return Path(root) / f"torchtree_native_{h.hexdigest()[:16]}"


def _build() -> bool:
    folder = build_directory()
    lib = folder / "torchtree_native.so"
    if lib.is_file():  # built before: load it (no build lock, no ninja run)
        torch.ops.load_library(str(lib))
    else:
        from torch.utils.cpp_extension import load

        folder.mkdir(parents=True, exist_ok=True)
        print(f"torchtree: building the compiled CPU kernels once, into {folder} (about a minute)", file=sys.stderr,
              flush=True)
        load(name="torchtree_native", sources=[str(p) for p in SOURCES], extra_cflags=FLAGS, extra_ldflags=OPENMP,
             build_directory=str(folder), is_python_module=False, verbose=False)
    return all(hasattr(torch.ops.torchtree, name) for name in OPERATORS)


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


def usable(device) -> bool:
    """Whether the kernels serve tensors on ``device``: CPU only, and :func:`available` (builds them on first use)."""
    return torch.device(device).type == "cpu" and available()


def op(name: str) -> Optional[Callable]:
    """``torch.ops.torchtree.<name>``, or None where the kernels are unavailable (see the module notes)."""
    return getattr(torch.ops.torchtree, name) if available() else None
