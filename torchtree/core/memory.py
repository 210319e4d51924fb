"""Memory estimates made before a sampler allocates, so that an impossible setting is
refused at once with the setting to change, rather than by the allocator (or the
kernel's OOM killer) after minutes of work.

The estimates count only the large arrays whose size a setting fixes up front (per
particle or chain, per data point, per parameter); they are lower bounds. A run is
refused when even that lower bound exceeds the memory available to the process, so a
refusal is never a false alarm, while a run close to the limit may still fail later.

``TORCHTREE_MEMORY_LIMIT`` (bytes, or with a ``K``/``M``/``G``/``T`` suffix) caps the
memory the checks assume available, e.g. on a machine shared with others.
"""
from __future__ import annotations

import math
import os
import resource
from typing import Optional

import torch

__all__ = ["available_bytes", "check_memory", "format_bytes", "hard_tree_bytes", "move_model_bytes", "check_tree_memory",
           "lais_bytes"]

_UNITS = {"": 1, "B": 1, "K": 1 << 10, "M": 1 << 20, "G": 1 << 30, "T": 1 << 40}


def format_bytes(n: float) -> str:
    """``n`` bytes in the largest binary unit that keeps it >= 1 (``"78.1 GiB"``)."""
    for unit, name in ((1 << 40, "TiB"), (1 << 30, "GiB"), (1 << 20, "MiB"), (1 << 10, "KiB")):
        if n >= unit:
            return f"{n / unit:.1f} {name}"
    return f"{int(n)} bytes"


def _env_limit() -> Optional[int]:
    raw = os.environ.get("TORCHTREE_MEMORY_LIMIT", "").strip().upper().removesuffix("IB").removesuffix("B")
    if not raw:
        return None
    unit = raw[-1] if raw[-1] in _UNITS else ""
    try:
        value = float(raw[: len(raw) - len(unit)])
    except ValueError:
        value = -1.0
    if not value > 0:
        raise ValueError(f"TORCHTREE_MEMORY_LIMIT must be a positive number of bytes (e.g. 8G), got "
                         f"{os.environ['TORCHTREE_MEMORY_LIMIT']!r}")
    return int(value * _UNITS[unit])


def _read_int(path: str) -> Optional[int]:
    try:
        with open(path) as fh:
            text = fh.read().strip()
    except OSError:
        return None
    return int(text) if text.isdigit() else None


def _cpu_available() -> Optional[int]:
    """Memory this process can still take: the least of the system's available memory,
    its cgroup's remaining allowance and its address-space limit (``ulimit -v``)."""
    found = []
    try:
        with open("/proc/meminfo") as fh:
            for line in fh:
                if line.startswith("MemAvailable:"):
                    found.append(int(line.split()[1]) * 1024)
                    break
    except (OSError, ValueError, IndexError):
        pass
    if not found:
        try:
            found.append(os.sysconf("SC_AVPHYS_PAGES") * os.sysconf("SC_PAGE_SIZE"))
        except (ValueError, OSError, AttributeError):
            pass
    for limit_file, usage_file in (("/sys/fs/cgroup/memory.max", "/sys/fs/cgroup/memory.current"),
                                   ("/sys/fs/cgroup/memory/memory.limit_in_bytes",
                                    "/sys/fs/cgroup/memory/memory.usage_in_bytes")):
        limit, usage = _read_int(limit_file), _read_int(usage_file)
        if limit is not None and usage is not None and limit < (1 << 60):
            found.append(max(limit - usage, 0))
    try:
        soft, _ = resource.getrlimit(resource.RLIMIT_AS)
        if soft != resource.RLIM_INFINITY:
            size = 0
            with open("/proc/self/statm") as fh:
                size = int(fh.read().split()[0]) * os.sysconf("SC_PAGE_SIZE")
            found.append(max(soft - size, 0))
    except (OSError, ValueError, AttributeError):
        pass
    return min(found) if found else None


