"""Golden outputs of every sampler family, recorded so that a refactor can be shown not to move numbers.

Usage (from the repository root)::

    OMP_NUM_THREADS=1 .venv/bin/python tests/golden/record_golden.py            # rewrite golden.json
    OMP_NUM_THREADS=1 .venv/bin/python tests/golden/record_golden.py --check    # compare, write nothing

``tests/test_golden.py`` re-runs every case below and compares with ``golden.json``.
Re-recording means the numbers were *meant* to move: say so in the commit message
(see ``README.md`` next to this file).

Only the stable public API is used (``import torchtree``, ``torchtree.soft``,
``torchtree.distributed`` backends by name, posterior methods), so the cases survive a
re-layering of the package's modules.

Data: small fixed subsets of the UCI tables in the repository's ``data/`` folder, read
with ``torchtree.datasets.load_table`` (which checks each file's SHA-256). The CSV text's
sha256 is part of each case's settings, so another copy of the data is a clear settings
mismatch, not a mysterious numeric one.

Each case is a dict ``{"name", "family", "settings", "outputs"}``; ``settings`` is
plain JSON that fully determines the run (the runner builds the sampler from it),
``outputs`` are plain JSON numbers (floats as Python's round-tripping repr), compared
exactly by the test (``compare``), except where a family says otherwise.
"""
from __future__ import annotations

import argparse
import copy
import hashlib
import importlib
import json
import math
import os
import platform
import socket
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np
import torch

import torchtree
from torchtree.datasets import load_table

HERE = Path(__file__).resolve().parent
ROOT = HERE.parents[1]
GOLDEN = HERE / "golden.json"
FORMAT = "torchtree-golden/1"

# ----------------------------------------------------------------------------- data
# name -> (file, task, train rows, query rows); rows are fixed index patterns of the file
# (no random subsetting, so no dependence on numpy's generator streams).
DATASETS = {
    # iris: 150 rows, 4 features, 3 classes (ordered by class): 100 training rows
    # (index % 3 != 0), 20 query rows among the others (index % 15 in {0, 6}).
    "iris": ("iris.csv", "classification", lambda n: [i for i in range(n) if i % 3],
             lambda n: [i for i in range(n) if i % 15 in (0, 6)]),
    # heart (Statlog): 270 rows, 13 features, 2 classes: 90 training rows, 20 query rows.
    "heart": ("heart_statlog.csv", "classification", lambda n: list(range(0, n, 3)),
              lambda n: list(range(1, n, 3))[:20]),
    # abalone: 4177 rows, 10 features, target = rings (as a real number): 105 training
    # rows (index % 40 == 0), 20 query rows (index % 40 == 20).
    "abalone": ("abalone.csv", "regression", lambda n: list(range(0, n, 40)),
                lambda n: list(range(20, n, 40))[:20]),
}

_DATA_CACHE: dict = {}


class GoldenDataMissing(RuntimeError):
    pass


def load(name: str):
    """(X_train, y_train, X_query, y_query, sha256 of the CSV text) of a named subset."""
    if name not in _DATA_CACHE:
        fname, task, tr_rows, q_rows = DATASETS[name]
        try:
            table = load_table(fname)
        except FileNotFoundError as e:
            raise GoldenDataMissing(str(e)) from e
        X, y = table.X, table.y
        y = y.astype(np.int64) if task == "classification" else y.astype(np.float64)
        tr, q = tr_rows(len(y)), q_rows(len(y))
        assert not set(tr) & set(q)
        _DATA_CACHE[name] = (X[tr], y[tr], X[q], y[q], table.sha256)
    return _DATA_CACHE[name]


def data_settings(name: str) -> dict:
    fname, task, tr_rows, q_rows = DATASETS[name]
    Xtr, ytr, Xq, yq, sha = load(name)
    return {"name": name, "file": fname, "sha256": sha, "task": task, "n_train": len(ytr), "n_query": len(yq)}


