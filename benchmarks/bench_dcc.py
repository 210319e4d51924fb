"""Benchmark DCC-Tree (paper 004) on CGM, WU and four UCI data sets, and batched NUTS vs Pyro.

Usage::

    python benchmarks/bench_dcc.py                      # all data sets + NUTS throughput
    python benchmarks/bench_dcc.py --datasets iris wine --seeds 0 1
    python benchmarks/bench_dcc.py --skip-throughput --json results.json
    python benchmarks/bench_dcc.py --only-throughput --throughput-models wu iris   # NUTS vs Pyro
    python benchmarks/bench_dcc.py --only-throughput --nuts-async   # asynchronous NUTS sampling phase
    python benchmarks/bench_dcc.py --only-throughput --compare-compile --pyro-seeds 0 1 2 3 4 5 6 7
    python benchmarks/bench_dcc.py --datasets raisin --split-seeds 0 1 2 --baselines   # + hard-tree MCMC / SMC
    python benchmarks/bench_dcc.py --datasets raisin --split-seeds 0 1 --baselines --skip-dcc --dcc-json a.json b.json
    python benchmarks/bench_dcc.py --datasets raisin --set signed_splits=True   # splits of either sign (not the paper's)
    python benchmarks/bench_dcc.py --datasets wu cgm --noise-floors 2000 --skip-dcc --skip-throughput
    python benchmarks/bench_dcc.py --smoke              # tiny run (< 1 min) for the example tests

Data: CGM and WU are generated (``torchtree.datasets.synthetic``, paper 004 App. C);
``breast_cancer_wisconsin_original``, ``iris``, ``wine`` and ``raisin`` are read from
``--data-dir`` (CSV with a header row, label in the last column) and split 70/30 with
a fixed seed. Split sharpness follows the paper's Table 5 (``h_init -> h_final``).

The paper runs T = 500 iterations with N_s = 100 draws, 16 chains and 1000-5000
warm-up iterations per topology on an HPC node; here each data set gets a budget of
DCC iterations sized for about five minutes on two CPU cores (``--max-seconds`` also
stops the loop), and refines several topologies per iteration in one batch.

Throughput (``--only-throughput``): chain-iterations per second of
``torchtree.soft.NUTS`` with 32 chains in one batch vs ``pyro.infer.MCMC(NUTS(model))``
with ``torchtree.pyro``'s model of the same soft tree (depth-2 full tree, same priors,
scaling and sharpness), same warm-up and draw counts, NUTS depth cap and target
acceptance, on WU (regression) and iris (classification). Both run single-threaded in
one process; rates are given per CPU second and per wall second, for warm-up plus
sampling and for the sampling phase alone, with each sampler's test metric as a
check that both sample the same posterior. ``--pyro-seeds`` runs several Pyro chains
one after the other and takes Pyro's rate over all of them (one chain's cost per
iteration depends on the mode it settles in). Pyro runs one chain at a time (its
``num_chains`` spawns processes: on two cores at best 2x, which the last figure
allows for).

Baselines (``--baselines``): paper 004's Table 2 sets DCC-Tree beside axis-aligned
Bayesian trees (CGM's MCMC, SMC) run on the same split. ``--baselines`` does the same
with this library's hard-tree samplers (``BayesianTreeClassifier`` / ``Regressor`` with
``method="mcmc"`` and ``method="smc"``, settings in ``BASELINES``), once per split seed,
and prints each one's mean over the splits, as for DCC, and, when DCC ran on the same
splits (in this run, or in earlier ``--json`` files given to ``--dcc-json``), DCC's
difference from each, paired by split. Test figures of one 70/30 split move by 2-3 points
from split to split on raisin, so a method is best compared with the others on the
same splits (``--skip-dcc`` runs the baselines alone).

Noise floors (``--noise-floors K``, CGM and WU): the test MSE of the true mean function
on each of K generated test sets (data seeds 0..K-1), i.e. what a perfect model scores.
The paper reports one generated data set, so its figure carries that test set's
noise; the distribution of the floor says how often a fresh draw allows the paper's
band at all (the expected floor is the noise variance: WU 0.0625, CGM 0.04). A second
reference is the true partition with its leaf means fitted to the training data: a
model that finds the generating tree can expect that, not the floor. DCC rows of CGM
and WU print both for their own test set.

Timing: ``--clock cpu`` (default) makes ``--max-seconds`` a budget of this process's
CPU time, so results do not depend on other jobs sharing the machine; tables report
CPU and wall seconds.
"""
# smoke-expect: ^iris\s+0\s+0\s+acc\s+[0-9.]+\s+[0-9.]+
# smoke-expect: ^wu\s+0\s+0\s+mse\s+[0-9.]+\s+[0-9.]+
# smoke-expect: ^iris\s+mcmc\s+0\s+acc\s+[0-9.]+\s+[0-9.]+
# smoke-expect: ^wu\s+DCC - smc test mse, paired over 1 splits: [-+][0-9.]+
# smoke-expect: ^wu\s+noise floor over 50 test sets: mean 0\.06[0-9]+
# smoke-expect: speed-up \(chain-iterations/s, CPU time\): [0-9.]+x
from __future__ import annotations

