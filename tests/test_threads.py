"""The intra-op thread policy (issue #21 item 2): ``n_threads="auto" | int`` on every method,
the estimators and the CLI; the driver sets it for a run and restores the previous count; the
result does not depend on it and neither does the checkpoint fingerprint."""
from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys

import numpy as np
import pytest
import torch

from torchtree import ChipmanPrior, DirichletMultinomial, TopDownSMC
from torchtree.cli import main
from torchtree.core import threads
from torchtree.core.threads import WORK_PER_THREAD, check_threads, choose_threads
from torchtree.estimators import BayesianTreeClassifier, BayesianTreeRegressor
from torchtree.monitor import CallbackMonitor
from torchtree.samplers.mcmc import MCMC
from torchtree.samplers.smc_moves import SMCSampler
from torchtree.soft import DCC, NUTS

BIG = 64 * WORK_PER_THREAD  # work that asks for 64 threads


def _data(n=60, seed=0):
    g = torch.Generator().manual_seed(seed)
    X = torch.rand(n, 3, generator=g, dtype=torch.float64)
    y = ((X[:, 0] + 0.3 * X[:, 1]) > 0.6).long()
    return X, y


# ------------------------------------------------------------------ the pure policy
def test_an_explicit_count_is_used_as_given():
    assert choose_threads(3, 10, local_world_size=4, cpu_count=2, cap=1, load=9.0) == 3
    assert choose_threads(1, BIG, local_world_size=1, cpu_count=64) == 1


def test_auto_gives_one_thread_to_small_work():
    assert choose_threads("auto", WORK_PER_THREAD - 1, cpu_count=64) == 1
    # pendigits (7494 rows) and magic04 (13314 rows) with 500 particles: one thread
    assert choose_threads("auto", 13314 * 500, cpu_count=64) == 1


def test_auto_grows_with_the_work_up_to_the_cores():
    assert choose_threads("auto", 2 * WORK_PER_THREAD, cpu_count=64) == 2
    assert choose_threads("auto", 5 * WORK_PER_THREAD + 7, cpu_count=64) == 5
    assert choose_threads("auto", BIG, cpu_count=16) == 16


def test_auto_divides_the_cores_among_the_local_ranks():
    assert choose_threads("auto", BIG, local_world_size=4, cpu_count=16) == 4
    assert choose_threads("auto", BIG, local_world_size=3, cpu_count=16) == 5
    assert choose_threads("auto", BIG, local_world_size=8, cpu_count=2) == 1


def test_auto_respects_the_cap_and_the_load():
    assert choose_threads("auto", BIG, cpu_count=16, cap=3) == 3
    assert choose_threads("auto", BIG, cpu_count=16, load=12.7) == 4  # 16 - 12 idle cores
    assert choose_threads("auto", BIG, cpu_count=16, load=40.0) == 1
    assert choose_threads("auto", BIG, local_world_size=2, cpu_count=16, load=4.0) == 6


@pytest.mark.parametrize("bad", [0, -1, "many", 1.5, True, None, "2"])
def test_invalid_settings_name_n_threads(bad):
    with pytest.raises(ValueError, match="n_threads must be 'auto' or an integer >= 1"):
        check_threads(bad)
    with pytest.raises(ValueError, match="n_threads"):
        choose_threads(bad, 10, cpu_count=2)


def test_auto_and_numpy_integers_are_accepted():
    assert check_threads("auto") == "auto" and check_threads("AUTO") == "auto"
    assert check_threads(np.int64(3)) == 3 and isinstance(check_threads(np.int64(3)), int)


# ------------------------------------------------------- what resolve_threads reads
_LAUNCHER_VARS = threads.LOCAL_SIZE_VARS + ("OMP_NUM_THREADS",)


@pytest.fixture
def machine(monkeypatch):
    """A 16-core idle machine whose torch default is 16 threads, no launcher variables."""
    for var in _LAUNCHER_VARS:
        monkeypatch.delenv(var, raising=False)
    monkeypatch.setattr(threads, "available_cpus", lambda: 16)
    monkeypatch.setattr(threads.os, "getloadavg", lambda: (0.0, 0.0, 0.0))
    monkeypatch.setattr(threads.torch, "get_num_threads", lambda: 16)
    return monkeypatch


