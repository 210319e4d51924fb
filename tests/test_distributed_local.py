"""In-process tests of torchtree.distributed: blocks, ncopies, and the redistribution algorithms.

The distributed algorithms run here on an in-process thread "world" (tests/_dist_workers/
thread_backend.py) so that many world sizes (including non-powers of two) and many random
cases run in seconds; tests/test_distributed_ranks.py checks the same code over real gloo and
MPI processes.
"""

from __future__ import annotations

import math
import sys
from pathlib import Path

import pytest
import torch

import torchtree.distributed as td
from torchtree.distributed._buffers import as_one_buffer

sys.path.insert(0, str(Path(__file__).parent / "_dist_workers"))
import dist_cases as dc  # noqa: E402
from thread_backend import run_threads  # noqa: E402


def same_block(a: dict, b: dict) -> bool:
    """Bitwise equality of two blocks (NaN == NaN)."""
    if a.keys() != b.keys():
        return False
    for k in a:
        x, y = a[k], b[k]
        if x.dtype != y.dtype or x.shape != y.shape:
            return False
        if x.is_floating_point():
            ints = {2: torch.int16, 4: torch.int32, 8: torch.int64}[x.element_size()]
            x, y = x.view(ints), y.view(ints)
        if not torch.equal(x, y):
            return False
    return True


def split_run(world: int, block: dict, ncopies: torch.Tensor, **kw) -> dict:
    """Run td.redistribute on a thread world; concatenate the ranks' outputs."""
    n = ncopies.numel() // world

    def fn(b):
        rows = slice(b.rank * n, (b.rank + 1) * n)
        return td.redistribute({k: v[rows] for k, v in block.items()}, ncopies[rows], b, **kw)

    outs = run_threads(world, fn)
    return {k: torch.cat([o[k] for o in outs]) for k in outs[0]}


# ----------------------------------------------------------------------------- backends
def test_local_backend_is_identity():
    b = td.LocalBackend()
    t = torch.tensor([1.0, 2.0])
    for op in ("sum", "max", "min"):
        out = b.all_reduce(t, op)
        assert torch.equal(out, t) and out.data_ptr() != t.data_ptr()
    assert torch.equal(b.exclusive_scan(t), torch.zeros(2))
    assert torch.equal(b.all_gather(t), t)
    assert torch.equal(b.sendrecv(t, 0, 0), t)
    assert b.sendrecv(t, None, None) is None
    assert torch.equal(b.all_to_all([t])[0], t)
    assert torch.equal(b.broadcast(t, 0), t)
    b.barrier()
    with pytest.raises(ValueError):
        b.all_reduce(t, "prod")
    with pytest.raises(ValueError):
        b.sendrecv(t, 1, 1)


def test_get_backend_resolution(monkeypatch):
    assert isinstance(td.get_backend(None), td.LocalBackend)
    assert isinstance(td.get_backend("local"), td.LocalBackend)
    b = td.LocalBackend(timeout=5)
    assert td.get_backend(b) is b and b.timeout == 5.0
    assert isinstance(b, td.Backend)
    with pytest.raises(ValueError, match="unknown backend"):
        td.get_backend("carrier-pigeon")
    with pytest.raises(TypeError):
        td.get_backend(42)
    with pytest.raises(ValueError, match="positive"):
        td.LocalBackend(timeout=0)
    import torch.distributed as dist

    if not dist.is_initialized():
        for var in ("RANK", "WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT"):
            monkeypatch.delenv(var, raising=False)
        with pytest.raises(RuntimeError, match="torchrun"):
            td.get_backend("gloo")
        with pytest.raises(RuntimeError, match="not initialised"):
            td.TorchDistBackend()


def test_mpi_is_optional(monkeypatch):
    """Without mpi4py the package imports and MPIBackend fails with a clear ImportError."""
    import importlib

    import torchtree.distributed.mpi_backend as mpi_backend

    monkeypatch.setitem(sys.modules, "mpi4py", None)  # makes `import mpi4py` raise ImportError
    monkeypatch.delitem(sys.modules, "mpi4py.MPI", raising=False)
    importlib.reload(td)  # the package's import must not touch mpi4py
    importlib.reload(mpi_backend)  # nor the backend module's
    assert td.get_backend("local").world_size == 1
    with pytest.raises(ImportError, match="mpi4py"):
        td.MPIBackend()


