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

import math
import random as _pyrandom
import time
from dataclasses import asdict, dataclass, field
from typing import Any, Dict, List, Optional, Sequence

import torch

from torchtree.model.data import resolve_device
from torchtree.model.priors import check_split_prior
from torchtree.core.validate import check_choice, check_int, check_probabilities, check_real
from torchtree.core.memory import check_memory, lais_bytes

from torchtree.steps.adaptation import sharpness_schedule
from torchtree.samplers.soft_chains import ChainState, draw, make_kernel, notify, warmup
from torchtree.steps.hmc import hmc_init
from torchtree.model.soft_data import FLOAT_DTYPES, as_soft_data
from torchtree.samplers.dcc.lais import EvidenceAccumulator, lais_log_weights
from torchtree.steps.soft_init import INIT_MODES, informed_start
from torchtree.model.soft_posterior import SoftTreePosterior
from torchtree.model.topology import Topology, propose_topology, sample_prior_topologies
from torchtree.model.soft_trees import SoftTreeHyper, SoftTrees
from torchtree.samplers.dcc.utility import dcc_utility

__all__ = ["DCC"]


@dataclass
class _Record:
    """Bookkeeping of one discovered topology."""

    topology: Topology
    log_prior: float
    proposed: int = 0
    selected: int = 0
    active: bool = False
    slot: int = -1  # row in the evidence accumulator
    position: Optional[torch.Tensor] = None  # [C, P_m] compact
    step_size: Optional[torch.Tensor] = None  # [C]
    inv_mass: Optional[torch.Tensor] = None  # [C, P_m]
    draws: List[torch.Tensor] = field(default_factory=list)  # each [T, C, P_m]
    pseudo: List[torch.Tensor] = field(default_factory=list)  # LAIS pseudo-samples, each [K, P_m]
    pseudo_logw: List[torch.Tensor] = field(default_factory=list)  # their log weights, each [K]
    parent: Optional[Topology] = None  # topology whose global move first proposed this one
    chain_log_z: Optional[torch.Tensor] = None  # [C] per-chain LAIS evidence of the latest visit
    chain_log_sum_w: Optional[torch.Tensor] = None  # [C] log sum of each chain's weights, all visits
    chain_n: int = 0  # weights per chain so far
    draw_chain: List[torch.Tensor] = field(default_factory=list)  # chain index of each stored draw


def _compact_keys(topology: Topology, n_features: int, regression: bool) -> List[tuple]:
    """Meaning of each compact coordinate (same order as ``ParamLayout.compact_index``)."""
    keys: List[tuple] = [("w", i, k) for i in topology.internal for k in range(n_features - 1)]
    keys += [("u", i) for i in topology.internal]
    if regression:
        keys += [("mu", l) for l in topology.leaves] + [("s",)]
    return keys


