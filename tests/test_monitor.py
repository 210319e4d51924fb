"""Tests for torchtree.monitor."""
from __future__ import annotations

import copy
import io
import os
import pickle

import numpy as np
import pytest
import torch

from torchtree.monitor import (
    Monitor,
    MonitorList,
    NullMonitor,
    ProgressMonitor,
    TensorBoardMonitor,
    TraceMonitor,
    as_monitor,
)


def _run(monitor, n_steps: int = 5, seed: int = 0):
    """Drive a monitor like a sampler would; return what was sent."""
    g = torch.Generator().manual_seed(seed)
    sent = []
    monitor.on_start({"sampler": "smc", "n_particles": 8, "total": n_steps})
    for step in range(n_steps):
        info = {
            "smc/ess": torch.tensor(8.0 - step, dtype=torch.float64),
            "smc/log_evidence": -10.0 * (step + 1),
            "smc/resampled": step % 2 == 0,
            "trees/n_leaves": torch.randint(1, 6, (8,), generator=g),
            "trees/depth": torch.rand(8, generator=g),
        }
        sent.append(info)
        monitor.on_step(step, info)
    monitor.on_end({"smc/log_evidence": -55.5, "runtime_s": 1.25, "note": "done"})
    return sent


# ----------------------------------------------------------------------------
# TraceMonitor
# ----------------------------------------------------------------------------


def test_trace_monitor_records():
    tm = TraceMonitor()
    sent = _run(tm)
    assert tm.steps == [0, 1, 2, 3, 4]
    assert tm.start_info == {"sampler": "smc", "n_particles": 8, "total": 5}
    assert tm.end_info["smc/log_evidence"] == -55.5 and tm.end_info["note"] == "done"
    assert set(tm.trace) == set(sent[0])
    for step, info in enumerate(sent):
        assert torch.equal(tm.trace["trees/n_leaves"][step], info["trees/n_leaves"])
        assert tm.trace["smc/log_evidence"][step] == info["smc/log_evidence"]
    arrays = tm.as_arrays()
    assert set(arrays) == {"smc/ess", "smc/log_evidence", "smc/resampled"}
    np.testing.assert_array_equal(arrays["smc/ess"], [8.0, 7.0, 6.0, 5.0, 4.0])
    assert arrays["smc/ess"].dtype == np.float64
    np.testing.assert_array_equal(arrays["smc/log_evidence"], [-10, -20, -30, -40, -50])
    assert arrays["smc/resampled"].dtype == bool
    np.testing.assert_array_equal(arrays["smc/resampled"], [True, False, True, False, True])


def test_trace_monitor_copies_tensors():
    """The sampler may reuse a buffer in place; the trace must not change."""
    tm = TraceMonitor()
    buf = torch.zeros(3, requires_grad=False)
    x = torch.tensor(1.0, requires_grad=True) * 2
    tm.on_step(0, {"v": buf, "x": x})
    buf += 5
    tm.on_step(1, {"v": buf})
    assert tm.trace["v"][0].tolist() == [0.0, 0.0, 0.0]
    assert tm.trace["v"][1].tolist() == [5.0, 5.0, 5.0]
    assert not tm.trace["x"][0].requires_grad
    assert tm.trace_steps == {"v": [0, 1], "x": [0]}
    assert tm.as_arrays()["x"].tolist() == [2.0]


def test_trace_monitor_integer_and_nested():
    tm = TraceMonitor()
    tm.on_step(0, {"mcmc": {"accepted": 3, "move": "grow"}})
    tm.on_step(1, {"mcmc": {"accepted": np.int64(4), "move": "prune"}})
    arr = tm.as_arrays()
    assert arr["mcmc/accepted"].dtype == np.int64 and arr["mcmc/accepted"].tolist() == [3, 4]
    assert "mcmc/move" not in arr and tm.trace["mcmc/move"] == ["grow", "prune"]


# ----------------------------------------------------------------------------
# TensorBoardMonitor
# ----------------------------------------------------------------------------


def _accumulator(path):
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    acc = EventAccumulator(str(path), size_guidance={"scalars": 0, "histograms": 0, "tensors": 0})
    acc.Reload()
    return acc


