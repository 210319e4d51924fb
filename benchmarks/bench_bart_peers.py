"""torchtree's BART (compiled C++ backfitting sweep on CPU) against stochtree and bartz, one thread.

Every run is its own process, one library after the other, the whole triple twice per data set
(torchtree stochtree bartz torchtree stochtree bartz). The peers run through
``benchmarks/bart_competitors.py`` in their throw-away venv (see its docstring)::

    python3 -m venv /tmp/bartvenv
    /tmp/bartvenv/bin/pip install stochtree==0.4.5 bartz==0.13.0 jax==0.10.2 jaxlib==0.10.2 numpy==2.4.6

The exact command (from the repository root; 20-40 min on a 2-core box)::

    .venv/bin/python benchmarks/bench_bart_peers.py --peer-python /tmp/bartvenv/bin/python \\
        --out benchmarks/results/bart_peers_native.txt

Cases (split 0 of ``benchmarks/bart_data.py``; friedman1_1000, friedman1_10000, abalone):

* ``defaults``: each library at its own defaults. torchtree:
  ``BayesianTreeRegressor(method="bart", random_state=seed, n_threads=1)`` (200 trees, 4 chains of
  5 grow-from-root + 45 MCMC burn-in + 100 kept sweeps); stochtree 0.4.5 ``BARTModel.sample`` defaults (200 trees, num_gfr=5,
  num_burnin=0, num_mcmc=100, num_threads=1); bartz 0.13.0 ``gbart`` defaults (200 trees, nskip=100,
  ndpost=1000, keepevery=1, one chain).
* ``equal``: 200 trees and 2,000 sweeps in all: torchtree ``BART(n_trees=200, n_chains=4,
  n_warmup=250, n_samples=250, n_gfr=0)`` (4 x 500 MCMC sweeps from single leaves, 1,000 kept draws); the peers one chain of
  1,000 burn-in + 1,000 kept sweeps (stochtree from root, num_gfr=0).

CPU seconds are ``time.process_time`` of fit + predict inside each process (bartz's JIT compile
inside, as bart_competitors measures it); torchtree first makes a tiny fit in the same process so
that loading the C++ extension is not timed (``load`` column). ``proc CPU s`` is the whole child
process (interpreter, imports, data) from ``getrusage(RUSAGE_CHILDREN)``. Before any timing the
parent makes one torchtree warm-up process, which builds the extension if its cache is stale.
``--smoke`` runs a tiny grid once (10 trees, a few sweeps, friedman1_1000); torchtree's runs there are made in the
parent process (the warm-up child runs the worker's code), so their ``proc CPU s`` is the call's alone.
"""
from __future__ import annotations

import argparse
import datetime
import json
import os
import platform
import resource
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
HERE = Path(__file__).resolve().parent
DATASETS = ["friedman1_1000", "friedman1_10000", "abalone"]
CASES = ["defaults", "equal"]
LIBS = ["torchtree", "stochtree", "bartz"]
THREAD_VARS = ("OMP_NUM_THREADS", "OPENBLAS_NUM_THREADS", "MKL_NUM_THREADS")
# smoke-expect: ^\| equal \| friedman1_1000


def peer_args(lib: str, case: str, smoke: bool) -> list:
    """bart_competitors.py flags: (trees, burn-in, kept draws, stochtree GFR sweeps)."""
    if smoke:
        trees, burn, draws, gfr = 10, 5, 5, (2 if case == "defaults" else 0)
    elif case == "defaults":  # each library's own defaults, spelled out
        trees, burn, draws, gfr = (200, 0, 100, 5) if lib == "stochtree" else (200, 100, 1000, 0)
    else:
        trees, burn, draws, gfr = 200, 1000, 1000, 0
    out = ["--n-trees", str(trees), "--n-burn", str(burn), "--n-draws", str(draws), "--thin", "1"]
    return out + (["--stochtree-gfr", str(gfr)] if lib == "stochtree" else [])