import argparse
import json
import math
import sys
import time
from typing import Dict, Optional

import numpy as np
import torch

from torchtree.cli.options import parse_threads
from torchtree.core.threads import resolve_threads
from torchtree.datasets import load_table
from torchtree.datasets.synthetic import cgm, cgm_mean, wu, wu_mean
from torchtree.estimators import BayesianTreeClassifier, BayesianTreeRegressor
from torchtree.monitor import Monitor
from torchtree.soft import DCC, NUTS, SoftTreeHyper
from torchtree.model.soft_data import train_test_split

# paper 004, Table 5 (h_init, h_final) and reported test metric (mean, std), Tables 1-2
PAPER = {
    "cgm": dict(h=(0.01, 0.001), metric="mse", paper=(0.040, 1.4e-4)),
    "wu": dict(h=(0.5, 0.025), metric="mse", paper=(0.059, 5.3e-4)),
    "bcw": dict(h=(0.1, 0.025), metric="acc", paper=(0.952, 0.004), file="breast_cancer_wisconsin_original.csv"),
    "iris": dict(h=(0.01, 0.01), metric="acc", paper=(0.911, 0.0), file="iris.csv"),
    "wine": dict(h=(0.025, 0.025), metric="acc", paper=(0.958, 0.020), file="wine.csv"),
    "raisin": dict(h=(0.05, 0.001), metric="acc", paper=(0.844, 0.002), file="raisin.csv"),
}

# per-data-set run sizes (CPU budget), see the module docstring. warm_start (not in
# the paper) starts a new topology from the chains of the topology that proposed it.
_COMMON = dict(n_warmup=150, n_warmup_warm=50, n_samples=20, n_parallel=4, max_depth=4, warm_start=True)
SETTINGS = {
    # CGM: thresholds between integer inputs at h = 0.001 get no gradient, so chains
    # keep the partition they start in: data-informed starts (init="data") find the
    # true tree with the common settings, prior starts with the paper's annealing did
    # not (test MSE 0.28 with n_warmup=500 / n_warmup_warm=200)
    "cgm": dict(_COMMON, n_iterations=60, init="data"),
    "wu": dict(_COMMON, n_iterations=60),
    "bcw": dict(_COMMON, n_iterations=60),
    "iris": dict(_COMMON, n_iterations=60),
    "wine": dict(_COMMON, n_iterations=60),
    "raisin": dict(_COMMON, n_iterations=60),
}


def load(name: str, split_seed: int = 0):
    """Train/test tensors of a data set (regression targets float, labels long)."""
    if name == "cgm":
        return cgm(seed=split_seed)
    if name == "wu":
        return wu(seed=split_seed)
    table = load_table(PAPER[name]["file"])
    X = torch.tensor(table.X, dtype=torch.float64)
    y = torch.tensor(table.y).long()
    return train_test_split(X, y, 0.3, seed=split_seed)


# hard-tree baselines (``--baselines``): Chipman prior (0.95, 0.5) and the estimators'
# default leaf models; sizes give each run well under a minute of CPU on raisin
BASELINES = {
    "mcmc": dict(method="mcmc", n_chains=16, n_warmup=1000, n_samples=1000),
    "smc": dict(method="smc", n_particles=2000, n_islands=5),
}
SMOKE_BASELINES = {
    "mcmc": dict(method="mcmc", n_chains=2, n_warmup=20, n_samples=20),
    "smc": dict(method="smc", n_particles=20, n_islands=2),
}


def run_baseline(name: str, method: str, options: dict, split_seed: int = 0, seed: int = 0) -> dict:
    """One hard-tree baseline on the split ``run_dcc`` uses: train / test metric and CPU seconds."""
    Xtr, ytr, Xte, yte = load(name, split_seed)
    Xtr, ytr, Xte, yte = Xtr.numpy(), ytr.numpy(), Xte.numpy(), yte.numpy()
    regression = PAPER[name]["metric"] == "mse"
    est = (BayesianTreeRegressor if regression else BayesianTreeClassifier)(random_state=seed, **options)
    c0 = time.process_time()
    est.fit(Xtr, ytr)
    fit_cpu = time.process_time() - c0
    if regression:
        train = float(np.mean((est.predict(Xtr) - ytr) ** 2))
        test = float(np.mean((est.predict(Xte) - yte) ** 2))
    else:
        train, test = float(est.score(Xtr, ytr)), float(est.score(Xte, yte))
    return {"dataset": name, "method": method, "seed": seed, "split_seed": split_seed, "metric": PAPER[name]["metric"],
            "train": train, "test": test, "fit_cpu_seconds": fit_cpu}


def _std(values: np.ndarray) -> float:
    """Sample standard deviation (nan for a single value)."""
    return float(values.std(ddof=1)) if len(values) > 1 else float("nan")


