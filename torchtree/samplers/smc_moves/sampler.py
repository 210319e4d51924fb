"""``SMCSampler``: the sampler of :mod:`torchtree.samplers.smc_moves` (see the package for the method)."""
from __future__ import annotations

import functools
import math
from typing import Any, Dict, List, Optional, Tuple

import torch

from torchtree.core.memory import check_tree_memory, hard_tree_bytes
from torchtree.core.random import derive_seed, keyed_uniform
from torchtree.distributed import BlockLayout, LocalBackend, ancestors_from_ncopies, redistribute
from torchtree.distributed.exact import global_stats
from torchtree.model.posterior import TreePosterior, dedupe_trees
from torchtree.model.priors import ALPHA_SPLIT, BETA_SPLIT, POISSON_LAMBDA, ChipmanPrior, make_prior
from torchtree.model.trees import HardTrees
from torchtree.samplers import driver
from torchtree.samplers.tuning.starts import topdown_draws
from torchtree.samplers.driver import describe, leaf_likelihood
from torchtree.core.smc import exact_weights_step, global_ncopies, next_temperature
from torchtree.samplers.base import SamplerBase
from torchtree.steps.moves import (N_SLOTS, TreeModel, TreeState, draw_moves, propose, sample_prior_state, snapshot_trees)
from torchtree.samplers.smc_moves.config import SMCSamplerConfig, Stream
from torchtree.samplers.smc_moves.checks import restored_state
from torchtree.samplers.smc_moves.state import SMCSamplerSetup, SMCSamplerState

__all__ = ["SMCSampler", "per_particle_accuracy"]

_LL_KEY = "smc.log_likelihood"  # per-particle tempering state travelling with the trees