def available_bytes(device=None) -> Optional[int]:
    """Bytes a new allocation on ``device`` can still get, or None when unknown.

    Parameters
    ----------
    device : torch.device or str, optional
        CUDA: the device's free memory plus what torch's caching allocator holds
        unused. Otherwise the host's: ``MemAvailable``, the cgroup's remaining limit
        and ``ulimit -v``, whichever is least. ``TORCHTREE_MEMORY_LIMIT`` caps either.

    Returns
    -------
    int or None
    """
    dev = torch.device(device) if device is not None else torch.device("cpu")
    avail: Optional[int] = None
    if dev.type == "cuda":
        try:
            free, _ = torch.cuda.mem_get_info(dev)
            avail = int(free + torch.cuda.memory_reserved(dev) - torch.cuda.memory_allocated(dev))
        except (RuntimeError, AssertionError):
            avail = None
    elif dev.type == "cpu":
        avail = _cpu_available()
    cap = _env_limit()
    if cap is not None:
        avail = cap if avail is None else min(avail, cap)
    return avail


def check_memory(what: str, n_bytes: float, setting: str, limit: Optional[int] = None, device=None) -> None:
    """Refuse a run whose estimated memory exceeds what is available.

    Parameters
    ----------
    what : str
        What needs the memory ("TopDownSMC with 100000000 particles"), for the message.
    n_bytes : float
        Estimated bytes (a lower bound).
    setting : str
        The setting(s) to lower, named in the message ("n_particles").
    limit : int, optional
        Bytes available; default :func:`available_bytes` of ``device``.
    device : torch.device or str, optional

    Raises
    ------
    ValueError
        ``n_bytes`` exceeds the limit.
    """
    if limit is None:
        limit = available_bytes(device)
    if limit is None or not n_bytes > limit:
        return
    where = "" if device is None else f" on {device}"
    raise ValueError(
        f"{what} needs at least {format_bytes(n_bytes)} of memory but {format_bytes(limit)} is available{where}; "
        f"lower {setting}"
    )


def hard_tree_bytes(n_points: int, n_stats: int, capacity: int = 16, caches: bool = True) -> int:
    """Bytes of one tree of :class:`torchtree.HardTrees` with ``capacity`` node slots.

    Parameters
    ----------
    n_points : int
        Training points (the move caches hold a bit per point and node).
    n_stats : int
        Statistics per node (the likelihood's ``n_stats``: classes, or 3 for regression).
    capacity : int
        Node slots (trees start with 16 or 32 and grow).
    caches : bool
        Include the MCMC / SMC-move caches: leaf terms, heap codes and threshold ranks per
        node, and the bitsets a move builds per tree (node ``j`` and its rewritten
        subtree, at least 4 x ``ceil(N / 64)`` words; the trees keep no bitset per node
        unless those are small, see :meth:`torchtree.model.target.TreeModel.keeps_bits`).

    Returns
    -------
    int
    """
    node = 5 * 4 + 8 + 1 + 8 * n_stats  # feature/left/right/parent/depth, threshold, status, stats
    per_tree = 8
    if caches:
        node += 3 * 8
        per_tree += 4 * 8 * math.ceil(max(n_points, 1) / 64)
    return capacity * node + per_tree


def move_model_bytes(n_points: int, n_features: int, n_stats: int, table_bytes: int = 1 << 28,
                     min_buckets: int = 16) -> int:
    """Bytes of the moves' data tables (:class:`torchtree.model.target.TreeModel`), ``O(N D)``.

    The ranks (int64) and a float32 copy of the features per value, the class bitsets and
    the two bucket tables (``table_bytes``, or ``min_buckets`` bitsets per feature when
    that is more). Nothing grows as ``N^2``.

    Parameters
    ----------
    n_points, n_features, n_stats : int
        Training points N, features D, statistics per node S.
    table_bytes, min_buckets : int
        The bucket tables' budget and least number of buckets per feature (the model's).

    Returns
    -------
    int
    """
    n, d = max(int(n_points), 1), max(int(n_features), 1)
    words = math.ceil(n / 64)
    tables = max(int(table_bytes), 2 * min_buckets * d * words * 8)
    return n * d * (8 + 4) + (n_stats + 1) * words * 8 + tables


