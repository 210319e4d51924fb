"""SMC sampler over complete trees with grow / prune / change / swap moves (paper 002, Alg. 4).

Every particle is a complete tree. Initial particles are drawn from the Chipman
prior and weighted by eq. 4b, ``w_0 = pi(t_0) / q_0(t_0)`` (the likelihood, for the
Chipman target). Each of the ``n_iterations`` iterations proposes one move per
particle and multiplies its weight by eq. 5b,

    w_k = w_{k-1} * pi(t_k) q(t_{k-1} | t_k) / (pi(t_{k-1}) q(t_k | t_{k-1})),

i.e. an SMC sampler with a fixed target and the reverse proposal as backward
kernel; weights are normalised and the particles resampled (then redistributed
in place with :meth:`HardTrees.take_` and ``stable_ancestors``) whenever the
ESS falls below ``ess_threshold * n_particles``. A proposal that is impossible
under the prior (an empty node, ...) keeps its particle with incremental weight
one: that is the kernel's atom at the current tree, so the weights stay exact
and no particle is killed for it.

``mh_step=True`` gives the resample-move variant: every proposal goes through a
Metropolis-Hastings accept/reject step, which leaves the target invariant, so
the incremental weights are one and the particles only carry the initial
importance weights (resampled away when they are degenerate).

Unlike the published code, predictions use the final weights; the paper's
accuracy figure (mean accuracy of the individual particles) is available from
:func:`per_particle_accuracy`.
"""
from __future__ import annotations

import math
import time
from typing import Sequence

import torch

from .mcmc import _snapshot, check_move_probs, default_likelihood, make_prior
from .monitor import NullMonitor, as_monitor
from .moves import N_SLOTS, TreeModel, draw_moves, propose, sample_prior_state
from .posterior import TreePosterior, dedupe_trees
from .random import derive_seed, keyed_uniform, seed_to_int
from .resampling import RESAMPLERS, get_resampler, stable_ancestors

__all__ = ["SMCSampler", "per_particle_accuracy"]


