"""Host reads per step of every hard-tree sampler, counted on the CPU.

A read of a device value (``item``, ``bool(tensor)``, ``nonzero``, boolean-mask indexing, ...)
stops a GPU run from queueing work ahead and keeps a step out of a CUDA graph; on the CPU it costs
nothing extra, so it can be counted without a GPU. :class:`torchtree.core.syncs.HostReads` counts
them in each sampler's ``step`` (a driver step: a top-down stage, an MCMC block of iterations up to
the next report, an SMC-with-moves iteration, a BART sweep), on a synthetic table (2,000 rows, 6
features). Reported per unit of work (stage, iteration or sweep), with the kinds and the three call
sites that read most, and the operations that would launch a device kernel
(:class:`torchtree.core.syncs.DeviceOps`; a compiled CPU pass counts as one).

Every sampler is counted twice: as it runs on the CPU (with the compiled passes) and through the
plain-torch route that runs off the CPU (``TORCHTREE_NATIVE=0``). For BART that route also has the
CPU's allowance off (``torchtree.samplers.bart.sampler._may_sync``): there a kept sweep reads its
group's depths once per ``COMPACT_EVERY`` sweeps. Last, BART's torch tree update alone: its
kernel-launching operations per update.

Command (from the repository root)::

    .venv/bin/python benchmarks/bench_syncs.py --out benchmarks/results/syncs.txt
"""
from __future__ import annotations

import argparse
import collections
import os
import sys
import warnings
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
# smoke-expect: ^\| TopDownSMC \| classification \|
# smoke-expect: ^\| BART, as on a GPU \| regression \| .* \| 0\.0 \|
# smoke-expect: ^\| regression \| \d+ \| \d+\.\d \|


def table(task: str, n: int, seed: int = 0):
    from torchtree import Data

    g = np.random.default_rng(seed)
    X = g.uniform(size=(n, 6))
    f = 2 * X[:, 0] - X[:, 1] + (X[:, 2] > 0.5)
    y = f + 0.3 * g.normal(size=n)
    return Data(X, y if task == "regression" else (y > np.median(y)).astype(int), task=task)


def count(cls, make, data, per_step):
    """(units of work, Counter of kinds, Counter of sites, kernel-launching operations) over one run of
    ``make()``; ``per_step(state, out)``: the units of work of one step."""
    from torchtree.core.syncs import DeviceOps, HostReads

    step = cls.step
    modes, ops = [], DeviceOps()

    def counted(self, state, ctx):
        with HostReads(where=True) as mode, ops:
            out = step(self, state, ctx)
        modes.append((mode, per_step(state, out)))
        return out

    cls.step = counted
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")  # convergence warnings of short runs
            make().run(data, seed=0)
    finally:
        cls.step = step
    kinds, sites = collections.Counter(), collections.Counter()
    units = sum(u for _, u in modes)
    for m, _ in modes:
        kinds.update(m.reads)
        sites.update(m.sites)
    return units, kinds, sites, ops.total