def _mean_line(name: str, label: str, rows: list) -> str:
    t = np.array([r["test"] for r in rows])
    sd = _std(t)
    return (f"{name:8s} mean test {rows[0]['metric']} of {label} over {len(rows)} runs: {t.mean():.4f} "
            f"(std {sd:.4f}, standard error {sd / math.sqrt(len(t)):.4f})")


def paired_line(name: str, method: str, dcc_rows: list, base_rows: list) -> Optional[str]:
    """DCC minus a baseline, paired by split: mean and standard error of the differences.

    DCC runs of several seeds on one split are averaged first. Returns None when no
    split has both. For MSE a negative difference means DCC is better; for accuracy a
    positive one.
    """
    dcc_by_split: Dict[int, list] = {}
    for r in dcc_rows:
        dcc_by_split.setdefault(r["split_seed"], []).append(r["test"])
    diffs = [float(np.mean(dcc_by_split[b["split_seed"]])) - b["test"] for b in base_rows
             if b["split_seed"] in dcc_by_split]
    if not diffs:
        return None
    d = np.array(diffs)
    se = _std(d) / math.sqrt(len(d))
    ahead = int((d > 0).sum() if base_rows[0]["metric"] == "acc" else (d < 0).sum())
    return (f"{name:8s} DCC - {method} test {base_rows[0]['metric']}, paired over {len(d)} splits: "
            f"{d.mean():+.4f} (standard error {se:.4f}; DCC better on {ahead}, level on {int((d == 0).sum())})")


def true_leaf(name: str, X: torch.Tensor) -> torch.Tensor:
    """Leaf of the generating tree each row of X falls in (CGM, WU), as a float code [N]."""
    if name == "cgm":  # two leaves share the mean 8: the root split tells them apart
        return cgm_mean(X) + 100.0 * (X[:, 1] <= 2).to(X.dtype)
    return wu_mean(X)


def reference_mses(name: str, Xtr, ytr, Xte, yte) -> tuple:
    """Two references for a generated data set's test MSE.

    Returns
    -------
    (floor, partition): the true mean function's test MSE (the noise of this test set),
    and that of the true partition with each leaf's mean fitted to the training data
    (what a model that finds the right tree but must estimate its leaves can expect).
    """
    mean_fn = {"cgm": cgm_mean, "wu": wu_mean}[name]
    floor = float(((yte - mean_fn(Xte)) ** 2).mean())
    leaf_tr, leaf_te = true_leaf(name, Xtr), true_leaf(name, Xte)
    fitted = torch.zeros_like(yte)
    for code in torch.unique(leaf_te):
        fitted[leaf_te == code] = ytr[leaf_tr == code].mean()
    return floor, float(((yte - fitted) ** 2).mean())


def noise_floors(name: str, n_draws: int) -> dict:
    """Test MSE of the true mean function on the test sets of data seeds 0..n_draws-1.

    Parameters
    ----------
    name : "cgm" or "wu" (generated with the paper's sizes, as ``load`` does)
    n_draws : int, number of data seeds

    Returns
    -------
    dict with ``floors`` (list [n_draws]), their ``mean``, ``std``, 5 / 50 / 95 %
    ``quantiles``, the paper's ``band`` (mean + one std) and ``fraction_within_band``,
    the share of test sets whose floor is at or below the band's upper end; the same
    for the true partition with fitted leaf means (``partition``, ``partition_mean``,
    ``partition_fraction_within_band``, see ``reference_mses``).
    """
    floors, partition = [], []
    for seed in range(n_draws):
        a, b = reference_mses(name, *load(name, seed))
        floors.append(a)
        partition.append(b)
    f, q = np.asarray(floors), np.asarray(partition)
    band = sum(PAPER[name]["paper"])
    return {"dataset": name, "n_draws": n_draws, "floors": floors, "mean": float(f.mean()), "std": _std(f),
            "quantiles": [float(v) for v in np.quantile(f, [0.05, 0.5, 0.95])], "band": band,
            "fraction_within_band": float((f <= band).mean()),
            "partition": partition, "partition_mean": float(q.mean()),
            "partition_fraction_within_band": float((q <= band).mean())}


