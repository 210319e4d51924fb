"""Data-informed starting points of soft-tree chains (torchtree.steps.soft_init)."""
import pytest
import torch

from torchtree.datasets.synthetic import cgm, cgm_mean
from torchtree.soft import DCC, NUTS, SoftTrees
from torchtree.steps.soft_init import _route, informed_start


def _hard_mse(model, theta):
    c = model.constrain(theta)
    leaf = _route(model.X.double(), c["weights"].double(), c["thresholds"].double(), model.node_mask, model.layout.depth)
    return ((c["mu"].gather(1, leaf) - model.y[None].double()) ** 2).mean(1)


def test_cgm_true_topology_starts_in_true_partition():
    # CGM's true tree (heap nodes 0, 1, 2, 4); a start in the true partition has hard
    # train MSE at the noise level (0.04), any other partition of this topology is
    # above 0.5 (the nearest wrong leaf means differ by 3). Prior draws essentially
    # never land there; the sweeps must put most rows there.
    Xtr, ytr, _, _ = cgm(n_train=400, seed=1)
    g = torch.Generator().manual_seed(0)
    m = SoftTrees((Xtr, ytr), [(0, 1, 2, 4)], n_chains=16, sharpness=0.001, dtype=torch.float64, generator=g)
    floor = float(((ytr - cgm_mean(Xtr)) ** 2).mean())
    prior_good = (_hard_mse(m, m.theta.data) < floor + 0.02).float().mean()
    th = informed_start(m, generator=g)
    mse = _hard_mse(m, th)
    good = (mse < floor + 0.02).float().mean()
    assert prior_good == 0.0
    assert good >= 0.5, mse
    # leaf means and noise variance come from the data
    c = m.constrain(th)
    best = int(mse.argmin())
    assert torch.allclose(c["sigma2"][best], mse[best].to(c["sigma2"]), rtol=1e-6)
    # inactive coordinates stay zero
    assert (th[~m.coord_mask] == 0).all()


def test_kept_nodes_are_not_changed_and_fresh_ones_are():
    torch.manual_seed(0)
    X = torch.rand(200, 3)
    y = (X[:, 1] > 0.3).long() + (X[:, 2] > 0.6).long()
    g = torch.Generator().manual_seed(1)
    m = SoftTrees((X, y), [(0, 1, 2)], n_chains=6, sharpness=0.01, dtype=torch.float64, generator=g)
    fresh = torch.zeros(6, m.layout.n_internal, dtype=torch.bool)
    fresh[:, 2] = True
    th = informed_start(m, m.theta.data, fresh, generator=g)
    c0, c1 = m.constrain(m.theta.data), m.constrain(th)
    for i in (0, 1):
        assert torch.allclose(c0["weights"][:, i], c1["weights"][:, i], atol=1e-9)
        assert torch.allclose(c0["thresholds"][:, i], c1["thresholds"][:, i], atol=1e-9)
    # the fresh node is (nearly) axis-aligned
    assert (c1["weights"][:, 2].max(-1).values > 0.99).all()
    assert not torch.allclose(c0["thresholds"][:, 2], c1["thresholds"][:, 2])


def test_classification_start_separates_classes():
    # noise-free two-split problem: every started tree (depth-2 full topology) should
    # classify most training points right under hard routing
    torch.manual_seed(2)
    X = torch.rand(300, 2)
    y = torch.where(X[:, 0] <= 0.4, 0, torch.where(X[:, 1] <= 0.7, 1, 2))
    g = torch.Generator().manual_seed(3)
    m = SoftTrees((X, y), [2], n_chains=8, sharpness=0.001, dtype=torch.float64, generator=g)
    th = informed_start(m, generator=g)
    m.set_sharpness(1e-4)
    acc = (m.predict(X, th).argmax(-1) == y[None]).double().mean(1)
    assert acc.median() > 0.97, acc


def test_init_option_is_validated():
    with pytest.raises(ValueError, match="init"):
        NUTS(init="cart")
    with pytest.raises(ValueError, match="init"):
        DCC(init="greedy")


def test_row_chunking_gives_the_same_start(monkeypatch):
    # the statistics are built in row chunks when they would exceed _MAX_STATS;
    # chunking must not change the result (same random numbers, same choices)
    import torchtree.steps.soft_init as init_mod

    Xtr, ytr, _, _ = cgm(n_train=200, seed=2)
    m = SoftTrees((Xtr, ytr), [(0, 1, 2, 4)], n_chains=5, sharpness=0.001, dtype=torch.float64,
                  generator=torch.Generator().manual_seed(0))
    a = informed_start(m, generator=torch.Generator().manual_seed(7), n_bins=64)
    monkeypatch.setattr(init_mod, "_MAX_STATS", 2 * 64 * 8 * 3 * 3)  # forces chunks of 3 rows, G stays 64
    b = informed_start(m, generator=torch.Generator().manual_seed(7), n_bins=64)
    assert torch.equal(a, b)


def test_nuts_from_data_informed_starts_samples_the_true_partition():
    # NUTS on CGM's true topology at h = 0.001 (integer inputs: thresholds get no
    # gradient between data points, so chains keep the partition they start in).
    # From data-informed starts the best chain's draws fit at the noise level; from
    # prior draws no chain gets near it (wrong partitions are above 0.5).
    Xtr, ytr, _, _ = cgm(n_train=200, seed=3)
    floor = float(((ytr - cgm_mean(Xtr)) ** 2).mean())
    best = {}
    for init in ("data", "prior"):
        s = NUTS(n_chains=4, n_samples=10, n_warmup=30, topology=(0, 1, 2, 4), sharpness=0.001, h_init=0.01,
                 max_tree_depth=6, init=init)
        post = s.run((Xtr, ytr), seed=0)
        pd = post.predict_draws(Xtr, 0).double()                       # [S, N], draws chain-minor
        mse = ((pd - ytr[None]) ** 2).mean(1).view(-1, 4).mean(0)      # per chain
        best[init] = float(mse.min())
    assert best["data"] < floor + 0.02, (best, floor)
    assert best["prior"] > 0.5, best
