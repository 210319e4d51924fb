"""DCC's ``max_rows`` (issue #21): a seeded row subset when the budget cannot afford every row.

A subset run is DCC on the subset, bit for bit; no subset means no change at all; "auto"
sizes the subset by a timed pilot so that a budget too small for every row still gives a
posterior. The pilot's cost model and the budget's clock are injected where a test needs them,
so no test depends on this machine's speed."""
from __future__ import annotations

import re
import warnings

import numpy as np
import pytest
import torch

from torchtree import BayesianTreeClassifier
from torchtree.datasets.scale import interactions
from torchtree.monitor import CallbackMonitor
from torchtree.samplers import driver
from torchtree.samplers.dcc import rows as dcc_rows
from torchtree.samplers.dcc.sampler import MIN_DRAWS
from torchtree.samplers.dcc.config import DCCConfig
from torchtree.samplers.dcc.rows import dcc_row_subset, subset_soft_data
from torchtree.soft import DCC

from _counting import TickClock

SMALL = dict(n_iterations=3, n_initial=8, n_chains=2, n_samples=4, n_warmup=10, n_parallel=2, activation_threshold=2,
             max_depth=2, n_proposals=2, max_tree_depth=4, device="cpu", n_threads=1)


def _same(a, b, X):
    assert [t.internal for t in a.topologies] == [t.internal for t in b.topologies]
    assert all(torch.equal(da, db) for da, db in zip(a.draws, b.draws)) and len(a.draws) == len(b.draws)
    assert torch.equal(a.topology_log_evidence, b.topology_log_evidence)
    assert torch.equal(torch.as_tensor(a.predict_proba(X)), torch.as_tensor(b.predict_proba(X)))


def _no_warnings(fn):
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        return fn()


def test_row_subset_is_seeded_uniform_and_sorted():
    a = dcc_row_subset(1000, 100, 7)
    assert torch.equal(a, dcc_row_subset(1000, 100, 7)) and not torch.equal(a, dcc_row_subset(1000, 100, 8))
    assert a.shape == (100,) and bool((a[1:] > a[:-1]).all()) and 0 <= int(a[0]) and int(a[-1]) < 1000
    assert torch.equal(dcc_row_subset(50, 50, 0), torch.arange(50))
    assert torch.equal(dcc_row_subset(50, 80, 0), torch.arange(50))
    # every row about equally often over seeds (uniform): 2000 draws of 10 of 20 rows
    counts = torch.zeros(20)
    for s in range(2000):
        counts[dcc_row_subset(20, 10, s)] += 1
    assert float((counts / 1000 - 1).abs().max()) < 0.1


def test_max_rows_fits_the_seeded_subset_bit_for_bit():
    X, y = interactions(400, 7, seed=1)
    with pytest.warns(UserWarning, match=r"DCC fits 150 of 400 rows .*max_rows=150; max_rows=None uses every row"):
        post = DCC(max_rows=150, **SMALL).run((X, y), seed=5)
    assert post.info["rows_used"] == 150 and post.info["rows_total"] == 400
    assert post.summary()["rows_used"] == 150
    dcc = DCC(max_rows=None, **SMALL)
    sub = subset_soft_data(dcc.prepare((X, y), None), dcc_row_subset(400, 150, 5))
    ref = _no_warnings(lambda: dcc.run(sub, seed=5))
    assert ref.info["rows_used"] == ref.info["rows_total"] == 150
    _same(post, ref, X)
    # another seed, other rows
    with pytest.warns(UserWarning):
        other = DCC(max_rows=150, **SMALL).run((X, y), seed=6)
    assert not torch.equal(torch.as_tensor(other.predict_proba(X)), torch.as_tensor(post.predict_proba(X)))


def test_no_subset_changes_nothing():
    X, y = interactions(200, 7, seed=3)
    ref = _no_warnings(lambda: DCC(**SMALL).run((X, y), seed=2))  # default "auto", no max_seconds
    assert ref.info["rows_used"] == ref.info["rows_total"] == 200
    for m in (None, 200, 10**6):
        _same(ref, _no_warnings(lambda: DCC(max_rows=m, **SMALL).run((X, y), seed=2)), X)