def run_dcc(name: str, seed: int, max_seconds: float, overrides: dict, clock: str = "wall",
            split_seed: int = 0) -> dict:
    Xtr, ytr, Xte, yte = load(name, split_seed)
    h_init, h_final = PAPER[name]["h"]
    kw = dict(SETTINGS[name])
    kw.update(overrides)
    if "max_seconds" in kw:  # a data set's own (smaller) budget
        max_seconds = min(max_seconds, float(kw.pop("max_seconds")))
    dcc = DCC(h_init=h_init, h_final=h_final, max_seconds=max_seconds, clock=clock, **kw)
    t0, c0 = time.perf_counter(), time.process_time()
    post = dcc.run((Xtr, ytr), seed=seed)
    fit_s, fit_cpu = time.perf_counter() - t0, time.process_time() - c0
    t1 = time.perf_counter()
    oracle = partition = None
    if PAPER[name]["metric"] == "mse":
        train = float(np.mean((post.predict(Xtr) - ytr.numpy()) ** 2))
        test = float(np.mean((post.predict(Xte) - yte.numpy()) ** 2))
        oracle, partition = reference_mses(name, Xtr, ytr, Xte, yte)
    else:
        train, test = post.accuracy(Xtr, ytr), post.accuracy(Xte, yte)
    pred_s = time.perf_counter() - t1
    top = post.summary()["topologies"][0]
    return {
        "dataset": name, "seed": seed, "split_seed": split_seed, "metric": PAPER[name]["metric"], "train": train, "test": test,
        "oracle_test_mse": oracle, "true_partition_test_mse": partition,
        "fit_seconds": fit_s, "fit_cpu_seconds": fit_cpu, "predict_seconds": pred_s, "iterations": post.info.get("iterations"),
        "n_topologies": len(post.topologies), "top_topology": top["topology"], "top_weight": top["weight"],
        "log_evidence": post.log_evidence, "grad_evals": post.info.get("grad_evals"),
        "divergences": post.info.get("divergences"), "settings": kw,
    }


class _PhaseClock(Monitor):
    """Monitor that notes the wall and CPU clocks when sampling starts (after warm-up)."""

    def __init__(self):
        super().__init__()  # a Monitor: samplers reject objects without the three hooks
        self.mark = None

    def on_step(self, step, d):
        if self.mark is None and d.get("hmc/phase") == "sample":
            self.mark = (time.perf_counter(), time.process_time())


def _throughput_data(model_name: str):
    if model_name == "wu":
        Xtr, ytr, Xte, yte = wu(seed=0)
        return Xtr.float(), ytr.float(), Xte.float(), yte.float()
    Xtr, ytr, Xte, yte = load(model_name)
    return Xtr.float(), ytr, Xte.float(), yte