@pytest.mark.parametrize("var", ["LOCAL_WORLD_SIZE", "OMPI_COMM_WORLD_LOCAL_SIZE", "MPI_LOCALNRANKS",
                                 "PMIX_LOCAL_SIZE", "SLURM_NTASKS_PER_NODE"])
def test_launcher_variables_divide_the_cores(machine, var):
    assert threads.resolve_threads("auto", BIG) == 16
    machine.setenv(var, "4")
    assert threads.local_world_size() == 4
    assert threads.resolve_threads("auto", BIG) == 4


def test_launcher_variables_read_in_order_and_garbage_is_ignored(machine):
    machine.setenv("MPI_LOCALNRANKS", "2")
    machine.setenv("LOCAL_WORLD_SIZE", "8")
    assert threads.local_world_size() == 8
    machine.setenv("LOCAL_WORLD_SIZE", "lots")
    assert threads.local_world_size() == 2
    assert threads.local_world_size({"SLURM_NTASKS_PER_NODE": "2(x3)"}) == 2


def test_without_launcher_variables_all_ranks_count_as_local(machine):
    assert threads.resolve_threads("auto", BIG, world_size=4) == 4


def test_omp_num_threads_caps_auto_but_not_an_explicit_count(machine):
    machine.setenv("OMP_NUM_THREADS", "3,1")
    assert threads.env_thread_cap() == 3
    assert threads.resolve_threads("auto", BIG) == 3
    assert threads.resolve_threads(8, BIG) == 8


def test_torch_setting_caps_auto(machine):
    machine.setattr(threads.torch, "get_num_threads", lambda: 2)
    assert threads.resolve_threads("auto", BIG) == 2


def test_a_busy_machine_gets_one_thread(machine):
    machine.setattr(threads.os, "getloadavg", lambda: (15.5, 15.0, 15.0))
    assert threads.resolve_threads("auto", BIG) == 1


@pytest.mark.skipif(shutil.which("mpiexec", path=os.path.dirname(sys.executable)) is None,
                    reason="no mpiexec beside this Python")
def test_mpiexec_sets_a_variable_the_policy_reads():
    mpiexec = shutil.which("mpiexec", path=os.path.dirname(sys.executable))
    # one write per rank (print writes the text and the newline separately, so two ranks' output
    # could interleave as "22\n\n"; a short single write to a pipe is atomic)
    code = ("import sys; from torchtree.core.threads import local_world_size; "
            "sys.stdout.write(f'[{local_world_size()}]'); sys.stdout.flush()")
    env = {k: v for k, v in os.environ.items() if k not in threads.LOCAL_SIZE_VARS}
    out = subprocess.run([mpiexec, "-n", "2", sys.executable, "-c", code], capture_output=True, text=True,
                         timeout=120, env=env)
    assert out.returncode == 0, out.stderr
    assert re.findall(r"\[(\d+)\]", out.stdout) == ["2", "2"]


# --------------------------------------------------------------- the run's threads
def _smc(**kw):
    return TopDownSMC(ChipmanPrior(0.95, 0.5), DirichletMultinomial(5.0), n_particles=20, n_islands=2, **kw)


def _seen_threads():
    seen = []
    mon = CallbackMonitor(on_start=lambda info: seen.append(("start", torch.get_num_threads(), info["n_threads"])),
                          on_step=lambda step, info: seen.append(("step", torch.get_num_threads(), None)))
    return seen, mon


def test_a_run_sets_its_threads_and_restores_the_previous_count():
    assert torch.get_num_threads() == 1  # tests/conftest.py
    seen, mon = _seen_threads()
    _smc(n_threads=2).run(_data(), seed=0, monitor=mon)
    assert seen[0] == ("start", 2, 2) and all(t == 2 for _, t, _ in seen)
    assert torch.get_num_threads() == 1


