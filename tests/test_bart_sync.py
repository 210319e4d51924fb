"""BART's sweeps never read a device value back to the host (the condition for running ahead of the
GPU and for capturing a sweep in a CUDA graph), counted on the CPU.

:class:`torchtree.core.syncs.HostReads` sees every torch call a sweep makes and counts those that wait
for a device (reads back, and ops whose output shape depends on values). On the CPU the sampler takes one such read per
sweep (the deepest node, to draw fewer leaf normals); off the CPU it must take none, so the tests
turn the CPU's allowance off (``_may_sync``) and the CPU's compiled random numbers (the GPU's tensor hash
instead), and require zero reads per sweep (a copy of a host value to the device counts), one per group of
``COMPACT_EVERY`` kept sweeps, and the very same draws as the run with the allowance.
"""
from __future__ import annotations

import numpy as np
import pytest
import torch

from torchtree import BART, Data
from torchtree.core.syncs import HostReads
import torchtree.core.random as random_module
import torchtree.samplers.bart.sampler as bart_sampler


def _run_counting(monkeypatch, data, **kw):
    """A run with every sweep counted; returns (posterior, [(step, Counter)])."""
    step, per_sweep = bart_sampler.BART.step, []

    def counted(self, state, ctx):
        before = len(state.kept)
        with HostReads() as mode:
            out = step(self, state, ctx)
        per_sweep.append((len(state.kept) > before and len(state.kept) % bart_sampler.COMPACT_EVERY == 0,
                          mode.reads))
        return out

    monkeypatch.setattr(bart_sampler.BART, "step", counted)
    post = BART(**kw).run(data, seed=3)
    monkeypatch.setattr(bart_sampler.BART, "step", step)
    return post, per_sweep


def _data(task):
    g = np.random.default_rng(0)
    X = g.uniform(size=(120, 4))
    f = 2 * X[:, 0] - X[:, 1]
    y = f + 0.3 * g.normal(size=120) if task == "regression" else (f + 0.3 * g.normal(size=120) > 0.5).astype(int)
    return Data(X, y, task=task)


@pytest.mark.parametrize("task", ["regression", "classification"])
def test_sweeps_read_nothing_back_and_draw_the_same(monkeypatch, task):
    data = _data(task)
    kw = dict(n_trees=12, n_chains=2, n_warmup=5, n_samples=2 * bart_sampler.COMPACT_EVERY + 3, compile="off")
    ref = BART(**kw).run(data, seed=3)
    monkeypatch.setattr(bart_sampler, "_may_sync", lambda device: False)
    # the keyed uniforms by the tensor hash, as on a GPU (the CPU's compiled pass gives the same bits)
    monkeypatch.setattr(random_module, "_compiled_uniforms", lambda *a: None)
    post, per_sweep = _run_counting(monkeypatch, data, **kw)
    assert len(per_sweep) == kw["n_warmup"] + kw["n_samples"]
    for compacting, reads in per_sweep:
        if compacting:  # the group's depths, read at once
            assert reads == {"tolist": 1}, reads
        else:
            assert not reads, reads
    assert sum(c for c, _ in per_sweep) == 2
    assert torch.equal(post.latent_draws(data.X), ref.latent_draws(data.X))
    if task == "regression":
        assert torch.equal(post.sigma, ref.sigma)


def test_the_cpu_allowance_is_the_one_read_per_sweep(monkeypatch):
    """Without the test's switch, the CPU run reads the deepest node once per sweep (and nothing else):
    the counter sees reads, so the zero above is not an artefact of the counting."""
    kw = dict(n_trees=12, n_chains=2, n_warmup=3, n_samples=3, compile="off")
    _, per_sweep = _run_counting(monkeypatch, _data("regression"), **kw)
    for _, reads in per_sweep:
        assert reads == {"nonzero": 1, "__int__": 1}, reads


def test_kept_sweeps_are_trimmed_to_their_deepest_level():
    """``_compact`` cuts each kept sweep to the complete levels down to its deepest used slot, reading
    the depths of the whole group at once, and keeps every used slot."""
    ABSENT, K = bart_sampler.ABSENT, 31
    sweeps = []
    for deepest in (0, 2, 9, 30):  # slots 0, 2, 9, 30: depths 0, 1, 3, 4
        f = torch.full((2, 3, K), ABSENT, dtype=torch.int16)
        f[:, :, 0] = bart_sampler.LEAF
        f[1, 2, deepest] = 1
        sweeps.append((f, torch.ones_like(f), torch.arange(K, dtype=torch.float32).expand(2, 3, K).clone()))
    kept = [tuple(x.clone() for x in s) for s in sweeps]
    with HostReads() as mode:
        bart_sampler._compact(kept, 1)
    assert mode.reads == {"tolist": 1}
    assert [k[0].shape[-1] for k in kept] == [K, 3, 15, 31]  # the first is before ``start``: untouched
    for full, cut in zip(sweeps, kept):
        w = cut[0].shape[-1]
        assert all(torch.equal(a[..., :w], b) for a, b in zip(full, cut))
        assert (full[0][..., w:] == ABSENT).all()


def test_a_tree_update_dispatches_a_bounded_number_of_kernels(monkeypatch):
    """Off the CPU a sweep costs its kernel launches (eager, or the nodes of a recorded CUDA graph), so
    the torch tree update's kernel-launching operations are counted (:class:`DeviceOps`): 282 per update
    when written, bounded at 300 so that a change adding launches to every update of every sweep shows here."""
    from torchtree.core.syncs import DeviceOps

    calls, mode = [], DeviceOps()
    update = bart_sampler.tree_update

    def counted(*args, **kwargs):
        calls.append(1)
        with mode:
            return update(*args, **kwargs)

    monkeypatch.setattr(bart_sampler, "tree_update", counted)
    for task in ("regression", "classification"):
        calls[:], mode.ops = [], mode.ops.__class__()
        BART(n_trees=5, n_chains=4, n_warmup=4, n_samples=4, compile="off").run(_data(task), seed=0)
        assert len(calls) == 5 * 8
        assert 150 < mode.total / len(calls) <= 300, mode.total / len(calls)
