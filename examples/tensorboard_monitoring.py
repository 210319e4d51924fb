"""Watch samplers in TensorBoard: one run per sampler, shared tag names.

Fits the Pima diabetes table of the repository's ``data/`` folder with top-down SMC and, when they are available in
this installation, SMC with moves, MCMC and BART, each writing a TensorBoard run under
``--logdir`` (``LOGDIR/smc``, ``LOGDIR/smc-moves``, ``LOGDIR/mcmc``, ``LOGDIR/bart``). Because every
sampler uses the same tags (``smc/ess``, ``trees/leaves_mean``, ``time/seconds``,
...; see docs/tensorboard.md) the runs overlay in TensorBoard's charts.

Usage::

    python examples/tensorboard_monitoring.py --logdir runs/demo
    tensorboard --logdir runs/demo          # then open http://localhost:6006
    python examples/tensorboard_monitoring.py --smoke

The same from the shell: ``torchtree fit DATA.csv --logdir runs/demo/smc``.
"""
from __future__ import annotations

import argparse
import os
import sys
import tempfile
import time

# smoke-expect: ^run smc\s+->
# smoke-expect: ^\s+smc/ess\s
# smoke-expect: ^\s+bart/splits/x0\s
# smoke-expect: ^tensorboard --logdir
# smoke-expect: ^tensorboard_monitoring: done


def load():
    from torchtree.datasets import load_table, table_path

    t = load_table("pima_diabetes")
    return t.X, t.y, str(table_path("pima_diabetes"))


def event_tags(run_dir: str):
    """Scalar tags written to a run directory, read back from the event files."""
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    acc = EventAccumulator(run_dir, size_guidance={"scalars": 0})
    acc.Reload()
    return {tag: len(acc.Scalars(tag)) for tag in acc.Tags()["scalars"]}


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--logdir", default=None, help="TensorBoard log directory (default: a new temporary one)")
    p.add_argument("--n-particles", type=int, default=500)
    p.add_argument("--mcmc-samples", type=int, default=500)
    p.add_argument("--methods", nargs="+", default=["smc", "smc-moves", "mcmc", "bart"])
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--smoke", action="store_true", help="tiny run (for the test suite)")
    args = p.parse_args(argv)
    if args.smoke:
        args.n_particles, args.mcmc_samples, args.methods = 20, 20, ["smc", "bart"]
    logdir = args.logdir or tempfile.mkdtemp(prefix="torchtree-tb-")

    from torchtree.estimators import BayesianTreeClassifier, get_method
    from torchtree.monitor import TensorBoardMonitor, TraceMonitor

    X, y, source = load()
    if args.smoke:
        X, y = X[:200], y[:200]
    print(f"data: {source}: {len(y)} rows, {X.shape[1]} features")
    options = {
        "smc": dict(n_particles=args.n_particles, n_islands=5 if args.n_particles % 5 == 0 else 1, proposal="prior"),
        "smc-moves": dict(n_particles=args.n_particles, n_iterations=10),
        "mcmc": dict(n_chains=4, n_samples=args.mcmc_samples, monitor_every=10),
        "bart": dict(n_trees=50, n_samples=args.mcmc_samples // 4, n_warmup=args.mcmc_samples // 4, monitor_every=5),
    }
    for method in args.methods:
        try:
            get_method(method)
        except ValueError as exc:
            print(f"run {method:<10s} skipped: {exc}")
            continue
        run_dir = os.path.join(logdir, method)
        trace = TraceMonitor()
        clf = BayesianTreeClassifier(method, random_state=args.seed, monitor=[TensorBoardMonitor(run_dir), trace],
                                     **options.get(method, {}))
        t0 = time.perf_counter()
        clf.fit(X, y)
        print(f"run {method:<10s} -> {run_dir} ({time.perf_counter() - t0:.1f} s, {len(trace.steps)} steps)")
        tags = event_tags(run_dir)
        for tag in sorted(tags):
            print(f"    {tag:<28s} {tags[tag]} points")
    if args.smoke and args.logdir is None:
        import shutil

        shutil.rmtree(logdir, ignore_errors=True)
        print(f"tensorboard --logdir {logdir}   (removed again: --smoke without --logdir)")
    else:
        print(f"tensorboard --logdir {logdir}")
    print("tensorboard_monitoring: done")
    return 0


if __name__ == "__main__":
    sys.exit(main())
