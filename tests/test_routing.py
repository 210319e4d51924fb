"""Routing node bitsets from the root with shared paths computed once (model/routing.py).

The result must equal every node's kept bitset (the small-data path, built top-down by the
moves themselves), whether the trees share their paths (resampled copies) or not, and
whichever way the (parent, rule, side) keys are made distinct.
"""
from __future__ import annotations

import pytest
import torch

import torchtree as tt
from torchtree.model import routing
from torchtree.model.routing import routed_node_bits
import torchtree.model.target as target
from torchtree.model.target import TreeModel
from torchtree.model.trees import UNUSED
from torchtree.samplers.mcmc import MCMC
from torchtree.samplers.smc_moves import SMCSampler
from torchtree.steps.moves import sample_prior_state


def _state(n_trees=24, seed=0):
    g = torch.Generator().manual_seed(seed)
    X = torch.randn(300, 4, generator=g)
    X[:, 1] = X[:, 1].round()
    y = (X[:, 0] + X[:, 1] > 0).long()
    model = TreeModel(tt.ChipmanPrior(alpha_split=0.95, beta_split=0.3), tt.DirichletMultinomial(1.0), tt.Data(X, y))
    state, _ = sample_prior_state(model, n_trees, seed=seed)
    assert "bits" in state.trees.extra  # small data: every node's bitset is kept, the reference
    return model, state


@pytest.mark.parametrize("packed", [True, False], ids=["int64-keys", "row-keys"])
def test_routed_bits_are_the_kept_bits(packed, monkeypatch):
    if not packed:  # keys too wide to pack: unique over rows
        real = routing._distinct_keys
        monkeypatch.setattr(routing, "_distinct_keys", lambda p, f, r, right, D, umax: real(p, f, r, right, D, 1 << 62))
    model, state = _state()
    t = state.trees
    t.take_(torch.tensor([0, 0, 0, 1, 1, 2] + list(range(3, 21))))  # copies share every path
    g = torch.Generator().manual_seed(1)
    for _ in range(5):
        used = (t.status != UNUSED).double()
        node = torch.multinomial(used, 1, generator=g).squeeze(1)
        bits, index = routed_node_bits(model, t, node)
        assert bits.shape[0] <= t.n_trees and index.shape == node.shape
        want = t.extra["bits"][torch.arange(t.n_trees), node]
        assert torch.equal(bits.index_select(0, index), want)
        assert torch.equal(model.node_bits(t, node), want)
    # the copies' nodes are routed once: at most as many distinct bitsets as distinct (tree, node)
    node = torch.zeros(t.n_trees, dtype=torch.long)
    bits, index = routed_node_bits(model, t, node)
    assert bits.shape[0] == 1 and bool((index == 0).all())  # every root is the same node


@pytest.mark.parametrize("make", [lambda: MCMC(n_chains=3, n_samples=60), lambda: SMCSampler(n_particles=48, n_iterations=6)],
                         ids=["mcmc", "smc-moves"])
@pytest.mark.parametrize("keep_bits", [True, False], ids=["kept-bits", "routed-bits"])
@pytest.mark.parametrize("task", ["classification", "regression"])
def test_subtrees_rebuilt_in_a_second_pass_give_the_same_run(make, keep_bits, task, monkeypatch):
    """With no room to keep the first pass's subtree bitsets, the surviving trees' nodes are
    rebuilt: every draw is the same as with them kept (regression: statistics from unpacked
    bitsets times the per-point statistics, in another batch order)."""
    if not keep_bits:
        monkeypatch.setattr(target, "_KEEP_BITS_BYTES", 0)
    g = torch.Generator().manual_seed(4)
    X = torch.randn(400, 3, generator=g)
    label = (X[:, 0] > 0) ^ (X[:, 1] > 0.5)
    data = (tt.Data(X, label.long()) if task == "classification"
            else tt.Data(X, label.double() + 0.3 * torch.randn(400, generator=g, dtype=torch.float64), task="regression"))
    want = make().run(data, seed=6)
    monkeypatch.setattr(routing, "_SUBTREE_BYTES", 0)
    got = make().run(data, seed=6)
    for name in ("feature", "threshold", "stats", "n_nodes"):
        assert torch.equal(getattr(want.trees, name), getattr(got.trees, name)), name
    assert torch.equal(want.log_weights, got.log_weights)
