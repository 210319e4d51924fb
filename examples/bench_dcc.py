"""Benchmark DCC-Tree (paper 004) on CGM, WU and four UCI data sets, and batched NUTS vs Pyro.

Usage::

    python examples/bench_dcc.py                      # all data sets + NUTS throughput
    python examples/bench_dcc.py --datasets iris wine --seeds 0 1
    python examples/bench_dcc.py --skip-throughput --json results.json

Data: CGM and WU are generated (``torchtree.datasets.synthetic``, paper 004 App. C);
``breast_cancer_wisconsin_original``, ``iris``, ``wine`` and ``raisin`` are read from
``--data-dir`` (CSV with a header row, label in the last column) and split 70/30 with
a fixed seed. Split sharpness follows the paper's Table 5 (``h_init -> h_final``).

The paper runs T = 500 iterations with N_s = 100 draws, 16 chains and 1000-5000
warm-up iterations per topology on an HPC node; here each data set gets a budget of
DCC iterations sized for about five minutes on two CPU cores (``--max-seconds`` also
stops the loop), and refines several topologies per iteration in one batch.

Throughput: chain-samples per second of ``torchtree.soft.NUTS`` with 32 chains vs
``pyro.infer.NUTS`` on the same soft-tree model (a depth-2 regression tree on WU),
both after the same number of warm-up iterations. Pyro runs one chain at a time
(its multi-chain mode spawns processes, which on two cores is at best 2x); its
rate is reported per chain and, generously, doubled for two cores.
"""
from __future__ import annotations

import argparse
import json
import math
import os
import sys
import time

import numpy as np
import torch

from torchtree.datasets.synthetic import cgm, cgm_mean, wu, wu_mean
from torchtree.soft import DCC, NUTS, SoftTreeHyper
from torchtree.soft.inputs import train_test_split

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
    "cgm": dict(_COMMON, n_iterations=60),
    "wu": dict(_COMMON, n_iterations=60),
    "bcw": dict(_COMMON, n_iterations=60),
    "iris": dict(_COMMON, n_iterations=60),
    "wine": dict(_COMMON, n_iterations=60),
    "raisin": dict(_COMMON, n_iterations=60),
}


def load(name: str, data_dir: str, split_seed: int = 0):
    """Train/test tensors of a data set (regression targets float, labels long)."""
    if name == "cgm":
        return cgm(seed=split_seed)
    if name == "wu":
        return wu(seed=split_seed)
    arr = np.loadtxt(os.path.join(data_dir, PAPER[name]["file"]), delimiter=",", skiprows=1)
    X = torch.tensor(arr[:, :-1], dtype=torch.float64)
    y = torch.tensor(arr[:, -1]).long()
    return train_test_split(X, y, 0.3, seed=split_seed)


def run_dcc(name: str, data_dir: str, seed: int, max_seconds: float, overrides: dict, clock: str = "wall") -> dict:
    Xtr, ytr, Xte, yte = load(name, data_dir)
    h_init, h_final = PAPER[name]["h"]
    kw = dict(SETTINGS[name])
    kw.update(overrides)
    dcc = DCC(h_init=h_init, h_final=h_final, max_seconds=max_seconds, clock=clock, **kw)
    t0, c0 = time.perf_counter(), time.process_time()
    post = dcc.run((Xtr, ytr), seed=seed)
    fit_s, fit_cpu = time.perf_counter() - t0, time.process_time() - c0
    t1 = time.perf_counter()
    oracle = None
    if PAPER[name]["metric"] == "mse":
        train = float(np.mean((post.predict(Xtr) - ytr.numpy()) ** 2))
        test = float(np.mean((post.predict(Xte) - yte.numpy()) ** 2))
        mean_fn = cgm_mean if name == "cgm" else wu_mean
        oracle = float(((yte - mean_fn(Xte)) ** 2).mean())  # the noise floor of this test set
    else:
        train, test = post.accuracy(Xtr, ytr), post.accuracy(Xte, yte)
    pred_s = time.perf_counter() - t1
    top = post.summary()["topologies"][0]
    return {
        "dataset": name, "seed": seed, "metric": PAPER[name]["metric"], "train": train, "test": test,
        "oracle_test_mse": oracle,
        "fit_seconds": fit_s, "fit_cpu_seconds": fit_cpu, "predict_seconds": pred_s, "iterations": post.info.get("iterations"),
        "n_topologies": len(post.topologies), "top_topology": top["topology"], "top_weight": top["weight"],
        "log_evidence": post.log_evidence, "grad_evals": post.info.get("grad_evals"),
        "divergences": post.info.get("divergences"), "settings": kw,
    }