def _inherit(child: Topology, parent: Topology, n_features: int, regression: bool) -> List[List[int]]:
    """For each compact coordinate of ``child``, the parent coordinates it copies (averaged).

    Shared split nodes keep their weights and thresholds; a leaf created by a grow
    move inherits its parent leaf's mean; a leaf created by a prune move takes the
    mean of the two leaves it replaces; a new split gets nothing (empty list).
    """
    pk = {k: j for j, k in enumerate(_compact_keys(parent, n_features, regression))}
    out: List[List[int]] = []
    for key in _compact_keys(child, n_features, regression):
        if key in pk:
            out.append([pk[key]])
        elif key[0] == "mu":
            l = key[1]
            up = ("mu", (l - 1) // 2) if l > 0 else None
            down = [("mu", 2 * l + 1), ("mu", 2 * l + 2)]
            if up in pk:
                out.append([pk[up]])
            elif all(d in pk for d in down):
                out.append([pk[d] for d in down])
            else:
                out.append([])
        else:
            out.append([])
    return out


class DCC:
    """Divide-Conquer-Combine sampler over soft-tree topologies (``method="dcc"``).

    Parameters
    ----------
    n_iterations : int, T (paper: 500)
    n_initial : int, T0 topologies drawn from the prior (paper code: 100)
    n_chains : int, N_c chains per topology (paper code: 16)
    n_samples : int, N_s NUTS draws per chain and visit (paper: 100)
    n_warmup : int, N_init warm-up iterations for a new topology (paper: 1000-5000)
    activation_threshold : int, C0
    n_proposals : int, N_M LAIS pseudo-samples per draw (paper: 10)
    n_parallel : int, topologies refined together per iteration (1 = paper)
    max_depth : int, deepest leaf allowed
    alpha_split, beta_split : float, Chipman structure prior (paper: 0.95, 1.0)
    move_probs : (p_grow, p_prune, p_stay) of the global proposal
    delta, optimism, kappa, look_ahead : utility hyperparameters (eq. 10, App. B)
    h_init, h_final : float, split sharpness annealed during warm-up (Table 5)
    max_tree_depth : int, NUTS depth cap
    target_accept : float
    lais_form : {"spatial", "basic"}
    hyper : SoftTreeHyper, optional; ``alpha``, ``split_concentration`` and ``signed_splits`` override it
    alpha : float, optional
        Dirichlet-multinomial total concentration (default: the number of classes,
        or ``hyper``'s value).
    split_concentration : float, optional
        Dirichlet prior of split weights (default: 1, or ``hyper``'s value).
    signed_splits : bool, optional
        Split weights over the inputs and their mirror images ``1 - x`` (not in
        the paper; see :class:`~torchtree.model.soft_trees.SoftTreeHyper`; default: off,
        or ``hyper``'s value).
    max_predict_draws : int, draws per topology kept in the posterior
    local_posterior : {"weighted", "chains", "draws"}
        How each topology's local posterior is represented: "weighted" resamples the
        LAIS pseudo-samples by their normalised weights (eq. 14; chains stuck in a
        poor mode get little weight, but in many dimensions few pseudo-samples carry
        the weight); "chains" keeps the NUTS draws and weights each chain by its own
        LAIS evidence (same protection against stuck chains, all draws used);
        "draws" keeps the NUTS draws with equal weights.
    warm_start : bool
        Start a new topology's chains from the chains of the topology whose move
        proposed it, resampled by their per-chain LAIS evidence (shared splits keep
        their parameters, see ``_inherit``), and warm
        up for ``n_warmup_warm`` iterations (sharpness annealed over that shorter
        warm-up) instead of ``n_warmup``. Not in the paper (which burns in every topology from
        scratch); it makes deep topologies affordable on a CPU budget.
    n_warmup_warm : int, optional, default ``max(30, n_warmup // 3)``
    compile : bool, run each NUTS leapfrog step (potential, gradient and the trajectory
        bookkeeping) as one ``torch.compile``-d call (``nuts_step(fused=...)``; 2-4x
        less time per step on a CPU after 20-60 s of compilation per tree depth; with
        ``asynchronous=True`` the potential itself is compiled as well)
    max_seconds : float, optional, stop the loop after this much time (summed over
        resumed segments of a checkpointed run). A time budget makes the number of
        iterations, and so the result, depend on the machine's speed: runs with
        ``max_seconds`` are not reproducible, and resuming one is not guaranteed to
        give the result of an uninterrupted run.
    clock : {"wall", "cpu"}, what ``max_seconds`` measures ("cpu" = this process's
        CPU time, useful on a shared machine)
    checkpoint : str, optional
        Path of a checkpoint file. Every ``checkpoint_every`` DCC iterations (and after
        the last one) the complete loop state is written there atomically: every
        discovered topology's counts, chains (positions, step sizes, inverse masses),
        draws, LAIS pseudo-samples and evidence accumulators, the random generators
        and the iteration counter (plain tensors and containers,
        ``torch.load(weights_only=True)``). If the file exists when :meth:`run`
        starts, the run resumes after its last saved iteration; without
        ``max_seconds`` the result is identical to an uninterrupted run with the
        same seed. The checkpoint carries a fingerprint of the data, seed and
        result-affecting settings (not ``n_iterations``, so a finished run can be
        extended); resuming a different run's checkpoint raises
        ``torchtree.io.checkpoint.CheckpointError``.
    checkpoint_every : int, save every this many DCC iterations
    device : str, "auto" = CUDA when present
    dtype : torch.dtype
    asynchronous : bool
        Draw the ``n_samples`` NUTS draws of each visit with
        :func:`torchtree.steps.nuts_async.nuts_draw_async` (each chain at its own pace,
        no barrier between transitions) instead of in lockstep; warm-up is always in
        lockstep. Same kernel, different random draws; see :class:`torchtree.soft.NUTS`
        for when it pays.
    init : {"prior", "data"}
        Where a topology's chains start. ``"prior"`` (default, the paper): prior
        draws, warm-up annealed from ``h_init``. ``"data"`` (not in the paper): the
        splits are drawn by conditional sweeps over the hard tree's axis-aligned
        splits on the training data (:func:`torchtree.steps.soft_init.informed_start`), for
        a new topology and for the new split of a warm-started one, and the warm-up
        runs at ``h_final`` (annealing from ``h_init`` would move the chains out of
        the partition they start in). Same target either way. Use ``"data"`` when
        ``h_final`` is so small that thresholds get no gradient between data points
        (e.g. inputs on a grid): on CGM (h = 0.001, integer inputs), chains from prior
        draws of the true topology settled at train MSE 1.0-1.3 against a noise
        variance of 0.04, chains from data-informed starts at 0.036, and DCC's test
        MSE went from 0.28 to 0.038. On softer, oblique problems the axis-aligned
        starts can cost accuracy (wine, h = 0.025: 0.925 vs 0.943 with prior starts).
    """

    method = "dcc"

    def __init__(
        self,
        n_iterations: int = 60,
        n_initial: int = 100,
        n_chains: int = 8,
        n_samples: int = 20,
        n_warmup: int = 150,
        activation_threshold: int = 5,
        n_proposals: int = 5,
        n_parallel: int = 4,
        max_depth: int = 5,
        alpha_split: float = 0.95,
        beta_split: float = 1.0,
        move_probs: Sequence[float] = (0.6, 0.3, 0.1),
        delta: float = 0.5,
        optimism: float = 1.0,
        kappa: float = 0.0,
        look_ahead: float = 1000.0,
        h_init: float = 0.05,
        h_final: float = 0.025,
        max_tree_depth: int = 6,
        target_accept: float = 0.8,
        lais_form: str = "spatial",
        hyper: Optional[SoftTreeHyper] = None,
        alpha: Optional[float] = None,
        split_concentration: Optional[float] = None,
        signed_splits: Optional[bool] = None,
        max_predict_draws: int = 200,
        local_posterior: str = "weighted",
        warm_start: bool = False,
        compile: bool = False,
        n_warmup_warm: Optional[int] = None,
        max_seconds: Optional[float] = None,
        clock: str = "wall",
        device: Any = "auto",
        dtype: torch.dtype = torch.float32,
        checkpoint: Optional[str] = None,
        checkpoint_every: int = 1,
        asynchronous: bool = False,
        init: str = "prior",
    ) -> None:
        self.n_iterations = check_int("n_iterations", n_iterations, 1)
        self.n_initial = check_int("n_initial", n_initial, 1)
        self.n_chains = check_int("n_chains", n_chains, 1)
        self.n_samples = check_int("n_samples", n_samples, 1)
        self.n_warmup = check_int("n_warmup", n_warmup, 0)
        self.activation_threshold = check_int("activation_threshold", activation_threshold, 1)
        self.n_proposals = check_int("n_proposals", n_proposals, 1)
        self.n_parallel = check_int("n_parallel", n_parallel, 1)
        self.max_depth = check_int("max_depth", max_depth, 1)
        self.alpha_split, self.beta_split = check_split_prior(alpha_split, beta_split)
        # validated but kept unnormalised: propose_topology scales by their sum, and
        # dividing here would move rounding and so change the draws of earlier runs
        check_probabilities("move_probs (grow, prune, stay)", move_probs, 3)
        self.move_probs = tuple(float(p) for p in move_probs)
        self.delta = check_real("delta", delta, 0.0, 1.0, low_open=False)
        self.optimism = check_real("optimism", optimism, 0.0, low_open=False)
        self.kappa = check_real("kappa", kappa)
        self.look_ahead = check_real("look_ahead", look_ahead, 0.0)
        self.h_init, self.h_final = check_real("h_init", h_init, 0.0), check_real("h_final", h_final, 0.0)
        self.max_tree_depth = check_int("max_tree_depth", max_tree_depth, 1)
        self.target_accept = check_real("target_accept", target_accept, 0.0, 1.0, high_open=True)
        self.lais_form = check_choice("lais_form", lais_form, ("spatial", "basic"))
        self.hyper = SoftTreeHyper.with_overrides(
            hyper, alpha=alpha, split_concentration=split_concentration, signed_splits=signed_splits)
        self.max_predict_draws = check_int("max_predict_draws", max_predict_draws, 1)
        self.local_posterior = check_choice("local_posterior", local_posterior, ("weighted", "chains", "draws"))
        self.warm_start = bool(warm_start)
        self.compile = bool(compile)
        self.n_warmup_warm = (check_int("n_warmup_warm", n_warmup_warm, 0) if n_warmup_warm is not None
                              else max(30, self.n_warmup // 3))
        self.max_seconds = None if max_seconds is None else check_real("max_seconds", max_seconds, 0.0)
        self.clock = check_choice("clock", clock, ("wall", "cpu"))
        self.device = device
        self.dtype = check_choice("dtype", dtype, FLOAT_DTYPES)
        self.checkpoint = checkpoint
        self.checkpoint_every = check_int("checkpoint_every", checkpoint_every, 1)
        self.asynchronous = bool(asynchronous)
        self.init = check_choice("init", init, INIT_MODES)
        # test hook: called with the iteration index after each iteration (and its
        # checkpoint); raising from it simulates an interruption
        self._after_iteration = None

    # ----------------------------------------------------------------- checkpoints
    # settings that do not change the draws of the iterations run (n_iterations only
    # bounds the loop, so a finished run can be extended by resuming it)
    _NOT_FINGERPRINTED = ("n_iterations", "max_seconds", "clock", "device", "checkpoint", "checkpoint_every",
                          "_after_iteration", "records_", "evidence_")

    def _fingerprint(self, sd, seed: int) -> str:
        from torchtree.io.checkpoint import fingerprint

        settings = {k: (asdict(v) if k == "hyper" else repr(v) if isinstance(v, torch.dtype) else v)
                    for k, v in sorted(self.__dict__.items()) if k not in self._NOT_FINGERPRINTED}
        if not self.asynchronous:
            # the default leaves the fingerprint of checkpoints written before the
            # option existed unchanged, so they still resume
            settings.pop("asynchronous", None)
        if not self.hyper.signed_splits:
            settings["hyper"].pop("signed_splits")  # likewise
        return fingerprint("DCC", settings, int(seed), sd.X, sd.y)

    @staticmethod
    def _record_state(r: "_Record") -> dict:
        def cpu(t):
            return None if t is None else t.detach().cpu()

        return {
            "topology": list(r.topology.internal), "log_prior": float(r.log_prior), "proposed": int(r.proposed),
            "selected": int(r.selected), "active": bool(r.active), "slot": int(r.slot),
            "position": cpu(r.position), "step_size": cpu(r.step_size), "inv_mass": cpu(r.inv_mass),
            "draws": [cpu(x) for x in r.draws], "pseudo": [cpu(x) for x in r.pseudo],
            "pseudo_logw": [cpu(x) for x in r.pseudo_logw],
            "parent": None if r.parent is None else list(r.parent.internal),
            "chain_log_z": cpu(r.chain_log_z), "chain_log_sum_w": cpu(r.chain_log_sum_w), "chain_n": int(r.chain_n),
            "draw_chain": [cpu(x) for x in r.draw_chain],
        }

    @staticmethod
    def _record_from_state(d: dict, dev: torch.device) -> "_Record":
        def on(t):
            return None if t is None else t.to(dev)

        return _Record(
            Topology(tuple(int(i) for i in d["topology"])), float(d["log_prior"]), int(d["proposed"]),
            int(d["selected"]), bool(d["active"]), int(d["slot"]),
            on(d["position"]), on(d["step_size"]), on(d["inv_mass"]),
            list(d["draws"]), list(d["pseudo"]), list(d["pseudo_logw"]),
            None if d["parent"] is None else Topology(tuple(int(i) for i in d["parent"])),
            d["chain_log_z"], d["chain_log_sum_w"], int(d["chain_n"]), list(d["draw_chain"]),
        )

    # ----------------------------------------------------------------- helpers
    def _model(self, data, recs: List[_Record], h: float, gen) -> SoftTrees:
        return SoftTrees(
            data, [r.topology for r in recs], n_chains=self.n_chains, sharpness=h,
            hyper=self.hyper, dtype=self.dtype, generator=gen, compile=self.compile and self.asynchronous,
        )

    def _kernel(self, model: SoftTrees):
        """Lockstep NUTS kernel for ``model``; with ``compile=True`` each leapfrog step runs
        as one compiled call (:func:`torchtree.steps.nuts.nuts_step`, ``fused=``), and the
        potential alone is compiled only for asynchronous sampling, which calls it directly."""
        return make_kernel("nuts", max_tree_depth=self.max_tree_depth, compact=0.5,
                           fused=model.fused_parts if self.compile else None)

    def _embed(self, model: SoftTrees, recs: List[_Record], name: str, fill: torch.Tensor) -> torch.Tensor:
        out = fill.clone()
        C = self.n_chains
        for m, r in enumerate(recs):
            out[m * C : (m + 1) * C, model.compact_index(m)] = getattr(r, name).to(out)
        return out

    def _store(self, model: SoftTrees, recs: List[_Record], chains: ChainState, positions: torch.Tensor) -> None:
        C = self.n_chains
        for m, r in enumerate(recs):
            rows, idx = slice(m * C, (m + 1) * C), model.compact_index(m)
            r.position = chains.state.position[rows][:, idx].clone()
            r.step_size = chains.step_size[rows].clone()
            r.inv_mass = chains.inv_mass[rows][:, idx].clone()
            r.draws.append(positions[:, rows][:, :, idx].cpu())
            r.draw_chain.append(torch.arange(C).repeat(positions.shape[0]))

    def _evidence(self, model: SoftTrees, recs, positions: torch.Tensor, acc: EvidenceAccumulator, gen) -> None:
        """LAIS update for the topologies of ``model`` from draws ``[T, B, P]``."""
        G, C = len(recs), self.n_chains
        T, B, P = positions.shape
        draws = positions.reshape(T, G, C, P).permute(1, 2, 0, 3)  # [G, C, T, P]
        mask = model.coord_mask[::C]  # [G, P]
        K = C * T * self.n_proposals
        rows = (torch.arange(G, device=positions.device) * C).repeat_interleave(K)

        def log_target(xi):  # [G, K, P] -> [G, K]
            return model.log_density_chunked(xi.reshape(G * K, P), rows).reshape(G, K)

        lw, xi = lais_log_weights(draws, mask, log_target, self.n_proposals, gen, self.lais_form,
                                  return_samples=True)
        acc.update(lw.reshape(G, -1), torch.tensor([r.slot for r in recs]))
        # per-chain evidence of this visit: how much posterior mass each chain's mode holds
        chain_lz = torch.logsumexp(lw.reshape(G, C, -1), -1) - math.log(lw[0, 0].numel())
        n_per_chain = lw[0, 0].numel()
        for m, r in enumerate(recs):
            r.chain_log_z = chain_lz[m].cpu()
            lsw = torch.logsumexp(lw[m].reshape(C, -1), -1).cpu()
            r.chain_log_sum_w = lsw if r.chain_log_sum_w is None else torch.logaddexp(r.chain_log_sum_w, lsw)
            r.chain_n += n_per_chain
        if self.local_posterior == "weighted":
            for m, r in enumerate(recs):
                idx = model.compact_index(m)
                r.pseudo.append(xi[m].reshape(-1, P)[:, idx].cpu())
                r.pseudo_logw.append(lw[m].reshape(-1).cpu())

    # ----------------------------------------------------------------- main loop
    def run(self, data, y=None, *, seed: Optional[int] = 0, monitor=None) -> SoftTreePosterior:
        """Run DCC-Tree on ``data``.

        Parameters
        ----------
        data : torchtree.Data, (X, y), or Tensor X [N, D] (with ``y``)
        y : Tensor [N], optional
        seed : int, optional
        monitor : Monitor or list, optional
            Receives ``on_start``, ``on_step`` (tags ``dcc/...`` once per iteration and
            ``hmc/...`` per NUTS iteration, with the running NUTS iteration count as
            step) and ``on_end``.

        Returns
        -------
        SoftTreePosterior over the active topologies, weighted by ``Z_m p(m)``.
        """
        t_start = time.perf_counter()
        cpu0 = time.process_time()
        timer = time.process_time if self.clock == "cpu" else time.perf_counter
        c_start = timer()
        dev = resolve_device(self.device)
        sd = as_soft_data(data, y, dtype=self.dtype, device=dev, signed=self.hyper.signed_splits)
        check_memory("DCC's evidence (LAIS) for the one-split tree", lais_bytes(1, self.n_chains, self.n_samples, self.n_proposals, sd.n_features + 4), "n_chains, n_samples or n_proposals (or use fewer features)", device=dev)
        self.hyper = self.hyper.resolve(sd)
        seed = 0 if seed is None else int(seed)
        gen = torch.Generator(device=dev).manual_seed(seed)
        rgen = torch.Generator().manual_seed(seed + 1)  # CPU draws for bookkeeping
        rng = _pyrandom.Random(seed)
        informed = self.init == "data"
        # a data-informed start is already a sharp partition: no annealing
        h_start = self.h_final if informed else self.h_init
        schedule = sharpness_schedule(self.n_warmup, h_start, self.h_final)
        warm_schedule = sharpness_schedule(self.n_warmup_warm, h_start, self.h_final)
        records: Dict[Topology, _Record] = {}
        acc = EvidenceAccumulator(0, device=torch.device("cpu"))

        def propose(t: Topology, parent: Optional[Topology] = None) -> None:
            r = records.get(t)
            if r is None:
                r = records[t] = _Record(t, t.log_prior(self.alpha_split, self.beta_split), parent=parent)
            r.proposed += 1

        for t in sample_prior_topologies(self.n_initial, self.alpha_split, self.beta_split, self.max_depth, rng):
            propose(t)
        notify(monitor, "on_start", {
            "method": "dcc", "n_iterations": self.n_iterations, "n_chains": self.n_chains,
            "n_samples": self.n_samples, "n_warmup": self.n_warmup, "n_discovered": len(records),
        })
        hmc_step = [0]
        stats = {"nuts_iterations": 0, "divergences": 0, "grad_evals": 0, "warmups": 0}

        def track(trace):
            stats["divergences"] += int(trace.is_divergent.sum())
            stats["grad_evals"] += int(trace.n_steps.sum())

        regression = sd.task == "regression"

        def warm_init(model: SoftTrees, batch: List[_Record]):
            """Initial positions / inverse masses / step sizes copied from parents."""
            C = self.n_chains
            pos, inv = model.theta.data.clone(), model.coord_mask.to(model.theta.dtype).clone()
            steps = []
            for m, r in enumerate(batch):
                par = records[r.parent]
                # parent chains resampled by their evidence (systematic): chains stuck
                # in a poor mode of the parent topology do not seed the new one
                if par.chain_log_z is not None and torch.isfinite(par.chain_log_z).any():
                    w = torch.softmax(torch.nan_to_num(par.chain_log_z, nan=-float("inf")), 0)
                    u = (torch.rand((), generator=rgen, dtype=torch.float64) + torch.arange(C)) / C
                    pick = torch.searchsorted(torch.cumsum(w, 0), u).clamp(max=C - 1)
                else:
                    pick = torch.arange(C)
                ppos, pinv, pstep = par.position[pick], par.inv_mass[pick], par.step_size[pick]
                idx = model.compact_index(m).unsqueeze(0)
                rows = torch.arange(m * C, (m + 1) * C, device=pos.device).unsqueeze(1)
                src = _inherit(r.topology, par.topology, sd.n_features, regression)
                cpos, cinv = pos[rows, idx], inv[rows, idx]  # prior draws / unit mass by default
                for j, js in enumerate(src):
                    if js:
                        cpos[:, j] = ppos[:, js].mean(1).to(cpos)
                        cinv[:, j] = pinv[:, js].mean(1).to(cinv)
                pos[rows, idx], inv[rows, idx] = cpos, cinv
                steps.append(pstep.to(pos))
            return pos, inv, torch.cat(steps)

        def activate_batch(batch: List[_Record], warm: bool) -> None:
            if warm:
                # new splits start from prior draws, so the sharpness is annealed here
                # too (a hard split gives its threshold almost no gradient to follow)
                model = self._model(sd, batch, h_start, gen)
                pos, inv, step = warm_init(model, batch)
                if informed:
                    fresh = torch.stack([
                        torch.tensor([i in r.topology.internal and i not in records[r.parent].topology.internal
                                      for i in range(model.layout.n_internal)], device=pos.device)
                        for r in batch]).repeat_interleave(self.n_chains, 0)
                    pos = informed_start(model, pos, fresh, generator=gen).to(pos)
                n_wu = self.n_warmup_warm
                ch, st = warmup(
                    self._kernel(model), model.potential_and_grad, pos, n_wu, generator=gen,
                    coord_mask=model.coord_mask,
                    step_size=step, inv_mass=inv, target_accept=self.target_accept, monitor=monitor,
                    step_offset=hmc_step[0], sharpness=warm_schedule, set_sharpness=model.set_sharpness,
                )
            else:
                model = self._model(sd, batch, h_start, gen)
                start = model.theta.data
                if informed:
                    start = informed_start(model, generator=gen)
                n_wu = self.n_warmup
                ch, st = warmup(
                    self._kernel(model), model.potential_and_grad, start, n_wu, generator=gen,
                    coord_mask=model.coord_mask, target_accept=self.target_accept, sharpness=schedule,
                    set_sharpness=model.set_sharpness, monitor=monitor, step_offset=hmc_step[0],
                )
            hmc_step[0] += n_wu
            model.set_sharpness(self.h_final)
            ch, tr = draw(self._kernel(model), model.potential_and_grad, ch, self.n_samples, generator=gen,
                          monitor=monitor, step_offset=hmc_step[0], refresh=True, asynchronous=self.asynchronous)
            hmc_step[0] += self.n_samples
            stats["divergences"] += int(st["divergences"].sum())
            stats["warmups"] += len(batch)
            track(tr)
            acc.extend(len(batch))
            for r in batch:
                r.active, r.selected, r.slot = True, 1, acc.count.shape[0] - len(batch) + batch.index(r)
            self._store(model, batch, ch, tr.positions)
            self._evidence(model, batch, tr.positions, acc, gen)

        def activate(new: List[_Record]) -> None:
            size = max(self.n_parallel, 4)
            warm = [r for r in new if self.warm_start and r.parent in records and records[r.parent].position is not None]
            cold = [r for r in new if r not in warm]
            for group, is_warm in ((cold, False), (warm, True)):
                for i in range(0, len(group), size):
                    activate_batch(group[i : i + size], is_warm)

        # ------------------------------------------------------------ checkpoint / resume
        from torchtree.io.checkpoint import Checkpointer

        ck = Checkpointer(self.checkpoint, self.checkpoint_every,
                          fingerprint=self._fingerprint(sd, seed) if self.checkpoint is not None else None)
        prev = {"wall": 0.0, "cpu": 0.0}  # time spent by earlier segments of a resumed run

        def snapshot(done: int) -> dict:
            version, internal, gauss = rng.getstate()
            return {
                "iteration": int(done),
                "records": [self._record_state(r) for r in records.values()],
                "evidence": {name: getattr(acc, name).cpu() for name in EvidenceAccumulator._FIELDS},
                "generator": gen.get_state().cpu(), "bookkeeping_generator": rgen.get_state(),
                "python_random": [int(version), [int(v) for v in internal], gauss],
                "hmc_step": int(hmc_step[0]), "stats": dict(stats),
                "elapsed_budget": float(timer() - c_start),
                "elapsed_wall": prev["wall"] + time.perf_counter() - t_start,
                "elapsed_cpu": prev["cpu"] + time.process_time() - cpu0,
            }

        start_it = 0
        saved = ck.load()
        if saved is not None:
            records.clear()
            for d in saved["records"]:
                r = self._record_from_state(d, dev)
                records[r.topology] = r
            for name in EvidenceAccumulator._FIELDS:
                setattr(acc, name, saved["evidence"][name].to(torch.float64))
            gen.set_state(saved["generator"].to(gen.get_state().device))
            rgen.set_state(saved["bookkeeping_generator"])
            version, internal, gauss = saved["python_random"]
            rng.setstate((int(version), tuple(int(v) for v in internal), gauss))
            hmc_step[0] = int(saved["hmc_step"])
            stats.update(saved["stats"])
            c_start = timer() - float(saved["elapsed_budget"])
            prev["wall"], prev["cpu"] = float(saved["elapsed_wall"]), float(saved["elapsed_cpu"])
            start_it = int(saved["iteration"]) + 1
            notify(monitor, "on_step", start_it - 1, {"dcc/resumed_from_iteration": start_it - 1})

        done = start_it - 1  # last completed iteration
        last_saved = done if saved is not None else None
        for it in range(start_it, self.n_iterations):
            if self.max_seconds is not None and timer() - c_start > self.max_seconds:
                break
            new = [r for r in records.values() if not r.active and r.proposed >= self.activation_threshold]
            if not any(r.active for r in records.values()) and not new:
                new = [max(records.values(), key=lambda r: r.proposed)]
            if new:
                activate(new)
            active = [r for r in records.values() if r.active]
            slots = torch.tensor([r.slot for r in active])
            util = dcc_utility(
                acc.log_evidence[slots], acc.log_var_w[slots], acc.logw_mean[slots], acc.logw_std[slots],
                float(acc.max_logw[slots].max()), torch.tensor([r.selected for r in active]),
                self.delta, self.optimism, self.kappa, self.look_ahead,
            )
            order = torch.argsort(util, descending=True)[: self.n_parallel].tolist()
            chosen = [active[i] for i in order]
            model = self._model(sd, chosen, self.h_final, gen)
            fill = model.theta.data
            chains = ChainState(
                hmc_init(self._embed(model, chosen, "position", fill), model.potential_and_grad),
                torch.cat([r.step_size for r in chosen]).to(fill),
                self._embed(model, chosen, "inv_mass", torch.zeros_like(fill)),
            )
            chains, tr = draw(self._kernel(model), model.potential_and_grad, chains, self.n_samples, generator=gen,
                              monitor=monitor, step_offset=hmc_step[0], asynchronous=self.asynchronous)
            hmc_step[0] += self.n_samples
            track(tr)
            self._store(model, chosen, chains, tr.positions)
            self._evidence(model, chosen, tr.positions, acc, gen)
            for r in chosen:
                r.selected += 1
                propose(propose_topology(r.topology, rng, self.move_probs, self.max_depth)[0], r.topology)
            if monitor is not None:
                lz = acc.log_evidence[slots]
                lp = torch.tensor([r.log_prior for r in active], dtype=torch.float64)
                notify(monitor, "on_step", it, {
                    "dcc/n_active": len(active),
                    "dcc/n_discovered": len(records),
                    "dcc/selected": ",".join(r.topology.key() for r in chosen),
                    "dcc/utility_max": float(util.max()),
                    "dcc/utilities": util.clone(),
                    "dcc/topology_log_evidence": lz.clone(),
                    "dcc/log_evidence": float(torch.logsumexp(lz + lp, 0)),
                    # summaries of this iteration's local inference (per-NUTS-iteration
                    # values go out under hmc/... with the NUTS iteration as step)
                    "dcc/step_size": float(chains.step_size.mean()),
                    "dcc/accept": float(tr.accept_prob.mean()),
                    "dcc/divergences": int(tr.is_divergent.sum()),
                    "dcc/tree_depth": float(tr.tree_depth.float().mean()),
                    "dcc/seconds": prev["wall"] + time.perf_counter() - t_start,
                })
            done = it
            if ck.maybe_save(it, lambda: snapshot(it), last=it == self.n_iterations - 1):
                last_saved = it
            if self._after_iteration is not None:
                self._after_iteration(it)
        if ck.enabled and done >= 0 and last_saved != done:  # stopped early by the time budget
            ck.save(done, snapshot(done))
        stats["nuts_iterations"] = hmc_step[0]
        stats["iterations"] = done + 1
        stats["seconds"] = prev["wall"] + time.perf_counter() - t_start
        stats["cpu_seconds"] = prev["cpu"] + time.process_time() - cpu0
        if saved is not None:
            stats["resumed_from_iteration"] = start_it - 1
        # kept for inspection (per-topology chains, draws, pseudo-samples, counts)
        self.records_, self.evidence_ = records, acc
        post = self._posterior(sd, records, acc, stats)
        # final values under their own names, as the other samplers write them (the
        # dcc/ tags are per-iteration series; repeating them here added a point)
        notify(monitor, "on_end", {
            "log_evidence": post.log_evidence, "n_active": len(post.topologies),
            "topology_log_evidence": post.topology_log_evidence, "seconds": stats["seconds"], "posterior": post,
        })
        return post

    def _posterior(self, sd, records, acc: EvidenceAccumulator, stats) -> SoftTreePosterior:
        active = [r for r in records.values() if r.active]
        tops, draws = [], []
        gen = torch.Generator().manual_seed(len(records))
        for r in active:
            n = self.max_predict_draws

            def resample(logw: torch.Tensor) -> torch.Tensor:
                # systematic resampling: the kept set follows the normalised weights
                w = torch.softmax(torch.nan_to_num(logw.double(), nan=-float("inf")), 0)
                u = (torch.rand((), generator=gen, dtype=torch.float64) + torch.arange(n, dtype=torch.float64)) / n
                return torch.searchsorted(torch.cumsum(w, 0), u).clamp(max=w.numel() - 1)

            if self.local_posterior == "weighted" and r.pseudo:
                # eq. 14: importance-resample the LAIS pseudo-samples
                d = torch.cat(r.pseudo)[resample(torch.cat(r.pseudo_logw))]
            elif self.local_posterior == "chains" and r.draws and r.chain_log_sum_w is not None:
                # NUTS draws, each chain weighted by its own LAIS evidence (the mass of
                # the mode it explores); draws within a chain keep equal weights
                d = torch.cat([x.reshape(-1, x.shape[-1]) for x in r.draws])
                chain = torch.cat(r.draw_chain)
                per = torch.log_softmax(r.chain_log_sum_w.double(), 0)
                counts = torch.bincount(chain, minlength=per.numel()).double()
                d = d[resample(per[chain] - torch.log(counts[chain]))]
            else:
                d = torch.cat([x.reshape(-1, x.shape[-1]) for x in r.draws]) if r.draws else torch.zeros(0)
                if d.shape[0] > self.max_predict_draws:  # evenly thinned
                    idx = torch.linspace(0, d.shape[0] - 1, self.max_predict_draws).round().long()
                    d = d[idx]
            tops.append(r.topology)
            draws.append(d)
        slots = torch.tensor([r.slot for r in active], dtype=torch.long)
        info = dict(stats)
        info["n_discovered"] = len(records)
        info["selected_counts"] = ",".join(f"{r.topology.key()}:{r.selected}" for r in active)
        info["local_posterior"] = self.local_posterior
        return SoftTreePosterior(
            sd, self.hyper, self.h_final, tops, draws,
            acc.log_evidence[slots], torch.tensor([r.log_prior for r in active], dtype=torch.float64), info,
        )
