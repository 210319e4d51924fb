"""The compiled point-list kernels of a top-down growth stage against their plain-torch references.

``node_extents`` and ``partition_points`` must equal the references in
:mod:`torchtree.kernels.node_points`, ``split_counts``, ``split_intervals`` and ``all_intervals``
brute-force counts, and ``split_sums`` and ``split_sum_intervals`` (float statistics) the sorted
candidates' sums bit for bit, on random lists
(float32 and float64 data, ties, empty lists, one query and many per list, 1 and 2 threads). Whole
top-down SMC runs with the kernels and without them (the sorted-candidate route) must give the same
trees, weights and evidence, for every proposal and expansion order, classification and regression.
"""
import numpy as np
import pytest
import torch

from torchtree import ChipmanPrior, Data, DirichletMultinomial, NormalInverseGamma, TopDownSMC
from torchtree.kernels import native
from types import SimpleNamespace

from torchtree.kernels.node_points import (all_intervals, gather_lists, node_extents, partition_points, split_counts,
                                           split_intervals, split_sum_intervals, split_sums)
from torchtree.kernels.segments import segmented_searchsorted
from torchtree.steps import growth
from torchtree.steps.split_candidates import SortedCandidates

pytestmark = pytest.mark.skipif(not native.available(), reason="the C++ kernels could not be built here")


def _lists(n, L, rng):
    """L random lists over n points (some empty), in one int32 buffer."""
    cnt = torch.as_tensor(rng.integers(0, n, size=L), dtype=torch.long)
    cnt[rng.integers(0, L)] = 0
    idx = [torch.as_tensor(rng.choice(n, size=int(c), replace=False)) for c in cnt]
    buf = torch.cat([torch.full((7,), -1)] + idx).to(torch.int32)  # a used prefix: offsets do not start at 0
    off = 7 + torch.cumsum(cnt, 0) - cnt
    return buf, off, cnt, idx


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
@pytest.mark.parametrize("threads", [1, 2])
def test_extents_and_partition_equal_the_reference(dtype, threads):
    rng = np.random.default_rng(0)
    n, D, L = 500, 4, 12
    X = torch.as_tensor(rng.integers(0, 9, size=(n, D)) / 4.0, dtype=dtype)  # many ties
    buf, off, cnt, idx = _lists(n, L, rng)
    old = torch.get_num_threads()
    torch.set_num_threads(threads)
    try:
        lo, hi = node_extents(buf, off, cnt, X, use_native=True)
        rlo, rhi = node_extents(buf, off, cnt, X, use_native=False)
        assert torch.equal(lo, rlo) and torch.equal(hi, rhi)
        empty = int((cnt == 0).nonzero()[0])
        assert torch.isposinf(lo[empty]).all() and torch.isneginf(hi[empty]).all()
        feat = torch.as_tensor(rng.integers(0, D, size=L))
        thr = torch.as_tensor(rng.integers(0, 9, size=L) / 4.0 - 0.01, dtype=torch.float64)
        side = torch.as_tensor(rng.integers(0, 2, size=L).astype(bool))
        want = torch.stack([((X[i, f] > t.to(dtype)) == s).sum() for i, f, t, s in zip(idx, feat, thr, side)])
        got, counts = partition_points(buf, off, cnt, X, feat, thr, side, want, use_native=True)
        ref, rcounts = partition_points(buf, off, cnt, X, feat, thr, side, want, use_native=False)
        assert torch.equal(counts, want) and torch.equal(rcounts, want) and torch.equal(got, ref)
        # a wrong expectation is reported through the counts, never written past the output
        short = want.clone()
        short[want.argmax()] -= 1
        _, counts = partition_points(buf, off, cnt, X, feat, thr, side, short, use_native=True)
        assert not torch.equal(counts, short) and torch.equal(counts, want)
    finally:
        torch.set_num_threads(old)


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
def test_split_counts_equal_a_brute_force_count(dtype):
    rng = np.random.default_rng(1)
    n, D, L, S = 400, 3, 9, 3
    X = torch.as_tensor(rng.integers(0, 20, size=(n, D)) / 8.0, dtype=dtype)
    stats = torch.nn.functional.one_hot(torch.as_tensor(rng.integers(0, S, size=n)), S).int()
    buf, off, cnt, idx = _lists(n, L, rng)
    dim = torch.as_tensor(rng.integers(0, D, size=L))
    Q = 60
    group = torch.as_tensor(rng.integers(0, L, size=Q))
    group[:3] = 0  # several queries on one list, with equal cuts
    thr = torch.as_tensor(rng.integers(-1, 21, size=Q) / 8.0, dtype=dtype)
    thr[1] = thr[0]
    n_left, left = split_counts(buf, off, cnt, X, dim, group, thr, stats)
    for q in range(Q):
        pts = idx[int(group[q])]
        m = X[pts, dim[group[q]]] <= thr[q]
        assert int(n_left[q]) == int(m.sum())
        assert torch.equal(left[q], stats[pts[m]].sum(0).int())
    assert left.dtype == torch.int32 and n_left.dtype == torch.long


