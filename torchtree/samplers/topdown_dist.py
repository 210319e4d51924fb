"""Top-down SMC across ranks: layouts, particle export/import, and the multi-rank run.

:meth:`TopDownSMC.run <torchtree.samplers.topdown.TopDownSMC.run>` calls :func:`run_distributed` when
its ``backend`` has more than one rank. Every rank holds the full training data and
``n = n_particles / world_size`` particles with global indices ``rank * n + i``; every random
draw is keyed by the global index (``torchtree.core.random.keyed_uniform``), so the same seed gives
the same particles on 1, 2 or 8 ranks.

Layouts
-------
``"islands"`` (``n_islands`` a multiple of ``world_size``)
    Whole islands live on one rank (rank ``r`` holds islands ``r I/W .. (r+1) I/W - 1``). An
    island's weights, ESS, evidence and resampling are local, so the run exchanges nothing
    until the end. A rank whose trees are finished keeps doing the (cheap, weights-only)
    bookkeeping of the stages the slowest rank still runs, exactly as the one-process filter
    does for its finished islands; the stage count is agreed in one collective at the end.
``"gathered"`` (any other ``n_islands``; requires only ``world_size | n_particles``)
    Islands may span ranks (an island of ``m`` particles is split over the ranks that hold
    global indices ``[i m, (i+1) m)``). Every stage does one ``all_gather`` of the local
    incremental log-weights (``8 n`` bytes per rank, ``8 n_particles`` received by every
    rank; 8 MB per stage at a million particles), after which every rank holds the global
    log-weights and computes normalisation, ESS, evidence and resampling decisions with the
    very tensor operations of the one-process filter (same shapes, same order), hence the
    same bits. Resampling: every rank draws the same global ancestors with the same
    generator (``derive_seed(seed, 1, stage, island)``), puts them in canonical order
    (:func:`~torchtree.samplers.topdown.canonical_ancestors`, the order of
    :func:`torchtree.distributed.redistribute`), and particles whose ancestor lives on
    another rank arrive through ``redistribute`` (``method="auto"``: all-to-all).

In the ``"islands"`` layout a rank that finishes early waits for the slowest at the end; the
backend's ``timeout`` is raised for that one call to twice the elapsed time (plus a minute),
but a torch.distributed process group's own timeout (``init_process_group(timeout=...)``,
which ``TorchDistBackend.from_env(timeout=...)`` sets) still bounds it: give long runs a
generous one.

Moving particles
----------------
A particle is a row of node uids into its rank's :class:`~torchtree.steps.growth.NodeTable`,
meaningless elsewhere. The sender exports the trees that leave it as padded arrays
(:func:`export_particles`: feature, threshold, left, right, parent slot, depth, status,
statistics, point count, sender uid); the receiver creates local uids for them
(:func:`import_particles`; one per distinct (sender, uid), so copies of one tree share nodes
again) with the data-derivation rule of each node taken from its parent's split, and
rebuilds the point lists the open nodes' expansion will need from the root
(:func:`materialise_ancestors`, vectorised over nodes, one pass per depth level). Rebuilding
costs the data of the imported internal nodes, at most ``N x depth`` per distinct imported
tree, paid only for particles that change rank.

Results
-------
Every rank returns the *global* posterior: the final trees are packed into one buffer and
``all_gather``-ed (every rank then holds ``n_particles x capacity`` nodes, about 33 bytes per
node for two classes: 2048 particles x 64 nodes = 4 MB, a million particles x 100 nodes =
3.3 GB per rank -- reduce particles or predict on fewer ranks if that is too much).
Monitors are written by rank 0 only (``as_monitor(monitor, rank=backend.rank)``); the
per-stage tree statistics (``trees/*``, ``smc/distinct_nodes``) are over rank 0's particles,
and in the ``"islands"`` layout so are ``smc/ess`` and ``smc/log_evidence`` (rank 0's islands).

Exactness
---------
Log-evidence, weights, particles and predictions are bit-identical to the one-process run
for classification with the prior and empirical proposals (node counts are integers and all
float reductions run on tensors of the same shape in the same order). Two places can differ
in the last bits: regression (the cumulative sums of float statistics run over the distinct
nodes *present on the rank*), and the optimal proposal's interval choice (a cumulative sum
over the candidates of all distinct nodes present), each of which can change a decision
only when a uniform falls within ~1e-13 of a boundary. Torch's CPU reductions also change
their summation order with the thread count for rows over 32768 elements, so islands of more
than 32768 particles are reproducible across world sizes only at equal thread counts
(``torchrun`` sets ``OMP_NUM_THREADS=1``).
"""
from __future__ import annotations

