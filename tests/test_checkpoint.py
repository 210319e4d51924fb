"""Tests of torchtree.io.checkpoint: atomic writes survive crashes; multi-rank manifests."""
from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
import threading
from pathlib import Path

import pytest
import torch

import torchtree.io.checkpoint as ck
from torchtree.io.checkpoint import (
    CheckpointError,
    Checkpointer,
    atomic_save,
    load_checkpoint,
    load_rank_checkpoint,
    manifest_path,
    rank_path,
    read_manifest,
    save_rank_checkpoint,
)

ROOT = Path(__file__).resolve().parents[1]


def _state(step: int):
    g = torch.Generator().manual_seed(step)
    return {"step": step, "logw": torch.randn(8, generator=g, dtype=torch.float64), "trees": {"feature": torch.arange(6).view(2, 3)}, "name": "smc"}


def _same(a, b):
    assert a["step"] == b["step"] and a["name"] == b["name"]
    assert torch.equal(a["logw"], b["logw"]) and torch.equal(a["trees"]["feature"], b["trees"]["feature"])


def _stray(tmp_path):
    return [p for p in os.listdir(tmp_path) if p.endswith(".tmp")]


def test_roundtrip(tmp_path):
    path = tmp_path / "run.ckpt"
    atomic_save(_state(1), path)
    _same(load_checkpoint(path), _state(1))
    atomic_save(_state(2), str(path))  # overwrite
    _same(load_checkpoint(str(path)), _state(2))
    assert _stray(tmp_path) == []


def test_written_files_get_the_usual_mode_and_keep_a_replaced_files_mode(tmp_path):
    """A new file gets 0o666 less the umask, as open() gives (the temporary file's 0600 leaked through);
    a file replaced keeps its mode."""
    from torchtree.io.checkpoint import atomic_write_text

    old = os.umask(0o022)
    try:
        atomic_save(_state(1), tmp_path / "new.ckpt")
        assert (tmp_path / "new.ckpt").stat().st_mode & 0o777 == 0o644
        os.umask(0o027)
        atomic_write_text("x", str(tmp_path / "new.json"))
        assert (tmp_path / "new.json").stat().st_mode & 0o777 == 0o640
        os.chmod(tmp_path / "new.ckpt", 0o664)
        atomic_save(_state(2), tmp_path / "new.ckpt")
        assert (tmp_path / "new.ckpt").stat().st_mode & 0o777 == 0o664
    finally:
        os.umask(old)


def test_crash_between_write_and_rename_keeps_previous(tmp_path, monkeypatch):
    path = tmp_path / "run.ckpt"
    atomic_save(_state(1), path)

    def crash(src, dst):
        raise KeyboardInterrupt("simulated crash before the rename")

    monkeypatch.setattr(ck.os, "replace", crash)
    with pytest.raises(KeyboardInterrupt):
        atomic_save(_state(2), path)
    monkeypatch.undo()
    _same(load_checkpoint(path), _state(1))
    assert _stray(tmp_path) == []  # the temporary file was cleaned up


def test_crash_during_write_keeps_previous(tmp_path, monkeypatch):
    path = tmp_path / "run.ckpt"
    atomic_save(_state(1), path)
    real_save = torch.save

    def half_write(obj, fh):
        fh.write(b"PK\x03\x04 half a zip file")
        raise OSError(28, "No space left on device")

    monkeypatch.setattr(ck.torch, "save", half_write)
    with pytest.raises(OSError, match="No space left"):
        atomic_save(_state(2), path)
    monkeypatch.setattr(ck.torch, "save", real_save)
    _same(load_checkpoint(path), _state(1))
    assert _stray(tmp_path) == []


def test_real_process_crash_before_rename(tmp_path):
    """A process killed (os._exit) between the temporary write and the rename."""
    path = tmp_path / "run.ckpt"
    atomic_save(_state(1), path)
    child = textwrap.dedent(
        f"""
        import os, sys, torch
        sys.path.insert(0, {str(ROOT)!r})
        import torchtree.io.checkpoint as ck
        ck.os.replace = lambda src, dst: os._exit(17)   # die right before the rename
        ck.atomic_save({{"step": 2}}, {str(path)!r})
        """
    )
    r = subprocess.run([sys.executable, "-c", child], capture_output=True, text=True, timeout=300)
    assert r.returncode == 17, r.stderr
    assert len(_stray(tmp_path)) == 1  # the dead process left its temporary file ...
    _same(load_checkpoint(path), _state(1))  # ... and the checkpoint is the previous one
    atomic_save(_state(3), path)  # the next save is unaffected by the stray file
    _same(load_checkpoint(path), _state(3))


