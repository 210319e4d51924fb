"""Run a competitor BART library (stochtree or bartz) on one benchmark split.

Prints ONE JSON line with the metrics of ``bart_data.metrics`` plus timings.
It runs in a throw-away virtual environment, not torchtree's::

    python3 -m venv /tmp/bartvenv
    /tmp/bartvenv/bin/pip install stochtree==0.4.5 bartz==0.13.0 jax==0.10.2 \\
        jaxlib==0.10.2 numpy==2.4.6

(stochtree also pulls scipy, pandas, scikit-learn; bartz pulls equinox,
jaxtyping.) Run from the repository root::

    /tmp/bartvenv/bin/python benchmarks/bart_competitors.py --lib stochtree \\
        --data abalone --split 0 --n-trees 200 --n-burn 500 --n-draws 500 --seed 0

The benchmark grid (one process at a time, appending to the results file)::

    for lib in stochtree bartz; do
      for data in abalone friedman1_1000 friedman1_10000 pima bcw heart students; do
        for split in 0 1 2 3 4; do
          /tmp/bartvenv/bin/python benchmarks/bart_competitors.py --lib $lib \\
            --data $data --split $split --n-trees 200 --n-burn 500 --n-draws 500 \\
            --seed 0 >> benchmarks/results/bart_competitors.jsonl
        done; done; done

Settings: library defaults except the number of trees, burn-in iterations
and retained draws (and ``--thin``, default 1 for both libraries; bartz's own
default thins probit chains by 10, which would run 10x more iterations).
stochtree runs plain MCMC from root (``num_gfr=0``) unless ``--stochtree-gfr
K`` asks for K grow-from-root warm-start sweeps. Single-threaded unless
``--threads N`` (OMP/BLAS env vars, XLA_FLAGS for JAX, stochtree num_threads).
"""

from __future__ import annotations

import argparse
import contextlib
import importlib
import json
import os
import platform
import resource
import sys
import time
import traceback
from pathlib import Path

_XLA_1THREAD = "--xla_cpu_multi_thread_eigen=false intra_op_parallelism_threads=1"