# ----------------------------------------------------------------------------- building from settings
def build_obj(spec):
    """``{"class": "ChipmanPrior", "args": [...], "kwargs": {...}}`` -> ``torchtree.ChipmanPrior(...)``."""
    if spec is None:
        return None
    return getattr(torchtree, spec["class"])(*spec.get("args", []), **spec.get("kwargs", {}))


def sampler_class(name: str):
    if name in ("NUTS", "DCC"):
        return getattr(importlib.import_module("torchtree.soft"), name)
    return getattr(torchtree, name)


def build_sampler(s: dict, **extra):
    cls = sampler_class(s["sampler"])
    kwargs = dict(s.get("kwargs", {}))
    kwargs.update(extra)
    if s["sampler"] in ("NUTS", "DCC"):
        return cls(**kwargs)
    return cls(build_obj(s.get("prior")), build_obj(s.get("likelihood")), **kwargs)


def make_data(s: dict):
    Xtr, ytr, Xq, yq, _ = load(s["data"]["name"])
    return torchtree.Data(Xtr, ytr, task=s["data"]["task"]), Xq, yq


# ----------------------------------------------------------------------------- outputs
def plain(x):
    """JSON-ready copy: tensors / arrays -> (nested) lists, numpy scalars -> Python numbers."""
    if isinstance(x, torch.Tensor):
        return plain(x.detach().cpu().tolist())
    if isinstance(x, np.ndarray):
        return plain(x.tolist())
    if isinstance(x, (np.floating,)):
        return float(x)
    if isinstance(x, (np.integer,)):
        return int(x)
    if isinstance(x, (np.bool_,)):
        return bool(x)
    if isinstance(x, dict):
        return {str(k): plain(v) for k, v in x.items()}
    if isinstance(x, (list, tuple)):
        return [plain(v) for v in x]
    return x


def _f64_hash(values) -> str:
    """sha256 (16 hex digits) of the values as float64 bytes: bit-exact identity of a long vector."""
    a = np.ascontiguousarray(np.asarray(values, dtype=np.float64))
    return hashlib.sha256(a.tobytes()).hexdigest()[:16]


def weights_summary(w) -> dict:
    w = torch.as_tensor(w, dtype=torch.float64).cpu()
    return {"n": int(w.numel()), "sum_sq": float((w * w).sum()), "first5": plain(w[:5]),
            "log_first5": plain(torch.log(w[:5])), "sha": _f64_hash(w.numpy())}


def hard_outputs(post, Xq, yq) -> dict:
    """What a hard-tree posterior (TreePosterior) answers on the query rows."""
    out = {"log_evidence": post.log_evidence}
    if post.task == "classification":
        out["predict_proba"] = plain(post.predict_proba(Xq))
        out["predict"] = plain(post.predict(Xq))
    else:
        out["predict"] = plain(post.predict(Xq))
    out["log_predictive"] = post.log_predictive(Xq, yq)
    out["weights"] = weights_summary(post.weights)
    sm = post.summary()
    out["summary"] = plain({k: sm[k] for k in ("n_particles", "n_distinct_trees", "ess", "leaves_mean", "leaves_max",
                                               "depth_mean", "depth_max", "map_tree", "feature_usage")})
    out["n_leaves_first5"] = plain(post.trees.n_leaves()[:5])
    return out


def soft_outputs(post, Xq, yq) -> dict:
    """What a soft-tree posterior (SoftTreePosterior) answers on the query rows."""
    out = {"log_evidence": post.log_evidence}
    if post.task == "classification":
        out["predict_proba"] = plain(post.predict_proba(Xq))
    out["predict"] = plain(post.predict(Xq))
    out["log_predictive"] = post.log_predictive(Xq, yq)
    out["weights"] = weights_summary(post.weights)
    sm = post.summary()
    out["summary"] = plain({"n_topologies": sm["n_topologies"], "expected_leaves": sm["expected_leaves"],
                            "topologies": [{k: r[k] for k in ("topology", "weight", "log_evidence", "n_leaves",
                                                              "n_draws")} for r in sm["topologies"]]})
    return out


