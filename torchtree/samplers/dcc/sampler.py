"""DCC-Tree: Divide, Conquer, Combine sampling of Bayesian soft decision trees (paper 004, Alg. 1).

Divide: the posterior over trees splits into one subspace per topology ``m`` (its own
parameter vector ``theta_m``). Conquer: local inference in a subspace is batched NUTS
on the soft tree of that topology (``n_chains`` chains), after a one-off warm-up
when the topology becomes *active*; LAIS turns the local draws into an evidence
estimate ``Z_m``, updated incrementally at every visit. Combine: the output weights
each topology by ``Z_m p(m)`` (Chipman prior), and predictions average over them.

Loop (``n_iterations`` = T):

1. topologies proposed at least ``activation_threshold`` (C0) times become active;
   new ones are warmed up (``n_warmup`` = N_init iterations, sharpness annealed from
   ``h_init`` to ``h_final``, Table 5) together in one batch, then draw ``n_samples``;
2. the utility of eq. 10 (exploitation, exploration, optimism boost) ranks the active
   topologies; the top ``n_parallel`` run ``n_samples`` (N_s) more NUTS iterations in
   one batch (``n_parallel = 1`` is the paper's algorithm; more amortises the
   per-step overhead of small batches on a CPU);
3. LAIS (spatial form, ``n_proposals`` = N_M pseudo-samples per draw) updates ``Z_m``;
4. a grow / prune / stay move from each refined topology is *proposed*: a new topology
   is recorded with count 1, a known one has its count increased.

Initial topologies: ``n_initial`` (T0) draws from the Chipman prior, truncated at
``max_depth``. If none reaches the threshold, the most-proposed one is activated so
the loop can start.
"""
from __future__ import annotations

import dataclasses
import math
import random as _pyrandom
import time
from dataclasses import asdict
from typing import Any, Callable, Dict, List, Optional, Tuple

import torch

from torchtree.core.memory import check_memory

from torchtree.model.soft_data import SoftData, as_soft_data, squeezed_columns
from torchtree.model.soft_posterior import SoftTreePosterior
from torchtree.model.soft_trees import SoftTreeHyper, SoftTrees
from torchtree.model.topology import Topology, propose_topology, sample_prior_topologies
from torchtree.samplers import driver
from torchtree.samplers.dcc.config import MIN_DRAWS, DCCConfig
from torchtree.samplers.dcc.lais import EvidenceAccumulator, lais_log_weights, lais_memory_bytes
from torchtree.samplers.dcc.records import (
    Record,
    bound_pseudo,
    compact_keys,
    embed,
    inherit,
    local_draws,
    record_from_state,
    store_chains,
    warm_start_chains,
)
from torchtree.samplers.dcc.rows import use_rows
from torchtree.samplers.dcc.state import DCCSetup, DCCState, new_stats
from torchtree.samplers.dcc.utility import dcc_utility
from torchtree.samplers.base import SamplerBase

from torchtree.samplers.nuts.chains import ChainState, SampleTrace, draw, make_kernel, warmup
from torchtree.steps.adaptation import sharpness_schedule
from torchtree.steps.hmc import hmc_init
from torchtree.steps.soft_init import informed_start
from torchtree.core.warn import warn

__all__ = ["DCC", "DCCConfig", "DCCState", "MIN_DRAWS"]

#: Pseudo-samples LAIS evaluates per call when a budget may cut it (a few leapfrog steps' work)
LAIS_CHUNK = 64


class _BudgetSpent(Exception):
    """The budget ran out inside a LAIS update (caught in :meth:`DCC._lais`)."""

# the names the records' helpers had when they lived here (tests and notebooks import them)
_Record, _compact_keys, _inherit = Record, compact_keys, inherit


#: the bookkeeping generator's seed is the run's seed plus this (NUTS' generator takes the seed itself)
BOOKKEEPING_OFFSET = 1