def _ranked_lists(rng, L, S, n=300, D=2):
    """Ranks (12 distinct values, ties) and one-hot class counts of n points, L random lists, each cut on
    a random column: ``(rank, stats, buf, off, cnt, idx, dim)``."""
    rank = torch.as_tensor(rng.integers(0, 12, size=(n, D)))
    stats = torch.nn.functional.one_hot(torch.as_tensor(rng.integers(0, S, size=n)), S).int()
    buf, off, cnt, idx = _lists(n, L, rng)
    return (rank, stats, buf, off, cnt, idx, torch.as_tensor(rng.integers(0, D, size=L)))


@pytest.mark.parametrize("n_ranks", [12, 4000])  # 12: histograms of the ranks; 4000: sorts of the points
def test_split_intervals_equal_a_brute_force_count(n_ranks):
    rng, L = np.random.default_rng(4), 8
    rank, stats, buf, off, cnt, idx, dim = _ranked_lists(rng, L, S=2)
    Q = 50
    group = torch.as_tensor(rng.integers(0, L, size=Q))
    u = torch.as_tensor(rng.uniform(size=Q))
    u[0], group[0] = 1.0 - 1e-17, group[1]  # the last interval
    n_left, left, n_int, r0, r1 = split_intervals(buf, off, cnt, rank, dim, group, u, stats, n_ranks)
    for q in range(Q):
        pts = idx[int(group[q])]
        ranks = rank[pts, dim[group[q]]]
        distinct = torch.unique(ranks)  # ascending
        nc = distinct.numel() - 1
        assert int(n_int[q]) == nc
        if nc < 1:
            continue
        j = min(int(float(u[q]) * nc), nc - 1)
        assert (int(r0[q]), int(r1[q])) == (int(distinct[j]), int(distinct[j + 1]))
        m = ranks <= distinct[j]
        assert int(n_left[q]) == int(m.sum()) and torch.equal(left[q], stats[pts[m]].sum(0).int())


@pytest.mark.parametrize("n_ranks", [12, 4000])
def test_all_intervals_list_every_boundary(n_ranks):
    rng, L = np.random.default_rng(5), 8
    rank, stats, buf, off, cnt, idx, dim = _ranked_lists(rng, L, S=3)
    g, r0, r1, n_left, left = all_intervals(buf, off, cnt, rank, dim, stats, n_ranks)
    want = []
    for lst in range(L):
        ranks = rank[idx[lst], dim[lst]]
        distinct = torch.unique(ranks).tolist()
        for a, b in zip(distinct[:-1], distinct[1:]):
            m = ranks <= a
            want.append((lst, a, b, int(m.sum()), stats[idx[lst][m]].sum(0).tolist()))
    got = [(int(g[e]), int(r0[e]), int(r1[e]), int(n_left[e]), left[e].tolist()) for e in range(g.numel())]
    assert got == want


class _Pool:
    """The two members of a NodeTable that SortedCandidates reads."""

    def __init__(self, buf, off, cnt):
        self.buf, self.off, self.cnt = buf, off, cnt

    def gather(self, uids):
        return gather_lists(self.buf, self.off[uids], self.cnt[uids])


