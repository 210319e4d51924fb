"""Particle blocks: ``dict[str, Tensor]`` whose tensors all share the leading dimension P.

A block is how redistribution sees a particle set: ``HardTrees.as_dict()`` gives one (per-node
fields ``[P, C]`` or ``[P, C, S]``, per-tree fields ``[P]``) and ``HardTrees.from_dict`` takes
one back. Nothing here knows about trees; the only tree-shaped notion is the *capacity*, the
size of dim 1 of the per-node fields, which may differ between ranks and must be made equal
(:func:`harmonize_capacity`) before rows can travel as fixed-size messages (paper 002, Alg. 6
steps 1-2: "Max" and "Pad").

For the wire, :class:`BlockLayout` packs every row of a block into one int64 row of ``words``
8-byte words (each field starts on an 8-byte boundary), so a particle with all its fields is one
row that a single ``index_select`` or a single message moves.
"""

from __future__ import annotations

import hashlib
import math
from typing import Callable, Iterable, Mapping

import torch

__all__ = [
    "block_rows",
    "take_rows",
    "block_capacity",
    "pad_block",
    "agree_capacity",
    "harmonize_capacity",
    "BlockLayout",
    "Workspace",
]

Block = dict[str, torch.Tensor]


def block_rows(block: Mapping[str, torch.Tensor]) -> int:
    """Number of particles in a block, after checking that it is one.

    Parameters
    ----------
    block : mapping str -> Tensor, each of shape ``[P, ...]``

    Returns
    -------
    int, P

    Raises
    ------
    ValueError
        Empty block, a value that is not a tensor or is 0-dimensional, unequal leading
        dimensions, or tensors on different devices.
    """
    if not isinstance(block, Mapping) or not block:
        raise ValueError("a particle block is a non-empty dict of tensors")
    rows, device = None, None
    for key, t in block.items():
        if not isinstance(key, str):
            raise ValueError(f"block keys must be str, got {key!r}")
        if not isinstance(t, torch.Tensor):
            raise ValueError(f"block[{key!r}] is {type(t).__name__}, not a Tensor")
        if t.dim() == 0:
            raise ValueError(f"block[{key!r}] is 0-dimensional; per-particle fields need a leading dim")
        if rows is None:
            rows, device = t.shape[0], t.device
        elif t.shape[0] != rows:
            raise ValueError(f"block[{key!r}] has {t.shape[0]} rows, other fields have {rows}")
        elif t.device != device:
            raise ValueError(f"block[{key!r}] is on {t.device}, other fields on {device}")
    return int(rows)


def take_rows(block: Mapping[str, torch.Tensor], index: torch.Tensor) -> Block:
    """Gather particles: ``out[k] = block[k][index]`` for every field.

    Parameters
    ----------
    block : mapping str -> Tensor ``[P, ...]``
    index : LongTensor ``[M]`` with values in ``[0, P)``

    Returns
    -------
    dict str -> Tensor ``[M, ...]`` (new, contiguous tensors)
    """
    return {k: v.index_select(0, index.to(v.device)) for k, v in block.items()}


def block_capacity(block: Mapping[str, torch.Tensor], node_keys: Iterable[str]) -> int:
    """The common size of dim 1 of the per-node fields.

    Parameters
    ----------
    block : mapping str -> Tensor
    node_keys : iterable of str
        Fields whose dim 1 is the node dimension (``[P, C]`` or ``[P, C, S]``).

    Returns
    -------
    int, C

    Raises
    ------
    ValueError
        A key is missing, has no dim 1, or the node fields disagree on C.
    """
    caps = {}
    for k in node_keys:
        if k not in block:
            raise ValueError(f"node key {k!r} not in block (keys: {sorted(block)})")
        if block[k].dim() < 2:
            raise ValueError(f"node field {k!r} has shape {list(block[k].shape)}; expected [P, C, ...]")
        caps[k] = int(block[k].shape[1])
    if not caps:
        raise ValueError("node_keys is empty")
    if len(set(caps.values())) != 1:
        raise ValueError(f"node fields disagree on capacity: {caps}")
    return next(iter(caps.values()))


def pad_block(
    block: Mapping[str, torch.Tensor],
    capacity: int,
    node_keys: Iterable[str],
    fill: float | int | bool | Mapping[str, float | int | bool] = 0,
) -> Block:
    """Pad the node dimension (dim 1) of the listed fields up to ``capacity``.

    Parameters
    ----------
    block : mapping str -> Tensor
        Per-node fields ``[P, C, ...]``; other fields are passed through unchanged.
    capacity : int
        Target C' >= C.
    node_keys : iterable of str
        Fields to pad.
    fill : scalar or mapping str -> scalar
        Value of the new nodes; choose one the model reads as "no node" (e.g. -1 for
        ``feature``/``left``/``right``, the *unused* status code, 0 for statistics).

    Returns
    -------
    dict str -> Tensor
        Padded fields are new tensors ``[P, capacity, ...]``; the others are the input objects.

    Raises
    ------
    ValueError
        ``capacity`` smaller than a field's C (this helper never truncates).
    """
    out = dict(block)
    for k in node_keys:
        t = block[k]
        if t.dim() < 2:
            raise ValueError(f"node field {k!r} has shape {list(t.shape)}; expected [P, C, ...]")
        c = t.shape[1]
        if capacity < c:
            raise ValueError(f"cannot pad {k!r} from capacity {c} down to {capacity}")
        if capacity == c:
            continue
        value = fill[k] if isinstance(fill, Mapping) else fill
        shape = (t.shape[0], capacity) + tuple(t.shape[2:])
        padded = torch.full(shape, value, dtype=t.dtype, device=t.device)
        padded[:, :c] = t
        out[k] = padded
    return out


