"""``MCMC``: the sampler of :mod:`torchtree.samplers.mcmc` (see the package for the method)."""
from __future__ import annotations

import math
from typing import Any, Dict, Optional, Tuple

import numpy as np
import torch

from torchtree.core.memory import check_tree_memory

from torchtree.core.random import derive_seed, keyed_uniform
from torchtree.distributed import BlockLayout
from torchtree.model.diagnostics import chain_ess, rhat, warn_if_unconverged  # noqa: F401  (rhat, chain_ess re-exported)
from torchtree.model.posterior import TreePosterior
from torchtree.model.priors import ALPHA_SPLIT, BETA_SPLIT, POISSON_LAMBDA, make_prior
from torchtree.model.trees import HardTrees
from torchtree.samplers import driver
from torchtree.samplers.driver import describe, leaf_likelihood
from torchtree.samplers.tuning.starts import topdown_draws
from torchtree.samplers.base import SamplerBase
from torchtree.steps.host_moves import HostChain, host_trees
from torchtree.steps.moves import (MOVES, N_SLOTS, TreeModel, TreeState, draw_moves, propose, sample_prior_state, snapshot_trees)

from torchtree.io.checkpoint import CheckpointError
from torchtree.samplers.mcmc.config import MCMCConfig, Stream, host_is_cheaper
from torchtree.samplers.mcmc.checks import restored_state
from torchtree.samplers.mcmc.state import MCMCSetup, MCMCState, HostMCMCState, HostRecord

__all__ = ["MCMC"]


_BLOCK = 512  # iterations whose uniforms are drawn in one call