def _ess(logw: torch.Tensor) -> float:
    return float(torch.exp(2 * torch.logsumexp(logw, 0) - torch.logsumexp(2 * logw, 0)))


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
        N.
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
        ``phi`` rising from 0 to 1 over the iterations (each step as large as keeps the
        ESS above ``ess_threshold * n_particles``, and at least an equal share of what
        is left), each followed by resampling when needed and one MH move per particle
        at the current ``phi``. The initial weights are then flat; the evidence
        estimate is the usual product of mean incremental weights.
    init_prior : ChipmanPrior, optional
        Initial proposal ``q_0`` (default: the target's Chipman prior, or
        ``ChipmanPrior()`` for a Poisson target). A prior with larger trees starts the
        particles closer to posterior tree sizes; eq. 4b's initial weights
        ``pi(t_0) / q_0(t_0)`` keep the target exact.
    device : str or torch.device, optional
        Default: the data's device.
    backend : None
        Multi-rank runs come with the distributed redistribution; the state is
        HardTrees plus per-particle tensors so that it can be redistributed.
    """

    def __init__(self, prior=None, likelihood=None, *, n_particles: int = 1024, n_iterations: int = 10,
                 move_probs: Sequence[float] = (0.25, 0.25, 0.25, 0.25), resampling: str = "multinomial",
                 ess_threshold: float = 0.5, mh_step: bool = False, alpha_split: float = 0.95,
                 beta_split: float = 0.5, poisson_lambda: float = 5.0, use_likelihood: bool = True,
                 init_prior=None, tempering: bool = False, device=None, backend=None) -> None:
        if int(n_particles) < 1:
            raise ValueError(f"n_particles must be >= 1, got {n_particles}")
        if int(n_iterations) < 0:
            raise ValueError(f"n_iterations must be >= 0, got {n_iterations}")
        if resampling not in RESAMPLERS:
            raise ValueError(f"resampling must be one of {tuple(RESAMPLERS)}, got {resampling!r}")
        if not 0.0 <= float(ess_threshold) <= 1.0:
            raise ValueError(f"ess_threshold must lie in [0, 1], got {ess_threshold}")
        if backend is not None:
            raise NotImplementedError("multi-rank SMCSampler is not implemented yet (backend must be None)")
        self.prior = make_prior(prior, alpha_split, beta_split, poisson_lambda)
        self.likelihood = likelihood
        self.n_particles, self.n_iterations = int(n_particles), int(n_iterations)
        self.move_probs = check_move_probs(move_probs)
        self.resampling, self.ess_threshold = resampling, float(ess_threshold)
        self.mh_step = bool(mh_step)
        self.use_likelihood = bool(use_likelihood)
        if init_prior is not None and getattr(init_prior, "name", None) != "chipman":
            raise ValueError("init_prior must be a ChipmanPrior (the initial proposal must be easy to sample)")
        self.init_prior = init_prior
        self.tempering = bool(tempering)
        self.device, self.backend = device, backend

    def run(self, data, *, seed=None, monitor=None) -> TreePosterior:
        """Run the sampler on ``data``.

        Parameters
        ----------
        data : Data
        seed : int or torch.Generator, optional
        monitor : Monitor or list of Monitors, optional
            Receives per iteration ``smc/ess``, ``smc/log_evidence``, ``smc/resampled``,
            ``smc/accept`` (fraction of particles that moved), ``trees/leaves_mean``,
            ``trees/leaves_max``, ``trees/depth_mean``, ``time/seconds``.

        Returns
        -------
        TreePosterior
            Weighted by the final weights. ``log_evidence`` is the running sum of
            the log mean incremental weights (with eq. 4b's initial weights). The
            target is fixed, so every later factor estimates 1 and the product is
            an unbiased estimate of ``p(Y | X)`` under the Chipman prior; with
            ``mh_step=True`` it is the initial importance-sampling estimate; with
            a Poisson prior it estimates the normaliser of the Poisson target,
            which is not normalised over tree shapes (paper 002 eq. 14), so it is
            not comparable with the Chipman evidence. ``info`` holds the final
            ESS, the number of resampling steps, acceptance fraction and
            ``particle_counts`` (copies of each distinct tree among the particles).
        """
        t0 = time.perf_counter()
        if self.device is not None and data.device != torch.device(self.device):
            data = data.to(self.device)
        lik = self.likelihood if self.likelihood is not None else default_likelihood(data)
        model = TreeModel(self.prior, lik, data, self.use_likelihood)
        seed_i = seed_to_int(seed)
        mon = as_monitor(monitor)
        watch = not isinstance(mon, NullMonitor)
        P, K, dev = self.n_particles, self.n_iterations, data.device
        mp = self.move_probs
        gidx = torch.arange(P, device=dev)
        mon.on_start({"sampler": "SMCSampler", "n_particles": P, "n_iterations": K, "mh_step": self.mh_step,
                      "n": data.n, "d": data.d, "prior": repr(self.prior)})
        state, log_q0 = sample_prior_state(model, P, derive_seed(seed_i, 1), gidx, draw_prior=self.init_prior)
        tempered = self.tempering and self.use_likelihood
        ll = state.log_likelihood(model) if tempered else None
        logw = state.log_posterior(model) - log_q0  # eq. 4b
        if tempered:
            logw = logw - ll  # the first target is the prior (likelihood power 0)
        log_z = float(torch.logsumexp(logw, 0)) - math.log(P)
        resample_fn = get_resampler(self.resampling)
        n_resample, moved_frac, ess_trace, phis = 0, [], [], []
        phi = 0.0 if tempered else 1.0

        def maybe_resample(logw, step, allowed=True):
            nonlocal n_resample, ll
            e = _ess(logw)
            ess_trace.append(e)
            if allowed and e < self.ess_threshold * P:
                g = torch.Generator(device="cpu").manual_seed(derive_seed(seed_i, 3, step))
                anc = stable_ancestors(resample_fn(g, logw, P), P)
                state.take_(anc)
                if ll is not None:
                    ll = ll.index_select(0, anc)
                n_resample += 1
                return torch.zeros_like(logw), e, True
            return logw, e, False

        def reweight(logw, incr):
            nonlocal log_z
            log_z += float(torch.logsumexp(logw - torch.logsumexp(logw, 0) + incr, 0))
            return logw + incr

        if not tempered:
            logw, _, _ = maybe_resample(logw, 0)
        useed = derive_seed(seed_i, 2)
        slots = torch.arange(N_SLOTS, device=dev)
        for k in range(K):
            res = False
            if tempered:
                # Reweight to the next temperature, resample, then move with an MH kernel at it.
                new_phi = 1.0 if k == K - 1 else _next_temperature(logw, ll, phi, self.ess_threshold * P, K - k)
                logw = reweight(logw, (new_phi - phi) * ll)
                phi = new_phi
                logw, e, res = maybe_resample(logw, k + 1)
            u = keyed_uniform(useed, k, gidx[:, None], slots)
            kind = draw_moves(u[:, 0], mp)
            prop = propose(state, model, kind, u, mp)
            if tempered:
                la = prop.log_target_ratio - (1.0 - phi) * prop.log_lik_ratio + prop.log_q_ratio
                acc = prop.valid & (torch.log(u[:, 4]) < la)
                ll = ll + torch.where(acc, prop.log_lik_ratio, torch.zeros_like(ll))
            elif self.mh_step:
                acc = torch.log(u[:, 4]) < prop.log_accept_ratio
            else:
                acc = prop.valid
                logw = reweight(logw, torch.where(acc, prop.log_target_ratio + prop.log_q_ratio, torch.zeros_like(logw)))
            state.accept_(prop, acc)
            if not tempered:
                # No resampling after the last reweighting: predictions use the weights.
                logw, e, res = maybe_resample(logw, k + 1, allowed=k < K - 1)
            phis.append(phi)
            moved_frac.append(acc.double().mean())
            if watch:
                leaves = state.trees.n_leaves().double()
                mon.on_step(k, {"smc/ess": e, "smc/log_evidence": log_z, "smc/resampled": int(res),
                                "smc/accept": float(moved_frac[-1]), "smc/temperature": phi,
                                "trees/leaves_mean": float(leaves.mean()), "trees/leaves_max": float(leaves.max()),
                                "trees/depth_mean": float(state.trees.max_depth().double().mean()),
                                "time/seconds": time.perf_counter() - t0})
        trees, lw_d, inv = dedupe_trees(_snapshot(state.trees), logw)
        counts = torch.bincount(inv, minlength=trees.n_trees)
        elapsed = time.perf_counter() - t0
        info = {"sampler": "SMCSampler", "n_particles": P, "n_iterations": K, "mh_step": self.mh_step,
                "prior": repr(self.prior), "resampling": self.resampling, "ess_threshold": self.ess_threshold,
                "n_resample": n_resample, "final_ess": _ess(logw), "ess_trace": ess_trace, "tempering": bool(tempered),
                "temperatures": phis,
                "accept_fraction": float(torch.stack(moved_frac).mean()) if moved_frac else float("nan"),
                "particle_counts": counts.cpu(), "seconds": elapsed}
        post = TreePosterior(trees, lw_d, lik, data.d, classes=data.classes_, log_evidence=log_z, info=info, dedupe=False)
        post.n_particles = P
        mon.on_end({"log_evidence": log_z, "seconds": elapsed, "final_ess": info["final_ess"], "posterior": post})
        return post


def _next_temperature(logw: torch.Tensor, ll: torch.Tensor, phi: float, target_ess: float, steps_left: int) -> float:
    """Next likelihood power: the largest one whose reweighting keeps ESS >= ``target_ess``
    (bisection), but at least an equal share of what is left so that 1 is reached in time."""
    floor = phi + (1.0 - phi) / steps_left
    if _ess(logw + (1.0 - phi) * ll) >= target_ess:
        return 1.0
    lo, hi = phi, 1.0
    for _ in range(50):
        mid = 0.5 * (lo + hi)
        if _ess(logw + (mid - phi) * ll) >= target_ess:
            lo = mid
        else:
            hi = mid
    return max(lo, floor)


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