import math
import re
import time
import zlib

import torch

from torchtree.steps.growth import Grower
from torchtree.monitor import NullMonitor, as_monitor, notify_checkpoint
from torchtree.model.posterior import TreePosterior
from torchtree.core.random import seed_to_int
from torchtree.core.resampling import get_resampler
from torchtree.model.data import resolve_device
from torchtree.samplers.driver import checkpointer, default_likelihood, describe, run_threads, seed_key
from torchtree.samplers.driver import default_memory_limit as _default_memory_limit
from torchtree.samplers.smc_engine import island_ancestors, island_posterior, island_weights_step
from torchtree.samplers.topdown_particles import (EXPORT_FIELDS, expansion_pairs, export_particles, gather_trees,
                                                  import_particles, layout_for, materialise_ancestors,
                                                  move_particles, tree_report)

__all__ = [
    "EXPORT_FIELDS",
    "layout_for",
    "export_particles",
    "import_particles",
    "materialise_ancestors",
    "move_particles",
    "gather_trees",
    "run_distributed",
]

# ------------------------------------------------------------------------------------- run
def _settings_hash(smc, data, lik) -> int:
    # derived from the config, as the checkpoint fingerprint is, so the two cannot drift apart
    text = repr((smc.config.result_settings(), smc.max_stages, data.n, data.d, data.task,
                 getattr(data, "n_classes", None), describe(lik), describe(smc.prior)))
    return zlib.crc32(re.sub(r" at 0x[0-9a-fA-F]+", "", text).encode())


def _end_sync(backend, t: torch.Tensor, elapsed: float) -> torch.Tensor:
    """``all_gather`` where ranks that finished their islands wait for the slowest one.

    The wait may legitimately be long, so the backend's per-call ``timeout`` is raised to
    at least the run's elapsed time for this one call (where it is a plain attribute, as in
    the built-in backends). A torch.distributed process group also has its own timeout
    (``init_process_group(timeout=...)``) that this cannot raise.
    """
    old = getattr(backend, "timeout", None)
    try:
        if isinstance(old, (int, float)):
            backend.timeout = max(float(old), 2.0 * elapsed + 60.0)
    except AttributeError:  # pragma: no cover - read-only attribute
        old = None
    try:
        return backend.all_gather(t)
    finally:
        if isinstance(old, (int, float)):
            backend.timeout = old


def run_distributed(smc, data, backend, *, seed=None, monitor=None) -> TreePosterior:
    """Multi-rank :meth:`TopDownSMC.run` (see the module notes); call on every rank.

    Parameters
    ----------
    smc : TopDownSMC
    data : Data, the full training data (identical on every rank)
    backend : Backend with ``world_size > 1``
    seed : int or torch.Generator, optional
        Rank 0's value is used by every rank (broadcast), so ``None`` is safe.
    monitor : Monitor, optional (written by rank 0 only unless created with ``all_ranks``)

    Returns
    -------
    TreePosterior: the global posterior, identical on every rank.

    Raises
    ------
    ValueError
        On every rank alike: ``n_particles`` not divisible by the world size, or ranks that
        disagree on the settings or the data's shape.

    Notes
    -----
    Runs with ``smc.n_threads`` intra-op threads (``"auto"``: per rank, the cores divided by
    the ranks on the node; see :func:`torchtree.samplers.driver.run_threads`).
    """
    with run_threads(smc.config, data.n, backend.world_size) as n_threads:
        return _run_distributed(smc, data, backend, seed=seed, monitor=monitor, n_threads=n_threads)


