"""torchtree's compiled kernels: C++ (CPU) and CUDA sources in ``csrc/`` built on first use and cached.

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
``tree_leaves``: the leaf each point reaches in each tree of a batch (:func:`torchtree.kernels.traversal.leaf_index`
routes by the reference instead where the kernels are unavailable or off the CPU).
``bart_sweep_blocks``: the CUDA sweep's code (``csrc/bart_block.h``) on the CPU, host threads standing in for a
block's (what tests that code without a GPU).

CUDA
----
:func:`cuda_op` returns an operator with a CUDA implementation: ``bart_sweep`` on CUDA tensors (``csrc/bart_cuda.cu``,
one launch per sweep, one block of threads per chain), built by nvcc on first use into :func:`cuda_build_directory`
(about a minute), after the CPU kernels, which declare the operators. A failed build warns once and
:func:`cuda_op` returns None; the callers then run their torch code on the GPU.
The sweep's warps add their points' values per cell before the shared-memory atomics;
``TORCHTREE_CUDA_CELL_ADDS=atomic`` makes one atomic per point instead (slower: a switch for benchmarks).
Each thread takes four points per turn of the sweep's passes, their loads issued before any is used
(``csrc/bart_block.h``); ``TORCHTREE_BLOCK_POINTS=1`` takes one (slower: a switch for benchmarks);
``bart_sweep_blocks`` reads it too. ``TORCHTREE_CHAIN_BLOCKS=G`` (a number, or ``auto``: as many as stay
resident, at least 4096 points each) spreads each chain's points over G blocks (``csrc/bart_grid_block.h``, a
cooperative launch, two chain-wide barriers per tree); default one block per chain until a GPU has timed it;
``bart_sweep_blocks`` runs it with G blocks of host threads.

Layer: base (no torchtree imports).
"""
from __future__ import annotations

import hashlib
import os
import sys
import threading
import warnings
from contextlib import contextmanager
from pathlib import Path
from typing import Callable, Optional

import torch

__all__ = ["op", "available", "usable", "cuda_op", "cuda_available", "SOURCES", "CUDA_SOURCES"]

CSRC = Path(__file__).resolve().parent / "csrc"
SOURCES = [CSRC / name for name in ("bart_update.cpp", "bart_gfr.cpp", "bart_block.cpp", "bart_predict.cpp", "node_points.cpp", "bitsets.cpp",
                                    "keyed.cpp", "traversal.cpp")]
#: every file the build reads (the sources and their headers): the build folder is named by their content
BUILD_INPUTS = SOURCES + [CSRC / name for name in ("bart_common.h", "bart_core.h", "bart_block.h", "bart_block_args.h",
                                             "bart_gfr_block.h", "bart_grid_block.h", "keyed.h")]
#: OpenMP where torch's CPU build uses GNU OpenMP (Linux): ``at::parallel_for`` spreads a kernel's tasks over
#: torch's threads only in code compiled with it, and the extension then shares torch's libgomp (same soname)
#: the CUDA kernels (a second library, implementing some of the operators above for CUDA tensors)
CUDA_SOURCES = [CSRC / "bart_cuda.cu"]
#: device code as the CPU's: no fused multiply-adds (the host code's -ffp-contract=off)
CUDA_FLAGS = ["-O3", "--expt-relaxed-constexpr", "--fmad=false"]
CUDA_OPERATORS = ("bart_sweep", "bart_gfr_blocks")
OPENMP = ["-fopenmp"] if sys.platform.startswith("linux") else []
FLAGS = ["-O3", "-ffp-contract=off"] + OPENMP
OPERATORS = ("bart_tree_update", "bart_sweep", "bart_sweep_blocks", "bart_gfr_sweep", "bart_gfr_blocks", "forest_sum", "forest_stats", "node_extents", "split_counts", "split_intervals", "all_intervals", "split_sums", "split_sum_intervals", "partition_points",
             "bitset_counts", "split_bits", "extent_ranks", "keyed_uniforms", "tree_leaves")
_STATE: dict = {}
_LOCK = threading.Lock()


def build_directory(cuda: bool = False) -> Path:
    """Where the build of these sources lives: one folder per content (sources, flags, torch version) under
    ``TORCH_EXTENSIONS_DIR`` (default ``~/.cache/torch_extensions``), shared by every checkout of them;
    ``cuda``: the CUDA library's."""
    h = hashlib.sha256()
    for p in BUILD_INPUTS + (CUDA_SOURCES if cuda else []):
        h.update(p.read_bytes())
    h.update(repr((FLAGS, CUDA_FLAGS if cuda else None, torch.__version__, torch.version.cuda if cuda else None)).encode())
    root = os.environ.get("TORCH_EXTENSIONS_DIR") or os.path.join(os.path.expanduser("~"), ".cache", "torch_extensions")
    return Path(root) / f"torchtree_{'cuda' if cuda else 'native'}_{h.hexdigest()[:16]}"


