"""Real multi-process tests of torchtree.distributed: gloo ranks and MPI ranks on CPU.

Jobs (all started together when the module's first test asks for them, so that their start-up
and the kill tests' waiting overlap):

* ``gloo/check``: 4 processes launched exactly as ``torchrun`` would (``RANK``, ``WORLD_SIZE``,
  ``LOCAL_RANK``, ``MASTER_ADDR``, ``MASTER_PORT``; the worker calls
  ``TorchDistBackend.from_env``), running every check on sub-groups of sizes 1, 2, 3 and 4;
* ``mpi/check``: ``mpiexec -n 4``, same checks on sub-communicators of sizes 1..4;
* ``gloo/kill`` and ``mpi/kill``: 3 ranks, rank 1 ``os._exit``s; the survivors must get an
  error within the 10 s timeout;
* ``gloo/hang``: 2 ranks, rank 1 stays alive but silent; rank 0 must time out.

Every output is compared here with a single-process reference: bit-identical for the
redistributions, ncopies and integer prefix sums. MPI tests skip cleanly without
mpiexec/mpi4py.
"""

from __future__ import annotations

import importlib.util
import json
import math
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import torch

import torchtree.distributed as td

WORKERS = Path(__file__).parent / "_dist_workers"
sys.path.insert(0, str(WORKERS))
import dist_cases as dc  # noqa: E402
from _launch import Job, gloo_ranks, torchrun  # noqa: E402

pytestmark = pytest.mark.distributed

KILL_TIMEOUT = 10.0
JOB_DEADLINE = 150.0


def _mpiexec() -> str | None:
    if importlib.util.find_spec("mpi4py") is None:
        return None
    local = Path(sys.executable).parent / "mpiexec"
    return str(local) if local.exists() else shutil.which("mpiexec")


def _is_hydra(mpiexec: str) -> bool:
    try:
        out = subprocess.run([mpiexec, "--version"], capture_output=True, text=True, timeout=20)
    except (OSError, subprocess.TimeoutExpired):
        return False
    return "HYDRA" in out.stdout.upper()


def _launch_gloo(out_dir: Path, nprocs: int, mode: str) -> Job:
    return gloo_ranks("redistribution_worker.py", ["gloo", out_dir, mode], nprocs, WORKERS, out_dir, JOB_DEADLINE,
                      env=lambda r: dict(os.environ, TT_TEST_TIMEOUT=str(KILL_TIMEOUT), OMP_NUM_THREADS="1"),
                      tail=3000)


def _launch_mpi(out_dir: Path, nprocs: int, mode: str, extra: list[str]) -> Job:
    env = dict(os.environ, TT_TEST_TIMEOUT=str(KILL_TIMEOUT), OMP_NUM_THREADS="1")
    log = open(out_dir / "mpi.log", "w")
    cmd = [_mpiexec(), *extra, "-n", str(nprocs), sys.executable, "redistribution_worker.py", "mpi",
           str(out_dir), mode]
    proc = subprocess.Popen(cmd, cwd=WORKERS, env=env, stdout=log, stderr=subprocess.STDOUT,
                            start_new_session=True)
    return Job([proc], out_dir, JOB_DEADLINE, tail=3000)


@pytest.fixture(scope="module")
def jobs(tmp_path_factory):
    """Start every job at once; tests wait only for the one they read."""
    started = {}

    def out(name):
        return tmp_path_factory.mktemp(name.replace("/", "_"))

    started["gloo/check"] = _launch_gloo(out("gloo_check"), 4, "check")
    started["gloo/kill"] = _launch_gloo(out("gloo_kill"), 3, "kill")
    started["gloo/hang"] = _launch_gloo(out("gloo_hang"), 2, "hang")
    mpiexec = _mpiexec()
    if mpiexec is not None:
        started["mpi/check"] = _launch_mpi(out("mpi_check"), 4, "check", [])
        hydra = _is_hydra(mpiexec)
        # Hydra kills the survivors as soon as one rank dies; let them report instead.
        started["mpi/kill"] = _launch_mpi(out("mpi_kill"), 3, "kill", ["-disable-auto-cleanup"] if hydra else [])
        started["mpi/kill"].hydra = hydra
    yield started
    for job in started.values():
        job.wait()


def _results(jobs, kind: str) -> list[dict]:
    if kind not in {k.split("/")[0] for k in jobs}:
        pytest.skip("mpiexec or mpi4py not available")
    job = jobs[f"{kind}/check"].wait()
    assert job.codes == [0] * len(job.codes), f"{kind} job failed {job.codes}:\n{job.logs}"
    files = sorted(job.out_dir.glob("rank*.pt"))
    assert len(files) == 4, job.logs
    return [torch.load(f, weights_only=False) for f in files]


