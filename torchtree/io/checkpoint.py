"""Checkpoints that survive a crash at any moment.

* :func:`atomic_save` writes a temporary file in the target's directory, flushes
  and ``fsync``s it, then ``os.replace``s it over the target (atomic on POSIX and
  Windows): a reader sees the previous checkpoint or the new one, never half of one.
  A crash before the rename leaves the previous checkpoint intact (and possibly a
  stray ``.<name>.*.tmp`` file, which nothing reads and the next save of the same
  process does not depend on).
* :func:`load_checkpoint` reads with ``torch.load(weights_only=True)``: plain
  tensors, numbers, strings, lists and dicts only; no pickled code runs.
* Multi-rank runs: every rank writes ``path.rank{r}.new``; after a barrier each rank
  moves its previous ``path.rank{r}`` (the step the manifest names) to ``path.rank{r}.prev``
  and the new file into its place; after another barrier rank 0 writes
  ``path.manifest.json`` (world size, step, files), and then each rank drops its
  ``.prev``. Each rank file records its rank, world size and step. A kill at any moment
  leaves every rank a file of the manifest's step (``path.rank{r}`` or its ``.prev``), so
  the run resumes from the last complete checkpoint; loading never mixes steps, and
  resuming with a different world size raises a clear error. A save stopped part way by
  an exception (an interrupt, a peer that left) removes its ``.new`` files, and the
  ``.prev`` files unless the manifest still names their step (a resume then reads them).
* :class:`Checkpointer` bundles this for samplers (``checkpoint=path,
  checkpoint_every=k``), and skips saves that would cost more than a small share
  of the run's time (see its ``min_seconds``).
* Content checksum: checkpoints and saved posteriors carry a sha256 of their
  tensors and fields (:func:`seal`); loading recomputes it (:func:`verify_checksum`)
  and refuses a file whose content was damaged or edited. The checksum detects
  corruption and casual edits; it is not a signature (whoever edits a file can
  recompute it). Files written before checksums existed have none and still load
  (their tree structure is still validated by the posterior loaders).
* A Ctrl-C (SIGINT) that arrives while a file is being written is held back until
  the file is complete and renamed into place, then raised as ``KeyboardInterrupt``:
  an interrupted write inside ``torch.save`` surfaced as a ``RuntimeError`` from
  torch's zip writer instead.

Examples
--------
>>> atomic_save({"step": 3, "logw": torch.zeros(4)}, "run.ckpt")      # doctest: +SKIP
>>> load_checkpoint("run.ckpt")["step"]                                # doctest: +SKIP
3
"""
from __future__ import annotations

import json
import os
import stat
import tempfile
import time
from typing import Any, Callable, Dict, Optional, Sequence

import torch

from torchtree.io.fingerprint import differing_parts, fingerprint, fingerprint_parts
from torchtree.io.integrity import (CHECKSUM_KEY, CheckpointError, content_checksum, feed_hash, sigint_deferred,  # noqa: F401
                                    read_payload, seal, verify_checksum)

__all__ = [
    "atomic_write",
    "atomic_save",
    "atomic_write_text",
    "load_checkpoint",
    "rank_path",
    "manifest_path",
    "save_rank_checkpoint",
    "load_rank_checkpoint",
    "read_manifest",
    "Checkpointer",
    "CheckpointError",
    "fingerprint",
    "fingerprint_parts",
    "differing_parts",
    "content_checksum",
    "seal",
    "verify_checksum",
    "read_payload",
]

FORMAT = "torchtree.io.checkpoint/1"
MANIFEST_FORMAT = "torchtree.io.checkpoint-manifest/1"


def _fsync_dir(directory: str) -> None:
    """Make the rename itself durable (best effort; not possible on every platform)."""
    try:
        fd = os.open(directory, os.O_RDONLY)
    except OSError:
        return
    try:
        os.fsync(fd)
    except OSError:
        pass
    finally:
        os.close(fd)


def _umask() -> int:
    """The process's umask (read from /proc where it is shown, else set and restored)."""
    try:
        with open("/proc/self/status") as fh:
            for line in fh:
                if line.startswith("Umask:"):
                    return int(line.split()[1], 8)
    except (OSError, ValueError, IndexError):
        pass
    mask = os.umask(0o022)
    os.umask(mask)
    return mask


