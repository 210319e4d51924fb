"""Top-down particle filtering for Bayesian decision trees (paper 001).

Stage ``i`` targets the posterior under the prior truncated at stage ``i``.
Every particle grows its tree node by node (``expansion="node"``: the oldest
open leaf, i.e. breadth-first; since children are appended, that is node ``i``
at stage ``i``) or layer by layer (``expansion="layer"``: every open leaf of the
shallowest open depth). Incremental weights:

* ``prior``: ``l(Y_left) l(Y_right) / l(Y_node)`` on a split, 1 on a stop;
* ``empirical``: the same times ``(U - 1) gap / range`` (prior over proposal
  density of the cut, U distinct values in the node);
* ``optimal``: the normaliser of the one-step optimal proposal over
  ``l(Y_node)`` (sec. 3.1).

The running product of the mean incremental weights estimates ``p(Y | X)``.
Islands are independent filters sharing ``n_particles`` equally; their evidence
is combined by log-mean-exp and their posteriors averaged.
"""
from __future__ import annotations

import math
import time
from typing import Optional

import torch

from .checkpoint import Checkpointer, fingerprint
from .data import Data, coerce_data, resolve_device
from .growth import PROPOSALS, Grower
from .likelihoods import DirichletMultinomial, NormalInverseGamma
from .memory import check_tree_memory
from .monitor import NullMonitor, as_monitor
from .posterior import TreePosterior
from .priors import make_prior
from .random import derive_seed, seed_to_int
from .resampling import RESAMPLERS, get_resampler
from .trees import LEAF, OPEN, HardTrees
from .validate import check_backend, check_choice, check_int, check_real

__all__ = ["TopDownSMC", "resolve_device", "default_likelihood", "canonical_ancestors"]

EXPANSIONS = ("node", "layer")
REDISTRIBUTIONS = ("auto", "alltoall", "rotational")


def canonical_ancestors(ancestors: torch.Tensor) -> torch.Tensor:
    """Slot -> ancestor map in canonical order: ``repeat_interleave(arange(m), ncopies)``.

    The order every redistribution (``torchtree.distributed.redistribute``) produces, so a
    resampling step maps global slots to the same ancestors on 1 rank or many. The
    built-in resamplers already return sorted ancestors; a custom one may not.
    """
    return torch.sort(ancestors).values


def default_likelihood(data):
    """Dirichlet-multinomial(alpha=5) for classification, data-scaled NIG for regression."""
    if data.task == "classification":
        return DirichletMultinomial(5.0)
    return NormalInverseGamma.default_for(data.y)


