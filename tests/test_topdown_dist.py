"""Multi-rank TopDownSMC: 2 and 4 ranks over gloo and MPI (3 over threads) equal one process.

Jobs (launched together when the module's first test asks for them):

* ``gloo``: 4 processes started as ``torchrun`` would, running every case of
  ``_dist_workers/topdown_cases.py`` on sub-groups of 2 and 4 ranks;
* ``mpi``: ``mpiexec -n 4``, the same on sub-communicators of 2 and 4 ranks.

Each job then runs ``examples/distributed_smc.py --smoke`` on its 4 ranks (the script's
``main`` inside the workers, sparing 4 more interpreter start-ups).

Exactness: classification runs are compared bit for bit (log evidence, predictive
probabilities, every tree field, weights); regression to 1e-9 (its float node statistics are
cumulated over the distinct nodes present on a rank, see ``torchtree.samplers.topdown``).
Fast in-process checks with a thread backend cover export/import, errors and monitors.
"""

from __future__ import annotations

import importlib.util
import math
import os
import shutil
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import torch

from torchtree import Data, TopDownSMC, TraceMonitor
from torchtree.steps.growth import Grower
from torchtree.model.likelihoods import DirichletMultinomial
from torchtree.model.priors import ChipmanPrior
from torchtree.samplers.topdown import export_particles, import_particles, layout_for

WORKERS = Path(__file__).parent / "_dist_workers"
ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(WORKERS))
import topdown_cases as tc  # noqa: E402
from thread_backend import run_threads  # noqa: E402
from _launch import Job, gloo_ranks  # noqa: E402

pytestmark = pytest.mark.distributed

JOB_DEADLINE = 240.0
TIMEOUT = 90.0


def _mpiexec() -> str | None:
    if importlib.util.find_spec("mpi4py") is None:
        return None
    local = Path(sys.executable).parent / "mpiexec"
    return str(local) if local.exists() else shutil.which("mpiexec")


def _env(**kw):
    env = dict(os.environ, OMP_NUM_THREADS="1", TT_TEST_TIMEOUT=str(TIMEOUT), **kw)
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(ROOT), env.get("PYTHONPATH", "")]))
    return env


def launch_jobs(tmp_path_factory, worker: str, prefix: str, gloo_sizes: str, mpi_ranks: int, mpi_sizes: str,
                extra=lambda kind: []):
    """Start ``worker`` on 4 gloo ranks (torchrun-style env vars) and, when mpiexec is
    available, on ``mpi_ranks`` MPI ranks; each writes into its own temporary folder.
    ``extra(kind)`` gives more worker arguments. Returns ``{kind: Job}``."""
    started = {}
    out = tmp_path_factory.mktemp(f"{prefix}gloo")
    started["gloo"] = gloo_ranks(worker, ["gloo", out, gloo_sizes, *extra("gloo")], 4, WORKERS, out, JOB_DEADLINE,
                                 env=lambda r: _env())
    mpiexec = _mpiexec()
    if mpiexec is not None:
        out = tmp_path_factory.mktemp(f"{prefix}mpi")
        started["mpi"] = Job([subprocess.Popen(
            [mpiexec, "-n", str(mpi_ranks), sys.executable, worker, "mpi", str(out), mpi_sizes] + extra("mpi"),
            cwd=WORKERS, env=_env(), stdout=open(out / "mpi.log", "w"), stderr=subprocess.STDOUT,
            start_new_session=True)], out, JOB_DEADLINE)
    return started


@pytest.fixture(scope="module")
def jobs(tmp_path_factory):
    started = launch_jobs(tmp_path_factory, "topdown_worker.py", "", "2,4", 4, "2,4")
    yield started
    for job in started.values():
        job.wait()


_LOADED: dict = {}


def load_rank_results(jobs, kind: str, n_ranks: int, cache: dict) -> list[dict]:
    """Wait for the ``kind`` job, check every rank exited 0, and load its ``rank*.pt`` files
    (once per test module: ``cache``)."""
    if kind not in jobs:
        pytest.skip("mpiexec or mpi4py not available")
    if kind not in cache:
        job = jobs[kind].wait()
        assert job.codes == [0] * len(job.codes), f"{kind} job failed {job.codes}:\n{job.logs}"
        files = sorted(job.out_dir.glob("rank*.pt"))
        assert len(files) == n_ranks, job.logs
        cache[kind] = [torch.load(f, weights_only=False) for f in files]
    return cache[kind]


def _results(jobs, kind: str) -> list[dict]:
    return load_rank_results(jobs, kind, 4, _LOADED)


_REF: dict = {}


def _reference(name: str) -> dict:
    if name not in _REF:
        _REF[name] = tc.run_estimator() if name == "estimator" else tc.run_case(name)
    return _REF[name]


