"""How DCC's cost grows with the rows N and the features D (issue #21, item 5).

For each (N, D) the script builds what one DCC refinement batches: ``--topologies``
topologies (full trees of ``--depth``) x ``--chains`` chains as one soft-tree batch on
synthetic data (a linear rule on the first two features), and measures in CPU seconds
(``time.process_time``; the process, all threads):

* ``grad``: one ``potential_and_grad`` call for the whole batch (one leapfrog step);
* ``transition``: one lockstep NUTS transition of the batch after a short warm-up, with
  the mean number of leapfrog steps it took (``steps``);
* ``lais``: one LAIS evidence update of ``T = --draws`` draws per chain, with the peak
  memory it adds (``lais_MiB``, from the allocation estimate of ``lais_memory_bytes``).

Budget model (what ``max_seconds`` buys): a DCC refinement visit costs about
``n_samples x steps x grad + lais``; a new topology's warm-up ``n_warmup x steps x grad``.
``grad`` is linear in N and in D (the routing is an ``[N, D] x [D, I]`` product per chain).

``--readme-line B [B ...]`` runs the README's line ``DCC(h_init=0.05, h_final=0.001,
max_seconds=B, clock="cpu")`` on the README's data (400 rows of scikit-learn's breast
cancer table) and reports the CPU seconds it used against B.

``--run-rows N --run-seconds B`` also runs ``DCC(max_seconds=B, clock="cpu")`` on N rows and
reports its CPU / wall seconds against B.

Usage::

    python benchmarks/bench_dcc_scale.py --out benchmarks/results/dcc_scale.txt
    python benchmarks/bench_dcc_scale.py --grid none --run-rows 100000 --run-seconds 120
    python benchmarks/bench_dcc_scale.py --smoke
"""
from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from torchtree.model.soft_trees import SoftTrees  # noqa: E402
from torchtree.model.topology import Topology  # noqa: E402
from torchtree.samplers.dcc.lais import lais_log_weights, lais_memory_bytes  # noqa: E402
from torchtree.samplers.nuts.chains import draw, make_kernel, warmup  # noqa: E402
from torchtree.soft import DCC  # noqa: E402

# smoke-expect: ^N=200 D=5 .*grad
# smoke-expect: ^DCC run: .*cpu .* budget


def synthetic(n: int, d: int, seed: int = 0):
    """``X [n, d]`` standard normal, labels from a linear rule on the first two columns."""
    g = torch.Generator().manual_seed(seed)
    X = torch.randn(n, d, generator=g, dtype=torch.float64)
    y = (X[:, 0] + 0.5 * X[:, 1] > 0).long()
    return X, y


def _clock(device: str):
    """CPU seconds of the process on the CPU; on CUDA, wall seconds after a synchronize (the
    host mostly waits there, so its CPU time says little)."""
    if torch.device(device).type != "cuda":
        return time.process_time

    def wall():
        torch.cuda.synchronize()
        return time.perf_counter()
    return wall