class TopDownSMC:
    """Top-down SMC sampler over decision trees (Lakshminarayanan, Roy & Teh, 2013).

    Parameters
    ----------
    prior : ChipmanPrior or "chipman", optional
        Default ``ChipmanPrior(0.95, 0.5)``.
    likelihood : DirichletMultinomial or NormalInverseGamma, optional
        Default chosen from the data (see :func:`default_likelihood`).
    n_particles : int
        Particles in total, across islands (and ranks).
    n_islands : int
        Independent filters sharing ``n_particles`` equally (must divide it).
    proposal : {"prior", "empirical", "optimal"}
    expansion : {"node", "layer"}
    resampling : {"multinomial", "systematic", "stratified", "residual"}
    ess_threshold : float in [0, 1]
        Resample an island when its ESS < ``ess_threshold`` x its particles.
    device : str or torch.device, optional
        ``"auto"`` = CUDA if present. Default: the data's device.
    backend : torchtree.distributed.Backend or str, optional
        Multi-rank runs (``"gloo"``/``"mpi"``/... resolve with
        ``torchtree.distributed.get_backend``). Each rank holds ``n_particles /
        world_size`` particles (global indices ``rank * n_local + i``) and every rank
        returns the same global posterior; results do not depend on the number of
        ranks. See :mod:`torchtree.topdown_dist` for the layouts and costs.
    redistribution : {"auto", "alltoall", "rotational"}
        How resampled particles move between ranks (``torchtree.distributed.redistribute``).
    max_stages : int
        Safety bound on the number of stages.
    use_likelihood : bool
        False runs the same sampler with the labels ignored (samples the prior).
    max_memory_bytes : int, optional
        Bound on the node-data pool; exceeding it raises ``MemoryError`` with advice
        instead of crashing. Default: half the physical memory (CPU) or of the GPU.
    checkpoint : str, optional
        Path of a checkpoint file (see :mod:`torchtree.checkpoint`). When it exists,
        :meth:`run` resumes from it and returns exactly what an uninterrupted run
        with the same seed returns (on the same kind of device); it is (re)written every ``checkpoint_every``
        stages and at the end, so re-running a finished run returns its posterior
        at once. A checkpoint of another run (other data, settings, seed or number
        of ranks) raises :class:`~torchtree.checkpoint.CheckpointError`. With
        ``seed=None`` the seed drawn by the first run is stored and reused. A
        multi-rank run writes ``checkpoint.rank{r}`` files plus
        ``checkpoint.manifest.json`` and must resume with the same number of ranks.
        Each save holds the particles and the node table (all node records created
        so far and the live point lists), so choose ``checkpoint_every`` so that
        saves stay a small part of the run. None (default): no checkpoints, no cost.
    checkpoint_every : int
        Save after every ``checkpoint_every``-th stage (stages ``k-1, 2k-1, ...``).
    """

    # Test hook: called with the step after every checkpoint save (e.g. to simulate a crash).
    _on_checkpoint = None

    def __init__(
        self,
        prior=None,
        likelihood=None,
        *,
        n_particles: int = 100,
        n_islands: int = 1,
        proposal: str = "prior",
        expansion: str = "node",
        resampling: str = "multinomial",
        ess_threshold: float = 0.1,
        device=None,
        backend=None,
        redistribution: str = "auto",
        max_stages: int = 100000,
        use_likelihood: bool = True,
        max_memory_bytes: Optional[int] = None,
        checkpoint: Optional[str] = None,
        checkpoint_every: int = 1,
    ) -> None:
        n_particles = check_int("n_particles", n_particles, 1)
        n_islands = check_int("n_islands", n_islands, 1)
        if n_particles % n_islands:
            raise ValueError(f"n_islands ({n_islands}) must be >= 1 and divide n_particles ({n_particles})")
        check_choice("proposal", proposal, PROPOSALS)
        check_choice("expansion", expansion, EXPANSIONS)
        check_choice("resampling", resampling, RESAMPLERS)
        check_choice("redistribution", redistribution, REDISTRIBUTIONS)
        ess_threshold = check_real("ess_threshold", ess_threshold, 0.0, 1.0, low_open=False)
        max_stages = check_int("max_stages", max_stages, 1)
        checkpoint_every = check_int("checkpoint_every", checkpoint_every, 1)
        self.prior = make_prior(prior)
        if not hasattr(self.prior, "split_prob"):
            # top-down growth decides node by node: it needs per-node split probabilities
            raise ValueError(f"TopDownSMC needs a prior with per-node split probabilities (ChipmanPrior), got "
                             f"{self.prior!r}; the Poisson prior works with MCMC and SMCSampler "
                             f"(method='mcmc' / 'smc-moves')")
        check_backend(backend)
        self.likelihood = likelihood
        self.n_particles, self.n_islands = n_particles, n_islands
        self.proposal, self.expansion, self.resampling = proposal, expansion, resampling
        self.ess_threshold = ess_threshold
        self.device, self.backend = device, backend
        self.redistribution = redistribution
        self.max_stages = max_stages
        self.use_likelihood = bool(use_likelihood)
        self.max_memory_bytes = max_memory_bytes
        self.checkpoint, self.checkpoint_every = checkpoint, checkpoint_every

    def _fingerprint(self, data, lik, seed_key, world_size: int) -> str:
        """Identity of a run for its checkpoints: what decides the result (not the device,
        memory bound, redistribution method, stage bound, checkpoint or monitor options)."""
        settings = {"prior": _config(self.prior), "likelihood": _config(lik), "n_particles": self.n_particles,
                    "n_islands": self.n_islands, "proposal": self.proposal, "expansion": self.expansion,
                    "resampling": self.resampling, "ess_threshold": self.ess_threshold,
                    "use_likelihood": self.use_likelihood, "task": data.task}
        return fingerprint("TopDownSMC", settings, seed_key, data.X, data.y, int(world_size))

    def _checkpointer(self, data, lik, seed_key, backend=None) -> Checkpointer:
        ws = 1 if backend is None else int(backend.world_size)
        fp = self._fingerprint(data, lik, seed_key, ws) if self.checkpoint is not None else None
        return Checkpointer(self.checkpoint, self.checkpoint_every, backend=backend, fingerprint=fp)

    # ------------------------------------------------------------------ run
    def run(self, data, *, seed=None, monitor=None) -> TreePosterior:
        """Run the particle filter on ``data``.

        Parameters
        ----------
        data : Data, or a pair (X, y)
        seed : int or torch.Generator, optional
        monitor : Monitor or list of Monitors, optional
            Receives per-stage ``smc/ess``, ``smc/log_evidence``, ``smc/resampled``,
            ``trees/leaves_mean``, ``trees/leaves_max``, ``trees/depth_mean``,
            ``trees/depth_max``, ``smc/open_nodes``, ``smc/distinct_nodes``, ``time/seconds``.

        Returns
        -------
        TreePosterior with ``log_evidence`` and ``info`` (per-island evidence,
        stages, resampling count).
        """
        data = coerce_data(data)
        if isinstance(self.backend, str):
            from .distributed import get_backend

            backend = get_backend(self.backend)
            try:
                return self._run(data, backend, seed, monitor)
            finally:
                backend.close()  # destroys only a process group that get_backend opened
        return self._run(data, self.backend, seed, monitor)

    def _run(self, data, backend, seed, monitor) -> TreePosterior:
        if backend is not None and backend.world_size > 1:
            from .topdown_dist import run_distributed

            return run_distributed(self, data, backend, seed=seed, monitor=monitor)
        t0 = time.perf_counter()
        dev = resolve_device(self.device) if self.device is not None else data.device
        if data.device != dev:
            data = data.to(dev)
        lik = self.likelihood if self.likelihood is not None else default_likelihood(data)
        if lik.task != data.task:
            raise ValueError(f"likelihood {lik!r} is for {lik.task} but the data is {data.task}")
        ck = self._checkpointer(data, lik, seed_key(seed), backend)
        saved = ck.load() if ck.enabled else None
        seed_i = int(saved["seed"]) if saved is not None else seed_to_int(seed)
        mon = as_monitor(monitor, rank=None if backend is None else backend.rank)
        P, I = self.n_particles, self.n_islands
        m = P // I
        check_tree_memory("TopDownSMC", P, data, "n_particles", capacity=0, caches=False, per_tree=2 * 4 * 32 + 80)
        grower = Grower(self.prior, lik, data, self.proposal, seed_i, self.use_likelihood)
        grower.table.limit_bytes = self.max_memory_bytes or _default_memory_limit(dev)
        gidx = torch.arange(P, device=dev)
        resample_fn = get_resampler(self.resampling)
        resample_s = 0.0
        if saved is None:
            state = grower.init_state(P)
            logw = torch.zeros(P, dtype=torch.float64, device=dev)
            # Stage 0's target is the root-only tree, whose weight is l(Y) of all the data.
            root_ll = float(lik.log_marginal(grower.table.stats[0])) if self.use_likelihood else 0.0
            logz = torch.full((I,), root_ll, dtype=torch.float64, device=dev)
            n_resample, resample_steps, stage, done = 0, 0, 0, False
        else:
            state = grower.load_state_dict(saved["growth"])
            logw, logz = saved["logw"].to(dev), saved["logz"].to(dev)
            n_resample, resample_steps = int(saved["n_resample"]), int(saved["resample_steps"])
            stage, done = int(saved["stage"]), bool(saved["done"])

        def snapshot(next_stage: int, finished: bool) -> dict:
            return {"stage": next_stage, "done": finished, "seed": seed_i, "logw": logw.clone(), "logz": logz.clone(),
                    "n_resample": n_resample, "resample_steps": resample_steps, "growth": grower.state_dict(state)}

        start_info = {"sampler": "TopDownSMC", "n_particles": P, "n_islands": I, "proposal": self.proposal,
                      "expansion": self.expansion, "n": data.n, "d": data.d}
        if saved is not None:
            start_info["resumed_at_stage"] = stage
        mon.on_start(start_info)
        while stage < self.max_stages:
            if done:  # resumed from the final checkpoint of a finished run
                break
            if self.expansion == "node":
                pp = (state.n_nodes > stage).nonzero().squeeze(1)
                nn = torch.full_like(pp, stage)
            else:
                pp, nn = (grower.slot_status(state) == OPEN).nonzero(as_tuple=True)
            if pp.numel() == 0:
                if ck.enabled and ck.maybe_save(stage, lambda: snapshot(stage, True), last=True):
                    self._checkpoint_saved(stage)
                break
            res = grower.expand(state, pp, nn, gidx[pp], stage)
            incr = torch.zeros(P, dtype=torch.float64, device=dev).index_add_(0, pp, res.log_weight)
            lw2 = logw.view(I, m)
            lwn = lw2 - torch.logsumexp(lw2, 1, keepdim=True)
            logz = logz + torch.logsumexp(lwn + incr.view(I, m), 1)
            logw = logw + incr
            lw2 = logw.view(I, m)
            ess = torch.exp(2 * torch.logsumexp(lw2, 1) - torch.logsumexp(2 * lw2, 1))
            need = (ess < self.ess_threshold * m).nonzero().squeeze(1).tolist()
            if need:
                ts = time.perf_counter()
                anc = torch.arange(P, device=dev)
                for isl in need:
                    g = torch.Generator(device="cpu").manual_seed(derive_seed(seed_i, 1, stage, isl))
                    a = resample_fn(g, lw2[isl], m)
                    anc[isl * m:(isl + 1) * m] = canonical_ancestors(a) + isl * m
                    logw[isl * m:(isl + 1) * m] = 0.0
                state.take_(anc)
                n_resample += len(need)
                if grower.table.needs_compaction():
                    grower.table.compact(grower.open_uids(state))
                resample_s += time.perf_counter() - ts
                resample_steps += 1
            if not isinstance(mon, NullMonitor):
                st = grower.slot_status(state)
                is_leaf = (st == OPEN) | (st == LEAF)
                leaves = is_leaf.sum(1).double()
                depth = torch.where(is_leaf, grower.table.depth[state.node_uid.long()], 0).amax(1).double()
                mon.on_step(stage, {
                    "smc/ess": float(ess.min()),
                    "smc/log_evidence": float(torch.logsumexp(logz, 0) - math.log(I)),
                    "smc/resampled": len(need),
                    "smc/open_nodes": int(pp.numel()),
                    "smc/distinct_nodes": res.n_distinct,
                    "trees/leaves_mean": float(leaves.mean()),
                    "trees/leaves_max": float(leaves.max()),
                    "trees/depth_mean": float(depth.mean()),
                    "trees/depth_max": float(depth.max()),
                    "time/seconds": time.perf_counter() - t0,
                })
            if ck.enabled and ck.maybe_save(stage, lambda: snapshot(stage + 1, False)):
                self._checkpoint_saved(stage)
            stage += 1
        else:
            raise RuntimeError(f"TopDownSMC did not finish within max_stages={self.max_stages}")
        trees = grower.to_trees(state)
        info = {"n_stages": stage, "n_resample": n_resample, "seconds": time.perf_counter() - t0,
                "resample_seconds": resample_s, "resample_steps": resample_steps}
        post = island_posterior(self, trees, logw, logz, lik, data, info, mon)
        return post

    def _checkpoint_saved(self, step: int) -> None:
        if self._on_checkpoint is not None:
            self._on_checkpoint(step)