def _run_distributed(smc, data, backend, *, seed=None, monitor=None, n_threads=1) -> TreePosterior:
    """:func:`run_distributed` under its thread setting."""
    t0 = time.perf_counter()
    W, r = backend.world_size, backend.rank
    P, I = smc.n_particles, smc.n_islands
    m = P // I
    layout = layout_for(P, I, W)
    n = P // W
    dev = resolve_device(smc.device) if smc.device is not None else data.device
    if data.device != dev:
        data = data.to(dev)
    lik = smc.likelihood if smc.likelihood is not None else default_likelihood(data)
    if lik.task != data.task:
        raise ValueError(f"likelihood {lik!r} is for {lik.task} but the data is {data.task}")
    # One set-up collective: rank 0's seed, and a check that every rank runs the same job.
    seed_i = seed_to_int(seed)
    fixed = int(seed_key(seed) != "drawn")
    mine = torch.tensor([[seed_i, _settings_hash(smc, data, lik), fixed]], dtype=torch.int64)
    table = backend.all_gather(mine)
    if bool((table[:, 1] != table[0, 1]).any()):
        raise ValueError("ranks disagree on the TopDownSMC settings or the data's shape; "
                         "every rank must run the same sampler on the same full training data")
    seed_i = int(table[0, 0])
    # Checkpoints: every rank loads its own file (the same step on all ranks, or an error).
    settings = {"prior": describe(smc.prior), "likelihood": describe(lik), "task": data.task}
    ck = checkpointer(smc, data, settings, seed_i if int(table[0, 2]) else "drawn", backend)
    saved = ck.load() if ck.enabled else None
    if saved is not None:
        seed_i = int(saved["seed"])
    mon = as_monitor(monitor, rank=r)
    grower = Grower(smc.prior, lik, data, smc.proposal, seed_i, smc.use_likelihood)
    grower.table.limit_bytes = smc.max_memory_bytes or _default_memory_limit(dev)
    state = grower.init_state(n) if saved is None else grower.load_state_dict(saved["growth"])
    g0 = r * n
    gidx = torch.arange(g0, g0 + n, device=dev)
    root_ll = float(lik.log_marginal(grower.table.stats[0])) if smc.use_likelihood else 0.0
    resample_fn = get_resampler(smc.resampling)
    method = getattr(smc, "redistribution", "auto")
    mon.on_start({"sampler": "TopDownSMC", "n_particles": P, "n_islands": I, "proposal": smc.proposal,
                  "expansion": smc.expansion, "n": data.n, "d": data.d, "world_size": W, "layout": layout,
                  "n_threads": n_threads})
    timing = {"resample_seconds": 0.0, "resample_steps": 0 if saved is None else int(saved["resample_steps"]), "received": 0}

    def save(step: int, fields: dict, last: bool = False) -> None:
        """Checkpoint (collective: every rank calls it at the same steps)."""
        def snap():
            out = {"seed": seed_i, "resample_steps": timing["resample_steps"], "growth": grower.state_dict(state)}
            out.update({k: v.clone() if isinstance(v, torch.Tensor) else v for k, v in fields.items()})
            return out

        if ck.maybe_save(step, snap, last=last):
            notify_checkpoint(mon, step)

    def report(stage, ess, logz_, n_isl, need, open_nodes, distinct):
        if isinstance(mon, NullMonitor):
            return
        rep = {
            "smc/ess": float(ess.min()),
            "smc/log_evidence": float(torch.logsumexp(logz_, 0) - math.log(n_isl)),
            "smc/resampled": len(need),
            "smc/open_nodes": int(open_nodes),
            "smc/distinct_nodes": int(distinct),
        }
        rep.update(tree_report(grower, state))
        rep["time/seconds"] = time.perf_counter() - t0
        mon.on_step(stage, rep)

    if layout == "islands":
        Il = I // W
        isl0 = r * Il
        logw = torch.zeros(n, dtype=torch.float64, device=dev)
        logz = torch.full((Il,), root_ll, dtype=torch.float64, device=dev)
        n_resample = 0
        # stage: the next stage to run (or, once this rank's trees are finished at
        # ``local_end``, the next stage whose weight bookkeeping is still to replay).
        stage, failed, local_end, n_stages = 0, False, -1, -1
        if saved is not None:
            logw, logz = saved["logw"].to(dev), saved["logz"].to(dev)
            n_resample, stage, failed = int(saved["n_resample"]), int(saved["stage"]), bool(saved["failed"])
            local_end, n_stages = int(saved["local_end"]), int(saved["n_stages"])

        def fields(next_stage):
            return {"stage": next_stage, "logw": logw, "logz": logz, "n_resample": n_resample, "failed": failed,
                    "local_end": local_end, "n_stages": n_stages}

        def step(stage, incr):
            nonlocal logw, logz, n_resample
            logw, logz, ess = island_weights_step(logw, logz, incr, Il, m)
            need = (ess < smc.ess_threshold * m).nonzero().squeeze(1).tolist()
            if need:
                ts = time.perf_counter()
                anc = island_ancestors(logw, need, m, resample_fn, seed_i, stage, first_island=isl0)
                state.take_(anc)
                n_resample += len(need)
                if grower.table.needs_compaction():
                    grower.table.compact(grower.open_uids(state))
                timing["resample_seconds"] += time.perf_counter() - ts
                timing["resample_steps"] += 1
            return ess, need

        every = ck.every
        zero = torch.zeros(n, dtype=torch.float64, device=dev)

        def sync(working: bool):
            """Checkpointed runs: at every due stage all ranks report whether they still grow trees."""
            msg = torch.tensor([[int(working), local_end, int(failed)]], dtype=torch.int64)
            return _end_sync(backend, msg, time.perf_counter() - t0)

        while local_end < 0:
            if stage >= smc.max_stages:
                failed, local_end = True, stage
                break
            pp, nn = expansion_pairs(grower, state, smc.expansion, stage)
            if pp.numel() == 0:
                local_end = stage
                break
            res = grower.expand(state, pp, nn, gidx[pp], stage)
            incr = torch.zeros(n, dtype=torch.float64, device=dev).index_add_(0, pp, res.log_weight)
            ess, need = step(stage, incr)
            report(stage, ess, logz, Il, need, pp.numel(), res.n_distinct)
            if ck.enabled and (stage + 1) % every == 0:
                sync(True)
                save(stage, fields(stage + 1))
            stage += 1
        if n_stages < 0 and not ck.enabled:
            # The global stage count; finished ranks replay the remaining stages' bookkeeping
            # (zero increments), as the one-process filter does for its finished islands.
            ends = _end_sync(backend, torch.tensor([[stage, int(failed)]], dtype=torch.int64), time.perf_counter() - t0)
            if bool(ends[:, 1].any()):
                raise RuntimeError(f"TopDownSMC did not finish within max_stages={smc.max_stages}")
            n_stages = int(ends[:, 0].max())
        elif n_stages < 0:
            # Checkpointed: a finished rank keeps meeting the others at every due stage (where
            # all ranks save), replaying its bookkeeping up to that stage while someone still
            # grows trees; at the first due stage where nobody does, the run ends.
            while True:
                due = ((stage + every) // every) * every - 1  # first due stage >= stage
                got = sync(False)
                if bool(got[:, 0].any()):
                    for s in range(stage, due + 1):
                        ess, need = step(s, zero)
                        report(s, ess, logz, Il, need, 0, 0)
                    stage = due + 1
                    save(due, fields(stage))
                    continue
                if bool(got[:, 2].any()):
                    raise RuntimeError(f"TopDownSMC did not finish within max_stages={smc.max_stages}")
                n_stages = int(got[:, 1].max())
                break
        for s in range(stage, n_stages):
            ess, need = step(s, zero)
            report(s, ess, logz, Il, need, 0, 0)
        if ck.enabled and stage <= n_stages:
            stage = n_stages + 1
            save(n_stages, fields(stage), last=True)
        fin = backend.all_gather(torch.cat([
            logw, logz, torch.tensor([n_resample, int(state.n_nodes.max())], dtype=torch.float64, device=dev)]))
        fin = fin.view(W, n + Il + 2)
        logw_g = fin[:, :n].reshape(P)
        logz_g = fin[:, n:n + Il].reshape(I)
        n_resample = int(fin[:, n + Il].sum())
        width = int(fin[:, n + Il + 1].max())
    else:
        logw_g = torch.zeros(P, dtype=torch.float64, device=dev)
        logz_g = torch.full((I,), root_ll, dtype=torch.float64, device=dev)
        n_resample, stage, done = 0, 0, False
        if saved is not None:
            logw_g, logz_g = saved["logw"].to(dev), saved["logz"].to(dev)
            n_resample, stage, done = int(saved["n_resample"]), int(saved["stage"]), bool(saved["done"])

        def fields(next_stage, finished):
            return {"stage": next_stage, "done": finished, "logw": logw_g, "logz": logz_g, "n_resample": n_resample}

        while stage < smc.max_stages:
            if done:  # resumed from the final checkpoint of a finished run
                break
            pp, nn = expansion_pairs(grower, state, smc.expansion, stage)
            incr = torch.zeros(n, dtype=torch.float64, device=dev)
            distinct = 0
            if pp.numel():
                res = grower.expand(state, pp, nn, gidx[pp], stage)
                incr.index_add_(0, pp, res.log_weight)
                distinct = res.n_distinct
            msg = torch.cat([incr, torch.tensor([pp.numel(), int(state.n_nodes.max())], dtype=torch.float64, device=dev)])
            allm = backend.all_gather(msg).view(W, n + 2)
            n_pairs = int(allm[:, n].sum())
            if n_pairs == 0:
                if ck.enabled:
                    save(stage, fields(stage, True), last=True)
                break
            width = int(allm[:, n + 1].max())
            incr_g = allm[:, :n].reshape(P)
            logw_g, logz_g, ess = island_weights_step(logw_g, logz_g, incr_g, I, m)
            need = (ess < smc.ess_threshold * m).nonzero().squeeze(1).tolist()
            if need:
                ts = time.perf_counter()
                anc = island_ancestors(logw_g, need, m, resample_fn, seed_i, stage)
                timing["received"] += move_particles(grower, state, anc, width, backend, method)
                n_resample += len(need)
                if grower.table.needs_compaction():
                    grower.table.compact(grower.open_uids(state))
                timing["resample_seconds"] += time.perf_counter() - ts
                timing["resample_steps"] += 1
            report(stage, ess, logz_g, I, need, n_pairs, distinct)
            if ck.enabled:
                save(stage, fields(stage + 1, False))
            stage += 1
        else:
            raise RuntimeError(f"TopDownSMC did not finish within max_stages={smc.max_stages}")
        n_stages = stage
        width = int(backend.all_reduce(torch.tensor([int(state.n_nodes.max())], dtype=torch.int64), "max").item())
    # ------------------------------------------------------------------ the global posterior
    width = max(width, 1)
    trees = gather_trees(grower, state, backend, width)
    info = {
        "n_stages": n_stages,
        "n_resample": n_resample,
        "seconds": time.perf_counter() - t0,
        "world_size": W,
        "rank": r,
        "layout": layout,
        "redistribution": method,
        # this rank's: time in resampling (incl. moving particles), steps, particles received
        "resample_seconds": timing["resample_seconds"],
        "resample_steps": timing["resample_steps"],
        "particles_received": timing["received"],
    }
    info = {"sampler": "TopDownSMC", "proposal": smc.proposal, "expansion": smc.expansion, **info}
    post = island_posterior(trees, logw_g, logz_g, lik, data, info)
    mon.on_end({"log_evidence": post.log_evidence, "seconds": info["seconds"], "n_stages": n_stages,
                "posterior": post})
    return post