# ----------------------------------------------------------------------------- case runners
def run_sampler(s: dict) -> dict:
    data, Xq, yq = make_data(s)
    post = build_sampler(s).run(data, seed=s["seed"])
    return (soft_outputs if s["sampler"] in ("NUTS", "DCC") else hard_outputs)(post, Xq, yq)


def run_estimator(s: dict) -> dict:
    Xtr, ytr, Xq, yq, _ = load(s["data"]["name"])
    # Intended change of meaning (issue #22): the estimators' default became hyper="evidence"
    # (hyperparameters chosen by pilot runs); the golden numbers are those of the fixed
    # hyperparameters the estimators used when they were recorded, hyper="fixed" today.
    fixed = {"hyper": "fixed"}
    if s["estimator"] == "BayesianTreeClassifier" and s["kwargs"].get("method") == "smc":
        # and (issue #22, later) small classification tables' default proposal became "optimal"
        fixed["proposal"] = "prior"
    if s["estimator"] == "BayesianTreeRegressor" and s["kwargs"].get("method") == "mcmc":
        fixed["init"] = "root"  # (issue #22, later) regression MCMC starts at top-down draws
    est = getattr(torchtree, s["estimator"])(**{**fixed, **s["kwargs"]}).fit(Xtr, ytr)
    out = {"log_evidence": est.log_evidence_, "predict": plain(est.predict(Xq)),
           "log_predictive": est.log_predictive(Xq, yq), "score": est.score(Xq, yq)}
    if s["estimator"] == "BayesianTreeClassifier":
        out["predict_proba"] = plain(est.predict_proba(Xq))
        out["classes"] = plain(est.classes_)
    else:
        out["predict_interval"] = plain(est.predict_interval(Xq, level=0.8))
    out["weights"] = weights_summary(est.posterior_.weights)
    return out


class Interrupt(Exception):
    """Raised by :class:`InterruptAt` to stop a run part way."""


class InterruptAt(torchtree.Monitor):
    """A public way to interrupt a run: raise from ``on_step`` at step ``k``."""

    def __init__(self, k: int):
        super().__init__()
        self.k = k

    def on_step(self, step, info):
        if int(step) == self.k:
            raise Interrupt(f"interrupted at step {step}")


class Steps(torchtree.Monitor):
    """Records the steps a run reports (to see where a resumed run starts)."""

    def __init__(self):
        super().__init__()
        self.steps = []

    def on_step(self, step, info):
        self.steps.append(int(step))


def checkpoint_step(path: str):
    """The step stored in a single-process checkpoint file (documented format: a dict saved
    with ``torch.save``, read with ``weights_only=True``, holding ``"step"``)."""
    payload = torch.load(path, map_location="cpu", weights_only=True)
    if not (isinstance(payload, dict) and isinstance(payload.get("step"), int)):
        raise AssertionError(f"{path}: the checkpoint file no longer holds a top-level 'step' (its format changed); "
                             "adapt checkpoint_step() in tests/golden/record_golden.py (the posteriors are what "
                             "the golden test compares)")
    return int(payload["step"])