def _same(a: torch.Tensor, b: torch.Tensor) -> bool:
    """Bitwise equality, dtype and shape included."""
    if a.dtype != b.dtype or a.shape != b.shape:
        return False
    if a.is_floating_point():
        bits = {2: torch.int16, 4: torch.int32, 8: torch.int64}[a.element_size()]
        a, b = a.view(bits), b.view(bits)
    return torch.equal(a, b)


def _check(got: dict, ref: dict, exact: bool, where: str) -> None:
    if exact:
        assert got["log_evidence"] == ref["log_evidence"], where
        assert np.array_equal(got["pred"], ref["pred"]), where
    else:
        assert got["log_evidence"] == pytest.approx(ref["log_evidence"], rel=0, abs=1e-9), where
        np.testing.assert_allclose(got["pred"], ref["pred"], rtol=0, atol=1e-9, err_msg=where)
    if "trees" not in ref:
        return
    assert got["info"]["n_stages"] == ref["info"]["n_stages"], where
    assert got["info"]["n_resample"] == ref["info"]["n_resample"], where
    for k, v in ref["trees"].items():
        if exact or k != "stats":
            assert _same(got["trees"][k], v), (where, k)
        else:
            torch.testing.assert_close(got["trees"][k], v, rtol=1e-12, atol=1e-9, msg=where)
    if exact:
        assert _same(got["log_weights"], ref["log_weights"]), where
        assert got["info"]["island_log_evidence"] == ref["info"]["island_log_evidence"], where


@pytest.mark.parametrize("kind", ["gloo", "mpi"])
@pytest.mark.parametrize("name", list(tc.CASES) + ["estimator"])
def test_ranks_equal_one_process(jobs, kind, name):
    per_rank = _results(jobs, kind)
    ref = _reference(name)
    exact = name == "estimator" or tc.CASES[name][0] == "classification"
    for size in (2, 4):
        for r in range(size):
            got = per_rank[r][(size, name)]
            _check(got, ref, exact, f"{kind} world {size} rank {r} {name}")
        if name != "estimator":
            task, kw = tc.CASES[name]
            assert per_rank[0][(size, name)]["info"]["layout"] == layout_for(tc.N_PARTICLES, kw["n_islands"], size)


def test_particles_moved_between_ranks(jobs):
    """The gathered layout really redistributes (so the import path is exercised)."""
    per_rank = _results(jobs, "gloo")
    moved = sum(per_rank[r][(4, "node_i1_prior")]["info"]["particles_received"] for r in range(4))
    assert moved > 0


_EXAMPLE_ONE_RANK: list = []


@pytest.mark.parametrize("kind", ["gloo", "mpi"])
def test_example_smoke(jobs, kind, capsys):
    """examples/distributed_smc.py --smoke on 4 ranks prints the one-rank evidence."""
    _results(jobs, kind)
    printed = (jobs[kind].out_dir / "example.txt").read_text()
    for pattern in ("test accuracy", "log evidence", f"ranks             4 ({kind})", "distributed_smc: done"):
        assert pattern in printed, printed
    if not _EXAMPLE_ONE_RANK:  # the same smoke run on one rank, in this process
        spec = importlib.util.spec_from_file_location("distributed_smc", ROOT / "examples" / "distributed_smc.py")
        example = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(example)
        threads = torch.get_num_threads()
        try:
            assert example.main(["--smoke", "--backend", "local", "--threads", "1"]) == 0
        finally:
            torch.set_num_threads(threads)
        _EXAMPLE_ONE_RANK.extend(line for line in capsys.readouterr().out.splitlines() if line.startswith(("log evidence", "test accuracy")))
    assert len(_EXAMPLE_ONE_RANK) == 2
    for line in _EXAMPLE_ONE_RANK:
        assert line in printed, (line, printed)


# ----------------------------------------------------------------- in-process (thread ranks)
def _small():
    rng = np.random.default_rng(5)
    X = rng.normal(size=(90, 3))
    X[:, 1] = np.round(X[:, 1], 1)
    y = ((X[:, 0] + X[:, 1] > 0) ^ (rng.random(90) < 0.15)).astype(int)
    return Data(X, y)