def test_tensorboard_writes_readable_events(tmp_path):
    tb = TensorBoardMonitor(tmp_path / "run", prefix="exp1")
    assert not (tmp_path / "run").exists(), "the writer is created lazily"
    sent = _run(tb)
    assert tb._writer is not None, "on_end flushes; the file stays open for what follows the run"
    twin = copy.deepcopy(tb)  # as sklearn's clone of an estimator holding the monitor: no writer copied
    assert twin._writer is None and twin.logdir == tb.logdir and pickle.loads(pickle.dumps(tb))._writer is None
    files = os.listdir(tmp_path / "run")
    assert len(files) == 1 and files[0].startswith("events.out.tfevents")
    assert any(f.startswith("events.out.tfevents") for f in files)

    acc = _accumulator(tmp_path / "run")
    tags = acc.Tags()
    assert "exp1/smc/ess" in tags["scalars"]
    ess = acc.Scalars("exp1/smc/ess")
    assert [e.step for e in ess] == [0, 1, 2, 3, 4]
    assert [e.value for e in ess] == [8.0, 7.0, 6.0, 5.0, 4.0]
    # log_evidence: one value per step, then the final one from on_end at the last step.
    le = acc.Scalars("exp1/smc/log_evidence")
    assert [(e.step, e.value) for e in le] == [(0, -10.0), (1, -20.0), (2, -30.0), (3, -40.0), (4, -50.0), (4, -55.5)]
    assert [e.value for e in acc.Scalars("exp1/smc/resampled")] == [1.0, 0.0, 1.0, 0.0, 1.0]
    assert [e.value for e in acc.Scalars("exp1/runtime_s")] == [1.25]
    # 1-D tensors are histograms with the right count and range.
    assert {"exp1/trees/n_leaves", "exp1/trees/depth"} <= set(tags["histograms"])
    hist = acc.Histograms("exp1/trees/n_leaves")
    assert len(hist) == 5
    for event, info in zip(hist, sent):
        h = event.histogram_value
        assert h.num == 8
        assert h.min == float(info["trees/n_leaves"].min())
        assert h.max == float(info["trees/n_leaves"].max())
        assert h.sum == pytest.approx(float(info["trees/n_leaves"].sum()))
    # Text summaries (start config, end summary, string values) land as tensors.
    assert {"exp1/start/text_summary", "exp1/summary/text_summary", "exp1/note/text_summary"} <= set(tags["tensors"])
    summary = acc.Tensors("exp1/summary/text_summary")[0].tensor_proto.string_val[0].decode()
    assert "| smc/log_evidence | -55.5 |" in summary


def test_tensorboard_no_prefix_no_histograms_nonfinite(tmp_path):
    tb = TensorBoardMonitor(tmp_path, histograms=False)
    tb.on_start({})
    tb.on_step(3, {"a": torch.tensor(float("-inf")), "h": torch.arange(4.0), "n": None, "o": object()})
    tb.on_step(4, {"a": 2.5})
    tb.on_end({})
    acc = _accumulator(tmp_path)
    assert acc.Tags()["histograms"] == []
    vals = [(e.step, e.value) for e in acc.Scalars("a")]
    assert vals == [(3, float("-inf")), (4, 2.5)]


def test_tensorboard_leaves_nan_scalars_out(tmp_path):
    """A NaN scalar (undefined at that step) is not written; the steps where the tag is defined are."""
    tb = TensorBoardMonitor(tmp_path)
    tb.on_start({})
    tb.on_step(0, {"accept/grow": float("nan"), "accept": torch.tensor(0.0), "rhat": torch.tensor(float("nan"))})
    tb.on_step(1, {"accept/grow": torch.tensor(0.25), "accept": 0.5, "rhat": float("nan")})
    tb.on_end({})
    acc = _accumulator(tmp_path)
    assert [(e.step, e.value) for e in acc.Scalars("accept/grow")] == [(1, 0.25)]
    assert [(e.step, e.value) for e in acc.Scalars("accept")] == [(0, 0.0), (1, 0.5)]
    assert "rhat" not in acc.Tags()["scalars"]
    tb.add_curve("curve", [1.0, 2.0, 3.0], [-1.0, float("nan"), -2.0])
    acc = _accumulator(tmp_path)
    assert [(e.step, e.value) for e in acc.Scalars("curve")] == [(0, -1.0), (2, -2.0)]