class SMCSampler(SamplerBase):
    """Sequential Monte Carlo sampler with tree moves (Drousiotis, Varsi et al., Alg. 4).

    Parameters
    ----------
    prior : ChipmanPrior, PoissonPrior, "chipman" or "poisson", optional
        Target prior (default ``ChipmanPrior(alpha_split, beta_split)``). The initial
        particles always come from the Chipman prior; with a Poisson target the
        initial weights correct for it.
    likelihood : DirichletMultinomial, NormalInverseGamma or another leaf likelihood, optional
        Default from the data.
        Any object with the hooks of :class:`~torchtree.model.likelihood_protocol.LeafLikelihood`; a run
        refuses one without them (``TypeError`` naming the missing hooks).
    alpha_split, beta_split, poisson_lambda : float
        Prior hyperparameters when ``prior`` is given by name.
    backend : torchtree.distributed.Backend or its name, optional
        Multi-rank run (see the module notes); ``None`` is one process. Every rank
        calls :meth:`run` with the same settings and the full training data. A name
        (``"gloo"``, ``"mpi"``, ...) is resolved by ``torchtree.distributed.get_backend``
        in :meth:`run`, and a process group that opens is closed when it returns.
    **settings
        The settings of :class:`~torchtree.samplers.smc_moves.config.SMCSamplerConfig` by name
        (``n_particles``, ``n_iterations``, ``move_probs``, ``resampling``, ``ess_threshold``,
        ``mh_step``, ``init_prior``, ``tempering``, ``cut_proposal``, ``max_bins``,
        ``redistribution``, ``checkpoint``, ...). Their defaults, allowed values and meanings
        are its option table: the API reference renders it, ``torchtree fit --method smc-moves
        --help`` prints it, ``SMCSamplerConfig.options()`` returns it.

    Notes
    -----
    Settings whose effect needs more than the table's line:

    ``init_prior``
        The initial proposal ``q_0`` (default: the target's Chipman prior, or
        ``ChipmanPrior()`` for a Poisson target; in Python also a ``ChipmanPrior``). A prior
        with larger trees starts the particles closer to posterior tree sizes; eq. 4b's
        initial weights ``pi(t_0) / q_0(t_0)`` keep the target exact. ``"topdown"``:
        multinomial draws from a top-down SMC run (``n_particles`` particles,
        :func:`~torchtree.samplers.tuning.starts.start_settings`) on the same model, equally
        weighted with that run's evidence estimate (Chipman prior, no tempering).
    ``mh_step=True``
        The resample-move variant: every proposal is accepted or rejected with the MH ratio,
        so the weights stay constant after the initial step.
    ``tempering=True``
        Likelihood tempering instead of eq. 5b: the targets are ``prior x L^phi`` with ``phi``
        rising from 0 to 1 over the iterations (each step about as large as keeps the ESS
        above ``ess_threshold * n_particles``, and at least an equal share of what is left),
        each followed by resampling when needed and one MH move per particle at the current
        ``phi``. The initial weights are then flat; the evidence estimate is the usual
        product of mean incremental weights.
    ``cut_proposal``
        How grow / change moves draw a cut (:func:`torchtree.steps.moves.propose`): uniform
        on the node's data range as the prior draws it (``"prior"``); a gap between
        consecutive distinct values, uniform among the node's gaps, then uniform in it
        (``"data"``, meant for features with far-apart codes); or ``"informed"``: one of 16
        equal cells of the range with probability ``0.9 softmax(log likelihood of the split at
        the cell's midpoint) + 0.1 / 16``, then uniform in the cell. The target, hence the
        posterior, is the same; the incremental weights carry the proposal density ratio.
    ``max_bins``
        Fits on at most ``max_bins`` quantile bins per feature, as for :class:`MCMC` (a change
        of the split prior). None: the data as given, the paper's model.
    ``redistribution``
        How resampled particles travel between ranks (:func:`torchtree.distributed.redistribute`;
        the result is the same for all). ``"gather"`` and ``"sequential"`` run on one rank only.
    ``checkpoint``
        A checkpoint to write every ``checkpoint_every`` iterations (and after the last) and,
        when it exists, to resume from (see the module notes).
    """

    name = "SMCSampler"

    config_class = SMCSamplerConfig

    def __init__(self, prior=None, likelihood=None, *, alpha_split: float = ALPHA_SPLIT,
                 beta_split: float = BETA_SPLIT, poisson_lambda: float = POISSON_LAMBDA, backend=None, **settings: Any) -> None:
        self.config = SMCSamplerConfig.of(self.name, **settings)
        driver.check_backend(backend)
        if backend is not None and not isinstance(backend, str):  # a name is resolved in run()
            if self.config.n_particles % int(backend.world_size):
                raise ValueError(
                    f"n_particles ({self.config.n_particles}) must be divisible by the number of ranks "
                    f"({backend.world_size}): every rank holds n_particles / world_size particles")
        self.backend = backend
        self.prior = make_prior(prior, alpha_split, beta_split, poisson_lambda)
        self.likelihood = likelihood


    @property
    def init_prior(self) -> Optional[ChipmanPrior]:
        """The initial proposal's prior (a name resolved), or None for the default."""
        ip = self.config.init_prior
        if ip == "topdown":
            return None
        return make_prior(ip) if isinstance(ip, str) else ip

    def run(self, data: Any, *, seed: int | torch.Generator | None = None, monitor: Any = None,
            backend: Any = None) -> TreePosterior:
        """Run the sampler on ``data`` (on every rank, with the full data, in a multi-rank run).

        Parameters
        ----------
        data : Data, or a pair (X, y)
        seed : int or torch.Generator, optional (None: fresh randomness)
            In a multi-rank run rank 0's value is used by every rank.
        monitor : Monitor or list of Monitors, optional
            Receives per iteration ``smc/ess``, ``smc/log_evidence``, ``smc/resampled``,
            ``smc/accept`` (fraction of particles that moved), ``smc/temperature``,
            ``trees/leaves_mean``, ``trees/leaves_max``, ``trees/depth_mean`` (all global
            over ranks), ``time/seconds``. Written by rank 0 only (unless a monitor asks
            for all ranks).
        backend : Backend or name, optional; default the one given at construction

        Returns
        -------
        TreePosterior
            The global posterior (identical on every rank), weighted by the final weights.
            ``log_evidence`` is the running sum of the log mean incremental weights (with
            eq. 4b's initial weights). The target is fixed, so every later factor estimates
            1 and the product is an unbiased estimate of ``p(Y | X)`` under the Chipman
            prior; with ``mh_step=True`` it is the initial importance-sampling estimate;
            with a Poisson prior it estimates the normaliser of the Poisson target, which is
            not normalised over tree shapes (paper 002 eq. 14), so it is not comparable with
            the Chipman evidence. ``info`` holds the final ESS, the number of resampling
            steps, acceptance fraction, ``particle_counts`` (copies of each distinct tree
            among the particles), ``world_size`` and ``resumed_from`` (the iteration a
            checkpoint was resumed after, or None).

        Raises
        ------
        ValueError
            ``n_particles`` not divisible by the world size, or ranks that disagree on the
            settings or the data's shape.
        CheckpointError
            ``checkpoint`` holds another run's state (other data, settings, seed or world size).
        """
        return driver.run(self, data, seed=seed, monitor=monitor, backend=self.backend if backend is None else backend)

    # ------------------------------------------------------------ protocol
    def setup(self, ctx: driver.RunContext) -> SMCSamplerSetup:
        """Check the settings against the ranks; the likelihood, the target, this rank's particles."""
        c, W = self.config, ctx.world_size
        if W > 1 and c.redistribution in ("gather", "sequential"):
            raise ValueError(f"redistribution={c.redistribution!r} runs on one rank; this run has {W} "
                             "(use 'auto', 'alltoall' or 'rotational')")
        if c.n_particles % W:
            raise ValueError(f"n_particles ({c.n_particles}) must be divisible by the number of ranks ({W})")
        lik = leaf_likelihood(self.likelihood, ctx.data)
        n = c.n_particles // W
        # on several ranks a refusal here is every rank's (the driver's agreed set-up)
        S = lik.n_stats(ctx.data)
        check_tree_memory("SMCSampler", n, ctx.data, "n_particles", n_stats=S, per_tree=2 * hard_tree_bytes(ctx.data.n, S))
        return SMCSamplerSetup(likelihood=lik, model=TreeModel(self.prior, lik, ctx.data, c.use_likelihood, c.max_bins),
                               # the exact reductions run through a backend also on one process
                               backend=ctx.backend if ctx.backend is not None else LocalBackend(),
                               n_local=n, gidx=torch.arange(ctx.rank * n, (ctx.rank + 1) * n, device=ctx.device),
                               tempered=c.tempering and c.use_likelihood)

    def settings(self, ctx: driver.RunContext) -> Dict[str, Any]:
        """What decides the result besides the config: the prior, the likelihood, the task."""
        return {"prior": describe(self.prior), "likelihood": describe(ctx.setup.likelihood), "task": ctx.data.task}

    def start_info(self, ctx: driver.RunContext) -> Dict[str, Any]:
        c = self.config
        return {"n_particles": c.n_particles, "n_iterations": c.n_iterations, "mh_step": c.mh_step, "n": ctx.data.n,
                "d": ctx.data.d, "prior": repr(self.prior), "world_size": ctx.world_size, "n_steps": c.n_iterations,
                "total": c.n_iterations}  # steps to expect (one report each): a progress bar's length

    def _stats(self, ctx: driver.RunContext, rows: List[torch.Tensor], maxes=(), sums=()):
        """:func:`~torchtree.distributed.exact.global_stats` of the weight vectors ``rows`` (each [n])."""
        return global_stats(ctx.setup.backend, self.config.n_particles, torch.stack(rows), maxes, sums)

    def init(self, ctx: driver.RunContext) -> SMCSamplerState:
        """Particles from the Chipman prior weighted by eq. 4b (flat under tempering); resampled
        at once when their ESS is already too low."""
        c, model, P = self.config, ctx.setup.model, self.config.n_particles
        tempered = ctx.setup.tempered
        if c.init_prior == "topdown":
            # equal weights: a properly weighted sample whose mean weight is the run's evidence
            seed = derive_seed(ctx.seed, Stream.TOPDOWN_START)
            particles, log_z = topdown_draws(model, ctx.setup.gidx, seed, n_particles=P, ctx=ctx)
            logw = torch.full((ctx.setup.n_local,), log_z, dtype=torch.float64, device=ctx.device)
        else:
            seed = derive_seed(ctx.seed, Stream.PRIOR_START)
            particles, log_q0 = sample_prior_state(model, ctx.setup.n_local, seed, ctx.setup.gidx,
                                                   draw_prior=self.init_prior)
            logw = particles.log_posterior(model) - log_q0  # eq. 4b
        ll = particles.log_likelihood(model) if tempered else None
        if tempered:
            logw = logw - ll  # the first target is the prior (likelihood power 0)
        st = SMCSamplerState(step=0, done=c.n_iterations == 0, particles=particles, logw=logw, ll=ll, log_z=0.0,
                             phi=0.0 if tempered else 1.0, n_resample=0, moved=[], ess=[], phis=[])
        (lse,), (e,), (cap,), _ = self._stats(ctx, [logw], maxes=[particles.trees.capacity])
        particles.trees.reserve(int(cap))  # every rank runs the same shapes
        st.log_z = lse - math.log(P)
        if not tempered:
            st.ess.append(e)
            if e < c.ess_threshold * P:
                self._resample(st, ctx, 0)
                st.logw = torch.zeros_like(st.logw)
        return st

    def restore(self, saved: Dict[str, Any], ctx: driver.RunContext) -> SMCSamplerState:
        """The state a checkpoint holds (this rank's file)."""
        # checked against the run field by field (particle count included): the moves index with the trees
        return restored_state(saved, ctx, self.config.checkpoint)

    def _resample(self, st: SMCSamplerState, ctx: driver.RunContext, step: int) -> None:
        """Resample by ``st.logw`` (in place); copies in canonical order, the same on any number of ranks."""
        c, P, W, dev = self.config, self.config.n_particles, ctx.world_size, ctx.device
        backend = ctx.setup.backend
        g = torch.Generator(device="cpu").manual_seed(derive_seed(ctx.seed, Stream.RESAMPLING, step))
        nc = global_ncopies(st.logw, backend, c.resampling, g, P, ctx.rank)
        if W == 1:
            anc = ancestors_from_ncopies(nc.to(dev))
            st.particles.take_(anc)
            if st.ll is not None:
                st.ll = st.ll.index_select(0, anc)
        else:
            block = st.particles.trees.as_dict()
            if st.ll is not None:
                block[_LL_KEY] = st.ll
            out = redistribute(block, nc, backend, method=c.redistribution)
            if st.ll is not None:
                st.ll = out.pop(_LL_KEY)
            st.particles = TreeState(HardTrees.from_dict(out))
        st.n_resample += 1

    def step(self, st: SMCSamplerState, ctx: driver.RunContext) -> Tuple[SMCSamplerState, Optional[dict]]:
        """One iteration: (tempering: reweight to the next power, resample) move, reweight, resample."""
        c, model, mp = self.config, ctx.setup.model, self.config.move_probs
        k, K, P = int(st.step), c.n_iterations, c.n_particles
        tempered, res, phi = ctx.setup.tempered, False, st.phi
        if tempered:
            # Reweight to the next temperature, resample, then move with an MH kernel at it.
            if k == K - 1:
                new_phi = 1.0
            else:
                stats = functools.partial(global_stats, ctx.setup.backend, P)
                new_phi = next_temperature(stats, st.logw, st.ll, phi, c.ess_threshold * P, K - k)
            new_logw = st.logw + (new_phi - phi) * st.ll
            dlz, e, (cap,), _ = exact_weights_step(ctx.setup.backend, P, st.logw, new_logw,
                                                   maxes=[st.particles.trees.capacity])
            st.particles.trees.reserve(int(cap))
            st.log_z += dlz
            st.logw, phi = new_logw, new_phi
            st.phi = phi
            st.ess.append(e)
            if e < c.ess_threshold * P:
                self._resample(st, ctx, k + 1)
                st.logw, res = torch.zeros_like(st.logw), True
        u = keyed_uniform(derive_seed(ctx.seed, Stream.MOVES), k, ctx.setup.gidx[:, None],
                          torch.arange(N_SLOTS, device=ctx.device))
        kind = draw_moves(u[:, 0], mp)
        prop = propose(st.particles, model, kind, u, mp, c.cut_proposal)
        if tempered:
            la = prop.log_target_ratio - (1.0 - phi) * prop.log_lik_ratio + prop.log_q_ratio
            acc = prop.valid & (torch.log(u[:, 4]) < la)
            st.ll = st.ll + torch.where(acc, prop.log_lik_ratio, torch.zeros_like(st.ll))
            new_logw = st.logw
        elif c.mh_step:
            acc = torch.log(u[:, 4]) < prop.log_accept_ratio
            new_logw = st.logw
        else:
            acc = prop.valid
            new_logw = st.logw + torch.where(acc, prop.log_target_ratio + prop.log_q_ratio, torch.zeros_like(st.logw))
        st.particles.accept_(prop, acc)
        trees = st.particles.trees
        leaves, depth = trees.n_leaves(), trees.max_depth()
        dlz, e, (cap, lmax), (n_acc, lsum, dsum) = exact_weights_step(
            ctx.setup.backend, P, st.logw, new_logw, maxes=[trees.capacity, float(leaves.max())],
            sums=[int(acc.sum()), int(leaves.sum()), int(depth.sum())])
        trees.reserve(int(cap))
        if not tempered:
            st.log_z += dlz
            st.ess.append(e)
        st.logw = new_logw
        # No resampling after the last reweighting: predictions use the weights.
        if not tempered and k < K - 1 and e < c.ess_threshold * P:
            self._resample(st, ctx, k + 1)
            st.logw, res = torch.zeros_like(st.logw), True
        st.phis.append(phi)
        st.moved.append(n_acc / P)
        st.step, st.done = k + 1, k + 1 >= K
        if not ctx.watch:
            return st, None
        return st, {"smc/ess": st.ess[-1], "smc/log_evidence": st.log_z, "smc/resampled": int(res),
                    "smc/accept": st.moved[-1], "smc/temperature": phi, "trees/leaves_mean": lsum / P,
                    "trees/leaves_max": lmax, "trees/depth_mean": dsum / P, "time/seconds": ctx.seconds()}

    def finalize(self, st: SMCSamplerState, ctx: driver.RunContext) -> TreePosterior:
        """The global posterior, the same on every rank: every rank's trees gathered, identical trees merged."""
        c, P, W, dev, data = self.config, self.config.n_particles, ctx.world_size, ctx.device, ctx.data
        (_,), (final_ess,), (cap,), _ = self._stats(ctx, [st.logw], maxes=[st.particles.trees.capacity])
        snap = ctx.setup.model.on_grid(snapshot_trees(st.particles.trees))  # max_bins: thresholds onto the grid
        snap.reserve(int(cap))
        if W > 1:
            backend = ctx.setup.backend
            d = snap.as_dict()
            layout = BlockLayout(d)
            snap = HardTrees.from_dict(layout.unpack(backend.all_gather(layout.pack(d))))
            logw_all = backend.all_gather(st.logw.cpu()).to(dev)
        else:
            logw_all = st.logw
        trees, lw_d, inv = dedupe_trees(snap, logw_all)
        counts = torch.bincount(inv, minlength=trees.n_trees)
        moved, tempered = st.moved, ctx.setup.tempered
        info = {"sampler": self.name, "n_particles": P, "n_iterations": c.n_iterations, "mh_step": c.mh_step,
                "prior": repr(self.prior), "resampling": c.resampling, "ess_threshold": c.ess_threshold,
                "n_resample": st.n_resample, "final_ess": final_ess, "ess_trace": list(st.ess),
                "tempering": bool(tempered), "temperatures": list(st.phis),
                "accept_fraction": float(sum(moved) / len(moved)) if moved else float("nan"),
                "particle_counts": counts.cpu(), "seconds": ctx.seconds(), "world_size": W, "rank": ctx.rank,
                "resumed_from": None if ctx.resumed_at is None else ctx.resumed_at - 1}
        post = TreePosterior(trees, lw_d, ctx.setup.likelihood, data.d, classes=data.classes_,
                             log_evidence=st.log_z, info=info, dedupe=False)
        post.n_particles = P
        post.ess = float(final_ess)  # Kish's over the particles, resampled copies apart (ess_distinct merges them)
        return post

    def end_info(self, post: TreePosterior) -> Dict[str, Any]:
        return {"log_evidence": post.log_evidence, "final_ess": post.info["final_ess"]}


