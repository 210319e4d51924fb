"""SMC sampler over complete trees with grow / prune / change / swap moves (paper 002, Alg. 4).

Every particle is a complete tree. Initial particles are drawn from the Chipman
prior and weighted by eq. 4b, ``w_0 = pi(t_0) / q_0(t_0)`` (the likelihood, for the
Chipman target). Each of the ``n_iterations`` iterations proposes one move per
particle and multiplies its weight by eq. 5b,

    w_k = w_{k-1} * pi(t_k) q(t_{k-1} | t_k) / (pi(t_{k-1}) q(t_k | t_{k-1})),

i.e. an SMC sampler with a fixed target and the reverse proposal as backward
kernel; weights are normalised and the particles resampled whenever the ESS
falls below ``ess_threshold * n_particles``. A proposal that is impossible under
the prior (an empty node, ...) keeps its particle with incremental weight one:
that is the kernel's atom at the current tree, so the weights stay exact and no
particle is killed for it.

``mh_step=True`` gives the resample-move variant: every proposal goes through a
Metropolis-Hastings accept/reject step, which leaves the target invariant, so
the incremental weights are one and the particles only carry the initial
importance weights (resampled away when they are degenerate).

Unlike the published code, predictions use the final weights; the paper's
accuracy figure (mean accuracy of the individual particles) is available from
:func:`per_particle_accuracy`.

Ranks
-----
With ``backend=`` (a :class:`torchtree.distributed.Backend`) every rank holds
``n = n_particles / world_size`` particles, global indices ``[rank n, (rank+1) n)``,
and the full training data. Every random draw of a particle is keyed by its global
index (:func:`torchtree.core.random.keyed_uniform`), normalisation, ESS and evidence come
from ``all_reduce`` s, resampling from :func:`torchtree.distributed.ncopies_from_log_weights`
followed by :func:`torchtree.distributed.redistribute` of the padded tree blocks (with
their per-node caches and per-particle state). Each iteration costs two small
collectives (a max and an integer sum; the tempering variant adds two per
temperature search round) plus the resampling's when it resamples.

Exactness. The result does not depend on the number of ranks: the same seed gives
bit-identical particles, weights, log evidence and predictions on 1, 2 or 8 ranks.
Sums of weights are taken in exact integer arithmetic
(:func:`torchtree.distributed.exact.global_stats`): each weight is turned into
the fixed-point integer ``round(2^B exp(logw - max))`` by
:func:`torchtree.distributed.fixed_point_weights` (a pure function of the element,
``B = 62 - ceil(log2 N)``), and int64 sums are associative. Weights below
``2^-B`` of the largest (``2^-52`` at N = 1024) count as zero in the ESS and the
evidence (a relative error below ``N 2^-B``). Capacities of the padded trees are
agreed across ranks every iteration, so every tensor op runs on the same shapes as
on one rank. Resampling puts the copies in canonical order (output slot ``j`` holds
a copy of the ``j``-th ancestor in increasing order), the order of ``redistribute``.
``resampling="systematic"`` and ``"multinomial"`` use the distributed ``ncopies``;
``"stratified"`` and ``"residual"`` all-gather the ``N`` log-weights (8 bytes each) and
draw the same global ancestors on every rank.

After the run every rank holds the *global* posterior (trees without the caches
``all_gather`` -ed, ``N x capacity`` nodes per rank). Monitors are written by rank 0.

Checkpoints
-----------
``checkpoint=path`` saves, every ``checkpoint_every`` iterations (and after the
last), everything a bit-identical continuation needs: this rank's trees with their
caches, log-weights, tempering log-likelihoods, the log evidence, the temperature,
the iteration and the traces (plain tensors and lists, loaded with
``weights_only=True``); there is no generator state to keep since every draw is
keyed. A later ``run`` with the same settings, data and seed (and world size)
resumes after the saved iteration (the driver, :func:`torchtree.samplers.driver.run`,
owns the checkpoint file; :class:`SMCSamplerState` is what it saves); a different run's checkpoint is a
:class:`~torchtree.io.checkpoint.CheckpointError`. Multi-rank runs write one file per
rank plus a manifest (:class:`~torchtree.io.checkpoint.Checkpointer`).
"""
from __future__ import annotations