def test_tensorboard_histogram_skips_nonfinite_and_empty(tmp_path):
    tb = TensorBoardMonitor(tmp_path)
    tb.on_step(0, {"h": torch.tensor([1.0, float("nan"), 3.0, float("inf")]), "e": torch.zeros(0)})
    tb.on_step(1, {"h": torch.tensor([float("nan")])})
    tb.close()
    tb.close()  # idempotent
    acc = _accumulator(tmp_path)
    hist = acc.Histograms("h")
    assert len(hist) == 1 and hist[0].histogram_value.num == 2
    assert "e" not in acc.Tags()["histograms"]


# ----------------------------------------------------------------------------
# ProgressMonitor
# ----------------------------------------------------------------------------


def test_progress_monitor_disabled_when_not_tty():
    pm = ProgressMonitor(file=io.StringIO())
    assert pm.disable
    _run(pm)
    assert pm.bar is None


def test_progress_monitor_forced_on_shows_postfix():
    out = io.StringIO()
    pm = ProgressMonitor(desc="smc", disable=False, file=out, mininterval=0.0)
    pm.on_start({"total": 3})
    assert pm.bar.total == 3
    pm.on_step(0, {"smc/ess": torch.tensor(7.5), "smc/log_evidence": -1.0, "other": 3.0, "h": torch.ones(4)})
    pm.on_step(1, {"smc/ess": torch.tensor(6.5), "smc/log_evidence": -2.0, "other": 3.0})
    assert pm.bar.n == 2
    assert pm.bar.postfix is not None
    assert "ess=6.5" in pm.bar.postfix and "log_evidence=-2" in pm.bar.postfix
    assert "other" not in pm.bar.postfix, "default keys prefer the known diagnostics"
    pm.on_end({"smc/log_evidence": -3.25})
    assert pm.bar is None
    text = out.getvalue()
    assert "smc" in text and "2/3" in text and "log_evidence=-3.25" in text


def test_progress_monitor_explicit_keys_and_fallback():
    pm = ProgressMonitor(disable=False, file=io.StringIO(), keys=["mcmc/accept"], mininterval=0.0)
    pm.on_start({})
    pm.on_step(0, {"mcmc/accept": 0.25, "smc/ess": 3.0})
    assert "accept=0.25" in pm.bar.postfix and "ess" not in pm.bar.postfix
    pm.close()
    pm2 = ProgressMonitor(disable=False, file=io.StringIO(), mininterval=0.0)
    pm2.on_start({})
    pm2.on_step(0, {"x": 1.0, "s": "text"})
    assert "x=1" in pm2.bar.postfix
    pm2.close()


# ----------------------------------------------------------------------------
# composition, coercion, ranks
# ----------------------------------------------------------------------------


class _Counting:
    """Duck-typed monitor (not a Monitor subclass)."""

    def __init__(self):
        self.calls = []

    def on_start(self, info):
        self.calls.append(("start", dict(info)))

    def on_step(self, step, info):
        self.calls.append(("step", step))

    def on_end(self, info):
        self.calls.append(("end", dict(info)))


def test_monitor_list_calls_all_in_order():
    a, b, tm = _Counting(), _Counting(), TraceMonitor()
    ml = as_monitor([a, None, (b, tm)])
    assert isinstance(ml, MonitorList) and len(ml) == 3
    _run(ml, n_steps=3)
    expected = ["start", "step", "step", "step", "end"]
    assert [c[0] for c in a.calls] == expected
    assert [c[0] for c in b.calls] == expected
    assert [c[1] for c in a.calls if c[0] == "step"] == [0, 1, 2]
    assert tm.steps == [0, 1, 2]


def test_as_monitor_basics_and_errors():
    assert isinstance(as_monitor(None), NullMonitor)
    tm = TraceMonitor()
    assert as_monitor(tm) is tm
    c = _Counting()
    assert as_monitor(c) is c
    NullMonitor().on_step(0, {})  # no-op, no error
    Monitor().on_start({})
    with pytest.raises(TypeError, match="monitor must be None"):
        as_monitor("tensorboard")
    with pytest.raises(TypeError, match="monitor must be None"):
        as_monitor(42)
    with pytest.raises(TypeError, match="dict"):
        as_monitor([TraceMonitor(), {"on_step": 1}])