def measure(n: int, d: int, args) -> dict:
    """The per-call seconds of one (N, D) cell (see the module docstring)."""
    X, y = synthetic(n, d)
    G, C, T = args.topologies, args.chains, args.draws
    clock = _clock(args.device)
    gen = torch.Generator(device=args.device).manual_seed(0)
    tops = [Topology.coerce(args.depth)] * G
    model = SoftTrees((X, y), tops, n_chains=C, sharpness=0.025, generator=gen, device=args.device)
    theta = model.theta.data
    model.potential_and_grad(theta)  # first call: allocations
    t = clock()
    for _ in range(args.grad_calls):
        model.potential_and_grad(theta)
    grad = (clock() - t) / args.grad_calls
    P = model.n_params
    if n <= args.max_transition_rows:
        kernel = make_kernel("nuts", max_tree_depth=6, compact=0.5)
        ch, _ = warmup(kernel, model.potential_and_grad, theta, args.warmup, generator=gen, coord_mask=model.coord_mask)
        t = clock()
        ch, tr = draw(kernel, model.potential_and_grad, ch, T, generator=gen)
        transition = (clock() - t) / T
        steps = float(tr.n_steps.float().mean())
        draws = tr.positions.reshape(T, G, C, P).permute(1, 2, 0, 3)
    else:
        # too slow to warm up here: the transition is estimated (steps of the smaller N x grad),
        # LAIS runs on jittered copies of the start
        transition = steps = float("nan")
        noise = 0.01 * torch.randn(G, C, T, P, generator=gen, dtype=theta.dtype, device=theta.device)
        draws = theta.reshape(1, G, C, P).permute(1, 2, 0, 3) + noise * model.coord_mask.reshape(G, C, 1, P)
    mask = model.coord_mask[::C]
    K = C * T * args.proposals
    rows = (torch.arange(G, device=theta.device) * C).repeat_interleave(K)
    t = clock()
    lais_log_weights(draws, mask, lambda xi: model.log_density_chunked(xi.reshape(G * K, P), rows).reshape(G, K),
                     args.proposals, gen)
    lais = clock() - t
    mem = lais_memory_bytes(G, C, T, args.proposals, P, itemsize=draws.element_size())
    return {"N": n, "D": d, "P": P, "grad_s": grad, "transition_s": transition, "steps": steps, "lais_s": lais,
            "lais_MiB": mem / 2**20}


def budget_run(n: int, d: int, seconds: float, clock: str, **settings) -> dict:
    """``DCC(max_seconds=seconds, clock=clock, **settings)`` on ``n x d`` synthetic rows: CPU and
    wall seconds, and the run's counters (or ``error``: the budget ran out before any
    topology was warmed up)."""
    X, y = synthetic(n, d)
    c0, w0 = time.process_time(), time.perf_counter()
    try:
        post = DCC(max_seconds=seconds, clock=clock, **settings).run((X, y), seed=0)
    except ValueError as exc:
        post, error = None, str(exc).split(";")[0]
    out = {"N": n, "D": d, "budget": seconds, "clock": clock, "cpu": time.process_time() - c0,
           "wall": time.perf_counter() - w0}
    if post is None:
        out["error"] = error
        return out
    out.update({k: post.info[k] for k in ("iterations", "warmups", "warmups_cut", "visits_cut", "nuts_iterations")})
    out["topologies"] = len(post.topologies)
    return out