def kernels_per_update(make, data):
    """(tree updates, DeviceOps) of one BART run of ``make()``: the kernel-launching operations of its torch
    tree updates (the route that runs off the CPU)."""
    from torchtree.core.syncs import DeviceOps
    import torchtree.samplers.bart.sampler as bart_sampler

    mode, calls, update = DeviceOps(), [0], bart_sampler.tree_update

    def counted(*args):
        calls[0] += 1
        with mode:
            return update(*args)

    bart_sampler.tree_update = counted
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            make().run(data, seed=0)
    finally:
        bart_sampler.tree_update = update
    return calls[0], mode


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--rows", type=int, default=2000)
    p.add_argument("--out", default=None)
    p.add_argument("--smoke", action="store_true", help="small runs (tests)")
    a = p.parse_args()
    import torch

    from torchtree import BART, MCMC, SMCSampler, TopDownSMC
    import torchtree.samplers.bart.sampler as bart_sampler

    torch.set_num_threads(1)
    # --smoke: every row of the report at a size whose counting (a Python hook on every torch call) stays short
    n = 40 if a.smoke else a.rows
    small = a.smoke
    mcmc_its = 8 if small else 200

    def one_per_step():
        return lambda state, out: 1

    def iterations():  # an MCMC step runs the iterations up to the next report: count them
        last = [0]

        def units(state, out):
            done, last[0] = state.step - last[0], state.step
            return done
        return units

    bart_kw = dict(n_trees=3 if small else 200, n_chains=4, n_warmup=2 if small else 20, n_samples=2 if small else 20)
    runs = [
        ("TopDownSMC", TopDownSMC, lambda: TopDownSMC(n_particles=20 if small else 500), one_per_step, "stage"),
        ("MCMC, batched", MCMC, lambda: MCMC(n_chains=4, n_samples=mcmc_its // 2, engine="batched"), iterations,
         "iteration"),
        ("SMCSampler", SMCSampler, lambda: SMCSampler(n_particles=16 if small else 256, n_iterations=3 if small else 20),
         one_per_step, "iteration"),
        ("BART, on the CPU", bart_sampler.BART, lambda: BART(**bart_kw), one_per_step, "sweep"),
    ]
    lines = [f"# {' '.join(sys.argv)}", f"# torch {torch.__version__}, CPU, synthetic table of {n} rows x 6 features; "
             "reads per unit of work (a stage, an iteration, a sweep) over one run", "",
             "| sampler | task | unit | units | reads per unit | kernels per unit | kinds (whole run) | top call sites "
             "(whole run) |", "|---|---|---|---|---|---|---|---|"]
    print("\n".join(lines), flush=True)

    def row(name, task, unit, units, kinds, sites, kernels):
        top = "; ".join(f"{k} {s} x{c}" for (k, s), c in sites.most_common(3))
        r = (f"| {name} | {task} | {unit} | {units} | {sum(kinds.values()) / max(units, 1):.1f} | "
             f"{kernels / max(units, 1):.0f} | {', '.join(f'{k} {v}' for k, v in kinds.most_common())} | {top} |")
        lines.append(r)
        print(r, flush=True)

    for task in ("classification", "regression"):
        data = table(task, n)
        for name, cls, make, units_of, unit in runs:
            row(name, task, unit, *count(cls, make, data, units_of()))
            if cls in (TopDownSMC, MCMC, SMCSampler):  # off the CPU: the plain-torch routes (no compiled kernels)
                os.environ["TORCHTREE_NATIVE"] = "0"
                try:
                    row(f"{name}, torch route (as on a GPU)", task, unit, *count(cls, make, data, units_of()))
                finally:
                    del os.environ["TORCHTREE_NATIVE"]
            if cls is bart_sampler.BART:  # off the CPU: the torch route, and no read allowed
                allowance = bart_sampler._may_sync
                bart_sampler._may_sync = lambda device: False
                os.environ["TORCHTREE_NATIVE"] = "0"
                try:
                    row("BART, as on a GPU", task, unit, *count(cls, lambda: BART(**bart_kw, compile="off"), data,
                                                               units_of()))
                finally:
                    bart_sampler._may_sync = allowance
                    del os.environ["TORCHTREE_NATIVE"]
    more = ["", "BART's torch tree update (the route off the CPU): operations that launch a device kernel "
            "(torchtree.core.syncs.DeviceOps), per update", "",
            "| task | tree updates | kernels per update | most frequent |", "|---|---|---|---|"]
    for task in ("classification", "regression"):
        calls, mode = kernels_per_update(lambda: BART(**bart_kw, compile="off"), table(task, n))
        top = ", ".join(f"{k.replace('aten.', '')} {v / calls:.1f}" for k, v in mode.ops.most_common(8))
        more.append(f"| {task} | {calls} | {mode.total / max(calls, 1):.1f} | {top} |")
    print("\n".join(more), flush=True)
    lines += more
    if a.out:
        Path(a.out).write_text("\n".join(lines) + "\n")
    print("bench_syncs: done")


if __name__ == "__main__":
    main()
