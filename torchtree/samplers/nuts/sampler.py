"""``NUTS`` and ``HMC``: the samplers of :mod:`torchtree.samplers.nuts` (see the package for the method)."""
from __future__ import annotations

import time
from typing import Any, Callable, Dict, Optional, Tuple

import torch

from torchtree.core.memory import check_soft_memory

from torchtree.core.random import seed_to_int
from torchtree.model.soft_data import SoftData, as_soft_data
from torchtree.model.soft_posterior import SoftTreePosterior
from torchtree.model.soft_trees import SoftTreeHyper, SoftTrees
from torchtree.model.topology import Topology
from torchtree.monitor import as_monitor
from torchtree.samplers import driver
from torchtree.samplers.dcc.lais import EvidenceAccumulator, lais_log_weights
from torchtree.samplers.base import SamplerBase
from torchtree.samplers.nuts.chains import ChainState, SampleTrace, draw, make_kernel, warmup
from torchtree.steps.adaptation import sharpness_schedule
from torchtree.steps.soft_init import informed_start

from torchtree.samplers.nuts.config import NUTSConfig
from torchtree.samplers.nuts.state import MCMCResult, NUTSState

__all__ = ["NUTS", "HMC"]


# default of ``NUTS(asynchronous=...)``: chosen by measurement (not faster on the
# soft-tree benchmark), see the class docstring
class NUTS(SamplerBase):
    """Batched multinomial NUTS with per-chain adaptation, on soft trees.

    The No-U-Turn sampler of Hoffman & Gelman (2014), "The No-U-Turn Sampler: adaptively setting
    path lengths in Hamiltonian Monte Carlo", JMLR 15, with multinomial sampling of the trajectory
    (Betancourt 2017, "A conceptual introduction to Hamiltonian Monte Carlo"); the soft-tree model
    and its priors are paper 004's (eq. 4-9).

    Settings: :class:`NUTSConfig` (``n_chains``, ``n_samples``, ``n_warmup`` and ``thin``
    may be given by position), readable as attributes.

    ``compile``: the soft-tree potential runs through ``torch.compile``; with lockstep
    NUTS each leapfrog step and its bookkeeping run as one compiled call
    (``nuts_step(fused=...)``), which removes most of the per-step overhead of small
    batches, after a compilation once per process and tree depth.

    ``asynchronous`` (NUTS only, default False): the sampling phase runs without a barrier
    between transitions, each chain starting its next transition as soon as its trajectory
    ends (:func:`torchtree.steps.nuts_async.nuts_draw_async`). Same kernel, same stationary
    distribution; the draws differ from lockstep ones because random numbers are consumed
    in another order. Warm-up is always in lockstep. A tick's bookkeeping costs about as much
    as a gradient of a small batch, and where one chain needs the depth cap in almost every
    transition there is little waiting to remove; it pays when gradients are expensive
    relative to ~100 small tensor operations and the deepest chain changes from transition
    to transition.

    ``init="data"``: chains start from randomised greedy splits of the training data
    (:func:`torchtree.steps.soft_init.informed_start`); the target is the same. The warm-up
    then runs at the final sharpness (``h_init`` is ignored): annealing from a soft start
    moved CGM chains started in the true partition out of it.
    """

    kind = "nuts"
    config_class = NUTSConfig

    def __init__(self, n_chains: int = 4, n_samples: int = 500, n_warmup: int = 500, thin: int = 1,
                 **settings: Any) -> None:
        self.config = NUTSConfig.of(self.name, n_chains=n_chains, n_samples=n_samples, n_warmup=n_warmup, thin=thin, **settings)
        _ = self.hyper  # the overrides are checked now, not at the first run

    @property
    def name(self) -> str:
        """The class name (``"NUTS"``, ``"HMC"``): the sampler's name in checkpoints and messages."""
        return type(self).__name__

    @property
    def topology(self) -> Topology:
        """The sampled topology (``topology``, or the full tree of ``depth``)."""
        return self.config.tree_topology()

    @property
    def hyper(self) -> SoftTreeHyper:
        """``hyper`` with the overrides (data-dependent defaults still unresolved)."""
        return self.config.soft_hyper()

    def _kernel(self, compact: float = 0.0, fused: Optional[Callable] = None):
        c = self.config
        return make_kernel(self.kind, max_tree_depth=c.max_tree_depth, n_leapfrog=c.n_leapfrog,
                           max_energy_error=c.max_energy_error, compact=compact, fused=fused)

    # ----------------------------------------------------------------- generic
    def sample(
        self,
        potential_and_grad: Callable,
        init: torch.Tensor,
        *,
        seed: Optional[int] = None,
        monitor=None,
        coord_mask: Optional[torch.Tensor] = None,
        sharpness_schedule_: Optional[list] = None,
        set_sharpness: Optional[Callable[[float], None]] = None,
        generator: Optional[torch.Generator] = None,
        compact: float = 0.0,
        fused: Optional[Callable] = None,
    ) -> MCMCResult:
        """Sample any batched potential with ``B = init.shape[0]`` chains.

        Parameters
        ----------
        potential_and_grad : callable [B, P] -> (U [B], grad [B, P])
        init : Tensor [B, P], initial positions
        seed : int, optional; None draws a fresh seed (an int reproduces)
        monitor : Monitor or list, optional (``hmc/...`` tags every iteration)
        coord_mask : BoolTensor [B, P], optional, frozen coordinates are False
        sharpness_schedule_, set_sharpness : optional warm-up annealing hooks
        generator : torch.Generator, optional (overrides ``seed``)
        compact : float, NUTS live-chain compaction threshold (needs a potential
            accepting ``rows``; see :func:`torchtree.steps.nuts.nuts_step`)
        fused : callable, optional, NUTS: the potential as ``rows -> (core, tensors,
            consts)`` for a compiled leapfrog step (see :func:`torchtree.steps.nuts.nuts_step`)

        Returns
        -------
        MCMCResult
        """
        t0 = time.perf_counter()
        c = self.config
        gen = generator or torch.Generator(device=init.device).manual_seed(seed_to_int(seed))
        kernel = self._kernel(compact, fused)
        monitor = as_monitor(monitor)
        monitor.on_start({"sampler": self.name, "method": self.kind, "n_chains": int(init.shape[0]),
                          "n_samples": c.n_samples, "n_warmup": c.n_warmup})
        chains, wstats = warmup(
            kernel, potential_and_grad, init, c.n_warmup, generator=gen, coord_mask=coord_mask,
            target_accept=c.target_accept, sharpness=sharpness_schedule_, set_sharpness=set_sharpness,
            monitor=monitor,
        )
        chains, trace = draw(
            kernel, potential_and_grad, chains, c.n_samples, generator=gen, thin=c.thin,
            monitor=monitor, step_offset=c.n_warmup, refresh=sharpness_schedule_ is not None,
            asynchronous=c.asynchronous,
        )
        seconds = time.perf_counter() - t0
        monitor.on_end({**_summary(trace, chains), "seconds": seconds})
        return MCMCResult(trace.positions, trace, chains, wstats, seconds)

    # ----------------------------------------------------------------- soft trees
    def model(self, data, y=None, generator: Optional[torch.Generator] = None) -> SoftTrees:
        """The :class:`SoftTrees` batch this sampler runs on ``data`` (one topology)."""
        c = self.config
        sd = self.prepare(data if y is None else (data, y), c.device)
        h0 = c.h_init if c.h_init is not None and c.init == "prior" else c.sharpness
        return SoftTrees(
            sd, [self.topology], n_chains=c.n_chains, sharpness=h0, hyper=self.hyper,
            dtype=sd.X.dtype, generator=generator, compile=c.compile and not self._fuses_steps,
        )

    @property
    def _fuses_steps(self) -> bool:
        """Whether every potential evaluation on a hot path goes through the fused,
        compiled NUTS step (lockstep NUTS), so the potential itself need not be compiled
        too (that would cost a second compilation for a few calls per window)."""
        return self.config.compile and self.kind == "nuts" and not self.config.asynchronous

    def run(self, data: Any, y: Any = None, *, seed: int | torch.Generator | None = None, monitor: Any = None,
            backend: None = None) -> SoftTreePosterior:
        """Sample the soft tree of one topology on ``data`` (through :func:`torchtree.samplers.driver.run`).

        Parameters
        ----------
        data : torchtree.Data, (X, y), or Tensor X [N, D] (with ``y``)
        y : Tensor [N], optional
        seed : int or torch.Generator, optional; None (default) draws a fresh seed, an int reproduces
        monitor : Monitor or list, optional
            Receives ``on_start``, ``on_step`` (``hmc/...`` tags every NUTS iteration,
            warm-up then sampling) and ``on_end``.
        backend : None
            The chains run in one process: a backend is refused (``TypeError``).

        Returns
        -------
        SoftTreePosterior with one topology (``n_chains * n_samples`` draws) and, with
        ``evidence=True``, its LAIS log evidence.
        """
        if backend is not None:
            raise TypeError(f"{type(self).__name__} runs in one process: it takes no backend (ranks), got {backend!r}")
        if y is not None:
            data = (data, y)
        return driver.run(self, data, seed=seed, monitor=monitor)

    # ------------------------------------------------------------ protocol
    def prepare(self, data, device) -> SoftData:
        """``data`` as SoftData (inputs scaled to [0, 1]) on ``device`` (None: the data's own)."""
        return as_soft_data(data, dtype=self.config.dtype, device=device, signed=self.hyper.signed_splits)

    def start_info(self, ctx: driver.RunContext) -> Dict[str, Any]:
        c = self.config
        # total: the on_step calls to expect (one per warm-up and per sampling iteration)
        return {"method": self.kind, "n_chains": c.n_chains, "n_samples": c.n_samples, "n_warmup": c.n_warmup,
                "total": c.n_warmup + c.n_samples * c.thin}

    def init(self, ctx: driver.RunContext) -> NUTSState:
        """The chains' starting positions: prior draws, or data-informed splits."""
        check_soft_memory(type(self).__name__, self.config.n_chains, ctx.data, self.config.tree_topology(), self.config.n_samples,
                          "n_chains (or n_samples)")
        gen = torch.Generator(device=ctx.device).manual_seed(ctx.seed)
        model = self.model(ctx.data, generator=gen)
        if self.config.init == "data":
            model.theta.data = informed_start(model, generator=gen)
        return NUTSState(step=0, done=False, model=model, generator=gen, position=model.theta.data)

    def step(self, state: NUTSState, ctx: driver.RunContext) -> Tuple[NUTSState, None]:
        """Step 0: warm-up (with the sharpness annealing); step 1: sampling."""
        c, model = self.config, state.model
        kernel = self._kernel(0.5, model.fused_parts if c.compile else None)
        # a data-informed start is already in a sharp partition; annealing from a soft
        # start would move the chains out of it, so it applies to prior starts only
        sched = None
        if c.init == "prior" and c.h_init is not None and c.h_init != c.sharpness:
            sched = sharpness_schedule(c.n_warmup, c.h_init, c.sharpness)
        if state.step == 0:
            state.chains, state.warmup_stats = warmup(
                kernel, model.potential_and_grad, state.position, c.n_warmup, generator=state.generator,
                coord_mask=model.coord_mask, target_accept=c.target_accept, sharpness=sched,
                set_sharpness=model.set_sharpness, monitor=ctx.monitor,
            )
        else:
            state.chains, state.trace = draw(
                kernel, model.potential_and_grad, state.chains, c.n_samples, generator=state.generator, thin=c.thin,
                monitor=ctx.monitor, step_offset=c.n_warmup, refresh=sched is not None, asynchronous=c.asynchronous,
            )
            state.done = True
        state.step += 1
        return state, None  # the hmc/... tags went out per NUTS iteration

    def finalize(self, state: NUTSState, ctx: driver.RunContext) -> SoftTreePosterior:
        """The draws (compact coordinates of the topology) and, with ``evidence``, LAIS's log Z."""
        c, model, trace, gen = self.config, state.model, state.trace, state.generator
        model.set_sharpness(c.sharpness)
        samples = trace.positions  # [S, C, P]
        idx = model.compact_index(0)
        draws = samples[:, :, idx].reshape(-1, idx.numel()).cpu()
        log_z = None
        if c.evidence and samples.shape[0] > 1:
            acc = EvidenceAccumulator(1)
            mask = model.coord_mask[:1]
            C, T, P = c.n_chains, samples.shape[0], model.n_params
            K = C * T * c.n_proposals
            rows = torch.zeros(K, dtype=torch.long, device=ctx.device)
            lw = lais_log_weights(
                samples.permute(1, 0, 2).unsqueeze(0), mask,
                lambda xi: model.log_density_chunked(xi.reshape(K, P), rows).reshape(1, K),
                c.n_proposals, gen,
            )
            acc.update(lw.reshape(1, -1))
            log_z = acc.log_evidence
        info = {
            "sampler": self.name,  # as in the hard-tree posteriors' info
            "method": self.kind,
            "seconds": ctx.seconds(),
            "accept": float(trace.accept_prob.mean()),
            "divergences": int(trace.is_divergent.sum()),
            "step_size": float(state.chains.step_size.mean()),
            "mean_tree_depth": float(trace.tree_depth.float().mean()),
            "grad_evals": int(trace.n_steps.sum()),
            "n_chains": int(samples.shape[1]),  # draws are draw-major: row s * n_chains + c is chain c's s-th
        }
        return SoftTreePosterior(model.data, model.hyper, c.sharpness, [self.topology], [draws], log_z, None, info)

    def end_info(self, post: SoftTreePosterior) -> Dict[str, Any]:
        return _end_values(post.info["accept"], post.info["divergences"], post.info["step_size"])


def _end_values(accept: float, divergences: int, step_size: float) -> Dict[str, float]:
    """What ``Monitor.on_end`` receives: the sampling phase's mean acceptance probability, its divergent
    transitions in all and the final mean step size, under names of their own (the ``hmc/...`` tags are per
    iteration: a run's mean and total written there made one step show two values, and a total a spike)."""
    return {"accept": accept, "divergences": divergences, "step_size": step_size}


def _summary(trace: SampleTrace, chains: ChainState) -> Dict[str, float]:
    """The end-of-run monitor values of a sampling phase (:func:`_end_values`)."""
    return _end_values(float(trace.accept_prob.mean()) if trace.accept_prob.numel() else float("nan"),
                       int(trace.is_divergent.sum()), float(chains.step_size.mean()))


class HMC(NUTS):
    """Batched static HMC (``n_leapfrog`` steps, jittered step size) on soft trees.

    Same settings as :class:`NUTS` (``n_leapfrog`` is HMC's; ``max_tree_depth`` and
    ``asynchronous`` are unused).
    """

    kind = "hmc"
