"""Building blocks of redistribution: ncopies checks, the ancestor map, the one-rank
variants (sequential reference, gather) and the plan the distributed variants share.

See :mod:`torchtree.distributed.redistribution` for the contract every variant keeps.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Mapping

import torch

from .backend import Backend
from .blocks import Block, BlockLayout, block_rows, take_rows

__all__ = ["METHODS", "LOCAL_METHODS", "ancestors_from_ncopies", "check_out", "sequential_redistribute",
           "gather_redistribute"]

METHODS = ("auto", "sequential", "gather", "rotational", "alltoall")
"""The ``method=`` values of :func:`~torchtree.distributed.redistribute`: ``"sequential"`` and
``"gather"`` run on one rank, ``"rotational"`` and ``"alltoall"`` on any number, ``"auto"``
picks ``"gather"`` on one rank and ``"alltoall"`` on several."""
LOCAL_METHODS = ("gather", "sequential")


def check_ncopies(ncopies: torch.Tensor, rows: int) -> str:
    """Describe what is wrong with a local ``ncopies`` (empty string when nothing is)."""
    if not isinstance(ncopies, torch.Tensor):
        return f"ncopies must be a tensor, got {type(ncopies).__name__}"
    if ncopies.dim() != 1 or ncopies.shape[0] != rows:
        return f"ncopies must have shape [{rows}] (one per local particle), got {list(ncopies.shape)}"
    if ncopies.dtype == torch.bool or ncopies.is_floating_point() or ncopies.is_complex():
        return f"ncopies must be an integer tensor, got {ncopies.dtype}"
    if rows and bool((ncopies < 0).any()):
        return "ncopies must be non-negative"
    return ""


def ancestors_from_ncopies(ncopies: torch.Tensor, start: int = 0, stop: int | None = None) -> torch.Tensor:
    """Ancestor of each output slot: ``repeat_interleave(arange(len(ncopies)), ncopies)[start:stop]``.

    Parameters
    ----------
    ncopies : Tensor [M]
        Non-negative integers.
    start, stop : int
        Output slots wanted (default: all ``sum(ncopies)``).

    Returns
    -------
    int64 Tensor ``[stop - start]`` on the device of ``ncopies``: output slot ``start + k``
    copies input particle ``out[k]``.

    Notes
    -----
    ``csum = cumsum(ncopies)``; slot ``j``'s ancestor is the first ``i`` with ``csum[i] > j``,
    found by ``searchsorted`` for every slot at once -- the pivot search of Alg. 5 applied per
    slot, ``O(log M)`` depth and no loop.
    """
    csum = torch.cumsum(ncopies.to(torch.int64), 0)
    if stop is None:
        stop = int(csum[-1]) if csum.numel() else 0
    slots = torch.arange(start, stop, dtype=torch.int64, device=csum.device)
    return torch.searchsorted(csum, slots, right=True)


def check_out(out: Mapping[str, torch.Tensor] | None, block: Mapping[str, torch.Tensor], rows: int) -> None:
    """Validate a caller-provided output block (see ``out=`` of the redistribution functions).

    Parameters
    ----------
    out : mapping str -> Tensor ``[rows, ...]`` or None
        Same keys, dtypes, devices and trailing shapes as ``block``, contiguous, and not
        sharing memory with it. None passes.
    block : mapping str -> Tensor ``[P, ...]``
        The input particles.
    rows : int
        The number of output particles.

    Raises
    ------
    ValueError
        ``out`` has other keys than ``block``, a field of another dtype, shape or device, a
        non-contiguous field, or a field sharing storage with the input.
    """
    if out is None:
        return
    if set(out) != set(block):
        raise ValueError(f"out has keys {sorted(out)}, the block has {sorted(block)}")
    for k, v in block.items():
        o = out[k]
        want = (rows,) + tuple(v.shape[1:])
        if o.dtype != v.dtype or tuple(o.shape) != want or o.device != v.device or not o.is_contiguous():
            raise ValueError(
                f"out[{k!r}] must be a contiguous {v.dtype} tensor of shape {list(want)} on {v.device}, "
                f"got {o.dtype}{list(o.shape)} on {o.device}"
            )
        if o.numel() and o.untyped_storage().data_ptr() == v.untyped_storage().data_ptr():
            raise ValueError(f"out[{k!r}] shares memory with the input block; use a separate buffer")


def sequential_redistribute(
    block: Mapping[str, torch.Tensor], ncopies: torch.Tensor, *, out: Mapping[str, torch.Tensor] | None = None
) -> Block:
    """Alg. 3 (sequential redistribution, S-R): the reference, a loop over particles.

    Parameters
    ----------
    block : mapping str -> Tensor ``[M, ...]``
    ncopies : Tensor [M]
        Non-negative integers.
    out : mapping str -> Tensor ``[sum(ncopies), ...]``, optional
        Buffers to write into (see :func:`gather_redistribute`).

    Returns
    -------
    dict str -> Tensor ``[sum(ncopies), ...]``: particle ``i`` repeated ``ncopies[i]`` times, in
    order (``sum(ncopies) == M`` for a resampling step).

    Raises
    ------
    ValueError
        A malformed block (see :func:`~torchtree.distributed.block_rows`), ``ncopies`` that is
        not a non-negative integer tensor ``[M]``, or a bad ``out`` (see :func:`check_out`).
    """
    rows = block_rows(block)
    problem = check_ncopies(ncopies, rows)
    if problem:
        raise ValueError(problem)
    counts = ncopies.tolist()
    check_out(out, block, sum(counts))
    if out is None:
        out = {k: v.new_empty((sum(counts),) + tuple(v.shape[1:])) for k, v in block.items()}
    out = dict(out)
    i = 0
    for j, c in enumerate(counts):  # the reference may loop; the fast paths do not
        if c:
            for k, v in block.items():
                out[k][i : i + c] = v[j]
            i += c
    return out


def gather_redistribute(
    block: Mapping[str, torch.Tensor], ncopies: torch.Tensor, *, out: Mapping[str, torch.Tensor] | None = None
) -> Block:
    """Shared-memory / single-device redistribution (Alg. 5 as tensor ops).

    Parameters
    ----------
    block : mapping str -> Tensor ``[M, ...]``
        Particles, on any device.
    ncopies : Tensor [M]
        Non-negative integers.
    out : mapping str -> Tensor ``[sum(ncopies), ...]``, optional
        Preallocated buffers (same keys, dtypes, trailing shapes; not the input's memory) to
        write into. Reusing one spare population across SMC steps ("double buffering") avoids
        allocating ``M`` fresh trees per step, which on CPU costs more than the copy itself
        (the pages must be faulted in and zeroed; see benchmarks/bench_redistribution.py).

    Returns
    -------
    dict str -> Tensor ``[sum(ncopies), ...]``, equal to :func:`sequential_redistribute`
    (the ``out`` tensors when given).

    Raises
    ------
    ValueError
        As :func:`sequential_redistribute`.

    Notes
    -----
    Prefix sum + binary search (:func:`ancestors_from_ncopies`) + one ``index_select`` per
    field. Padded, variable-size trees cost the same per particle, so the work is balanced by
    construction (the point of Alg. 5's Pad step).
    """
    rows = block_rows(block)
    problem = check_ncopies(ncopies, rows)
    if problem:
        raise ValueError(problem)
    device = next(iter(block.values())).device
    anc = ancestors_from_ncopies(ncopies.to(device))
    if out is None:
        return take_rows(block, anc)
    check_out(out, block, anc.numel())
    for k, v in block.items():
        torch.index_select(v, 0, anc, out=out[k])
    return dict(out)


def local_redistribute(block: Mapping[str, torch.Tensor], counts: torch.Tensor, local: str, out=None) -> Block:
    if local == "gather":
        return gather_redistribute(block, counts, out=out)
    if local == "sequential":
        return sequential_redistribute(block, counts, out=out)
    raise ValueError(f"local must be one of {LOCAL_METHODS}, got {local!r}")


def expand_runs(layout: BlockLayout, rows: torch.Tensor, counts: torch.Tensor, local: str, out) -> Block:
    """Step 5 of the distributed variants: expand packed runs ``rows`` by ``counts``."""
    if local == "gather":
        return layout.unpack(rows, index=ancestors_from_ncopies(counts), out=out)
    return sequential_redistribute(layout.unpack(rows), counts, out=out)


@dataclass
class _Plan:
    """What every distributed variant learns in its set-up collective."""

    layout: BlockLayout
    n: int  # particles per rank
    big_n: int  # particles in total
    offset: int  # global output slot of this rank's first copy (exclusive prefix of ncopies)
    zeros_before: int  # particles with ncopies == 0 on lower ranks
    counts: torch.Tensor  # int64 [n] ncopies on the block's device


def make_plan(block: Mapping[str, torch.Tensor], ncopies: torch.Tensor, backend: Backend, out=None) -> _Plan:
    """Validate inputs on every rank at once and learn the per-rank totals: one ``all_gather``.

    Each rank contributes ``[problem flag, n, layout hash, sum(ncopies), #zero ncopies]``; every
    rank then runs the same checks on the same table, so a bad input anywhere makes all ranks
    raise the same ``ValueError`` together instead of one raising and the rest timing out.
    """
    problem, layout, n, sig = "", None, 0, 0
    try:
        n = block_rows(block)
        layout = BlockLayout(block)
        sig = layout.signature_hash()
    except ValueError as exc:
        problem = f"bad particle block: {exc}"
    if not problem:
        problem = check_ncopies(ncopies, n)
    if not problem:
        try:
            check_out(out, block, n)
        except ValueError as exc:
            problem = str(exc)
    if problem:
        copies = zeros = 0
        counts = None
    else:
        device = next(iter(block.values())).device
        counts = ncopies.to(device=device, dtype=torch.int64)
        copies, zeros = (int(v) for v in torch.stack([counts.sum(), (counts == 0).sum()]).tolist())
    mine = torch.tensor([[1 if problem else 0, n, sig, copies, zeros]], dtype=torch.int64)
    table = backend.all_gather(mine)  # [P, 5]
    if bool((table[:, 0] > 0).any()):
        raise ValueError(problem or "invalid redistribution input on another rank (see its error)")
    if bool((table[:, 1] != n).any()):
        raise ValueError(
            f"every rank must hold N/P particles (N divisible by the world size); ranks hold "
            f"{table[:, 1].tolist()}"
        )
    if bool((table[:, 2] != sig).any()):
        raise ValueError(
            "particle blocks differ between ranks in keys, dtypes or trailing shapes (pad tree "
            f"capacities with harmonize_capacity first); this rank has {layout.signature()}"
        )
    big_n = n * backend.world_size
    total = int(table[:, 3].sum())
    if total != big_n:
        raise ValueError(f"sum(ncopies) over all ranks is {total}; it must equal N = {big_n}")
    before = table[: backend.rank, 3:].sum(0)
    return _Plan(layout, n, big_n, int(before[0]), int(before[1]), counts)