def island_posterior(smc: "TopDownSMC", trees: HardTrees, logw: torch.Tensor, logz: torch.Tensor, lik, data: Data,
                     info: dict, monitor) -> TreePosterior:
    """The posterior of a finished run: islands weighted equally, each normalised.

    Shared by the one-process and the multi-rank runs so that both report alike.

    Parameters
    ----------
    smc : TopDownSMC, trees : HardTrees [P trees], logw : Tensor [P] (island-major),
    logz : Tensor [I] per-island log evidence, lik : likelihood, data : Data
    info : dict, run facts to add (``n_stages``, ``seconds``, ...)
    monitor : Monitor, gets ``on_end``

    Returns
    -------
    TreePosterior with final log weights summing to one over all P particles.
    """
    I = logz.numel()
    lw2 = logw.view(I, -1)
    final_lw = (lw2 - torch.logsumexp(lw2, 1, keepdim=True) - math.log(I)).reshape(-1)
    log_evidence = float(torch.logsumexp(logz, 0) - math.log(I))
    ess_final = torch.exp(2 * torch.logsumexp(lw2, 1) - torch.logsumexp(2 * lw2, 1))
    info = {
        "sampler": "TopDownSMC",
        "proposal": smc.proposal,
        "expansion": smc.expansion,
        "island_log_evidence": logz.cpu().tolist(),
        "island_ess": ess_final.cpu().tolist(),
        **info,
    }
    post = TreePosterior(trees, final_lw, lik, data.d, classes=data.classes_, log_evidence=log_evidence, info=info)
    monitor.on_end({"log_evidence": log_evidence, "seconds": info.get("seconds"), "n_stages": info.get("n_stages"),
                    "posterior": post})
    return post


def seed_key(seed):
    """What of ``seed`` identifies a run in a checkpoint fingerprint: the seed itself, or
    ``"drawn"`` for None / a ``torch.Generator`` (the drawn seed is then stored in the
    checkpoint and reused on resume)."""
    if seed is None or isinstance(seed, torch.Generator):
        return "drawn"
    return seed_to_int(seed)


def _config(obj):
    """A plain, exact description of a prior or likelihood (``config()`` where it has one)."""
    cfg = getattr(obj, "config", None)
    if callable(cfg):
        try:
            return cfg()
        except Exception:  # pragma: no cover - fall back to the repr
            pass
    import re

    return re.sub(r" at 0x[0-9a-fA-F]+", "", repr(obj))


def _default_memory_limit(dev: torch.device) -> int:
    if dev.type == "cuda":
        free, total = torch.cuda.mem_get_info(dev)
        return int(0.5 * total)
    try:
        import os

        return int(0.5 * os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES"))
    except (ValueError, OSError, AttributeError):  # pragma: no cover
        return 8 << 30