@pytest.mark.parametrize("n,L", [(300, 9), (4000, 24)])  # the second: over 32768 sorted points (runs of int32 sorts)
@pytest.mark.parametrize("threads", [1, 2])
def test_float_sums_equal_the_sorted_candidates_bit_for_bit(n, L, threads):
    """Float statistics depend on the order of their sums: the kernels must add in the sorted
    candidates' order (ranks ascending, ties in list order, one running sum over the lists)."""
    rng = np.random.default_rng(6)
    D, nv = 3, 15
    rank = torch.as_tensor(rng.integers(0, nv, size=(n, D)))  # many ties
    values = torch.sort(torch.as_tensor(rng.normal(size=(D, nv)), dtype=torch.float32), 1).values
    y = torch.as_tensor(rng.normal(size=n) * 1e3 + 0.1)  # sums that round, so that the order shows
    stats = torch.stack([torch.ones(n, dtype=torch.float64), y, y * y], 1)
    buf, off, cnt, idx = _lists(n, L, rng)
    dim = torch.as_tensor(rng.integers(0, D, size=L))
    data = SimpleNamespace(n_unique=torch.full((D,), nv), X_rank=rank, sorted_values=values)
    old = torch.get_num_threads()
    torch.set_num_threads(threads)
    try:
        srt = SortedCandidates(_Pool(buf, off, cnt), torch.arange(L), dim, data, stats)
        Q = 80
        live = (cnt > 0).nonzero().squeeze(1)
        group = live[torch.as_tensor(rng.integers(0, live.numel(), size=Q))]
        # prior: cuts between and at the values, below and above them all
        col = values[dim[group], torch.as_tensor(rng.integers(0, nv, size=Q))]
        thr = torch.where(torch.as_tensor(rng.uniform(size=Q) < 0.5), col, col - 1e-3)
        thr[0], thr[1] = -1e9, 1e9
        n_left, left = split_sums(buf, off, cnt, rank, values, dim, group, thr, stats)
        ref_n = segmented_searchsorted(srt.vals, srt.start[group], srt.end[group], thr, right=True)
        assert torch.equal(n_left, ref_n) and torch.equal(left, srt.left_stats_at(group, ref_n))
        # empirical: the j-th interval between distinct values; lists of one value are never queried
        two = torch.as_tensor([torch.unique(rank[idx[int(g)], dim[g]]).numel() > 1 for g in group])
        gq = group[two]
        u = torch.as_tensor(rng.uniform(size=gq.numel()))
        u[0] = 1.0 - 1e-17
        n_left, left, n_int, r0, r1 = split_sum_intervals(buf, off, cnt, rank, dim, gq, u, stats)
        nc = srt.n_cand[gq]
        j = (u * nc.double()).long().clamp(max=nc - 1)
        e = srt.cand[srt.cand_start[gq] + j]
        ref_n = e + 1 - srt.start[gq]
        assert torch.equal(n_int, nc) and torch.equal(n_left, ref_n)
        assert torch.equal(r0, srt.rank[e]) and torch.equal(r1, srt.rank[e + 1])
        assert torch.equal(left, srt.left_stats_at(gq, ref_n))
    finally:
        torch.set_num_threads(old)
    # and the sums are the points': a brute-force check of the meaning (to rounding)
    for q in range(gq.numel()):
        pts = idx[int(gq[q])]
        m = rank[pts, dim[gq[q]]] <= r0[q]
        assert int(n_left[q]) == int(m.sum())
        assert torch.allclose(left[q], stats[pts[m]].sum(0), rtol=1e-9, atol=1e-6)


def _run(data, lik, proposal, expansion, monkeypatch, use_native, calls):
    monkeypatch.setattr(growth, "native_usable", lambda device: use_native)
    for name in ("split_counts", "split_intervals", "all_intervals", "split_sums", "split_sum_intervals"):
        kernel = getattr(growth, name)

        def counted(*args, kernel=kernel):
            calls.append(1)
            return kernel(*args)

        monkeypatch.setattr(growth, name, counted)
    post = TopDownSMC(ChipmanPrior(0.95, 0.5), lik, n_particles=150, n_islands=3, proposal=proposal,
                      expansion=expansion, ess_threshold=0.5).run(data, seed=3)
    return post


@pytest.mark.parametrize("proposal", ["prior", "empirical", "optimal"])
@pytest.mark.parametrize("task", ["classification", "regression"])
def test_runs_with_and_without_the_kernels_are_equal(proposal, task, monkeypatch):
    rng = np.random.default_rng(2)
    X = np.round(rng.normal(size=(300, 5)), 1).astype(np.float32)  # ties
    if task == "classification":
        data, lik = Data(X, (X[:, 0] + X[:, 1] * X[:, 2] > 0).astype(np.int64)), DirichletMultinomial(1.0)
    else:
        data = Data(X, X[:, 0] * 2 + np.sin(X[:, 1]) + rng.normal(size=300) * .3, task="regression")
        lik = NormalInverseGamma()
    for expansion in ("node", "layer"):
        calls = []
        a = _run(data, lik, proposal, expansion, monkeypatch, True, calls)
        # the kernels score the proposals' cuts; the optimal proposal's regression scores take the sorted route
        assert (len(calls) > 0) == (task == "classification" or proposal != "optimal")
        b = _run(data, lik, proposal, expansion, monkeypatch, False, calls[:0])
        monkeypatch.undo()
        for name in ("feature", "threshold", "left", "right", "status", "stats", "n_nodes"):
            assert torch.equal(getattr(a.trees, name), getattr(b.trees, name)), name
        assert torch.equal(a.log_weights, b.log_weights)
        assert a.log_evidence == b.log_evidence
