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
Sums of weights are taken in exact integer arithmetic: each weight is turned into
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
resumes after the saved iteration; a different run's checkpoint is a
:class:`~torchtree.io.checkpoint.CheckpointError`. Multi-rank runs write one file per
rank plus a manifest (:class:`~torchtree.io.checkpoint.Checkpointer`).
"""
from __future__ import annotations

import math
import re
import time
import zlib
from typing import Optional, Sequence

import torch

from torchtree.io.checkpoint import Checkpointer, fingerprint
from torchtree.model.data import coerce_data, resolve_device
from torchtree.distributed import (
    METHODS as REDISTRIBUTION_METHODS,
    BlockLayout,
    LocalBackend,
    ancestors_from_ncopies,
    fixed_point_weights,
    get_backend,
    ncopies_from_log_weights,
    redistribute,
)
from torchtree.model.priors import make_prior
from torchtree.samplers.driver import default_likelihood
from torchtree.samplers.mcmc import _snapshot, check_move_probs
from torchtree.monitor import NullMonitor, as_monitor
from torchtree.steps.moves import N_SLOTS, TreeModel, TreeState, check_cut_proposal, draw_moves, propose, sample_prior_state
from torchtree.model.posterior import TreePosterior, dedupe_trees
from torchtree.core.random import derive_seed, keyed_uniform, seed_to_int
from torchtree.core.resampling import RESAMPLERS, get_resampler
from torchtree.model.trees import HardTrees
from torchtree.core.validate import check_backend, check_choice, check_int, check_real
from torchtree.core.memory import check_tree_memory, hard_tree_bytes

__all__ = ["SMCSampler", "per_particle_accuracy"]

_LN2 = math.log(2.0)
_LL_KEY = "smc.log_likelihood"  # per-particle tempering state travelling with the trees


class _StopForTest(RuntimeError):
    """Raised by the private test hook ``SMCSampler._stop_after``."""


# ------------------------------------------------------------------ exact global reductions
def _fixed_bits(n_total: int) -> int:
    return 62 - max(0, math.ceil(math.log2(max(n_total, 1))))


def _fixed_sums(x: torch.Tensor, m: torch.Tensor, bits: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Row sums of ``round(2^bits exp(x - m))`` and of ``round(2^bits exp(2 (x - m)))``.

    Parameters
    ----------
    x : float64 Tensor [R, n]
    m : float64 Tensor [R], the global row maxima (finite)
    bits : int

    Returns
    -------
    (int64 [R], int64 [R]); exact, so partial sums from any partition add up to the same total.
    """
    z = x - m[:, None]
    R, n = z.shape
    q = fixed_point_weights(z.reshape(-1), bits).view(R, n).sum(1)
    q2 = fixed_point_weights((2.0 * z).reshape(-1), bits).view(R, n).sum(1)
    return q, q2


def _global_stats(backend, n_total: int, lws: torch.Tensor, maxes: Sequence[float] = (),
                  sums: Sequence[int] = ()):
    """Log-sum-exp and ESS of each row of ``lws`` over all ranks, bit-identical on any partition.

    Parameters
    ----------
    backend : Backend
    n_total : int, N (global particles)
    lws : float64 Tensor [R, n], this rank's rows of R global log-weight vectors
    maxes : floats reduced with ``max`` in the same collective (e.g. tree capacity)
    sums : ints reduced with ``sum`` in the same collective (e.g. accepted moves)

    Returns
    -------
    lse : list of R floats, ``log sum_i exp(lws[r, i])`` (``-inf`` if every weight is zero)
    ess : list of R floats, ``(sum w)^2 / sum w^2`` (0 if every weight is zero)
    maxes : list of floats
    sums : list of ints

    Notes
    -----
    Two collectives: one ``all_reduce(max)`` of ``R + len(maxes)`` float64, one
    ``all_reduce(sum)`` of ``2R + len(sums)`` int64. The sums are exact integers (see the
    module notes), so the result is a pure function of the global log-weights.
    """
    R = lws.shape[0]
    loc = lws.max(1).values if lws.shape[1] else torch.full((R,), -math.inf, dtype=torch.float64)
    head = torch.cat([loc.double().cpu(), torch.tensor([float(v) for v in maxes], dtype=torch.float64)])
    head = backend.all_reduce(head, "max")
    M = head[:R]
    bits = _fixed_bits(n_total)
    fin = torch.isfinite(M)
    q, q2 = _fixed_sums(lws, torch.where(fin, M, torch.zeros_like(M)).to(lws.device), bits)
    q = torch.where(fin.to(q.device), q, torch.zeros_like(q))
    q2 = torch.where(fin.to(q.device), q2, torch.zeros_like(q2))
    ints = torch.cat([q.cpu(), q2.cpu(), torch.tensor([int(v) for v in sums], dtype=torch.int64)])
    ints = backend.all_reduce(ints, "sum").tolist()
    lse, ess = [], []
    for r in range(R):
        s1, s2 = int(ints[r]), int(ints[R + r])
        if s1 <= 0 or not bool(fin[r]):
            lse.append(-math.inf)
            ess.append(0.0)
        else:
            lse.append(float(M[r]) + math.log(s1) - bits * _LN2)
            ess.append(s1 * s1 / (s2 << bits))
    return lse, ess, head[R:].tolist(), [int(v) for v in ints[2 * R:]]