def throughput(model_name: str = "wu", n_chains: int = 32, n_warmup: int = 100,
               n_samples: int = 100, depth: int = 2, h: float = 0.05, max_tree_depth: int = 8,
               pyro_jit: bool = False, asynchronous: bool = False, compile: bool = False,
               pyro_seeds=(0,), n_threads=1) -> dict:
    """Chain-iterations per second: ``torchtree.soft.NUTS`` with ``n_chains`` chains in one
    batch vs ``pyro.infer.MCMC(pyro.infer.NUTS(model))`` (one chain per seed in
    ``pyro_seeds``, run one after the other) on the same soft tree.

    Same model (full tree of ``depth``, sharpness ``h``, same priors and input scaling),
    same warm-up and draw counts, same NUTS depth cap and target acceptance, both
    single-threaded in this process. Rates count warm-up and sampling iterations
    (``total``) and the sampling phase alone (``sample``); wall and CPU clocks.
    Also reports each sampler's test metric (posterior predictive), as a check that
    both sample the same posterior.
    """
    from torchtree.pyro import SoftTreeClassifier, SoftTreeRegressor
    from torchtree.model.soft_data import as_soft_data

    Xtr, ytr, Xte, yte = _throughput_data(model_name)
    regression = ytr.is_floating_point()
    sd = as_soft_data(Xtr, ytr)
    hp = SoftTreeHyper().resolve(sd)
    D = Xtr.shape[1]
    # ours --------------------------------------------------------------------------
    ours = NUTS(n_chains=n_chains, n_samples=n_samples, n_warmup=n_warmup, depth=depth, sharpness=h, hyper=hp,
                max_tree_depth=max_tree_depth, asynchronous=asynchronous, compile=compile, n_threads=n_threads)
    clock = _PhaseClock()
    t0, c0 = time.perf_counter(), time.process_time()
    post = ours.run((Xtr, ytr), seed=0, monitor=clock)
    t_ours, c_ours = time.perf_counter() - t0, time.process_time() - c0
    ts_ours, cs_ours = (t0 + t_ours - clock.mark[0]), (c0 + c_ours - clock.mark[1])
    if regression:
        ours_metric = float(((torch.as_tensor(post.predict(Xte)) - yte) ** 2).mean())
    else:
        ours_metric = post.accuracy(Xte, yte)
    # pyro --------------------------------------------------------------------------
    rng = dict(feature_min=Xtr.min(0).values, feature_max=Xtr.max(0).values)
    if regression:
        model = SoftTreeRegressor(D, topology=depth, sharpness=h, mu_mean=hp.mu_mean, mu_var=hp.mu_var,
                                  sigma_shape=hp.sigma_shape, sigma_scale=hp.sigma_scale, **rng)
    else:
        model = SoftTreeClassifier(D, sd.n_classes, topology=depth, sharpness=h, alpha=hp.alpha, **rng)
    # one Pyro chain per seed, run one after the other: a single chain's cost per
    # iteration depends on the mode it settles in (our 32 chains' step sizes spread
    # over 15x on WU), so several seeds estimate Pyro's rate less noisily
    runs = []
    for seed in pyro_seeds:
        key = (model_name, seed, n_warmup, n_samples, depth, h, max_tree_depth, pyro_jit)
        if key not in _PYRO_RUNS:  # a second variant of ours is compared with the same Pyro chains
            _PYRO_RUNS[key] = _pyro_chain(model, Xtr, ytr, Xte, yte, hp, sd, regression, seed, n_warmup, n_samples,
                                          max_tree_depth, pyro_jit)
        runs.append(_PYRO_RUNS[key])
    t_pyro, c_pyro = sum(r["seconds"] for r in runs), sum(r["cpu_seconds"] for r in runs)
    ts_pyro, cs_pyro = sum(r["sample_seconds"] for r in runs), sum(r["sample_cpu_seconds"] for r in runs)
    pyro_metric = float(np.mean([r["metric"] for r in runs]))
    n_it = n_warmup + n_samples
    out = {
        "model": f"{model_name} depth-{depth} soft {'regression' if regression else 'classification'} tree, h={h}",
        "metric": "test MSE" if regression else "test accuracy",
        "n_warmup": n_warmup, "n_samples": n_samples, "max_tree_depth": max_tree_depth,
        "ours_chains": n_chains, "ours_asynchronous": asynchronous, "ours_compile": compile,
        "ours_seconds": t_ours, "ours_cpu_seconds": c_ours,
        "ours_sample_seconds": ts_ours, "ours_sample_cpu_seconds": cs_ours,
        "ours_grad_evals": post.info["grad_evals"], "ours_tree_depth": post.info["mean_tree_depth"],
        "ours_step_size": post.info["step_size"], "ours_metric": ours_metric,
        "pyro_chains": len(runs), "pyro_seeds": list(pyro_seeds), "pyro_jit": pyro_jit,
        "pyro_seconds": t_pyro, "pyro_cpu_seconds": c_pyro,
        "pyro_sample_seconds": ts_pyro, "pyro_sample_cpu_seconds": cs_pyro,
        "pyro_step_size": float(np.mean([r["step_size"] for r in runs])), "pyro_metric": pyro_metric,
        "pyro_runs": runs,
    }
    for clk, (ot, pt, ost, pst) in {
        "wall": (t_ours, t_pyro, ts_ours, ts_pyro), "cpu": (c_ours, c_pyro, cs_ours, cs_pyro),
    }.items():
        out[f"ours_chain_iter_per_s_{clk}"] = n_chains * n_it / ot
        k = len(runs)
        out[f"pyro_chain_iter_per_s_{clk}"] = k * n_it / pt
        out[f"speedup_total_{clk}"] = (n_chains * n_it / ot) / (k * n_it / pt)
        out[f"speedup_sample_{clk}"] = (n_chains * n_samples / ost) / (k * n_samples / pst)
    # compatibility with earlier JSON consumers
    out["ours_chain_iter_per_s"] = out["ours_chain_iter_per_s_wall"]
    out["pyro_chain_iter_per_s"] = out["pyro_chain_iter_per_s_wall"]
    out["speedup_vs_pyro_1core"] = out["speedup_total_cpu"]
    out["speedup_vs_pyro_2cores"] = out["speedup_total_cpu"] / 2
    return out


_PYRO_RUNS: dict = {}


def _pyro_chain(model, Xtr, ytr, Xte, yte, hp, sd, regression, seed, n_warmup, n_samples, max_tree_depth, jit):
    """One ``pyro.infer.MCMC(NUTS(model))`` chain: wall and CPU seconds (total and
    sampling phase), adapted step size and test metric (posterior predictive)."""
    import pyro
    from pyro.infer import MCMC, Predictive
    from pyro.infer import NUTS as PyroNUTS

    from torchtree.kernels.soft_routing import soft_class_counts

    pyro.set_rng_seed(seed)
    pyro.clear_param_store()
    marks = {}

    def hook(kernel, params, stage, i):
        if stage == "Warmup" and i == n_warmup - 1:
            marks["sample"] = (time.perf_counter(), time.process_time())

    mc = MCMC(PyroNUTS(model, max_tree_depth=max_tree_depth, target_accept_prob=0.8, jit_compile=jit,
                       ignore_jit_warnings=True),
              num_samples=n_samples, warmup_steps=n_warmup, disable_progbar=True, hook_fn=hook)
    t0, c0 = time.perf_counter(), time.process_time()
    mc.run(Xtr, ytr)
    t, c = time.perf_counter() - t0, time.process_time() - c0
    samples = mc.get_samples()
    with torch.no_grad():
        if regression:
            pred = Predictive(model, posterior_samples=samples, return_sites=["_RETURN"])(Xte)["_RETURN"].mean(0)
            metric = float(((pred - yte) ** 2).mean())
        else:
            # leaf class probabilities integrated out: p(k | x) = sum_l phi_l(x) (n_lk + a/K) / (n_l + a)
            K = sd.n_classes
            pred_fn = Predictive(model, posterior_samples=samples, return_sites=["_RETURN"])
            phi_tr = pred_fn(Xtr, ytr)["_RETURN"]  # [S, N, L]
            phi_te = pred_fn(Xte, torch.zeros(len(Xte), dtype=torch.long))["_RETURN"]
            onehot = torch.nn.functional.one_hot(ytr.long(), K).to(phi_tr)
            counts = soft_class_counts(phi_tr, onehot)  # [S, L, K]
            a = float(hp.alpha)
            leaf_p = (counts + a / K) / (counts.sum(-1, keepdim=True) + a)
            proba = torch.einsum("snl,slk->snk", phi_te, leaf_p).mean(0)
            metric = float((proba.argmax(-1) == yte).double().mean())
    return {"seed": seed, "seconds": t, "cpu_seconds": c, "sample_seconds": t0 + t - marks["sample"][0],
            "sample_cpu_seconds": c0 + c - marks["sample"][1], "step_size": float(mc.kernel.step_size),
            "metric": metric}


