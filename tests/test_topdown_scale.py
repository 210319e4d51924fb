"""Top-down SMC on large data: a stage's per-node temporaries are built in batches of nodes.

``torchtree.steps.split_candidates.STAGE_CHUNK_BYTES`` bounds the data-extent gather and the
optimal proposal's sorted candidate tables. Shrinking it to a few bytes forces one batch per
distinct node; the run must give the same posterior: bit for bit where batching only splits
exact min / max computations (prior and empirical proposals), and to floating-point rounding
for the optimal proposal (its per-node cumulative probabilities restart per batch).
"""
from __future__ import annotations

import numpy as np
import pytest
import torch

import torchtree.steps.growth as growth
from torchtree import TopDownSMC
from torchtree.datasets.scale import interactions
from torchtree.model.data import Data
from torchtree.steps.split_candidates import node_batches


def _data(task="classification"):
    X, y = interactions(400, 8, task=task, seed=3)
    return Data(X, y, task=task)


@pytest.mark.parametrize("proposal", ["prior", "empirical", "optimal"])
@pytest.mark.parametrize("task", ["classification", "regression"])
def test_node_batches_do_not_change_the_posterior(monkeypatch, proposal, task):
    data = _data(task)
    kw = dict(n_particles=40, proposal=proposal, n_islands=2)
    ref = TopDownSMC(**kw).run(data, seed=5)
    monkeypatch.setattr(growth, "STAGE_CHUNK_BYTES", 64)  # every distinct node its own batch
    got = TopDownSMC(**kw).run(data, seed=5)
    Xq = data.X[:50]
    if proposal == "optimal":
        assert got.log_evidence == pytest.approx(ref.log_evidence, rel=1e-12)
        np.testing.assert_allclose(got.predict(Xq), ref.predict(Xq), rtol=1e-10, atol=1e-12)
    else:
        assert got.log_evidence == ref.log_evidence
        assert np.array_equal(got.predict(Xq), ref.predict(Xq))


def test_node_batches_cover_every_node_once():
    cost = torch.tensor([1.0, 1.0, 1.0, 5.0, 1.0, 1.0])
    got = node_batches(cost, 2.5)
    assert got == [(0, 3), (3, 4), (4, 6)]
    assert node_batches(cost, 100.0) == [(0, 6)]
    assert node_batches(torch.zeros(0), 1.0) == [(0, 0)]
    rng = torch.Generator().manual_seed(0)
    cost = torch.rand(200, generator=rng) * 10
    got = node_batches(cost, 25.0)
    assert got[0][0] == 0 and got[-1][1] == 200
    assert all(a[1] == b[0] for a, b in zip(got, got[1:]))
    # a batch costs at most the budget plus its last node
    assert all(float(cost[s:e].sum()) <= 25.0 + float(cost[e - 1]) + 1e-9 for s, e in got)


@pytest.mark.parametrize("T,G,R", [(1000, 7, 50), (40000, 30, 5), (50000, 4000, 1_000_000), (70000, 3, 3_000_000)])
def test_group_rank_sort_is_the_int64_sort(T, G, R):
    # int32 keys in runs of groups (above torch's radix-sort size) must give the permutation
    # of one stable int64 sort, as small inputs do: ties in input order, so cumulative statistics
    # are bit-identical (and the compiled float sums, which add in that order, equal them)
    from torchtree.steps.split_candidates import _sort_by_group_and_rank

    g = torch.Generator().manual_seed(T + G)
    seg = torch.sort(torch.randint(0, G, (T,), generator=g)).values
    ranks = torch.randint(0, min(R, 40), (T,), generator=g) * (R // min(R, 40))
    s, r, order = _sort_by_group_and_rank(seg, ranks, G, R)
    keys, want = torch.sort(seg * R + ranks, stable=True)
    assert torch.equal(order, want)
    assert torch.equal(s, keys // R) and torch.equal(r, keys % R)
    assert s.dtype == torch.int64 and r.dtype == torch.int64