def torchtree_worker(case: str, data: str, seed: int, threads: int, smoke: bool) -> dict:
    """One torchtree fit + predict in this process (a tiny untimed fit first loads the extension)."""
    import numpy as np
    import torch

    sys.path.insert(0, str(HERE))
    import bart_data
    from torchtree import BayesianTreeRegressor, __version__
    from torchtree.kernels.native import available as native_ok
    from torchtree.model.data import Data
    from torchtree.samplers.bart import BART

    torch.set_num_threads(threads)
    X, y, Xt, yt, task = bart_data.load(data, 0)
    c0 = time.process_time()
    BART(n_trees=2, n_chains=1, n_warmup=0, n_samples=1, n_threads=threads).run(Data(X, y, task=task), seed=seed)
    load_s = time.process_time() - c0
    small = dict(n_trees=10, n_warmup=5, n_samples=5) if smoke else {}
    c0, w0 = time.process_time(), time.perf_counter()
    if case == "defaults":
        est = BayesianTreeRegressor(method="bart", random_state=seed, n_threads=threads, **small).fit(X, y)
        post, cfg = est.posterior_, est.sampler_config_
    else:
        kw = {**dict(n_trees=200, n_chains=4, n_warmup=250, n_samples=250, n_gfr=0), **small}
        sampler = BART(**kw, n_threads=threads)
        post, cfg = sampler.run(Data(X, y, task=task), seed=seed), sampler.config
    fit_s = time.process_time() - c0
    f = post.latent_draws(Xt).cpu().numpy()
    sigma = (post.sigma * post.prior.scale).cpu().numpy()
    cpu, wall = time.process_time() - c0, time.perf_counter() - w0
    return {"lib": "torchtree", "lib_version": __version__, "case": case, "data": data, "seed": seed,
            "n_trees": cfg.n_trees, "n_chains": cfg.n_chains, "n_burn": post.info["n_warmup"], "n_gfr": post.info.get("n_gfr", 0), "n_draws": cfg.n_samples,
            "compile": cfg.compile, "native": native_ok(), "metrics": bart_data.metrics(task, yt, f, sigma),
            "rhat_sigma": post.info.get("rhat_sigma"), "ess_sigma": post.info.get("ess_sigma"),
            "load_cpu_s": round(load_s, 3), "fit_cpu_s": round(fit_s, 3), "cpu_s": round(cpu, 3),
            "wall_s": round(wall, 3), "numpy": np.__version__, "torch": torch.__version__}


def run_child(cmd: list, env: dict) -> tuple:
    """Run one child; return (its last stdout line as JSON, child CPU s, wall s)."""
    r0, w0 = resource.getrusage(resource.RUSAGE_CHILDREN), time.perf_counter()
    p = subprocess.run(cmd, capture_output=True, text=True, env=env, cwd=ROOT)
    r1, wall = resource.getrusage(resource.RUSAGE_CHILDREN), time.perf_counter() - w0
    cpu = (r1.ru_utime + r1.ru_stime) - (r0.ru_utime + r0.ru_stime)
    lines = p.stdout.strip().splitlines()
    try:
        rec = json.loads(lines[-1])
    except (IndexError, json.JSONDecodeError):
        rec = {"error": f"rc={p.returncode}: {p.stderr.strip()[-800:]}"}
    return rec, cpu, wall


def run_inline(case: str, data: str, seed: int, threads: int) -> tuple:
    """``--smoke``: one torchtree run in this process, as ``run_child`` reports it (the worker's code and its JSON
    record, without a process of its own: the warm-up child has run that path)."""
    c0, w0 = time.process_time(), time.perf_counter()
    try:
        rec = json.loads(json.dumps(torchtree_worker(case, data, seed, threads, True)))
    except Exception as exc:  # noqa: BLE001 - a failure is a record, as a failed child's is
        rec = {"error": f"{type(exc).__name__}: {exc}"[-800:]}
    return rec, time.process_time() - c0, time.perf_counter() - w0


def versions(peer_python: str) -> str:
    import numpy
    import torch

    import torchtree

    code = ("import importlib.metadata as m, platform; print(platform.python_version(), *[n + '=' + m.version(n) "
            "for n in ('stochtree', 'bartz', 'jax', 'jaxlib', 'numpy')])")
    peer = (subprocess.run([peer_python, "-c", code], capture_output=True, text=True).stdout.split()
            if Path(peer_python).exists() else [])
    return (f"torchtree={torchtree.__version__} (commit {git_head()}) torch={torch.__version__} "
            f"numpy={numpy.__version__} python={platform.python_version()} | peer venv: python="
            f"{peer[0] if peer else '?'} {' '.join(peer[1:])}")


def git_head() -> str:
    """The repository's commit, with '+dirty' when torchtree/ or kernels/ differ from it."""
    git = lambda *a: subprocess.run(["git", *a], capture_output=True, text=True, cwd=ROOT).stdout.strip()  # noqa: E731
    dirty = git("status", "--porcelain", "torchtree", "kernels")
    return git("rev-parse", "--short", "HEAD") + ("+dirty" if dirty else "")


def cpu_model() -> str:
    try:
        return next(ln.split(":", 1)[1].strip() for ln in open("/proc/cpuinfo") if ln.startswith("model name"))
    except (OSError, StopIteration):
        return platform.processor() or "?"


