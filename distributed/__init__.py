"""torchtree.distributed: collectives, backends and redistribution across ranks.

Knows tensors and backends, not samplers. A sampler asks for a :class:`Backend` (``backend=``)
and calls:

* :func:`ncopies_from_log_weights` -- how many copies of each local particle (distributed
  prefix sum in exact integer arithmetic; identical on 1 rank or P);
* :func:`global_stats` -- log-sum-exp and ESS of log-weights over all ranks, exact (fixed-point
  integer sums), so identical on any number of ranks;
* :func:`harmonize_capacity` -- agree on the largest tree capacity and pad (Alg. 6 Max + Pad);
* :func:`redistribute` -- the new population, ``N/P`` particles per rank
  (``method="gather" | "sequential" | "rotational" | "alltoall" | "auto"``).

Particles are *blocks*: ``dict[str, Tensor]`` whose tensors share the leading dimension
(``HardTrees.as_dict()``). mpi4py is only imported when an :class:`MPIBackend` is built.
"""

from .alltoall import alltoall_redistribute
from .backend import (
    DEFAULT_TIMEOUT,
    Backend,
    CollectiveError,
    CollectiveTimeout,
    LocalBackend,
)
from .blocks import (
    BlockLayout,
    Workspace,
    agree_capacity,
    block_capacity,
    block_rows,
    harmonize_capacity,
    pad_block,
    take_rows,
)
from .exact import fixed_bits, fixed_sums, global_stats
from .ncopies import (
    fixed_point_weights,
    global_ess,
    global_log_sum_exp,
    ncopies_from_log_weights,
    prefix_sum,
)
from .redistribution import (
    METHODS,
    ancestors_from_ncopies,
    check_out,
    gather_redistribute,
    redistribute,
    sequential_redistribute,
)
from .resolve import get_backend, launcher, launcher_backend
from .rotational import rotational_redistribute
from .torch_backend import TorchDistBackend


def __getattr__(name):
    # MPIBackend lives behind a lazy attribute so that importing the package never needs mpi4py
    # (the module itself imports mpi4py only when a backend is constructed, but keeping it lazy
    # also spares the import cost).
    if name == "MPIBackend":
        from .mpi_backend import MPIBackend

        return MPIBackend
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


__all__ = [
    "Backend",
    "LocalBackend",
    "TorchDistBackend",
    "MPIBackend",
    "CollectiveError",
    "CollectiveTimeout",
    "DEFAULT_TIMEOUT",
    "get_backend",
    "launcher",
    "launcher_backend",
    "block_rows",
    "take_rows",
    "block_capacity",
    "pad_block",
    "agree_capacity",
    "harmonize_capacity",
    "BlockLayout",
    "Workspace",
    "prefix_sum",
    "global_log_sum_exp",
    "global_ess",
    "fixed_point_weights",
    "fixed_bits",
    "fixed_sums",
    "global_stats",
    "ncopies_from_log_weights",
    "METHODS",
    "ancestors_from_ncopies",
    "check_out",
    "sequential_redistribute",
    "gather_redistribute",
    "rotational_redistribute",
    "alltoall_redistribute",
    "redistribute",
]