def test_the_previous_count_is_restored_after_an_exception():
    def boom(step, info):
        assert torch.get_num_threads() == 3
        raise RuntimeError("stop")

    with pytest.raises(RuntimeError, match="stop"):
        _smc(n_threads=3).run(_data(), seed=0, monitor=CallbackMonitor(on_step=boom))
    assert torch.get_num_threads() == 1
    with pytest.raises(RuntimeError, match="stop"):
        with threads.using_threads(2):
            raise RuntimeError("stop")
    assert torch.get_num_threads() == 1


def test_auto_on_small_work_runs_with_one_thread():
    torch.set_num_threads(2)
    try:
        seen, mon = _seen_threads()
        _smc().run(_data(), seed=0, monitor=mon)
        assert seen[0] == ("start", 1, 1)
        assert torch.get_num_threads() == 2
    finally:
        torch.set_num_threads(1)


def test_bart_compiled_sweep_counts_each_chain_as_a_thread_of_work(monkeypatch):
    """With the compiled sweep (one parallel region per sweep, a task per chain) "auto" gives a thread per
    chain up to the idle cores, on any table size; the torch route, Particle Gibbs and CUDA keep rows x
    chains. A run on a 4-chain config with free cores starts with 2 threads."""
    from torchtree import BART
    from torchtree.kernels import native
    from torchtree.samplers.bart.config import BARTConfig
    from torchtree.samplers.driver import work_size

    monkeypatch.setattr(native, "available", lambda: True)
    cfg = BARTConfig(n_chains=4)
    assert work_size(cfg, 100, 1, torch.device("cpu")) == 4 * WORK_PER_THREAD
    assert work_size(cfg, 100, 2, "cpu") == 2 * WORK_PER_THREAD  # two chains on each of two ranks
    assert choose_threads("auto", work_size(cfg, 100, 1, "cpu"), cpu_count=2, load=0.0) == 2
    assert choose_threads("auto", work_size(cfg, 100, 1, "cpu"), cpu_count=2, load=1.5) == 1  # a busy core
    for other in (BARTConfig(n_chains=4, compile="off"), BARTConfig(n_chains=4, bart_sampler="pg")):
        assert work_size(other, 100, 1, "cpu") == 400
    assert work_size(cfg, 100, 1, "cuda:0") == 400
    monkeypatch.setattr(native, "available", lambda: False)  # no compiler: the torch route's small ops
    assert work_size(cfg, 100, 1, "cpu") == 400
    monkeypatch.undo()
    if native.available():
        monkeypatch.setattr(threads, "available_cpus", lambda: 2)
        monkeypatch.setattr(threads.os, "getloadavg", lambda: (0.0, 0.0, 0.0))
        monkeypatch.delenv("OMP_NUM_THREADS", raising=False)  # `make test` sets it to 1: a cap on "auto"
        torch.set_num_threads(2)
        try:
            seen, mon = _seen_threads()
            BART(n_trees=5, n_chains=4, n_warmup=2, n_samples=2).run(_data(), seed=0, monitor=mon)
            assert seen[0] == ("start", 2, 2)
        finally:
            torch.set_num_threads(1)


def test_the_multi_rank_path_runs_under_the_policy():
    """A multi-rank top-down run goes through the same driver: thread-ranks (one process) all
    run at the run's setting and the previous count is back afterwards."""
    from pathlib import Path

    sys.path.insert(0, str(Path(__file__).resolve().parent / "_dist_workers"))
    from thread_backend import run_threads

    seen, mon = _seen_threads()
    data = _as_data()
    run_threads(2, lambda b: _smc(n_threads=2, backend=b).run(data, seed=0, monitor=mon if b.rank == 0 else None),
                timeout=60)
    assert seen and seen[0][2] == 2 and all(t == 2 for _, t, _ in seen)
    assert torch.get_num_threads() == 1


def _as_data():
    from torchtree import Data

    X, y = _data()
    return Data(X, y)


# ------------------------------------------------------- results do not depend on it
def _mcmc(**kw):
    return MCMC(ChipmanPrior(0.95, 0.5), DirichletMultinomial(5.0), n_chains=3, n_samples=30, **kw)


