"""The work clock (torchtree.core.work): a budget read from it stops a seeded DCC run at the same
evaluation whatever the machine's speed, so the estimators' default DCC fit is reproducible.

The real clocks are injected (``driver.CLOCKS``) to stand for a slow or busy machine: each reading
advances them by a fixed step (tests/_counting.py), so nothing here depends on this machine's speed.
How close the work clock comes to real CPU seconds is a measurement
(benchmarks/bench_work_clock.py), not a test."""
from __future__ import annotations

import threading

import numpy as np
import pytest
import torch

from torchtree.core.work import add_work, work_seconds
from torchtree.model.soft_trees import SoftTrees, evaluation_cost
from torchtree.samplers import driver
from torchtree.soft import DCC

from _counting import TickClock


def _data(n=120, d=4, seed=0):
    g = np.random.default_rng(seed)
    X = g.normal(size=(n, d))
    return X, (X[:, 0] + 0.5 * X[:, 1] > 0).astype(int)


def test_each_evaluation_advances_the_clock_by_its_modelled_cost():
    """Potential and gradient (eager, and the parts a fused step evaluates) and the log density each
    count once, by ``evaluation_cost`` of their sizes (exact sums)."""
    X, y = _data()
    m = SoftTrees((torch.tensor(X, dtype=torch.float32), torch.tensor(y)), [2, 3], n_chains=3)
    B, N, I = m.batch_size, 120, m.layout.n_internal
    assert (B, I) == (6, 7)
    w0 = work_seconds()
    m.potential_and_grad(m.theta.data)
    assert work_seconds() - w0 == pytest.approx(evaluation_cost(B, N, I, 4, True), rel=1e-12)
    rows = torch.tensor([0, 4])
    w0 = work_seconds()
    m.potential_and_grad(m.theta.data[rows], rows)
    m.fused_parts(rows)
    assert work_seconds() - w0 == pytest.approx(2 * evaluation_cost(2, N, I, 4, True), rel=1e-12)
    w0 = work_seconds()
    m.log_density_chunked(m.theta.data[rows], rows)
    assert work_seconds() - w0 == pytest.approx(evaluation_cost(2, N, I, 4, False), rel=1e-12)
    # linear in trees x rows x internal slots, and growing with the features
    assert evaluation_cost(8, 1000, 7, 10, True) - evaluation_cost(4, 1000, 7, 10, True) == pytest.approx(
        evaluation_cost(4, 1000, 7, 10, True) - evaluation_cost(0, 1000, 7, 10, True))
    assert evaluation_cost(8, 1000, 7, 500, True) > evaluation_cost(8, 1000, 7, 10, True)


def test_the_count_is_per_thread():
    """Work counted in another thread (a second run of the same process) does not move this thread's clock."""
    w0 = work_seconds()
    t = threading.Thread(target=add_work, args=(5.0,))
    t.start()
    t.join()
    assert work_seconds() == w0
    add_work(0.25)
    assert work_seconds() == w0 + 0.25


def _run(clock, seed=0):
    X, y = _data()
    return DCC(n_iterations=40, n_warmup=20, n_chains=2, n_samples=5, n_initial=20, max_depth=2, max_rows=None,
               max_seconds=1.5, clock=clock).run((X, y), seed=seed)


def test_a_work_budget_cuts_the_run_at_the_same_point_on_any_machine(monkeypatch):
    """A budget on the work clock cuts the run (fewer than n_iterations) at the same iteration, with the same
    predictions, when the real clocks read 10 ms more at every reading (a slow machine), while a CPU-clock
    budget runs out there before any warm-up ends: the default is the clock that does not depend on the
    machine."""
    X, _ = _data()
    with pytest.warns(UserWarning, match="stopped the run after"):
        ref = _run("work")
    assert 0 < ref.info["iterations"] < 40
    monkeypatch.setitem(driver.CLOCKS, "cpu", TickClock(0.01))
    monkeypatch.setitem(driver.CLOCKS, "wall", TickClock(0.01))
    with pytest.warns(UserWarning, match="stopped the run after"):
        slow = _run("work")
    assert slow.info["iterations"] == ref.info["iterations"]
    np.testing.assert_array_equal(slow.predict_proba(X), ref.predict_proba(X))
    with pytest.raises(ValueError, match=r"max_seconds=1\.5 \(cpu clock\) ran out before any topology finished"):
        _run("cpu")