class MCMC(SamplerBase):
    """Chipman et al. (1998) Metropolis-Hastings sampler, many chains as one batch.

    Parameters
    ----------
    prior : ChipmanPrior, PoissonPrior, "chipman" or "poisson", optional
        Default ``ChipmanPrior(alpha_split, beta_split)``.
    likelihood : DirichletMultinomial, NormalInverseGamma or another leaf likelihood, optional
        Default from the data (Dirichlet-multinomial alpha=5, or data-scaled NIG).
        Any object with the hooks of :class:`~torchtree.model.likelihood_protocol.LeafLikelihood`; a run
        refuses one without them (``TypeError`` naming the missing hooks).
    alpha_split, beta_split, poisson_lambda : float
        Prior hyperparameters when ``prior`` is given by name.
    backend : torchtree.distributed.Backend or str, optional
        Multi-rank runs: each of the ``W`` ranks runs ``n_chains / W`` chains (global chain
        indices ``rank * n_chains / W + i`` key their random numbers), and every rank returns
        the global posterior, the same as a one-process run with the same seed. Needs the
        batched engine; monitors see rank 0's chains.
    **settings
        The settings of :class:`~torchtree.samplers.mcmc.config.MCMCConfig` by name
        (``n_chains``, ``n_samples``, ``n_warmup``, ``thin``, ``move_probs``, ``init``, ``keep``,
        ``engine``, ``cut_proposal``, ``max_bins``, ``checkpoint``, ...). Their defaults,
        allowed values and meanings are its option table: the API reference renders it,
        ``torchtree fit --method mcmc --help`` prints it, ``MCMCConfig.options()`` returns it.

    Notes
    -----
    Settings whose effect needs more than the table's line:

    ``init="topdown"``
        Each chain starts at a weighted draw of a top-down SMC run on the same model (1000
        particles, settings by :func:`~torchtree.samplers.tuning.starts.start_settings`: more
        particles on wide classification tables). On large data chains from the root-only tree
        need far more iterations to grow trees of the posterior's size. The chains still target
        the same posterior.
    ``engine``
        ``"batched"`` runs all chains as one batch of tensor operations on the data's device;
        ``"host"`` runs each chain with numpy on the CPU, one after another (a chain is
        latency-bound; same moves, same random numbers, same chains). ``"auto"`` picks
        ``"host"`` on a numeric table with ``cut_proposal="prior"`` (the host engine takes
        neither missing values, categories nor the other cut proposals) for one chain, and for
        several on the CPU where :func:`~torchtree.samplers.mcmc.config.host_is_cheaper` finds
        them cheaper one by one than as a batch: a batched iteration is a fixed count of small
        tensor operations, so on small tables host chains cost less than their batch.
        Larger batches (more than ``HOST_MAX_CHAINS = 16`` chains) cost little per added chain and
        stay batched.
    ``cut_proposal``
        How grow / change moves draw a cut (:func:`torchtree.steps.moves.propose`): uniform on the
        node's data range as the prior draws it (``"prior"``), uniform among the gaps between
        consecutive distinct values and then uniform in the gap (``"data"``), or a cell of the
        range chosen by the likelihood of the split it makes (``"informed"``, see
        :class:`~torchtree.samplers.smc_moves.SMCSampler`). Same target: the MH ratio carries the
        proposal density ratio.
    ``max_bins``
        Ranks every feature of more than ``max_bins`` distinct values into at most ``max_bins``
        quantile bins and fits on them (:func:`torchtree.model.target.quantile_binned`): a change
        of the split prior (cuts uniform over the grid's range instead of the data's), and the
        returned thresholds of binned features are grid values. None: the data as given, the
        paper's model.
    ``checkpoint``
        When the file exists, :meth:`run` resumes from it and returns exactly what an
        uninterrupted run with the same seed returns on the same kind of device (the uniforms
        are keyed by seed, chain and iteration, so the chains' trees, the acceptance counters,
        the kept draws and the traces so far are the whole state). It is (re)written every
        ``checkpoint_every`` iterations (iterations ``k-1, 2k-1, ...``) and after the last one,
        so re-running a finished run returns its posterior at once. A checkpoint of another run
        (other data, settings, seed or engine) raises
        :class:`~torchtree.io.checkpoint.CheckpointError`. With ``seed=None`` the seed drawn by
        the first run is stored and reused. Every save holds all the draws kept so far: with
        many draws, save every few hundred iterations or more.
    """

    name = "MCMC"

    config_class = MCMCConfig

    def __init__(self, prior=None, likelihood=None, *, alpha_split: float = ALPHA_SPLIT,
                 beta_split: float = BETA_SPLIT, poisson_lambda: float = POISSON_LAMBDA, backend=None, **settings: Any) -> None:
        self.config = MCMCConfig.of(self.name, **settings)
        driver.check_backend(backend)
        self.backend = backend
        self.prior = make_prior(prior, alpha_split, beta_split, poisson_lambda)
        self.likelihood = likelihood


    @property
    def n_warmup(self) -> int:
        """Burn-in iterations per chain (the default resolved: ``n_samples * thin``)."""
        c = self.config
        return c.n_samples * c.thin if c.n_warmup is None else c.n_warmup

    @property
    def engine(self) -> str:
        """The engine setting, ``"batched"`` when the cut proposal needs it (the host engine
        implements ``cut_proposal="prior"`` only)."""
        c = self.config
        return "batched" if c.cut_proposal != "prior" else c.engine

    @property
    def n_iterations(self) -> int:
        """Iterations per chain: ``n_warmup + n_samples * thin``."""
        return self.n_warmup + self.config.n_samples * self.config.thin

    def run(self, data: Any, *, seed: int | torch.Generator | None = None, monitor: Any = None,
            backend: Any = None) -> TreePosterior:
        """Run the chains on ``data``.

        Parameters
        ----------
        data : Data, or a pair (X, y)
        seed : int or torch.Generator, optional (None: fresh randomness)
        monitor : Monitor or list of Monitors, optional
            Receives ``mcmc/accept/<move>`` (running acceptance rate per move type),
            ``mcmc/accept``, ``mcmc/log_posterior_mean``, ``trees/leaves_mean``,
            ``trees/depth_mean``, ``time/seconds`` every ``monitor_every`` iterations.
        backend : Backend or name, optional; default the one given at construction

        Returns
        -------
        TreePosterior
            Equal weights over kept draws x chains (identical trees merged);
            ``log_evidence`` is None. ``info`` holds acceptance rates, R-hat and ESS
            of the number of leaves and of the log posterior, iterations per second.
        """
        backend = self.backend if backend is None else backend
        return driver.run(self, data, seed=seed, monitor=monitor, backend=backend)

    # ------------------------------------------------------------ protocol
    def setup(self, ctx: driver.RunContext) -> "MCMCSetup":
        """The likelihood (default from the data), the target and the engine of this run."""
        lik = leaf_likelihood(self.likelihood, ctx.data)
        model = TreeModel(self.prior, lik, ctx.data, self.config.use_likelihood, self.config.max_bins)
        W, n_chains = ctx.world_size, self.config.n_chains
        if n_chains % W:
            raise ValueError(f"n_chains ({n_chains}) must be divisible by the number of ranks ({W}): every rank "
                             "runs n_chains / world_size chains")
        if W > 1 and self.engine == "host":
            raise ValueError("engine='host' runs its chains in one process; a multi-rank run needs "
                             "engine='batched' (or 'auto')")
        n_local = n_chains // W
        if model.groups is not None and self.engine == "host":
            raise ValueError("engine='host' takes numeric tables only; a table with missing values or categorical "
                             "columns runs on engine='batched' (or 'auto')")
        host = model.groups is None and (self.engine == "host" or (self.engine == "auto" and (n_chains == 1 or (
            W == 1 and ctx.device.type == "cpu" and host_is_cheaper(n_chains, ctx.data.n)))))
        check_tree_memory("MCMC", n_local, ctx.data, "n_chains (or n_samples)", n_stats=lik.n_stats(ctx.data),
                          kept_per_tree=0 if host else self.config.n_samples,
                          per_tree=0 if host else min(_BLOCK, self.n_iterations) * N_SLOTS * 8)  # a block of uniforms
        return MCMCSetup(likelihood=lik, model=model, host=host,
                         chains=torch.arange(ctx.rank * n_local, (ctx.rank + 1) * n_local))

    def settings(self, ctx: driver.RunContext) -> Dict[str, Any]:
        """What decides the result besides the config: the prior, the likelihood, the task."""
        return {"prior": describe(self.prior), "likelihood": describe(ctx.setup.likelihood), "task": ctx.data.task}

    def start_info(self, ctx: driver.RunContext) -> Dict[str, Any]:
        c = self.config
        info = {"n_chains": c.n_chains, "n_iterations": self.n_iterations, "total": self.n_iterations, "n_warmup": self.n_warmup, "thin": c.thin,
                "n": ctx.data.n, "d": ctx.data.d, "prior": repr(self.prior),
                "engine": "host" if ctx.setup.host else "batched"}
        if ctx.resumed_at is not None:
            info["resumed_at_iteration"] = ctx.resumed_at
        return info

    def init(self, ctx: driver.RunContext):
        """Every chain at the root-only tree or at a prior draw; nothing kept yet."""
        c, model = self.config, ctx.setup.model
        gidx = ctx.setup.chains
        if c.init == "prior":
            chains, _ = sample_prior_state(model, gidx.numel(), derive_seed(ctx.seed, Stream.PRIOR_START), index=gidx.to(ctx.device))
        elif c.init == "topdown":
            chains, _ = topdown_draws(model, gidx, derive_seed(ctx.seed, Stream.TOPDOWN_START), ctx=ctx)
        else:
            chains = TreeState.roots(model, gidx.numel())
        if ctx.setup.host:
            t = chains.trees.to("cpu")
            leaves = t.leaf_index(model.X.cpu()).numpy()
            records = []
            for p in range(t.n_trees):
                chain = HostChain(model, c.move_probs)
                chain.load(t.take(torch.tensor([p])), leaves[p])
                records.append(HostRecord.start(chain))
            return HostMCMCState(step=0, done=False, chains=records)
        zeros = torch.zeros(4, dtype=torch.long, device=ctx.device)
        return MCMCState(step=0, done=False, chains=chains, proposed=zeros, accepted=zeros.clone(), kept=[],
                         trace_leaves=[], trace_lp=[])

    def restore(self, saved: Dict[str, Any], ctx: driver.RunContext):
        """The state a checkpoint holds (refused when another engine wrote it)."""
        host, path = ctx.setup.host, self.config.checkpoint
        if host != ("chains" in saved or "chain" in saved):
            raise CheckpointError(f"{path}: the checkpoint holds {'batched' if host else 'host'} chains and this run "
                                  f"uses the {'host' if host else 'batched'} engine; pass the engine that wrote it "
                                  "(engine=) or delete the file")
        # checked against the run field by field: the moves and the compiled traversal index with the trees
        state = restored_state(saved, ctx, path, lambda: HostChain(ctx.setup.model, self.config.move_probs))
        if self.growable_settings():  # n_samples may have grown; it may not shrink
            c = self.config
            kept = max(0, (int(state.step) - self.n_warmup) // c.thin)
            if kept > c.n_samples:
                raise ValueError(f"{c.checkpoint}: this run has kept {kept} draws per chain, more than n_samples="
                                 f"{c.n_samples}; a run resumes with as many draws or more (n_samples >= {kept}), "
                                 "or give another checkpoint path")
            state.done = int(state.step) >= self.n_iterations
        return state

    def growable_settings(self) -> Tuple[str, ...]:
        """``n_samples`` where ``n_warmup`` is given (its default, ``n_samples * thin``, grows with it): a
        checkpoint's run, finished or not, resumes with a larger one, and its draws are those of one run of that
        length (an iteration's uniforms are keyed by the seed, the chain and the iteration alone)."""
        return ("n_samples",) if self.config.n_warmup is not None else ()

    def step(self, state, ctx: driver.RunContext) -> Tuple[Any, Optional[dict]]:
        """The iterations up to the next monitor report or checkpoint (or the end)."""
        c, total, start = self.config, self.n_iterations, int(state.step)
        end = total
        for every in (c.monitor_every if ctx.watch else None, ctx.checkpoint_every):
            if every is not None:
                end = min(end, (start // every + 1) * every)
        if ctx.setup.host:
            self._host_iterations(state, start, end, ctx)
        else:
            self._batched_iterations(state, start, end, ctx)
        state.step, state.done = end, end == total
        if not ctx.watch or (end % c.monitor_every and end != total):
            return state, None
        if ctx.setup.host:
            recs = state.chains
            chs = [r.chain for r in recs]
            return state, _report(torch.from_numpy(sum(r.proposed for r in recs)),
                                  torch.from_numpy(sum(r.accepted for r in recs)),
                                  torch.tensor([ch.log_posterior() for ch in chs]),
                                  torch.tensor([int(ch.leaf[:ch.n].sum()) for ch in chs]),
                                  torch.tensor([int(ch.depth[:ch.n][ch.leaf[:ch.n]].max()) for ch in chs]), ctx.seconds())
        t = state.chains.trees
        return state, _report(state.proposed, state.accepted, state.chains.log_posterior(ctx.setup.model),
                              t.n_leaves(), t.max_depth(), ctx.seconds())

    def _uniforms(self, it: int, ctx: driver.RunContext) -> Tuple[int, Any]:
        """(first iteration b0, uniforms) of the block of ``_BLOCK`` iterations holding ``it``:
        ``[B, P, N_SLOTS]`` on the device (batched) or in numpy (host). Keyed by
        seed, chain and iteration, so a run resumed inside a block draws the same numbers."""
        b0 = it - it % _BLOCK
        cache = ctx.setup.uniforms
        if not cache or cache[0][0] != b0:
            host = ctx.setup.host
            dev = torch.device("cpu") if host else ctx.device
            gidx = ctx.setup.chains.to(dev)
            its = torch.arange(b0, min(b0 + _BLOCK, self.n_iterations), device=dev)
            slots = torch.arange(N_SLOTS, device=dev)
            U = keyed_uniform(derive_seed(ctx.seed, Stream.MOVES), 0, gidx[None, :, None],
                              its[:, None, None] * N_SLOTS + slots)
            cache[:] = [(b0, U.numpy() if host else U)]
        return cache[0]

    def _batched_iterations(self, st: MCMCState, start: int, end: int, ctx: driver.RunContext) -> None:
        """Iterations ``start .. end-1`` of all chains as one batch (in place on ``st``)."""
        c, model = self.config, ctx.setup.model
        mp, warm, thin, keep_all = c.move_probs, self.n_warmup, c.thin, c.keep == "all"
        for it in range(start, end):  # a Markov chain: iterations are sequential
            b0, U = self._uniforms(it, ctx)
            u = U[it - b0]
            kind = draw_moves(u[:, 0], mp)
            prop = propose(st.chains, model, kind, u, mp, c.cut_proposal)
            acc = torch.log(u[:, 4]) < prop.log_accept_ratio
            st.chains.accept_(prop, acc)
            st.proposed.index_add_(0, kind, torch.ones_like(kind))
            st.accepted.index_add_(0, kind, acc.long())
            record = it >= warm and (it - warm) % thin == thin - 1
            if keep_all or record:
                st.kept.append(snapshot_trees(st.chains.trees))
            if record:
                st.trace_leaves.append(st.chains.trees.n_leaves())
                st.trace_lp.append(st.chains.log_posterior(model))

    def _host_iterations(self, st: HostMCMCState, start: int, end: int, ctx: driver.RunContext) -> None:
        """Iterations ``start .. end-1`` of the host chains (in place on ``st``): block by block of
        uniforms, each chain's share of the block in turn."""
        it = start
        while it < end:
            b0, U = self._uniforms(it, ctx)
            stop = min(end, b0 + U.shape[0])
            for p, rec in enumerate(st.chains):
                self._host_chain(rec, U[it - b0: stop - b0, p], it)
            it = stop

    def _host_chain(self, rec: HostRecord, U: np.ndarray, start: int) -> None:
        """Iterations ``start .. start + len(U) - 1`` of one host chain, with uniforms ``U [B, N_SLOTS]``
        (in place on ``rec``)."""
        c, chain = self.config, rec.chain
        warm, thin, keep_all = self.n_warmup, c.thin, c.keep == "all"
        proposed, accepted, snaps, counts = rec.proposed, rec.accepted, rec.snaps, rec.counts
        version, snap_version = rec.version, rec.snap_version
        for i, u in enumerate(U, start):  # a Markov chain: iterations are sequential
            kind, acc = chain.step(u)
            proposed[kind] += 1
            if acc:
                accepted[kind] += 1
                version += 1
            record = i >= warm and (i - warm) % thin == thin - 1
            if keep_all or record:
                # Consecutive identical draws are stored once with a count.
                if version != snap_version:
                    snaps.append(chain.snapshot())
                    counts.append(0)
                    snap_version = version
                counts[-1] += 1
            if record:
                rec.trace_leaves.append(int(chain.leaf[: chain.n].sum()))
                rec.trace_lp.append(chain.log_posterior())
        rec.version, rec.snap_version = version, snap_version

    def finalize(self, state, ctx: driver.RunContext) -> TreePosterior:
        """Equal weights over the kept draws (a host chain's repeated draws merged with their counts;
        host chains one after another, batched draws iteration by iteration)."""
        c, data, lik = self.config, ctx.data, ctx.setup.likelihood
        if ctx.setup.host:
            recs = state.chains
            counts = [k for r in recs for k in r.counts]
            trees = host_trees([s for r in recs for s in r.snaps], recs[0].chain.dt, lik.stats_dtype)
            logw = torch.log(torch.tensor(counts, dtype=torch.float64))
            n_kept = int(sum(counts))
            proposed = torch.from_numpy(sum(r.proposed for r in recs))
            accepted = torch.from_numpy(sum(r.accepted for r in recs))
            leaves = np.asarray([r.trace_leaves for r in recs], np.float64)  # [chains, draws]
            lp = np.asarray([r.trace_lp for r in recs], np.float64)
        else:
            trees = HardTrees.cat(state.kept)
            proposed, accepted = state.proposed, state.accepted
            leaves = torch.stack(state.trace_leaves, 1).double()  # [chains, draws]
            lp = torch.stack(state.trace_lp, 1)
            if ctx.world_size > 1:
                trees, proposed, accepted, leaves, lp = _gather_chains(ctx, trees, proposed, accepted, leaves, lp)
            logw = torch.zeros(trees.n_trees, dtype=torch.float64)
            n_kept = trees.n_trees
            leaves, lp = leaves.cpu().numpy(), lp.cpu().numpy()
        trees = ctx.setup.model.on_grid(trees)  # max_bins: thresholds onto the grid
        elapsed, total = ctx.seconds(), self.n_iterations
        ran = total - (ctx.resumed_at or 0)  # this segment's iterations: a resumed run's seconds are its own
        info = {"sampler": self.name, "engine": "host" if ctx.setup.host else "batched", "n_chains": c.n_chains,
                "world_size": ctx.world_size, "n_samples": c.n_samples, "n_warmup": self.n_warmup, "thin": c.thin, "keep": c.keep,
                "n_iterations": total, "prior": repr(self.prior), "move_probs": list(c.move_probs),
                "seconds": elapsed, "iterations_per_second": ran / max(elapsed, 1e-12)}
        if ctx.resumed_at is not None:  # seconds and iterations_per_second are this segment's
            info["resumed_at_iteration"] = ctx.resumed_at
        info.update(_accept_info(proposed, accepted))
        info.update(rhat_leaves=rhat(leaves), ess_leaves=chain_ess(leaves),
                    rhat_log_posterior=rhat(lp), ess_log_posterior=chain_ess(lp),
                    trace={"n_leaves": leaves, "log_posterior": lp})
        warn_if_unconverged(info, n_kept // max(c.n_chains, 1), "Run more chains (n_chains), longer ones "
                            "(n_samples, n_warmup), or use method='smc'")
        dev = ctx.device
        post = TreePosterior(trees.to(dev), logw.to(dev), lik, data.d, classes=data.classes_, log_evidence=None,
                             info=info)
        post.n_particles = n_kept
        # the draws' effective number: the chains' autocorrelation ESS (the smaller of the two traces'), not
        # Kish's of the stored weights, which count runs of repeated draws as the engine happens to store them
        chain = [float(v) for v in (info["ess_leaves"], info["ess_log_posterior"]) if math.isfinite(float(v))]
        post.ess = min(chain) if chain else float("nan")
        return post

    def end_info(self, post: TreePosterior) -> Dict[str, Any]:
        return {k: v for k, v in post.info.items() if k.startswith(("accept", "rhat", "ess"))}


def _gather_chains(ctx: driver.RunContext, trees: HardTrees, proposed, accepted, leaves, lp):
    """Every rank's kept draws and traces, in the one-process order (draw-major, then global
    chain), and the summed move counters: collective, the same on every rank."""
    be, W = ctx.backend, ctx.world_size
    n = ctx.setup.chains.numel()
    cap = int(be.all_reduce(torch.tensor([trees.capacity], dtype=torch.int64), "max").item())
    if trees.capacity != cap:
        trees = trees.with_capacity(cap)
    d = trees.as_dict()
    layout = BlockLayout(d)
    every = HardTrees.from_dict(layout.unpack(be.all_gather(layout.pack(d))))  # [W * K * n], rank-major
    K = trees.n_trees // n
    order = torch.arange(W * K * n).view(W, K, n).permute(1, 0, 2).reshape(-1)
    every = every.take(order.to(every.feature.device))
    counts = be.all_reduce(torch.stack([proposed, accepted]).cpu(), "sum").to(proposed.device)
    leaves_all = be.all_gather(leaves.cpu()).view(W * n, -1)
    lp_all = be.all_gather(lp.cpu()).view(W * n, -1)
    return every, counts[0], counts[1], leaves_all, lp_all


def _accept_info(proposed: torch.Tensor, accepted: torch.Tensor) -> dict:
    """Acceptance rate per move type (``accept/<move>``, NaN when never proposed) and overall."""
    pr, ac = proposed.cpu().tolist(), accepted.cpu().tolist()
    out = {f"accept/{m}": (a / p if p else float("nan")) for m, p, a in zip(MOVES, pr, ac)}
    out["accept/all"] = sum(ac) / max(sum(pr), 1)
    return out


def _report(proposed, accepted, log_post, leaves, depth, seconds: float) -> dict:
    """A monitor report: running acceptance rates, mean log posterior, leaves and depth of the chains."""
    acc = _accept_info(proposed, accepted)
    out = {f"mcmc/{k}": v for k, v in acc.items()}
    out["mcmc/accept"] = out.pop("mcmc/accept/all")
    out["mcmc/log_posterior_mean"] = float(log_post.mean())
    out["trees/leaves_mean"] = float(leaves.double().mean())
    out["trees/depth_mean"] = float(depth.double().mean())
    out["time/seconds"] = seconds
    return out