def test_export_import_round_trip_rebuilds_trees_and_lists():
    data = _small()
    src = Grower(ChipmanPrior(), DirichletMultinomial(5.0), data, "prior", seed=1)
    state = src.init_state(16)
    gidx = torch.arange(16)
    for stage in range(2):  # two layers, leaving open nodes
        pp, nn = (src.slot_status(state) == 1).nonzero(as_tuple=True)
        if pp.numel():
            src.expand(state, pp, nn, gidx[pp], stage)
    rows = torch.tensor([3, 0, 7, 12, 3])
    block = export_particles(src, state, rows, int(state.n_nodes.max()) + 3)
    dst = Grower(ChipmanPrior(), DirichletMultinomial(5.0), data, "prior", seed=1)
    uid, nn = import_particles(dst, block, torch.zeros(5, dtype=torch.long))
    assert torch.equal(uid[0], uid[4])  # copies of one tree share their imported nodes
    from torchtree.steps.growth import GrowthState

    got = dst.to_trees(GrowthState(uid, nn))
    want = src.to_trees(GrowthState(state.node_uid[rows], state.n_nodes[rows]))
    for k, v in want.as_dict().items():
        assert _same(got.as_dict()[k], v), k
    # Open nodes' lists, rebuilt from the root, equal the sender's.
    open_dst = uid.long()[dst.slot_status(GrowthState(uid, nn)) == 1]
    open_src = state.node_uid[rows].long()[src.slot_status(GrowthState(state.node_uid[rows], state.n_nodes[rows])) == 1]
    assert open_dst.numel() == open_src.numel() > 0
    dst.table.materialise(torch.unique(open_dst), data.X)
    src.table.materialise(torch.unique(open_src), data.X)
    for a, b in zip(open_dst.tolist(), open_src.tolist()):
        sa, ia = dst.table.gather(torch.tensor([a]))
        sb, ib = src.table.gather(torch.tensor([b]))
        assert torch.equal(ia, ib)


@pytest.mark.parametrize("n_islands,world", [(1, 3), (2, 3), (4, 2), (3, 4)])
def test_thread_ranks_equal_one_process(n_islands, world):
    data = _small()
    kw = dict(n_particles=24, n_islands=n_islands, ess_threshold=0.9, expansion="layer")
    ref = TopDownSMC(**kw).run(data, seed=11)
    outs = run_threads(world, lambda b: TopDownSMC(**kw, backend=b).run(data, seed=11), timeout=60)
    for post in outs:
        assert post.log_evidence == ref.log_evidence
        assert np.array_equal(post.predict_proba(data.X[:20]), ref.predict_proba(data.X[:20]))


def test_seed_none_is_agreed_and_monitor_only_on_rank_zero():
    data = _small()
    monitors = [TraceMonitor(), TraceMonitor()]

    def fn(b):
        return TopDownSMC(n_particles=12, backend=b).run(data, seed=None, monitor=monitors[b.rank])

    a, b = run_threads(2, fn, timeout=60)
    assert a.log_evidence == b.log_evidence
    assert len(monitors[0].trace["smc/log_evidence"]) == a.info["n_stages"]
    assert monitors[0].trace["smc/log_evidence"][-1] == pytest.approx(a.log_evidence)
    assert not monitors[1].trace


def test_errors_are_clear_and_raised_on_every_rank():
    data = _small()
    with pytest.raises(ValueError, match="divisible by the number of ranks"):
        run_threads(4, lambda b: TopDownSMC(n_particles=10, backend=b).run(data, seed=0), timeout=30)
    with pytest.raises(ValueError, match="ranks disagree"):
        run_threads(2, lambda b: TopDownSMC(n_particles=12, proposal=("prior", "optimal")[b.rank], backend=b).run(data, seed=0), timeout=30)
    with pytest.raises(ValueError, match="redistribution"):
        TopDownSMC(redistribution="fast")


def test_ranks_holding_different_data_of_one_shape_are_refused():
    """A rank whose training values differ (one cell) would sample a mixture of two data sets: every rank
    raises instead."""
    data = _small()
    X = data.X.numpy().copy()
    X[0, 0] += 1
    other = Data(X, data.y.numpy())
    with pytest.raises(ValueError, match=r"ranks disagree on the TopDownSMC settings or the training data \(rank 1 differs"):
        run_threads(2, lambda b: TopDownSMC(n_particles=12, backend=b).run((data, other)[b.rank], seed=0), timeout=30)


def test_logaddexp_is_the_same_wherever_an_element_sits():
    """The optimal proposal's per-node normaliser must not depend on the batch around the node
    (torch.logaddexp's vectorised and scalar paths differ in the last bit on the CPU)."""
    from torchtree.steps.growth import _logaddexp

    g = torch.Generator().manual_seed(0)
    a = torch.randn(1003, generator=g, dtype=torch.float64) * 5
    b = torch.randn(1003, generator=g, dtype=torch.float64) * 5
    b[::7] = -math.inf
    full = _logaddexp(a, b)
    single = torch.stack([_logaddexp(a[i:i + 1], b[i:i + 1])[0] for i in range(a.numel())])
    assert torch.equal(full, single)
    torch.testing.assert_close(full, torch.logaddexp(a, b), rtol=1e-15, atol=1e-15)
    both = torch.full((3,), -math.inf, dtype=torch.float64)
    assert torch.equal(_logaddexp(both, both), both)
