"""The moves' target at scale: O(N D) tables, the bucket path, max_bins, memory estimates.

Every quantity the per-node kernels compute (varying dimensions, extents, child bitsets)
is an exact integer, so the checks are exact: against brute force on the points, and
between the exact tables and tables forced down to a few buckets per feature (which
exercise the scans inside a bucket), whose samplers' results must be bit for bit equal.
"""
from __future__ import annotations

import types

import numpy as np
import pytest
import torch

import torchtree as tt
import torchtree.model.target as target
from torchtree.core.memory import check_tree_memory, move_model_bytes
from torchtree.model.target import TreeModel, bit_of, quantile_binned
from torchtree.model.trees import INTERNAL
from torchtree.samplers.mcmc import MCMC
from torchtree.samplers.smc_moves import SMCSampler
from torchtree.steps.moves import check_state, sample_prior_state


def _data(n=600, seed=0):
    g = torch.Generator().manual_seed(seed)
    X = torch.randn(n, 5, generator=g)
    X[:, 1] = X[:, 1].round()  # a few values
    X[:, 2] = (X[:, 2] * 3).round() / 3  # ties
    X[:, 4] = 1.0  # constant
    X[7] = X[8]
    y = ((X[:, 0] + X[:, 1] * X[:, 2]) > 0).long()
    return tt.Data(X, y)


@pytest.fixture
def tiny_buckets(monkeypatch):
    """Bucket tables of at most 3 buckets per feature (every multi-value path taken)."""
    monkeypatch.setattr(target, "_TABLE_BYTES", 0)
    monkeypatch.setattr(target, "_EXACT_BYTES", 0)
    monkeypatch.setattr(target, "_MIN_BUCKETS", 3)