def readme_line(seconds: float, clock: str = "cpu") -> dict:
    """The README's DCC line with ``max_seconds=seconds`` on the README's 400 training rows."""
    import numpy as np
    from sklearn.datasets import load_breast_cancer

    X, y = load_breast_cancer(return_X_y=True)
    idx = np.random.default_rng(0).permutation(len(y))[:400]
    c0, w0 = time.process_time(), time.perf_counter()
    post = DCC(h_init=0.05, h_final=0.001, max_seconds=seconds, clock=clock).run((X[idx], y[idx]), seed=0)
    out = {"budget": seconds, "clock": clock, "cpu": time.process_time() - c0, "wall": time.perf_counter() - w0}
    out.update({k: post.info[k] for k in ("iterations", "warmups", "warmups_cut", "visits_cut")})
    return out


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--grid", default="full", choices=("full", "none"),
                    help="full: N in 1e3, 1e4, 1e5 at D=10 and D in 10, 100, 1000 at N=1e3")
    ap.add_argument("--topologies", type=int, default=4, help="topologies per batch (DCC's n_parallel)")
    ap.add_argument("--chains", type=int, default=8)
    ap.add_argument("--depth", type=int, default=3)
    ap.add_argument("--draws", type=int, default=10, help="NUTS transitions timed (and LAIS draws per chain)")
    ap.add_argument("--warmup", type=int, default=20)
    ap.add_argument("--proposals", type=int, default=5)
    ap.add_argument("--grad-calls", type=int, default=5)
    ap.add_argument("--max-transition-rows", type=int, default=20_000,
                    help="above this N the NUTS transition is estimated as steps x grad, not run")
    ap.add_argument("--run-rows", type=int, default=0, help="also run DCC with a budget on this many rows")
    ap.add_argument("--run-features", type=int, default=10)
    ap.add_argument("--run-seconds", type=float, default=120.0)
    ap.add_argument("--clock", default="cpu", choices=("cpu", "wall"))
    ap.add_argument("--run-warmup", type=int, default=150, help="the run's n_warmup (DCC's default: 150)")
    ap.add_argument("--run-settings", default="{}", help="more DCC settings for the run, as JSON")
    ap.add_argument("--readme-line", type=float, nargs="*", default=[], help="budgets for the README's DCC line")
    ap.add_argument("--device", default="cpu", help="cpu or cuda (CUDA cells are timed in wall seconds)")
    ap.add_argument("--out", help="append the report here")
    ap.add_argument("--smoke", action="store_true", help="a tiny grid and run (for the test-suite)")
    args = ap.parse_args(argv)
    cells = []
    if args.smoke:
        args.draws, args.warmup, args.grad_calls, args.chains = 3, 4, 1, 2
        cells = [(200, 5)]
        args.run_rows, args.run_features, args.run_seconds, args.run_warmup = 200, 3, 3.0, 10
    elif args.grid == "full" and not args.readme_line:
        cells = [(1000, 10), (10_000, 10), (100_000, 10), (1000, 100), (1000, 1000)]
    unit = "wall seconds per call, synchronized" if torch.device(args.device).type == "cuda" else "CPU seconds per call"
    lines = [f"device={args.device} threads={torch.get_num_threads()} topologies={args.topologies} "
             f"chains={args.chains} depth={args.depth} ({unit})"]
    print(lines[0], flush=True)
    steps_seen = float("nan")
    for n, d in cells:
        r = measure(n, d, args)
        if r["steps"] == r["steps"]:
            steps_seen = r["steps"]
            tr_text = f"transition {r['transition_s']:.3f} s ({r['steps']:.1f} steps)"
        else:
            tr_text = f"transition ~{steps_seen * r['grad_s']:.2f} s (est.: {steps_seen:.1f} steps x grad)"
        line = (f"N={n} D={d} P={r['P']}: grad {r['grad_s']:.4f} s, {tr_text}, lais {r['lais_s']:.3f} s "
                f"({r['lais_MiB']:.1f} MiB)")
        print(line, flush=True)
        lines.append(line)
    for b in args.readme_line:
        r = readme_line(b, args.clock)
        line = (f"README line DCC(h_init=0.05, h_final=0.001, max_seconds={b:g}, clock={args.clock!r}): "
                f"cpu {r['cpu']:.2f} s, wall {r['wall']:.2f} s, used/budget {r[args.clock] / b:.4f}; "
                + json.dumps({k: r[k] for k in ("iterations", "warmups", "warmups_cut", "visits_cut")}))
        print(line, flush=True)
        lines.append(line)
    if args.run_rows:
        extra = json.loads(args.run_settings)
        if args.device != "cpu":
            extra.setdefault("device", args.device)
        r = budget_run(args.run_rows, args.run_features, args.run_seconds, args.clock, n_warmup=args.run_warmup,
                       **extra)
        what = ("ValueError: " + r["error"]) if "error" in r else json.dumps(
            {k: r[k] for k in ("iterations", "warmups", "warmups_cut", "visits_cut", "nuts_iterations", "topologies")})
        line = (f"DCC run: N={r['N']} D={r['D']} n_warmup={args.run_warmup} {args.run_settings} "
                f"max_seconds={r['budget']:g} ({r['clock']}): cpu {r['cpu']:.1f} s, wall {r['wall']:.1f} s, "
                f"budget used {r[r['clock']] / r['budget']:.3f}; {what}")
        print(line, flush=True)
        lines.append(line)
    if args.out:
        with open(args.out, "a") as fh:
            fh.write("\n".join(lines) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