def test_load_errors(tmp_path):
    with pytest.raises(FileNotFoundError):
        load_checkpoint(tmp_path / "none.ckpt")
    junk = tmp_path / "junk.ckpt"
    junk.write_bytes(b"not a checkpoint")
    with pytest.raises(CheckpointError, match="not a readable checkpoint"):
        load_checkpoint(junk)
    with pytest.raises(FileNotFoundError, match="does not exist"):
        atomic_save({}, tmp_path / "no_dir" / "x.ckpt")


class _Opaque:
    pass


def test_weights_only_refuses_arbitrary_objects(tmp_path):
    path = tmp_path / "obj.ckpt"
    atomic_save({"x": _Opaque()}, path)
    with pytest.raises(CheckpointError):
        load_checkpoint(path)
    assert isinstance(CheckpointError("x"), ValueError)  # the CLI reports it as a user error


# ----------------------------------------------------------------------------- multi-rank
def _save_ranks(path, world, step):
    # Without a backend there is no barrier: write rank 0 (which writes the manifest) last.
    for r in list(range(1, world)) + [0]:
        save_rank_checkpoint(_state(10 * step + r), path, rank=r, world_size=world, step=step, extra={"sampler": "TopDownSMC"})


def test_rank_files_and_manifest(tmp_path):
    path = str(tmp_path / "run.ckpt")
    _save_ranks(path, 3, step=4)
    m = read_manifest(path)
    assert m["world_size"] == 3 and m["step"] == 4 and m["sampler"] == "TopDownSMC"
    assert m["files"] == ["run.ckpt.rank0", "run.ckpt.rank1", "run.ckpt.rank2"]
    assert json.loads(Path(manifest_path(path)).read_text()) == m
    for r in range(3):
        assert os.path.exists(rank_path(path, r))
        _same(load_rank_checkpoint(path, rank=r, world_size=3), _state(40 + r))


def test_resume_on_other_world_size_is_a_clear_error(tmp_path):
    path = str(tmp_path / "run.ckpt")
    _save_ranks(path, 3, step=1)
    with pytest.raises(CheckpointError, match=r"written by 3 rank\(s\) but this run has 2"):
        load_rank_checkpoint(path, rank=0, world_size=2)
    with pytest.raises(CheckpointError, match="written by 3 rank"):
        Checkpointer(path).load()  # a single process


class _Killed(BaseException):
    pass


class _KilledAt:
    """One rank's backend whose ``k``-th barrier never returns: the process was killed there (each rank's save of
    :func:`save_rank_checkpoint` passes barrier 1 after writing ``.new``, 2 after moving it into place, 3 after
    rank 0 wrote the manifest)."""

    def __init__(self, rank, world_size, k):
        self.rank, self.world_size, self.k, self.n = rank, world_size, k, 0

    def barrier(self):
        self.n += 1
        if self.n == self.k:
            raise _Killed


@pytest.mark.parametrize("kills,resumes", [
    ((1, 1), 1),  # both wrote .new: the files of step 1 are in place
    ((2, 1), 1),  # rank 0 moved step 2 in (step 1 kept as .prev), rank 1 did not
    ((2, 2), 1),  # both moved in, the manifest not written: step 1 from .prev
    ((3, 3), 2),  # the manifest names step 2; rank 1 died before dropping its .prev
    ((None, None), 2),  # a complete save
])
def test_a_kill_at_any_point_of_a_multi_rank_save_resumes_a_complete_step(tmp_path, kills, resumes):
    """A kill anywhere in the save of step 2 leaves every rank the file of the manifest's step: the ranks resume
    step 1 or step 2 alike, never a mixture and never a refusal (a QA pass lost every step when rank files were
    replaced before the manifest: 2 kills in 14)."""
    path = str(tmp_path / "run.ckpt")
    _save_ranks(path, 2, step=1)
    for r, k in enumerate(kills):  # rank 0's save, then rank 1's, each stopped at its barrier k
        try:
            save_rank_checkpoint(_state(20 + r), path, backend=_KilledAt(r, 2, k or 0), step=2)
        except _Killed:
            pass
    assert read_manifest(path)["step"] == resumes
    for r in range(2):
        _same(load_rank_checkpoint(path, rank=r, world_size=2), _state(10 * resumes + r))
    if kills == (None, None):
        assert not [p for p in os.listdir(tmp_path) if p.endswith((".prev", ".new"))]


class _StoppedAt(_KilledAt):
    """A rank whose ``k``-th barrier raises ``KeyboardInterrupt`` (a handled Ctrl-C or SIGTERM, or a peer that left
    there, which raises ``CollectiveError``): the save unwinds instead of dying."""

    def barrier(self):
        self.n += 1
        if self.n == self.k:
            raise KeyboardInterrupt


