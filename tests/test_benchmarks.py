"""The benchmark suite (benchmarks/headline.py): its smoke mode runs every figure at tiny sizes,
and its comparison flags a figure slower than the tolerance. Speed itself is measured by
``make bench``, never asserted here."""
import importlib.util
import json
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def _headline():
    spec = importlib.util.spec_from_file_location("headline", ROOT / "benchmarks" / "headline.py")
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def test_smoke_runs_every_figure():
    """``--smoke`` (run by tests/test_examples.py, whose ``smoke-expect`` lines check the table's first and
    last rows) runs every figure of the record, at tiny sizes."""
    h = _headline()
    assert [c.name for c in h.cases(True)] == [c.name for c in h.cases(False)]


def test_the_record_holds_every_figure_at_one_and_two_threads():
    h = _headline()
    rec = json.loads(h.RECORD.read_text())["figures"]
    for c in h.cases(False):
        assert set(rec[c.name]) >= {"1", "2"}, c.name
        for t in ("1", "2"):
            assert rec[c.name][t]["fit_cpu"] > 0 and rec[c.name][t]["predict_cpu"] > 0


def test_compare_flags_a_slower_one_thread_figure(capsys):
    h = _headline()
    record = {"a": {"1": {"fit_cpu": 1.0, "predict_cpu": 1.0}, "2": {"fit_cpu": 1.0, "predict_cpu": 1.0}}}
    row = lambda fit, pred: {"fit_cpu": fit, "fit_wall": fit, "predict_cpu": pred, "predict_wall": pred}  # noqa: E731
    assert h.compare({"a": {"1": row(1.2, 0.5), "2": row(2.0, 1.0)}}, record, 1.3) == []  # 2 threads: shown, not failed
    flagged = h.compare({"a": {"1": row(1.0, 1.5)}}, record, 1.3)
    assert flagged == ["a/predict: 1.50x the recorded 1.000 CPU s"]
    assert "<-- SLOWER" in capsys.readouterr().out