def _random_nodes(N, n, seed):
    g = torch.Generator().manual_seed(seed)
    mask = torch.rand(n, N, generator=g) < torch.rand(n, 1, generator=g) ** 3
    mask[0] = False  # an empty node
    mask[1] = False
    mask[1, 5] = True  # a single point
    mask[2] = False
    mask[2, [7, 8]] = True  # two points with the same feature row (a constant node)
    mask[3] = False
    mask[3, [7, 8, 9]] = True
    B = torch.zeros(n, (N + 63) // 64, dtype=torch.long)
    w, v = bit_of(torch.arange(N))
    for i in range(n):
        B[i].index_put_((w[mask[i]],), v[mask[i]], accumulate=True)
    return mask, B


@pytest.mark.parametrize("small_work", ["default", "never"])
@pytest.mark.parametrize("buckets", ["exact", "tiny"])
def test_kernels_match_brute_force(buckets, small_work, monkeypatch):
    if small_work == "never":  # every batch takes the large-batch paths (nonconst's own loop)
        monkeypatch.setattr(target, "_SMALL_WORK", 0)
    if buckets == "tiny":
        monkeypatch.setattr(target, "_TABLE_BYTES", 0)
        monkeypatch.setattr(target, "_EXACT_BYTES", 0)
        monkeypatch.setattr(target, "_MIN_BUCKETS", 3)
    data = _data()
    model = TreeModel(tt.ChipmanPrior(), tt.DirichletMultinomial(), data)
    assert (int(model.n_buckets.max()) <= 3) == (buckets == "tiny")
    N, D, R = model.N, model.D, model.rank
    mask, B = _random_nodes(N, 120, seed=1)
    # members: node order, ascending points, exactly the set bits
    got = torch.cat([torch.stack([a, b], 1) for a, b in model.members(B)])
    want = mask.nonzero()
    assert torch.equal(got, want)
    vary = torch.zeros(len(mask), D, dtype=torch.bool)
    for i in range(len(mask)):
        if mask[i].any():
            vary[i] = R[mask[i]].amax(0) > R[mask[i]].amin(0)
    assert torch.equal(model.varying(B), vary)
    assert torch.equal(model.nonconst(B), vary.any(1))
    f = torch.randint(0, D, (len(mask),), generator=torch.Generator().manual_seed(2))
    lo, hi, rlo, rhi = model.extent_ranks(B, f)
    for i in range(2, len(mask)):
        if mask[i].any():
            assert int(rlo[i]) == int(R[mask[i], f[i]].min()) and int(rhi[i]) == int(R[mask[i], f[i]].max())
            assert float(lo[i]) == float(data.X[mask[i], f[i]].min()) and float(hi[i]) == float(data.X[mask[i], f[i]].max())
    r = (torch.rand(len(mask), generator=torch.Generator().manual_seed(3)) * model.n_unique[f]).long() - 1
    right = torch.arange(len(mask)) % 2 == 1
    child = model.split_bits(B, f, r, right)
    w, v = bit_of(torch.arange(N))
    for i in range(len(mask)):
        sel = mask[i] & ((R[:, f[i]] <= r[i]) != bool(right[i]))
        ref = torch.zeros(model.W, dtype=torch.long).index_put_((w[sel],), v[sel], accumulate=True)
        assert torch.equal(child[i], ref), i


@pytest.mark.parametrize("keep_bits", [True, False], ids=["kept-bits", "routed-bits"])
@pytest.mark.parametrize("cut_proposal", ["prior", "data", "informed"])
def test_tiny_buckets_keep_the_caches_exact(tiny_buckets, cut_proposal, keep_bits, monkeypatch):
    if not keep_bits:
        monkeypatch.setattr(target, "_KEEP_BITS_BYTES", 0)
    data = _data(200)
    model = TreeModel(tt.ChipmanPrior(), tt.DirichletMultinomial(2.0), data)
    state, _ = sample_prior_state(model, 32, seed=3)
    assert ("bits" in state.trees.extra) == keep_bits
    check_state(state, model)
    from tests.test_moves import _mh_steps
    _mh_steps(state, model, 15, seed=5, check=True, cut_proposal=cut_proposal)


def _fit(sampler, data):
    post = sampler.run(data, seed=11)
    t = post.trees
    return [t.feature, t.threshold, t.stats, t.n_nodes, post.log_weights]


@pytest.mark.parametrize("make", [lambda **k: MCMC(n_chains=3, n_samples=40, **k),
                                  lambda **k: MCMC(n_chains=1, n_samples=80, **k),
                                  lambda **k: SMCSampler(n_particles=48, n_iterations=5, **k)],
                         ids=["mcmc-batched", "mcmc-host", "smc-moves"])
@pytest.mark.parametrize("change", ["tiny-buckets", "routed-bits", "both"])
def test_results_do_not_depend_on_the_tables_or_kept_bits(make, change, monkeypatch):
    """Exact tables with kept per-node bitsets (the small-data path) against 3 buckets per
    feature and / or bitsets routed from the root (the large-data path): same results."""
    data = _data(300)
    want = _fit(make(), data)
    if change != "routed-bits":
        monkeypatch.setattr(target, "_TABLE_BYTES", 0)
        monkeypatch.setattr(target, "_EXACT_BYTES", 0)
        monkeypatch.setattr(target, "_MIN_BUCKETS", 3)
    if change != "tiny-buckets":
        monkeypatch.setattr(target, "_KEEP_BITS_BYTES", 0)
    got = _fit(make(), data)
    for a, b in zip(want, got):
        assert torch.equal(a, b)


@pytest.mark.parametrize("dedup", ["off", "every-hash-collides"])
def test_results_do_not_depend_on_deduplicating_nodes(dedup, monkeypatch):
    """Extents and informed-cut histograms are computed once per distinct (node, feature) and
    gathered back (kernels/distinct.py). Without it, and with a hash under which every row
    collides (each row then verified and standing for itself), the results are the same."""
    from torchtree.kernels import distinct

    data = _data(400)
    make = lambda: SMCSampler(n_particles=128, n_iterations=4, cut_proposal="informed")  # noqa: E731
    want = _fit(make(), data)
    if dedup == "off":
        monkeypatch.setattr(distinct, "MIN_ROWS", 1 << 62)
    else:
        monkeypatch.setattr(distinct, "_row_hash", lambda rows: torch.zeros(rows.shape[0], dtype=torch.long))
    monkeypatch.setattr(target, "_SMALL_WORK", 0)  # the de-duplicated path on this small data
    got = _fit(make(), data)
    for a, b in zip(want, got):
        assert torch.equal(a, b)


def test_distinct_rows_is_exact_under_collisions(monkeypatch):
    from torchtree.kernels import distinct

    g = torch.Generator().manual_seed(0)
    base = torch.randint(-2**62, 2**62, (5, 7), generator=g)
    idx = torch.randint(0, 5, (200,), generator=g)
    rows, extra = base[idx], torch.randint(0, 2, (200,), generator=g)
    first, inv = distinct.distinct_rows(rows, extra)
    assert first.numel() <= 10
    assert torch.equal(rows[first[inv]], rows) and torch.equal(extra[first[inv]], extra)
    monkeypatch.setattr(distinct, "_row_hash", lambda r: torch.zeros(r.shape[0], dtype=torch.long))
    first, inv = distinct.distinct_rows(rows, extra)
    assert torch.equal(rows[first[inv]], rows) and torch.equal(extra[first[inv]], extra)


@pytest.mark.parametrize("make", [lambda **k: MCMC(n_chains=2, n_samples=40, **k),
                                  lambda **k: SMCSampler(n_particles=48, n_iterations=5, **k)],
                         ids=["mcmc", "smc-moves"])
def test_max_bins_above_the_distinct_values_changes_nothing(make):
    data = _data(300)
    want = _fit(make(), data)
    got = _fit(make(max_bins=int(data.n_unique.max())), data)
    for a, b in zip(want, got):
        assert torch.equal(a, b)


@pytest.mark.parametrize("make", [lambda **k: MCMC(n_chains=2, n_samples=60, **k),
                                  lambda **k: MCMC(n_chains=1, n_samples=60, **k),
                                  lambda **k: SMCSampler(n_particles=64, n_iterations=6, **k)],
                         ids=["mcmc-batched", "mcmc-host", "smc-moves"])
def test_small_max_bins_splits_only_on_grid_values(make):
    data = _data(500)
    bins = 6
    grid = quantile_binned(data, bins)
    assert int(grid.n_unique.max()) <= bins
    post = make(max_bins=bins).run(data, seed=2)
    t = post.trees
    p, c = (t.status == INTERNAL).nonzero(as_tuple=True)
    assert p.numel() > 10
    binned = set((data.n_unique > bins).nonzero().squeeze(1).tolist())
    assert binned == {0, 2, 3}
    split_on = set()
    for f, thr in zip(t.feature[p, c].tolist(), t.threshold[p, c].tolist()):
        vals = grid.sorted_values[f, : int(grid.n_unique[f])].tolist()
        if f in binned:  # a binned feature: the threshold is a grid value
            assert thr in vals, (f, thr, vals)
            split_on.add(f)
        else:  # a feature of at most max_bins values is fitted as it is
            assert vals[0] <= thr < vals[-1]
    assert split_on
    # the leaves' statistics are those of the raw training points routed by the snapped thresholds
    t.validate(data, tt.DirichletMultinomial())


def test_quantile_bins_are_quantiles_and_keep_ties_together():
    X = np.concatenate([np.zeros(500), np.arange(1, 501)])[:, None].astype(np.float32)
    data = tt.Data(X, (X[:, 0] > 250).astype(np.int64))
    b = quantile_binned(data, 4)
    # half the points are 0: bin 0 holds only them; the rest split into quantile bins of 1..500
    assert b.sorted_values[0, : int(b.n_unique[0])].tolist() == [0.0, 250.0, 500.0]
    assert torch.equal(b.X[:, 0] == 0, data.X[:, 0] == 0)
    assert bool((b.X[:, 0] >= data.X[:, 0]).all())  # every value moves up to its bin's largest
    with pytest.raises(ValueError, match="max_bins"):
        MCMC(max_bins=1)


def test_tables_are_linear_in_the_data():
    """No N^2 table: at N = 50,000 continuous points (where the old prefix tables took
    ~20 GB) the model holds its data and 256 MB of bucket tables, as estimated."""
    g = torch.Generator().manual_seed(0)
    X = torch.randn(50_000, 10, generator=g)
    data = tt.Data(X, (X[:, 0] > 0).long())
    model = TreeModel(tt.ChipmanPrior(), tt.DirichletMultinomial(), data)
    held = sum(v.numel() * v.element_size() for v in vars(model).values() if isinstance(v, torch.Tensor))
    assert held < 300 * 2**20, held
    assert held < move_model_bytes(50_000, 10, 2) * 1.1


def test_a_million_rows_are_not_refused():
    data = types.SimpleNamespace(n=700_000, d=10, n_classes=2, device=torch.device("cpu"))
    check_tree_memory("SMCSampler", 1024, data, "n_particles", limit=4 * 2**30)
    check_tree_memory("MCMC", 4, data, "n_chains", limit=1 * 2**30)
    with pytest.raises(ValueError, match="n_particles"):
        check_tree_memory("SMCSampler", 1024, data, "n_particles", limit=512 * 2**20)


def test_checkpoint_of_another_max_bins_is_refused(tmp_path):
    from torchtree.io.checkpoint import CheckpointError

    data = _data(200)
    path = str(tmp_path / "ck.pt")
    SMCSampler(n_particles=16, n_iterations=2, checkpoint=path).run(data, seed=1)
    with pytest.raises(CheckpointError, match="different run"):
        SMCSampler(n_particles=16, n_iterations=2, checkpoint=path, max_bins=8).run(data, seed=1)