def _file_mode(path: str) -> int:
    """The permission bits a file written at ``path`` gets: those of the file it replaces, else those
    ``open`` gives a new file (0o666 less the umask). A temporary file alone would be 0600."""
    try:
        return stat.S_IMODE(os.stat(path).st_mode)
    except OSError:
        return 0o666 & ~_umask()


def atomic_write(path: str | os.PathLike[str], write: Callable[[Any], None], mode: str = "w", **open_args: Any) -> None:
    """Write ``path`` atomically: ``write(fh)`` into a new temporary file of an unpredictable name in the same
    directory (``mkstemp``: created exclusively, never through a link), fsync, then rename over ``path``. The
    file keeps the mode of the file it replaces (else 0o666 less the umask); a failed write leaves nothing.
    ``mode`` and ``open_args`` are given to ``os.fdopen``."""
    path = os.fspath(path)
    directory = os.path.dirname(os.path.abspath(path))
    if not os.path.isdir(directory):
        raise FileNotFoundError(f"{path}: directory {directory} does not exist")
    if os.path.isdir(path):  # say so about the user's path, not the temporary file's rename
        raise IsADirectoryError(f"{path}: is a directory; give the path of the file to write")
    with sigint_deferred():
        fd, tmp = tempfile.mkstemp(prefix=f".{os.path.basename(path)}.", suffix=".tmp", dir=directory)
        try:
            try:
                os.fchmod(fd, _file_mode(path))
            except OSError:  # a file system without modes: keep what it gave
                pass
            with os.fdopen(fd, mode, **open_args) as fh:
                write(fh)
                fh.flush()
                os.fsync(fh.fileno())
            os.replace(tmp, path)
        except BaseException:
            try:
                os.unlink(tmp)
            except OSError:
                pass
            raise
        _fsync_dir(directory)


def atomic_save(obj: Any, path: str | os.PathLike[str]) -> None:
    """``torch.save(obj)`` to ``path`` atomically.

    Parameters
    ----------
    obj : object
        Keep to tensors, numbers, strings, lists, tuples and dicts so that
        :func:`load_checkpoint` (``weights_only=True``) can read it back.
    path : str or os.PathLike
        Its directory must exist.
    """
    atomic_write(path, lambda fh: torch.save(obj, fh), "wb")


def atomic_write_text(text: str, path: str) -> None:
    """Write ``text`` to ``path`` atomically (temporary file + fsync + rename)."""
    atomic_write(path, lambda fh: fh.write(text), "w")


def load_checkpoint(path: str, map_location: Any = "cpu") -> Any:
    """Read a checkpoint written by :func:`atomic_save` (``torch.load(weights_only=True)``).

    A checkpoint saved with a content checksum (:func:`seal`) is verified.

    Raises
    ------
    FileNotFoundError
        No file at ``path``.
    CheckpointError
        The file is not a readable checkpoint (empty, truncated, not written by
        torch.save, or holding objects other than tensors and plain containers),
        or its content does not match its checksum (damaged or edited).
    """
    return read_payload(path, "checkpoint", map_location)


# ----------------------------------------------------------------------------- multi-rank
def rank_path(path: str, rank: int) -> str:
    """``path.rank{rank}``: the file of one rank."""
    return f"{os.fspath(path)}.rank{int(rank)}"


def manifest_path(path: str) -> str:
    """``path.manifest.json``."""
    return f"{os.fspath(path)}.manifest.json"


def _barrier(backend) -> None:
    if backend is None or getattr(backend, "world_size", 1) <= 1:
        return
    barrier = getattr(backend, "barrier", None)
    if callable(barrier):
        barrier()
    else:  # any collective synchronises
        backend.all_reduce(torch.zeros(1))