def per_particle_accuracy(posterior: TreePosterior, X, y, weighted: bool = False) -> float:
    """Mean test accuracy of the individual trees (the figure paper 002 reports).

    Each tree predicts with its own leaf predictive; the accuracies are averaged
    over particles (using ``info["particle_counts"]`` when the sampler recorded the
    copies of each distinct tree, otherwise the posterior weights, which for MCMC
    are the multiplicities of the kept draws). The result is also stored in
    ``posterior.info["per_particle_accuracy"]`` (and the weight-averaged value in
    ``posterior.info["per_particle_accuracy_weighted"]``).

    Parameters
    ----------
    posterior : TreePosterior (classification)
    X : array-like [M, D]
    y : array-like [M] original labels
    weighted : bool
        Return the weight-averaged accuracy instead of the particle average.

    Returns
    -------
    float
    """
    if posterior.task != "classification":
        raise ValueError("per_particle_accuracy applies to classification")
    Xt = posterior.inputs(X)
    yt = posterior._encode_y(y, Xt.shape[0]).to(Xt.device)
    accs = []
    for _, rows in posterior._mixture_rows(Xt):
        accs.append((rows.argmax(-1) == yt[None, :]).double().mean(1))
    acc = torch.cat(accs)
    w = posterior.weights.to(acc.device)
    counts = posterior.info.get("particle_counts")
    if counts is not None and len(counts) == acc.numel():
        c = torch.as_tensor(counts, dtype=torch.float64, device=acc.device)
        particle = float((c * acc).sum() / c.sum())
    else:
        particle = float((w * acc).sum())
    weighted_v = float((w * acc).sum())
    posterior.info["per_particle_accuracy"] = particle
    posterior.info["per_particle_accuracy_weighted"] = weighted_v
    return weighted_v if weighted else particle
