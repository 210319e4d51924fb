"""Benchmark resampling's redistribution step: sequential vs gather vs rotational vs all-to-all.

Usage::

    python benchmarks/bench_redistribution.py                       # defaults below, gloo ranks
    python benchmarks/bench_redistribution.py --exps 10 12 14 16 --capacities 64 512 \
        --ranks 1 2 4 8 --backend gloo --out bench_redistribution.json
    python benchmarks/bench_redistribution.py --backend mpi --ranks 1 2 4   # via mpiexec

For every world size K the script launches K rank processes (gloo ranks with torchrun's
environment variables, or ``mpiexec -n K``), and each rank holds ``N/K`` particles made like a
``HardTrees.as_dict()`` block: 8 per-node fields ``[N, C]`` (int32/float32) plus per-node
statistics ``[N, C, 2]`` float32 and two per-tree fields, i.e. ``40 C + 16`` bytes per tree.
Log-weights are ``randn * 2`` (a typical mid-run degeneracy: about a third of the particles get
no copy); ``ncopies`` comes from ``ncopies_from_log_weights`` (systematic).

Methods: ``sequential`` (Alg. 3, a Python loop; only up to ``--seq-max-exp``) and ``gather``
(prefix sum + searchsorted + index_select) on one rank; ``rotational`` (Alg. 6) and
``alltoall`` on K > 1 ranks (on one rank both reduce to ``gather``). They run as in an SMC loop:
into a spare population (``out=``) with a reused ``Workspace``; ``gather-fresh`` and
``alltoall-fresh`` allocate their outputs and buffers every call, to show what that costs. Each
time is the median of ``--repeats`` runs after one warm-up, each run timed as the slowest rank's
wall time between two barriers. ``step`` is one whole resampling step (ncopies + gather on one
rank, ncopies + all-to-all on several).

Configurations whose estimated memory (about 3x the particle bytes for one rank, 6x summed over
the ranks of a distributed run: input, spare output, packed send and receive buffers) exceeds
``--mem-gb`` are skipped and listed. Ranks are processes on this machine: with more ranks than
cores they are oversubscribed, which shows the shape of the algorithms (message counts, bytes
moved) but not a real cluster's speed-up.

``uid`` (one rank) is the gather of what ``TopDownSMC`` resamples: its particles are rows of
node ids into a shared node table (``GrowthState.node_uid [N, C]`` int32 + ``n_nodes``), 4 C + 8
bytes per particle instead of 40 C + 16, so its resampling moves a tenth of the bytes.

Writes a JSON file and prints a table (milliseconds). ``--smoke`` runs tiny sizes on 1 and 2 ranks, this process
being rank 0 (so one rank process is launched in all).
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import socket
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import torch

NODE_FIELDS = (
    ("feature", torch.int32), ("threshold", torch.float32), ("left", torch.int32),
    ("right", torch.int32), ("parent", torch.int32), ("depth", torch.int32),
    ("status", torch.int32), ("n_data", torch.int32),
)


def row_bytes(capacity: int) -> int:
    return 8 * 4 * capacity + 2 * 4 * capacity + 8 + 8


def make_block(n: int, capacity: int, seed: int) -> dict:
    g = torch.Generator().manual_seed(seed)
    block = {}
    for name, dtype in NODE_FIELDS:
        if dtype.is_floating_point:
            block[name] = torch.rand(n, capacity, generator=g, dtype=dtype)
        else:
            block[name] = torch.randint(-1, 1000, (n, capacity), generator=g, dtype=dtype)
    block["stats"] = torch.rand(n, capacity, 2, generator=g)
    block["n_nodes"] = torch.randint(1, capacity + 1, (n,), generator=g)
    block["log_prior"] = torch.randn(n, generator=g, dtype=torch.float64)
    return block


def mem_needed(big_n: int, capacity: int, ranks: int) -> int:
    # one rank: input, spare output, a fresh output; several: + packed send and receive buffers
    return (3 if ranks == 1 else 6) * big_n * row_bytes(capacity)


# ----------------------------------------------------------------------------- rank side
def worker(args) -> None:
    import torchtree.distributed as td

    if args.backend == "mpi":
        b = td.MPIBackend(timeout=args.timeout)
    else:
        b = td.TorchDistBackend.from_env("gloo", timeout=args.timeout)
    cores = os.cpu_count() or 1
    torch.set_num_threads(args.threads or max(1, cores // b.world_size))
    K = b.world_size
    records = []

    def timed(fn):
        times = []
        for rep in range(args.repeats + 1):
            b.barrier()
            t0 = time.perf_counter()
            fn()
            dt = time.perf_counter() - t0
            slowest = float(b.all_reduce(torch.tensor([dt], dtype=torch.float64), "max")[0])
            if rep:  # the first run is a warm-up (allocator, gloo buffers, caches)
                times.append(slowest)
        times.sort()
        return times[len(times) // 2], times[0]

    for capacity in args.capacities:
        for e in args.exps:
            big_n = 2 ** e
            if big_n % K:
                continue
            if mem_needed(big_n, capacity, K) > args.mem_gb * 2**30:
                continue
            n = big_n // K
            block = make_block(n, capacity, seed=b.rank)
            lw = torch.randn(n, generator=torch.Generator().manual_seed(1000 + b.rank), dtype=torch.float64) * 2
            nc = td.ncopies_from_log_weights(lw, b, u=0.5)
            # Steady-state use: one spare population (out=) and one Workspace per rank.
            out = {k: torch.empty_like(v) for k, v in block.items()}
            ws = td.Workspace()
            if K == 1:
                methods = ["gather", "gather-fresh"] + (["sequential"] if e <= args.seq_max_exp else [])
                # What TopDownSMC actually resamples: node ids into a shared node table
                # (GrowthState.node_uid [N, C] int32 + n_nodes), 4 C + 8 bytes per particle.
                uid_block = {"node_uid": block["left"], "n_nodes": block["n_nodes"]}
                uid_out = {k: torch.empty_like(v) for k, v in uid_block.items()}
                uid_ws = td.Workspace()
                med, best = timed(lambda: td.redistribute(uid_block, nc, b, method="gather", out=uid_out, workspace=uid_ws))
                records.append(dict(ranks=K, N=big_n, capacity=capacity, method="gather-uid", seconds=med, best=best))
                del uid_block, uid_out, uid_ws
            else:
                methods = ["rotational", "alltoall", "alltoall-fresh"]
            for method in methods:
                name, fresh = method.split("-")[0], method.endswith("-fresh")
                kw = {} if fresh else dict(out=out, workspace=ws)
                med, best = timed(lambda: td.redistribute(block, nc, b, method=name, **kw))
                records.append(dict(ranks=K, N=big_n, capacity=capacity, method=method, seconds=med, best=best))
            med, best = timed(lambda: td.ncopies_from_log_weights(lw, b, u=0.5))
            records.append(dict(ranks=K, N=big_n, capacity=capacity, method="ncopies", seconds=med, best=best))
            step = "gather" if K == 1 else "alltoall"
            med, best = timed(lambda: td.redistribute(
                block, td.ncopies_from_log_weights(lw, b, u=0.5), b, method=step, out=out, workspace=ws))
            records.append(dict(ranks=K, N=big_n, capacity=capacity, method="step", seconds=med, best=best))
            del block, out, ws
    if b.rank == 0:
        Path(args.result).write_text(json.dumps(records))
    b.close()


# ----------------------------------------------------------------------------- launcher
def launch(args, ranks: int, result: Path, inline: bool = False) -> None:
    """Run the ``ranks`` rank processes, rank 0's records written to ``result``. ``inline`` (``--smoke``, gloo):
    this process is rank 0 and only the other ranks are launched, which saves a process's torch import per world
    size (a world of one rank launches none)."""
    here = Path(__file__).resolve()
    common = [str(here), "--worker", "--result", str(result), "--backend", args.backend,
              "--repeats", str(args.repeats), "--mem-gb", str(args.mem_gb), "--timeout", str(args.timeout),
              "--seq-max-exp", str(args.seq_max_exp), "--threads", str(args.threads), "--exps", *map(str, args.exps),
              "--capacities", *map(str, args.capacities)]
    if args.backend == "mpi":
        mpiexec = Path(sys.executable).parent / "mpiexec"
        cmd = [str(mpiexec) if mpiexec.exists() else "mpiexec", "-n", str(ranks), sys.executable, *common]
        subprocess.run(cmd, check=True)
        return
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    procs = []
    rank_env = lambda r: dict(RANK=str(r), LOCAL_RANK=str(r), WORLD_SIZE=str(ranks),  # noqa: E731
                              LOCAL_WORLD_SIZE=str(ranks), MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    for r in range(1 if inline else 0, ranks):
        procs.append(subprocess.Popen([sys.executable, *common], env=dict(os.environ, **rank_env(r))))
    if inline:
        saved = {k: os.environ.get(k) for k in rank_env(0)}
        os.environ.update(rank_env(0))
        try:
            worker(argparse.Namespace(**dict(vars(args), result=str(result))))
        except BaseException:
            for p in procs:  # not left waiting for a rank 0 that has gone
                p.kill()
            raise
        finally:
            for k, v in saved.items():
                if v is None:
                    os.environ.pop(k, None)
                else:
                    os.environ[k] = v
    codes = [p.wait() for p in procs]
    if any(codes):
        raise SystemExit(f"ranks failed with exit codes {codes}")


def table(records: list[dict], args) -> str:
    cols = [(1, "sequential"), (1, "gather-fresh"), (1, "gather"), (1, "gather-uid")]
    for k in args.ranks:
        if k > 1:
            cols += [(k, "rotational"), (k, "alltoall")]
    short = {"sequential": "seq", "gather-fresh": "gathF", "gather": "gather", "gather-uid": "uid", "rotational": "rot", "alltoall": "a2a"}
    head = ["C", "N"] + [f"{short[m]}@{k}" for k, m in cols]
    lines = ["  ".join(f"{h:>10}" for h in head)]
    index = {(r["ranks"], r["N"], r["capacity"], r["method"]): r["seconds"] for r in records}
    for c in args.capacities:
        for e in args.exps:
            row = [f"{c:>10}", f"{'2^' + str(e):>10}"]
            for k, m in cols:
                v = index.get((k, 2**e, c, m))
                row.append(f"{v * 1e3:>10.2f}" if v is not None else f"{'-':>10}")
            lines.append("  ".join(row))
    lines.append("")
    lines.append("time per resampling step (ncopies + redistribution; gather on 1 rank, alltoall on K), ms")
    lines.append("  ".join(f"{h:>10}" for h in ["C", "N"] + [f"step@{k}" for k in args.ranks] + [f"ncop@{k}" for k in args.ranks]))
    for c in args.capacities:
        for e in args.exps:
            row = [f"{c:>10}", f"{'2^' + str(e):>10}"]
            for m in ("step", "ncopies"):
                for k in args.ranks:
                    v = index.get((k, 2**e, c, m))
                    row.append(f"{v * 1e3:>10.2f}" if v is not None else f"{'-':>10}")
            lines.append("  ".join(row))
    return "\n".join(lines)


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--exps", type=int, nargs="+", default=[10, 12, 14, 16, 18, 20], help="N = 2^exp particles")
    p.add_argument("--capacities", type=int, nargs="+", default=[64, 512])
    p.add_argument("--ranks", type=int, nargs="+", default=[1, 2, 4, 8])
    p.add_argument("--backend", choices=["gloo", "mpi"], default="gloo")
    p.add_argument("--repeats", type=int, default=3)
    p.add_argument("--mem-gb", type=float, default=6.0, help="skip configurations estimated above this")
    p.add_argument("--seq-max-exp", type=int, default=14, help="largest exp for the Python-loop reference")
    p.add_argument("--timeout", type=float, default=600.0)
    p.add_argument("--threads", type=int, default=0, help="torch threads per rank (0: cores // ranks)")
    p.add_argument("--out", default="bench_redistribution.json")
    p.add_argument("--smoke", action="store_true", help="tiny sizes, 1 and 2 ranks (a quick check that it runs)")
    p.add_argument("--worker", action="store_true", help=argparse.SUPPRESS)
    p.add_argument("--result", help=argparse.SUPPRESS)
    args = p.parse_args()
    if args.worker:
        worker(args)
        return
    if args.smoke:
        args.exps, args.capacities, args.ranks, args.repeats = [8, 10], [16], [1, 2], 1
        args.out = os.path.join(tempfile.gettempdir(), f"bench_redistribution_smoke_{os.getpid()}.json")

    records, skipped = [], []
    for c in args.capacities:
        for e in args.exps:
            for k in args.ranks:
                need = mem_needed(2**e, c, k)
                if need > args.mem_gb * 2**30:
                    skipped.append(dict(ranks=k, N=2**e, capacity=c, reason=f"needs ~{need / 2**30:.1f} GiB > --mem-gb {args.mem_gb}"))
    with tempfile.TemporaryDirectory() as tmp:
        for k in args.ranks:
            result = Path(tmp) / f"ranks{k}.json"
            t0 = time.perf_counter()
            launch(args, k, result, inline=args.smoke)
            records += json.loads(result.read_text())
            print(f"[{k} rank(s): {time.perf_counter() - t0:.1f} s]", file=sys.stderr)
    meta = dict(
        command=" ".join([Path(sys.argv[0]).name] + sys.argv[1:]), backend=args.backend,
        torch=torch.__version__, python=platform.python_version(), machine=platform.machine(),
        cpu_count=os.cpu_count(), row_bytes={c: row_bytes(c) for c in args.capacities},
        note="ranks are local processes; beyond cpu_count they are oversubscribed",
    )
    Path(args.out).write_text(json.dumps(dict(meta=meta, records=records, skipped=skipped), indent=1))
    print(table(records, args))
    for s in skipped:
        print(f"skipped: K={s['ranks']} N={s['N']} C={s['capacity']}: {s['reason']}")
    target = [r for r in records if r["ranks"] == 1 and r["N"] == 2**16 and r["method"] == "gather"]
    for r in target:
        # smoke-expect: ^target: gather of N=2\^\d+ trees|^wrote
        verdict = "meets" if r["seconds"] < 0.1 else "misses"
        print(f"target: gather of N=2^16 trees, C={r['capacity']}: {r['seconds'] * 1e3:.1f} ms ({verdict} < 100 ms)")
    print(f"wrote {args.out}")


if __name__ == "__main__":
    main()