import enum
import functools
import math
from dataclasses import dataclass
from typing import Any, Dict, List, Optional, Tuple, Union

import torch

from torchtree.core.memory import check_tree_memory, hard_tree_bytes

from torchtree.core.random import derive_seed, keyed_uniform
from torchtree.core.resampling import RESAMPLERS, get_resampler
from torchtree.distributed import (
    METHODS as REDISTRIBUTION_METHODS,
    BlockLayout,
    LocalBackend,
    ancestors_from_ncopies,
    ncopies_from_log_weights,
    redistribute,
)
from torchtree.distributed.exact import global_stats
from torchtree.model.posterior import TreePosterior, dedupe_trees
from torchtree.model.priors import ALPHA_SPLIT, BETA_SPLIT, POISSON_LAMBDA, ChipmanPrior, make_prior
from torchtree.model.trees import HardTrees
from torchtree.samplers import driver
from torchtree.samplers.topdown_starts import topdown_draws
from torchtree.samplers.driver import default_likelihood, describe
from torchtree.samplers.presets import Preset, optimal_proposal_fits
from torchtree.samplers.smc_engine import next_temperature
from torchtree.samplers.base import SamplerBase
from torchtree.samplers.protocol import SamplerConfig, SamplerState, option
from torchtree.steps.moves import (CUT_PROPOSALS, N_SLOTS, TreeModel, TreeState, check_move_probs, draw_moves, propose,
                                   sample_prior_state, snapshot_trees)

__all__ = ["SMCSampler", "SMCSamplerConfig", "SMCSamplerState", "per_particle_accuracy"]

class Stream(enum.IntEnum):
    """SMC with moves' random streams: ``derive_seed(run seed, stream, ...)`` seeds each (fixed values)."""

    PRIOR_START = 1  #: the initial particles drawn from q_0
    MOVES = 2  #: every iteration's move type, cut and acceptance uniforms, keyed by particle and iteration
    RESAMPLING = 3  #: the resampling generator of each iteration (``derive_seed(seed, RESAMPLING, step)``)
    TOPDOWN_START = 4  #: ``init_prior="topdown"``: the top-down run and the draws from it


_LL_KEY = "smc.log_likelihood"  # per-particle tempering state travelling with the trees


@dataclass(frozen=True)
class SMCSamplerConfig(SamplerConfig):
    """Settings of :class:`SMCSampler` (see its docstring)."""

    n_particles: int = option(1024, help="N, particles over all ranks (a multiple of the number of ranks)", low=1)
    n_iterations: int = option(10, help="K, move-reweight-resample iterations", low=0)
    move_probs: Tuple[float, float, float, float] = option(
        (0.25, 0.25, 0.25, 0.25), help="probabilities of grow, prune, change, swap (normalised)")
    resampling: str = option("multinomial", help="resampling scheme", choices=tuple(RESAMPLERS))
    ess_threshold: float = option(0.5, help="resample when ESS < ess_threshold x n_particles (paper: 0.5)",
                                  low=0.0, high=1.0)
    mh_step: bool = option(False, help="resample-move variant: accept/reject every proposal with the MH ratio "
                                       "(weights then stay constant after the initial step)", presets=(
        Preset("well-weighted-start", "from a top-down start that is already well weighted (regression, small "
               "classification tables) reweighting after each move collapses the particles onto a few trees",
               lambda v, s: not v["tempering"] and (s.regression or optimal_proposal_fits(s)), True),))
    use_likelihood: bool = option(True, help="False targets the prior (labels ignored)")
    init_prior: Optional[Union[str, ChipmanPrior]] = option(
        None, help="initial proposal q_0: 'chipman' (in Python also a ChipmanPrior; default: the target's "
                   "Chipman prior, or ChipmanPrior() for a Poisson target), or 'topdown': draws from a top-down "
                   "SMC run on the same model (big data)", presets=(
        Preset("topdown-start", "particles drawn from the prior stay far below the posterior's trees in 10 "
               "iterations", lambda v, s: s.prior == "chipman" and not v["tempering"], "topdown"),))
    tempering: bool = option(False, help="likelihood tempering from power 0 to 1 with MH moves, instead of "
                                         "reweighting by eq. 5b")
    device: Optional[str] = option(None, help="torch device (None: the data's; 'auto': CUDA if present)",
                                   result=False)
    redistribution: str = option("auto", help="how resampled particles travel between ranks (same result for all)",
                                 choices=tuple(REDISTRIBUTION_METHODS), result=False)
    checkpoint: Optional[str] = option(None, help="checkpoint file (resume when it exists)", result=False)
    checkpoint_every: int = option(1, help="save after every k-th iteration", low=1, result=False)
    cut_proposal: str = option("informed", help="how grow / change moves draw a cut: uniform on the node's range "
                                                "(prior), among the gaps between distinct values (data), or one of "
                                                "16 cells by the likelihood of the split (informed)",
                               choices=CUT_PROPOSALS)
    max_bins: Optional[int] = option(None, help="rank each feature into at most max_bins quantile bins and cut only "
                                                "between bins: a change of the split prior (cuts uniform over the "
                                                "grid's range, not the data's), for large data; None: the data "
                                                "(the paper's model)", low=2)

    def check(self) -> None:
        object.__setattr__(self, "move_probs", check_move_probs(self.move_probs))
        if self.init_prior == "topdown" and self.tempering:
            raise ValueError("init_prior='topdown' starts at posterior draws, tempering at the prior: use one")
        ip = self.init_prior if self.init_prior != "topdown" else None
        ip = make_prior(ip) if isinstance(ip, str) else ip
        if ip is not None and getattr(ip, "name", None) != "chipman":
            raise ValueError("init_prior must be a ChipmanPrior (the initial proposal must be easy to sample)")


