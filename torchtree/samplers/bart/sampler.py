"""``BART``: the sampler of :mod:`torchtree.samplers.bart` (see the package for the method), its compiled tree update and ``backfit_sweep``."""
from __future__ import annotations

from functools import partial
from typing import Any, Dict, Optional, Tuple

import numpy as np
import torch

from torchtree.core.memory import check_memory
from torchtree.core.random import derive_seed, keyed_uniform
from torchtree.model.bart import ABSENT, LEAF, BartPrior, CutGrid, heap_depth, mnp_offsets
from torchtree.model.bart_posterior import BARTPosterior
from torchtree.model.diagnostics import warn_if_unconverged
from torchtree.samplers import driver
from torchtree.samplers.base import SamplerBase
from torchtree.kernels import native
from torchtree.kernels.native import available as native_ok
from torchtree.kernels.native import cuda_available as cuda_ok
from torchtree.steps.bart_moves import (draw_latent, draw_sigma, draw_utilities, gfr_sweep_native, sweep_native,
                                       tree_update, tree_update_native, warm_tables)

import torchtree.samplers.bart.graph as sweep_graph
from torchtree.samplers.bart.mixing import (cat_chains, diagnostics, gather_traces, kept_sweeps, run_traces, traced_f,
                                            traced_rows, traces_out, window)
from torchtree.samplers.bart.config import GFR_WARMUP, ROOT_WARMUP, BARTConfig, Stream, default_gfr_sweeps
from torchtree.samplers.bart.checks import restored_state
from torchtree.samplers.bart.state import COMPACT_EVERY, BARTSetup, BARTState
from torchtree.core.warn import warn

__all__ = ["BART", "backfit_sweep"]


_GAMMA_TRIES = 16
#: tree updates in a run from which ``compile="auto"`` takes torch.compile (its one-time cost pays off)
COMPILE_MIN_UPDATES = 40_000
_COMPILED = {}


def _compiled(key: str, fn):
    """``fn`` through torch.compile, made once per process and kept under ``key`` (the number
    of points is marked symbolic at each call: one graph for every data size); None where
    torch.compile is unavailable or has failed before."""
    if key not in _COMPILED:
        try:
            _COMPILED[key] = torch.compile(fn, dynamic=False)
        except Exception:  # pragma: no cover - torch builds without dynamo
            _COMPILED[key] = None
    return _COMPILED[key]


def _compiled_pg_level(d: int):
    """:func:`~torchtree.steps.bart_pg.pg_level` for level ``d``, compiled (one graph per level),
    falling back to eager like :func:`_update`."""
    from torchtree.steps.bart_pg import pg_level

    return _pg_level_guarded if _compiled("pg", pg_level) is not None else pg_level


def _pg_level_guarded(*args):
    from torchtree.steps.bart_pg import pg_level

    return _compiled_or_eager("pg", pg_level, args)


def _compiled_or_eager(key: str, eager, args):
    """``_COMPILED[key](*args)``, or ``eager(*args)`` when there is none; a compilation failure falls back to
    eager execution for the rest of the process, with a warning (the eager code computes the same)."""
    fn = _COMPILED.get(key)
    if fn is None:
        return eager(*args)
    try:
        return fn(*args)
    except Exception as exc:  # compiler missing or failing
        warn(f"BART: torch.compile failed ({type(exc).__name__}: {exc}); running eagerly", RuntimeWarning)
        _COMPILED[key] = None
        return eager(*args)


def _update(ctx, *args):
    """One tree update, compiled where the run asked for it; a compilation failure falls back
    to eager execution for the rest of the process, with a warning."""
    update_fn = ctx.setup.update_fn
    if update_fn is tree_update_native:
        return tree_update_native(*args)
    if update_fn is tree_update or _COMPILED.get("fn") is None:  # eager asked for, or a failed compile
        return tree_update(*args)
    # views of one tree in a sweep's tensors sit at storage offset 0 (the first tree) or beyond, which the
    # compiled function would specialise on (two graphs): it is handed offset-free copies (a tree's worth)
    args = tuple(a.clone() if isinstance(a, torch.Tensor) and a.storage_offset() else a for a in args)
    leaf_of, resid, Xb = args[4], args[5], args[6]
    for t in (leaf_of, resid, Xb):
        torch._dynamo.maybe_mark_dynamic(t, 1)
    return _compiled_or_eager("fn", tree_update, args)


_STREAMS = 8  # random streams per sweep (``Stream``'s first five; sweep ``it`` uses ``it * _STREAMS + stream``)