def save_rank_checkpoint(state: Any, path: str, *, rank: int = 0, world_size: int = 1, step: Optional[int] = None,
                         backend=None, extra: Optional[Dict[str, Any]] = None) -> None:
    """Write this rank's part of a multi-rank checkpoint; rank 0 then writes the manifest.

    Every rank must call it (it synchronises through ``backend``).

    Parameters
    ----------
    state : object
        This rank's state (tensors and plain containers).
    path : str
        Base path: files are ``path.rank{r}`` and ``path.manifest.json``.
    rank, world_size : int
        Taken from ``backend`` when it is given.
    step : int, optional
        The sampler step the state belongs to (checked on load).
    backend : torchtree.distributed.Backend, optional
        Used for the barrier between the rank files and the manifest.
    extra : dict, optional
        JSON-serialisable fields added to the manifest (sampler name, seed, ...).
    """
    if backend is not None:
        rank, world_size = int(backend.rank), int(backend.world_size)
    rank, world_size = int(rank), int(world_size)
    if not 0 <= rank < world_size:
        raise ValueError(f"rank {rank} is not in [0, {world_size})")
    mine = rank_path(path, rank)
    placed = synced = False  # this rank's new file is in place; every rank's is
    try:
        atomic_save(seal({"format": FORMAT, "rank": rank, "world_size": world_size, "step": step, "state": state}),
                    mine + ".new")
        _barrier(backend)
        # the manifest's step stays on disk as .prev until the new manifest names the new files
        if os.path.exists(mine):
            os.replace(mine, mine + ".prev")
        os.replace(mine + ".new", mine)
        placed = True
        _barrier(backend)
        synced = True
        if rank == 0:
            manifest = {
                "format": MANIFEST_FORMAT,
                "world_size": world_size,
                "step": step,
                "files": [os.path.basename(rank_path(path, r)) for r in range(world_size)],
                "time": time.time(),
            }
            if extra:
                manifest.update(extra)
            atomic_write_text(json.dumps(manifest, indent=1) + "\n", manifest_path(path))
        _barrier(backend)
    except BaseException:  # an interrupt, or a peer that left: keep only the files a resume reads
        _tidy_stopped_save(path, rank, world_size, step, placed, synced)
        raise
    if os.path.exists(mine + ".prev"):
        os.remove(mine + ".prev")


def _tidy_stopped_save(path: str, rank: int, world_size: int, step: Optional[int], placed: bool, synced: bool) -> None:
    """After a save stopped part way: drop this rank's ``.new`` (never read), and the ``.prev`` files once the
    manifest on disk names ``step`` (the rank files in place hold it): this rank's own when its new file is in
    place, every rank's on rank 0 when every rank's is. A ``.prev`` the manifest still needs stays."""
    mine = rank_path(path, rank)
    stale = [mine + ".new"]
    try:
        current = placed and read_manifest(path).get("step") == step
    except (OSError, ValueError, CheckpointError):
        current = False
    if current:
        ranks = range(world_size) if rank == 0 and synced else [rank]
        stale += [rank_path(path, r) + ".prev" for r in ranks]
    for name in stale:
        try:
            os.remove(name)
        except OSError:
            pass


def read_manifest(path: str) -> Dict[str, Any]:
    """The manifest of a multi-rank checkpoint (``FileNotFoundError`` if there is none)."""
    mp = manifest_path(path)
    if not os.path.exists(mp):
        raise FileNotFoundError(f"{mp}: no such checkpoint manifest")
    try:
        with open(mp) as fh:
            manifest = json.load(fh)
    except (OSError, json.JSONDecodeError) as exc:
        raise CheckpointError(f"{mp}: unreadable manifest ({exc})") from exc
    if not isinstance(manifest, dict) or manifest.get("format") != MANIFEST_FORMAT:
        raise CheckpointError(f"{mp}: not a torchtree checkpoint manifest")
    return manifest


