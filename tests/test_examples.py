"""Smoke tests of the runnable examples (examples/*.py) and benchmarks (benchmarks/*.py).

Every script of either folder that defines a ``--smoke`` option is discovered and run as
a subprocess with ``--smoke`` (a tiny configuration); the test asserts exit status 0
and, for each ``# smoke-expect: REGEX`` comment line in the script, that some line
of its standard output matches REGEX (``re.search`` per line). So a script
written by anyone is covered as soon as it has ``--smoke``; add ``smoke-expect``
lines to check its output too.

Marked ``slow``. Each script runs in a process of its own, forked from one that has imported torch already
(``_zygote.py``: the same as ``python SCRIPT --smoke`` but for the import's 3 CPU seconds;
``TORCHTREE_TEST_ZYGOTE=0`` starts a fresh interpreter per script instead).
"""
from __future__ import annotations

import os
import re
import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parent))
import _zygote  # noqa: E402

ROOT = Path(__file__).resolve().parents[1]
EXAMPLES = ROOT / "examples"
BENCHMARKS = ROOT / "benchmarks"
TIMEOUT = 600


def _smoke_examples():
    out = []
    for folder in (EXAMPLES, BENCHMARKS):
        for path in sorted(folder.glob("*.py")):
            text = path.read_text()
            if re.search(r"""add_argument\(\s*["']--smoke["']""", text):
                out.append(path)
    return out


def _expectations(path: Path):
    return [m.group(1).strip() for m in re.finditer(r"^\s*#\s*smoke-expect:\s*(.+)$", path.read_text(), re.M)]


SMOKE = _smoke_examples()


def test_examples_are_discovered():
    found = {p.relative_to(ROOT).as_posix() for p in SMOKE}
    # The examples of the user-facing layer and the benchmarks; others join when they define --smoke.
    for name in ("examples/quickstart.py", "examples/regression_intervals.py", "examples/tensorboard_monitoring.py",
                 "examples/paper001_reproduction.py", "benchmarks/bench_paper001.py", "benchmarks/headline.py"):
        if (ROOT / name).exists():
            assert name in found, f"{name} has no --smoke option"
    # every runnable script: each example and each benchmark behind `torchtree bench NAME` (helper modules aside)
    for path in sorted(EXAMPLES.glob("*.py")) + sorted(BENCHMARKS.glob("bench_*.py")):
        name = path.relative_to(ROOT).as_posix()
        assert path in SMOKE, f"{name} has no --smoke option"
        assert _expectations(path), f"{name} has no '# smoke-expect: REGEX' line checking its --smoke output"
    assert len({p.stem for p in SMOKE}) == len(SMOKE), "two smoke scripts share a name (the test ids)"
    for p in SMOKE:
        for rx in _expectations(p):
            re.compile(rx)  # malformed expectations fail here, not as a confusing mismatch


def _script_env() -> dict:
    """The environment every script here runs in: one for all, so that each is forked from the one zygote server
    (a request whose import-time variables differ from the server's runs as a fresh interpreter)."""
    env = dict(os.environ)
    env["PYTHONPATH"] = str(ROOT) + os.pathsep + env.get("PYTHONPATH", "")
    env.setdefault("OMP_NUM_THREADS", "1")
    return env


@pytest.mark.slow
@pytest.mark.parametrize("path", SMOKE, ids=[p.stem for p in SMOKE])
def test_example_smoke(path, tmp_path):
    r = _zygote.run([str(path), "--smoke"], cwd=tmp_path, env=_script_env(), timeout=TIMEOUT)
    assert r.returncode == 0, f"{path.name} exited {r.returncode}\n--- stdout\n{r.stdout[-3000:]}\n--- stderr\n{r.stderr[-3000:]}"
    lines = r.stdout.splitlines()
    for rx in _expectations(path):
        assert any(re.search(rx, line) for line in lines), f"{path.name}: no output line matches {rx!r}\n{r.stdout[-3000:]}"
    assert "Traceback" not in r.stderr


def _bench_dcc():
    import importlib.util

    spec = importlib.util.spec_from_file_location("bench_dcc", BENCHMARKS / "bench_dcc.py")
    bench = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(bench)
    return bench


def test_bench_dcc_paired_line():
    """DCC seeds on one split are averaged, then paired with the baseline of that split."""
    bench = _bench_dcc()
    dcc = [dict(split_seed=0, test=0.84), dict(split_seed=0, test=0.86), dict(split_seed=1, test=0.83)]
    base = [dict(split_seed=s, test=t, metric="acc") for s, t in [(0, 0.84), (1, 0.84), (2, 0.90)]]
    line = bench.paired_line("raisin", "mcmc", dcc, base)
    # differences +0.01 (split 0, mean of two seeds) and -0.01 (split 1); split 2 has no DCC row
    assert "paired over 2 splits: +0.0000 (standard error 0.0100; DCC better on 1, level on 0)" in line
    mse = [dict(split_seed=0, test=0.05, metric="mse")]
    assert "DCC better on 1" in bench.paired_line("wu", "smc", [dict(split_seed=0, test=0.04)], mse)
    assert bench.paired_line("raisin", "mcmc", [], base) is None


def test_bench_dcc_noise_floors_average_the_noise_variance():
    """The true function's test MSE over generated test sets averages the noise variance
    (WU sd 0.25, CGM sd 0.2); with leaf means fitted to n training points the true
    partition adds sigma^2 L / n on average (WU 3 leaves / 300 points, CGM 5 / 800;
    measured 0.00056 and 0.00023 against 0.00063 and 0.00025). 200 test sets, each
    mean within 4 standard errors."""
    import numpy as np

    bench = _bench_dcc()
    for name, var, leaves, n in [("wu", 0.25**2, 3, 300), ("cgm", 0.2**2, 5, 800)]:
        nf = bench.noise_floors(name, 200)
        assert len(nf["floors"]) == 200 and len(nf["partition"]) == 200
        assert abs(nf["mean"] - var) < 4 * nf["std"] / 200**0.5, (name, nf["mean"])
        # the excess of the fitted partition over the floor, paired by test set
        excess = np.asarray(nf["partition"]) - np.asarray(nf["floors"])
        assert abs(excess.mean() - var * leaves / n) < 4 * excess.std() / 200**0.5, (name, excess.mean())
        assert nf["quantiles"][0] < nf["quantiles"][1] < nf["quantiles"][2]
        assert nf["fraction_within_band"] == sum(f <= nf["band"] for f in nf["floors"]) / 200


def test_bench_threads_estimators_mode(tmp_path):
    """``bench_threads.py --estimators`` fits each named method at each thread setting and writes the rows."""
    import json

    out = tmp_path / "rows.json"
    r = _zygote.run([str(BENCHMARKS / "bench_threads.py"), "--estimators", "smc", "--datasets", "iris", "--threads", "1",
                     "2", "--json", str(out)], cwd=tmp_path, env=_script_env(), timeout=600)
    assert r.returncode == 0, r.stderr[-2000:]
    rows = json.loads(out.read_text())["estimators"]
    assert [(row["dataset"], row["method"], row["n_threads"]) for row in rows] == [("iris", "smc", "1"), ("iris", "smc", "2")]
    assert all(row["cpu_s"] > 0 and row["wall_s"] > 0 for row in rows)