def sigma_ess(recs: list) -> str:
    """Mean effective sample size of sigma over the runs: torchtree's pooled over its chains (its
    ``info``), a peer's from its one chain of draws (the same estimator, torchtree.model.diagnostics)."""
    import numpy as np

    from torchtree.model.diagnostics import chain_ess

    vals = [r["ess_sigma"] if r.get("ess_sigma") is not None else
            chain_ess(np.asarray(r["sigma_draws"])[None, :]) if r.get("sigma_draws") else np.nan for r in recs]
    return f"{np.mean(vals):.0f}" if np.isfinite(vals).all() else "-"


def tables(recs: list) -> str:
    """The summary (means over the runs) and the per-library detail, as markdown."""
    import numpy as np

    def get(case, data, lib):
        return [r for r in recs if r.get("case") == case and r.get("data") == data and r.get("lib") == lib]

    summ = ["| case | data | torchtree CPU s | stochtree CPU s | bartz CPU s | tt/stochtree | tt/bartz | "
            "RMSE tt | RMSE stochtree | RMSE bartz | cov90 tt | cov90 st | cov90 bz |", "|" + "---|" * 13]
    det = ["| case | data | library | chains x (burn + kept) | CPU s per run | mean CPU s | load s | proc CPU s | "
           "RMSE | lpd | cov90 | sigma ESS |", "|" + "---|" * 12]
    for case in CASES:
        for data in dict.fromkeys(r.get("data") for r in recs if r.get("data")):  # the data sets run, in order
            cpu, rmse, cov = {}, {}, {}
            for lib in LIBS:
                rs = get(case, data, lib)
                ok = [r for r in rs if "metrics" in r]
                if not rs:
                    continue
                if not ok:
                    err = (rs[0].get("error") or "?").strip().splitlines()[-1][:120]
                    det.append(f"| {case} | {data} | {lib} | | error: {err} | | | | | | |")
                    continue
                m = lambda k: float(np.mean([r["metrics"][k] for r in ok]))  # noqa: E731
                cpu[lib], rmse[lib], cov[lib] = np.mean([r["cpu_s"] for r in ok]), m("rmse"), m("coverage90")
                r0 = ok[0]
                work = f"{r0.get('n_chains', 1)} x ({r0['n_burn']} + {r0['n_draws']})"
                if lib == "stochtree" and r0.get("stochtree_gfr"):
                    work += f" + {r0['stochtree_gfr']} GFR"
                if r0.get("n_gfr"):
                    work += f", {r0['n_gfr']} of the burn-in GFR"
                load = f"{np.mean([r['load_cpu_s'] for r in ok]):.2f}" if "load_cpu_s" in r0 else "-"
                det.append(f"| {case} | {data} | {lib} | {work} | {', '.join('%.2f' % r['cpu_s'] for r in ok)} | "
                           f"{cpu[lib]:.2f} | {load} | {np.mean([r['proc_cpu_s'] for r in ok]):.2f} | "
                           f"{rmse[lib]:.4f} | {m('lpd'):.4f} | {cov[lib]:.3f} | {sigma_ess(ok)} |")
            if not cpu:
                continue
            c = lambda lib, d=cpu: f"{d[lib]:.2f}" if lib in d else "-"  # noqa: E731
            q = lambda lib, d, p=4: f"{d[lib]:.{p}f}" if lib in d else "-"  # noqa: E731
            ratio = lambda lib: (f"{cpu['torchtree'] / cpu[lib]:.3f}"  # noqa: E731
                                 if "torchtree" in cpu and lib in cpu else "-")
            summ.append(f"| {case} | {data} | {c('torchtree')} | {c('stochtree')} | {c('bartz')} | "
                        f"{ratio('stochtree')} | {ratio('bartz')} | {q('torchtree', rmse)} | {q('stochtree', rmse)} | "
                        f"{q('bartz', rmse)} | {q('torchtree', cov, 3)} | {q('stochtree', cov, 3)} | "
                        f"{q('bartz', cov, 3)} |")
    return "\n".join(summ) + "\n\nPer library and run:\n\n" + "\n".join(det)


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--peer-python", default="/tmp/bartvenv/bin/python", help="python of the peers' venv")
    p.add_argument("--cases", nargs="+", default=CASES, choices=CASES)
    p.add_argument("--datasets", nargs="+", default=DATASETS)
    p.add_argument("--libs", nargs="+", default=LIBS, choices=LIBS)
    p.add_argument("--repeats", type=int, default=2, help="times the A B C triple runs per case and data set")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--threads", type=int, default=1)
    p.add_argument("--out", default=None, help="write the report (command, versions, tables, raw records) here")
    p.add_argument("--smoke", action="store_true", help="tiny runs: 10 trees, a few sweeps, friedman1_1000, once")
    p.add_argument("--worker", choices=["torchtree", "warmup"], help=argparse.SUPPRESS)
    p.add_argument("--case", default="defaults", help=argparse.SUPPRESS)
    p.add_argument("--data", default="friedman1_1000", help=argparse.SUPPRESS)
    a = p.parse_args(argv)
    if a.worker:
        smoke = a.smoke or a.worker == "warmup"
        print(json.dumps(torchtree_worker(a.case, a.data, a.seed, a.threads, smoke)), flush=True)
        return 0
    if a.smoke:
        a.datasets, a.repeats = ["friedman1_1000"], 1
    if not Path(a.peer_python).exists():
        print(f"no peer venv at {a.peer_python}: torchtree only (see the docstring to make it)", flush=True)
        a.libs = [lib for lib in a.libs if lib == "torchtree"]
    env = {**os.environ, **{v: str(a.threads) for v in THREAD_VARS}}
    started = datetime.datetime.now().astimezone().isoformat(timespec="seconds")
    load0, head0 = os.getloadavg(), git_head()
    me = [sys.executable, str(Path(__file__).resolve())]
    flags = ["--seed", str(a.seed), "--threads", str(a.threads)] + (["--smoke"] if a.smoke else [])
    warm, wcpu, wwall = run_child(me + ["--worker", "warmup"] + flags, env)
    warm_note = (f"warm-up torchtree process before timing (builds/loads the C++ extension cache): "
                 f"{wcpu:.1f} CPU s, {wwall:.1f} wall s, {'ok' if 'metrics' in warm else warm.get('error')}")
    print(warm_note, flush=True)
    recs = []
    for case in a.cases:
        for data in a.datasets:
            for rep in range(a.repeats):
                for lib in a.libs:
                    if lib == "torchtree" and a.smoke:  # proc CPU s: this call's
                        rec, cpu, wall = run_inline(case, data, a.seed, a.threads)
                    elif lib == "torchtree":
                        cmd = me + ["--worker", "torchtree", "--case", case, "--data", data] + flags
                        rec, cpu, wall = run_child(cmd, env)
                    else:
                        cmd = ([a.peer_python, str(HERE / "bart_competitors.py"), "--lib", lib, "--data", data,
                                "--split", "0", "--seed", str(a.seed), "--threads", str(a.threads)]
                               + peer_args(lib, case, a.smoke))
                        rec, cpu, wall = run_child(cmd, env)
                    rec.update(case=case, data=data, lib=lib, rep=rep, proc_cpu_s=round(cpu, 3),
                               proc_wall_s=round(wall, 3))
                    recs.append(rec)
                    print(json.dumps({k: rec.get(k) for k in ("case", "data", "lib", "rep", "cpu_s", "proc_cpu_s",
                                                              "proc_wall_s", "metrics", "error") if k in rec}),
                          flush=True)
    table = tables(recs)
    print("\n" + table, flush=True)
    if a.out:
        cmd = " ".join([os.path.relpath(sys.executable, ROOT), os.path.relpath(__file__, ROOT)]
                       + (argv if argv is not None else sys.argv[1:]))
        head = [f"# {__doc__.splitlines()[0]}", "", f"command: {cmd}", f"started: {started}",
                f"finished: {datetime.datetime.now().astimezone().isoformat(timespec='seconds')}",
                f"versions: {versions(a.peer_python)}; torchtree commit at start {head0}",
                f"machine: {cpu_model()}, {os.cpu_count()} cores shared with other jobs (load avg at start "
                f"{load0[0]:.2f}, at end {os.getloadavg()[0]:.2f}); every library at {a.threads} thread(s); "
                "times are CPU seconds, not wall",
                warm_note, "order: per case and data set, torchtree stochtree bartz, repeated "
                f"{a.repeats}x; split 0, seed {a.seed}", "",
                "CPU s = process_time of fit + predict in the child (bartz: JIT compile included; torchtree: "
                "C++ extension load excluded, shown as 'load s'); proc CPU s = the whole child process; "
                "ratios are torchtree CPU s / the peer's; cov90 = 90% predictive interval coverage "
                "(bart_data.metrics).", ""]
        Path(a.out).write_text("\n".join(head) + "\n" + table + "\n\nRaw records:\n\n"
                               + "\n".join(json.dumps({k: v for k, v in r.items() if k != "sigma_draws"})
                                           for r in recs) + "\n")
    return 0 if all("metrics" in r for r in recs) else 1


if __name__ == "__main__":
    sys.exit(main())
