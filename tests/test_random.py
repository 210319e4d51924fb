"""Tests for torchtree.core.random: keyed counter-based random numbers."""
from __future__ import annotations

import math

import numpy as np
import pytest
import torch

from torchtree.core.random import derive_seed, keyed_bits, keyed_uniform, seed_to_int

N = 100_000


def ks_statistic(u: torch.Tensor) -> float:
    """Kolmogorov-Smirnov distance of the sample to Uniform(0, 1)."""
    s, _ = torch.sort(u.double())
    n = s.numel()
    i = torch.arange(1, n + 1, dtype=torch.float64)
    return float(torch.maximum(i / n - s, s - (i - 1) / n).max())


# Asymptotic Kolmogorov critical value at alpha = 1e-3: sqrt(-log(alpha / 2) / 2) = 1.9495
KS_CRIT_1E3 = math.sqrt(-math.log(0.5e-3) / 2)


def chi2_sf(x: float, dof: int) -> float:
    return float(torch.special.gammaincc(torch.tensor(dof / 2, dtype=torch.float64), torch.tensor(x / 2, dtype=torch.float64)))


def test_open_interval_and_dtype():
    u = keyed_uniform(123, 4, torch.arange(N))
    assert u.dtype == torch.float64 and u.shape == (N,)
    assert float(u.min()) > 0.0 and float(u.max()) < 1.0
    v = keyed_uniform(123, 4, torch.arange(N), dtype=torch.float32)
    assert v.dtype == torch.float32
    assert float(v.min()) > 0.0 and float(v.max()) < 1.0
    assert torch.allclose(v.double(), u, atol=1e-7)


def test_deterministic():
    idx = torch.arange(5000)
    a = keyed_uniform(7, 3, idx, 1)
    b = keyed_uniform(7, 3, idx.clone(), 1)
    assert torch.equal(a, b)
    assert torch.equal(keyed_bits(7, 3, idx, torch.tensor(2)), keyed_bits(7, 3, idx, torch.tensor(2)))


def test_independent_of_batch_composition():
    """The draw of index i is the same alone, in any batch, in any order or shape."""
    full = keyed_uniform(42, 9, torch.arange(10_000), 1)
    g = torch.Generator().manual_seed(0)
    sub = torch.randint(0, 10_000, (777,), generator=g)
    assert torch.equal(keyed_uniform(42, 9, sub, 1), full[sub])
    perm = torch.randperm(10_000, generator=g)
    assert torch.equal(keyed_uniform(42, 9, perm, 1), full[perm])
    for i in (0, 1, 9999, 4321):
        assert torch.equal(keyed_uniform(42, 9, torch.tensor([i]), 1), full[i : i + 1])
        assert float(keyed_uniform(42, 9, torch.tensor(i), 1)) == float(full[i])
    assert torch.equal(keyed_uniform(42, 9, torch.arange(10_000).view(100, 100), 1), full.view(100, 100))
    # chunks concatenate to the whole
    parts = [keyed_uniform(42, 9, torch.arange(s, min(s + 3333, 10_000)), 1) for s in range(0, 10_000, 3333)]
    assert torch.equal(torch.cat(parts), full)
    # int32 indices give the same as int64
    assert torch.equal(keyed_uniform(42, 9, torch.arange(10_000, dtype=torch.int32), 1), full)


def test_slot_tensor_broadcasts_like_scalar_slots():
    idx = torch.arange(50)
    slots = torch.tensor([0, 1, 3, 17])
    grid = keyed_uniform(1, 2, idx[:, None], slots[None, :])
    assert grid.shape == (50, 4)
    for j, s in enumerate(slots.tolist()):
        assert torch.equal(grid[:, j], keyed_uniform(1, 2, idx, torch.tensor(s)))
        assert torch.equal(grid[:, j], keyed_uniform(1, 2, idx, s))
    per_elem = keyed_uniform(1, 2, idx, torch.arange(50))
    assert torch.equal(per_elem, torch.stack([keyed_uniform(1, 2, idx[i : i + 1], torch.tensor(i))[0] for i in range(50)]))


def test_int_slots_above_one():
    idx = torch.arange(10)
    assert torch.equal(keyed_uniform(1, 2, idx, 2), keyed_uniform(1, 2, idx, torch.tensor(2)))


def test_seed_stream_slot_change_the_draws():
    idx = torch.arange(20_000)
    base = keyed_uniform(5, 1, idx, 0)
    for other in (keyed_uniform(6, 1, idx, 0), keyed_uniform(5, 2, idx, 0), keyed_uniform(5, 1, idx, 1), keyed_uniform(5, 1, idx + 1, 0)):
        assert int((other == base).sum()) == 0
        # correlation of two independent uniform streams: sd 1/sqrt(n) = 0.007
        c = float(torch.corrcoef(torch.stack([base, other]))[0, 1])
        assert abs(c) < 0.035  # 5 sd; false-failure rate ~6e-7


