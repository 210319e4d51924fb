"""Counter-based random numbers keyed by (seed, stream, particle, slot).

The samplers draw every random number that belongs to a particle from a hash of
the seed, the stage, the particle's *global* index and a slot. The same seed
then gives the same particles whether the particles live on 1 rank or 8, in one
batch or in chunks, on CPU or CUDA (integer arithmetic is exact everywhere).

The hash is SplitMix64's finaliser applied to a mixed key; its output is
equidistributed and passes BigCrush when used as a counter-based generator.
"""
from __future__ import annotations

import torch

__all__ = ["keyed_bits", "keyed_uniform", "keyed_uniforms", "seed_to_int", "derive_seed"]

from torchtree.kernels.hashing import GOLDEN as _GOLDEN
from torchtree.kernels.hashing import mix as _mix
from torchtree.kernels.hashing import srl as _srl
from torchtree.kernels import native as _native


def seed_to_int(seed: int | torch.Generator | None) -> int:
    """Turn ``seed`` (int in ``[0, 2**63 - 1]``, None or a ``torch.Generator``) into a 63-bit int.

    Raises
    ------
    ValueError
        ``seed`` is not an int, None or a generator, or an int outside ``[0, 2**63 - 1]`` (it would
        alias a seed inside: ``2**63 + 3`` would run as ``3``).
    """
    if seed is None:
        return int(torch.randint(0, 2**62, (1,)).item())
    if isinstance(seed, torch.Generator):
        return int(torch.randint(0, 2**62, (1,), generator=seed).item())
    if isinstance(seed, bool) or not isinstance(seed, int):
        try:
            seed = int(seed)
        except (TypeError, ValueError) as exc:
            raise ValueError(f"seed must be an int, None or a torch.Generator, got {seed!r}") from exc
    if not 0 <= seed < (1 << 63):
        raise ValueError(f"seed must be an int in [0, 2**63 - 1], got {seed}: seeds are 63-bit, and a negative or "
                         "larger one would run as another seed")
    return int(seed)  # a plain int (subclasses such as the driver's DrawnSeed do not go into checkpoints)


_MASK64 = (1 << 64) - 1


def _mix_int(z: int) -> int:
    """:func:`torchtree.kernels.hashing.mix` on one unsigned 64-bit Python int (same bits)."""
    z = ((z ^ (z >> 30)) * 0xBF58476D1CE4E5B9) & _MASK64
    z = ((z ^ (z >> 27)) * 0x94D049BB133111EB) & _MASK64
    return z ^ (z >> 31)


def derive_seed(seed: int, *keys: int) -> int:
    """A new 63-bit seed from ``seed`` and integer ``keys`` (pure function).

    Computed on Python ints with 64-bit wrap-around, bit for bit what the tensor hash gives
    (a scalar tensor round trip per call cost more than the draws it keys)."""
    z = int(seed) & _MASK64
    for k in keys:
        z = _mix_int((z * (_GOLDEN & _MASK64) + int(k)) & _MASK64)
    return z & ((1 << 63) - 1)


def keyed_bits(seed: int, stream: int, index: torch.Tensor, slot: int | torch.Tensor = 0) -> torch.Tensor:
    """64 pseudo-random bits per element of ``index``.

    Parameters
    ----------
    seed : int
        Run seed.
    stream : int
        Which use this is (e.g. the stage number times a purpose code).
    index : LongTensor [...]
        Global particle (or node) index; the output has its shape and device.
    slot : int or LongTensor broadcastable to ``index``
        Which draw of that particle.

    Returns
    -------
    LongTensor [...] of int64 bits.
    """
    base = derive_seed(seed, stream)
    z = index.to(torch.int64) * _GOLDEN + base
    z = _mix(z)
    return _mix(z + _slot_term(slot))


