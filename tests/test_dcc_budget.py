"""DCC's ``max_seconds`` holds inside warm-ups and draws (issue #20): ``DCC(max_seconds=270,
clock="cpu")`` used 720 CPU s because the budget was only asked between iterations.

Every test injects the budget's clock (``driver.CLOCKS``): a clock that advances a fixed step per
reading (tests/_counting.py), so what a budget cuts is a function of how often the run asks, not
of the machine's speed or load. How close real runs come to their budget in seconds is a
measurement (benchmarks/results/dcc_budget.txt), not a test."""
from __future__ import annotations


import numpy as np
import pytest
import torch

from torchtree.samplers import driver
from torchtree.samplers.nuts.chains import draw, make_kernel, warmup
from torchtree.soft import DCC

from _counting import TickClock

# a run stops within this many readings of its clock after the budget is spent (the driver's
# check, the warm-up's and the draw loop's stop before the next leapfrog step)
READINGS_PAST = 8


def _data(n=300, d=8, seed=0):
    g = np.random.default_rng(seed)
    X = g.normal(size=(n, d))
    return X, (X[:, 0] + 0.5 * X[:, 1] > 0).astype(int)


def _long_dcc(**kw):
    # unbudgeted, this runs for many minutes (1000 iterations of 8 chains x 20 draws), and its
    # first iteration alone warms up 13 topologies (8.5 CPU s here): the budget checked only
    # between iterations overran 4 s by more than the slack. max_rows=None: no budget planning
    # (tests/test_dcc_rows.py), so these tests see the cuts inside warm-ups and draws
    return DCC(n_iterations=1000, n_warmup=20, n_initial=100, activation_threshold=2, max_depth=3, max_rows=None, **kw)


@pytest.mark.parametrize("clock", ["cpu", "wall"])
def test_budget_holds_inside_warm_ups_and_draws(monkeypatch, clock):
    """4 s at 1 ms per reading of the clock: 4000 budget checks cover one iteration of this run
    (which alone warms up 13 topologies), then the run stops inside the next one."""
    X, y = _data()
    tick = TickClock(0.001)
    monkeypatch.setitem(driver.CLOCKS, clock, tick)
    post = _long_dcc(max_seconds=4.0, clock=clock).run((X, y), seed=0)
    assert 4.0 <= tick.t <= 4.0 + READINGS_PAST * tick.step, tick.t
    assert 1 <= post.info["iterations"] < 1000 and len(post.topologies) >= 1
    assert np.isfinite(post.predict_proba(X[:5])).all()


def test_budget_spent_in_the_first_warm_up_is_a_clear_error_in_time(monkeypatch):
    """A warm-up of 5000 iterations cannot finish in 1000 budget checks: no topology has usable
    draws, and the run says so at the budget, not after the warm-up."""
    X, y = _data()
    tick = TickClock(0.001)
    monkeypatch.setitem(driver.CLOCKS, "cpu", tick)
    with pytest.raises(ValueError, match=r"max_seconds=1\.0 \(cpu clock\) ran out before any topology finished"):
        DCC(n_warmup=5000, max_seconds=1.0, clock="cpu", max_rows=None).run((X, y), seed=0)
    assert 1.0 <= tick.t <= 1.0 + READINGS_PAST * tick.step, tick.t


class _FakeClock:
    """One tick per reading: the budget's clock for deterministic cuts."""

    def __init__(self):
        self.t = 0.0

    def __call__(self):
        self.t += 1.0
        return self.t


def test_cut_warm_up_leaves_its_topologies_inactive(monkeypatch):
    X, y = _data(120, 3)
    kw = dict(n_iterations=50, n_initial=30, n_chains=2, n_samples=4, n_warmup=6, activation_threshold=1,
              max_depth=3, n_parallel=1, max_tree_depth=3)
    full = DCC(**kw).run((X, y), seed=0)
    n_full = sum(r.active for r in full.run_records.values())
    monkeypatch.setitem(driver.CLOCKS, "cpu", _FakeClock())
    # enough ticks (one per leapfrog step and per transition) for the first activation batch of
    # 4 topologies, not for the second
    cut = DCC(max_seconds=100, clock="cpu", max_rows=None, **kw)
    post = cut.run((X, y), seed=0)
    active = [r for r in post.run_records.values() if r.active]
    assert len(active) == len(post.topologies) == 4 < n_full
    assert post.info["warmups"] == 4 and post.info["warmups_cut"] == 4
    for r in active:  # every kept topology has draws and an evidence estimate
        assert r.draws and torch.cat(r.draws).shape[0] >= 2
    assert torch.isfinite(post.topology_log_evidence).all()
    # inactive ones keep no chains: nothing of a cut warm-up is used
    assert all(r.position is None and not r.draws for r in post.run_records.values() if not r.active)


def _toy():
    def pg(theta, rows=None):
        return 0.5 * (theta**2).sum(-1), theta.clone()

    return pg, torch.randn(4, 3, generator=torch.Generator().manual_seed(0))


def _stopper(n):
    calls = [0]

    def stop():
        calls[0] += 1
        return calls[0] >= n

    return stop


def test_warmup_and_draw_stop_when_the_budget_is_spent():
    """``stop`` is asked before every leapfrog step: a transition it interrupts is abandoned,
    so the chains keep their last whole transition (for draw: the last kept draw)."""
    pg, x0 = _toy()
    k = make_kernel("nuts", max_tree_depth=4)
    g = torch.Generator().manual_seed(1)
    ch, st = warmup(k, pg, x0, 50, generator=g, stop=_stopper(40))
    assert 0 < st["iterations"] < 50 and not st["completed"]
    ch, st = warmup(k, pg, x0, 10, generator=g, stop=_stopper(10**6))
    assert st["iterations"] == 10 and st["completed"]
    end, tr = draw(k, pg, ch, 30, generator=g, stop=_stopper(40))
    assert 0 < tr.positions.shape[0] < 30 and tr.positions.shape[1:] == (4, 3)
    assert torch.equal(end.state.position, tr.positions[-1])
    _, tr = draw(k, pg, ch, 30, generator=g, stop=_stopper(40), asynchronous=True)
    assert 0 <= tr.positions.shape[0] < 30 and torch.isfinite(tr.positions).all()