def load_rank_checkpoint(path: str, *, rank: int = 0, world_size: int = 1, backend=None, map_location: Any = "cpu") -> Any:
    """Read this rank's state of a multi-rank checkpoint.

    Returns
    -------
    The ``state`` that :func:`save_rank_checkpoint` was given on this rank.

    Raises
    ------
    FileNotFoundError
        No manifest or no file for this rank.
    CheckpointError
        The checkpoint was written by a different number of ranks, or this rank's
        file does not belong to the manifest's step (a crash between the writes).
    """
    if backend is not None:
        rank, world_size = int(backend.rank), int(backend.world_size)
    manifest = read_manifest(path)
    saved = int(manifest["world_size"])
    if saved != int(world_size):
        raise CheckpointError(
            f"{path}: checkpoint was written by {saved} rank(s) but this run has {world_size}; "
            f"resume with the same world size ({saved} process{'es' if saved != 1 else ''}), or start afresh without the checkpoint"
        )
    mine = rank_path(path, rank)
    steps = []
    # the rank's file, or (a save stopped before its manifest) the previous one the manifest still names
    for candidate in [c for c in (mine, mine + ".prev") if os.path.exists(c)] or [mine]:
        payload = load_checkpoint(candidate, map_location=map_location)
        if not isinstance(payload, dict) or payload.get("format") != FORMAT:
            raise CheckpointError(f"{candidate}: not a torchtree rank checkpoint")
        if int(payload["rank"]) != int(rank) or int(payload["world_size"]) != saved:
            raise CheckpointError(f"{candidate}: written by rank {payload['rank']} of {payload['world_size']}, expected "
                                  f"rank {rank} of {saved}")
        if payload.get("step") == manifest.get("step"):
            return payload["state"]
        steps.append(payload.get("step"))
    raise CheckpointError(
        f"{mine}: holds step {' / '.join(str(s) for s in steps)} but the manifest says step {manifest.get('step')}; "
        "delete the checkpoint files to start afresh")


def _min_seconds_from_env() -> Optional[float]:
    """``TORCHTREE_CHECKPOINT_MIN_SECONDS``: a number, or unset / ``auto`` for None."""
    raw = os.environ.get("TORCHTREE_CHECKPOINT_MIN_SECONDS", "").strip()
    if raw in ("", "auto"):
        return None
    try:
        value = float(raw)
    except ValueError:
        value = -1.0
    if not value >= 0:
        raise ValueError(f"TORCHTREE_CHECKPOINT_MIN_SECONDS must be a number >= 0 or 'auto', got {raw!r}")
    return value