@dataclass
class SMCSamplerState(SamplerState):
    """This rank's share of an SMC-with-moves run between two iterations.

    Attributes
    ----------
    step : int, the next iteration; done : bool, all ``n_iterations`` ran
    particles : TreeState [n] (this rank's ``n = n_particles / world_size`` trees with their caches)
    logw : float64 Tensor [n], log-weights
    ll : float64 Tensor [n] or None, each tree's log-likelihood (tempering only)
    log_z : float, log evidence so far; phi : float, the likelihood power (1 without tempering)
    n_resample : int, resampling steps so far
    moved, ess, phis : lists of floats, per iteration: fraction of particles moved, ESS
        (and the initial ESS first, without tempering), likelihood power
    """

    step: int
    done: bool
    particles: TreeState
    logw: torch.Tensor
    ll: Optional[torch.Tensor]
    log_z: float
    phi: float
    n_resample: int
    moved: List[float]
    ess: List[float]
    phis: List[float]

    def state_dict(self) -> Dict[str, Any]:
        return {"iteration": int(self.step) - 1, "done": bool(self.done),
                "trees": {key: v.detach().cpu() for key, v in self.particles.trees.as_dict().items()},
                "logw": self.logw.detach().cpu(), "ll": None if self.ll is None else self.ll.detach().cpu(),
                "n_resample": int(self.n_resample), "log_z": float(self.log_z), "phi": float(self.phi),
                "moved": [float(v) for v in self.moved], "ess": [float(v) for v in self.ess],
                "phis": [float(v) for v in self.phis]}

    @classmethod
    def from_state_dict(cls, saved: Dict[str, Any], device=None) -> "SMCSamplerState":
        return cls(step=int(saved["iteration"]) + 1, done=bool(saved["done"]),
                   particles=TreeState(HardTrees.from_dict({k: v.to(device) for k, v in saved["trees"].items()})),
                   logw=saved["logw"].to(device), ll=None if saved["ll"] is None else saved["ll"].to(device),
                   log_z=saved["log_z"], phi=saved["phi"], n_resample=saved["n_resample"],
                   moved=list(saved["moved"]), ess=list(saved["ess"]), phis=list(saved["phis"]))


