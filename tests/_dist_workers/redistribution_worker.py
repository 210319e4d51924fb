"""One rank of the distributed test job (gloo via torchrun-style env vars, or MPI via mpiexec).

Usage::

    RANK=r WORLD_SIZE=K MASTER_ADDR=... MASTER_PORT=... python redistribution_worker.py gloo OUT MODE
    mpiexec -n K python redistribution_worker.py mpi OUT MODE

MODE ``check``: for every sub-world of sizes 1..K (ranks 0..s-1, a real sub-group /
sub-communicator with its own world size) run the backend primitives, the distributed prefix
sums and ncopies, and every redistribution method on every case, and save the raw outputs to
``OUT/rank{r}.pt`` for the test to compare with single-process references.

MODE ``kill``: rank 1 exits abruptly (``os._exit``) without entering the collective; the
others run a redistribution with a short timeout and record the error they get (and how long
it took) in ``OUT/rank{r}.json``. MODE ``hang``: the same, but rank 1 stays alive and silent
until after the timeout.

In ``check`` mode the ranks meet at a barrier after writing and exit normally (MPI finalises;
``mpiexec`` would kill ranks still writing if one left unfinalised). In the failure modes they
leave with ``os._exit``: after a failed collective MPI's finalisation can hang.
"""

from __future__ import annotations

import json
import os
import sys
import time
import traceback

import torch

import dist_cases as dc
from worker_common import make_world, sub_backend
import torchtree.distributed as td


def primitives(b) -> dict:
    r, s = b.rank, b.world_size
    out = {}
    x = torch.tensor([[r + 1.0, -r, 2.0 ** r]], dtype=torch.float64)
    for op in ("sum", "max", "min"):
        out[f"all_reduce_{op}"] = b.all_reduce(x, op)
    out["all_reduce_int"] = b.all_reduce(torch.tensor([r, 10 * r], dtype=torch.int64), "sum")
    out["all_reduce_bool"] = b.all_reduce(torch.tensor([r == 0, True]), "min")
    out["exclusive_scan"] = b.exclusive_scan(torch.tensor([r + 1, 2 * r + 3], dtype=torch.int64))
    out["all_gather"] = b.all_gather(torch.full((2, 3), float(r)))
    out["all_gather_bool"] = b.all_gather(torch.tensor([r % 2 == 0]))
    ring = torch.arange(4, dtype=torch.int32) + 100 * r
    out["sendrecv"] = b.sendrecv(ring, (r + 1) % s, (r - 1) % s)
    buf = torch.empty_like(ring)
    b.sendrecv(ring, (r + 1) % s, (r - 1) % s, out=buf)
    out["sendrecv_out"] = buf
    out["sendrecv_half"] = b.sendrecv(ring, r + 1 if r + 1 < s else None, r - 1 if r >= 1 else None)
    # Variable sizes, including empty messages: rank r sends (r + d) % 3 rows to rank d.
    send = [torch.full(((r + d) % 3, 2), float(10 * r + d)) for d in range(s)]
    out["all_to_all"] = b.all_to_all(send)
    out["broadcast"] = b.broadcast(torch.tensor([float(r), 7.0]), src=s - 1)
    b.barrier()
    return out


def resampling(b, size: int) -> dict:
    out = {}
    n = dc.N_TOTAL // size
    rows = slice(b.rank * n, (b.rank + 1) * n)
    lw = dc.log_weights(dc.N_TOTAL, seed=size)[rows]
    out["ncopies_systematic"] = td.ncopies_from_log_weights(lw, b, u=dc.SYSTEMATIC_U)
    g = torch.Generator().manual_seed(dc.MULTINOMIAL_SEED)
    out["ncopies_multinomial"] = td.ncopies_from_log_weights(lw, b, method="multinomial", generator=g)
    vals = dc.int_values(dc.N_TOTAL, seed=size)[rows]
    out["prefix_int"] = td.prefix_sum(vals, b)
    out["prefix_int_excl"] = td.prefix_sum(vals, b, exclusive=True)
    out["prefix_float"] = td.prefix_sum(vals.to(torch.float64) / 7, b)
    out["ess"] = td.global_ess(lw, b)
    out["lse"] = td.global_log_sum_exp(lw, b)
    return out