def test_as_one_buffer_is_zero_copy_for_consecutive_views():
    buf = torch.arange(20, dtype=torch.int64).reshape(10, 2)
    pieces = list(buf.split([3, 0, 7]))
    flat, sizes, _ = as_one_buffer(pieces)
    assert sizes == [3, 0, 7] and flat.data_ptr() == buf.data_ptr() and torch.equal(flat, buf)
    flat2, _, _ = as_one_buffer([buf[5:], buf[:5]])  # out of order: must copy
    assert torch.equal(flat2, torch.cat([buf[5:], buf[:5]]))
    with pytest.raises(ValueError):
        as_one_buffer([buf, buf.double()])


# ----------------------------------------------------------------------------- blocks
def test_block_checks_and_padding():
    block = dc.make_block(6, capacity=3)
    assert td.block_rows(block) == 6 and td.block_capacity(block, dc.NODE_KEYS) == 3
    for bad in ({}, {"a": torch.zeros(())}, {"a": torch.zeros(3), "b": torch.zeros(4)}, {"a": [1, 2]}):
        with pytest.raises(ValueError):
            td.block_rows(bad)
    padded = td.pad_block(block, 5, dc.NODE_KEYS, {"feature": -1, "threshold": 0.5, "stats": 0.0})
    assert padded["feature"].shape == (6, 5) and padded["stats"].shape == (6, 5, 2)
    assert (padded["feature"][:, 3:] == -1).all() and (padded["threshold"][:, 3:] == 0.5).all()
    assert torch.equal(padded["feature"][:, :3], block["feature"])
    assert padded["n_nodes"] is block["n_nodes"]
    with pytest.raises(ValueError, match="down"):
        td.pad_block(block, 2, dc.NODE_KEYS)
    with pytest.raises(ValueError, match="disagree"):
        td.block_capacity({**block, "feature": torch.zeros(6, 4)}, dc.NODE_KEYS)


@pytest.mark.parametrize("rows", [0, 1, 7])
def test_layout_pack_unpack_roundtrip(rows):
    g = torch.Generator().manual_seed(rows)
    block = {
        "b": torch.rand(rows, 3, generator=g) > 0.5,
        "i8": torch.randint(-100, 100, (rows,), generator=g, dtype=torch.int8),
        "h": torch.randn(rows, 5, generator=g).half(),
        "bf": torch.randn(rows, 1, 3, generator=g).bfloat16(),
        "i64": torch.randint(-(2**62), 2**62, (rows, 2), generator=g),
        "f64": torch.randn(rows, 2, 2, generator=g, dtype=torch.float64),
        "empty": torch.zeros(rows, 0),
    }
    layout = td.BlockLayout(block)
    wire = layout.pack(block, extra_words=2)
    assert wire.dtype == torch.int64 and wire.shape == (rows, layout.words + 2)
    assert same_block(layout.unpack(wire), block)
    if rows:
        idx = torch.tensor([rows - 1, 0, rows - 1])
        assert same_block(layout.unpack(wire, index=idx), td.take_rows(block, idx))
        assert same_block(layout.unpack(layout.pack(block, index=idx)), td.take_rows(block, idx))
    assert layout.signature() != td.BlockLayout({**block, "h": block["h"].float()}).signature()


def test_harmonize_capacity_on_threads():
    def fn(b):
        block = dc.make_block(4, capacity=2 + 3 * b.rank, seed=b.rank)
        padded, cap = td.harmonize_capacity(block, b, node_keys=dc.NODE_KEYS, fill=-1)
        via_callable, cap2 = td.harmonize_capacity(
            block, b, capacity=2 + 3 * b.rank, pad=lambda d, c: td.pad_block(d, c, dc.NODE_KEYS, 7))
        return cap, cap2, padded["feature"].shape, via_callable["stats"].shape, padded["feature"]

    for cap, cap2, shape, shape2, feature in run_threads(3, fn):
        assert cap == cap2 == 8 and shape == (4, 8) and shape2 == (4, 8, 2)
    assert (run_threads(3, fn)[0][4][:, 2:] == -1).all()