@pytest.mark.parametrize("stops,resumes,left", [
    ((1, 1), 1, set()),  # both wrote .new, which nothing reads
    ((2, 1), 1, {"run.ckpt.rank0.prev"}),  # the manifest still names step 1, which rank 0 holds as .prev only
    ((2, 2), 1, {"run.ckpt.rank0.prev", "run.ckpt.rank1.prev"}),  # likewise for both ranks
    ((3, 3), 2, set()),  # the manifest names step 2: the .prev files are stale
])
def test_a_stopped_multi_rank_save_leaves_only_the_files_a_resume_reads(tmp_path, stops, resumes, left):
    """A handled interrupt during a save left ``.new`` files (the size of the state) and stale ``.prev`` files
    next to the checkpoint until a resume removed them."""
    path = str(tmp_path / "run.ckpt")
    _save_ranks(path, 2, step=1)
    for r, k in enumerate(stops):
        with pytest.raises(KeyboardInterrupt):
            save_rank_checkpoint(_state(20 + r), path, backend=_StoppedAt(r, 2, k), step=2)
    assert read_manifest(path)["step"] == resumes
    for r in range(2):
        _same(load_rank_checkpoint(path, rank=r, world_size=2), _state(10 * resumes + r))
    assert {p for p in os.listdir(tmp_path) if p.endswith((".prev", ".new"))} == left


def test_a_kill_between_a_ranks_two_renames_resumes_the_previous_step(tmp_path):
    """Rank 0's step-1 file moved to .prev, its step-2 file not yet moved in (no ``path.rank0`` at all)."""
    path = str(tmp_path / "run.ckpt")
    _save_ranks(path, 2, step=1)
    for r in range(2):
        try:
            save_rank_checkpoint(_state(20 + r), path, backend=_KilledAt(r, 2, 1), step=2)
        except _Killed:
            pass
    os.replace(rank_path(path, 0), rank_path(path, 0) + ".prev")
    assert not os.path.exists(rank_path(path, 0))
    for r in range(2):
        _same(load_rank_checkpoint(path, rank=r, world_size=2), _state(10 + r))


def test_rank_files_without_their_manifest_are_not_overwritten(tmp_path):
    """A distributed run whose manifest is gone refuses to start afresh over the rank files (it overwrote them)."""
    path = str(tmp_path / "run.ckpt")
    _save_ranks(path, 2, step=1)
    os.remove(manifest_path(path))
    c = Checkpointer(path, backend=_KilledAt(1, 2, 0))
    with pytest.raises(CheckpointError, match="exists but .*manifest.json does not"):
        c._load()


def test_incomplete_multi_rank_checkpoint_detected(tmp_path):
    """A rank file of another step than the manifest's, with no file of the manifest's step beside it, is refused."""
    path = str(tmp_path / "run.ckpt")
    _save_ranks(path, 2, step=1)
    save_rank_checkpoint(_state(21), path, rank=1, world_size=2, step=2)  # alone, no barrier: its .prev is gone
    _same(load_rank_checkpoint(path, rank=0, world_size=2), _state(10))
    with pytest.raises(CheckpointError, match="holds step 2 but the manifest says step 1"):
        load_rank_checkpoint(path, rank=1, world_size=2)


class _ThreadBackend:
    """Ranks as threads sharing a barrier (enough for the checkpoint protocol: barrier,
    and all_gather for the ranks' agreement on resuming)."""

    def __init__(self, rank, world_size, barrier):
        self.rank, self.world_size, self._barrier = rank, world_size, barrier
        if not hasattr(barrier, "slots"):
            barrier.slots = {}  # the ranks' all_gather deposits, shared through the barrier

    def barrier(self):
        self._barrier.wait(timeout=60)

    def all_gather(self, t):
        self.barrier()  # the previous gather has been read by every rank
        self._barrier.slots[self.rank] = t.clone()
        self.barrier()
        # a lone thread standing in for one rank of several: the missing ranks mirror it
        return torch.cat([self._barrier.slots.get(r, t) for r in range(self.world_size)])