def _parse(argv=None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--lib", required=True, choices=["stochtree", "bartz"])
    p.add_argument("--data", required=True)
    p.add_argument("--split", type=int, default=0)
    p.add_argument("--n-trees", type=int, default=200)
    p.add_argument("--n-burn", type=int, default=500)
    p.add_argument("--n-draws", type=int, default=500)
    p.add_argument("--thin", type=int, default=1, help="keep every k-th draw (both libs)")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--threads", type=int, default=1)
    p.add_argument("--stochtree-gfr", type=int, default=0,
                   help="grow-from-root warm-start sweeps (0 = plain MCMC)")
    return p.parse_args(argv)


def _set_threads(n: int) -> dict:
    """Set thread-count env vars; must run before numpy / jax are imported."""
    for var in ("OMP_NUM_THREADS", "OPENBLAS_NUM_THREADS", "MKL_NUM_THREADS"):
        os.environ[var] = str(n)
    if n == 1:
        os.environ["XLA_FLAGS"] = (os.environ.get("XLA_FLAGS", "") + " " + _XLA_1THREAD).strip()
    return {"threads": n, "OMP_NUM_THREADS": os.environ["OMP_NUM_THREADS"],
            "XLA_FLAGS": os.environ.get("XLA_FLAGS", "")}


if __name__ == "__main__":  # thread env before numpy is loaded
    ARGS = _parse()
    THREAD_INFO = _set_threads(ARGS.threads)

import numpy as np  # noqa: E402

sys.path.insert(0, str(Path(__file__).resolve().parent))
import bart_data  # noqa: E402


def run_stochtree(args, X_train, y_train, X_test, task):
    """Fit stochtree's BARTModel; return (version, f_draws [S,n], sigma_draws|None, timing)."""
    import stochtree
    from stochtree import BARTModel, OutcomeModel

    general = {"random_seed": args.seed, "num_threads": args.threads,
               "keep_every": args.thin}
    if task == "classification":
        general["outcome_model"] = OutcomeModel(outcome="binary", link="probit")
    model = BARTModel()
    t0 = time.perf_counter()
    model.sample(X_train=X_train, y_train=y_train, num_gfr=args.stochtree_gfr,
                 num_burnin=args.n_burn, num_mcmc=args.n_draws,
                 general_params=general, mean_forest_params={"num_trees": args.n_trees})
    t1 = time.perf_counter()
    # [n_test, S]; "linear" scale = mean forest * y_std + y_bar, i.e. the
    # original-scale mean (regression) or the full probit latent incl. offset.
    f = np.asarray(model.predict(X_test, type="posterior", terms="y_hat", scale="linear"))
    t2 = time.perf_counter()
    sigma = None
    if task == "regression":  # global_var_samples: sigma^2 on the original y scale
        sigma = np.sqrt(np.asarray(model.global_var_samples, dtype=np.float64))
    return stochtree.__version__ if hasattr(stochtree, "__version__") else _dist_version(
        "stochtree"), f.T, sigma, (t1 - t0, t2 - t1)


def run_bartz(args, X_train, y_train, X_test, task):
    """Fit bartz's gbart (single chain); return (version, f_draws, sigma_draws|None, timing)."""
    import bartz
    import jax

    kind = "wbart" if task == "regression" else "pbart"
    y = y_train if task == "regression" else y_train.astype(bool)
    t0 = time.perf_counter()
    model = bartz.BART.gbart(X_train, y, type=kind, ntree=args.n_trees, nskip=args.n_burn,
                             ndpost=args.n_draws, keepevery=args.thin, seed=args.seed,
                             printevery=None)
    jax.block_until_ready(model)
    t1 = time.perf_counter()
    f = np.asarray(model.predict(X_test), dtype=np.float64)  # [S, n] latent (probit: with offset)
    t2 = time.perf_counter()
    sigma = None
    if task == "regression":  # sigma_: post-burn-in error sd, original y scale
        sigma = np.asarray(model.sigma_, dtype=np.float64)
    return bartz.__version__, f, sigma, (t1 - t0, t2 - t1)


def _dist_version(name: str) -> str:
    from importlib.metadata import version
    return version(name)


def main(args, thread_info) -> dict:
    """Run one (lib, data, split) job and return the JSON record."""
    X_train, y_train, X_test, y_test, task = bart_data.load(args.data, args.split)
    rec = {"lib": args.lib, "lib_version": None, "data": args.data, "split": args.split,
           "task": task, "n_train": int(len(y_train)), "n_test": int(len(y_test)),
           "n_trees": args.n_trees, "n_burn": args.n_burn, "n_draws": args.n_draws,
           "thin": args.thin, "seed": args.seed, "thread_setting": thread_info}
    if args.lib == "stochtree":
        rec["stochtree_gfr"] = args.stochtree_gfr
    runner = run_stochtree if args.lib == "stochtree" else run_bartz
    try:  # import outside the timed region (jit compilation stays inside)
        importlib.import_module(args.lib)
    except Exception:
        pass  # reported by the runner below
    c0, w0 = time.process_time(), time.perf_counter()
    try:
        with contextlib.redirect_stdout(sys.stderr):  # keep stdout to the JSON line
            version, f, sigma, (fit_w, pred_w) = runner(args, X_train, y_train, X_test, task)
    except Exception as exc:  # record and carry on with the grid
        traceback.print_exc(file=sys.stderr)
        rec["lib_version"] = _safe_version(args.lib)
        rec["error"] = f"{type(exc).__name__}: {exc}"
        return rec
    cpu, wall = time.process_time() - c0, time.perf_counter() - w0
    rec["lib_version"] = version
    if f.shape != (args.n_draws, len(y_test)):
        rec["draws_shape"] = list(f.shape)
    rec["metrics"] = bart_data.metrics(task, y_test, f, sigma)
    if sigma is not None:
        rec["sigma_mean"] = float(np.mean(sigma))
        rec["sigma_draws"] = [float(v) for v in np.ravel(sigma)]  # for the caller's ESS (one chain)
    rec.update(cpu_s=round(cpu, 3), wall_s=round(wall, 3), fit_wall_s=round(fit_w, 3),
               predict_wall_s=round(pred_w, 3),
               peak_rss_mb=round(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024, 1),
               python=platform.python_version(), numpy=np.__version__)
    return rec


def _safe_version(lib: str):
    try:
        return _dist_version(lib)
    except Exception:  # pragma: no cover
        return None


if __name__ == "__main__":
    print(json.dumps(main(ARGS, THREAD_INFO)), flush=True)
