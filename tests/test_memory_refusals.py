"""Settings whose memory cannot exist are refused before anything is allocated
(issue #20): ``n_particles=10**8`` / ``n_chains=10**8`` failed in the allocator (or the
process was OOM-killed) after minutes; DCC's evidence on a wide table asked for 78 GB.
Each sampler estimates a lower bound of its memory first and raises a ValueError naming
the setting to lower. "Before anything is allocated" is checked by counting the bytes torch's
operators produce before the refusal (tests/_counting.py), not by the clock."""
from __future__ import annotations

import numpy as np
import pytest
import torch

import torchtree.core.memory as memory
from torchtree import MCMC, Data, SMCSampler, TopDownSMC
from torchtree.soft import DCC, NUTS
from torchtree.samplers.dcc.lais import lais_log_weights

from _counting import MiB, Allocations

GiB = 1 << 30


def _data(n=100, d=4):
    g = np.random.default_rng(0)
    X = g.normal(size=(n, d))
    return X, (X[:, 0] > 0).astype(int)


@pytest.fixture
def four_gib(monkeypatch):
    """A machine with 4 GiB free, whatever this one has."""
    monkeypatch.setenv("TORCHTREE_MEMORY_LIMIT", "4G")


@pytest.mark.parametrize("make, setting", [
    (lambda: TopDownSMC(n_particles=10**8), "n_particles"),
    (lambda: MCMC(n_chains=10**8, n_samples=10), "n_chains"),
    (lambda: SMCSampler(n_particles=10**8, n_iterations=2), "n_particles"),
])
def test_huge_hard_tree_batches_are_refused_at_once(four_gib, make, setting):
    X, y = _data()
    sampler, data = make(), Data(X, y)
    with Allocations() as a, pytest.raises(ValueError, match=rf"needs at least .* GiB of memory but 4\.0 GiB is available.*lower {setting}"):
        sampler.run(data, seed=0)
    assert a.largest < 16 * MiB, a.largest


def test_refused_without_a_cap_too():
    """10**11 particles exceed any machine (tens of TB), cap or no cap."""
    X, y = _data()
    with pytest.raises(ValueError, match="lower n_particles"):
        TopDownSMC(n_particles=10**11).run(Data(X, y), seed=0)


def test_nuts_chains_are_refused(four_gib):
    X, y = _data(2000)
    with Allocations() as a, pytest.raises(ValueError, match=r"NUTS .*lower n_chains"):
        NUTS(n_chains=10**6, n_samples=10, n_warmup=10, depth=3).run(X, y, seed=0)
    assert a.largest < 16 * MiB, a.largest


def test_dcc_on_a_wide_table_is_refused_before_sampling(four_gib):
    # LAIS's low-rank form runs DCC on 50 x 10,000 in ~0.6 GiB (tests/test_dcc_scale.py); a
    # million pseudo-samples per draw still cannot fit
    X, y = _data(50, 10_000)
    with Allocations() as a, pytest.raises(ValueError, match=r"DCC's evidence .*lower n_chains, n_samples or n_proposals \(or use fewer features\)"):
        DCC(n_iterations=2, n_proposals=10**6).run((X, y), seed=0)
    assert a.largest < 64 * MiB, a.largest


def test_lais_refuses_covariances_that_do_not_fit(four_gib):
    G, C, T, P = 2, 8, 20, 20_000  # 2 x 8 covariances of 20k x 20k: 48 GiB each kind
    draws = torch.zeros(G, C, T, P).expand(G, C, T, P)  # no memory behind it
    mask = torch.ones(G, P, dtype=torch.bool)
    with pytest.raises(ValueError, match=r"LAIS evidence of 2 topologies x 8 chains with 20000 parameters"):
        lais_log_weights(draws, mask, lambda xi: xi.sum(-1), covariance="dense")


def test_ordinary_runs_pass_the_check(four_gib):
    X, y = _data()
    post = MCMC(n_chains=4, n_samples=20, n_warmup=5).run(Data(X, y), seed=0)
    assert len(post) > 0


def test_available_bytes_and_limit_parsing(monkeypatch):
    monkeypatch.delenv("TORCHTREE_MEMORY_LIMIT", raising=False)
    free = memory.available_bytes()
    assert free is None or free > 0
    for raw, want in (("8G", 8 * GiB), ("512MiB", 512 << 20), ("1000", 1000), ("1.5g", int(1.5 * GiB))):
        monkeypatch.setenv("TORCHTREE_MEMORY_LIMIT", raw)
        assert memory.available_bytes() == (want if free is None else min(free, want))
    monkeypatch.setenv("TORCHTREE_MEMORY_LIMIT", "lots")
    with pytest.raises(ValueError, match="TORCHTREE_MEMORY_LIMIT"):
        memory.available_bytes()
    with pytest.raises(ValueError, match="lower n_things"):
        memory.check_memory("a run", 2e9, "n_things", limit=1e9)
    memory.check_memory("a run", 1e9, "n_things", limit=2e9)  # fits: no error


def test_the_node_table_of_many_classes_stays_within_its_bound():
    """1000 classes on 2000 rows grew top-down SMC's node table (a count per class and node) to 16.9 GB;
    the table now stops at its bound with a MemoryError naming what to lower, having allocated no
    tensor beyond the bound."""
    g = np.random.default_rng(0)
    X = g.normal(size=(600, 5))
    y = g.integers(0, 300, 600)
    bound = 32 << 20
    with Allocations() as a, pytest.raises(MemoryError, match=r"node table would need .* statistics per node.*n_particles"):
        TopDownSMC(n_particles=1000, proposal="empirical", max_memory_bytes=bound).run(Data(X, y), seed=0)
    assert a.largest <= bound, a.largest


def test_many_classes_leave_the_optimal_proposal_to_small_label_sets():
    """The optimal proposal's work per candidate cut grows with the classes (it took 464 s on 1000
    classes x 2000 rows): the estimators choose it by rows x features x classes / 2."""
    from torchtree.samplers.tuning.starts import start_settings

    assert start_settings(2000, 5, "classification", 1000, n_classes=2)["proposal"] == "optimal"
    assert start_settings(2000, 5, "classification", 1000, n_classes=1000)["proposal"] == "empirical"
    assert start_settings(297, 13, "classification", 1000, n_classes=5)["proposal"] == "optimal"  # heart_cleveland


def test_bart_with_too_many_trees_is_refused_before_it_allocates(four_gib):
    """n_trees=10**7 failed in the allocator (40.9 GB) with no estimate first."""
    from torchtree import BART

    X, y = _data()
    data = Data(X, y.astype(float), task="regression")
    with Allocations() as a, pytest.raises(ValueError, match=r"BART with 10000000 trees .* needs at least .*lower n_trees"):
        BART(n_trees=10**7, n_samples=10, n_warmup=10).run(data, seed=0)
    assert a.largest < 16 * MiB, a.largest