def test_hardtrees_blocks_roundtrip_through_distributed_redistribution():
    """The contract with torchtree.HardTrees: as_dict -> harmonise capacity -> redistribute -> from_dict."""
    trees_mod = pytest.importorskip("torchtree.model.trees")
    HardTrees = trees_mod.HardTrees
    world, n = 3, 4
    big_n = world * n
    nc = dc.ncopies_case("random", big_n, world, seed=9)
    # Rank r grows its trees a little differently, so capacities differ (4, 8, 16).
    parts = []
    for r in range(world):
        t = HardTrees.roots(n, torch.tensor([1.0, 2.0]), capacity=4 * 2**r)
        t.threshold[:, 0] = torch.arange(n) + 10.0 * r
        t.n_nodes[:] = 1 + r
        parts.append(t)
    cap = max(p.capacity for p in parts)
    reference = HardTrees.cat([p.with_capacity(cap) for p in parts]).take(torch.repeat_interleave(torch.arange(big_n), nc))

    def fn(b):
        mine = parts[b.rank]
        block, c = td.harmonize_capacity(
            mine.as_dict(), b, capacity=mine.capacity,
            pad=lambda d, c: HardTrees.from_dict(d).with_capacity(c).as_dict())
        assert c == cap
        return HardTrees.from_dict(td.redistribute(block, nc[b.rank * n:(b.rank + 1) * n], b, method="rotational"))

    got = HardTrees.cat(run_threads(world, fn))
    assert same_block(got.as_dict(), reference.as_dict())


# ----------------------------------------------------------------------------- local redistribution
@pytest.mark.parametrize("case", dc.CASES)
def test_gather_equals_sequential_and_repeat_interleave(case):
    nc = dc.ncopies_case(case, dc.N_TOTAL, 4, seed=3)
    block = dc.make_block(dc.N_TOTAL, seed=3)
    ref = td.sequential_redistribute(block, nc)
    anc = torch.repeat_interleave(torch.arange(dc.N_TOTAL), nc)
    assert torch.equal(td.ancestors_from_ncopies(nc), anc)
    assert torch.equal(td.ancestors_from_ncopies(nc, 7, 50), anc[7:50])
    assert same_block(ref, td.take_rows(block, anc))
    assert same_block(td.gather_redistribute(block, nc), ref)
    assert same_block(td.redistribute(block, nc), ref)
    assert same_block(td.redistribute(block, nc, method="sequential"), ref)


def test_out_buffers_are_filled_and_checked():
    nc = dc.ncopies_case("random", dc.N_TOTAL, 3, seed=1)
    block = dc.make_block(dc.N_TOTAL, seed=1)
    ref = td.sequential_redistribute(block, nc)
    for method in ("gather", "sequential"):
        out = {k: torch.empty_like(v) for k, v in block.items()}
        got = td.redistribute(block, nc, method=method, out=out)
        assert same_block(got, ref) and all(got[k] is out[k] for k in out)
    for method in ("rotational", "alltoall"):
        n = dc.N_TOTAL // 3

        def fn(b):
            rows = slice(b.rank * n, (b.rank + 1) * n)
            out = {k: torch.full_like(v[rows], 3) for k, v in block.items()}
            ws = td.Workspace()
            for _ in range(2):  # the second call reuses the workspace's buffers
                res = td.redistribute({k: v[rows] for k, v in block.items()}, nc[rows], b, method=method,
                                      out=out, workspace=ws)
            assert all(res[k] is out[k] for k in out) and ws.nbytes > 0
            return res

        outs = run_threads(3, fn)
        assert same_block({k: torch.cat([o[k] for o in outs]) for k in ref}, ref)
    with pytest.raises(ValueError, match="shape"):
        td.redistribute(block, nc, out={k: v[:3].clone() for k, v in block.items()})
    with pytest.raises(ValueError, match="shares memory"):
        td.redistribute(block, nc, out=block)
    with pytest.raises(ValueError, match="keys"):
        td.gather_redistribute(block, nc, out={"feature": block["feature"].clone()})


def test_workspace_buffers_grow_and_alias_by_name():
    ws = td.Workspace()
    a = ws.buffer("x", (4, 3), torch.int64, "cpu")
    b = ws.buffer("x", (2, 3), torch.int64, "cpu")
    assert b.data_ptr() == a.data_ptr() and b.shape == (2, 3)
    c = ws.buffer("x", (10, 3), torch.int64, "cpu")  # grows
    assert c.shape == (10, 3) and ws.nbytes == 10 * 3 * 8
    assert ws.buffer("y", (1,), torch.int64, "cpu").data_ptr() != c.data_ptr()
    ws.clear()
    assert ws.nbytes == 0