def _slot_term(slot: int | torch.Tensor):
    """``slot * GOLDEN + 0x632BE5AB`` with int64 wrap-around: an int64 tensor for a tensor slot, else a Python
    int wrapped to int64 here (no host-to-device copy of a scalar tensor, which synchronises on CUDA)."""
    if isinstance(slot, torch.Tensor):
        return slot.to(torch.int64) * _GOLDEN + 0x632BE5AB
    if not -(1 << 63) <= int(slot) < 1 << 63:  # as an int64 tensor of it would (and the CPU's compiled pass does)
        raise OverflowError(f"keyed random numbers: slot {int(slot)} is outside int64")
    t = (int(slot) * _GOLDEN + 0x632BE5AB) & _MASK64
    return t - (1 << 64) if t >= 1 << 63 else t


def keyed_uniforms(seed: int, streams, index: torch.Tensor, slot: int | torch.Tensor = 0) -> torch.Tensor:
    """:func:`keyed_uniform` (float64) for several streams in one hash pass.

    Parameters
    ----------
    seed : int
    streams : sequence of int, length K
    index, slot : see :func:`keyed_bits`

    Returns
    -------
    Tensor [K, ...] float64: row k equals ``keyed_uniform(seed, streams[k], index, slot)``.
    """
    bases = [derive_seed(seed, int(s)) for s in streams]
    fast = _compiled_uniforms(bases, index, slot)
    if fast is not None:
        return fast
    idx = index.to(torch.int64)
    if isinstance(slot, torch.Tensor):  # the output's shape: index and slot broadcast (as the compiled pass)
        idx, slot = torch.broadcast_tensors(idx, slot)
    # one fill per stream, not a tensor made from a list (a host-to-device copy, which synchronises on CUDA)
    base = torch.stack([torch.full((), b, dtype=torch.int64, device=idx.device) for b in bases])
    z = _mix(idx * _GOLDEN + base.view(-1, *([1] * idx.dim())))
    bits = _srl(_mix(z + _slot_term(slot)), 11)
    u = (bits.to(torch.float64) + 0.5) * (1.0 / 9007199254740992.0)
    return u.clamp_(max=1.0 - torch.finfo(torch.float64).eps / 2)


def keyed_uniform(
    seed: int,
    stream: int,
    index: torch.Tensor,
    slot: int | torch.Tensor = 0,
    dtype: torch.dtype = torch.float64,
) -> torch.Tensor:
    """Uniform draws in the open interval (0, 1), one per element of ``index``.

    Parameters
    ----------
    seed, stream, index, slot
        See :func:`keyed_bits`.
    dtype : torch.dtype
        float64 (53 random bits) or float32.

    Returns
    -------
    Tensor [...] of ``dtype`` on ``index.device``.
    """
    u = _compiled_uniforms([derive_seed(seed, stream)], index, slot)
    if u is not None:  # float64, already below 1: the narrower dtype's rounding is handled below
        u = u[0]
    else:
        bits = _srl(keyed_bits(seed, stream, index, slot), 11)  # 53 bits
        u = (bits.to(torch.float64) + 0.5) * (1.0 / 9007199254740992.0)
    # Rounding to a narrower dtype can reach 1.0; keep the interval open.
    return u.to(dtype).clamp_(max=1.0 - torch.finfo(dtype).eps / 2)


def _compiled_uniforms(bases, index: torch.Tensor, slot):
    """``[K, *shape]`` float64 uniforms of the streams whose derived seeds are ``bases``, by the compiled
    ``keyed_uniforms`` pass (the same bits as the tensor hash above; ``shape``: index and slot broadcast);
    None off the CPU or without the compiled kernels."""
    if index.device.type != "cpu" or (isinstance(slot, torch.Tensor) and slot.device.type != "cpu"):
        return None
    op = _native.op("keyed_uniforms")
    if op is None:
        return None
    st = slot.to(torch.int64) if isinstance(slot, torch.Tensor) else torch.tensor(int(slot), dtype=torch.int64)
    idx, st = torch.broadcast_tensors(index.to(torch.int64), st)
    shape = idx.shape
    out = op(torch.tensor(bases, dtype=torch.int64), idx.reshape(-1), st.reshape(-1))  # derived seeds fit 63 bits
    return out.view(len(bases), *shape)