def test_uniform_ks():
    """KS against Uniform(0, 1) on 100k draws, alpha = 1e-3 (false-failure rate)."""
    for seed, stream, slot in ((0, 0, 0), (2**62, 12345, 1), (99, 3, torch.tensor(1000))):
        u = keyed_uniform(seed, stream, torch.arange(N), slot)
        assert ks_statistic(u) * math.sqrt(N) < KS_CRIT_1E3
        assert float(u.mean()) == pytest.approx(0.5, abs=5 * math.sqrt(1 / 12 / N))


def test_ks_check_has_power():
    u = keyed_uniform(0, 0, torch.arange(N))
    assert ks_statistic(u ** 1.05) * math.sqrt(N) > KS_CRIT_1E3


def test_neighbouring_indices_and_slots_are_independent():
    """Chi-square on a 10 x 10 grid of pairs (u_i, u_{i+1}) and (slot 0, slot 1);
    alpha = 1e-3 each."""
    n = 50_000
    u = keyed_uniform(11, 0, torch.arange(n + 1))
    v0 = keyed_uniform(11, 0, torch.arange(n), 0)
    v1 = keyed_uniform(11, 0, torch.arange(n), 1)
    for a, b in ((u[:-1], u[1:]), (v0, v1)):
        cell = (a * 10).long() * 10 + (b * 10).long()
        counts = torch.bincount(cell, minlength=100).double()
        stat = float(((counts - n / 100) ** 2 / (n / 100)).sum())
        assert chi2_sf(stat, 99) > 1e-3


def test_bits_are_balanced():
    """Each of the 64 bits is set about half the time: 50k draws, |freq - 0.5| < 0.015
    (6.7 sd; 64 bits together false-fail with probability ~1e-9)."""
    bits = keyed_bits(3, 1, torch.arange(50_000))  # sd of a frequency: 0.0022
    assert bits.dtype == torch.int64
    freq = ((bits[:, None] >> torch.arange(64)) & 1).double().mean(0)
    assert (freq - 0.5).abs().max() < 0.015


def test_large_global_indices():
    idx = torch.tensor([2**40, 2**40 + 1, 2**62])
    u = keyed_uniform(0, 0, idx)
    assert ((u > 0) & (u < 1)).all() and len(set(u.tolist())) == 3


def test_float32_draws_never_round_to_one():
    # index found by search: its float64 draw is 0.99999998839...
    idx = torch.tensor([107591689])
    assert float(keyed_uniform(0, 0, idx)) < 1.0
    assert float(keyed_uniform(0, 0, idx, dtype=torch.float32)) < 1.0


# ------------------------------------------------------------- seeds
def test_derive_seed():
    a = derive_seed(123, 4, 5)
    assert a == derive_seed(123, 4, 5) and 0 <= a < 2**63
    assert len({derive_seed(123, 4, 5), derive_seed(123, 5, 4), derive_seed(124, 4, 5), derive_seed(123, 4), derive_seed(123)}) == 5


def test_seed_to_int():
    assert seed_to_int(5) == 5
    assert seed_to_int(2**63 - 1) == 2**63 - 1
    for bad in (-1, 2**63, 2**70 + 3):  # refused: masking them would alias another seed
        with pytest.raises(ValueError, match=r"\[0, 2\*\*63 - 1\]"):
            seed_to_int(bad)
    assert seed_to_int(np.int64(9)) == 9
    assert seed_to_int(True) == 1
    g1, g2 = torch.Generator().manual_seed(3), torch.Generator().manual_seed(3)
    assert seed_to_int(g1) == seed_to_int(g2)
    s = seed_to_int(None)
    assert 0 <= s < 2**62
    with pytest.raises(ValueError, match="seed"):
        seed_to_int("abc")
    with pytest.raises(ValueError, match="seed"):
        seed_to_int(object())


def test_derive_seed_matches_the_tensor_hash():
    # derive_seed runs on Python ints; it must give the bits of the int64 tensor hash
    from torchtree.kernels.hashing import GOLDEN, mix

    def tensor_derive(seed, *keys):
        t = torch.tensor([seed], dtype=torch.int64)
        for k in keys:
            t = mix(t * GOLDEN + int(k))
        return int(t.item()) & ((1 << 63) - 1)

    for seed in (0, 1, 12345, 2**62 + 7, 2**63 - 1):
        for keys in ((), (0,), (1, 2), (-5,), (2**40, 3, 9), (-(2**62), 7)):
            assert derive_seed(seed, *keys) == tensor_derive(seed, *keys), (seed, keys)


