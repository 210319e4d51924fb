"""Multi-rank SMCSampler: 2 and 4 gloo ranks, 2 MPI ranks (and 2-4 thread ranks) equal one process.

Jobs (launched together when the module's first test asks for them):

* ``gloo``: 4 processes started as ``torchrun`` would, running every case of
  ``_dist_workers/smc_moves_cases.py`` on sub-groups of 2 and 4 ranks, a checkpointed run
  stopped after iteration 2 and resumed from its per-rank files, then
  ``benchmarks/bench_paper002.py --smoke --backend gloo`` on the 4 ranks;
* ``mpi``: ``mpiexec -n 2``, the same on 2 ranks (skipped without mpiexec / mpi4py).

Exactness: everything is compared bit for bit -- log evidence, predictive probabilities,
every tree field, final log-weights, ESS trace (the weight sums are exact integers, see
``torchtree.samplers.smc_moves``).
"""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path

import numpy as np
import pytest
import torch

WORKERS = Path(__file__).parent / "_dist_workers"
ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(WORKERS))
sys.path.insert(0, str(Path(__file__).parent))
import smc_moves_cases as sc  # noqa: E402
from test_topdown_dist import _same, launch_jobs, load_rank_results  # noqa: E402
from thread_backend import run_threads  # noqa: E402


from torchtree import SMCSampler  # noqa: E402

pytestmark = pytest.mark.distributed


@pytest.fixture(scope="module")
def jobs(tmp_path_factory):
    started = launch_jobs(tmp_path_factory, "smc_moves_worker.py", "smc_", "2,4", 2, "2",
                          extra=lambda kind: [str(tmp_path_factory.mktemp(f"smc_{kind}_ckpt"))])
    yield started
    for job in started.values():
        job.wait()


SIZES = {"gloo": (2, 4), "mpi": (2,)}
_LOADED: dict = {}


def _results(jobs, kind: str) -> list[dict]:
    return load_rank_results(jobs, kind, max(SIZES[kind]), _LOADED)


_REF: dict = {}


def _reference(name: str) -> dict:
    if name not in _REF:
        _REF[name] = sc.run_estimator() if name == "estimator" else sc.run_case(name)
    return _REF[name]


def _check(got: dict, ref: dict, where: str) -> None:
    assert got["log_evidence"] == ref["log_evidence"], where
    assert np.array_equal(got["pred"], ref["pred"]), where
    if "trees" not in ref:
        return
    for k, v in ref["trees"].items():
        assert _same(got["trees"][k], v), (where, k)
    assert _same(got["log_weights"], ref["log_weights"]), where
    for k in ("n_resample", "final_ess", "ess_trace", "temperatures", "accept_fraction"):
        assert got["info"][k] == ref["info"][k], (where, k)
    assert torch.equal(got["info"]["particle_counts"], ref["info"]["particle_counts"]), where


@pytest.mark.parametrize("kind", ["gloo", "mpi"])
@pytest.mark.parametrize("name", list(sc.CASES) + ["estimator"])
def test_ranks_equal_one_process(jobs, kind, name):
    per_rank = _results(jobs, kind)
    ref = _reference(name)
    for size in SIZES[kind]:
        for r in range(size):
            _check(per_rank[r][(size, name)], ref, f"{kind} world {size} rank {r} {name}")


@pytest.mark.parametrize("kind", ["gloo", "mpi"])
def test_resumed_multi_rank_run_equals_uninterrupted(jobs, kind):
    """Per-rank checkpoints + manifest: stopped after iteration 2, resumed, same result."""
    per_rank = _results(jobs, kind)
    size = max(SIZES[kind])
    ref = _reference("tempering_residual")
    for r in range(size):
        got = per_rank[r][(size, "resumed")]
        assert got["info"]["resumed_from"] == 2
        _check(got, ref, f"{kind} resumed rank {r}")
    files = sorted(p.name for p in Path(jobs[kind].out_dir).parent.glob(f"*ckpt*/{kind}_run.ckpt*"))
    assert f"{kind}_run.ckpt.manifest.json" in files and f"{kind}_run.ckpt.rank{size - 1}" in files, files


@pytest.mark.parametrize("kind", ["gloo", "mpi"])
def test_bench_example_smoke_distributed(jobs, kind, tmp_path, capsys):
    """benchmarks/bench_paper002.py --smoke on several ranks prints the one-rank table."""
    _results(jobs, kind)
    printed = (jobs[kind].out_dir / "example.txt").read_text()
    assert f"ranks={max(SIZES[kind])} ({kind})" in printed and "bench_paper002: done" in printed, printed
    spec = importlib.util.spec_from_file_location("bench_paper002", ROOT / "benchmarks" / "bench_paper002.py")
    bench = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(bench)
    threads = torch.get_num_threads()
    try:
        assert bench.main(["--smoke", "--threads", "1", "--out", str(tmp_path / "b.json")]) == 0
    finally:
        torch.set_num_threads(threads)
    mine = [ln for ln in capsys.readouterr().out.splitlines() if "smc-moves" in ln]
    theirs = [ln for ln in printed.splitlines() if "smc-moves" in ln]
    assert len(mine) == len(theirs) > 0
    for a, b in zip(mine, theirs):  # accuracy, tree accuracy, log p and ESS columns agree (times differ)
        assert a.split()[:6] == b.split()[:6] and a.split()[-3] == b.split()[-3], (a, b)


# ----------------------------------------------------------------- in-process (thread ranks)
@pytest.mark.parametrize("world", [2, 3, 4])
@pytest.mark.parametrize("name", ["weights_multinomial", "tempering_residual", "mh_stratified", "informed_cuts"])
def test_thread_ranks_equal_one_process(name, world):
    torch.set_num_threads(1)
    ref = _reference(name)
    for r, got in enumerate(run_threads(world, lambda b: sc.run_case(name, b), timeout=60)):
        _check(got, ref, f"threads world {world} rank {r} {name}")


def test_thread_ranks_rotational_and_alltoall_agree():
    torch.set_num_threads(1)
    ref = _reference("weights_systematic_rotational")
    for method in ("alltoall", "rotational"):
        outs = run_threads(4, lambda b: sc.run_case("weights_systematic_rotational", b, redistribution=method), timeout=60)
        for r, got in enumerate(outs):
            _check(got, ref, f"{method} rank {r}")


def test_particle_count_must_divide_world():
    class World:
        rank, world_size = 0, 3
        all_reduce = all_gather = None

    with pytest.raises(ValueError, match="divisible by the number of ranks"):
        SMCSampler(n_particles=32, backend=World())


def test_ranks_with_different_settings_raise():
    d, _ = sc.data("classification")

    def fn(b):
        return SMCSampler(n_particles=16, n_iterations=2 + b.rank, backend=b).run(d, seed=1)

    with pytest.raises(ValueError, match="disagree"):
        run_threads(2, fn, timeout=30)
