"""``TopDownSMC``: the sampler of :mod:`torchtree.samplers.topdown` (see the package for the method)."""
from __future__ import annotations

import math
import time
from typing import Any, Dict, Optional, Tuple

import torch

from torchtree.core.memory import available_bytes, check_tree_memory
from torchtree.core.resampling import get_resampler
from torchtree.model.data import Data
from torchtree.model.posterior import TreePosterior
from torchtree.model.priors import make_prior
from torchtree.model.trees import HardTrees
from torchtree.samplers import driver
from torchtree.samplers.driver import default_memory_limit, describe, leaf_likelihood
from torchtree.samplers.base import SamplerBase
from torchtree.samplers.topdown.particles import expansion_pairs, gather_trees, layout_for, move_particles, tree_report
from torchtree.core.smc import island_ancestors, island_weights_step, islands_ess
from torchtree.steps.growth import Grower

from torchtree.samplers.topdown.config import TopDownConfig
from torchtree.samplers.topdown.checks import restored_particles
from torchtree.samplers.topdown.state import TopDownSetup, TopDownState

__all__ = ["TopDownSMC", "island_posterior", "variant_log_evidences"]


class TopDownSMC(SamplerBase):
    """Top-down SMC sampler over decision trees (Lakshminarayanan, Roy & Teh, 2013).

    Parameters
    ----------
    prior : ChipmanPrior or "chipman", optional
        Default ``ChipmanPrior(0.95, 0.5)``.
    likelihood : DirichletMultinomial, NormalInverseGamma or another leaf likelihood, optional
        Default chosen from the data (see :func:`default_likelihood`).
        Any object with the hooks of :class:`~torchtree.model.likelihood_protocol.LeafLikelihood`; a run
        refuses one without them (``TypeError`` naming the missing hooks).
    backend : torchtree.distributed.Backend or str, optional
        Multi-rank runs (``"gloo"``/``"mpi"``/... resolve with
        ``torchtree.distributed.get_backend``). Each rank holds ``n_particles /
        world_size`` particles (global indices ``rank * n_local + i``) and every rank
        returns the same global posterior; results do not depend on the number of
        ranks. See :mod:`torchtree.samplers.topdown` for the layouts and costs.
    **settings
        The settings of :class:`~torchtree.samplers.topdown.config.TopDownConfig` by name
        (``n_particles``, ``n_islands``, ``proposal``, ``expansion``, ``resampling``,
        ``ess_threshold``, ``redistribution``, ``max_memory_bytes``, ``checkpoint``, ...).
        Their defaults, allowed values and meanings are its option table: the API reference
        renders it, ``torchtree fit --method smc --help`` prints it,
        ``TopDownConfig.options()`` returns it.

    Notes
    -----
    Settings whose effect needs more than the table's line:

    ``proposal``
        ``"prior"`` draws a node's split from the prior; ``"empirical"`` draws its cut among
        the gaps between the node's distinct values; ``"optimal"`` scores every cut (the
        one-step optimal proposal of the paper's sec. 3.1). The incremental weights are given
        in :mod:`torchtree.samplers.topdown`.
    ``max_memory_bytes``
        Exceeding the bound raises ``MemoryError`` with advice instead of crashing. Default:
        half the physical memory (CPU) or of the GPU, and at most 3/4 of the memory available
        (``TORCHTREE_MEMORY_LIMIT`` caps it).
    ``checkpoint``
        See :mod:`torchtree.io.checkpoint`. When the file exists, :meth:`run` resumes from it
        and returns exactly what an uninterrupted run with the same seed returns (on the same
        kind of device); it is (re)written every ``checkpoint_every`` stages (stages ``k-1,
        2k-1, ...``) and at the end, so re-running a finished run returns its posterior at
        once. A checkpoint of another run (other data, settings, seed or number of ranks)
        raises :class:`~torchtree.io.checkpoint.CheckpointError`. With ``seed=None`` the seed
        drawn by the first run is stored and reused. A multi-rank run writes
        ``checkpoint.rank{r}`` files plus ``checkpoint.manifest.json`` and must resume with
        the same number of ranks. Each save holds the particles and the node table (all node
        records created so far and the live point lists), so choose ``checkpoint_every`` so
        that saves stay a small part of the run.
    """


    name = "TopDownSMC"

    config_class = TopDownConfig
    #: (prior, likelihood) per island for :func:`variant_log_evidences` (None: every island runs ``prior``, ``likelihood``)
    _variants = None

    def __init__(self, prior=None, likelihood=None, *, backend=None, **settings: Any) -> None:
        self.config = TopDownConfig.of(self.name, **settings)
        self.backend = backend
        self.prior = make_prior(prior)
        if not hasattr(self.prior, "split_prob"):
            # top-down growth decides node by node: it needs per-node split probabilities
            raise ValueError(f"TopDownSMC needs a prior with per-node split probabilities (ChipmanPrior), got "
                             f"{self.prior!r}; the Poisson prior works with MCMC and SMCSampler "
                             f"(method='mcmc' / 'smc-moves')")
        self.likelihood = likelihood


    # ------------------------------------------------------------------ run
    def run(self, data: Any, *, seed: int | torch.Generator | None = None, monitor: Any = None,
            backend: Any = None) -> TreePosterior:
        """Run the particle filter on ``data``.

        Parameters
        ----------
        data : Data, or a pair (X, y)
        seed : int or torch.Generator, optional (None: fresh randomness)
        monitor : Monitor or list of Monitors, optional
            Receives per-stage ``smc/ess``, ``smc/log_evidence``, ``smc/resampled``,
            ``trees/leaves_mean``, ``trees/leaves_max``, ``trees/depth_mean``,
            ``trees/depth_max``, ``smc/open_nodes``, ``smc/distinct_nodes``, ``time/seconds``.
        backend : Backend or name, optional; default the one given at construction

        Returns
        -------
        TreePosterior with ``log_evidence`` and ``info`` (per-island evidence,
        stages, resampling count).
        """
        backend = self.backend if backend is None else backend
        return driver.run(self, data, seed=seed, monitor=monitor, backend=backend)

    @property
    def backend(self):
        """The default backend of :meth:`run` (a ``torchtree.distributed.Backend``, a name, or None);
        setting it checks it (``TypeError`` for an object without the collective operations)."""
        return self.__dict__.get("_backend")

    @backend.setter
    def backend(self, value) -> None:
        driver.check_backend(value)
        self.__dict__["_backend"] = value

    # ------------------------------------------------------------ protocol
    def setup(self, ctx: driver.RunContext) -> "TopDownSetup":
        """The likelihood for the data (default: :func:`default_likelihood`) and the rank layout; refuses
        (``ValueError``) particles that cannot fit in this rank's memory."""
        lik = leaf_likelihood(self.likelihood, ctx.data)
        c = self.config
        # every rank checks divisibility alike, so all of them raise the same error
        layout = "single" if ctx.world_size == 1 else layout_for(c.n_particles, c.n_islands, ctx.world_size)
        # on several ranks a refusal here is every rank's (the driver's agreed set-up)
        check_tree_memory("TopDownSMC", c.n_particles // ctx.world_size, ctx.data, "n_particles", capacity=0,
                          n_stats=lik.n_stats(ctx.data),
                          caches=False, per_tree=2 * 4 * 32 + 80)
        return TopDownSetup(likelihood=lik, layout=layout)

    def settings(self, ctx: driver.RunContext) -> Dict[str, Any]:
        """What decides the result besides the config: the prior, the likelihood, the task."""
        return {"prior": describe(self.prior), "likelihood": describe(ctx.setup.likelihood), "task": ctx.data.task}

    def start_info(self, ctx: driver.RunContext) -> Dict[str, Any]:
        c = self.config
        info = {"n_particles": c.n_particles, "n_islands": c.n_islands, "proposal": c.proposal,
                "expansion": c.expansion, "n": ctx.data.n, "d": ctx.data.d, "n_steps": None}
        if ctx.world_size > 1:
            info.update(world_size=ctx.world_size, layout=ctx.setup.layout)
        if ctx.resumed_at is not None:
            info["resumed_at_stage"] = ctx.resumed_at
        return info

    def _grower(self, ctx: driver.RunContext) -> Grower:
        c = self.config
        grower = Grower(self.prior, ctx.setup.likelihood, ctx.data, c.proposal, ctx.seed, c.use_likelihood,
                        variants=self._variants, island_size=c.n_particles // c.n_islands)
        avail = available_bytes(ctx.device)  # TORCHTREE_MEMORY_LIMIT caps it too; the run needs the rest
        grower.table.limit_bytes = c.max_memory_bytes or int(min(default_memory_limit(ctx.device),
                                                                 0.75 * avail if avail is not None else float("inf")))
        if not c.max_memory_bytes:
            grower.table.limit_source = ("give max_memory_bytes (the default limit is the smaller of half the "
                                         "machine's memory and 3/4 of the available memory, which "
                                         "TORCHTREE_MEMORY_LIMIT caps)")
        return grower

    def _weights_shape(self, ctx: driver.RunContext) -> Tuple[int, int]:
        """(particles, islands) in this rank's weight vector: its own in the islands layout,
        the global ones otherwise (the gathered layout keeps global weights on every rank)."""
        c = self.config
        if ctx.setup.layout == "islands":
            return c.n_particles // ctx.world_size, c.n_islands // ctx.world_size
        return c.n_particles, c.n_islands

    def init(self, ctx: driver.RunContext) -> TopDownState:
        """P root-only trees (``P / W`` on each of ``W`` ranks); stage 0's target is the
        root-only tree, weighted by l(Y) of all the data."""
        c, dev = self.config, ctx.device
        grower = self._grower(ctx)
        n_local = c.n_particles // ctx.world_size
        liks = [ctx.setup.likelihood] if self._variants is None else [lik for _, lik in self._variants]
        root_ll = [float(lik.log_marginal(grower.table.stats[0])) if c.use_likelihood else 0.0 for lik in liks]
        n_w, n_isl = self._weights_shape(ctx)
        return TopDownState(step=0, done=False, particles=grower.init_state(n_local),
                            logw=torch.zeros(n_w, dtype=torch.float64, device=dev),
                            logz=torch.tensor(root_ll, dtype=torch.float64, device=dev).expand(n_isl).clone(),
                            n_resample=0, resample_steps=0, resample_seconds=0.0, grower=grower,
                            layout=ctx.setup.layout)

    def restore(self, saved: Dict[str, Any], ctx: driver.RunContext) -> TopDownState:
        """The state a checkpoint holds (on several ranks: this rank's file)."""
        grower = self._grower(ctx)
        # checked against the run field by field: the compiled passes index the data with the node table
        particles = restored_particles(saved, grower, self.config.n_particles // ctx.world_size,
                                       self._weights_shape(ctx), self.config.checkpoint)
        return TopDownState(step=int(saved["stage"]), done=bool(saved["done"]), particles=particles,
                            logw=saved["logw"].to(ctx.device), logz=saved["logz"].to(ctx.device),
                            n_resample=int(saved["n_resample"]), resample_steps=int(saved["resample_steps"]),
                            resample_seconds=0.0, grower=grower, layout=ctx.setup.layout)

    def step(self, state: TopDownState, ctx: driver.RunContext) -> Tuple[TopDownState, Optional[dict]]:
        """Expand one stage's nodes, weigh, resample the islands whose ESS fell too low.

        On several ranks every rank expands its own particles; the ``"gathered"`` layout then
        shares the incremental weights (one ``all_gather``), the ``"islands"`` layout only the
        number of nodes still open (one ``all_reduce`` of one integer), so that all ranks run
        the same stages and end together. A rank whose trees are finished keeps the weight
        bookkeeping of its islands with zero increments, as the one-process filter does.
        """
        c, stage, grower, particles = self.config, state.step, state.grower, state.particles
        if stage >= c.max_stages:
            raise RuntimeError(f"TopDownSMC did not finish within max_stages={c.max_stages}")
        pp, nn = expansion_pairs(grower, particles, c.expansion, stage)
        if state.layout == "single" and pp.numel() == 0:
            state.done = True
            return state, None
        n_local, dev = particles.n_particles, ctx.device
        incr = torch.zeros(n_local, dtype=torch.float64, device=dev)
        distinct = 0
        m = c.n_particles // c.n_islands
        if pp.numel():
            gidx = torch.arange(ctx.rank * n_local, (ctx.rank + 1) * n_local, device=dev)
            if self._variants is not None:  # each island draws the numbers of a run of its variant alone
                gidx = gidx % m
            res = grower.expand(particles, pp, nn, gidx[pp], stage)
            incr.index_add_(0, pp, res.log_weight)
            distinct = res.n_distinct
        n_open, width = pp.numel(), 0
        if state.layout == "gathered":
            allm = ctx.backend.all_gather(torch.cat([incr, torch.tensor(
                [pp.numel(), int(particles.n_nodes.max())], dtype=torch.float64, device=dev)])).view(-1, n_local + 2)
            n_open, width = int(allm[:, n_local].sum()), int(allm[:, n_local + 1].max())
            incr = allm[:, :n_local].reshape(-1)
        elif state.layout == "islands":
            n_open = int(ctx.backend.all_reduce(torch.tensor([pp.numel()], dtype=torch.int64), "sum").item())
        if n_open == 0:
            state.done = True
            return state, None
        n_w, I = self._weights_shape(ctx)
        logz = state.logz
        state.logw, state.logz, ess = island_weights_step(state.logw, state.logz, incr, I, m)
        low = ess < c.ess_threshold * m
        if self._variants is not None:  # an island whose trees are finished has ended, as its run alone would
            active = torch.bincount(pp // m, minlength=I) > 0
            state.logz, low = torch.where(active, state.logz, logz), low & active
        need = low.nonzero().squeeze(1).tolist()
        if need:
            ts = time.perf_counter()
            first = ctx.rank * I if state.layout == "islands" else 0
            anc = island_ancestors(state.logw, need, m, get_resampler(c.resampling), ctx.seed, stage,
                                   first_island=first, shared_keys=self._variants is not None)
            if state.layout == "gathered":
                state.received += move_particles(grower, particles, anc, width, ctx.backend, c.redistribution)
            else:
                particles.take_(anc)
            state.n_resample += len(need)
            if grower.table.needs_compaction():
                grower.table.compact(grower.open_uids(particles))
            state.resample_seconds += time.perf_counter() - ts
            state.resample_steps += 1
        state.step = stage + 1
        if not ctx.watch:
            return state, None
        return state, {"smc/ess": float(ess.min()),
                       "smc/log_evidence": float(torch.logsumexp(state.logz, 0) - math.log(I)),
                       "smc/resampled": len(need), "smc/open_nodes": int(n_open),
                       "smc/distinct_nodes": distinct, **tree_report(grower, particles),
                       "time/seconds": ctx.seconds()}

    def finalize(self, state: TopDownState, ctx: driver.RunContext) -> TreePosterior:
        """Islands weighted equally, each normalised; on several ranks every rank returns the
        global posterior (the trees and, in the islands layout, the weights are gathered)."""
        info = {"sampler": self.name, "proposal": self.config.proposal, "expansion": self.config.expansion,
                "n_stages": state.step, "n_resample": state.n_resample, "seconds": ctx.seconds(),
                "resample_seconds": state.resample_seconds, "resample_steps": state.resample_steps}
        lik, particles = ctx.setup.likelihood, state.particles
        if state.layout == "single":
            return island_posterior(state.grower.to_trees(particles), state.logw, state.logz, lik, ctx.data, info)
        be, W = ctx.backend, ctx.world_size
        logw, logz, n_resample = state.logw, state.logz, state.n_resample
        n_w, I = logw.numel(), logz.numel()
        fin = be.all_gather(torch.cat([logw, logz, torch.tensor([n_resample, int(particles.n_nodes.max())],
                                                                dtype=torch.float64, device=ctx.device)]))
        fin = fin.view(W, n_w + I + 2)
        width = max(int(fin[:, n_w + I + 1].max()), 1)
        if state.layout == "islands":
            logw, logz = fin[:, :n_w].reshape(-1), fin[:, n_w:n_w + I].reshape(-1)
            n_resample = int(fin[:, n_w + I].sum())
        trees = gather_trees(state.grower, particles, be, width)
        info.update(n_resample=n_resample, world_size=W, rank=ctx.rank, layout=state.layout,
                    redistribution=self.config.redistribution, particles_received=state.received)
        return island_posterior(trees, logw, logz, lik, ctx.data, info)

    def end_info(self, post: TreePosterior) -> Dict[str, Any]:
        return {"log_evidence": post.log_evidence, "n_stages": post.info.get("n_stages")}


def island_posterior(trees: HardTrees, logw: torch.Tensor, logz: torch.Tensor, lik, data: Data,
                     info: dict) -> TreePosterior:
    """The posterior of a finished run: islands weighted equally, each normalised.

    Parameters
    ----------
    trees : HardTrees [P trees], logw : Tensor [P] (island-major),
    logz : Tensor [I] per-island log evidence, lik : likelihood, data : Data
    info : dict, run facts (``sampler``, ``n_stages``, ``seconds``, ...)

    Returns
    -------
    TreePosterior with final log weights summing to one over all P particles.
    """
    I = logz.numel()
    lw2 = logw.view(I, -1)
    final_lw = (lw2 - torch.logsumexp(lw2, 1, keepdim=True) - math.log(I)).reshape(-1)
    log_evidence = float(torch.logsumexp(logz, 0) - math.log(I))
    info = {**info, "island_log_evidence": logz.cpu().tolist(), "island_ess": islands_ess(logw, I).cpu().tolist()}
    return TreePosterior(trees, final_lw, lik, data.d, classes=data.classes_, log_evidence=log_evidence, info=info)


def variant_log_evidences(data: Data, variants, n_particles: int, seed: int, **settings: Any):
    """The log evidence of a top-down SMC run under each (prior, likelihood) of ``variants``, from one run.

    Island ``i`` of the run holds ``n_particles`` particles that grow under ``variants[i]`` with the
    random numbers of a run of that variant alone (the same keys for its particles and its resampling),
    and stops where that run would, so ``out[i]`` is ``TopDownSMC(*variants[i], n_particles=n_particles,
    **settings).run(data, seed=seed).log_evidence`` (the evidence pilots'
    :func:`~torchtree.samplers.tuning.evidence.choose_by_evidence` use it: their per-stage work is
    shared). One process; the prior and empirical proposals.

    Returns
    -------
    list of float, one per variant
    """
    variants = list(variants)
    smc = TopDownSMC(variants[0][0], variants[0][1], n_particles=n_particles * len(variants),
                     n_islands=len(variants), **settings)
    smc._variants = [(make_prior(p), lik) for p, lik in variants]
    post = smc.run(data, seed=seed)
    return [float(v) for v in post.info["island_log_evidence"]]