def test_keyed_uniforms_equal_one_stream_at_a_time():
    from torchtree.core.random import keyed_uniforms

    idx = torch.randint(0, 10**9, (500,), generator=torch.Generator().manual_seed(0))
    slot = torch.randint(0, 5000, (500,), generator=torch.Generator().manual_seed(1))
    streams = [0, 3, 17, -4, 2**33]
    for sl in (slot, 7):
        u = keyed_uniforms(42, streams, idx, sl)
        assert u.shape == (len(streams), 500)
        for row, s in zip(u, streams):
            assert torch.equal(row, keyed_uniform(42, s, idx, sl))


def _reference_uniforms(monkeypatch_ctx, fn, *args, **kwargs):
    """``fn(*args, **kwargs)`` with the compiled pass switched off: the int64 tensor hash."""
    import torchtree.core.random as R

    monkeypatch_ctx.setattr(R, "_compiled_uniforms", lambda *a: None)
    return fn(*args, **kwargs)


@pytest.mark.parametrize("case", ["scalar slot", "broadcast slot", "slot of more dimensions", "int32 index",
                                  "extreme keys", "extreme scalar slot", "negative scalar slot", "empty"])
def test_compiled_uniforms_equal_the_tensor_hash_bit_for_bit(monkeypatch, case):
    """On the CPU the keyed uniforms come from one compiled pass (``keyed_uniforms`` in torchtree.kernels); they
    are the tensor hash's numbers to the last bit, in every shape the samplers ask for."""
    from torchtree.core.random import _compiled_uniforms, keyed_uniforms
    from torchtree.kernels import native

    if not native.available():
        pytest.skip("compiled kernels unavailable")
    g = torch.Generator().manual_seed(0)
    index, slot = torch.randint(0, 10**6, (500,), generator=g), 3
    if case == "broadcast slot":  # (chain, 1, 1) keys against (tries, 2) slots, as BART's noise draws
        index, slot = torch.arange(5)[:, None, None], torch.arange(8).view(4, 2)
    elif case == "slot of more dimensions":  # the output takes the slots' extra dimensions
        index, slot = torch.tensor([0, 1, 7, 2**40 + 3, -5, 2**63 - 1]), torch.arange(6)[:, None].expand(6, 6)
    elif case == "extreme scalar slot":  # an int slot's product wraps as a tensor slot's
        slot = 2**63 - 1
    elif case == "negative scalar slot":
        slot = -(2**62) - 3
    elif case == "int32 index":
        index, slot = index.to(torch.int32), torch.randint(0, 50, (500,), generator=g).to(torch.int32)
    elif case == "extreme keys":  # wrap-around of the 64-bit products
        index = torch.tensor([0, 1, -1, 2**63 - 1, -2**63, 2**40 + 17])
        slot = torch.tensor([2**62, -5, 0, 1, 2**63 - 1, -2**63])
    elif case == "empty":
        index = torch.zeros(0, 3, dtype=torch.long)
    seed, streams = 2**62 + 12345, [0, 1, 7, 2**40]
    assert _compiled_uniforms([1], index, slot) is not None  # the compiled pass serves this call
    fast = keyed_uniforms(seed, streams, index, slot)
    fast1 = [keyed_uniform(seed, s, index, slot, dtype=dt) for s in streams for dt in (torch.float64, torch.float32)]
    with monkeypatch.context() as mp:
        ref = _reference_uniforms(mp, keyed_uniforms, seed, streams, index, slot)
        ref1 = [keyed_uniform(seed, s, index, slot, dtype=dt) for s in streams for dt in (torch.float64, torch.float32)]
    assert fast.shape == ref.shape and fast.dtype == ref.dtype == torch.float64
    assert torch.equal(fast, ref)
    for a, b in zip(fast1, ref1):
        assert a.dtype == b.dtype and torch.equal(a, b)


@pytest.mark.parametrize("route", ["compiled", "tensor hash"])
def test_a_slot_outside_int64_is_refused_on_either_route(monkeypatch, route):
    """An int slot is wrapped like an int64 tensor's product, so one that is no int64 is refused, as an int64
    tensor of it would be (the CPU's compiled pass and the tensor hash of a GPU run agree)."""
    import torchtree.core.random as R

    if route == "tensor hash":
        monkeypatch.setattr(R, "_compiled_uniforms", lambda *a: None)
    for slot in (2**63, -(2**63) - 1):
        with pytest.raises((OverflowError, RuntimeError, ValueError)):
            R.keyed_uniforms(1, [2], torch.arange(5), slot)
        with pytest.raises((OverflowError, RuntimeError, ValueError)):
            R.keyed_uniform(1, 2, torch.arange(5), slot)
    assert R.keyed_uniforms(1, [2], torch.arange(5), 2**63 - 1).shape == (1, 5)