def run_resume(s: dict, tmpdir: str | None = None) -> dict:
    """Interrupt a checkpointed run at step ``interrupt_at`` (a monitor raising), then run again
    with the same checkpoint path and seed. Returns the resumed posterior's outputs (which must
    equal the uninterrupted base case's) and facts about the interruption."""
    base = s["base"]
    data, Xq, yq = make_data(base)
    with tempfile.TemporaryDirectory(dir=tmpdir) as td:
        path = os.path.join(td, "run.ckpt")
        ck = {"checkpoint": path, "checkpoint_every": s["checkpoint_every"]}
        interrupted = False
        try:
            build_sampler(base, **ck).run(data, seed=base["seed"], monitor=InterruptAt(s["interrupt_at"]))
        except Interrupt:
            interrupted = True
        if not interrupted:
            raise AssertionError("the monitor's exception did not propagate out of run(): the run was not interrupted")
        if not os.path.exists(path):
            raise AssertionError(f"no checkpoint at {path} after interrupting at step {s['interrupt_at']}")
        saved_step = checkpoint_step(path)
        mon = Steps()
        post = build_sampler(base, **ck).run(data, seed=base["seed"], monitor=mon)
    out = hard_outputs(post, Xq, yq)
    return {"posterior": out, "checkpoint_step": saved_step, "first_step_after_resume": mon.steps[0] if mon.steps else None}


# ----------------------------------------------------------------------------- 2 ranks (gloo)
def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def rank_worker(out_dir: str, names: list) -> int:
    """One rank of the 2-rank job (started by :func:`run_ranks` with torchrun's env vars)."""
    torch.set_num_threads(1)
    import torchtree.distributed as td

    by_name = {c["name"]: c for c in cases()}
    backend = td.get_backend("gloo", timeout=120)
    rank = int(backend.rank)
    results = {}
    try:
        for name in names:
            base = by_name[name]["settings"]["base"]
            data, Xq, yq = make_data(base)
            post = build_sampler(base, backend=backend).run(data, seed=base["seed"])
            results[name] = hard_outputs(post, Xq, yq)
    finally:
        backend.close()
    with open(os.path.join(out_dir, f"rank{rank}.json"), "w") as fh:
        json.dump(results, fh)
    return 0


def run_ranks(names: list, world_size: int = 2, timeout: float = 300.0) -> list:
    """Run the named 2-rank cases on ``world_size`` real processes over gloo; returns each
    rank's ``{name: outputs}``."""
    with tempfile.TemporaryDirectory() as out:
        port = _free_port()
        procs = []
        for r in range(world_size):
            env = dict(os.environ, MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port), RANK=str(r), LOCAL_RANK=str(r),
                       WORLD_SIZE=str(world_size), LOCAL_WORLD_SIZE=str(world_size), OMP_NUM_THREADS="1")
            procs.append(subprocess.Popen([sys.executable, __file__, "--rank-worker", out, *names], env=env,
                                          stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True))
        logs, codes = [], []
        deadline = time.monotonic() + timeout
        for p in procs:
            try:
                o, _ = p.communicate(timeout=max(1.0, deadline - time.monotonic()))
            except subprocess.TimeoutExpired:
                for q in procs:
                    q.kill()
                o, _ = p.communicate()
            logs.append(o)
            codes.append(p.returncode)
        if any(codes):
            raise RuntimeError(f"rank processes failed with {codes}:\n" + "\n---\n".join(logs))
        res = []
        for r in range(world_size):
            with open(os.path.join(out, f"rank{r}.json")) as fh:
                res.append(json.load(fh))
        return res


# ----------------------------------------------------------------------------- the cases
CHIPMAN = {"class": "ChipmanPrior", "args": [0.95, 0.5]}
DM5 = {"class": "DirichletMultinomial", "args": [5.0]}
# abalone rings: mean about 10, variance about 10
NIG = {"class": "NormalInverseGamma", "kwargs": {"mu0": 10.0, "kappa0": 0.1, "a0": 2.0, "b0": 10.0}}


def _hard(sampler, data, prior, lik, seed=0, **kwargs):
    return {"sampler": sampler, "data": data, "prior": prior, "likelihood": lik, "kwargs": {"device": "cpu", **kwargs},
            "seed": seed}