def _next_temperature(backend, n_total: int, logw: torch.Tensor, ll: torch.Tensor, phi: float, target_ess: float,
                      steps_left: int, grid: int = 16, rounds: int = 5) -> float:
    """Next likelihood power: about the largest one whose reweighting keeps ESS >= ``target_ess``,
    but at least an equal share of what is left so that 1 is reached in time.

    A grid search (``grid`` candidates per round, ``rounds`` rounds: resolution
    ``(1 - phi) grid^-rounds``) that evaluates all candidates of a round in the two
    collectives of :func:`_global_stats`; like a bisection it assumes the ESS falls with
    the step.
    """
    floor = phi + (1.0 - phi) / steps_left
    span = 1.0 - phi
    lo, hi = 0.0, span
    for rnd in range(rounds):
        cands = [lo + (hi - lo) * (i + 1) / grid for i in range(grid)]
        cands[-1] = hi
        d = torch.tensor(cands, dtype=torch.float64, device=logw.device)
        _, ess, _, _ = _global_stats(backend, n_total, logw[None, :] + d[:, None] * ll[None, :])
        if rnd == 0 and ess[-1] >= target_ess:
            return 1.0
        f = next((i for i, e in enumerate(ess) if e < target_ess), grid - 1)
        lo, hi = (cands[f - 1] if f > 0 else lo), cands[f]
    return max(phi + lo, floor)


def _settings_text(smc, data, lik, world_size: int) -> str:
    text = repr((type(smc).__name__, smc.n_particles, smc.n_iterations, tuple(smc.move_probs), smc.resampling,
                 smc.ess_threshold, smc.mh_step, repr(smc.prior), repr(lik), smc.use_likelihood,
                 repr(smc.init_prior), smc.tempering, data.n, data.d, data.task, getattr(data, "n_classes", None),
                 world_size) + ((smc.cut_proposal,) if smc.cut_proposal != "prior" else ()))
    return re.sub(r" at 0x[0-9a-fA-F]+", "", text)