def test_local_redistribution_errors():
    block = dc.make_block(4)
    with pytest.raises(ValueError, match="sum"):
        td.redistribute(block, torch.tensor([1, 1, 1, 0]))
    with pytest.raises(ValueError, match="integer"):
        td.redistribute(block, torch.ones(4))
    with pytest.raises(ValueError, match="shape"):
        td.redistribute(block, torch.ones(5, dtype=torch.int64))
    with pytest.raises(ValueError, match="non-negative"):
        td.gather_redistribute(block, torch.tensor([2, -1, 2, 1]))
    with pytest.raises(ValueError, match="method"):
        td.redistribute(block, torch.ones(4, dtype=torch.int64), method="teleport")


# ----------------------------------------------------------------------------- distributed algorithms
@pytest.mark.parametrize("world", [1, 2, 3, 5, 6, 8])
@pytest.mark.parametrize("method", ["rotational", "alltoall"])
def test_distributed_equals_sequential_on_threads(world, method):
    """Random and extreme ncopies, any world size, n = 1..6 particles per rank."""
    g = torch.Generator().manual_seed(100 * world + len(method))
    for trial in range(12):
        n = 1 + trial % 6
        big_n = n * world
        kind = trial % 4
        nc = torch.zeros(big_n, dtype=torch.int64)
        if kind == 0:
            w = torch.rand(big_n, generator=g, dtype=torch.float64) ** 4
            nc.index_add_(0, torch.multinomial(w, big_n, True, generator=g), torch.ones(big_n, dtype=torch.int64))
        elif kind == 1:
            nc[int(torch.randint(big_n, (), generator=g))] = big_n
        elif kind == 2:
            nc[:] = 1
        else:
            nc.index_add_(0, torch.randint(big_n - n, big_n, (big_n,), generator=g), torch.ones(big_n, dtype=torch.int64))
        block = dc.make_block(big_n, capacity=3, seed=trial)
        ref = td.sequential_redistribute(block, nc)
        local = "sequential" if trial == 0 else "gather"
        assert same_block(split_run(world, block, nc, method=method, local=local), ref), (world, n, nc.tolist())


def test_distributed_errors_are_raised_on_every_rank():
    block = dc.make_block(6)

    def run(fn_per_rank, world=3):
        def fn(b):
            try:
                fn_per_rank(b)
                return None
            except ValueError as exc:
                return str(exc)
        return run_threads(world, fn)

    ones = torch.ones(2, dtype=torch.int64)
    part = {k: v[:2] for k, v in block.items()}
    # sum(ncopies) != N
    msgs = run(lambda b: td.redistribute(part, ones * (b.rank == 0) * 2, b, method="alltoall"))
    assert all(m and "sum(ncopies)" in m for m in msgs)
    # a negative count on one rank only
    msgs = run(lambda b: td.redistribute(part, torch.tensor([-1, 3]) if b.rank == 1 else ones, b, method="rotational"))
    assert all(m for m in msgs) and "non-negative" in msgs[1]
    # unequal particle counts
    msgs = run(lambda b: td.redistribute(
        {k: v[: 2 + (b.rank == 2)] for k, v in block.items()},
        torch.ones(2 + (b.rank == 2), dtype=torch.int64), b, method="alltoall"))
    assert all(m and "N/P" in m for m in msgs)
    # different layouts (capacity not harmonised)
    msgs = run(lambda b: td.redistribute(
        dc.make_block(2, capacity=3 + b.rank), ones, b, method="rotational"))
    assert all(m and "harmonize_capacity" in m for m in msgs)
    # single-rank methods on several ranks
    msgs = run(lambda b: td.redistribute(part, ones, b, method="gather"))
    assert all(m and "one rank" in m for m in msgs)


# ----------------------------------------------------------------------------- ncopies
def test_fixed_point_weights():
    x = -torch.rand(10000, generator=torch.Generator().manual_seed(0), dtype=torch.float64) * 40
    q = td.fixed_point_weights(x, 40)
    assert (q.double() / 2**40 - torch.exp(x)).abs().max() <= 2**-40  # within one quantum
    special = td.fixed_point_weights(torch.tensor([0.0, -0.0, -1e-300, -math.inf, -5000.0], dtype=torch.float64), 50)
    assert special.tolist() == [2**50, 2**50, 2**50, 0, 0]
    # a pure function of each element: the same values in any slicing give the same bits
    assert torch.equal(torch.cat([td.fixed_point_weights(x[i : i + 37], 40) for i in range(0, 10000, 37)]), q)