def _case_list():
    iris, abalone, heart = "iris", "abalone", "heart"
    c = []

    def add(name, family, runner, settings, **meta):
        c.append({"name": name, "family": family, "runner": runner, "settings": settings, **meta})

    # --- TopDownSMC (paper 001)
    add("topdown_prior_node", "TopDownSMC", "sampler",
        _hard("TopDownSMC", iris, CHIPMAN, DM5, n_particles=200, proposal="prior", expansion="node"))
    add("topdown_optimal_layer", "TopDownSMC", "sampler",
        _hard("TopDownSMC", iris, CHIPMAN, DM5, n_particles=20, proposal="optimal", expansion="layer", seed=1))
    add("topdown_empirical_node_systematic", "TopDownSMC", "sampler",
        _hard("TopDownSMC", iris, CHIPMAN, DM5, n_particles=100, proposal="empirical", expansion="node",
              resampling="systematic", ess_threshold=0.5, seed=2))
    add("topdown_islands2", "TopDownSMC", "sampler",
        _hard("TopDownSMC", iris, CHIPMAN, DM5, n_particles=200, n_islands=2, proposal="prior", expansion="node"))
    add("topdown_regression", "TopDownSMC", "sampler",
        _hard("TopDownSMC", abalone, CHIPMAN, NIG, n_particles=100, n_islands=2, proposal="prior", expansion="node"))
    # --- MCMC (Chipman et al.): engine "auto" runs the numpy host loop for one chain
    # (cut_proposal="prior"), and for several where its cost model finds it cheaper (these small
    # tables), the batched tensor loop otherwise; engine= forces either.
    add("mcmc_host_1chain", "MCMC", "sampler",
        _hard("MCMC", iris, CHIPMAN, DM5, n_chains=1, n_samples=300, engine="auto"), engine="host")
    add("mcmc_batched_1chain", "MCMC", "sampler",
        _hard("MCMC", iris, CHIPMAN, DM5, n_chains=1, n_samples=300, engine="batched"), engine="batched")
    add("mcmc_batched_4chains", "MCMC", "sampler",
        _hard("MCMC", iris, CHIPMAN, DM5, n_chains=4, n_samples=50, thin=2, seed=3, engine="batched"), engine="batched")
    add("mcmc_host_4chains", "MCMC", "sampler",
        _hard("MCMC", iris, CHIPMAN, DM5, n_chains=4, n_samples=50, thin=2, seed=3), engine="host")
    add("mcmc_informed_cuts", "MCMC", "sampler",
        _hard("MCMC", iris, CHIPMAN, DM5, n_chains=2, n_samples=50, cut_proposal="informed", seed=4), engine="batched")
    add("mcmc_regression_host", "MCMC", "sampler",
        _hard("MCMC", abalone, CHIPMAN, NIG, n_chains=1, n_samples=150, init="prior", seed=5), engine="host")
    add("mcmc_regression_batched", "MCMC", "sampler",
        _hard("MCMC", abalone, CHIPMAN, NIG, n_chains=3, n_samples=50, seed=5, engine="batched"), engine="batched")
    add("mcmc_poisson_host", "MCMC", "sampler",
        _hard("MCMC", iris, {"class": "PoissonPrior", "args": [4.0]}, DM5, n_chains=1, n_samples=150, seed=6),
        engine="host")
    add("mcmc_poisson_batched", "MCMC", "sampler",
        _hard("MCMC", iris, {"class": "PoissonPrior", "args": [4.0]}, DM5, n_chains=2, n_samples=50, seed=6,
              engine="batched"), engine="batched")
    # --- SMCSampler (paper 002)
    add("smcmoves_classification", "SMCSampler", "sampler",
        _hard("SMCSampler", iris, CHIPMAN, DM5, n_particles=64, n_iterations=8))
    add("smcmoves_classification_prior_cuts", "SMCSampler", "sampler",
        _hard("SMCSampler", heart, CHIPMAN, DM5, n_particles=64, n_iterations=8, cut_proposal="prior",
              resampling="systematic", seed=7))
    add("smcmoves_regression", "SMCSampler", "sampler",
        _hard("SMCSampler", abalone, CHIPMAN, NIG, n_particles=64, n_iterations=6, seed=8))
    # --- estimators
    add("estimator_classifier_smc", "estimators", "estimator",
        {"estimator": "BayesianTreeClassifier", "data": heart,
         "kwargs": {"method": "smc", "n_particles": 100, "n_islands": 2, "random_state": 0}})
    add("estimator_regressor_mcmc", "estimators", "estimator",
        {"estimator": "BayesianTreeRegressor", "data": abalone,
         "kwargs": {"method": "mcmc", "n_chains": 2, "n_samples": 60, "random_state": 0}})
    # --- checkpoint: interrupted by a monitor raising at step interrupt_at, then resumed
    add("resume_topdown", "TopDownSMC", "resume", {"base_case": "topdown_prior_node", "interrupt_at": 5,
                                                    "checkpoint_every": 1})
    add("resume_mcmc_host", "MCMC", "resume", {"base_case": "mcmc_host_1chain", "interrupt_at": 519,
                                               "checkpoint_every": 40, "monitor_every": 40})
    add("resume_mcmc_batched", "MCMC", "resume", {"base_case": "mcmc_batched_4chains", "interrupt_at": 139,
                                                  "checkpoint_every": 20, "monitor_every": 20})
    add("resume_smcmoves", "SMCSampler", "resume", {"base_case": "smcmoves_classification", "interrupt_at": 4,
                                                    "checkpoint_every": 1})
    # --- 2 gloo ranks (real processes): every rank returns the global posterior, equal to 1 rank's
    add("ranks2_topdown", "TopDownSMC", "ranks", {"base_case": "topdown_islands2", "world_size": 2,
                                                  "backend": "gloo"})
    add("ranks2_smcmoves", "SMCSampler", "ranks", {"base_case": "smcmoves_classification", "world_size": 2,
                                                   "backend": "gloo"})
    # --- soft trees (paper 004), explicit int seeds (DCC treats seed=None as 0 today)
    add("nuts_classification", "NUTS", "sampler",
        {"sampler": "NUTS", "data": iris, "seed": 0,
         "kwargs": {"n_chains": 2, "n_samples": 10, "n_warmup": 15, "depth": 2, "sharpness": 0.05,
                    "max_tree_depth": 5, "evidence": True, "n_proposals": 3, "device": "cpu"}})
    add("nuts_regression_annealed", "NUTS", "sampler",
        {"sampler": "NUTS", "data": abalone, "seed": 3,
         "kwargs": {"n_chains": 2, "n_samples": 8, "n_warmup": 12, "depth": 2, "sharpness": 0.05, "h_init": 0.2,
                    "max_tree_depth": 5, "device": "cpu"}})
    add("dcc_classification", "DCC", "sampler",
        {"sampler": "DCC", "data": iris, "seed": 0,
         "kwargs": {"n_iterations": 2, "n_initial": 5, "n_chains": 2, "n_samples": 3, "n_warmup": 5,
                    "n_warmup_warm": 3, "n_parallel": 1, "activation_threshold": 1, "max_depth": 2,
                    "max_tree_depth": 4, "device": "cpu"}})
    add("dcc_regression_warm", "DCC", "sampler",
        {"sampler": "DCC", "data": abalone, "seed": 1,
         "kwargs": {"n_iterations": 2, "n_initial": 5, "n_chains": 2, "n_samples": 3, "n_warmup": 5,
                    "n_warmup_warm": 3, "n_parallel": 2, "activation_threshold": 1, "max_depth": 2,
                    "max_tree_depth": 4, "warm_start": True, "device": "cpu"}})
    return c


