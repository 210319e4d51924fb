"""``HMC`` and ``NUTS`` samplers: batched chains on soft trees or on any potential.

Two ways in:

* ``NUTS(...).run(data, seed=..., monitor=...)`` samples the soft tree of one
  topology (``topology=`` or a full tree of ``depth=``) with ``n_chains`` chains and
  returns a :class:`~torchtree.model.soft_posterior.SoftTreePosterior` (optionally with a
  LAIS evidence estimate);
* ``NUTS(...).sample(potential_and_grad, init, seed=...)`` samples any batched
  potential ``[B, P] -> ([B], [B, P])`` and returns an :class:`MCMCResult`.

Both run warm-up (Stan windows, per-chain dual averaging and diagonal mass matrix,
optional sharpness annealing ``h_init -> h_final``) and then sampling, all chains in
lockstep (see :mod:`torchtree.samplers.soft_chains`); ``NUTS(asynchronous=True)`` samples with
each chain at its own pace instead (see :mod:`torchtree.steps.nuts_async`).
"""
from __future__ import annotations

import time
from typing import Any, Callable, NamedTuple, Optional

import torch

from torchtree.model.data import resolve_device
from torchtree.core.validate import check_choice, check_int, check_real
from torchtree.core.memory import check_soft_memory

from torchtree.steps.adaptation import sharpness_schedule
from torchtree.samplers.soft_chains import ChainState, SampleTrace, draw, make_kernel, notify, warmup
from torchtree.model.soft_data import FLOAT_DTYPES, as_soft_data
from torchtree.steps.soft_init import INIT_MODES, informed_start
from torchtree.samplers.dcc.lais import EvidenceAccumulator, lais_log_weights
from torchtree.model.soft_posterior import SoftTreePosterior
from torchtree.model.topology import Topology
from torchtree.model.soft_trees import SoftTreeHyper, SoftTrees

__all__ = ["MCMCResult", "NUTS", "HMC"]

# default of ``NUTS(asynchronous=...)``: chosen by measurement (not faster on the
# soft-tree benchmark), see the class docstring
ASYNC_DEFAULT = False


class MCMCResult(NamedTuple):
    """Output of :meth:`NUTS.sample` / :meth:`HMC.sample`.

    Attributes
    ----------
    samples : Tensor [S, B, P], kept draws (``S = n_samples``)
    trace : SampleTrace, per-draw diagnostics
    chains : ChainState, final state with adapted step sizes and inverse masses
    warmup_stats : dict, ``accept_prob [B]`` and ``divergences [B]`` of warm-up
    seconds : float, wall time
    """

    samples: torch.Tensor
    trace: SampleTrace
    chains: ChainState
    warmup_stats: dict
    seconds: float