def test_max_rows_through_the_estimator_and_the_command_line():
    from torchtree.cli.options import sampler_options

    X, y = interactions(300, 7, seed=4)
    kw = {k: v for k, v in SMALL.items() if k not in ("device",)}
    with pytest.warns(UserWarning, match="120 of 300"):
        est = BayesianTreeClassifier(method="dcc", max_rows=120, random_state=0, **kw).fit(X.numpy(), y.numpy())
    assert est.posterior_.info["rows_used"] == 120
    opts = dict(sampler_options(DCC))
    parse = opts["max_rows"]["type"]
    assert "max_rows" in opts and "every row" in opts["max_rows"]["help"]
    assert [DCCConfig(max_rows=parse(t)).max_rows for t in ("auto", "150", "none")] == ["auto", 150, None]


@pytest.mark.parametrize("bad", [0, -1, 2.5, "x", True, "1.5", [3]])
def test_invalid_max_rows_is_refused(bad):
    with pytest.raises(ValueError, match="max_rows"):
        DCC(max_rows=bad)
    with pytest.raises(ValueError, match="max_rows"):
        BayesianTreeClassifier(method="dcc", max_rows=bad).fit(np.zeros((4, 2)), np.array([0, 1, 0, 1]))


def test_auto_fits_the_subset_its_cost_model_allows(monkeypatch):
    """40,000 rows whose measured cost (injected here: 0.27 ms + 2 us per row per gradient) puts the
    first warm-up on every row far past a quarter of 3 s: "auto" fits the largest subset the model
    allows, warns, and returns a posterior within the budget. The budget's clock is injected too
    (2 ms per reading), so nothing depends on this machine's speed."""
    X, y = interactions(40_000, 7, seed=2)
    kw = dict(n_iterations=1000, n_chains=4, n_warmup=20, n_samples=5, max_tree_depth=4, max_seconds=3.0,
              clock="cpu", n_threads=1)
    a, b = 2.7e-4, 2e-6
    monkeypatch.setattr(dcc_rows, "gradient_cost_model", lambda *args, **kwargs: (a, b))
    tick = TickClock(0.002)
    monkeypatch.setitem(driver.CLOCKS, "cpu", tick)
    expected = dcc_rows.auto_rows(40_000, 3.0, 20 + MIN_DRAWS, 2**4 - 1, a, b)
    assert dcc_rows.MIN_AUTO_ROWS <= expected < 40_000
    with pytest.warns(UserWarning, match=rf"DCC fits {expected} of 40000 rows .*max_seconds=3 \(cpu clock\)"):
        post = DCC(**kw).run((X, y), seed=0)
    assert tick.t <= 3.0 + 8 * tick.step
    assert post.info["rows_used"] == expected and post.info["rows_total"] == 40_000
    assert len(post.topologies) >= 1 and np.isfinite(post.predict_proba(X[:10])).all()


def test_auto_model_picks_the_largest_subset_that_fits():
    # 100 transitions x 10 gradients of (1 ms + 1 us per row) within a quarter of 10 s: 1500 rows
    assert dcc_rows.auto_rows(10_000, 10.0, 100, 10, 1e-3, 1e-6) == 1500
    assert dcc_rows.auto_rows(1_400, 10.0, 100, 10, 1e-3, 1e-6) is None  # every row fits
    assert dcc_rows.auto_rows(10_000, 1.0, 100, 10, 1e-3, 1e-6) is None  # not even the floor fits


class _Interrupt(Exception):
    pass


def _fake_cost(rows):
    """A cost model under which "auto" picks ``rows`` rows (of SMALL, with max_seconds=1e6)."""
    transitions, leapfrog = SMALL["n_warmup"] + 2, 2 ** SMALL["max_tree_depth"] - 1
    return lambda *a, **k: (0.0, dcc_rows.BUDGET_SHARE * 1e6 / (transitions * leapfrog * (rows + 0.5)))


def test_resumed_auto_run_keeps_its_rows(tmp_path, monkeypatch):
    """The checkpoint keeps the rows "auto" chose; a resumed run whose pilot would choose
    others fits the same rows and ends as the uninterrupted run."""
    X, y = interactions(1000, 7, seed=5)
    kw = dict(SMALL, n_iterations=4, max_seconds=1e6)
    monkeypatch.setattr(dcc_rows, "gradient_cost_model", _fake_cost(600))
    with pytest.warns(UserWarning, match="600 of 1000"):
        ref = DCC(**kw).run((X, y), seed=3)
    path = str(tmp_path / "dcc.ckpt")

    def stop(it):
        if it == 1:
            raise _Interrupt

    with pytest.raises(_Interrupt), pytest.warns(UserWarning, match="600 of 1000"):
        DCC(checkpoint=path, **kw).run((X, y), seed=3, monitor=CallbackMonitor(on_checkpoint=stop))
    monkeypatch.setattr(dcc_rows, "gradient_cost_model", _fake_cost(800))
    resumed = _no_warnings(lambda: DCC(checkpoint=path, **kw).run((X, y), seed=3))
    assert resumed.info["resumed_from_iteration"] == 1 and resumed.info["rows_used"] == 600
    _same(ref, resumed, X)


