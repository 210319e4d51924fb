"""BART checkpoints keep the kept sweeps as ragged trees (``pack_kept``): bit for bit, a fraction of the
dense size, each trimmed group packed once. A QA pass found a 20-tree run's checkpoint 4x its posterior
file, every kept tree stored at the width of its sweep's deepest one."""
from __future__ import annotations

import os

import numpy as np
import pytest
import torch

from torchtree import BART, Data
from torchtree.model.bart import ABSENT, LEAF
from torchtree.monitor import CallbackMonitor
from torchtree.samplers.bart.state import COMPACT_EVERY, pack_kept, unpack_kept


def _sweep(g, C, T, w):
    """A kept sweep's trees [C, T, w]: a few nodes near the root, and a cut left behind in an absent slot."""
    f = torch.full((C, T, w), ABSENT, dtype=torch.int16)
    f[..., 0] = LEAF
    grown = torch.rand(C, T, generator=g) < 0.5
    f[..., 0][grown] = 1
    if w >= 3:
        f[..., 1][grown], f[..., 2][grown] = LEAF, LEAF
    cut = torch.where(f >= 0, torch.randint(1, 9, (C, T, w), generator=g, dtype=torch.int16), 0).to(torch.int16)
    cut[0, 0, w - 1] = 5  # junk in an absent slot: kept too
    value = torch.where(f == LEAF, torch.randn(C, T, w, generator=g), torch.zeros(()))
    value[0, 1, w - 1] = -0.0  # a signed zero in an absent slot: its sign bit too
    return f, cut, value


def test_pack_and_unpack_give_back_every_sweep_bit_for_bit():
    g = torch.Generator().manual_seed(0)
    kept = [_sweep(g, 3, 5, w) for w in (7, 1, 63, 7, 15, 63, 3)]
    packed = pack_kept(kept)
    back = unpack_kept(packed)
    assert len(back) == len(kept)
    for a, b in zip(kept, back):
        for x, y in zip(a, b):
            assert x.shape == y.shape and x.dtype == y.dtype and torch.equal(x, y)
            assert torch.equal(torch.signbit(x.float()), torch.signbit(y.float()))
    dense = sum(x.numel() for k in kept for x in k)
    assert packed["feature"].numel() < dense / 3 / 3  # the ragged slots: far fewer than the dense ones
    assert unpack_kept(pack_kept([])) == []


def test_a_resumed_run_equals_the_uninterrupted_one_and_its_checkpoint_is_small(tmp_path):
    """Stopped at the save after sweep 40 of 60 (two trimmed groups and a partial one packed), resumed: the same posterior
    as a run without checkpoints; the checkpoint holds the kept trees in under a third of their dense bytes."""
    rng = np.random.default_rng(0)
    X = rng.uniform(size=(150, 4))
    data = Data(X, 10 * X[:, 0] + rng.normal(size=150), task="regression")
    kw = dict(n_trees=15, n_chains=2, n_warmup=10, n_samples=50)
    want = BART(**kw).run(data, seed=4)
    ck = str(tmp_path / "b.ckpt")

    class Stop(Exception):
        pass

    def hook(step):
        if step >= 40:
            raise Stop

    with pytest.raises(Stop):
        BART(**kw, checkpoint=ck, checkpoint_every=5).run(data, seed=4, monitor=CallbackMonitor(on_checkpoint=hook))
    saved = torch.load(ck, weights_only=True)["state"]["sampler_state"]["state"]["kept"]
    chunks = saved["chunks"]
    kept = [k for c in chunks for k in unpack_kept(c)]
    # the save of sweep 44: 35 kept, two trimmed groups (packed once each) and the partial one
    assert len(kept) == 35 and len(chunks) == len(kept) // COMPACT_EVERY + 1
    dense = sum(x.numel() * x.element_size() for k in kept for x in k)
    stored = sum(c[n].numel() * c[n].element_size() for c in chunks for n in ("feature", "cut", "value"))
    assert stored < dense / 3
    got = BART(**kw, checkpoint=ck, checkpoint_every=5).run(data, seed=4)
    assert torch.equal(got.value, want.value) and torch.equal(got.feature, want.feature)
    assert torch.equal(got.sigma, want.sigma)
    assert os.path.getsize(ck) > 0