class SMCSampler(SamplerBase):
    """Sequential Monte Carlo sampler with tree moves (Drousiotis, Varsi et al., Alg. 4).

    Parameters
    ----------
    prior : ChipmanPrior, PoissonPrior, "chipman" or "poisson", optional
        Target prior (default ``ChipmanPrior(alpha_split, beta_split)``). The initial
        particles always come from the Chipman prior; with a Poisson target the
        initial weights correct for it.
    likelihood : DirichletMultinomial or NormalInverseGamma, optional
        Default from the data.
    n_particles : int
        N, over all ranks (a multiple of the backend's world size).
    n_iterations : int
        K, move-reweight-resample iterations.
    move_probs : 4 floats
        Probabilities of grow, prune, change, swap (default 0.25 each).
    resampling : {"multinomial", "systematic", "stratified", "residual"}
    ess_threshold : float in [0, 1]
        Resample when ESS < ``ess_threshold * n_particles`` (paper: 0.5).
    mh_step : bool
        Resample-move variant: accept/reject every proposal with the MH ratio
        (weights then stay constant after the initial step).
    alpha_split, beta_split, poisson_lambda : float
        Prior hyperparameters when ``prior`` is given by name.
    use_likelihood : bool
        False targets the prior (labels ignored).
    tempering : bool
        Likelihood tempering instead of eq. 5b: the targets are ``prior x L^phi`` with
        ``phi`` rising from 0 to 1 over the iterations (each step about as large as keeps
        the ESS above ``ess_threshold * n_particles``, and at least an equal share of
        what is left), each followed by resampling when needed and one MH move per
        particle at the current ``phi``. The initial weights are then flat; the evidence
        estimate is the usual product of mean incremental weights.
    init_prior : ChipmanPrior, "chipman" or "topdown", optional
        Initial proposal ``q_0`` (default: the target's Chipman prior, or
        ``ChipmanPrior()`` for a Poisson target). A prior with larger trees starts the
        particles closer to posterior tree sizes; eq. 4b's initial weights
        ``pi(t_0) / q_0(t_0)`` keep the target exact. ``"topdown"``: multinomial draws
        from a top-down SMC run (``n_particles`` particles, ``start_settings``) on the same model,
        equally weighted with that run's evidence estimate (Chipman prior, no tempering).
    device : str or torch.device, optional
        ``"auto"`` = CUDA if present. Default: the data's device.
    backend : torchtree.distributed.Backend or its name, optional
        Multi-rank run (see the module notes); ``None`` is one process. Every rank
        calls :meth:`run` with the same settings and the full training data. A name
        (``"gloo"``, ``"mpi"``, ...) is resolved by ``torchtree.distributed.get_backend``
        in :meth:`run`, and a process group that opens is closed when it returns.
    redistribution : {"auto", "alltoall", "rotational", "gather", "sequential"}
        How resampled particles travel between ranks (:func:`torchtree.distributed.redistribute`;
        the result is the same for all). "gather" and "sequential" run on one rank only.
    checkpoint : str, optional
        Path of a checkpoint to write and, when it exists, resume from (see the module notes).
    checkpoint_every : int
        Save after every ``checkpoint_every`` iterations (and after the last).
    cut_proposal : {"prior", "data", "informed"}
        How grow / change moves draw a cut (:func:`torchtree.steps.moves.propose`): uniform on
        the node's data range as the prior draws it; a gap between consecutive
        distinct values uniform among the node's gaps, then uniform in it (meant for
        features with far-apart codes); or ``"informed"``: one of 16 equal cells of the
        range with probability 0.9 softmax(likelihood of the split at the cell's
        midpoint) + 0.1 / 16, then uniform in the cell. The target, hence the
        posterior, is the same; the incremental weights carry the proposal density
        ratio. The default is ``"informed"``: on the four paper-002 data sets (10 splits)
        it gives a better test log-likelihood on every one and equal or better accuracy
        (heart 77.3 -> 79.5 %, students 73.5 -> 73.7 %) for 1.2-3x the time; the final
        ESS moves either way (students 4 -> 14 of 1024, diabetes 197 -> 72); see
        ``examples/bench_paper002.py``.
    max_bins : int, optional
        Fit on at most ``max_bins`` quantile bins per feature, as for :class:`MCMC` (a change
        of the split prior). None (default): the data as given, the paper's model.
    """

    name = "SMCSampler"

    config_class = SMCSamplerConfig

    def __init__(self, prior=None, likelihood=None, *, alpha_split: float = ALPHA_SPLIT,
                 beta_split: float = BETA_SPLIT, poisson_lambda: float = POISSON_LAMBDA, backend=None, **settings: Any) -> None:
        self.config = SMCSamplerConfig(**settings)
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

    def run(self, data, *, seed=None, monitor=None, backend=None) -> TreePosterior:
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
    def setup(self, ctx: driver.RunContext) -> None:
        """Check the settings against the ranks; the likelihood, the target, this rank's particles."""
        c, W = self.config, ctx.world_size
        if W > 1 and c.redistribution in ("gather", "sequential"):
            raise ValueError(f"redistribution={c.redistribution!r} runs on one rank; this run has {W} "
                             "(use 'auto', 'alltoall' or 'rotational')")
        if c.n_particles % W:
            raise ValueError(f"n_particles ({c.n_particles}) must be divisible by the number of ranks ({W})")
        lik = self.likelihood if self.likelihood is not None else default_likelihood(ctx.data)
        n = c.n_particles // W
        if W == 1:  # one rank alone would refuse while the others wait in a collective
            check_tree_memory("SMCSampler", n, ctx.data, "n_particles",
                              per_tree=2 * hard_tree_bytes(ctx.data.n, ctx.data.n_classes or 3))
        ctx.extra.update(likelihood=lik, model=TreeModel(self.prior, lik, ctx.data, c.use_likelihood, c.max_bins),
                         # the exact reductions run through a backend also on one process
                         backend=ctx.backend if ctx.backend is not None else LocalBackend(),
                         n_local=n, gidx=torch.arange(ctx.rank * n, (ctx.rank + 1) * n, device=ctx.device),
                         tempered=c.tempering and c.use_likelihood)

    def settings(self, ctx: driver.RunContext) -> Dict[str, Any]:
        """What decides the result besides the config: the prior, the likelihood, the task."""
        return {"prior": describe(self.prior), "likelihood": describe(ctx.extra["likelihood"]), "task": ctx.data.task}

    def start_info(self, ctx: driver.RunContext) -> Dict[str, Any]:
        c = self.config
        return {"n_particles": c.n_particles, "n_iterations": c.n_iterations, "mh_step": c.mh_step, "n": ctx.data.n,
                "d": ctx.data.d, "prior": repr(self.prior), "world_size": ctx.world_size, "n_steps": c.n_iterations,
                "total": c.n_iterations}  # steps to expect (one report each): a progress bar's length

    def _stats(self, ctx: driver.RunContext, rows: List[torch.Tensor], maxes=(), sums=()):
        """:func:`~torchtree.distributed.exact.global_stats` of the weight vectors ``rows`` (each [n])."""
        return global_stats(ctx.extra["backend"], self.config.n_particles, torch.stack(rows), maxes, sums)

    def init(self, ctx: driver.RunContext) -> SMCSamplerState:
        """Particles from the Chipman prior weighted by eq. 4b (flat under tempering); resampled
        at once when their ESS is already too low."""
        c, model, P = self.config, ctx.extra["model"], self.config.n_particles
        tempered = ctx.extra["tempered"]
        ctx.extra["useed"] = derive_seed(ctx.seed, Stream.MOVES)
        if c.init_prior == "topdown":
            # equal weights: a properly weighted sample whose mean weight is the run's evidence
            seed = derive_seed(ctx.seed, Stream.TOPDOWN_START)
            particles, log_z = topdown_draws(model, ctx.extra["gidx"], seed, n_particles=P, ctx=ctx)
            logw = torch.full((ctx.extra["n_local"],), log_z, dtype=torch.float64, device=ctx.device)
        else:
            seed = derive_seed(ctx.seed, Stream.PRIOR_START)
            particles, log_q0 = sample_prior_state(model, ctx.extra["n_local"], seed, ctx.extra["gidx"],
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
        ctx.extra["useed"] = derive_seed(ctx.seed, Stream.MOVES)
        st = SMCSamplerState.from_state_dict(saved, ctx.device)
        if st.particles.n_trees != ctx.extra["n_local"]:
            raise ValueError(f"checkpoint holds {st.particles.n_trees} particles on this rank, expected "
                             f"{ctx.extra['n_local']}")
        return st

    def _resample(self, st: SMCSamplerState, ctx: driver.RunContext, step: int) -> None:
        """Resample by ``st.logw`` (in place); copies in canonical order, the same on any number of ranks."""
        c, P, W, dev = self.config, self.config.n_particles, ctx.world_size, ctx.device
        backend, n = ctx.extra["backend"], ctx.extra["n_local"]
        g = torch.Generator(device="cpu").manual_seed(derive_seed(ctx.seed, Stream.RESAMPLING, step))
        if c.resampling in ("systematic", "multinomial"):
            nc = ncopies_from_log_weights(st.logw, backend, method=c.resampling, generator=g)
        else:  # every rank draws the same global ancestors from the gathered log-weights
            full = backend.all_gather(st.logw.cpu()) if W > 1 else st.logw.cpu()
            anc = torch.sort(get_resampler(c.resampling)(g, full, P)).values
            g0 = ctx.rank * n
            nc = torch.bincount(anc, minlength=P)[g0:g0 + n].to(dev)
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
        c, model, mp = self.config, ctx.extra["model"], self.config.move_probs
        k, K, P = int(st.step), c.n_iterations, c.n_particles
        tempered, res, phi = ctx.extra["tempered"], False, st.phi
        if tempered:
            # Reweight to the next temperature, resample, then move with an MH kernel at it.
            if k == K - 1:
                new_phi = 1.0
            else:
                stats = functools.partial(global_stats, ctx.extra["backend"], P)
                new_phi = next_temperature(stats, st.logw, st.ll, phi, c.ess_threshold * P, K - k)
            new_logw = st.logw + (new_phi - phi) * st.ll
            (l0, l1), (_, e), (cap,), _ = self._stats(ctx, [st.logw, new_logw], maxes=[st.particles.trees.capacity])
            st.particles.trees.reserve(int(cap))
            st.log_z += l1 - l0
            st.logw, phi = new_logw, new_phi
            st.phi = phi
            st.ess.append(e)
            if e < c.ess_threshold * P:
                self._resample(st, ctx, k + 1)
                st.logw, res = torch.zeros_like(st.logw), True
        u = keyed_uniform(ctx.extra["useed"], k, ctx.extra["gidx"][:, None],
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
        (l0, l1), (_, e), (cap, lmax), (n_acc, lsum, dsum) = self._stats(
            ctx, [st.logw, new_logw], maxes=[trees.capacity, float(leaves.max())],
            sums=[int(acc.sum()), int(leaves.sum()), int(depth.sum())])
        trees.reserve(int(cap))
        if not tempered:
            st.log_z += l1 - l0
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
        snap = ctx.extra["model"].on_grid(snapshot_trees(st.particles.trees))  # max_bins: thresholds onto the grid
        snap.reserve(int(cap))
        if W > 1:
            backend = ctx.extra["backend"]
            d = snap.as_dict()
            layout = BlockLayout(d)
            snap = HardTrees.from_dict(layout.unpack(backend.all_gather(layout.pack(d))))
            logw_all = backend.all_gather(st.logw.cpu()).to(dev)
        else:
            logw_all = st.logw
        trees, lw_d, inv = dedupe_trees(snap, logw_all)
        counts = torch.bincount(inv, minlength=trees.n_trees)
        moved, tempered = st.moved, ctx.extra["tempered"]
        info = {"sampler": self.name, "n_particles": P, "n_iterations": c.n_iterations, "mh_step": c.mh_step,
                "prior": repr(self.prior), "resampling": c.resampling, "ess_threshold": c.ess_threshold,
                "n_resample": st.n_resample, "final_ess": final_ess, "ess_trace": list(st.ess),
                "tempering": bool(tempered), "temperatures": list(st.phis),
                "accept_fraction": float(sum(moved) / len(moved)) if moved else float("nan"),
                "particle_counts": counts.cpu(), "seconds": ctx.seconds(), "world_size": W, "rank": ctx.rank,
                "resumed_from": None if ctx.resumed_at is None else ctx.resumed_at - 1}
        post = TreePosterior(trees, lw_d, ctx.extra["likelihood"], data.d, classes=data.classes_,
                             log_evidence=st.log_z, info=info, dedupe=False)
        post.n_particles = P
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
    Xt = posterior._X(X)
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