def _resolve(cases):
    """Fill in data settings (file hash, sizes) and copy each base case's settings into the
    resume / ranks cases that derive from it."""
    by_name = {}
    for case in cases:
        s = case["settings"]
        if isinstance(s.get("data"), str):
            s["data"] = data_settings(s["data"])
        by_name[case["name"]] = case
    for case in cases:
        s = case["settings"]
        if "base_case" in s:
            base = copy.deepcopy(by_name[s["base_case"]]["settings"])
            if "monitor_every" in s:
                base["kwargs"]["monitor_every"] = s["monitor_every"]
            s["base"] = base
    return cases


CASES_RAW = _case_list()
CASES = None  # filled by cases() (needs the data files)


def cases():
    global CASES
    if CASES is None:
        CASES = _resolve(copy.deepcopy(CASES_RAW))
    return CASES


def run_case(case: dict, rank_results: dict | None = None) -> dict:
    """Outputs of one case (``rank_results``: the 2-rank job's results, for "ranks" cases)."""
    r, s = case["runner"], case["settings"]
    if r == "sampler":
        return run_sampler(s)
    if r == "estimator":
        return run_estimator(s)
    if r == "resume":
        return run_resume(s)
    if r == "ranks":
        if rank_results is None:
            rank_results = run_ranks([case["name"]], s["world_size"])
        return {f"rank{k}": res[case["name"]] for k, res in enumerate(rank_results)}
    raise ValueError(r)