def test_rank_gating(tmp_path):
    tm0, tm_all, tb = TraceMonitor(), TraceMonitor(all_ranks=True), TensorBoardMonitor(tmp_path / "tb")
    # Rank 0 keeps everything.
    assert as_monitor(tm0, rank=0) is tm0
    # Rank 1: monitors without all_ranks are gated off.
    gated = as_monitor(tm0, rank=1)
    gated.on_start({"a": 1})
    gated.on_step(0, {"a": 1.0})
    gated.on_end({})
    assert tm0.steps == [] and tm0.start_info is None
    ml = as_monitor([tm0, tm_all, tb], rank=1)
    _run(ml, n_steps=2)
    assert tm0.steps == []
    assert tm_all.steps == [0, 1] and tm_all.rank == 1
    assert not (tmp_path / "tb").exists(), "gated TensorBoard monitor must not create files"


def test_tensorboard_all_ranks_writes_per_rank_dir(tmp_path):
    tbs = [TensorBoardMonitor(tmp_path, all_ranks=True) for _ in range(2)]
    for r, tb in enumerate(tbs):
        m = as_monitor(tb, rank=r)
        m.on_step(0, {"x": float(r)})
        m.on_end({})
    for r in range(2):
        acc = _accumulator(tmp_path / f"rank{r}")
        assert [e.value for e in acc.Scalars("x")] == [float(r)]


def test_progress_rank_gating():
    pm = ProgressMonitor(disable=False, file=io.StringIO())
    assert isinstance(as_monitor(pm, rank=2), NullMonitor)
    pm_all = ProgressMonitor(disable=False, file=io.StringIO(), all_ranks=True, desc="run")
    m = as_monitor(pm_all, rank=2)
    m.on_start({"total": 1})
    assert "[rank 2]" in m.bar.desc
    m.close()


def test_a_monitor_without_on_step_does_not_make_samplers_compute_reports(monkeypatch):
    """Per-step reports cost time (tree statistics every stage): a monitor that only listens
    to on_start / on_end (wants_steps False) must not make the sampler build them."""
    import numpy as np

    import torchtree.samplers.topdown.sampler as topdown
    from torchtree import Data, TopDownSMC
    from torchtree.monitor import CallbackMonitor, MonitorList

    calls = []
    real = topdown.tree_report
    monkeypatch.setattr(topdown, "tree_report", lambda *a: calls.append(1) or real(*a))
    X = np.random.default_rng(0).normal(size=(50, 2))
    data = Data(X, (X[:, 0] > 0).astype(int))
    started = []
    TopDownSMC(n_particles=10).run(data, seed=0, monitor=CallbackMonitor(on_start=started.append))
    assert started and not calls
    both = MonitorList([CallbackMonitor(on_start=started.append), CallbackMonitor(on_step=lambda s, i: None)])
    TopDownSMC(n_particles=10).run(data, seed=0, monitor=both)
    assert calls  # one member reads the reports


def test_a_disabled_progress_bar_costs_no_per_step_work():
    """A disabled ProgressMonitor (what the CLI attaches when stderr is no terminal) used to make the
    samplers build their per-step reports anyway: +8% work here, 2x CPU on 140k rows. Counted in
    function calls, not seconds."""
    from _counting import Calls

    from torchtree import Data, TopDownSMC
    from torchtree.datasets.scale import interactions
    from torchtree.monitor import ProgressMonitor

    X, y = interactions(20000, 10, seed=0)
    data = Data(X, y)
    assert ProgressMonitor(disable=True).wants_steps is False and ProgressMonitor(disable=False).wants_steps
    counts = []
    for mon in (None, ProgressMonitor(disable=True)):
        with Calls() as c:
            TopDownSMC(n_particles=100, proposal="empirical").run(data, seed=0, monitor=mon)
        counts.append(c.n)
    assert counts[1] <= 1.02 * counts[0], counts