def _warmup_cost(fits: int, rows: int = dcc_rows.MIN_AUTO_ROWS, budget: float = 1e6):
    """A cost model under which ``fits`` transitions of SMALL's first warm-up fit the budget's share on
    ``rows`` rows, and no subset of more than ``MIN_AUTO_ROWS`` rows fits its whole warm-up."""
    leapfrog = 2 ** SMALL["max_tree_depth"] - 1
    per_call = dcc_rows.BUDGET_SHARE * budget / ((fits + 0.5) * leapfrog)
    return lambda *a, **k: (per_call - 1e-9 * rows, 1e-9)


def test_auto_shortens_the_warm_up_when_even_the_smallest_subset_cannot_afford_it(monkeypatch):
    """Rows are cut to MIN_AUTO_ROWS and the warm-up to what the cost model says fits, with a warning
    naming both; the run returns a posterior whose topologies warmed up that long."""
    X, y = interactions(2000, 7, seed=5)
    kw = dict(SMALL, n_warmup=60, max_seconds=1e6)
    monkeypatch.setattr(dcc_rows, "gradient_cost_model", _warmup_cost(fits=34))  # 32 warm-up + MIN_DRAWS
    with pytest.warns(UserWarning, match=r"DCC fits 500 of 2000 rows .* with a warm-up of 32 iterations: .*"
                                         r"only 32 of n_warmup=60"):
        post = DCC(**kw).run((X, y), seed=0)
    assert post.info["rows_used"] == 500 and post.info["warmup_used"] == 32
    assert len(post.topologies) >= 1 and np.isfinite(post.predict_proba(X[:10])).all()
    assert dcc_rows.auto_warmup(500, 1e6, 60, MIN_DRAWS, 2 ** SMALL["max_tree_depth"] - 1,
                                *_warmup_cost(34)()) == 32


def test_auto_refuses_at_once_when_no_useful_warm_up_fits(monkeypatch):
    """Fewer than MIN_AUTO_WARMUP warm-up iterations fit even on MIN_AUTO_ROWS rows: a ValueError
    naming the budget it would need, before any NUTS transition (no hmc/... report)."""
    X, y = interactions(2000, 7, seed=5)
    kw = dict(SMALL, n_warmup=150, max_seconds=1e6)
    monkeypatch.setattr(dcc_rows, "gradient_cost_model", _warmup_cost(fits=20))  # 18 < MIN_AUTO_WARMUP
    steps = []
    with pytest.raises(ValueError, match=r"max_seconds=1e\+06 \(wall clock\) cannot afford even 30 warm-up "
                                         r"iterations .* on 500 rows .*raise max_seconds to \S+ or more") as err:
        DCC(**kw).run((X, y), seed=0, monitor=CallbackMonitor(on_step=lambda s, i: steps.append(i)))
    assert not steps
    # the advice has headroom over the estimate (1.5x, rounded up): taking it is not refused again
    advised = float(re.search(r"raise max_seconds to (\S+) or more", str(err.value)).group(1))
    need = float(re.search(r"estimated (\S+) s, which must fit", str(err.value)).group(1))
    assert advised >= 1.5 * need / dcc_rows.BUDGET_SHARE * 0.999
    assert dcc_rows.auto_warmup(500, advised, 150, MIN_DRAWS, 2 ** SMALL["max_tree_depth"] - 1,
                                *_warmup_cost(20)()) >= dcc_rows.MIN_AUTO_WARMUP


def test_a_small_table_keeps_its_rows_and_shortens_its_warm_up(monkeypatch):
    """A table of MIN_AUTO_ROWS rows or fewer is never cut; its warm-up is shortened the same way."""
    X, y = interactions(300, 7, seed=5)
    kw = dict(SMALL, n_warmup=40, max_seconds=1e6)
    monkeypatch.setattr(dcc_rows, "gradient_cost_model", _warmup_cost(fits=34, rows=300))
    with pytest.warns(UserWarning, match=r"DCC fits all 300 rows with a warm-up of 32 iterations"):
        post = DCC(**kw).run((X, y), seed=0)
    assert post.info["rows_used"] == 300 and post.info["warmup_used"] == 32