def print_throughput(t: dict) -> None:
    print(f"\nNUTS throughput: {t['model']}; {t['n_warmup']} warm-up + {t['n_samples']} draws per chain, "
          f"NUTS depth cap {t['max_tree_depth']}")
    how = (" (asynchronous sampling)" if t.get("ours_asynchronous") else "") + (" (torch.compile)" if t.get("ours_compile") else "")
    print(f"  torchtree batched NUTS{how}, "
          f"{t['ours_chains']} chains: {t['ours_chain_iter_per_s_cpu']:.1f} chain-iterations "
          f"per CPU s ({t['ours_cpu_seconds']:.1f} cpu s, {t['ours_seconds']:.1f} wall s; sampling phase "
          f"{t['ours_sample_cpu_seconds']:.1f} cpu s), mean tree depth {t['ours_tree_depth']:.2f}, "
          f"{t['metric']} {t['ours_metric']:.4f}")
    k = t["pyro_chains"]
    each = "" if k == 1 else " (per chain: sampling phase " + ", ".join(
        f"{r['sample_cpu_seconds']:.1f}" for r in t["pyro_runs"]) + " cpu s, step size " + ", ".join(
        f"{r['step_size']:.3f}" for r in t["pyro_runs"]) + ")"
    print(f"  pyro NUTS{' (jit)' if t['pyro_jit'] else ''}, {k} chain{'s one after the other' if k > 1 else ''}{each}: "
          f"{t['pyro_chain_iter_per_s_cpu']:.2f} chain-iterations "
          f"per CPU s ({t['pyro_cpu_seconds']:.1f} cpu s, {t['pyro_seconds']:.1f} wall s; sampling phase "
          f"{t['pyro_sample_cpu_seconds']:.1f} cpu s), {t['metric']} {t['pyro_metric']:.4f}")
    print(f"  speed-up (chain-iterations/s, CPU time): {t['speedup_total_cpu']:.1f}x warm-up+sampling, "
          f"{t['speedup_sample_cpu']:.1f}x sampling only; wall time: {t['speedup_total_wall']:.1f}x, "
          f"{t['speedup_sample_wall']:.1f}x; vs Pyro on both cores (num_chains=2, at best 2x): "
          f"{t['speedup_total_cpu'] / 2:.1f}x")


SMOKE_DCC = dict(n_iterations=3, n_initial=10, n_chains=2, n_samples=5, n_warmup=10, n_warmup_warm=5, n_parallel=2,
                 max_depth=2, n_proposals=2, max_tree_depth=4)


def _fmt_row(r: dict) -> str:
    pm, ps = PAPER[r["dataset"]]["paper"]
    return (f"{r['dataset']:8s} {r['seed']:4d} {r.get('split_seed', 0):5d} {r['metric']:>6s} {r['train']:7.4f} {r['test']:7.4f} "
            f"{pm:8.3f}({ps:.1g}) {r['fit_seconds']:7.1f} {r['fit_cpu_seconds']:7.1f} {r['iterations']:5d} "
            f"{r['n_topologies']:5d}  {r['top_topology']} ({r['top_weight']:.2f})"
            + (f"  [noise floor of this test set: {r['oracle_test_mse']:.4f}" if r["oracle_test_mse"] else "")
            + (f"; true partition, fitted means: {r['true_partition_test_mse']:.4f}]" if r.get("true_partition_test_mse")
               else "]" if r["oracle_test_mse"] else ""))


def within_one_std(r: dict) -> bool:
    """Whether a result matches the paper's mean within one reported std, or is better."""
    pm, ps = PAPER[r["dataset"]]["paper"]
    if r["metric"] == "mse":
        return r["test"] <= pm + ps
    return r["test"] >= pm - ps - 1e-12


