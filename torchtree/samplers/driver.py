"""The one ``run()`` every sampler goes through, and the run-level helpers samplers share.

:func:`run` owns what is the same for every method: the data and its device, the seed
(``None`` = fresh randomness, an int reproduces), the backend (opened by name and closed
again), the intra-op threads (``config.n_threads``, :mod:`torchtree.core.threads`), the
checkpoint (fingerprint, load, atomic saves, resume), the monitors (one dispatch, rank-gated,
type-checked), the time budget and the loop itself. A sampler only supplies ``init`` /
``step`` / ``finalize`` (see :mod:`torchtree.samplers.protocol`).
"""
from __future__ import annotations

import contextlib
import os
import re
import time
from dataclasses import dataclass, field
from typing import Any, Callable, Dict, Iterator, Optional

import torch

from torchtree.core.random import seed_to_int
from torchtree.core.threads import resolve_threads, using_threads
from torchtree.core.validate import check_backend
from torchtree.core.work import work_seconds
from torchtree.io.checkpoint import Checkpointer, fingerprint, fingerprint_parts
from torchtree.io.integrity import CheckpointError
from torchtree.io.lock import run_lock
from torchtree.model.data import Data, resolve_device
from torchtree.model.likelihood_protocol import check_hooks
from torchtree.model.likelihoods import DirichletMultinomial, NormalInverseGamma
from torchtree.monitor import Monitor, NullMonitor, as_monitor, closed_on_error, notify_checkpoint, progress_monitor
from torchtree.samplers.presets import RunShape, describe_resolution
from torchtree.samplers.protocol import HOOKS

__all__ = ["run", "sub_run", "RunContext", "CLOCKS", "checkpointer", "default_likelihood", "leaf_likelihood", "seed_key",
           "DrawnSeed", "describe", "default_memory_limit", "on_device", "opened_backend", "work_size", "run_threads"]


def default_likelihood(data: Data):
    """Dirichlet-multinomial(alpha=5) for classification, data-scaled NIG for regression."""
    if data.task == "classification":
        return DirichletMultinomial(5.0)
    return NormalInverseGamma.default_for(data.y)


def leaf_likelihood(likelihood, data: Data):
    """The leaf likelihood of a run on ``data``: :func:`default_likelihood` when ``likelihood`` is None, else
    ``likelihood`` itself once it passes the contract's check at the run's start.

    Raises
    ------
    TypeError
        ``likelihood`` lacks a hook of :class:`~torchtree.model.likelihood_protocol.LeafLikelihood` (every
        missing one is named) or has an unknown ``task``.
    ValueError
        Its ``task`` is not the data's.
    """
    if likelihood is None:
        return default_likelihood(data)
    check_hooks(likelihood)
    if likelihood.task != data.task:
        raise ValueError(f"likelihood {likelihood!r} is for {likelihood.task} but the data is {data.task}")
    return likelihood


class DrawnSeed(int):
    """A seed the caller drew for a run asked with ``seed=None`` (an estimator's ``random_state=None``,
    which seeds its evidence pilots with it too): the run uses it, and its checkpoint is keyed as a
    drawn seed's, as ``run(seed=None)`` keys it, so that either resumes the other."""


def seed_key(seed):
    """What of ``seed`` identifies a run in a checkpoint fingerprint: the seed itself, or
    ``"drawn"`` for None / a ``torch.Generator`` / a :class:`DrawnSeed` (the drawn seed is then
    stored in the checkpoint and reused on resume)."""
    if seed is None or isinstance(seed, (torch.Generator, DrawnSeed)):
        return "drawn"
    return seed_to_int(seed)


def describe(obj) -> Any:
    """A plain, exact description of a prior or likelihood (``config()`` where it has one)."""
    cfg = getattr(obj, "config", None)
    if callable(cfg):
        try:
            return cfg()
        except Exception:  # pragma: no cover - fall back to the repr
            pass
    return re.sub(r" at 0x[0-9a-fA-F]+", "", repr(obj))