class DCC(SamplerBase):
    """Divide-Conquer-Combine sampler over soft-tree topologies (``method="dcc"``).

    Cochrane, Wills & Johnson, "Divide, Conquer, Combine Bayesian Decision Tree Sampling" (paper
    004): each topology's soft-tree posterior is sampled by NUTS, its evidence estimated by layered
    adaptive importance sampling, and the posterior is their mixture weighted by evidence x prior.

    Settings: :class:`~torchtree.samplers.dcc.config.DCCConfig` (keyword arguments here,
    readable as attributes: ``dcc.n_chains``). The notes below say more on a few.

    ``local_posterior``: "weighted" resamples the LAIS pseudo-samples by their normalised
    weights (eq. 14; chains stuck in a poor mode get little weight, but in many dimensions
    few pseudo-samples carry the weight); "chains" keeps the NUTS draws and weights each
    chain by its own LAIS evidence (same protection against stuck chains, all draws used);
    "draws" keeps the NUTS draws with equal weights.

    ``warm_start`` (not in the paper, which burns in every topology from scratch): a new
    topology's chains start from those of the topology whose move proposed it, resampled
    by their per-chain LAIS evidence (shared splits keep their parameters, see
    :func:`~torchtree.samplers.dcc.records.inherit`), and warm up for ``n_warmup_warm``
    iterations (sharpness annealed over that shorter warm-up). It makes deep topologies
    affordable on a CPU budget.

    ``init="data"`` (not in the paper): the splits of a new topology (and the new split of
    a warm-started one) are drawn by conditional sweeps over the hard tree's axis-aligned
    splits on the training data (:func:`torchtree.steps.soft_init.informed_start`) and the
    warm-up runs at ``h_final``. Same target. It helps when ``h_final`` is so small that
    thresholds get no gradient between data points (integer-valued inputs at a small
    ``h_final``); on softer, oblique problems the axis-aligned starts can cost accuracy
    (the documentation's DCC benchmark page measures both).

    ``asynchronous``: each visit's draws come from
    :func:`torchtree.steps.nuts_async.nuts_draw_async` (no barrier between transitions);
    same kernel, other random draws; see :class:`torchtree.soft.NUTS` for when it pays.

    ``checkpoint``: every ``checkpoint_every`` iterations (and after the last one) the
    loop state (:class:`DCCState`: every topology's counts, chains, draws, LAIS
    pseudo-samples and evidence, the generators) is written atomically
    (:func:`torchtree.samplers.driver.run`); a run finding the file resumes after its last
    saved iteration and, without ``max_seconds``, returns what an uninterrupted run with
    the same seed returns. ``n_iterations`` is not fingerprinted, so a finished run can be
    extended. ``max_seconds`` makes the number of iterations, and so the result, depend on
    the machine's speed; the budget sums the segments of a resumed run.

    ``max_seconds`` is asked after every NUTS transition (warm-ups, draws; every leapfrog
    tick of asynchronous draws) and between activation batches, so a run overshoots it by
    at most one transition plus one LAIS update.
    What a cut leaves: topologies whose warm-up was cut, or whose first sampling kept fewer
    than ``MIN_DRAWS`` draws, stay inactive and out of the posterior (no chains kept; a
    resumed run warms them up again); a refinement cut after ``MIN_DRAWS`` or more draws
    keeps them (LAIS runs on them), one cut before that changes nothing. A budget too small
    for any topology to finish its warm-up raises a ``ValueError`` naming ``max_seconds``; before
    that, ``max_rows="auto"`` fits a row subset the budget can afford (:mod:`~torchtree.samplers.dcc.rows`).
    """

    name = "DCC"
    method = "dcc"
    config_class = DCCConfig

    def __init__(self, **settings: Any) -> None:
        self.config = DCCConfig.of(self.name, **settings)
        _ = self.hyper  # the overrides are checked now, not at the first run

    @property
    def hyper(self) -> SoftTreeHyper:
        """The soft-tree hyperparameters: ``hyper`` with the ``alpha`` / ``split_concentration``
        / ``signed_splits`` overrides (data-dependent defaults still unresolved)."""
        return self.config.soft_hyper()

    # ------------------------------------------------------------------ run
    def run(self, data: Any, y: Any = None, *, seed: int | torch.Generator | None = None, monitor: Any = None,
            backend: None = None) -> SoftTreePosterior:
        """Run DCC-Tree on ``data`` (through :func:`torchtree.samplers.driver.run`).

        Parameters
        ----------
        data : torchtree.Data, (X, y), or Tensor X [N, D] (with ``y``)
        y : Tensor [N], optional
        seed : int or torch.Generator, optional
            None (default) draws a fresh seed (kept in the checkpoint, so a resumed run
            continues it); an int reproduces; a generator gives one draw.
        monitor : Monitor or list, optional
            Receives ``on_start``, ``on_step`` (tags ``dcc/...`` once per iteration and
            ``hmc/...`` per NUTS iteration, with the running NUTS iteration count as
            step), ``on_checkpoint`` and ``on_end``.
        backend : None
            DCC runs in one process: a backend is refused (``TypeError``).

        Returns
        -------
        SoftTreePosterior over the active topologies, weighted by ``Z_m p(m)``.
        """
        if backend is not None:
            raise TypeError(f"{type(self).__name__} runs in one process: it takes no backend (ranks), got {backend!r}")
        if y is not None:
            data = (data, y)
        return driver.run(self, data, seed=seed, monitor=monitor)

    # ------------------------------------------------------------ protocol
    def prepare(self, data, device) -> SoftData:
        """``data`` as SoftData (inputs scaled to [0, 1], a regression target standardised) on ``device``
        (None: the data's own); warns about columns whose range a few extreme values set
        (:func:`~torchtree.model.soft_data.squeezed_columns`)."""
        sd = as_soft_data(data, dtype=self.config.dtype, device=device, signed=self.hyper.signed_splits,
                          standardize=True)
        width = 4 * self.config.h_final  # a gate's transition (sigmoid 0.12 to 0.88) on the scaled inputs
        squeezed = squeezed_columns(sd, width)
        if squeezed:
            cols = ", ".join(f"column {j} ({100 * f:.2g}%)" for j, f in squeezed[:5])
            more = f" and {len(squeezed) - 5} more" if len(squeezed) > 5 else ""
            warn(f"DCC: a few extreme values set the range of X's {cols}{more}: the central 98% of the values span "
                 "that share of the range. Soft splits act on inputs min-max scaled to [0, 1] by the training range, "
                 f"so these values sit within one split's soft transition ({width:g} of the range at h_final="
                 f"{self.config.h_final:g}) and the splits can hardly separate them. Transform the column(s) (clip, "
                 "log or rank them) or use a hard-tree method ('smc', 'mcmc', 'smc-moves', 'bart'), which is "
                 "invariant to monotone transforms of the inputs", UserWarning)
        return sd

    def setup(self, ctx: driver.RunContext) -> DCCSetup:
        """The run's resolved hyperparameters and warm-up schedules (the rows and warm-up length
        are settled in :meth:`init`, once the seed is known)."""
        c = self.config
        check_memory("DCC's evidence (LAIS) for the one-split tree",
                     lais_memory_bytes(1, c.n_chains, c.n_samples, c.n_proposals, ctx.data.n_features + 4,
                                       itemsize=ctx.data.X.element_size()),
                     "n_chains, n_samples or n_proposals (or use fewer features)", device=ctx.device)
        informed = c.init == "data"
        # a data-informed start is already a sharp partition: no annealing
        h_start = c.h_final if informed else c.h_init
        n = int(ctx.data.X.shape[0])
        return DCCSetup(hyper=c.resolved_hyper(ctx.data), informed=informed, h_start=h_start,
                        cpu0=time.process_time(), before=(0.0, 0.0),
                        schedule=sharpness_schedule(c.n_warmup, h_start, c.h_final),
                        warm_schedule=sharpness_schedule(c.warmup_warm, h_start, c.h_final),
                        n_warmup=c.n_warmup, n_warmup_warm=min(c.warmup_warm, c.n_warmup), rows=(n, n))

    def settings(self, ctx: driver.RunContext) -> Dict[str, Any]:
        """What decides the result besides the config: the resolved hyperparameters, the task."""
        return {"hyper": asdict(ctx.setup.hyper), "task": ctx.data.task}

    def init(self, ctx: driver.RunContext) -> DCCState:
        """Generators from the seed, and the ``n_initial`` topologies drawn from the prior."""
        c = self.config
        state = DCCState(step=0, done=False, records={}, evidence=EvidenceAccumulator(0, device=torch.device("cpu")),
                         generator=torch.Generator(device=ctx.device).manual_seed(ctx.seed),
                         bookkeeping=torch.Generator().manual_seed(ctx.seed + BOOKKEEPING_OFFSET),  # CPU draws for bookkeeping
                         rng=_pyrandom.Random(ctx.seed), hmc_step=0,
                         stats=new_stats())
        for t in sample_prior_topologies(c.n_initial, c.alpha_split, c.beta_split, c.max_depth, state.rng):
            self._propose(state, t)
        ctx.setup = dataclasses.replace(ctx.setup, n_discovered=len(state.records))
        state.rows_used = use_rows(c, ctx, state.records.values(), MIN_DRAWS)  # before any per-row work
        state.warmup_used = ctx.setup.n_warmup
        return state

    def restore(self, saved: Dict[str, Any], ctx: driver.RunContext) -> DCCState:
        """The state :meth:`DCCState.state_dict` saved."""
        gen = torch.Generator(device=ctx.device)
        gen.set_state(saved["generator"].to(gen.get_state().device))
        rgen = torch.Generator()
        rgen.set_state(saved["bookkeeping_generator"])
        version, internal, gauss = saved["python_random"]
        rng = _pyrandom.Random()
        rng.setstate((int(version), tuple(int(v) for v in internal), gauss))
        acc = EvidenceAccumulator(0, device=torch.device("cpu"))
        for name in EvidenceAccumulator._FIELDS:
            setattr(acc, name, saved["evidence"][name].to(torch.float64))
        records = {r.topology: r for r in (record_from_state(d, ctx.device) for d in saved["records"])}
        step = int(saved["iteration"]) + 1
        stats = new_stats()
        stats.update(saved["stats"])
        ctx.setup = dataclasses.replace(ctx.setup, before=(float(saved["elapsed_wall"]), float(saved["elapsed_cpu"])),
                                        n_discovered=len(records))
        return DCCState(step=step, done=step >= self.config.n_iterations, records=records, evidence=acc,
                        generator=gen, bookkeeping=rgen, rng=rng, hmc_step=int(saved["hmc_step"]), stats=stats,
                        elapsed_budget=float(saved["elapsed_budget"]), elapsed_wall=float(saved["elapsed_wall"]),
                        elapsed_cpu=float(saved["elapsed_cpu"]),
                        rows_used=use_rows(self.config, ctx, (), MIN_DRAWS, saved=saved["rows_used"],
                                           saved_warmup=saved.get("warmup_used")),
                        warmup_used=ctx.setup.n_warmup)

    def start_info(self, ctx: driver.RunContext) -> Dict[str, Any]:
        c = self.config
        info = {"method": "dcc", "n_iterations": c.n_iterations, "n_chains": c.n_chains, "n_samples": c.n_samples,
                "n_warmup": c.n_warmup, "n_discovered": ctx.setup.n_discovered}
        # no "total": on_step also carries the hmc/... tags of every NUTS iteration, whose
        # number is not known in advance, so a progress bar counts steps without a total
        if ctx.resumed_at is not None:
            info["resumed_from_iteration"] = ctx.resumed_at - 1
        return info

    def step(self, state: DCCState, ctx: driver.RunContext) -> Tuple[DCCState, Optional[dict]]:
        """One DCC iteration: activate, choose by utility, refine with NUTS, update the
        evidence with LAIS, propose a move from each refined topology."""
        c, records = self.config, state.records
        it = state.step
        new = [r for r in records.values() if not r.active and r.proposed >= c.activation_threshold]
        if not any(r.active for r in records.values()) and not new:
            new = [max(records.values(), key=lambda r: r.proposed)]
        stop = self._stop(ctx)
        if new:
            self._activate(state, ctx, new, stop)
        acc = state.evidence
        active = [r for r in records.values() if r.active]
        if not active or (stop is not None and stop()):
            # the budget ran out in the activations: no refinement (its draws would be cut
            # at once); the driver ends the run after this step
            return self._end_iteration(state, ctx, it), None
        slots = torch.tensor([r.slot for r in active])
        util = dcc_utility(
            acc.log_evidence[slots], acc.log_var_w[slots], acc.logw_mean[slots], acc.logw_std[slots],
            float(acc.max_logw[slots].max()), torch.tensor([r.selected for r in active]),
            c.delta, c.optimism, c.kappa, c.look_ahead,
        )
        order = torch.argsort(util, descending=True)[: c.n_parallel].tolist()
        chosen = [active[i] for i in order]
        model = self._model(ctx, chosen, c.h_final, state.generator)
        fill = model.theta.data
        chains = ChainState(
            hmc_init(embed(model, chosen, "position", fill, c.n_chains), model.potential_and_grad),
            torch.cat([r.step_size for r in chosen]).to(fill),
            embed(model, chosen, "inv_mass", torch.zeros_like(fill), c.n_chains),
        )
        chains, tr = draw(self._kernel(model), model.potential_and_grad, chains, c.n_samples,
                          generator=state.generator, monitor=ctx.monitor, step_offset=state.hmc_step,
                          asynchronous=c.asynchronous, stop=stop)
        state.hmc_step += tr.positions.shape[0]
        self._track(state, tr)
        lais = None if tr.positions.shape[0] < MIN_DRAWS else self._lais(model, chosen, tr.positions,
                                                                         state.generator, stop)
        if lais is None:
            # cut by the budget before LAIS had draws to build proposals from, or inside LAIS:
            # this visit leaves the topologies as they were
            state.stats["visits_cut"] += len(chosen)
            return self._end_iteration(state, ctx, it), None
        self._store(model, chosen, chains, tr.positions)
        self._evidence(model, chosen, *lais, acc)
        for r in chosen:
            r.selected += 1
            self._propose(state, propose_topology(r.topology, state.rng, c.move_probs, c.max_depth)[0], r.topology)
        self._end_iteration(state, ctx, it)
        if not ctx.watch:
            return state, None
        lz = acc.log_evidence[slots]
        jac = ctx.data.target_log_jacobian  # the evidence of the targets in their own units
        lp = torch.tensor([r.log_prior for r in active], dtype=torch.float64)
        return state, {
            "dcc/n_active": len(active),
            "dcc/n_discovered": len(records),
            "dcc/selected": ",".join(r.topology.key() for r in chosen),
            "dcc/utility_max": float(util.max()),
            "dcc/utilities": util.clone(),
            "dcc/topology_log_evidence": lz + jac,
            "dcc/log_evidence": float(torch.logsumexp(lz + lp, 0)) + jac,
            # summaries of this iteration's local inference (per-NUTS-iteration values go
            # out under hmc/... with the NUTS iteration as step)
            "dcc/step_size": float(chains.step_size.mean()),
            "dcc/accept": float(tr.accept_prob.mean()),
            "dcc/divergences": int(tr.is_divergent.sum()),
            "dcc/tree_depth": float(tr.tree_depth.float().mean()),
            "dcc/seconds": state.elapsed_wall,
        }

    def finalize(self, state: DCCState, ctx: driver.RunContext) -> SoftTreePosterior:
        """The posterior over the active topologies, weighted by ``Z_m p(m)``."""
        stats = dict(state.stats)
        stats["nuts_iterations"] = state.hmc_step
        stats["divergence_rate"] = stats["divergences"] / max(stats["transitions"], 1)  # per chain transition
        stats["iterations"] = state.step
        stats["seconds"], stats["cpu_seconds"] = self._elapsed(ctx)
        stats["rows_used"], stats["rows_total"] = ctx.setup.rows
        stats["warmup_used"] = ctx.setup.n_warmup
        if ctx.resumed_at is not None:
            stats["resumed_from_iteration"] = ctx.resumed_at - 1
        if not any(r.active for r in state.records.values()):
            raise ValueError(
                f"DCC: max_seconds={self.config.max_seconds} ({self.config.clock} clock) ran out before any topology "
                f"finished its warm-up ({ctx.setup.n_warmup} iterations of {self.config.n_chains} chains) and "
                f"{MIN_DRAWS} draws; raise max_seconds (or lower n_warmup, n_chains, n_parallel or max_rows)")
        if state.step < self.config.n_iterations:
            warn(f"DCC: max_seconds={self.config.max_seconds:g} ({self.config.clock} clock) stopped the run after "
                 f"{state.step} of n_iterations={self.config.n_iterations} iterations; the posterior holds the "
                 f"{sum(r.active for r in state.records.values())} topologies refined so far (raise max_seconds "
                 "for more)", UserWarning)
        post = self._posterior(ctx.data, state.records, state.evidence, stats)
        # the run's per-topology records (chains, draws, pseudo-samples, counts) and LAIS
        # evidence stay with its result: a sampler holds settings only
        post.run_records, post.run_evidence = state.records, state.evidence
        return post

    def end_info(self, post: SoftTreePosterior) -> Dict[str, Any]:
        # final values under their own names (the dcc/ tags are per-iteration series)
        return {"log_evidence": post.log_evidence, "n_active": len(post.topologies),
                "topology_log_evidence": post.topology_log_evidence, "seconds": post.info["seconds"],
                "divergence_rate": post.info["divergence_rate"]}

    # ----------------------------------------------------------------- helpers
    def _end_iteration(self, state: DCCState, ctx: driver.RunContext, it: int) -> DCCState:
        """Count iteration ``it`` as done and bring the clocks up to date."""
        state.step = it + 1
        state.done = state.step >= self.config.n_iterations
        state.elapsed_budget = ctx.budget_seconds()
        state.elapsed_wall, state.elapsed_cpu = self._elapsed(ctx)
        return state

    def _stop(self, ctx: driver.RunContext) -> Optional[Callable[[], bool]]:
        """The budget test the warm-ups and draws ask after every NUTS transition (None
        without ``max_seconds``): one read of the budget's clock, no synchronisation."""
        budget = self.config.max_seconds
        if budget is None:
            return None
        return lambda: ctx.budget_seconds() >= budget

    @staticmethod
    def _elapsed(ctx: driver.RunContext) -> Tuple[float, float]:
        """Wall and CPU seconds of the whole run (earlier segments of a resumed run included)."""
        wall, cpu = ctx.setup.before
        return wall + ctx.seconds(), cpu + time.process_time() - ctx.setup.cpu0

    def _propose(self, state: DCCState, t: Topology, parent: Optional[Topology] = None) -> None:
        """Count a proposal of ``t`` (recording it, with its first proposer, when new)."""
        r = state.records.get(t)
        if r is None:
            c = self.config
            r = state.records[t] = Record(t, t.log_prior(c.alpha_split, c.beta_split), parent=parent)
        r.proposed += 1

    @staticmethod
    def _track(state: DCCState, trace: SampleTrace) -> None:
        state.stats["divergences"] += int(trace.is_divergent.sum())
        state.stats["transitions"] += trace.is_divergent.numel()  # one per chain and NUTS iteration
        state.stats["grad_evals"] += int(trace.n_steps.sum())

    def _activate(self, state: DCCState, ctx: driver.RunContext, new: List[Record], stop=None) -> None:
        """Warm up the new topologies, in batches of ``max(n_parallel, 4)`` (cold ones first);
        once ``stop()`` says the budget is spent, the remaining ones wait (inactive)."""
        c = self.config
        size = max(c.n_parallel, 4)
        records = state.records
        warm = [r for r in new if c.warm_start and r.parent in records and records[r.parent].position is not None]
        cold = [r for r in new if r not in warm]
        for group, is_warm in ((cold, False), (warm, True)):
            for i in range(0, len(group), size):
                if stop is not None and stop():
                    return
                self._activate_batch(state, ctx, group[i : i + size], is_warm, stop)

    def _activate_batch(self, state: DCCState, ctx: driver.RunContext, batch: List[Record], warm: bool,
                        stop=None) -> None:
        """Warm-up then ``n_samples`` draws of a batch of newly active topologies.

        A batch whose warm-up ``stop`` cut, or whose sampling it cut before ``MIN_DRAWS``
        draws, stays inactive and keeps no chains: unadapted chains that may still be in
        their transient are no draws of the posterior, and LAIS needs draws to build its
        proposals from. Its topologies keep their proposal counts (a resumed run with
        more budget warms them up again)."""
        c, x, gen, records = self.config, ctx.setup, state.generator, state.records
        # new splits start from prior draws, so the sharpness is annealed for warm starts
        # too (a hard split gives its threshold almost no gradient to follow)
        model = self._model(ctx, batch, x.h_start, gen)
        if warm:
            pos, inv, step = warm_start_chains(model, batch, records, c.n_chains, ctx.data.task == "regression",
                                               state.bookkeeping)
            if x.informed:
                fresh = torch.stack([
                    torch.tensor([i in r.topology.internal and i not in records[r.parent].topology.internal
                                  for i in range(model.layout.n_internal)], device=pos.device)
                    for r in batch]).repeat_interleave(c.n_chains, 0)
                pos = informed_start(model, pos, fresh, generator=gen).to(pos)
            n_wu = x.n_warmup_warm
            ch, st = warmup(
                self._kernel(model), model.potential_and_grad, pos, n_wu, generator=gen, coord_mask=model.coord_mask,
                step_size=step, inv_mass=inv, target_accept=c.target_accept, monitor=ctx.monitor,
                step_offset=state.hmc_step, sharpness=x.warm_schedule, set_sharpness=model.set_sharpness,
                stop=stop,
            )
        else:
            start = model.theta.data
            if x.informed:
                start = informed_start(model, generator=gen)
            n_wu = x.n_warmup
            ch, st = warmup(
                self._kernel(model), model.potential_and_grad, start, n_wu, generator=gen,
                coord_mask=model.coord_mask, target_accept=c.target_accept, sharpness=x.schedule,
                set_sharpness=model.set_sharpness, monitor=ctx.monitor, step_offset=state.hmc_step, stop=stop,
            )
        state.hmc_step += st["iterations"]
        state.stats["divergences"] += int(st["divergences"].sum())
        state.stats["transitions"] += int(st["iterations"]) * st["divergences"].numel()  # chains move in lockstep
        if not st["completed"]:
            state.stats["warmups_cut"] += len(batch)
            return
        model.set_sharpness(c.h_final)
        ch, tr = draw(self._kernel(model), model.potential_and_grad, ch, c.n_samples, generator=gen,
                      monitor=ctx.monitor, step_offset=state.hmc_step, refresh=True, asynchronous=c.asynchronous,
                      stop=stop)
        state.hmc_step += tr.positions.shape[0]
        self._track(state, tr)
        if tr.positions.shape[0] < MIN_DRAWS:
            state.stats["warmups_cut"] += len(batch)
            return
        lais = self._lais(model, batch, tr.positions, gen, stop)
        if lais is None:
            state.stats["warmups_cut"] += len(batch)
            return
        state.stats["warmups"] += len(batch)
        acc = state.evidence
        acc.extend(len(batch))
        for r in batch:
            r.active, r.selected, r.slot = True, 1, acc.count.shape[0] - len(batch) + batch.index(r)
        self._store(model, batch, ch, tr.positions)
        self._evidence(model, batch, *lais, acc)

    def _model(self, ctx: driver.RunContext, recs: List[Record], h: float, gen) -> SoftTrees:
        c = self.config
        return SoftTrees(
            ctx.data, [r.topology for r in recs], n_chains=c.n_chains, sharpness=h,
            hyper=ctx.setup.hyper, dtype=ctx.data.X.dtype, generator=gen, compile=c.compile and c.asynchronous,
        )

    def _kernel(self, model: SoftTrees):
        """Lockstep NUTS kernel for ``model``; with ``compile=True`` each leapfrog step runs
        as one compiled call (:func:`torchtree.steps.nuts.nuts_step`, ``fused=``), and the
        potential alone is compiled only for asynchronous sampling, which calls it directly."""
        return make_kernel("nuts", max_tree_depth=self.config.max_tree_depth, compact=0.5,
                           fused=model.fused_parts if self.config.compile else None)

    def _store(self, model: SoftTrees, recs: List[Record], chains: ChainState, positions: torch.Tensor) -> None:
        store_chains(model, recs, chains.state.position, chains.step_size, chains.inv_mass, positions,
                     self.config.n_chains)

    def _lais(self, model: SoftTrees, recs, positions: torch.Tensor, gen, stop=None):
        """LAIS log weights and pseudo-samples ``[G, C, T, N_M(, P)]`` of the topologies of
        ``model`` from draws ``[T, B, P]``; None when ``stop`` (asked after every
        ``LAIS_CHUNK`` target evaluations) says the budget ran out."""
        G, C = len(recs), self.config.n_chains
        T, B, P = positions.shape
        draws = positions.reshape(T, G, C, P).permute(1, 2, 0, 3)  # [G, C, T, P]
        mask = model.coord_mask[::C]  # [G, P]
        K = C * T * self.config.n_proposals
        rows = (torch.arange(G, device=positions.device) * C).repeat_interleave(K)

        def log_target(xi):  # [G, K, P] -> [G, K]
            if stop is None:  # one call (the unbudgeted numbers stay those of earlier versions)
                return model.log_density_chunked(xi.reshape(G * K, P), rows).reshape(G, K)
            flat, out = xi.reshape(G * K, P), []
            for i in range(0, G * K, LAIS_CHUNK):
                if stop():
                    raise _BudgetSpent
                out.append(model.log_density_chunked(flat[i : i + LAIS_CHUNK], rows[i : i + LAIS_CHUNK]))
            return torch.cat(out).reshape(G, K)

        try:
            return lais_log_weights(draws, mask, log_target, self.config.n_proposals, gen, self.config.lais_form,
                                    return_samples=True)
        except _BudgetSpent:
            return None

    def _evidence(self, model: SoftTrees, recs, lw: torch.Tensor, xi: torch.Tensor, acc: EvidenceAccumulator) -> None:
        """Fold a LAIS update (:meth:`_lais`) into the evidence and the records."""
        G, C = len(recs), self.config.n_chains
        P = xi.shape[-1]
        acc.update(lw.reshape(G, -1), torch.tensor([r.slot for r in recs]))
        # per-chain evidence of this visit: how much posterior mass each chain's mode holds
        chain_lz = torch.logsumexp(lw.reshape(G, C, -1), -1) - math.log(lw[0, 0].numel())
        n_per_chain = lw[0, 0].numel()
        for m, r in enumerate(recs):
            r.chain_log_z = chain_lz[m].cpu()
            lsw = torch.logsumexp(lw[m].reshape(C, -1), -1).cpu()
            r.chain_log_sum_w = lsw if r.chain_log_sum_w is None else torch.logaddexp(r.chain_log_sum_w, lsw)
            r.chain_n += n_per_chain
        if self.config.local_posterior == "weighted":
            for m, r in enumerate(recs):
                idx = model.compact_index(m)
                r.pseudo.append(xi[m].reshape(-1, P)[:, idx].cpu())
                r.pseudo_logw.append(lw[m].reshape(-1).cpu())
                bound_pseudo(r, self.config.max_predict_draws)

    def _posterior(self, sd, records, acc: EvidenceAccumulator, stats) -> SoftTreePosterior:
        c = self.config
        n = c.max_predict_draws
        active = [r for r in records.values() if r.active]
        tops, draws = [], []
        gen = torch.Generator().manual_seed(len(records))
        for r in active:
            tops.append(r.topology)
            draws.append(local_draws(r, c.local_posterior, n, gen))
        slots = torch.tensor([r.slot for r in active], dtype=torch.long)
        info = {"sampler": self.name, **stats}  # "sampler" as in the hard-tree posteriors' info
        info["n_discovered"] = len(records)
        info["selected_counts"] = ",".join(f"{r.topology.key()}:{r.selected}" for r in active)
        info["local_posterior"] = c.local_posterior
        return SoftTreePosterior(
            sd, c.resolved_hyper(sd), c.h_final, tops, draws,
            acc.log_evidence[slots], torch.tensor([r.log_prior for r in active], dtype=torch.float64), info,
        )