def agree_capacity(capacity: int, backend) -> int:
    """Maximum of the ranks' capacities (one ``all_reduce(max)``; Alg. 6 step 1).

    Parameters
    ----------
    capacity : int
        This rank's C.
    backend : Backend

    Returns
    -------
    int
        The largest C over all ranks (identical on every rank).

    Raises
    ------
    CollectiveError, CollectiveTimeout
        A peer died, raised, or did not answer within the backend's timeout.
    """
    return int(backend.all_reduce(torch.tensor([int(capacity)], dtype=torch.int64), "max").item())


def harmonize_capacity(
    block: Mapping[str, torch.Tensor],
    backend,
    *,
    node_keys: Iterable[str] | None = None,
    fill: float | int | bool | Mapping[str, float | int | bool] = 0,
    pad: Callable[[Block, int], Block] | None = None,
    capacity: int | None = None,
) -> tuple[Block, int]:
    """Agree on the largest capacity across ranks and pad this rank's block to it.

    Call this on every rank before distributed redistribution when tree capacities may differ.

    Parameters
    ----------
    block : mapping str -> Tensor
    backend : Backend
    node_keys : iterable of str, optional
        Per-node fields; used to read this rank's capacity and, without ``pad``, to pad
        with :func:`pad_block`.
    fill : scalar or mapping
        Fill values for :func:`pad_block`.
    pad : callable ``(block, capacity) -> block``, optional
        Model-aware padding, e.g.
        ``lambda d, c: HardTrees.from_dict(d).with_capacity(c).as_dict()``.
    capacity : int, optional
        This rank's capacity, if it is not readable from ``node_keys``.

    Returns
    -------
    block : dict str -> Tensor
        This rank's block, padded to the common capacity.
    capacity : int
        The common capacity.

    Raises
    ------
    ValueError
        Neither ``node_keys`` nor ``capacity`` given, ``capacity`` given without ``node_keys``
        or ``pad``, or node fields that :func:`block_capacity` rejects.
    CollectiveError, CollectiveTimeout
        A peer died, raised, or did not answer within the backend's timeout.
    """
    if capacity is None:
        if node_keys is None:
            raise ValueError("give node_keys or capacity")
        node_keys = list(node_keys)
        capacity = block_capacity(block, node_keys)
    common = agree_capacity(capacity, backend)
    if pad is not None:
        return dict(pad(dict(block), common)), common
    if node_keys is None:
        raise ValueError("padding without a pad callable needs node_keys")
    return pad_block(block, common, node_keys, fill), common