def _same(a, b) -> bool:
    """Bitwise equality (NaN == NaN), dtype and shape included."""
    if a.dtype != b.dtype or a.shape != b.shape:
        return False
    if a.is_floating_point():
        a = a.view({2: torch.int16, 4: torch.int32, 8: torch.int64}[a.element_size()])
        b = b.view({2: torch.int16, 4: torch.int32, 8: torch.int64}[b.element_size()])
    return torch.equal(a, b)


def _cat(per_rank: list[dict], key: str):
    return [r[key] for r in per_rank]


def _check_primitives(res: list[dict], s: int) -> None:
    x = torch.tensor([[r + 1.0, -r, 2.0 ** r] for r in range(s)], dtype=torch.float64)
    for r, out in enumerate(res):
        assert out["rank"] == r and out["world_size"] == s
        assert torch.equal(out["all_reduce_sum"], x.sum(0, keepdim=True))
        assert torch.equal(out["all_reduce_max"], x.max(0, keepdim=True).values)
        assert torch.equal(out["all_reduce_min"], x.min(0, keepdim=True).values)
        assert out["all_reduce_int"].tolist() == [sum(range(s)), 10 * sum(range(s))]
        assert out["all_reduce_bool"].tolist() == [s == 1, True]
        assert out["exclusive_scan"].tolist() == [sum(q + 1 for q in range(r)), sum(2 * q + 3 for q in range(r))]
        assert torch.equal(out["all_gather"], torch.cat([torch.full((2, 3), float(q)) for q in range(s)]))
        assert out["all_gather_bool"].tolist() == [q % 2 == 0 for q in range(s)]
        left = (r - 1) % s
        assert torch.equal(out["sendrecv"], torch.arange(4, dtype=torch.int32) + 100 * left)
        assert torch.equal(out["sendrecv_out"], out["sendrecv"])
        if r >= 1:
            assert torch.equal(out["sendrecv_half"], torch.arange(4, dtype=torch.int32) + 100 * (r - 1))
        else:
            assert out["sendrecv_half"] is None
        got = out["all_to_all"]
        assert len(got) == s
        for src in range(s):
            assert torch.equal(got[src], torch.full(((src + r) % 3, 2), float(10 * src + r)))
        assert out["broadcast"].tolist() == [float(s - 1), 7.0]


def _check_resampling(res: list[dict], s: int) -> None:
    lw = dc.log_weights(dc.N_TOTAL, seed=s)
    ref_sys = td.ncopies_from_log_weights(lw, u=dc.SYSTEMATIC_U)
    g = torch.Generator().manual_seed(dc.MULTINOMIAL_SEED)
    ref_mult = td.ncopies_from_log_weights(lw, method="multinomial", generator=g)
    assert torch.equal(torch.cat(_cat(res, "ncopies_systematic")), ref_sys)
    assert torch.equal(torch.cat(_cat(res, "ncopies_multinomial")), ref_mult)
    vals = dc.int_values(dc.N_TOTAL, seed=s)
    assert torch.equal(torch.cat(_cat(res, "prefix_int")), torch.cumsum(vals, 0))
    assert torch.equal(torch.cat(_cat(res, "prefix_int_excl")), torch.cumsum(vals, 0) - vals)
    torch.testing.assert_close(torch.cat(_cat(res, "prefix_float")), torch.cumsum(vals.double() / 7, 0),
                               rtol=1e-12, atol=1e-9)
    for out in res:
        torch.testing.assert_close(out["ess"], td.global_ess(lw), rtol=1e-12, atol=0)
        torch.testing.assert_close(out["lse"], td.global_log_sum_exp(lw), rtol=1e-14, atol=0)