def test_concurrent_ranks_with_barrier(tmp_path):
    path = str(tmp_path / "run.ckpt")
    world = 4
    barrier = threading.Barrier(world)
    errors = []

    def rank_main(r):
        try:
            c = Checkpointer(path, every=2, backend=_ThreadBackend(r, world, barrier))
            assert c.load() is None
            for step in range(5):
                c.maybe_save(step, lambda: {"rank": r, "step": step})
            assert c.load() == {"rank": r, "step": 3}
        except BaseException as exc:  # pragma: no cover - reported below
            errors.append(exc)
            barrier.abort()

    threads = [threading.Thread(target=rank_main, args=(r,)) for r in range(world)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(120)
    assert not errors, errors
    assert read_manifest(path)["step"] == 3
    # A single-process resume of this 4-rank checkpoint is refused.
    with pytest.raises(CheckpointError, match="this run has 1"):
        Checkpointer(path).load()


def test_checkpointer_single_process(tmp_path):
    path = str(tmp_path / "run.ckpt")
    c = Checkpointer(path, every=3)
    assert c.enabled and not c.exists() and c.load() is None
    saved = [c.maybe_save(s, lambda s=s: {"step": s}) for s in range(7)]
    assert saved == [False, False, True, False, False, True, False]
    assert c.load() == {"step": 5}
    off = Checkpointer(None)
    assert not off.enabled and off.maybe_save(0, lambda: 1 / 0) is False and off.load() is None
    with pytest.raises(ValueError):
        Checkpointer(path, every=0)
    # A single-file checkpoint resumed by a 2-rank run is refused.
    two = Checkpointer(path, backend=_ThreadBackend(0, 2, threading.Barrier(1)))
    with pytest.raises(CheckpointError, match=r"written by 1 rank\(s\) but this run has 2"):
        two.load()


def test_fingerprint_distinguishes_runs():
    X = torch.arange(12.0).reshape(4, 3)
    a = ck.fingerprint("TopDownSMC", {"n_particles": 10, "seed": 1}, X)
    assert a == ck.fingerprint("TopDownSMC", {"seed": 1, "n_particles": 10}, X.clone())  # key order irrelevant
    assert a != ck.fingerprint("TopDownSMC", {"n_particles": 10, "seed": 2}, X)
    X2 = X.clone()
    X2[3, 2] += 1e-6
    assert a != ck.fingerprint("TopDownSMC", {"n_particles": 10, "seed": 1}, X2)
    assert a != ck.fingerprint("TopDownSMC", {"n_particles": 10, "seed": 1}, X.double())
    assert len(a) == 16


def test_checkpointer_refuses_another_runs_checkpoint(tmp_path):
    path = str(tmp_path / "run.ckpt")
    Checkpointer(path, fingerprint="aaaa").maybe_save(0, lambda: {"step": 0}, last=True)
    assert Checkpointer(path, fingerprint="aaaa").load() == {"step": 0}
    with pytest.raises(CheckpointError, match="different run"):
        Checkpointer(path, fingerprint="bbbb").load()
    # a plain torch file at the path is not mistaken for a sampler checkpoint
    torch.save({"x": 1}, path)
    with pytest.raises(CheckpointError, match="not a torchtree sampler checkpoint"):
        Checkpointer(path).load()


class _OneOfTwoRanks:
    """Rank ``rank`` of a two-rank run whose other rank reported ``other`` to all_gather
    (enough of a backend for Checkpointer.load)."""

    def __init__(self, rank, other):
        self.rank, self.world_size, self.other = rank, 2, other

    def all_gather(self, t):
        vals = [self.other]
        vals.insert(self.rank, int(t[0]))
        return torch.tensor(vals)


def _save_two_ranks(path, step):
    for r in (1, 0):
        save_rank_checkpoint({"fingerprint": None, "sampler_state": _state(10 * step + r)}, path, rank=r,
                             world_size=2, step=step)


def test_ranks_that_would_not_resume_alike_all_raise(tmp_path):
    """Per-rank paths (or node-local storage) let rank 0 resume while rank 1 started afresh:
    a wrong posterior (top-down SMC) or a hang (SMC with moves), without a word."""
    shared = str(tmp_path / "run.ckpt")
    _save_two_ranks(shared, step=3)
    # both ranks see the same checkpoint: both resume it
    _same(Checkpointer(shared, backend=_OneOfTwoRanks(0, 3)).load(), _state(30))
    _same(Checkpointer(shared, backend=_OneOfTwoRanks(1, 3)).load(), _state(31))
    # rank 0 finds step 3, rank 1 (its own path) finds nothing: every rank raises
    alone = str(tmp_path / "rank1-only.ckpt")
    msg = r"the ranks disagree on resuming \(rank 0 resumes after step 3, rank 1 finds no checkpoint\)"
    with pytest.raises(CheckpointError, match=msg):
        Checkpointer(shared, backend=_OneOfTwoRanks(0, -1)).load()
    with pytest.raises(CheckpointError, match=msg):
        Checkpointer(alone, backend=_OneOfTwoRanks(1, 3)).load()
    # neither has one: both start afresh
    assert Checkpointer(alone, backend=_OneOfTwoRanks(0, -1)).load() is None
    with pytest.raises(ValueError, match="checkpoint path is empty"):
        Checkpointer("")