def cuda_build_directory() -> Path:
    """Where the CUDA library's build lives (:func:`build_directory` with ``cuda=True``)."""
    return build_directory(cuda=True)


def _load_built(lib: Path) -> bool:
    """Load a library built before (no build lock, no ninja run). False where it does not load: another process
    may be linking it at this moment, and the build below then waits for that process's lock."""
    try:
        torch.ops.load_library(str(lib))
    except OSError:
        return False
    return True


@contextmanager
def _build_lock(folder: Path):
    """Hold the build of ``folder`` for this process: an ``fcntl`` lock on ``folder/torchtree.lock``, which the
    system releases when the process ends however it ends. Holding it, no other torchtree process is building
    there, so torch's own lock file (``folder/lock``, left behind when a build is killed by a signal or a time
    limit, after which every later build waits on it for ever) is removed. Without ``fcntl`` (Windows) torch's
    lock alone serialises builds."""
    folder.mkdir(parents=True, exist_ok=True)
    try:
        import fcntl
    except ImportError:
        yield
        return
    with open(folder / "torchtree.lock", "a") as fh:
        fcntl.flock(fh, fcntl.LOCK_EX)
        try:
            (folder / "lock").unlink(missing_ok=True)
            yield
        finally:
            fcntl.flock(fh, fcntl.LOCK_UN)


def _build_once(folder: Path, lib: Path, what: str, build: Callable[[], None]) -> None:
    """Load ``lib`` if it is built, else build it (``build()``) under :func:`_build_lock`; a process that waited
    for another's build loads that build."""
    if lib.is_file() and _load_built(lib):
        return
    with _build_lock(folder):
        if lib.is_file() and _load_built(lib):
            return
        print(f"torchtree: building the {what} once, into {folder} (about a minute)", file=sys.stderr, flush=True)
        build()


def _build() -> bool:
    from torch.utils.cpp_extension import load

    folder = build_directory()
    _build_once(folder, folder / "torchtree_native.so", "compiled CPU kernels", lambda: load(
        name="torchtree_native", sources=[str(p) for p in SOURCES], extra_cflags=FLAGS, extra_ldflags=OPENMP,
        build_directory=str(folder), is_python_module=False, verbose=False))
    return all(hasattr(torch.ops.torchtree, name) for name in OPERATORS)


def _build_cuda() -> bool:
    from torch.utils.cpp_extension import load

    folder = cuda_build_directory()
    _build_once(folder, folder / "torchtree_cuda.so", "CUDA kernels", lambda: load(
        name="torchtree_cuda", sources=[str(p) for p in CUDA_SOURCES], extra_cuda_cflags=CUDA_FLAGS,
        build_directory=str(folder), is_python_module=False, verbose=False))
    return all(torch._C._dispatch_has_kernel_for_dispatch_key(f"torchtree::{name}", "CUDA") for name in CUDA_OPERATORS)


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


def cuda_available() -> bool:
    """Whether the CUDA kernels can be used in this process (building them, and the CPU kernels that declare
    their operators, if need be): False without CUDA, with ``TORCHTREE_NATIVE=0``, or where a build fails."""
    if not torch.cuda.is_available() or not available():
        return False
    with _LOCK:
        if "cuda" not in _STATE:
            try:
                _STATE["cuda"] = _build_cuda()
            except Exception as exc:  # nvcc missing or failing: the torch code runs on the GPU instead
                _STATE["cuda"] = False
                warnings.warn(f"torchtree: the CUDA kernels could not be built ({type(exc).__name__}: "
                              f"{str(exc)[:300]}); running the torch code on the GPU instead", RuntimeWarning)
        return _STATE["cuda"]


def cuda_op(name: str) -> Optional[Callable]:
    """``torch.ops.torchtree.<name>`` for CUDA tensors, or None where the CUDA kernels are unavailable."""
    return getattr(torch.ops.torchtree, name) if name in CUDA_OPERATORS and cuda_available() else None


def usable(device) -> bool:
    """Whether the kernels serve tensors on ``device``: CPU only, and :func:`available` (builds them on first use)."""
    return torch.device(device).type == "cpu" and available()


def op(name: str) -> Optional[Callable]:
    """``torch.ops.torchtree.<name>``, or None where the kernels are unavailable (see the module notes)."""
    return getattr(torch.ops.torchtree, name) if available() else None