def _smc_moves(**kw):
    return SMCSampler(n_particles=16, n_iterations=4, **kw)


def _dcc(**kw):
    return DCC(n_iterations=2, n_initial=4, n_chains=2, n_samples=3, n_warmup=5, n_warmup_warm=3, n_parallel=1,
               activation_threshold=1, max_depth=2, max_tree_depth=4, **kw)


def _nuts(**kw):
    return NUTS(n_chains=2, n_samples=4, n_warmup=6, depth=1, max_tree_depth=4, n_leapfrog=3, **kw)


def _fingerprint_of(post, X):
    out = [torch.as_tensor(np.asarray(post.predict_proba(X)))]
    if getattr(post, "log_evidence", None) is not None:
        out.append(torch.tensor([float(post.log_evidence)], dtype=torch.float64))
    for d in getattr(post, "draws", None) or []:
        out.append(d.reshape(-1).to(torch.float64))
    return out


@pytest.mark.parametrize("make", [_smc, _mcmc, _smc_moves, _dcc, _nuts], ids=["smc", "mcmc", "smc-moves", "dcc", "nuts"])
def test_one_and_two_threads_give_the_same_bits(make):
    X, y = _data(80)
    one = _fingerprint_of(make(n_threads=1).run((X, y), seed=3), X)
    two = _fingerprint_of(make(n_threads=2).run((X, y), seed=3), X)
    assert len(one) == len(two)
    for a, b in zip(one, two):
        assert torch.equal(a, b)
    assert torch.get_num_threads() == 1


def test_one_and_two_threads_give_the_same_bits_on_ops_large_enough_to_split():
    # 40000 rows: the per-node ops exceed torch's 32768-element grain, so two threads really split them
    X, y = _data(36000, seed=1)
    make = lambda t: TopDownSMC(n_particles=4, n_islands=2, n_threads=t)  # noqa: E731
    one, two = make(1).run((X, y), seed=2), make(2).run((X, y), seed=2)
    assert one.log_evidence == two.log_evidence
    assert np.array_equal(one.predict_proba(X[:500]), two.predict_proba(X[:500]))


@pytest.mark.parametrize("make", [_smc, _mcmc, _smc_moves, _dcc, _nuts], ids=["smc", "mcmc", "smc-moves", "dcc", "nuts"])
@pytest.mark.parametrize("bad", [0, -1, "many", 1.5])
def test_every_method_refuses_invalid_settings(make, bad):
    with pytest.raises(ValueError, match="n_threads"):
        make(n_threads=bad)


def test_n_threads_is_outside_the_fingerprint_and_a_run_resumes_with_another(tmp_path):
    assert "n_threads" not in _smc(n_threads=2).config.result_settings()
    X, y = _data(80)
    full = _smc(n_threads=1).run((X, y), seed=5)
    path = str(tmp_path / "ck.pt")

    def stop(step, info):
        if step == 3:
            raise KeyboardInterrupt

    with pytest.raises(KeyboardInterrupt):
        _smc(n_threads=1, checkpoint=path).run((X, y), seed=5, monitor=CallbackMonitor(on_step=stop))
    started = []
    resumed = _smc(n_threads=2, checkpoint=path).run(
        (X, y), seed=5, monitor=CallbackMonitor(on_start=started.append))
    assert started[0]["resumed_at_step"] >= 1 and started[0]["n_threads"] == 2
    assert resumed.log_evidence == full.log_evidence
    assert np.array_equal(resumed.predict_proba(X), full.predict_proba(X))


# ------------------------------------------------------------- estimators and CLI
@pytest.mark.parametrize("Est", [BayesianTreeClassifier, BayesianTreeRegressor])
def test_estimators_take_n_threads(Est):
    est = Est(n_particles=10, n_threads=2)
    assert est.get_params()["n_threads"] == 2
    assert est.set_params(n_threads="auto").get_params()["n_threads"] == "auto"
    assert Est().get_params()["n_threads"] == "auto"
    clone = Est(**est.set_params(n_threads=3).get_params())
    assert clone.get_params() == est.get_params()