def redistributions(b, size: int) -> dict:
    out = {}
    n = dc.N_TOTAL // size
    rows = slice(b.rank * n, (b.rank + 1) * n)
    block = {k: v[rows] for k, v in dc.make_block(dc.N_TOTAL, seed=size).items()}
    for case in dc.CASES:
        nc = dc.ncopies_case(case, dc.N_TOTAL, size, seed=size)[rows]
        for method in dc.METHODS:
            out[f"{case}/{method}"] = td.redistribute(block, nc, b, method=method)
    nc = dc.ncopies_case("random", dc.N_TOTAL, size, seed=size)[rows]
    for method in dc.METHODS:
        out[f"random/{method}/sequential"] = td.redistribute(block, nc, b, method=method, local="sequential")
    out["random/auto"] = td.redistribute(block, nc, b)
    # Steady-state use: the same workspace and output buffers, twice.
    ws = td.Workspace()
    for method in dc.METHODS:
        buf = {k: torch.full_like(v, 1) for k, v in block.items()}
        for _ in range(2):
            res = td.redistribute(block, nc, b, method=method, out=buf, workspace=ws)
        assert all(res[k] is buf[k] for k in buf)
        out[f"random/{method}/workspace"] = {k: v.clone() for k, v in res.items()}
    # Capacities differ per rank: agree on the largest and pad, then redistribute.
    small = {k: v[rows] for k, v in dc.make_block(dc.N_TOTAL, capacity=3 + b.rank, seed=size).items()}
    fill = {"feature": -1, "threshold": float("nan"), "stats": 0.0}
    padded, cap = td.harmonize_capacity(small, b, node_keys=dc.NODE_KEYS, fill=fill)
    out["capacity"] = torch.tensor(cap)
    out["padded/rotational"] = td.redistribute(padded, nc, b, method="rotational")
    out["padded/alltoall"] = td.redistribute(padded, nc, b, method="alltoall")
    # A bad input on one rank must make every rank raise ValueError together, not hang.
    bad = nc.clone()
    if b.rank == 0:
        bad[0] = -1
    for method in dc.METHODS:
        try:
            td.redistribute(block, bad, b, method=method)
            out[f"bad/{method}"] = "no error"
        except ValueError as exc:
            out[f"bad/{method}"] = f"ValueError: {exc}"
    return out


def check(kind: str, out_dir: str) -> None:
    world = make_world(kind, timeout=60.0)
    results = {"world_size": world.world_size}
    for size in dc.GROUP_SIZES:
        if size > world.world_size:
            continue
        b = sub_backend(kind, world, size, timeout=60.0)
        if b is None:
            continue
        res = {"rank": b.rank, "world_size": b.world_size}
        res.update(primitives(b))
        res.update(resampling(b, size))
        res.update(redistributions(b, size))
        results[size] = res
    world.barrier()
    torch.save(results, os.path.join(out_dir, f"rank{world.rank}.pt"))
    # Nobody leaves before every file is written: mpiexec kills the job as soon as one rank
    # ends without finalising. close() also takes gloo's process group down before exit.
    world.close()


def kill(kind: str, out_dir: str, mode: str = "kill") -> None:
    timeout = float(os.environ.get("TT_TEST_TIMEOUT", "10"))
    world = make_world(kind, timeout=timeout)
    # every rank has finished connecting before rank 1 goes: a rank still setting up its connections when the
    # peer dies fails there, outside the collective under test (seen with the suite on 2 workers of 2 cores)
    world.barrier()
    if world.rank == 1:
        if mode == "hang":  # alive but never joins: only the timeout can free the others
            time.sleep(timeout + 3.0)
        os._exit(3)
    n = 8
    block = dc.make_block(n)
    record = {"rank": world.rank}
    t0 = time.monotonic()
    try:
        td.redistribute(block, torch.ones(n, dtype=torch.int64), world, method="rotational")
        record["error"] = None
    except Exception as exc:  # the test inspects the type
        record["error"] = type(exc).__name__
        record["is_runtime_or_timeout"] = isinstance(exc, (RuntimeError, TimeoutError))
        record["message"] = str(exc)[:500]
    record["elapsed"] = time.monotonic() - t0
    with open(os.path.join(out_dir, f"rank{world.rank}.json"), "w") as f:
        json.dump(record, f)


if __name__ == "__main__":
    kind, out_dir, mode = sys.argv[1], sys.argv[2], sys.argv[3]
    try:
        if mode == "check":
            check(kind, out_dir)
        else:
            kill(kind, out_dir, mode)
    except BaseException:
        traceback.print_exc()
        sys.stderr.flush()
        os._exit(1)
    if mode != "check":
        # After a failed collective, MPI finalisation and gloo teardown can hang: leave now.
        sys.stdout.flush()
        os._exit(0)
