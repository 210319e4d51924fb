"""Helpers shared by the backends: turning a list of row blocks into one send buffer and back."""

from __future__ import annotations

import math
from typing import Sequence

import torch


def as_one_buffer(tensors: Sequence[torch.Tensor]) -> tuple[torch.Tensor, list[int], torch.Tensor]:
    """View (or copy) a list of row blocks as one 2-D buffer.

    Parameters
    ----------
    tensors : sequence of Tensors, shapes ``[m_d, *S]`` with one dtype and one ``S``

    Returns
    -------
    flat : Tensor, shape ``[sum m_d, prod(S)]``
        A view without copying when the blocks are consecutive slices of one contiguous
        buffer (what the redistribution passes), else a concatenated copy.
    sizes : list of int, the ``m_d``
    like : Tensor, ``tensors[0]`` (dtype, trailing shape and device of the results)
    """
    if not tensors:
        raise ValueError("need at least one tensor")
    like = tensors[0]
    if like.dim() < 1:
        raise ValueError("all_to_all tensors need a leading (row) dimension")
    trail = tuple(like.shape[1:])
    for t in tensors:
        if t.dtype != like.dtype or tuple(t.shape[1:]) != trail or t.device != like.device:
            raise ValueError(
                "all_to_all tensors must share dtype, device and trailing shape: "
                f"{like.dtype}{list(like.shape)} vs {t.dtype}{list(t.shape)}"
            )
    sizes = [int(t.shape[0]) for t in tensors]
    row = math.prod(trail)
    total = sum(sizes)
    if _consecutive(tensors):
        first = next(t for t in tensors if t.numel())
        flat = torch.empty(0, dtype=like.dtype, device=like.device).set_(
            first.untyped_storage(), first.storage_offset(), (total, row), (row, 1)
        )
        return flat, sizes, like
    flat = torch.cat([t.reshape(t.shape[0], row) for t in tensors], 0) if total else like.new_empty((0, row))
    return flat, sizes, like


def _consecutive(tensors: Sequence[torch.Tensor]) -> bool:
    """True when the non-empty blocks are contiguous and follow each other in one storage."""
    nonempty = [t for t in tensors if t.numel()]
    if not nonempty:
        return False
    ptr = None
    storage = nonempty[0].untyped_storage().data_ptr()
    for t in nonempty:
        if not t.is_contiguous() or t.untyped_storage().data_ptr() != storage:
            return False
        if ptr is not None and t.data_ptr() != ptr:
            return False
        ptr = t.data_ptr() + t.numel() * t.element_size()
    return True


def split_rows(flat: torch.Tensor, sizes: Sequence[int], like: torch.Tensor) -> list[torch.Tensor]:
    """Split a ``[sum m, prod(S)]`` buffer into views of shapes ``[m, *S]``."""
    trail = tuple(like.shape[1:])
    return [p.reshape((int(m),) + trail) for p, m in zip(flat.split(list(sizes), 0), sizes)]