class BART(SamplerBase):
    """Bayesian additive regression trees (Chipman, George & McCulloch 2010), batched over chains.

    Parameters
    ----------
    backend : Backend or name, optional; chains are split over its ranks
    **settings : the fields of :class:`BARTConfig`
    """

    name = "BART"
    config_class = BARTConfig

    def __init__(self, *, backend=None, **settings: Any) -> None:
        self.config = BARTConfig.of(self.name, **settings)
        self.backend = backend

    def run(self, data: Any, *, seed: int | torch.Generator | None = None, monitor: Any = None,
            backend: Any = None) -> BARTPosterior:
        """Sample the posterior of the sum of trees.

        Parameters
        ----------
        data : Data or (X, y); regression, or classification (binary probit for two classes,
            multinomial probit with a forest per class but the first for more). A tuple is
            ``Data(X, y)``, whose task defaults to classification: pass
            ``Data(X, y, task="regression")`` for a real-valued or count target
        seed : int, torch.Generator or None
        monitor : Monitor(s); receives ``bart/sigma``, ``bart/accept``, ``bart/accept/<move>``,
            ``trees/leaves_mean``, ``bart/splits/x<d>`` (splits on feature ``d`` in the current
            trees) and ``time/seconds`` every ``monitor_every`` sweeps
        backend : Backend or name, optional

        Returns
        -------
        BARTPosterior over the kept sweeps of every chain.
        """
        return driver.run(self, data, seed=seed, monitor=monitor, backend=self.backend if backend is None else backend)

    # ------------------------------------------------------------ protocol
    def setup(self, ctx: driver.RunContext) -> "BARTSetup":
        """The prior calibrated on the data, the cut grid, the bins, this rank's chains."""
        c, data = self.config, ctx.data
        U = data.n_classes - 1 if data.task == "classification" and data.n_classes > 2 else 1
        ps = {"alpha_split": 0.95 if c.alpha_split is None else c.alpha_split,
              "beta_split": 2.0 if c.beta_split is None else c.beta_split}
        # K >= 3 classes: the prior of each utility's forest is binary probit's (offset unused, see offsets)
        y_prior = data.y if U == 1 else (data.y > 0).long()
        prior = BartPrior.from_data(data.X, y_prior, data.task, c.n_trees, k=c.k, nu=c.nu, q=c.q,
                                    sigma_hat=c.sigma_hat, max_depth=c.max_depth, **ps)
        grid = CutGrid.from_data(data, c.max_cuts)
        W = ctx.world_size
        if c.n_chains % W:
            raise ValueError(f"n_chains ({c.n_chains}) must be a multiple of the number of ranks ({W})")
        n_local = c.n_chains // W
        dt = torch.float32 if c.dtype == "float32" else torch.float64
        # per tree and chain: the heap's feature / cut (int16) and values, each point's leaf (int16) (twice with
        # compile="graph": the recorded sweep's own copy), and the kept draws' copies of the heap; refused before
        # any of it is allocated
        slot = 2 + 2 + (4 if dt == torch.float32 else 8)
        copies = 2 if c.compile == "graph" else 1
        per_tree = prior.n_slots * slot * (copies + c.kept_cap()) + copies * 2 * data.n
        forests = f"{n_local} chains" if U == 1 else f"{n_local} chains x {U} class utilities"
        check_memory(f"BART with {c.n_trees} trees x {forests} ({c.kept_cap()} kept draws of "
                     f"{prior.n_slots}-slot trees)", float(c.n_trees) * n_local * U * per_tree,
                     "n_trees, n_chains, n_samples or max_samples (or max_depth)", device=ctx.device)
        y = data.y.to(torch.float64)
        target = (y - prior.offset) / prior.scale if data.task == "regression" else y
        cpu = ctx.device.type == "cpu"
        native = c.bart_sampler == "mcmc" and (cpu and (c.compile == "native" or (c.compile == "auto" and native_ok()))
                                               or ctx.device.type == "cuda" and c.compile in ("native", "auto")
                                               and cuda_ok())
        n_gfr = 0 if not native else c.n_gfr if c.n_gfr is not None else default_gfr_sweeps(
            data.n, data.d, int(grid.n_cuts.sum()))
        n_warmup = c.n_warmup if c.n_warmup is not None else GFR_WARMUP if n_gfr else ROOT_WARMUP
        n_gfr = min(n_gfr, n_warmup)
        updates = c.n_trees * (n_warmup + c.n_samples * c.thin)
        want = c.compile in ("on", "graph") or (c.compile == "auto" and cpu and updates >= COMPILE_MIN_UPDATES)
        update_fn = tree_update_native if native else (_compiled("fn", tree_update) or tree_update) if want else tree_update
        if update_fn is not tree_update_native and update_fn is not tree_update:  # compiled: one graph from the start
            warm_tables(prior, n_local * U, prior.n_slots, ctx.device)
        chains = torch.arange(ctx.rank * n_local, (ctx.rank + 1) * n_local, device=ctx.device)
        Xb, n_cuts = grid.bins(data.X).to(ctx.device), grid.n_cuts.to(ctx.device)
        groups = None if data.groups is None else data.groups.to(ctx.device)
        graph = None
        if c.compile == "graph":
            if c.bart_sampler != "mcmc" or (ctx.device.type != "cuda" and sweep_graph.GRAPH is sweep_graph.CudaGraph):
                raise ValueError(f"compile='graph' records backfitting MCMC sweeps as CUDA graphs: it needs "
                                 f"bart_sampler='mcmc' and a CUDA device (this run: bart_sampler="
                                 f"'{c.bart_sampler}', device '{ctx.device}')")
            graph = sweep_graph.SweepGraph()
        return BARTSetup(update_fn=update_fn, graph=graph, n_warmup=n_warmup, n_gfr=n_gfr,
                         pg_level_fn=_compiled_pg_level if want else None, prior=prior, grid=grid,
                         Xb=Xb, n_cuts=n_cuts, dt=dt,
                         target=target.to(dt), chains=chains, n_utilities=U,
                         instances=(chains[:, None] * U + torch.arange(U, device=ctx.device)).reshape(-1),
                         offsets=mnp_offsets(data.y, data.n_classes) if U > 1 else None,
                         groups=groups, f_rows=traced_rows(data.n, ctx.device))

    def settings(self, ctx: driver.RunContext) -> Dict[str, Any]:
        return {"prior": ctx.setup.prior.to_dict(), "task": ctx.data.task}

    def start_info(self, ctx: driver.RunContext) -> Dict[str, Any]:
        c = self.config
        return {"n_trees": c.n_trees, "n_chains": c.n_chains, "bart_sampler": c.bart_sampler, "n": ctx.data.n,
                "d": ctx.data.d, "n_utilities": ctx.setup.n_utilities,
                # sweeps to expect, a progress bar's length: with min_ess, the most the run may take
                "total": ctx.setup.n_warmup + c.kept_cap() * c.thin}

    def n_iterations(self, ctx: driver.RunContext) -> int:
        """Sweeps per chain: ``n_warmup + n_samples * thin`` (``n_warmup`` as resolved for the run); with
        ``min_ess``, the fewest (see :meth:`finished`)."""
        return ctx.setup.n_warmup + self.config.n_samples * self.config.thin

    def finished(self, state: BARTState, ctx: driver.RunContext, kept_now: bool) -> bool:
        """Whether the run ends after the sweep that brought ``state`` (``kept_now``: that sweep was kept).

        Without ``min_ess``, after :meth:`n_iterations` sweeps. With it, the run goes on past them and
        decides at every ``n_samples``-th kept sweep: it ends when :meth:`_window` finds the kept sweeps within
        the limits, or when ``BARTConfig.kept_cap`` sweeps are kept. The rule reads only the draws, so a seed
        gives the same run length everywhere, and a resumed run decides as the uninterrupted one; on several
        ranks every rank decides on all chains (one gather per decision)."""
        c = self.config
        if state.step < self.n_iterations(ctx):
            return False
        if c.min_ess is None:
            return True
        S = len(state.kept)
        if not kept_now or (S % c.n_samples and S < c.kept_cap()):  # a cap off the blocks stops there too
            return False
        if S >= c.kept_cap():
            return True
        sig, leaves, f = run_traces(state)
        if ctx.world_size > 1:
            sig, leaves, f = gather_traces(ctx.backend, sig, leaves, f)
        return self._window(ctx, sig, leaves, f)[2]

    def _window(self, ctx: driver.RunContext, sig: torch.Tensor, leaves: torch.Tensor, f: torch.Tensor):
        """:func:`~torchtree.samplers.bart.mixing.window` with this run's settings."""
        c = self.config
        return window(sig, leaves, f, ctx.setup.n_warmup, c.thin, c.n_samples, c.max_rhat, c.min_ess,
                      ctx.setup.prior.task == "regression", ctx.setup.n_utilities)

    def init(self, ctx: driver.RunContext) -> BARTState:
        """Every tree a single leaf of value 0; sigma at its prior guess; probit latents drawn."""
        c, prior, dev = self.config, ctx.setup.prior, ctx.device
        inst, U = ctx.setup.instances, ctx.setup.n_utilities
        C, T, N, K = inst.numel(), c.n_trees, ctx.data.n, prior.n_slots
        feature = torch.full((T, C, K), ABSENT, dtype=torch.int16, device=dev)
        feature[:, :, 0] = LEAF
        target = ctx.setup.target
        latent = torch.zeros(0, device=dev, dtype=ctx.setup.dt)
        if ctx.data.task == "classification":
            u = keyed_uniform(derive_seed(ctx.seed, Stream.INITIAL_LATENTS), 0, inst[:, None] * N
                              + torch.arange(N, device=dev)[None, :])
            if U == 1:
                latent = draw_latent(torch.full((C, N), prior.offset, dtype=torch.float64, device=dev),
                                     target.bool(), u).to(ctx.setup.dt)
                resid = latent - prior.offset
            else:  # one Gibbs sweep over the utilities from their means (the offsets: every tree is 0)
                fit = ctx.setup.offsets.to(dev)[None, :, None].expand(C // U, U, N)
                latent = draw_utilities(fit, fit, target.long(), u.view(C // U, U, N)).reshape(C, N).to(ctx.setup.dt)
                resid = latent - fit.reshape(C, N).to(latent.dtype)
        else:
            resid = target[None, :].expand(C, N).clone()
        return BARTState(step=0, done=False, feature=feature, cut=torch.zeros_like(feature),
                         value=torch.zeros(T, C, K, dtype=ctx.setup.dt, device=dev),
                         leaf_of=torch.zeros(T, C, N, dtype=torch.int16, device=dev), resid=resid,
                         sigma2=torch.full((C,), prior.sigma_hat ** 2 if prior.task == "regression" else 1.0,
                                           dtype=torch.float64, device=dev),
                         latent=latent, counts=torch.zeros(2, 3, dtype=torch.long, device=dev), kept=[], kept_sigma=[],
                         trace_leaves=[], kept_f=[])

    def growable_settings(self) -> Tuple[str, ...]:
        """``n_samples`` (without ``min_ess``, whose decisions fall every ``n_samples`` kept sweeps): a checkpoint's
        run, finished or not, resumes with a larger one, and its kept sweeps are those of one run of that length
        (a sweep's random numbers depend on its index alone)."""
        return ("n_samples",) if self.config.min_ess is None else ()

    def restore(self, saved: Dict[str, Any], ctx: driver.RunContext) -> BARTState:
        state = restored_state(saved, ctx, self.config)  # checked against the run: the kernels index with it
        c = self.config
        if c.min_ess is None:  # n_samples may have grown (growable_settings); it may not shrink
            if len(state.kept) > c.n_samples:
                raise ValueError(f"{c.checkpoint}: this run has kept {len(state.kept)} sweeps per chain, more than "
                                 f"n_samples={c.n_samples}; a run resumes with as many kept sweeps or more "
                                 f"(n_samples >= {len(state.kept)}), or give another checkpoint path")
            state.done = state.step >= self.n_iterations(ctx)
        dev = ctx.device
        state.kept = [tuple(t.to(dev) for t in k) for k in state.kept]
        state.kept_sigma = [s.to(dev) for s in state.kept_sigma]
        state.trace_leaves = [t.to(dev) for t in state.trace_leaves]
        state.kept_f = [t.to(dev) for t in state.kept_f]
        state.counts = state.counts.to(dev)
        return state

    def step(self, state: BARTState, ctx: driver.RunContext):
        """One sweep over the trees, then sigma (or the latents); keeps the sweep after warm-up."""
        c, prior = self.config, ctx.setup.prior
        T, C, K = state.feature.shape
        N = ctx.data.n
        it = state.step
        dev = ctx.device
        gidx, U = ctx.setup.instances, ctx.setup.n_utilities
        tree_chain = torch.arange(T, device=dev)[:, None] * (c.n_chains * U) + gidx[None, :]  # [T, C] global keys
        base = it * _STREAMS
        Xb, n_cuts, use = ctx.setup.Xb, ctx.setup.n_cuts, c.use_likelihood
        feature, cut, value, leaf_of = state.feature, state.cut, state.value, state.leaf_of
        gfr = it < ctx.setup.n_gfr
        if gfr:  # a grow-from-root sweep opens the warm-up (XBART's warm start)
            # each node's uniform (stream GROW_FROM_ROOT) and each leaf's normal (LEAVES), slot by slot, drawn in the
            # kernel where a node or leaf uses one
            keyed = (derive_seed(ctx.seed, base + Stream.GROW_FROM_ROOT), derive_seed(ctx.seed, base + Stream.LEAVES),
                     tree_chain)
            gfr = gfr_sweep_native(prior, feature, cut, value, leaf_of, state.resid, Xb, n_cuts, state.sigma2, None, None,
                                   use, ctx.setup.groups, keyed=keyed, max_bins=ctx.setup.grid.cuts.shape[1] + 1)
            resid, moves = state.resid, torch.zeros(2, 3, dtype=torch.long, device=dev)
        if gfr:
            pass
        elif c.bart_sampler == "mcmc":
            update = tree_update_native if ctx.setup.update_fn is tree_update_native else (lambda *a: _update(ctx, *a))
            resid, moves = backfit_sweep(prior, feature, cut, value, leaf_of, state.resid, Xb, n_cuts, state.sigma2,
                                         ctx.seed, base, tree_chain, use, update, ctx.setup.groups, state.forest_stats,
                                         ctx.setup.graph)
        else:
            from torchtree.steps.bart_pg import pg_tree_update

            Z = _leaf_normals(ctx.seed, base, tree_chain, K, K)
            resid, moves = state.resid, torch.zeros(2, 3, dtype=torch.long, device=dev)
            for t in range(T):
                f, k, v, L, resid = pg_tree_update(
                    prior, feature[t].long(), cut[t].long(), value[t], leaf_of[t].long(), resid, Xb, n_cuts,
                    state.sigma2, Z[t].to(value.dtype), c.n_pg_particles, ctx.seed, base + Stream.PARTICLE_GIBBS, tree_chain[t], use,
                    level_fn=ctx.setup.pg_level_fn, groups=ctx.setup.groups)
                feature[t], cut[t], value[t], leaf_of[t] = f.to(torch.int16), k.to(torch.int16), v, L
        sigma2, latent = state.sigma2, state.latent
        if prior.task == "regression":
            u = keyed_uniform(ctx.seed, base + Stream.SIGMA, gidx[:, None, None],
                              torch.arange(2 * _GAMMA_TRIES, device=dev).view(_GAMMA_TRIES, 2))
            sigma2 = draw_sigma(prior, resid if use else resid[:, :0], u)  # no data: a draw from its prior
        elif prior.task == "classification" and use:
            u = keyed_uniform(ctx.seed, base + Stream.LATENTS, gidx[:, None] * N + torch.arange(N, device=dev)[None, :])
            fit = latent.double() - resid.double()  # offset + sum of trees
            if U == 1:
                new = draw_latent(fit, ctx.setup.target.bool(), u).to(latent.dtype)
            else:
                shape = (C // U, U, N)
                new = draw_utilities(fit.view(shape), latent.view(shape), ctx.setup.target.long(), u.view(shape))
                new = new.reshape(C, N)
            resid = resid + (new - latent)
            latent = new
        # no host synchronisation between here and the monitor: counts and traces stay on the device, and the
        # kept sweeps are trimmed to their deepest slot in groups of COMPACT_EVERY (one read of the depths each)
        counts = state.counts + moves
        state.sigma2, state.latent, state.resid, state.counts = sigma2, latent, resid, counts
        stats = _forest_stats(feature) if ctx.setup.update_fn is tree_update_native else None
        state.forest_stats = stats  # the next sweep starts from these trees
        leaves = stats[:C] if stats is not None else (feature == LEAF).sum(2).double().mean(0)  # [C]
        state.trace_leaves.append(leaves)
        state.step = it + 1
        n_warmup = ctx.setup.n_warmup
        keep = it >= n_warmup and (it - n_warmup) % c.thin == c.thin - 1
        if keep:
            # on the CPU the summary gives the width at once: the complete levels down to the deepest node
            width = (1 << (int(stats[-1]) + 1)) - 1 if stats is not None else None
            state.kept.append(_kept(feature, cut, value, width))
            state.kept_sigma.append(sigma2.clone())
            state.kept_f.append(traced_f(ctx.setup, latent, resid))
            if len(state.kept) % COMPACT_EVERY == 0:
                _compact(state.kept, len(state.kept) - COMPACT_EVERY)
        state.done = self.finished(state, ctx, keep)
        if not ctx.watch or (state.step % c.monitor_every and not state.done):
            return state, None
        info = {}
        if c.bart_sampler == "mcmc":
            pr, ac = counts.tolist()
            info = {f"bart/accept/{m}": (a / p if p else float("nan"))
                    for m, p, a in zip(("grow", "prune", "change"), pr, ac)}
            info["bart/accept"] = sum(ac) / max(sum(pr), 1)
        if prior.task == "regression":
            info["bart/sigma"] = float(sigma2.sqrt().mean()) * prior.scale
        info["trees/leaves_mean"] = float(leaves.mean())
        inner = feature[feature >= 0].long()
        split_counts = torch.bincount(inner, minlength=ctx.data.d).cpu().tolist()  # this rank's chains, this sweep
        info.update({f"bart/splits/x{d}": n for d, n in enumerate(split_counts)})
        info["time/seconds"] = ctx.seconds()
        return state, info

    def finalize(self, state: BARTState, ctx: driver.RunContext) -> BARTPosterior:
        """The kept sweeps of every chain (draw-major, then global chain) as a posterior."""
        c, prior, dev = self.config, ctx.setup.prior, ctx.device
        T, C, K = state.feature.shape
        S = len(state.kept)
        in_warmup = S == 0
        if in_warmup:  # a time budget ended the run in warm-up: keep the last sweep, and say so
            state.kept.append(_kept(state.feature, state.cut, state.value))
            state.kept_sigma.append(state.sigma2.clone())
            state.kept_f.append(traced_f(ctx.setup, state.latent, state.resid))
            S = 1
            warn(f"BART: max_seconds={c.max_seconds:g} ran out in warm-up, after {int(state.step)} of "
                 f"{ctx.setup.n_warmup} warm-up sweeps: the posterior is each chain's last sweep, which has not "
                 "converged. Raise max_seconds, or lower n_warmup", UserWarning)
        elif S < 4 and c.max_seconds is not None and S < c.kept_cap():
            warn(f"BART: max_seconds={c.max_seconds:g} ran out after {S} kept sweep(s) per chain, too few to judge "
                 "convergence; raise max_seconds", UserWarning)
        elif ctx.stopped_by_budget and c.min_ess is None and S < c.n_samples:
            warn(f"BART: max_seconds={c.max_seconds:g} ran out after {S} of n_samples={c.n_samples} kept sweeps per "
                 "chain: the posterior holds those (info['stopped_by']). Raise max_seconds, or resume from a "
                 "checkpoint", UserWarning)
        _compact(state.kept, S - S % COMPACT_EVERY)  # the last, incomplete group
        width = max(k[0].shape[-1] for k in state.kept)
        feat = torch.stack([_pad(k[0], width, ABSENT) for k in state.kept])  # [S, C, T, K']
        cut = torch.stack([_pad(k[1], width, 0) for k in state.kept])
        val = torch.stack([_pad(k[2], width, 0) for k in state.kept])
        sig, leaves, f_rows = run_traces(state)  # [S, C], [C, sweeps], [S, C, R]
        counts = state.counts
        if ctx.world_size > 1:
            feat, cut, val, sig, leaves, f_rows, counts = _gather(ctx, feat, cut, val, sig, leaves, f_rows, counts, width)
        n_warmup, converged = (int(state.step) if in_warmup else ctx.setup.n_warmup), None
        # the sweeps kept (a budget's stop can leave a few unkept ones after the last; in warm-up, the last sweep)
        kept = np.array([int(state.step) - 1]) if in_warmup else kept_sweeps(n_warmup, c.thin, S)
        U = ctx.setup.n_utilities
        if c.min_ess is not None:  # the window the run was judged on: its first kept sweeps may join the warm-up
            drop, mixing, converged = self._window(ctx, sig, leaves, f_rows)
            feat, cut, val, sig, f_rows = feat[drop:], cut[drop:], val[drop:], sig[drop:], f_rows[drop:]
            S, n_warmup, kept = S - drop, n_warmup + drop * c.thin, kept[drop:]
        else:
            mixing = diagnostics(sig, leaves, f_rows, kept, prior.task == "regression", U)
        Cg = feat.shape[1]
        feat = feat.reshape(S * Cg, T, -1)
        cut, val = cut.reshape(S * Cg, T, -1), val.reshape(S * Cg, T, -1)
        sig_flat = sig.reshape(-1).sqrt()
        pr, ac = counts.tolist()
        info = {"sampler": self.name, "bart_sampler": c.bart_sampler, "n_trees": c.n_trees, "n_chains": c.n_chains,
                "n_samples": S, "n_warmup": n_warmup, "n_gfr": ctx.setup.n_gfr, "thin": c.thin,
                "world_size": ctx.world_size, "sweeps": int(state.step), "seconds": ctx.seconds(),
                "prior": prior.to_dict(), **mixing,
                "trace": traces_out(sig, leaves, f_rows, prior, U), "kept_sweeps": kept.tolist(),
                "f_rows": ctx.setup.f_rows.tolist()}
        if c.bart_sampler == "mcmc":
            info.update({f"accept/{m}": (a / p if p else float("nan")) for m, p, a in zip(("grow", "prune", "change"), pr, ac)})
            info["accept/all"] = sum(ac) / max(sum(pr), 1)
        f_note = (f" (f: the sum of trees at {len(info['f_rows'])} training rows, its R-hat the 90% quantile over "
                  "them, its ESS the 10% quantile)")
        if c.min_ess is None:
            warn_if_unconverged(info, S, "Run longer chains (n_warmup, n_samples), more of them (n_chains), or until "
                                "converged (min_ess)" + f_note)
        else:
            info["converged"] = converged
            kept = len(state.kept)
            warn_if_unconverged(info, S, f"The run stopped at {kept} kept sweeps per chain (max_samples "
                                f"{c.kept_cap()}{'' if kept >= c.kept_cap() else ', or its time budget'}): raise "
                                "max_samples, or n_warmup" + f_note, c.max_rhat, c.min_ess)
        chain_of = torch.arange(Cg).repeat(S) // U  # each forest's chain
        if U > 1:
            info["n_utilities"] = U
        return BARTPosterior(prior, ctx.setup.grid, feat.to(dev), cut.to(dev), val.to(dev), sig_flat.to(dev),
                             chain_of, ctx.data.d, classes=ctx.data.classes_, info=info, n_utilities=U,
                             offsets=ctx.setup.offsets)

    def end_info(self, post: BARTPosterior) -> Dict[str, Any]:
        return {k: v for k, v in post.info.items() if k.startswith(("accept", "rhat", "ess"))}


def _may_sync(device: torch.device) -> bool:
    """Whether a sweep may read a value back to the host (free on the CPU; a stall of the queue elsewhere)."""
    return device.type == "cpu"


def _forest_stats(feature: torch.Tensor):
    """``[C + 1]`` float64 of the trees ``[T, C, K]``: each chain's mean leaves per tree, then the deepest
    node's depth, by one compiled pass (``forest_stats``); None off the CPU or without the kernels."""
    op = native.op("forest_stats") if feature.device.type == "cpu" and feature.dtype == torch.int16 else None
    return op(feature) if op is not None else None


def _leaf_normals(seed: int, base: int, tree_chain: torch.Tensor, K: int, Kz: int) -> torch.Tensor:
    """Standard normals ``[T, C, K]`` for the leaf values, keyed by (sweep, tree, chain, slot);
    slots from ``Kz`` on are 0 (no leaf can be there this sweep)."""
    T, C = tree_chain.shape
    Z = torch.zeros(T, C, K, dtype=torch.float64, device=tree_chain.device)
    Z[..., :Kz] = torch.special.ndtri(keyed_uniform(seed, base + Stream.LEAVES, tree_chain[..., None],
                                                    torch.arange(Kz, device=tree_chain.device)))
    return Z


def backfit_sweep(prior: BartPrior, feature, cut, value, leaf_of, resid, Xb, n_cuts, sigma2, seed: int, base: int,
                  tree_chain: torch.Tensor, use_likelihood: bool = True, update=tree_update, groups=None, stats=None,
                  graph=None):
    """One Bayesian-backfitting sweep: every tree in turn redrawn on its partial residual.

    Parameters
    ----------
    feature, cut : Int16Tensor [T, C, K]
    value : Tensor [T, C, K]
    leaf_of : Int16Tensor [T, C, N]
        the chains' trees, updated in place
    resid : Tensor [C, N] the response minus the sum of trees
    sigma2 : Tensor [C] float64
    seed, base : the keyed random streams of this sweep (``base + Stream.MOVES`` moves, ``base + Stream.LEAVES`` leaves)
    tree_chain : LongTensor [T, C] global (tree, chain) keys
    update : the tree update (:func:`~torchtree.steps.bart_moves.tree_update` or its compiled form)
    groups : LongTensor [D], optional, the input column of each feature of a coded table
    stats : Tensor [C + 1], optional, ``forest_stats`` of these trees if known (saves recomputing them)
    graph : :class:`~torchtree.samplers.bart.graph.SweepGraph`, optional: the tree updates replayed from
        a recorded CUDA graph (``compile="graph"``)

    Returns
    -------
    resid : Tensor [C, N]
    moves : LongTensor [2, 3] proposed / accepted grow, prune, change.
    """
    T, C, K = feature.shape
    dev = resid.device
    U = keyed_uniform(seed, base + Stream.MOVES, tree_chain[..., None], torch.arange(5, device=dev))
    # a grow deepens a tree by one level at most, so slots below the deepest node's children are never
    # leaves in this sweep; off the CPU every slot's normal is drawn instead of reading the depth (a host sync)
    if stats is None and update is tree_update_native:
        stats = _forest_stats(feature)
    if stats is not None:
        deepest = int(stats[-1])
    elif _may_sync(dev):
        used = (feature != ABSENT).flatten(0, 1).any(0).nonzero()
        deepest = int(heap_depth(used.max())) if used.numel() else 0
    else:
        deepest = K
    if update is tree_update_native and all(x.is_contiguous() for x in (feature, cut, value, leaf_of, resid)):
        kz = min(K, (1 << (deepest + 2)) - 1)  # the leaves' normals drawn in the kernel, only where a leaf needs one
        counts = sweep_native(prior, feature, cut, value, leaf_of, resid, Xb, n_cuts, sigma2, U, None, use_likelihood,
                              groups, keyed_leaves=(derive_seed(seed, base + Stream.LEAVES), tree_chain, kz))
        if counts is not None:  # the whole sweep in one compiled call
            return resid, counts
    Z = _leaf_normals(seed, base, tree_chain, K, min(K, (1 << (deepest + 2)) - 1))
    loop = partial(tree_loop, prior, Xb, n_cuts, use_likelihood, update, groups)
    out = graph(loop, feature, cut, value, leaf_of, resid, sigma2, U, Z) if graph is not None else None
    return out if out is not None else loop(feature, cut, value, leaf_of, resid, sigma2, U, Z)


def tree_loop(prior: BartPrior, Xb, n_cuts, use_likelihood: bool, update, groups, feature, cut, value, leaf_of, resid,
              sigma2, U, Z):
    """:func:`backfit_sweep`'s tree updates with its uniforms ``U [T, C, 5]`` and leaf normals ``Z [T, C, K]``
    (the trees updated in place): the part of a sweep that :class:`~torchtree.samplers.bart.graph.SweepGraph`
    records. Returns ``(resid, moves)``."""
    T, C, _ = feature.shape
    moves = torch.zeros(2, 3, dtype=torch.long, device=resid.device)
    ones = torch.ones(C, dtype=torch.long, device=resid.device)
    for t in range(T):
        f, k, v, L, resid, (move, acc) = update(prior, feature[t].long(), cut[t].long(), value[t], leaf_of[t], resid,
                                                Xb, n_cuts, sigma2, U[t], Z[t].to(value.dtype), use_likelihood,
                                                *(() if groups is None else (groups,)))
        moves[0].index_add_(0, move, ones)
        moves[1].index_add_(0, move, acc.long())
        feature[t], cut[t], value[t], leaf_of[t] = f.to(torch.int16), k.to(torch.int16), v, L
    return resid, moves


def _kept(feature, cut, value, width: Optional[int] = None):
    """A copy of one sweep's trees ``[T, C, K]`` as a kept draw, ``[C, T, K']`` each: ``K' = width`` slots
    (no node lies beyond them), or full width until :func:`_compact` trims its group."""
    K = feature.shape[-1]
    w = K if width is None else min(K, width)
    return tuple(x[..., :w].transpose(0, 1).clone() for x in (feature, cut, value))


def _compact(kept: list, start: int) -> None:
    """Trim the kept sweeps ``kept[start:]`` (``[C, T, K]`` trees each) in place to ``K'`` slots, the
    complete levels down to the deepest node used in that sweep; one host read for all of them."""
    group = kept[max(start, 0):]
    if not group:
        return
    slots = [torch.arange(k[0].shape[-1], device=k[0].device) for k in group]
    tops = torch.stack([torch.where((k[0] != ABSENT).flatten(0, 1).any(0), s, 0).max() for k, s in zip(group, slots)])
    for i, top in enumerate(tops.tolist()):
        width = (1 << (top + 1).bit_length()) - 1  # heap slots of depth <= depth(top)
        kept[max(start, 0) + i] = tuple(x[..., :width].clone() if x.shape[-1] > width else x for x in group[i])


def _pad(t: torch.Tensor, width: int, fill) -> torch.Tensor:
    if t.shape[-1] == width:
        return t
    out = torch.full((*t.shape[:-1], width), fill, dtype=t.dtype, device=t.device)
    out[..., : t.shape[-1]] = t
    return out


def _gather(ctx, feat, cut, val, sig, leaves, f, counts, width):
    """Every rank's kept sweeps and traces, chains in global order (collective)."""
    be = ctx.backend
    w = int(be.all_reduce(torch.tensor([width], dtype=torch.int64), "max").item())
    feat, cut, val = _pad(feat, w, ABSENT), _pad(cut, w, 0), _pad(val, w, 0)

    feat = cat_chains(be, feat.long()).to(torch.int16)
    cut = cat_chains(be, cut.long()).to(torch.int16)
    val = cat_chains(be, val.double()).to(val.dtype)
    sig, leaves, f = gather_traces(be, sig, leaves, f)
    counts = be.all_reduce(counts.cpu(), "sum")
    return feat, cut, val, sig, leaves, f, counts