@pytest.mark.parametrize("world", [1, 2, 3, 4, 5])
def test_ncopies_identical_for_any_world_size(world):
    g = torch.Generator().manual_seed(world)
    for trial in range(6):
        n = 1 + 13 * trial
        lw = torch.randn(n * world, generator=g, dtype=torch.float64) * (10.0 ** (trial % 3))
        lw[torch.rand(n * world, generator=g) < 0.25] = -math.inf
        lw[int(torch.randint(n * world, (), generator=g))] = 3.0  # never all zero
        for method, kw in (("systematic", {"u": 0.77}), ("multinomial", {})):
            ref = td.ncopies_from_log_weights(lw, method=method, generator=torch.Generator().manual_seed(trial), **kw)

            def fn(b):
                rows = slice(b.rank * n, (b.rank + 1) * n)
                gen = torch.Generator().manual_seed(trial)
                return td.ncopies_from_log_weights(lw[rows], b, method=method, generator=gen, **kw)

            got = torch.cat(run_threads(world, fn))
            assert torch.equal(got, ref), (world, trial, method)
            assert int(ref.sum()) == n * world and bool((ref >= 0).all())
            assert bool((ref[torch.isinf(lw)] == 0).all())


def test_systematic_counts_are_floor_or_ceil_of_expected():
    """Systematic resampling gives every particle floor(N w) or ceil(N w) copies."""
    g = torch.Generator().manual_seed(5)
    for trial in range(20):
        big_n = 200
        lw = torch.randn(big_n, generator=g, dtype=torch.float64) * 3
        u = float(torch.rand((), generator=g))
        nc = td.ncopies_from_log_weights(lw, u=u)
        expected = big_n * torch.softmax(lw, 0)
        assert bool(((nc - expected).abs() < 1 + 1e-9).all())


def test_multinomial_counts_have_the_right_mean():
    """Mean of 400 multinomial draws vs N w: |z| < 5 per particle (false-failure rate ~1e-5)."""
    big_n, reps = 40, 400
    lw = torch.linspace(-3, 1, big_n, dtype=torch.float64)
    w = torch.softmax(lw, 0)
    total = torch.zeros(big_n, dtype=torch.float64)
    for r in range(reps):
        total += td.ncopies_from_log_weights(lw, method="multinomial", generator=torch.Generator().manual_seed(r)).double()
    z = (total - reps * big_n * w) / torch.sqrt(reps * big_n * w * (1 - w))
    assert z.abs().max() < 5, z


def test_ncopies_errors_and_helpers():
    with pytest.raises(ValueError, match="NaN"):
        td.ncopies_from_log_weights(torch.tensor([0.0, math.nan]))
    with pytest.raises(ValueError, match="zero"):
        td.ncopies_from_log_weights(torch.full((3,), -math.inf))
    with pytest.raises(ValueError, match=r"\[0, 1\)"):
        td.ncopies_from_log_weights(torch.zeros(3), u=1.0)
    with pytest.raises(ValueError, match="method"):
        td.ncopies_from_log_weights(torch.zeros(3), method="residual")
    with pytest.raises(ValueError, match="1-D"):
        td.ncopies_from_log_weights(torch.zeros(2, 2))
    lw = torch.tensor([0.0, math.log(3.0), -math.inf], dtype=torch.float64)
    assert td.ncopies_from_log_weights(lw, u=0.5).tolist() == [1, 2, 0]
    torch.testing.assert_close(td.global_log_sum_exp(lw), torch.tensor(math.log(4.0), dtype=torch.float64))
    torch.testing.assert_close(td.global_ess(lw), torch.tensor(16 / 10, dtype=torch.float64))
    x = torch.arange(10)
    assert torch.equal(td.prefix_sum(x), torch.cumsum(x, 0))
    # +inf particles share the mass; u just below 1 must not lose a copy to rounding
    inf = torch.tensor([0.0, math.inf, -math.inf, math.inf], dtype=torch.float64)
    assert td.ncopies_from_log_weights(inf, u=0.25).tolist() == [0, 2, 0, 2]
    assert float(td.global_ess(inf)) == 2.0
    for big_n in (1, 3, 1000):
        nc = td.ncopies_from_log_weights(torch.zeros(big_n, dtype=torch.float64), u=1.0 - 2.0**-53)
        assert nc.tolist() == [1] * big_n

    def fn(b):  # NaN on one rank only: every rank raises
        try:
            td.ncopies_from_log_weights(torch.tensor([math.nan if b.rank == 2 else 0.0]), b)
        except ValueError as exc:
            return str(exc)

    assert all(m for m in run_threads(3, fn))