class BlockLayout:
    """Byte layout of one particle (one row of every field) packed into 8-byte words.

    Parameters
    ----------
    block : mapping str -> Tensor ``[P, ...]``
        Fields are laid out in sorted key order; each starts on an 8-byte boundary so that it
        can be viewed in its own dtype inside the packed buffer without copying.

    Attributes
    ----------
    fields : tuple of (key, dtype, trailing shape, byte offset, byte count)
    words : int
        Row width of the packed buffer in int64 words.

    Raises
    ------
    ValueError
        ``block`` is not a valid particle block (see :func:`block_rows`).
    """

    def __init__(self, block: Mapping[str, torch.Tensor]):
        block_rows(block)
        fields, offset = [], 0
        for key in sorted(block):
            t = block[key]
            shape = tuple(t.shape[1:])
            nbytes = math.prod(shape) * t.element_size()
            fields.append((key, t.dtype, shape, offset, nbytes))
            offset += -(-nbytes // 8) * 8
        self.fields = tuple(fields)
        self.words = offset // 8

    def signature(self) -> str:
        """Canonical text of the layout (keys, dtypes, trailing shapes) for cross-rank checks."""
        return ";".join(f"{k}:{str(d)}:{list(s)}" for k, d, s, _, _ in self.fields)

    def signature_hash(self) -> int:
        """A 56-bit hash of :meth:`signature`, to compare layouts across ranks in one reduce."""
        return int.from_bytes(hashlib.blake2b(self.signature().encode(), digest_size=7).digest(), "little")

    def _field_view(self, buf: torch.Tensor, key_dtype_shape_off_n) -> torch.Tensor:
        """A typed, zero-copy view ``[rows, *shape]`` of one field inside an int64 buffer."""
        _, dtype, shape, off, nbytes = key_dtype_shape_off_n
        raw = buf.view(torch.uint8)[:, off : off + nbytes]
        # .view, not .reshape: a silent copy here would make pack() write into a temporary.
        return raw.view(dtype).view((buf.shape[0],) + shape)

    def pack(
        self,
        block: Mapping[str, torch.Tensor],
        *,
        index: torch.Tensor | None = None,
        extra_words: int = 0,
        out: torch.Tensor | None = None,
    ) -> torch.Tensor:
        """Pack (optionally a subset of) the particles into one int64 buffer.

        Parameters
        ----------
        block : mapping str -> Tensor ``[P, ...]`` with this layout
        index : LongTensor ``[M]``, optional
            Rows to pack, in this order (default: all P rows).
        extra_words : int
            Trailing int64 columns left for the caller's per-row metadata (not initialised).
        out : LongTensor ``[M, words + extra_words]``, optional
            Buffer to pack into (e.g. from a :class:`Workspace`).

        Returns
        -------
        LongTensor ``[M, words + extra_words]``
        """
        first = block[self.fields[0][0]]
        rows = first.shape[0] if index is None else int(index.numel())
        shape = (rows, self.words + extra_words)
        if out is None:
            buf = torch.empty(shape, dtype=torch.int64, device=first.device)
        else:
            if out.dtype != torch.int64 or tuple(out.shape) != shape or not out.is_contiguous():
                raise ValueError(f"pack out= must be a contiguous int64 tensor of shape {list(shape)}")
            buf = out
        raw = buf.view(torch.uint8)
        for f in self.fields:
            src = block[f[0]]
            view = self._field_view(buf, f)
            if index is None:
                view.copy_(src)
            else:  # gathers straight into the strided field view: no temporary
                torch.index_select(src, 0, index, out=view)
            gap = -(-f[4] // 8) * 8 - f[4]
            if gap:  # zero the alignment bytes so messages are reproducible byte for byte
                raw[:, f[3] + f[4] : f[3] + f[4] + gap].zero_()
        return buf

    def empty(self, rows: int, device: torch.device | str = "cpu") -> Block:
        """An uninitialised block of ``rows`` particles with this layout.

        Returns
        -------
        dict str -> Tensor ``[rows, ...]``
        """
        return {k: torch.empty((rows,) + shape, dtype=dtype, device=device) for k, dtype, shape, _, _ in self.fields}

    def unpack(
        self,
        buf: torch.Tensor,
        index: torch.Tensor | None = None,
        out: Mapping[str, torch.Tensor] | None = None,
    ) -> Block:
        """Unpack rows of a packed buffer back into a block.

        Parameters
        ----------
        buf : LongTensor ``[R, >= words]`` made by :meth:`pack` (extra columns are ignored)
        index : LongTensor ``[M]``, optional
            Rows to take, in this order (the redistribution's ancestor indices).
        out : mapping str -> Tensor ``[M, ...]``, optional
            Contiguous buffers to write into instead of allocating.

        Returns
        -------
        dict str -> Tensor ``[M, ...]``, contiguous, with the original dtypes and shapes
        """
        if out is not None:
            for f in self.fields:
                view = self._field_view(buf, f)
                if index is None:
                    out[f[0]].copy_(view)
                else:
                    torch.index_select(view, 0, index, out=out[f[0]])
            return dict(out)
        # Gather whole int64 rows once, then split: much faster than field-by-field gathers
        # when the result has to be freshly allocated anyway.
        rows = buf if index is None else buf.index_select(0, index)
        return {f[0]: self._field_view(rows, f).contiguous() for f in self.fields}


class Workspace:
    """Scratch buffers reused across redistribution calls (keep one per particle population).

    Allocating hundreds of MB of fresh CPU memory per resampling step costs page faults and
    kernel zeroing that can exceed the copying itself. Passing the same workspace to every
    :func:`~torchtree.distributed.redistribute` call lets the packed send/receive buffers be
    reused; together with ``out=`` (double-buffered populations) a step allocates almost
    nothing. A buffer only grows; :meth:`clear` releases everything.

    Not thread-safe; one workspace per concurrent caller.
    """

    def __init__(self) -> None:
        self._flat: dict[str, torch.Tensor] = {}

    def buffer(self, name: str, shape: tuple[int, ...], dtype: torch.dtype, device) -> torch.Tensor:
        """A contiguous tensor of ``shape`` backed by the cached storage called ``name``.

        Parameters
        ----------
        name : str
            Which scratch slot (different names never alias).
        shape : tuple of int
        dtype : torch.dtype
        device : torch.device or str

        Returns
        -------
        Tensor of ``shape`` (contents unspecified)
        """
        numel = math.prod(shape)
        flat = self._flat.get(name)
        if flat is None or flat.dtype != dtype or flat.device != torch.device(device) or flat.numel() < numel:
            flat = torch.empty(max(numel, 1), dtype=dtype, device=device)
            self._flat[name] = flat
        return flat[:numel].view(shape)

    @property
    def nbytes(self) -> int:
        """Bytes currently held."""
        return sum(t.numel() * t.element_size() for t in self._flat.values())

    def clear(self) -> None:
        """Drop every cached buffer."""
        self._flat.clear()
