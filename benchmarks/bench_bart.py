"""BART benchmark (issue #23): torchtree's ``BART`` against stochtree and bartz.

One run (a data set, a split) prints one JSON line, in the format of
``benchmarks/bart_competitors.py`` (the competitors' runner, in its own throw-away virtual
environment), so both append to the same kind of file::

    python benchmarks/bench_bart.py --data abalone --split 0 >> benchmarks/results/bench_bart.jsonl

``--grid`` runs every data set and split in fresh processes (peak RSS per run) and appends;
``--table`` prints the README's markdown table from both result files (means over splits).

Settings: 200 trees; the competitors run one chain of 500 burn-in and 500 kept sweeps;
torchtree runs 4 chains of 125 warm-up and 125 kept sweeps (the same 1,000 sweeps and 500
kept draws in all). One intra-op thread unless ``--threads``. ``compile_s`` is the
one-time torch.compile cost of the process (a warm-up fit on the same shapes), reported
apart from ``cpu_s`` (the fit and prediction).
"""
from __future__ import annotations

import argparse
import json
import os
import resource
import subprocess
import sys
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))
import bart_data  # noqa: E402

GRID = ["abalone", "friedman1_1000", "friedman1_10000", "friedman1_100000", "pima", "bcw", "heart", "students"]
# smoke-expect: "lib": "torchtree".*"accuracy"

RESULTS = HERE / "results" / "bench_bart.jsonl"
COMPETITORS = HERE / "results" / "bart_competitors.jsonl"


def run_one(data: str, split: int, n_trees: int, n_chains: int, n_warmup: int, n_samples: int, threads: int,
            sampler: str, seed: int, compile: str = "on") -> dict:
    """Fit on one split and return the metrics and timings (one JSON-able dict)."""
    import numpy as np
    import torch

    from torchtree.model.data import Data
    from torchtree.samplers.bart import BART

    torch.set_num_threads(threads)
    X, y, Xt, yt, task = bart_data.load(data, split)
    d = Data(X, y.astype(np.int64) if task == "classification" else y, task=task)
    kw = dict(n_trees=n_trees, n_chains=n_chains, n_warmup=n_warmup, n_samples=n_samples, bart_sampler=sampler,
              n_threads=threads)
    t0, c0 = time.perf_counter(), time.process_time()
    BART(**{**kw, "n_warmup": 0, "n_samples": 1, "n_trees": 2, "compile": compile}).run(d, seed=seed)  # warm-up: compiles
    compile_s = time.process_time() - c0
    t0, c0 = time.perf_counter(), time.process_time()
    post = BART(**kw, compile=compile).run(d, seed=seed)
    fit_wall, fit_cpu = time.perf_counter() - t0, time.process_time() - c0
    t1 = time.perf_counter()
    f = post.latent_draws(Xt).cpu().numpy()
    if task == "regression":
        m = bart_data.metrics(task, yt, f, (post.sigma * post.prior.scale).cpu().numpy())
    else:
        m = bart_data.metrics(task, yt, f)
    pred_wall = time.perf_counter() - t1
    info = post.info
    return {"lib": "torchtree", "lib_version": _version(), "bart_sampler": sampler, "data": data, "split": split,
            "task": task, "n_train": len(y), "n_test": len(yt), "n_trees": n_trees, "n_chains": n_chains,
            "n_warmup": n_warmup, "n_samples": n_samples, "seed": seed, "threads": threads, "compile": compile,
            "metrics": m,
            "sigma_mean": float(post.sigma.mean() * post.prior.scale) if task == "regression" else None,
            "rhat_sigma": info.get("rhat_sigma"), "accept": info.get("accept/all"),
            "compile_s": round(compile_s, 3), "cpu_s": round(time.process_time() - c0, 3),
            "wall_s": round(time.perf_counter() - t0, 3), "fit_cpu_s": round(fit_cpu, 3),
            "fit_wall_s": round(fit_wall, 3), "predict_wall_s": round(pred_wall, 3),
            "peak_rss_mb": round(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024, 1)}


def _version() -> str:
    try:
        from torchtree import __version__
        return __version__
    except Exception:  # pragma: no cover
        return "?"