class SMCSampler:
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
    init_prior : ChipmanPrior or "chipman", optional
        Initial proposal ``q_0`` (default: the target's Chipman prior, or
        ``ChipmanPrior()`` for a Poisson target). A prior with larger trees starts the
        particles closer to posterior tree sizes; eq. 4b's initial weights
        ``pi(t_0) / q_0(t_0)`` keep the target exact.
    device : str or torch.device, optional
        Default: the data's device.
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
    """

    #: private test hook: raise after the iteration with this index (after its checkpoint)
    _stop_after: Optional[int] = None

    def __init__(self, prior=None, likelihood=None, *, n_particles: int = 1024, n_iterations: int = 10,
                 move_probs: Sequence[float] = (0.25, 0.25, 0.25, 0.25), resampling: str = "multinomial",
                 ess_threshold: float = 0.5, mh_step: bool = False, alpha_split: float = 0.95,
                 beta_split: float = 0.5, poisson_lambda: float = 5.0, use_likelihood: bool = True,
                 init_prior=None, tempering: bool = False, device=None, backend=None,
                 redistribution: str = "auto", checkpoint: Optional[str] = None, checkpoint_every: int = 1,
                 cut_proposal: str = "informed") -> None:
        n_particles = check_int("n_particles", n_particles, 1)
        n_iterations = check_int("n_iterations", n_iterations, 0)
        check_choice("resampling", resampling, RESAMPLERS)
        ess_threshold = check_real("ess_threshold", ess_threshold, 0.0, 1.0, low_open=False)
        check_backend(backend)
        if backend is not None and not isinstance(backend, str):  # a name is resolved in run()
            if n_particles % int(backend.world_size):
                raise ValueError(
                    f"n_particles ({n_particles}) must be divisible by the number of ranks ({backend.world_size}): "
                    "every rank holds n_particles / world_size particles")
        check_choice("redistribution", redistribution, REDISTRIBUTION_METHODS)
        checkpoint_every = check_int("checkpoint_every", checkpoint_every, 1)
        self.prior = make_prior(prior, alpha_split, beta_split, poisson_lambda)
        self.likelihood = likelihood
        self.n_particles, self.n_iterations = n_particles, n_iterations
        self.move_probs = check_move_probs(move_probs)
        self.resampling, self.ess_threshold = resampling, ess_threshold
        self.mh_step = bool(mh_step)
        self.use_likelihood = bool(use_likelihood)
        if isinstance(init_prior, str):  # "chipman" (e.g. from the command line)
            init_prior = make_prior(init_prior)
        if init_prior is not None and getattr(init_prior, "name", None) != "chipman":
            raise ValueError("init_prior must be a ChipmanPrior (the initial proposal must be easy to sample)")
        self.init_prior = init_prior
        self.tempering = bool(tempering)
        self.device, self.backend = device, backend
        self.redistribution = redistribution
        self.checkpoint, self.checkpoint_every = checkpoint, int(checkpoint_every)
        self.cut_proposal = check_cut_proposal(cut_proposal)

    def run(self, data, *, seed=None, monitor=None) -> TreePosterior:
        """Run the sampler on ``data`` (on every rank, with the full data, in a multi-rank run).

        Parameters
        ----------
        data : Data
        seed : int or torch.Generator, optional
            In a multi-rank run rank 0's value is used by every rank.
        monitor : Monitor or list of Monitors, optional
            Receives per iteration ``smc/ess``, ``smc/log_evidence``, ``smc/resampled``,
            ``smc/accept`` (fraction of particles that moved), ``smc/temperature``,
            ``trees/leaves_mean``, ``trees/leaves_max``, ``trees/depth_mean`` (all global
            over ranks), ``time/seconds``. Written by rank 0 only.

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
        t0 = time.perf_counter()
        data = coerce_data(data)
        dev = resolve_device(self.device) if self.device is not None else data.device
        if data.device != dev:
            data = data.to(dev)
        if isinstance(self.backend, str):
            backend = get_backend(self.backend)
            try:
                return self._run(data, backend, seed, monitor, t0)
            finally:
                backend.close()  # destroys only a process group that get_backend opened
        return self._run(data, self.backend if self.backend is not None else LocalBackend(), seed, monitor, t0)

    def _run(self, data, backend, seed, monitor, t0: float) -> TreePosterior:
        W, rank = int(backend.world_size), int(backend.rank)
        if W > 1 and self.redistribution in ("gather", "sequential"):
            raise ValueError(f"redistribution={self.redistribution!r} runs on one rank; this run has {W} "
                             "(use 'auto', 'alltoall' or 'rotational')")
        P, K, dev = self.n_particles, self.n_iterations, data.device
        if P % W:
            raise ValueError(f"n_particles ({P}) must be divisible by the number of ranks ({W})")
        n = P // W
        if W == 1:  # a refusal on one rank only would leave the others waiting in a collective
            check_tree_memory("SMCSampler", n, data, "n_particles", per_tree=2 * hard_tree_bytes(data.n, data.n_classes or 3))
        g0 = rank * n
        lik = self.likelihood if self.likelihood is not None else default_likelihood(data)
        model = TreeModel(self.prior, lik, data, self.use_likelihood)
        seed_i = seed_to_int(seed)
        if W > 1:  # one set-up collective: rank 0's seed, and a check that every rank runs the same job
            h = zlib.crc32(_settings_text(self, data, lik, W).encode())
            table = backend.all_gather(torch.tensor([[seed_i, h]], dtype=torch.int64))
            if bool((table[:, 1] != table[0, 1]).any()):
                raise ValueError("ranks disagree on the SMCSampler settings or the data's shape; "
                                 "every rank must run the same sampler on the same full training data")
            seed_i = int(table[0, 0])
        ck = Checkpointer(self.checkpoint, self.checkpoint_every, backend=backend if W > 1 else None,
                          fingerprint=self._fingerprint(data, lik, seed, W) if self.checkpoint else None)
        mon = as_monitor(monitor, rank=rank)
        watch = not isinstance(mon, NullMonitor)
        mp = self.move_probs
        gidx = torch.arange(g0, g0 + n, device=dev)
        tempered = self.tempering and self.use_likelihood
        resample_fn = get_resampler(self.resampling)
        mon.on_start({"sampler": "SMCSampler", "n_particles": P, "n_iterations": K, "total": K, "mh_step": self.mh_step,
                      "n": data.n, "d": data.d, "prior": repr(self.prior), "world_size": W})
        S = {"n_resample": 0, "moved": [], "ess": [], "phis": [], "log_z": 0.0, "phi": 0.0 if tempered else 1.0}
        ll = None

        def stats(rows, maxes=(), sums=()):
            return _global_stats(backend, P, torch.stack(rows), maxes, sums)

        def harmonize(cap: float) -> None:
            state.trees.reserve(int(cap))

        def resample(step: int) -> None:
            nonlocal state, ll
            g = torch.Generator(device="cpu").manual_seed(derive_seed(seed_i, 3, step))
            if self.resampling in ("systematic", "multinomial"):
                nc = ncopies_from_log_weights(logw, backend, method=self.resampling, generator=g)
            else:  # every rank draws the same global ancestors from the gathered log-weights
                full = backend.all_gather(logw.cpu()) if W > 1 else logw.cpu()
                anc = torch.sort(resample_fn(g, full, P)).values
                nc = torch.bincount(anc, minlength=P)[g0:g0 + n].to(dev)
            if W == 1:
                anc = ancestors_from_ncopies(nc.to(dev))
                state.take_(anc)
                if ll is not None:
                    ll = ll.index_select(0, anc)
            else:
                block = state.trees.as_dict()
                if ll is not None:
                    block[_LL_KEY] = ll
                out = redistribute(block, nc, backend, method=self.redistribution)
                if ll is not None:
                    ll = out.pop(_LL_KEY)
                state = TreeState(HardTrees.from_dict(out))
            S["n_resample"] += 1

        saved = ck.load()
        if saved is not None:
            start = int(saved["iteration"]) + 1
            seed_i = int(saved["seed"])
            state = TreeState(HardTrees.from_dict({k: v.to(dev) for k, v in saved["trees"].items()}))
            logw = saved["logw"].to(dev)
            ll = saved["ll"].to(dev) if tempered else None
            for key in ("n_resample", "log_z", "phi"):
                S[key] = saved[key]
            S["moved"], S["ess"], S["phis"] = list(saved["moved"]), list(saved["ess"]), list(saved["phis"])
            if state.n_trees != n:
                raise ValueError(f"checkpoint holds {state.n_trees} particles on this rank, expected {n}")
        else:
            start = 0
            state, log_q0 = sample_prior_state(model, n, derive_seed(seed_i, 1), gidx, draw_prior=self.init_prior)
            ll = state.log_likelihood(model) if tempered else None
            logw = state.log_posterior(model) - log_q0  # eq. 4b
            if tempered:
                logw = logw - ll  # the first target is the prior (likelihood power 0)
            (lse,), (e,), (cap,), _ = stats([logw], maxes=[state.trees.capacity])
            harmonize(cap)
            S["log_z"] = lse - math.log(P)
            if not tempered:
                S["ess"].append(e)
                if e < self.ess_threshold * P:
                    resample(0)
                    logw = torch.zeros_like(logw)

        useed = derive_seed(seed_i, 2)
        slots = torch.arange(N_SLOTS, device=dev)
        for k in range(start, K):
            res = False
            phi = S["phi"]
            if tempered:
                # Reweight to the next temperature, resample, then move with an MH kernel at it.
                new_phi = 1.0 if k == K - 1 else _next_temperature(backend, P, logw, ll, phi, self.ess_threshold * P, K - k)
                new_logw = logw + (new_phi - phi) * ll
                (l0, l1), (_, e), (cap,), _ = stats([logw, new_logw], maxes=[state.trees.capacity])
                harmonize(cap)
                S["log_z"] += l1 - l0
                logw, phi = new_logw, new_phi
                S["phi"] = phi
                S["ess"].append(e)
                if e < self.ess_threshold * P:
                    resample(k + 1)
                    logw, res = torch.zeros_like(logw), True
            u = keyed_uniform(useed, k, gidx[:, None], slots)
            kind = draw_moves(u[:, 0], mp)
            prop = propose(state, model, kind, u, mp, self.cut_proposal)
            if tempered:
                la = prop.log_target_ratio - (1.0 - phi) * prop.log_lik_ratio + prop.log_q_ratio
                acc = prop.valid & (torch.log(u[:, 4]) < la)
                ll = ll + torch.where(acc, prop.log_lik_ratio, torch.zeros_like(ll))
                new_logw = logw
            elif self.mh_step:
                acc = torch.log(u[:, 4]) < prop.log_accept_ratio
                new_logw = logw
            else:
                acc = prop.valid
                new_logw = logw + torch.where(acc, prop.log_target_ratio + prop.log_q_ratio, torch.zeros_like(logw))
            state.accept_(prop, acc)
            leaves = state.trees.n_leaves()
            depth = state.trees.max_depth()
            (l0, l1), (_, e), (cap, lmax), (n_acc, lsum, dsum) = stats(
                [logw, new_logw], maxes=[state.trees.capacity, float(leaves.max())],
                sums=[int(acc.sum()), int(leaves.sum()), int(depth.sum())])
            harmonize(cap)
            if not tempered:
                S["log_z"] += l1 - l0
                S["ess"].append(e)
            logw = new_logw
            # No resampling after the last reweighting: predictions use the weights.
            if not tempered and k < K - 1 and e < self.ess_threshold * P:
                resample(k + 1)
                logw, res = torch.zeros_like(logw), True
            S["phis"].append(phi)
            S["moved"].append(n_acc / P)
            ck.maybe_save(k, lambda: self._checkpoint_state(k, seed_i, state, logw, ll, S), last=(k == K - 1))
            if watch:
                mon.on_step(k, {"smc/ess": S["ess"][-1], "smc/log_evidence": S["log_z"], "smc/resampled": int(res),
                                "smc/accept": S["moved"][-1], "smc/temperature": phi,
                                "trees/leaves_mean": lsum / P, "trees/leaves_max": lmax,
                                "trees/depth_mean": dsum / P, "time/seconds": time.perf_counter() - t0})
            if self._stop_after is not None and k == self._stop_after:
                raise _StopForTest(f"stopped after iteration {k} (test hook)")

        # ------------------------------------------------------------- the global posterior
        (_,), (final_ess,), (cap,), _ = stats([logw], maxes=[state.trees.capacity])
        snap = _snapshot(state.trees)
        snap.reserve(int(cap))
        if W > 1:
            d = snap.as_dict()
            layout = BlockLayout(d)
            snap = HardTrees.from_dict(layout.unpack(backend.all_gather(layout.pack(d))))
            logw_all = backend.all_gather(logw.cpu()).to(dev)
        else:
            logw_all = logw
        trees, lw_d, inv = dedupe_trees(snap, logw_all)
        counts = torch.bincount(inv, minlength=trees.n_trees)
        elapsed = time.perf_counter() - t0
        moved = S["moved"]
        info = {"sampler": "SMCSampler", "n_particles": P, "n_iterations": K, "mh_step": self.mh_step,
                "prior": repr(self.prior), "resampling": self.resampling, "ess_threshold": self.ess_threshold,
                "n_resample": S["n_resample"], "final_ess": final_ess, "ess_trace": list(S["ess"]),
                "tempering": bool(tempered), "temperatures": list(S["phis"]),
                "accept_fraction": float(sum(moved) / len(moved)) if moved else float("nan"),
                "particle_counts": counts.cpu(), "seconds": elapsed, "world_size": W, "rank": rank,
                "resumed_from": start - 1 if saved is not None else None}
        post = TreePosterior(trees, lw_d, lik, data.d, classes=data.classes_, log_evidence=S["log_z"], info=info,
                             dedupe=False)
        post.n_particles = P
        mon.on_end({"log_evidence": S["log_z"], "seconds": elapsed, "final_ess": final_ess, "posterior": post})
        return post

    # ---------------------------------------------------------------------- checkpoints
    def _fingerprint(self, data, lik, seed, world_size: int) -> str:
        # numpy integers are seeds like ints (they were all "generator": another seed's
        # checkpoint resumed); a torch.Generator's drawn seed is stored in the checkpoint
        s = None if seed is None else ("generator" if isinstance(seed, torch.Generator) else seed_to_int(seed))
        return fingerprint(_settings_text(self, data, lik, world_size), s, data.X, data.y)

    @staticmethod
    def _checkpoint_state(k: int, seed_i: int, state: TreeState, logw, ll, S: dict) -> dict:
        return {"iteration": int(k), "seed": int(seed_i),
                "trees": {key: v.detach().cpu() for key, v in state.trees.as_dict().items()},
                "logw": logw.detach().cpu(), "ll": None if ll is None else ll.detach().cpu(),
                "n_resample": int(S["n_resample"]), "log_z": float(S["log_z"]), "phi": float(S["phi"]),
                "moved": [float(v) for v in S["moved"]], "ess": [float(v) for v in S["ess"]],
                "phis": [float(v) for v in S["phis"]]}


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