# ----------------------------------------------------------------------------- comparison
def canonical(x):
    """JSON round trip: tuples -> lists, numpy/torch -> plain; what the file would hold."""
    return json.loads(json.dumps(plain(x)))


def compare(got, want, path="", rtol=0.0, atol=0.0) -> list:
    """Paths where ``got`` differs from ``want``. Floats: bit-exact (repr) unless a tolerance
    is given; NaN equals NaN."""
    diffs = []
    if isinstance(want, dict):
        if not isinstance(got, dict) or set(got) != set(want):
            return [f"{path}: keys {sorted(got) if isinstance(got, dict) else type(got).__name__} != {sorted(want)}"]
        for k in want:
            diffs += compare(got[k], want[k], f"{path}.{k}", rtol, atol)
        return diffs
    if isinstance(want, list):
        if not isinstance(got, list) or len(got) != len(want):
            return [f"{path}: length/type {type(got).__name__}[{len(got) if isinstance(got, list) else '-'}] "
                    f"!= list[{len(want)}]"]
        for i, (g, w) in enumerate(zip(got, want)):
            diffs += compare(g, w, f"{path}[{i}]", rtol, atol)
        return diffs
    if isinstance(want, float) and isinstance(got, (int, float)) and not isinstance(got, bool):
        g = float(got)
        if math.isnan(want) and math.isnan(g):
            return []
        if rtol == 0.0 and atol == 0.0:
            same = g == want and math.copysign(1.0, g) == math.copysign(1.0, want)
        else:
            same = g == want or abs(g - want) <= atol + rtol * abs(want)
        return [] if same else [f"{path}: {g!r} != {want!r} (diff {g - want:.3e})"]
    if isinstance(want, str) and path.endswith(".sha") and (rtol or atol):
        return []  # a bit-exact hash cannot be compared with a tolerance; the values next to it are
    return [] if got == want and type(got) is type(want) else [f"{path}: {got!r} != {want!r}"]


# ----------------------------------------------------------------------------- main
def cpu_capability() -> str:
    """The instruction set torch's CPU kernels use here (``AVX512``, ``AVX2``, ...): results differ between
    them in the last bits, so records are kept per capability."""
    return torch.backends.cpu.get_cpu_capability()


def environment() -> dict:
    return {"torch": torch.__version__, "numpy": np.__version__, "python": platform.python_version(),
            "machine": platform.machine(), "torch_threads": torch.get_num_threads(),
            "torchtree": getattr(torchtree, "__version__", None), "cpu_capability": cpu_capability()}