def table(paths) -> str:
    """Markdown table: per data set and library, means over splits."""
    import numpy as np

    rows = {}
    for p in paths:
        if not Path(p).exists():
            continue
        for line in open(p):
            r = json.loads(line)
            lib = r["lib"] + (f"-{r['bart_sampler']}" if r.get("bart_sampler", "mcmc") != "mcmc" else "")
            threads = r.get("threads", (r.get("thread_setting") or {}).get("threads", 1))
            rows.setdefault((r["data"], lib, threads), []).append(r)
    out = ["| data | library | threads | splits | RMSE / accuracy | test lpd | 90% coverage | fit+predict CPU s "
           "| + compile s | peak RSS MB |", "|---|---|---|---|---|---|---|---|---|---|"]
    for (data, lib, threads), rs in sorted(rows.items(), key=lambda kv: (GRID.index(kv[0][0]) if kv[0][0] in GRID
                                                                           else 99, kv[0][1], kv[0][2])):
        m = rs[0]["metrics"]
        key = "rmse" if "rmse" in m else "accuracy"
        mean = lambda k: np.mean([r["metrics"][k] for r in rs])  # noqa: E731
        cov = f"{mean('coverage90'):.3f}" if "coverage90" in m else "-"
        comp = f"{np.mean([r['compile_s'] for r in rs]):.1f}" if "compile_s" in rs[0] else "(in CPU s)"
        out.append(f"| {data} | {lib} | {threads} | {len(rs)} | {mean(key):.4f} | {mean('lpd'):.4f} | {cov} | "
                   f"{np.mean([r['cpu_s'] for r in rs]):.1f} | {comp} | {np.mean([r['peak_rss_mb'] for r in rs]):.0f} |")
    return "\n".join(out)


def main(argv=None) -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--data", default="abalone")
    p.add_argument("--split", type=int, default=0)
    p.add_argument("--n-trees", type=int, default=200)
    p.add_argument("--n-chains", type=int, default=4)
    p.add_argument("--n-warmup", type=int, default=125)
    p.add_argument("--n-samples", type=int, default=125)
    p.add_argument("--threads", type=int, default=1)
    p.add_argument("--sampler", default="mcmc", choices=["mcmc", "pg"])
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--grid", action="store_true", help="every data set and split, each in a fresh process")
    p.add_argument("--splits", type=int, default=5)
    p.add_argument("--datasets", nargs="*", default=[g for g in GRID if g != "friedman1_100000"])
    p.add_argument("--out", default=str(RESULTS))
    p.add_argument("--table", action="store_true")
    p.add_argument("--compile", default="on", choices=["on", "auto", "native", "off"],
                   help="BART's compile setting: 'on' (torch.compile, as the recorded figures ran), 'auto' (the default)")
    p.add_argument("--smoke", action="store_true", help="a tiny run (tests): heart, 10 trees, 10 + 10 sweeps, "
                   "compile 'auto' (Inductor's cold start would be most of the time; test_bart.py checks 'on')")
    a = p.parse_args(argv)
    if a.smoke:
        a.data, a.n_trees, a.n_warmup, a.n_samples, a.compile = "heart", 10, 10, 10, "auto"
    if a.table:
        print(table([a.out, COMPETITORS]))
        return
    if a.grid:
        for data in a.datasets:
            for split in range(a.splits):
                cmd = [sys.executable, __file__, "--data", data, "--split", str(split), "--n-trees", str(a.n_trees),
                       "--n-chains", str(a.n_chains), "--n-warmup", str(a.n_warmup), "--n-samples",
                       str(a.n_samples), "--threads", str(a.threads), "--sampler", a.sampler, "--seed", str(a.seed),
                       "--compile", a.compile]
                env = {**os.environ, "OMP_NUM_THREADS": str(a.threads)}
                line = subprocess.run(cmd, capture_output=True, text=True, env=env, check=True).stdout.strip()
                with open(a.out, "a") as fh:
                    fh.write(line.splitlines()[-1] + "\n")
                print(line.splitlines()[-1], flush=True)
        return
    print(json.dumps(run_one(a.data, a.split, a.n_trees, a.n_chains, a.n_warmup, a.n_samples, a.threads, a.sampler,
                             a.seed, a.compile)))


if __name__ == "__main__":
    main()