def check_tree_memory(what: str, n_trees: int, data, setting: str, *, capacity: int = 16, caches: bool = True,
                      per_tree: int = 0, kept_per_tree: int = 0, limit: Optional[int] = None,
                      n_stats: Optional[int] = None) -> None:
    """:func:`check_memory` for a batch of ``n_trees`` hard trees fitted to ``data``.

    Parameters
    ----------
    what : str
    n_trees : int
        Particles or chains.
    data : torchtree.Data
    setting : str
        The setting(s) to lower.
    capacity, caches : see :func:`hard_tree_bytes`; with ``caches`` the moves' data tables
        (:func:`move_model_bytes`) are counted once as well
    per_tree : int
        Further bytes per tree (log weights, blocks of uniforms, ...).
    kept_per_tree : int
        Snapshots kept per tree (MCMC draws), each a tree without caches.
    limit : int, optional
        Bytes available (default: what the data's device has).
    n_stats : int, optional
        Statistics per node, the likelihood's ``n_stats(data)`` (default: the data's number of classes, 3 for
        regression: the built-in likelihoods').
    """
    n, s = int(data.n), int(n_stats if n_stats is not None else (getattr(data, "n_classes", 0) or 3))
    each = hard_tree_bytes(n, s, capacity, caches) + per_tree + kept_per_tree * hard_tree_bytes(n, s, 4, False)
    fixed = move_model_bytes(n, int(data.d), s) if caches else 0
    check_memory(f"{what} ({n_trees} x ~{format_bytes(each)})", float(n_trees) * each + fixed, setting, limit,
                 data.device)


def lais_bytes(n_groups: int, n_chains: int, n_draws: int, n_proposals: int, n_params: int) -> int:
    """Bytes of one LAIS evidence update (:func:`torchtree.soft.lais.lais_log_weights`):
    per chain, covariance, Cholesky factor and its inverse (``P x P`` each) and the
    pseudo-samples with their noise and whitened copies (``T x N_M x P`` each), float64."""
    P = int(n_params)
    per_chain = 3 * P * P + 3 * int(n_draws) * int(n_proposals) * P + int(n_draws) * P
    return 8 * int(n_groups) * int(n_chains) * per_chain


def soft_tree_bytes(n_points: int, n_features: int, n_classes: int, n_internal: int, n_leaf_slots: int,
                    n_draws: int, itemsize: int = 8) -> int:
    """Bytes per chain of a soft tree sampled by HMC / NUTS: the leaf-assignment
    probabilities ``[N, L]`` with the intermediate products and gradients that
    autograd keeps (about 4 copies), and the stored draws ``[T, P]``.

    Parameters
    ----------
    n_points, n_features, n_classes : int
        Training rows, split features (doubled for signed splits), classes (1 for regression).
    n_internal, n_leaf_slots : int
        Internal nodes and leaf slots (``2**depth``) of the topology.
    n_draws : int
        Draws kept per chain (``n_samples``).
    itemsize : int
        Bytes per number of the run's dtype.

    Returns
    -------
    int
    """
    P = n_internal * (n_features + 2) + n_leaf_slots * max(n_classes, 1)
    return itemsize * (4 * n_points * n_leaf_slots + n_draws * P + 16 * P)


def check_soft_memory(what: str, n_chains: int, sd, topology, n_draws: int, setting: str, dtype=None) -> None:
    """:func:`check_memory` for ``n_chains`` chains of the soft tree of ``topology`` on
    the soft data ``sd`` (see :func:`soft_tree_bytes`)."""
    itemsize = torch.empty((), dtype=dtype or sd.X.dtype).element_size()
    internal = len(getattr(topology, "internal", ()))
    depth = 1 + max((int(i + 1).bit_length() for i in getattr(topology, "internal", ())), default=0)
    each = soft_tree_bytes(int(sd.X.shape[0]), int(sd.n_features), int(sd.n_classes or 1), internal,
                           1 << (depth - 1), int(n_draws), itemsize)
    check_memory(f"{what} ({n_chains} chains x ~{format_bytes(each)})", float(n_chains) * each, setting,
                 device=sd.X.device)