def _check_redistribution(res: list[dict], s: int) -> None:
    block = dc.make_block(dc.N_TOTAL, seed=s)
    keys = [k for k in res[0] if isinstance(k, str) and "/" in k and not k.startswith(("bad/", "padded/"))]
    assert len(keys) == len(dc.CASES) * len(dc.METHODS) + 2 * len(dc.METHODS) + 1
    for key in keys:
        case = key.split("/")[0]
        ref = td.sequential_redistribute(block, dc.ncopies_case(case, dc.N_TOTAL, s, seed=s))
        for field, want in ref.items():
            got = torch.cat([out[key][field] for out in res])
            assert _same(got, want), f"world {s}, {key}, field {field}"
    # Padded to the largest capacity across ranks, then redistributed.
    cap = 3 + s - 1
    assert all(int(out["capacity"]) == cap for out in res)
    parts = []
    for r in range(s):
        rows = slice(r * dc.N_TOTAL // s, (r + 1) * dc.N_TOTAL // s)
        small = {k: v[rows] for k, v in dc.make_block(dc.N_TOTAL, capacity=3 + r, seed=s).items()}
        parts.append(td.pad_block(small, cap, dc.NODE_KEYS, {"feature": -1, "threshold": float("nan"), "stats": 0.0}))
    padded = {k: torch.cat([p[k] for p in parts]) for k in parts[0]}
    ref = td.sequential_redistribute(padded, dc.ncopies_case("random", dc.N_TOTAL, s, seed=s))
    for method in dc.METHODS:
        for field, want in ref.items():
            assert _same(torch.cat([out[f"padded/{method}"][field] for out in res]), want), (method, field)
    for method in dc.METHODS:
        for out in res:
            assert out[f"bad/{method}"].startswith("ValueError"), out[f"bad/{method}"]


@pytest.mark.parametrize("kind", ["gloo", "mpi"])
@pytest.mark.parametrize("size", dc.GROUP_SIZES)
def test_ranks_match_single_process(jobs, kind, size):
    """Primitives, prefix sums, ncopies and every redistribution == single-process reference."""
    per_rank = _results(jobs, kind)
    res = [r[size] for r in per_rank[:size]]
    assert all(size not in r for r in per_rank[size:])
    _check_primitives(res, size)
    _check_resampling(res, size)
    _check_redistribution(res, size)


@pytest.mark.parametrize("kind", ["gloo", "mpi"])
def test_killed_rank_fails_the_others(jobs, kind):
    """Rank 1 of 3 dies; ranks 0 and 2 must raise within the timeout instead of hanging."""
    if f"{kind}/kill" not in jobs:
        pytest.skip("mpiexec or mpi4py not available")
    job = jobs[f"{kind}/kill"].wait()
    assert job.elapsed < JOB_DEADLINE - 5, f"{kind} kill job hung:\n{job.logs}"
    records = {int(p.stem[4:]): json.loads(p.read_text()) for p in job.out_dir.glob("rank*.json")}
    if kind == "mpi" and not getattr(job, "hydra", True):
        # Other launchers kill the survivors themselves; all we can require is a prompt end.
        assert job.codes != [0]
        return
    assert sorted(records) == [0, 2], job.logs
    for rec in records.values():
        assert rec["error"] is not None and rec["is_runtime_or_timeout"], rec
        assert rec["elapsed"] < KILL_TIMEOUT + 5.0, rec


def test_silent_rank_times_out_gloo(jobs):
    """Rank 1 of 2 stays alive but never joins: rank 0 gets CollectiveTimeout after ~10 s."""
    job = jobs["gloo/hang"].wait()
    rec = json.loads((job.out_dir / "rank0.json").read_text())
    assert rec["error"] == "CollectiveTimeout", rec
    assert KILL_TIMEOUT - 0.5 < rec["elapsed"] < KILL_TIMEOUT + 5.0, rec


@pytest.mark.slow
def test_torchrun_launch(tmp_path):
    """The real launcher: torchrun --nproc-per-node 2 runs the check job on gloo."""
    proc = torchrun(["redistribution_worker.py", "gloo", tmp_path, "check"], WORKERS, timeout=JOB_DEADLINE)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    per_rank = [torch.load(tmp_path / f"rank{r}.pt", weights_only=False) for r in range(2)]
    for size in (1, 2):
        res = [r[size] for r in per_rank[:size]]
        _check_primitives(res, size)
        _check_resampling(res, size)
        _check_redistribution(res, size)


def test_cases_are_valid():
    """The shared cases themselves: sums, divisibility, the 'last rank only' property."""
    for s in dc.GROUP_SIZES:
        assert dc.N_TOTAL % s == 0
        for case in dc.CASES:
            nc = dc.ncopies_case(case, dc.N_TOTAL, s, seed=s)
            assert int(nc.sum()) == dc.N_TOTAL and bool((nc >= 0).all())
        last = dc.ncopies_case("last_rank_only", dc.N_TOTAL, s, seed=s)
        assert int(last[: dc.N_TOTAL - dc.N_TOTAL // s].sum()) == 0
    assert math.isinf(float(dc.log_weights(dc.N_TOTAL).min()))