def markdown(results: dict) -> str:
    """Results table (markdown) of a benchmark run."""
    lines = [f"Command: `{results['command']}`", "",
             "| data | seed | split | metric | train | test | paper test (std) | within 1 std or better | fit CPU s | fit wall s "
             "| predict s | DCC iterations | topologies | test-set noise floor |",
             "|---|---|---|---|---|---|---|---|---|---|---|---|---|---|"]
    for r in results["dcc"]:
        pm, ps = PAPER[r["dataset"]]["paper"]
        floor = f"{r['oracle_test_mse']:.4f}" if r["oracle_test_mse"] else ""
        lines.append(f"| {r['dataset']} | {r['seed']} | {r.get('split_seed', 0)} | {r['metric']} | {r['train']:.4f} | {r['test']:.4f} | "
                     f"{pm:.3f} ({ps:.2g}) | {'yes' if within_one_std(r) else 'no'} | {r['fit_cpu_seconds']:.0f} | "
                     f"{r['fit_seconds']:.0f} | {r['predict_seconds']:.1f} | {r['iterations']} | {r['n_topologies']} | {floor} |")
    if results.get("baselines"):
        lines += ["", "| data | hard-tree baseline | split | metric | train | test | fit CPU s |", "|---|---|---|---|---|---|---|"]
        lines += [f"| {r['dataset']} | {r['method']} | {r['split_seed']} | {r['metric']} | {r['train']:.4f} | {r['test']:.4f} "
                  f"| {r['fit_cpu_seconds']:.1f} |" for r in results["baselines"]]
    for t in results.get("throughput") or []:
        lines += ["", f"NUTS vs Pyro, {t['model']}, {t['n_warmup']} + {t['n_samples']} iterations per chain: "
                  f"{t['ours_chains']} batched chains {t['ours_chain_iter_per_s_cpu']:.1f} chain-iterations/CPU s, "
                  f"Pyro (1 chain) {t['pyro_chain_iter_per_s_cpu']:.2f}; speed-up {t['speedup_total_cpu']:.1f}x "
                  f"(warm-up + sampling), {t['speedup_sample_cpu']:.1f}x (sampling only); {t['metric']} "
                  f"{t['ours_metric']:.4f} (ours) vs {t['pyro_metric']:.4f} (Pyro)."]
    return "\n".join(lines) + "\n"


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--datasets", nargs="+", default=list(PAPER))
    ap.add_argument("--seeds", nargs="+", type=int, default=[0], help="DCC seeds")
    ap.add_argument("--split-seeds", nargs="+", type=int, default=[0],
                    help="70/30 split seeds (UCI) or data seeds (CGM, WU)")
    ap.add_argument("--max-seconds", type=float, default=270.0, help="time cap of each DCC loop")
    ap.add_argument("--clock", choices=["wall", "cpu"], default="cpu",
                    help="what --max-seconds measures (cpu: this process's CPU time, for shared machines)")
    ap.add_argument("--threads", type=parse_threads, default="auto",
                    help="torch intra-op threads: auto (torchtree's policy, README 'Threads': 1 for these sizes) or N")
    ap.add_argument("--set", nargs="*", default=[], help="DCC overrides, e.g. n_iterations=20 n_chains=4")
    ap.add_argument("--skip-throughput", action="store_true")
    ap.add_argument("--only-throughput", action="store_true", help="only batched NUTS vs Pyro NUTS")
    ap.add_argument("--throughput-models", nargs="+", default=["wu", "iris"], choices=["wu"] + list(PAPER)[2:],
                    help="soft-tree models of the NUTS vs Pyro comparison")
    ap.add_argument("--throughput-chains", type=int, default=32)
    ap.add_argument("--throughput-iters", nargs=2, type=int, default=[100, 100], metavar=("WARMUP", "SAMPLES"))
    ap.add_argument("--pyro-jit", action="store_true", help="Pyro NUTS with jit_compile=True")
    ap.add_argument("--pyro-seeds", nargs="+", type=int, default=[0],
                    help="one Pyro chain per seed, one after the other; its rate is over all of them")
    ap.add_argument("--nuts-async", action="store_true",
                    help="our NUTS with asynchronous sampling (NUTS(asynchronous=True)) instead of the default")
    ap.add_argument("--compile", action="store_true",
                    help="our NUTS with the soft-tree potential through torch.compile (NUTS(compile=True)); "
                         "the compilation counts in the warm-up time")
    ap.add_argument("--compare-compile", action="store_true",
                    help="run our NUTS both plain and with --compile, against the same Pyro chains")
    ap.add_argument("--baselines", action="store_true",
                    help="also run the hard-tree MCMC and SMC baselines (BASELINES) on each split")
    ap.add_argument("--skip-dcc", action="store_true", help="no DCC runs (e.g. baselines alone)")
    ap.add_argument("--dcc-json", nargs="*", default=[], metavar="FILE",
                    help="DCC rows from earlier --json files, paired with --baselines by split")
    ap.add_argument("--noise-floors", type=int, default=0, metavar="K",
                    help="for CGM / WU: the true function's test MSE on K generated test sets")
    ap.add_argument("--json", default=None, help="write all results to this file")
    ap.add_argument("--markdown", default=None, help="write a markdown results table to this file")
    ap.add_argument("--smoke", action="store_true", help="tiny configuration (< 1 min) for the example tests")
    args = ap.parse_args(argv)
    # "auto": the policy for this script's largest runs (rows x chains), small work: one thread
    threads = resolve_threads(args.threads, 20_000 * max(32, args.throughput_chains))
    torch.set_num_threads(threads)  # Pyro and predictions; the samplers get n_threads below
    print(f"threads: {threads} (--threads {args.threads})", flush=True)
    overrides = {}
    defaults = {o.name: o.default for o in DCC.config_class.options()}  # DCCConfig's table
    for item in args.set:
        k, v = item.split("=", 1)
        if v in ("True", "False"):
            overrides[k] = v == "True"
        elif k in defaults and isinstance(defaults[k], str):
            overrides[k] = v
        elif k in defaults and defaults[k] is not None and not isinstance(defaults[k], bool):
            overrides[k] = type(defaults[k])(float(v))
        else:
            overrides[k] = float(v)
    overrides["n_threads"] = threads
    tp = dict(n_chains=args.throughput_chains, n_warmup=args.throughput_iters[0], n_samples=args.throughput_iters[1],
              n_threads=threads)
    baselines = BASELINES
    if args.smoke:
        args.baselines, baselines = True, SMOKE_BASELINES
        args.datasets, args.seeds, args.max_seconds = ["iris", "wu"], [0], 60.0
        overrides = dict(SMOKE_DCC, **overrides)
        args.throughput_models = ["iris"]
        args.noise_floors = 50
        tp = dict(n_chains=4, n_warmup=5, n_samples=5, max_tree_depth=4)
    results = {"command": " ".join([sys.executable.split("/")[-1]] + sys.argv), "dcc": [], "baselines": [],
               "throughput": [], "noise_floors": []}
    for name in [d for d in args.datasets if d in ("cgm", "wu")] if args.noise_floors else []:
        nf = noise_floors(name, args.noise_floors)
        lo, mid, hi = nf["quantiles"]
        print(f"{name:8s} noise floor over {nf['n_draws']} test sets: mean {nf['mean']:.4f} (std {nf['std']:.4f}; "
              f"5/50/95 %: {lo:.4f} / {mid:.4f} / {hi:.4f}); at or below the paper's band "
              f"(<= {nf['band']:.4f}) on {100 * nf['fraction_within_band']:.1f} % of them", flush=True)
        print(f"{name:8s} true partition with fitted leaf means: test MSE {nf['partition_mean']:.4f} on average, "
              f"within the paper's band on {100 * nf['partition_fraction_within_band']:.1f} % of the test sets", flush=True)
        results["noise_floors"].append(nf)
    if not (args.only_throughput or args.skip_dcc):
        print(f"{'data':8s} {'seed':>4s} {'split':>5s} {'metric':>6s} {'train':>7s} {'test':>7s} {'paper':>15s} {'wall s':>7s} "
              f"{'cpu s':>7s} {'iters':>5s} {'topos':>5s}  top topology (weight)")
        for name in args.datasets:
            rows = []
            for split in args.split_seeds:
                for seed in args.seeds:
                    r = run_dcc(name, seed, args.max_seconds, overrides, args.clock, split)
                    rows.append(r)
                    print(_fmt_row(r), flush=True)
            results["dcc"] += rows
            if len(rows) > 1:
                print(_mean_line(name, "DCC", rows), flush=True)
    for path in args.dcc_json:
        with open(path) as f:
            results["dcc"] += json.load(f)["dcc"]
    if args.baselines and not args.only_throughput:
        print(f"{'data':8s} {'method':>6s} {'split':>5s} {'metric':>6s} {'train':>7s} {'test':>7s} {'cpu s':>7s}")
        for name in args.datasets:
            for method, options in baselines.items():
                rows = [run_baseline(name, method, dict(options, n_threads=threads), split)
                        for split in args.split_seeds]
                for r in rows:
                    print(f"{name:8s} {method:>6s} {r['split_seed']:5d} {r['metric']:>6s} {r['train']:7.4f} "
                          f"{r['test']:7.4f} {r['fit_cpu_seconds']:7.1f}", flush=True)
                if len(rows) > 1:
                    print(_mean_line(name, method, rows), flush=True)
                line = paired_line(name, method, [r for r in results["dcc"] if r["dataset"] == name], rows)
                if line:
                    print(line, flush=True)
                results["baselines"] += rows
    if not args.skip_throughput:
        variants = [False, True] if args.compare_compile else [args.compile]
        for m in args.throughput_models:
            for comp in variants:
                t = throughput(m, pyro_jit=args.pyro_jit, asynchronous=args.nuts_async,
                               compile=comp, pyro_seeds=args.pyro_seeds, **tp)
                results["throughput"].append(t)
                print_throughput(t)
    if args.json:
        with open(args.json, "w") as f:
            json.dump(results, f, indent=1, default=str)
    if args.markdown:
        with open(args.markdown, "w") as f:
            f.write(markdown(results))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