def throughput(n_chains: int = 32, n_warmup: int = 100, n_samples: int = 100, pyro_samples: int = 100) -> dict:
    """Chain-samples per second: batched NUTS (n_chains) vs Pyro NUTS (one chain)."""
    import pyro
    from pyro.infer import MCMC
    from pyro.infer import NUTS as PyroNUTS

    from torchtree.pyro import SoftTreeRegressor

    Xtr, ytr, _, _ = wu(seed=0)
    Xtr, ytr = Xtr.float(), ytr.float()
    h = 0.05
    hp = SoftTreeHyper().resolve(__import__("torchtree.soft.inputs", fromlist=["as_soft_data"]).as_soft_data(Xtr, ytr))
    ours = NUTS(n_chains=n_chains, n_samples=n_samples, n_warmup=n_warmup, depth=2, sharpness=h, hyper=hp,
                max_tree_depth=8)
    t0 = time.perf_counter()
    post = ours.run((Xtr, ytr), seed=0)
    t_ours = time.perf_counter() - t0
    pyro.set_rng_seed(0)
    model = SoftTreeRegressor(3, topology=2, sharpness=h, mu_mean=hp.mu_mean, mu_var=hp.mu_var,
                              sigma_shape=hp.sigma_shape, sigma_scale=hp.sigma_scale,
                              feature_min=Xtr.min(0).values, feature_max=Xtr.max(0).values)
    mc = MCMC(PyroNUTS(model, max_tree_depth=8), num_samples=pyro_samples, warmup_steps=n_warmup,
              disable_progbar=True)
    t0 = time.perf_counter()
    mc.run(Xtr, ytr)
    t_pyro = time.perf_counter() - t0
    ours_rate = n_chains * (n_warmup + n_samples) / t_ours
    pyro_rate = (n_warmup + pyro_samples) / t_pyro
    return {
        "model": "WU depth-2 soft regression tree, h=0.05",
        "ours_chains": n_chains, "ours_seconds": t_ours, "ours_chain_iter_per_s": ours_rate,
        "ours_grad_evals": post.info["grad_evals"], "ours_tree_depth": post.info["mean_tree_depth"],
        "pyro_seconds": t_pyro, "pyro_chain_iter_per_s": pyro_rate,
        "speedup_vs_pyro_1core": ours_rate / pyro_rate, "speedup_vs_pyro_2cores": ours_rate / (2 * pyro_rate),
    }


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--datasets", nargs="+", default=list(PAPER))
    ap.add_argument("--seeds", nargs="+", type=int, default=[0])
    ap.add_argument("--data-dir", default=os.environ.get("TORCHTREE_DATA", "/work/shared/data"))
    ap.add_argument("--max-seconds", type=float, default=270.0, help="time cap of each DCC loop")
    ap.add_argument("--clock", choices=["wall", "cpu"], default="wall",
                    help="what --max-seconds measures (cpu: this process's CPU time, for shared machines)")
    ap.add_argument("--threads", type=int, default=1, help="torch intra-op threads (1 is fastest on shared cores)")
    ap.add_argument("--set", nargs="*", default=[], help="DCC overrides, e.g. n_iterations=20 n_chains=4")
    ap.add_argument("--skip-throughput", action="store_true")
    ap.add_argument("--only-throughput", action="store_true")
    ap.add_argument("--json", default=None, help="write all results to this file")
    args = ap.parse_args(argv)
    torch.set_num_threads(args.threads)
    overrides = {}
    for item in args.set:
        k, v = item.split("=", 1)
        overrides[k] = type(DCC().__dict__.get(k, 0.0))(float(v)) if k in DCC().__dict__ else float(v)
    results = {"command": " ".join([sys.executable.split("/")[-1]] + sys.argv), "dcc": [], "throughput": None}
    if not args.only_throughput:
        print(f"{'data':8s} {'seed':>4s} {'metric':>6s} {'train':>7s} {'test':>7s} {'paper':>15s} {'wall s':>7s} "
              f"{'cpu s':>7s} {'iters':>5s} {'topos':>5s}  top topology (weight)")
        for name in args.datasets:
            for seed in args.seeds:
                r = run_dcc(name, args.data_dir, seed, args.max_seconds, overrides, args.clock)
                results["dcc"].append(r)
                pm, ps = PAPER[name]["paper"]
                print(f"{name:8s} {seed:4d} {r['metric']:>6s} {r['train']:7.4f} {r['test']:7.4f} "
                      f"{pm:8.3f}({ps:.1g}) {r['fit_seconds']:7.1f} {r['fit_cpu_seconds']:7.1f} {r['iterations']:5d} "
                      f"{r['n_topologies']:5d}  "
                      f"{r['top_topology']} ({r['top_weight']:.2f})"
                      + (f"  [noise floor of this test set: {r['oracle_test_mse']:.4f}]" if r["oracle_test_mse"] else ""),
                      flush=True)
    if not args.skip_throughput:
        t = throughput()
        results["throughput"] = t
        print(f"\nNUTS throughput ({t['model']}):")
        print(f"  torchtree batched NUTS, {t['ours_chains']} chains: {t['ours_chain_iter_per_s']:.1f} chain-iterations/s "
              f"({t['ours_seconds']:.1f} s)")
        print(f"  pyro NUTS, 1 chain: {t['pyro_chain_iter_per_s']:.2f} chain-iterations/s ({t['pyro_seconds']:.1f} s)")
        print(f"  speed-up: {t['speedup_vs_pyro_1core']:.1f}x (vs one Pyro chain), "
              f"{t['speedup_vs_pyro_2cores']:.1f}x (vs Pyro on both cores)")
    if args.json:
        with open(args.json, "w") as f:
            json.dump(results, f, indent=1, default=str)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