def record(names=None, check=False, repeat=1) -> int:
    torch.set_num_threads(1)
    all_cases = cases()
    chosen = [c for c in all_cases if names is None or c["name"] in names]
    rank_names = [c["name"] for c in chosen if c["runner"] == "ranks"]
    old = json.loads(GOLDEN.read_text()) if GOLDEN.exists() else None
    old_cases = {c["name"]: c for c in old["cases"]} if old else {}
    records, bad = [], 0
    for rep in range(repeat):
        rank_results = None
        if rank_names:
            t0 = time.perf_counter()
            rank_results = run_ranks(rank_names, 2)
            print(f"  2-rank job ({', '.join(rank_names)}): {time.perf_counter() - t0:.2f} s", flush=True)
        records = []
        for case in chosen:
            t0 = time.perf_counter()
            out = canonical(run_case(case, rank_results))
            dt = time.perf_counter() - t0
            rec = {"name": case["name"], "family": case["family"], "runner": case["runner"],
                   "settings": canonical(case["settings"]), "outputs": out}
            if "engine" in case:
                rec["engine"] = case["engine"]
            records.append(rec)
            ref = old_cases.get(case["name"])
            status = ""
            if ref is not None:
                d = compare(out, ref["outputs"]) + compare(rec["settings"], ref["settings"], "settings")
                status = "same as golden.json" if not d else f"DIFFERS from golden.json ({len(d)}): {d[:3]}"
                bad += bool(d)
            print(f"  [{rep}] {case['name']:<40s} {dt:6.2f} s  {status}", flush=True)
    if check:
        return 1 if bad else 0
    cap = cpu_capability()
    by_cap = dict(old.get("by_capability", {})) if old else {}
    if old is not None and old["recorded_with"].get("cpu_capability", cap) != cap:
        # another CPU capability than the main records': these outputs are kept apart for it (by_capability)
        by_cap[cap] = dict(by_cap.get(cap, {}), **{r["name"]: r["outputs"] for r in records})
        doc = dict(old, by_capability=by_cap)
        GOLDEN.write_text(json.dumps(doc, indent=1) + "\n")
        print(f"wrote {GOLDEN} ({len(records)} cases for {cap} CPUs, apart from the main {old['recorded_with']} ones)")
        return 0
    for other in by_cap.values():  # main records that move leave other CPUs' records of them stale: dropped
        for r in records:
            other.pop(r["name"], None)
    if names is not None and old is not None:  # re-record some cases only: keep the others
        merged = {c["name"]: c for c in old["cases"]}
        merged.update({r["name"]: r for r in records})
        records = [merged[c["name"]] for c in all_cases if c["name"] in merged]
    doc = {"format": FORMAT, "recorded_with": environment(),
           "note": "Re-record with tests/golden/record_golden.py only when the numbers are meant to move; "
                   "say so in the commit message.",
           "cases": records}
    if any(by_cap.values()):
        doc["by_capability"] = {k: v for k, v in by_cap.items() if v}
    GOLDEN.write_text(json.dumps(doc, indent=1) + "\n")
    print(f"wrote {GOLDEN} ({len(records)} cases)")
    return 0


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("names", nargs="*", help="cases to (re)record (default: all)")
    p.add_argument("--check", action="store_true", help="compare with golden.json and write nothing")
    p.add_argument("--repeat", type=int, default=1, help="run every case this many times (determinism check)")
    p.add_argument("--rank-worker", metavar="OUT_DIR", help=argparse.SUPPRESS)
    p.add_argument("--list", action="store_true", help="list the cases")
    a = p.parse_args(argv)
    if a.rank_worker:
        cases()
        return rank_worker(a.rank_worker, a.names)
    if a.list:
        for c in CASES_RAW:
            print(f"{c['name']:<40s} {c['family']:<12s} {c['runner']}")
        return 0
    return record(a.names or None, check=a.check, repeat=a.repeat)


if __name__ == "__main__":
    sys.exit(main())