class Checkpointer:
    """Periodic checkpoints for a sampler loop (``checkpoint=path, checkpoint_every=k``).

    One process writes ``path`` (atomic); a multi-rank run (``backend`` with
    ``world_size > 1``) writes rank files plus a manifest.

    Saving costs time (``torch.save`` and ``fsync``: milliseconds to seconds), so
    a save that is due by step is skipped when it comes too soon after the previous
    one (see ``min_seconds``); the save after the last step (``last=True``) always
    happens. Every save holds the complete state, so a run resumed from whichever
    save came last ends exactly as an uninterrupted run does.

    Parameters
    ----------
    path : str or None
        None disables checkpointing (every method becomes a no-op).
    every : int
        A save is due when ``(step + 1) % every == 0``.
    backend : torchtree.distributed.Backend, optional
    fingerprint : str, optional
        Identifies the run (see :func:`fingerprint`); stored with every save and
        checked by :meth:`load`.
    writer : str, optional
        What writes the checkpoint (a sampler's name); stored with every save, and named by
        :meth:`load` when a checkpoint of another writer is refused.
    accept : sequence of str
        Further fingerprints :meth:`load` takes as this run's (those an earlier version gave the same
        run); saves store ``fingerprint``.
    min_seconds : float or None
        Least time between the end of one save and the start of the next:
        ``0`` saves at every due step; a number skips due saves sooner than
        that; ``None`` (default) is cost-aware: it measures each save and skips due
        saves sooner than ``COST_RATIO`` (19) times the last save's duration, so
        that saving takes at most about 5% of the run's time. The environment
        variable ``TORCHTREE_CHECKPOINT_MIN_SECONDS`` replaces the default (a number,
        or ``auto``); the test suite sets it to 0. Multi-rank runs save at every
        due step whatever this says (skipping by each rank's clock would let ranks
        disagree on which steps they save).

    Examples
    --------
    >>> ck = Checkpointer(checkpoint, checkpoint_every, backend)      # doctest: +SKIP
    >>> state = ck.load()          # None when there is nothing to resume  # doctest: +SKIP
    >>> for step in range(start, n_steps):                           # doctest: +SKIP
    ...     ...
    ...     ck.maybe_save(step, lambda: {"step": step, "logw": logw, "trees": trees.as_dict()})
    """

    #: With ``min_seconds=None``: skip due saves sooner than this many times the
    #: last save's duration (save time / run time <= 1 / (1 + COST_RATIO)).
    COST_RATIO = 19.0

    def __init__(self, path: Optional[str], every: int = 1, backend=None, fingerprint: Optional[str] = None,
                 min_seconds: Optional[float] = None, writer: Optional[str] = None,
                 parts: Optional[Dict[str, Any]] = None, accept: Sequence[str] = ()) -> None:
        if path is not None and int(every) < 1:
            raise ValueError(f"checkpoint_every must be >= 1, got {every}")
        if path is not None and not os.fspath(path):
            raise ValueError("checkpoint path is empty (pass None for no checkpoints)")
        if path is not None and os.path.isdir(os.fspath(path)):
            raise ValueError(f"checkpoint path {os.fspath(path)!r} is a directory; give a file path in it, e.g. "
                             f"{os.path.join(os.fspath(path), 'run.ckpt')!r}")
        self.path = None if path is None else os.fspath(path)
        self.every = int(every)
        self.backend = backend
        self.fingerprint = fingerprint
        self.writer = writer
        self.parts = parts
        self.accept = tuple(accept)
        if min_seconds is None:
            min_seconds = _min_seconds_from_env()
        elif not (isinstance(min_seconds, (int, float)) and min_seconds >= 0):
            raise ValueError(f"min_seconds must be a number >= 0 or None, got {min_seconds!r}")
        self.min_seconds = None if min_seconds is None else float(min_seconds)
        self._last_end: Optional[float] = None
        self._last_cost = 0.0
        self.n_skipped = 0

    @property
    def enabled(self) -> bool:
        """Whether checkpoints are written at all (a ``path`` was given)."""
        return self.path is not None

    @property
    def distributed(self) -> bool:
        """Whether the run spans several ranks (one checkpoint file per rank)."""
        return self.backend is not None and int(getattr(self.backend, "world_size", 1)) > 1

    @property
    def rank(self) -> int:
        """This process's rank (0 without a backend)."""
        return int(getattr(self.backend, "rank", 0)) if self.backend is not None else 0

    @property
    def world_size(self) -> int:
        """Number of ranks (1 without a backend)."""
        return int(getattr(self.backend, "world_size", 1)) if self.backend is not None else 1

    def exists(self) -> bool:
        """Whether there is a checkpoint at ``path`` (single-file or multi-rank)."""
        if self.path is None:
            return False
        return os.path.exists(manifest_path(self.path)) or os.path.exists(self.path)

    def save(self, step: int, state: Any) -> None:
        """Write ``state`` for ``step`` now."""
        if self.path is None:
            return
        t0 = time.perf_counter()
        state = {"fingerprint": self.fingerprint, "writer": self.writer, "sampler_state": state}
        if self.parts is not None:
            state["fingerprint_parts"] = self.parts
        if self.distributed:
            save_rank_checkpoint(state, self.path, step=int(step), backend=self.backend)
        else:
            atomic_save(seal({"format": FORMAT, "rank": 0, "world_size": 1, "step": int(step), "state": state}), self.path)
        self._last_end = time.perf_counter()
        self._last_cost = self._last_end - t0

    def too_soon(self) -> bool:
        """Whether a save due now would come too soon after the previous one (see
        ``min_seconds``)."""
        if self._last_end is None or self.distributed:
            return False
        wait = self.COST_RATIO * self._last_cost if self.min_seconds is None else self.min_seconds
        return time.perf_counter() - self._last_end < wait

    def maybe_save(self, step: int, state_fn: Callable[[], Any], last: bool = False) -> bool:
        """Save ``state_fn()`` when ``step`` is due (or ``last``) and not too soon after
        the previous save (see ``min_seconds``); returns whether it saved."""
        if self.path is None or ((int(step) + 1) % self.every and not last):
            return False
        if not last and self.too_soon():
            self.n_skipped += 1
            return False
        self.save(step, state_fn())
        return True

    def load(self, map_location: Any = "cpu") -> Any:
        """The saved state, or None when there is no checkpoint.

        Raises ``CheckpointError`` when the checkpoint was written by a different
        number of ranks than this run has, or is incomplete. In a multi-rank run
        every rank raises it when the ranks would not all resume the same step (or
        all start afresh): one rank resuming while another starts from scratch gave
        a wrong posterior, or a hang, without a word.
        """
        if not self.distributed:
            return self._load(map_location)
        try:
            state, error = self._load(map_location), None
        except (CheckpointError, OSError) as exc:
            state, error = None, exc
        step = -2 if error is not None else (-1 if state is None else int(read_manifest(self.path)["step"]))
        steps = [int(v) for v in self.backend.all_gather(torch.tensor([step], dtype=torch.int64)).tolist()]
        if error is not None:
            raise error
        if len(set(steps)) > 1:
            said = {-2: "cannot read its checkpoint", -1: "finds no checkpoint"}
            detail = ", ".join(f"rank {r} {said.get(v, f'resumes after step {v}')}" for r, v in enumerate(steps))
            raise CheckpointError(
                f"{self.path}: the ranks disagree on resuming ({detail}); give every rank the same path, on "
                "storage every rank sees, or delete the checkpoint files to start afresh")
        return state

    def _load(self, map_location: Any = "cpu") -> Any:
        """This process's saved state, or None (see :meth:`load`)."""
        if self.path is None:
            return None
        if os.path.exists(manifest_path(self.path)):
            state = load_rank_checkpoint(self.path, rank=self.rank, world_size=self.world_size, map_location=map_location)
        elif self.distributed and os.path.exists(rank_path(self.path, self.rank)):
            raise CheckpointError(
                f"{rank_path(self.path, self.rank)} exists but {manifest_path(self.path)} does not: the manifest was "
                "removed, or the run stopped during its first checkpoint. Restore the manifest to resume, or delete "
                f"{self.path}.rank* to start afresh (a new run would overwrite them)")
        elif not os.path.exists(self.path):
            return None
        else:
            payload = load_checkpoint(self.path, map_location=map_location)
            if not (isinstance(payload, dict) and payload.get("format") == FORMAT):
                raise CheckpointError(f"{self.path}: not a torchtree sampler checkpoint")
            saved = int(payload.get("world_size", 1))
            if saved != self.world_size:
                raise CheckpointError(
                    f"{self.path}: checkpoint was written by {saved} rank(s) but this run has {self.world_size}; "
                    f"resume with the same world size ({saved} process{'es' if saved != 1 else ''}), or start afresh without the checkpoint"
                )
            state = payload["state"]
        if not (isinstance(state, dict) and "sampler_state" in state):
            raise CheckpointError(f"{self.path}: not a torchtree sampler checkpoint")
        theirs = state.get("writer")
        if self.fingerprint is not None and self.writer and theirs and theirs != self.writer:
            raise CheckpointError(f"{self.path}: this checkpoint was written by {theirs}, not by this run's "
                                  f"{self.writer}; delete it or choose another checkpoint path to start afresh")
        if self.fingerprint is not None and state.get("fingerprint") not in (self.fingerprint, *self.accept):
            what = differing_parts(state.get("fingerprint_parts"), self.parts)
            raise CheckpointError(
                f"{self.path}: this checkpoint belongs to a different run ("
                + (what or "its data, settings or seed differ")
                + ("; " if ":" in what else ": ")
                + f"fingerprint {state.get('fingerprint')} != {self.fingerprint}); delete it or choose another "
                "checkpoint path to start afresh"
            )
        return state["sampler_state"]

    def stored_seed(self) -> Optional[int]:
        """The seed stored in this process's checkpoint (the run's ``{"seed": ...}`` state), or None when
        there is no readable one; the fingerprint is not checked (the run's :meth:`load` does that)."""
        try:
            state = Checkpointer(self.path, backend=self.backend)._load()
        except (CheckpointError, OSError, KeyError, ValueError):
            return None
        seed = state.get("seed") if isinstance(state, dict) else None
        return int(seed) if seed is not None else None

    def __repr__(self) -> str:
        return f"Checkpointer(path={self.path!r}, every={self.every}, min_seconds={self.min_seconds!r})"