def test_the_estimator_runs_with_its_threads_and_refuses_bad_ones():
    X, y = _data(80)
    seen, mon = _seen_threads()
    BayesianTreeClassifier(n_particles=10, n_threads=2, monitor=mon).fit(X.numpy(), y.numpy())
    assert seen[0] == ("start", 2, 2) and torch.get_num_threads() == 1
    for method in ("smc", "mcmc"):
        with pytest.raises(ValueError, match="n_threads"):
            BayesianTreeClassifier(method, n_threads="many").fit(X.numpy(), y.numpy())


@pytest.mark.parametrize("bad", ["0", "-1", "many", "1.5"])
def test_cli_refuses_bad_threads_with_status_2(bad, capsys):
    with pytest.raises(SystemExit) as exit_:
        main(["fit", "data.csv", f"--threads={bad}"])
    assert exit_.value.code == 2
    err = capsys.readouterr().err
    assert "--threads" in err and "must be 'auto' or an integer >= 1" in err and "Traceback" not in err


def test_cli_fit_passes_threads(tmp_path, capsys, monkeypatch):
    X, y = _data(60)
    csv = tmp_path / "d.csv"
    np.savetxt(csv, np.column_stack([X.numpy(), y.numpy()]), delimiter=",", header="a,b,c,y", comments="")
    seen = []
    real_run = TopDownSMC.run

    def run(self, *a, **k):
        seen.append((self.n_particles, self.n_threads))
        return real_run(self, *a, **k)

    monkeypatch.setattr(TopDownSMC, "run", run)
    out = str(tmp_path / "p.pt")
    assert main(["fit", str(csv), "--n-particles", "10", "--threads", "2", "--out", out, "-q"]) == 0
    assert main(["fit", str(csv), "--n-particles", "10", "--out", out, "-q"]) == 0
    # the fits (10 particles; the hyperparameter pilots before each run with the same setting)
    assert [t for n, t in seen if n == 10] == [2, "auto"]
    assert {t for n, t in seen if n != 10} == {2, "auto"}


def test_a_fit_in_a_child_forked_after_threads_runs_on_one_thread_instead_of_hanging():
    """GNU OpenMP deadlocks in a forked child at its first parallel region of more than one thread when the parent
    had run one: a fit in a default multiprocessing Pool on Linux (fork) after a fit on 2 threads never returned
    (a QA pass). The child now runs on one thread, and warns where more were asked for. Run in a subprocess with a
    time limit, so a regression fails rather than hangs the suite."""
    import textwrap

    code = textwrap.dedent("""
        import os, warnings, numpy as np, torch
        from torchtree import BayesianTreeRegressor
        from torchtree.core.threads import forked_after_threads
        g = np.random.default_rng(0)
        X = g.normal(size=(300, 3)); y = X[:, 0] + g.normal(size=300)
        fit = lambda n: BayesianTreeRegressor(method="bart", n_trees=10, n_samples=20, n_warmup=20, n_threads=n,
                                              verbose=0).fit(X, y)
        torch.set_num_threads(2)
        fit(2)
        torch.ones(4_000_000).exp().sum()  # a parallel region of torch's own, on 2 threads
        assert not forked_after_threads()
        pid = os.fork()
        if pid == 0:
            with warnings.catch_warnings(record=True) as seen:
                warnings.simplefilter("always")
                fit(2); fit("auto")
                torch.ones(4_000_000).exp().sum()
            ok = forked_after_threads() and torch.get_num_threads() == 1 and \\
                sum("forked from one that ran torch on several threads" in str(w.message) for w in seen) == 1
            os._exit(0 if ok else 3)
        _, status = os.waitpid(pid, 0)
        print("child", os.waitstatus_to_exitcode(status), "threads", torch.get_num_threads())
        """)
    env = {k: v for k, v in os.environ.items() if k != "OMP_NUM_THREADS"}
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=240, env=env)
    assert out.returncode == 0, out.stderr
    assert "child 0 threads 2" in out.stdout, out.stdout + out.stderr