def default_memory_limit(dev: torch.device) -> int:
    """Half the GPU's memory, or half the machine's physical memory (bytes)."""
    if dev.type == "cuda":
        free, total = torch.cuda.mem_get_info(dev)
        return int(0.5 * total)
    try:
        return int(0.5 * os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES"))
    except (ValueError, OSError, AttributeError):  # pragma: no cover
        return 8 << 30


def on_device(data: Data, device) -> Data:
    """``data`` on the run's device: ``device`` (``"auto"`` = CUDA if present), or the data's own
    device when ``device`` is None."""
    dev = resolve_device(device, data.device)
    return data if data.device == dev else data.to(dev)


@contextlib.contextmanager
def opened_backend(backend) -> Iterator[Any]:
    """The run's backend: ``None`` stays None, a name is opened here (``torchtree.distributed.get_backend``), a
    Backend object is used as it is. A torch process group that the name opened is kept for the next run by
    name and destroyed when the interpreter exits: one rendezvous per process (opening and destroying it at
    every fit failed by the third or fourth fit, gloo's connections refused); other backends are closed."""
    check_backend(backend)
    if not isinstance(backend, str):
        yield backend
        return
    from torchtree.distributed import get_backend

    opened = get_backend(backend)
    try:
        yield opened
    finally:
        if getattr(opened, "_owns_process_group", False):
            _keep_until_exit(opened)
        else:
            opened.close()


_DESTROY_AT_EXIT = [False]  # whether _destroy_kept is registered with atexit


def _keep_until_exit(backend) -> None:
    """Keep ``backend``'s process group open (it lives in ``torch.distributed``); destroy it at exit."""
    if not _DESTROY_AT_EXIT[0]:
        import atexit

        atexit.register(_destroy_kept)
        _DESTROY_AT_EXIT[0] = True


def _destroy_kept() -> None:
    """At exit: destroy the process group the runs by name opened (no barrier: a rank that failed must not hold
    the others' exit until the timeout)."""
    import torch.distributed as dist

    if dist.is_available() and dist.is_initialized():
        dist.destroy_process_group()


def work_size(config, n_rows: int, world_size: int = 1, device=None) -> int:
    """Units of work on one rank for the thread policy: ``config.thread_work(n_rows, world_size, device)``
    where the config defines it (a sampler whose work runs in few large parallel kernels), else data rows
    x the particles (or chains) this rank holds (``config.n_particles`` or ``config.n_chains``; 1 when it
    has neither)."""
    own = getattr(config, "thread_work", None)
    if callable(own):
        return int(own(n_rows, world_size, device))
    units = 1
    for name in ("n_particles", "n_chains"):
        value = getattr(config, name, None)
        if isinstance(value, int) and not isinstance(value, bool):
            units = value
            break
    return int(n_rows) * max(1, units // max(1, int(world_size)))


@contextlib.contextmanager
def run_threads(config, n_rows: int, world_size: int = 1, device=None) -> Iterator[int]:
    """The run's intra-op threads: ``config.n_threads`` (``"auto"`` when absent) resolved by
    :func:`torchtree.core.threads.resolve_threads` for this rank's work (:func:`work_size` on the data's
    ``device``), set for the block and restored after it (on an exception too). Yields the thread count."""
    n = resolve_threads(getattr(config, "n_threads", "auto"), work_size(config, n_rows, world_size, device),
                        world_size)
    with using_threads(n) as used:  # fewer in a child forked after threads (core.threads.forked_after_threads)
        yield used


#: What a config's ``clock`` setting may name: the clock its ``max_seconds`` budget reads.
#: "cpu" (this process's CPU time) keeps a budget meaningful on a shared machine; "work"
#: (:mod:`torchtree.core.work`: modelled reference seconds of the evaluations made) stops a seeded
#: run at the same point on every machine.
CLOCKS: Dict[str, Callable[[], float]] = {"wall": time.perf_counter, "cpu": time.process_time, "work": work_seconds}


@dataclass
class RunContext:
    """What a sampler's ``init`` / ``step`` / ``finalize`` may use of the run.

    Attributes
    ----------
    data : Data, on ``device``
    device : torch.device
    seed : int, the run's seed (drawn once when the caller gave None; stored in checkpoints)
    backend : Backend or None; ``rank`` / ``world_size`` from it (0 / 1 without)
    monitor : Monitor (rank-gated); ``watch`` is False when nobody listens, so that a step
        can skip computing its report
    t0 : float, ``time.perf_counter()`` at the start of the run
    resumed_at : int or None, the step a checkpoint resumed at
    checkpoint_every : int or None, save after steps ``k-1, 2k-1, ...`` (None: no
        checkpoints); a step that runs several transitions ends at these points
    setup : the sampler's run objects, what its ``setup(ctx)`` returned (a frozen dataclass of the
        method: the likelihood, the target, ...; None when it has none)
    clock : callable, the budget's clock (``CLOCKS[config.clock]``, wall time by default)
    c0 : float, ``clock()`` at the start of the run
    budget_before : float, seconds of ``clock`` that earlier segments of a resumed run spent
        (the restored state's ``elapsed_budget``; 0 for a fresh run)
    n_threads : int, the torch intra-op threads the run uses (set for its duration)
    thread_setting : ``"auto"`` or int, the config's ``n_threads`` (what a sub-run inherits)
    sub_runs : list of dict, the nested runs :func:`sub_run` made (recorded in the posterior's
        ``info["sub_runs"]``)
    stopped_by_budget : bool, whether ``max_seconds`` ended the step loop (known to ``finalize``; the
        posterior's ``info["stopped_by"]`` is then ``"max_seconds"``)
    checkpoint_writable : bool, False when the checkpoint exists in a directory the run cannot write: it
        is then read only (a finished run's posterior), and a run that would write it is refused
    """

    data: Data
    device: torch.device
    seed: int
    backend: Any = None
    monitor: Monitor = field(default_factory=NullMonitor)
    t0: float = 0.0
    resumed_at: Optional[int] = None
    checkpoint_every: Optional[int] = None
    setup: Any = None
    clock: Callable[[], float] = time.perf_counter
    c0: float = 0.0
    budget_before: float = 0.0
    n_threads: int = 1
    thread_setting: Any = "auto"
    sub_runs: list = field(default_factory=list)
    stopped_by_budget: bool = False
    checkpoint_writable: bool = True

    @property
    def rank(self) -> int:
        return 0 if self.backend is None else int(self.backend.rank)

    @property
    def world_size(self) -> int:
        return 1 if self.backend is None else int(self.backend.world_size)

    @property
    def watch(self) -> bool:
        return not isinstance(self.monitor, NullMonitor) and bool(getattr(self.monitor, "wants_steps", True))

    def seconds(self) -> float:
        """Wall seconds since the start of the run (this segment of it)."""
        return time.perf_counter() - self.t0

    def budget_seconds(self) -> float:
        """Seconds of the budget's clock spent by the whole run, earlier segments included."""
        return self.budget_before + self.clock() - self.c0


def checkpointer(sampler, data: Data, settings: Dict[str, Any], key, backend) -> Checkpointer:
    """The run's :class:`~torchtree.io.checkpoint.Checkpointer` (disabled without a path).

    Its fingerprint hashes the sampler's name, the config's result settings but the sampler's
    ``growable_settings()``, ``settings`` (what else decides the result: the prior, the likelihood,
    ...), the seed key, the data and the number of ranks: a checkpoint of any other run is refused.
    """
    cfg = sampler.config
    path = getattr(cfg, "checkpoint", None)
    fp = parts = None
    accept = ()
    if path is not None:
        world = 1 if backend is None else int(backend.world_size)
        every = cfg.result_settings()
        grow = tuple(getattr(sampler, "growable_settings", tuple)())
        result = {k: v for k, v in every.items() if k not in grow}
        fp = fingerprint(sampler.name, {"config": result, **settings}, key, data.X, data.y, world)
        if grow:  # a checkpoint written before these settings could grow hashed them all
            accept = (fingerprint(sampler.name, {"config": every, **settings}, key, data.X, data.y, world),)
        # what a refusal names: the parts that differ (the whole fingerprint alone decides)
        parts = fingerprint_parts({**result, **settings}, key, (data.X, data.y), world)
    return Checkpointer(path, getattr(cfg, "checkpoint_every", 1), backend=backend, fingerprint=fp, writer=sampler.name,
                        parts=parts, accept=accept)


def _agree(sampler, data: Data, settings: Dict[str, Any], ctx: RunContext) -> int:
    """Multi-rank set-up: every rank runs the same job, with rank 0's seed.

    One ``all_gather`` of (seed, hash of the settings and the training data's values); a rank whose
    hash differs makes every rank raise the same ``ValueError`` instead of sampling a mixture of two
    data sets or two runs.
    """
    what = fingerprint(sampler.name, {"config": sampler.config.result_settings(), **settings}, data.task,
                       data.X, data.y)
    mine = torch.tensor([[ctx.seed, int(what[:15], 16)]], dtype=torch.int64)
    table = ctx.backend.all_gather(mine).view(-1, 2)
    if bool((table[:, 1] != table[0, 1]).any()):
        other = int((table[:, 1] != table[0, 1]).nonzero()[0, 0])
        raise ValueError(f"ranks disagree on the {sampler.name} settings or the training data (rank {other} differs "
                         "from rank 0); every rank must run the same sampler on the same full training data")
    return int(table[0, 0])


#: bytes of a refusal's message that :func:`_agreed_setup` shares with the other ranks
_REFUSAL_BYTES = 400


def _agreed_setup(sampler, ctx: RunContext, lock: contextlib.ExitStack):
    """Rank 0 takes the checkpoint's lock into ``lock`` (:func:`~torchtree.io.lock.run_lock`: one run per
    checkpoint path), then ``sampler.setup(ctx)``; on several ranks, a refusal on one rank is every rank's.

    A set-up that raises on some ranks only (a memory check where ranks see different free memory) left
    the others waiting in the run's first collective until its timeout. Every rank now sets up, then one
    ``all_gather`` shares whether (and why) each refused: a rank that refused raises its own error, the
    others a ``ValueError`` naming the first refusing rank and its message."""
    def lock_and_setup():
        if ctx.rank == 0:
            path = getattr(sampler.config, "checkpoint", None)
            # one process may read a finished checkpoint in a read-only directory (ranks would not agree)
            readable = lambda: ctx.world_size == 1 and os.path.isfile(os.fspath(path))  # noqa: E731
            ctx.checkpoint_writable = lock.enter_context(run_lock(path, readable))
        return sampler.setup(ctx)

    if ctx.world_size == 1:
        return lock_and_setup()
    try:
        setup, error = lock_and_setup(), None
    except Exception as exc:  # noqa: BLE001 - shared with the peers, then raised again below
        setup, error = None, exc
    text = b"" if error is None else f"{type(error).__name__}: {error}".encode("utf-8", "replace")[:_REFUSAL_BYTES]
    mine = torch.zeros(1, _REFUSAL_BYTES + 1, dtype=torch.int64)
    mine[0, 0] = int(error is not None)
    mine[0, 1:1 + len(text)] = torch.tensor(list(text), dtype=torch.int64)
    table = ctx.backend.all_gather(mine).view(ctx.world_size, -1)
    if error is not None:
        raise error
    refused = (table[:, 0] != 0).nonzero().flatten().tolist()
    if refused:
        r = refused[0]
        said = bytes(v for v in table[r, 1:].tolist() if v).decode("utf-8", "replace")
        raise ValueError(f"rank {r} refused the run before it started ({said}); every rank stops with it")
    return setup


def _over_budget(ctx: RunContext, budget: float) -> bool:
    """Whether the time budget is spent; on several ranks the slowest rank's clock decides for all,
    so that every rank stops after the same step."""
    spent = ctx.budget_seconds() >= budget
    if ctx.world_size == 1:
        return spent
    return bool(ctx.backend.all_reduce(torch.tensor([int(spent)], dtype=torch.int64), "max").item())


def sub_run(ctx: RunContext, sampler, data, *, seed: int, purpose: str):
    """A run nested in the run of ``ctx`` (e.g. the top-down SMC whose draws start MCMC's chains).

    It runs on the parent's data device with the parent's thread setting (``"auto"`` resolves for
    the sub-run's own work; an int is used as it is), in one process (every rank of a
    multi-rank parent runs the same seeded sub-run), without the parent's monitors, and is recorded
    in ``ctx.sub_runs`` (``purpose``, sampler, seed, settings, seconds, log evidence), which the
    parent's posterior carries as ``info["sub_runs"]``. Within a fit that asked for progress bars
    (:func:`torchtree.monitor.progress_bars`) it shows its own, labelled ``purpose``.

    Parameters
    ----------
    ctx : RunContext of the parent run
    sampler : a complete sampler (its config has no ``"auto"`` left)
    data : Data, on the parent's device
    seed : int, derived from the parent's seed by the caller's named stream
    purpose : str, one line

    Returns
    -------
    The sub-run's posterior.
    """
    if "n_threads" in getattr(type(sampler.config), "__dataclass_fields__", {}):
        sampler.config = sampler.config.replace(n_threads=ctx.thread_setting)
    t0 = time.perf_counter()
    post = run(sampler, data, seed=seed, monitor=progress_monitor(purpose))  # a bar only within a fit that asked
    settings = {k: v for k, v in sampler.config.result_settings().items() if isinstance(v, (int, float, str, bool))}
    ctx.sub_runs.append({"purpose": purpose, "sampler": sampler.name, "seed": int(seed), "settings": settings,
                         "seconds": time.perf_counter() - t0,
                         "log_evidence": float(getattr(post, "log_evidence", None) or float("nan"))})
    return post


def run(sampler, data, *, seed=None, monitor=None, backend=None):
    """Run ``sampler`` on ``data`` through its ``init`` / ``step`` / ``finalize``.

    Parameters
    ----------
    sampler : an object with ``name``, ``config`` and the three functions of
        :class:`~torchtree.samplers.protocol.Sampler`; optionally ``prepare(data, device)``
        (-> Data; default: ``Data`` on the device), ``settings(ctx)`` (more of what decides the
        result, e.g. the prior's description), ``start_info(ctx)``, ``end_info(posterior)``
        and ``restore(saved, ctx)`` (default: ``init`` then the state class's
        ``from_state_dict``).
        Run settings read from ``sampler.config`` when present: ``device``, ``n_threads``
        (torch intra-op threads during the run, see :func:`run_threads`; the previous count is
        restored afterwards), ``checkpoint``, ``checkpoint_every``, ``max_seconds`` and
        ``clock`` (``"wall"`` or ``"cpu"``, what ``max_seconds`` measures; see :data:`CLOCKS`). The budget counts the earlier segments
        of a resumed run when the state carries ``elapsed_budget`` (seconds, kept up to date
        by ``step``); a run stopped by its budget saves its last step, so that running it
        again resumes there.
    data : Data or (X, y)
    seed : int, torch.Generator or None
        None draws a fresh seed (kept in the checkpoint, so a resumed run continues it).
    monitor : Monitor, list of Monitors or None
    backend : Backend, name or None (a name is opened and closed here)

    Returns
    -------
    What ``finalize`` returns (a posterior).

    Notes
    -----
    ``step`` usually runs one transition (``state.step`` += 1). It may run several (a
    latency-bound sampler amortising the per-call cost): the driver then reports its
    ``info`` and saves the checkpoint under the last transition's index, so such a step
    should end where a report is due and at ``ctx.checkpoint_every`` boundaries.
    """
    missing = [h for h in HOOKS if not callable(getattr(sampler, h, None))]
    if missing:
        raise TypeError(f"{type(sampler).__name__} lacks the sampler hook(s) {missing}: subclass "
                        "torchtree.samplers.base.SamplerBase, which declares each with its default")
    given = sampler.config
    t0 = time.perf_counter()
    with opened_backend(backend) as be:
        data = sampler.prepare(data, getattr(given, "device", None))
        unresolved = bool(getattr(given, "unresolved", list)())  # a config without presets has nothing to resolve
        if unresolved:  # "auto" settings: this run's values from the data's shape (the sampler's own config is kept)
            sampler.config = given.resolve(RunShape.of(data, prior=getattr(sampler, "prior", None),
                                                       world_size=1 if be is None else int(be.world_size)))
        try:
            cfg = sampler.config
            clock = CLOCKS[getattr(cfg, "clock", None) or "wall"]
            rank = None if be is None else int(be.rank)
            ctx = RunContext(data=data, device=data.device, seed=0, backend=be, monitor=as_monitor(monitor, rank=rank),
                             t0=t0, clock=clock, c0=clock(), thread_setting=getattr(cfg, "n_threads", "auto"))
            with run_threads(cfg, int(data.X.shape[0]), ctx.world_size, data.device) as n_threads:
                ctx.n_threads = n_threads
                post = _run_loop(sampler, ctx, seed)
            if isinstance(getattr(post, "info", None), dict):
                post.info.setdefault("seed", ctx.seed)
                chosen = getattr(cfg, "resolution", None)
                if chosen:
                    post.info["settings"] = describe_resolution(chosen)
                if ctx.sub_runs:
                    post.info["sub_runs"] = list(ctx.sub_runs)
            return post
        finally:
            if unresolved:
                sampler.config = given


def _run_loop(sampler, ctx: RunContext, seed):
    """:func:`run` after the set-up of its data, backend and threads."""
    with contextlib.ExitStack() as lock:
        ctx.setup = _agreed_setup(sampler, ctx, lock)
        return _locked_run(sampler, ctx, seed)


def _locked_run(sampler, ctx: RunContext, seed):
    """:func:`_run_loop` after the set-up, holding the checkpoint's lock."""
    cfg, data, be = sampler.config, ctx.data, ctx.backend
    settings = sampler.settings(ctx)
    ck = checkpointer(sampler, data, settings, seed_key(seed), be)
    ctx.checkpoint_every = ck.every if ck.enabled else None
    saved = ck.load() if ck.enabled else None
    lacking = [k for k in ("seed", "state") if saved is not None and not (isinstance(saved, dict) and k in saved)]
    if lacking:  # an edit that recomputed the checksum
        raise CheckpointError(f"{cfg.checkpoint}: not a checkpoint this run can resume: its sampler state lacks "
                              f"{' and '.join(lacking)}; start afresh without it")
    ctx.seed = int(saved["seed"]) if saved is not None else seed_to_int(seed)
    if saved is not None:
        ctx.sub_runs = list(saved.get("sub_runs") or [])
    if ctx.world_size > 1:
        ctx.seed = _agree(sampler, data, settings, ctx)
    if saved is None:
        state = sampler.init(ctx)
    else:
        state = sampler.restore(saved["state"], ctx)
        ctx.resumed_at = int(state.step)
        ctx.budget_before = float(getattr(state, "elapsed_budget", 0.0))
    if not ctx.checkpoint_writable and not (saved is not None and state.done):
        raise PermissionError(
            f"checkpoint {cfg.checkpoint}: its directory cannot be written, and the run it holds is not finished with "
            "these settings, so going on would write it; copy it to a writable directory and give that path")
    start = {"sampler": sampler.name, **sampler.start_info(ctx), "n_threads": ctx.n_threads}
    if ctx.resumed_at is not None:
        start["resumed_at_step"] = ctx.resumed_at
    mon = ctx.monitor
    mon.on_start(start)
    with closed_on_error(mon):  # an interrupted run's bars and files are released, as a finished run's are
        state = _steps(sampler, ctx, state, ck, getattr(cfg, "max_seconds", None))
        with _peers_stop_with_me(ctx):
            post = sampler.finalize(state, ctx)
    if ctx.stopped_by_budget and isinstance(getattr(post, "info", None), dict):
        post.info["stopped_by"] = "max_seconds"
    if getattr(ctx.data, "encoder", None) is not None and hasattr(post, "encoder"):
        post.encoder = ctx.data.encoder  # predictions take the raw table, coded as in training
    end = {"seconds": ctx.seconds(), "posterior": post, **sampler.end_info(post)}
    mon.on_end(end)
    return post


@contextlib.contextmanager
def _peers_stop_with_me(ctx: RunContext):
    """Around a sampler's own work (``step``, ``finalize``; not the monitors', which the caller may raise from on
    purpose): an exception on this rank alone leaves the other ranks waiting in their next exchange, so a backend
    that can end the whole job (``MPIBackend.abort``; ``torchrun`` stops a gloo job itself) is asked to."""
    try:
        yield
    except Exception as exc:
        abort = getattr(ctx.backend, "abort", None)
        if ctx.world_size > 1 and callable(abort):
            abort(f"rank {ctx.rank}: the run failed ({type(exc).__name__}: {exc})")
        raise


def _steps(sampler, ctx: RunContext, state, ck, budget):
    """The step loop of :func:`_run_loop`, and the save of a run its budget stopped; the last state."""
    mon = ctx.monitor
    # the nested runs made by init (a top-down start) go with the state: a resumed run reports them too
    payload = lambda: {"seed": ctx.seed, "state": state.state_dict(), "sub_runs": list(ctx.sub_runs)}  # noqa: E731
    last_saved = None if ctx.resumed_at is None else ctx.resumed_at - 1
    stopped, stepped = False, False
    while not state.done:
        # the budget is checked between steps: a fresh run always makes one step (so there is
        # an answer), a resumed run whose earlier segments spent the budget makes none
        if budget is not None and (stepped or ctx.resumed_at is not None) and _over_budget(ctx, budget):
            stopped = True
            break
        stepped = True
        step = int(state.step)
        with _peers_stop_with_me(ctx):
            state, info = sampler.step(state, ctx)
        # A step may run several transitions (``state.step`` counts them): its report and
        # its checkpoint belong to the last one it ran.
        step = max(step, int(state.step) - 1)
        if info:
            mon.on_step(step, info)
        if ck.enabled and ck.maybe_save(step, payload, last=state.done):
            last_saved = step
            notify_checkpoint(mon, step)
    ctx.stopped_by_budget = stopped
    if stopped and ck.enabled and int(state.step) > 0 and last_saved != int(state.step) - 1:
        # the budget ended the run between two saves: keep its last step
        ck.save(int(state.step) - 1, payload())
        notify_checkpoint(mon, int(state.step) - 1)
    return state