class NUTS:
    """Batched multinomial NUTS with per-chain adaptation, on soft trees.

    Parameters
    ----------
    n_chains : int
    n_samples : int, kept draws per chain
    n_warmup : int
    thin : int
    depth : int, full-tree depth when ``topology`` is not given
    topology : Topology or iterable of internal node ids, optional
    sharpness : float, final split sharpness ``h`` (``h_final``)
    h_init : float, optional, start of the warm-up annealing (default: no annealing)
    max_tree_depth : int
    target_accept : float
    max_energy_error : float, divergence threshold
    hyper : SoftTreeHyper, optional
    alpha : float, optional, Dirichlet-multinomial total concentration
    split_concentration : float, optional
    signed_splits : bool, optional
        Split weights over the inputs and their mirror images ``1 - x`` (not in
        the paper; see :class:`~torchtree.model.soft_trees.SoftTreeHyper`).
    evidence : bool, estimate ``log Z`` of the topology with LAIS after sampling
        (needs ``n_samples >= 2``)
    n_proposals : int, LAIS pseudo-samples per draw
    device : str ("auto" = CUDA if present), dtype : torch.dtype
    n_leapfrog : int, leapfrog steps per HMC iteration (HMC only)
    compile : bool, run the soft-tree potential through ``torch.compile``; with NUTS
        (lockstep), each leapfrog step and its bookkeeping run as one compiled call
        (``nuts_step(fused=...)``), which removes most of the per-step overhead of small
        batches; costs 20-60 s of compilation once per process and tree depth
    asynchronous : bool, NUTS only (default False)
        Sampling phase without a barrier between transitions: each chain starts its
        next transition as soon as its trajectory ends, so a transition no longer
        costs the deepest chain's trajectory
        (:func:`torchtree.steps.nuts_async.nuts_draw_async`). Same kernel, same
        stationary distribution; draws differ from ``False`` (lockstep
        :func:`torchtree.steps.nuts.nuts_step`) because random numbers are consumed in
        another order. Warm-up is always in lockstep. Ignored by :class:`HMC`.
        Not the default because it was not faster where measured
        (``examples/bench_dcc.py --only-throughput [--nuts-async]``, 32 chains, one
        CPU thread): sampling phase 36-40 vs 31-33 CPU s on WU, 9.5-10.5 vs 9.1-13.3
        on iris. With chains this small a tick's bookkeeping costs about as much as
        a gradient, and on WU one chain needs the depth cap in almost every
        transition, so there is little waiting to remove (iris: ~30% fewer batched
        steps, eaten by the bookkeeping). It pays when gradients are expensive
        relative to ~100 small tensor operations and the deepest chain changes from
        transition to transition.
    init : {"prior", "data"}
        Chains start from prior draws ("prior") or from randomised greedy splits of the
        training data (``"data"``, :func:`torchtree.steps.soft_init.informed_start`); the
        target is the same either way. With ``"data"`` the warm-up runs at the final
        sharpness (``h_init`` is ignored): annealing from a soft start moved CGM
        chains started in the true partition out of it.
    """

    kind = "nuts"

    def __init__(
        self,
        n_chains: int = 4,
        n_samples: int = 500,
        n_warmup: int = 500,
        thin: int = 1,
        *,
        depth: int = 2,
        topology: Any = None,
        sharpness: float = 0.05,
        h_init: Optional[float] = None,
        max_tree_depth: int = 10,
        target_accept: float = 0.8,
        max_energy_error: float = 1000.0,
        hyper: Optional[SoftTreeHyper] = None,
        alpha: Optional[float] = None,
        split_concentration: Optional[float] = None,
        signed_splits: Optional[bool] = None,
        evidence: bool = False,
        n_proposals: int = 5,
        device: Any = "auto",
        dtype: torch.dtype = torch.float32,
        n_leapfrog: int = 10,
        compile: bool = False,
        asynchronous: bool = ASYNC_DEFAULT,
        init: str = "prior",
    ) -> None:
        self.n_chains = check_int("n_chains", n_chains, 1)
        self.n_samples = check_int("n_samples", n_samples, 1)
        self.n_warmup = check_int("n_warmup", n_warmup, 0)
        self.thin = check_int("thin", thin, 1)
        self.topology = Topology.coerce(topology if topology is not None else check_int("depth", depth, 1))
        if self.topology.n_internal == 0:
            raise ValueError("the topology needs at least one split (depth >= 1)")
        self.sharpness = check_real("sharpness", sharpness, 0.0)
        self.h_init = None if h_init is None else check_real("h_init", h_init, 0.0)
        self.max_tree_depth = check_int("max_tree_depth", max_tree_depth, 1)
        self.n_leapfrog = check_int("n_leapfrog", n_leapfrog, 1)
        self.target_accept = check_real("target_accept", target_accept, 0.0, 1.0, high_open=True)
        self.max_energy_error = check_real("max_energy_error", max_energy_error, 0.0)
        self.hyper = SoftTreeHyper.with_overrides(
            hyper, alpha=alpha, split_concentration=split_concentration, signed_splits=signed_splits)
        self.evidence = bool(evidence)
        if self.evidence and self.n_samples < 2:
            raise ValueError(f"evidence=True needs n_samples >= 2 (LAIS builds its proposals from the draws), "
                             f"got n_samples={self.n_samples}")
        self.n_proposals = check_int("n_proposals", n_proposals, 1)
        self.device = device
        self.dtype = check_choice("dtype", dtype, FLOAT_DTYPES)
        self.compile = bool(compile)
        self.asynchronous = bool(asynchronous)
        self.init = check_choice("init", init, INIT_MODES)

    def _kernel(self, compact: float = 0.0, fused: Optional[Callable] = None):
        return make_kernel(
            self.kind, max_tree_depth=self.max_tree_depth, n_leapfrog=self.n_leapfrog,
            max_energy_error=self.max_energy_error, compact=compact, fused=fused,
        )

    # ----------------------------------------------------------------- generic
    def sample(
        self,
        potential_and_grad: Callable,
        init: torch.Tensor,
        *,
        seed: Optional[int] = 0,
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
        seed : int, optional
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
        gen = generator or torch.Generator(device=init.device).manual_seed(0 if seed is None else int(seed))
        kernel = self._kernel(compact, fused)
        notify(monitor, "on_start", {
            "method": self.kind, "n_chains": int(init.shape[0]), "n_samples": self.n_samples,
            "n_warmup": self.n_warmup, "total": self.n_warmup + self.n_samples * self.thin,
        })
        chains, wstats = warmup(
            kernel, potential_and_grad, init, self.n_warmup, generator=gen, coord_mask=coord_mask,
            target_accept=self.target_accept, sharpness=sharpness_schedule_, set_sharpness=set_sharpness,
            monitor=monitor,
        )
        chains, trace = draw(
            kernel, potential_and_grad, chains, self.n_samples, generator=gen, thin=self.thin,
            monitor=monitor, step_offset=self.n_warmup, refresh=sharpness_schedule_ is not None,
            asynchronous=self.asynchronous,
        )
        seconds = time.perf_counter() - t0
        notify(monitor, "on_end", {
            "hmc/accept": float(trace.accept_prob.mean()) if trace.accept_prob.numel() else float("nan"),
            "hmc/divergences": int(trace.is_divergent.sum()),
            "hmc/step_size": float(chains.step_size.mean()),
            "seconds": seconds,
        })
        return MCMCResult(trace.positions, trace, chains, wstats, seconds)

    # ----------------------------------------------------------------- soft trees
    def model(self, data, y=None, generator: Optional[torch.Generator] = None) -> SoftTrees:
        """The :class:`SoftTrees` batch this sampler runs on ``data`` (one topology)."""
        sd = as_soft_data(data, y, dtype=self.dtype, device=resolve_device(self.device),
                          signed=self.hyper.signed_splits)
        check_soft_memory(type(self).__name__, self.n_chains, sd, self.topology, self.n_samples, "n_chains (or n_samples)")
        h0 = self.h_init if self.h_init is not None and self.init == "prior" else self.sharpness
        return SoftTrees(
            sd, [self.topology], n_chains=self.n_chains, sharpness=h0, hyper=self.hyper,
            dtype=self.dtype, generator=generator, compile=self.compile and not self._fuses_steps,
        )

    @property
    def _fuses_steps(self) -> bool:
        """Whether every potential evaluation on a hot path goes through the fused,
        compiled NUTS step (lockstep NUTS), so the potential itself need not be compiled
        too (that would cost a second compilation for a few calls per window)."""
        return self.compile and self.kind == "nuts" and not self.asynchronous

    def run(self, data, y=None, *, seed: Optional[int] = 0, monitor=None) -> SoftTreePosterior:
        """Sample the soft tree of one topology on ``data``.

        Parameters
        ----------
        data : torchtree.Data, (X, y), or Tensor X [N, D] (with ``y``)
        y : Tensor [N], optional
        seed : int, optional
        monitor : Monitor or list, optional

        Returns
        -------
        SoftTreePosterior with one topology (``n_chains * n_samples`` draws) and, with
        ``evidence=True``, its LAIS log evidence.
        """
        dev = resolve_device(self.device)
        gen = torch.Generator(device=dev).manual_seed(0 if seed is None else int(seed))
        model = self.model(data, y, generator=gen)
        if self.init == "data":
            model.theta.data = informed_start(model, generator=gen)
        sched = None
        # a data-informed start is already in a sharp partition; annealing from a soft
        # start would move the chains out of it, so it applies to prior starts only
        if self.init == "prior" and self.h_init is not None and self.h_init != self.sharpness:
            sched = sharpness_schedule(self.n_warmup, self.h_init, self.sharpness)
        res = self.sample(
            model.potential_and_grad, model.theta.data, monitor=monitor, coord_mask=model.coord_mask,
            sharpness_schedule_=sched, set_sharpness=model.set_sharpness, generator=gen, compact=0.5,
            fused=model.fused_parts if self.compile else None,
        )
        model.set_sharpness(self.sharpness)
        idx = model.compact_index(0)
        draws = res.samples[:, :, idx].reshape(-1, idx.numel()).cpu()
        log_z = None
        if self.evidence and res.samples.shape[0] > 1:
            acc = EvidenceAccumulator(1)
            mask = model.coord_mask[:1]
            C, T, P = self.n_chains, res.samples.shape[0], model.n_params
            K = C * T * self.n_proposals
            rows = torch.zeros(K, dtype=torch.long, device=dev)
            lw = lais_log_weights(
                res.samples.permute(1, 0, 2).unsqueeze(0), mask,
                lambda xi: model.log_density_chunked(xi.reshape(K, P), rows).reshape(1, K),
                self.n_proposals, gen,
            )
            acc.update(lw.reshape(1, -1))
            log_z = acc.log_evidence
        info = {
            "method": self.kind,
            "seconds": res.seconds,
            "accept": float(res.trace.accept_prob.mean()),
            "divergences": int(res.trace.is_divergent.sum()),
            "step_size": float(res.chains.step_size.mean()),
            "mean_tree_depth": float(res.trace.tree_depth.float().mean()),
            "grad_evals": int(res.trace.n_steps.sum()),
        }
        return SoftTreePosterior(model.data, model.hyper, self.sharpness, [self.topology], [draws], log_z, None, info)


class HMC(NUTS):
    """Batched static HMC (``n_leapfrog`` steps, jittered step size) on soft trees.

    Same parameters as :class:`NUTS` plus ``n_leapfrog`` (``max_tree_depth`` unused).
    """

    kind = "hmc"
