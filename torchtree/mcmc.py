"""Metropolis-Hastings over decision trees (Chipman, George & McCulloch, 1998).

Any number of chains run as one batch: every iteration proposes one
grow / prune / change / swap move per chain (:mod:`torchtree.moves`) and accepts it
with probability ``min(1, pi(t') q(t | t') / (pi(t) q(t' | t)))``. A single chain
is latency-bound: an iteration is a fixed number of small tensor operations,
random numbers are drawn in blocks of iterations, and nothing is synchronised
with the host except the subtree height that bounds the routing loop.

Diagnostics: acceptance rate per move type, and split-R-hat and effective sample
size (:func:`rhat`, :func:`chain_ess`) of the number of leaves and of the log
posterior, computed over the kept draws of all chains.
"""
from __future__ import annotations

import math
import time
from typing import Optional, Sequence

import numpy as np
import torch

from .likelihoods import DirichletMultinomial, NormalInverseGamma
from .monitor import NullMonitor, as_monitor
from .moves import MOVES, N_SLOTS, TreeModel, TreeState, draw_moves, propose, sample_prior_state
from .posterior import TreePosterior
from .priors import ChipmanPrior, PoissonPrior
from .random import derive_seed, keyed_uniform, seed_to_int
from .trees import HardTrees

__all__ = ["MCMC", "rhat", "chain_ess", "make_prior", "default_likelihood"]

_BLOCK = 512  # iterations whose uniforms are drawn in one call


def make_prior(prior=None, alpha_split: float = 0.95, beta_split: float = 0.5, poisson_lambda: float = 5.0):
    """Resolve ``prior``: an object is returned as is; ``None``/``"chipman"`` gives
    ``ChipmanPrior(alpha_split, beta_split)``; ``"poisson"`` gives ``PoissonPrior(poisson_lambda)``."""
    if prior is None or prior == "chipman":
        return ChipmanPrior(alpha_split, beta_split)
    if prior == "poisson":
        return PoissonPrior(poisson_lambda)
    if isinstance(prior, str):
        raise ValueError(f"prior must be 'chipman', 'poisson' or a prior object, got {prior!r}")
    return prior


def default_likelihood(data):
    """Dirichlet-multinomial(alpha=5) for classification, data-scaled NIG for regression."""
    if data.task == "classification":
        return DirichletMultinomial(5.0)
    return NormalInverseGamma.default_for(data.y)


def check_move_probs(move_probs: Sequence[float]) -> tuple:
    """Validate mixture probabilities (grow, prune, change, swap); returns them normalised."""
    mp = tuple(float(x) for x in move_probs)
    if len(mp) != 4 or any(not (x >= 0 and math.isfinite(x)) for x in mp) or sum(mp) <= 0:
        raise ValueError(f"move_probs must be 4 non-negative numbers (grow, prune, change, swap), got {move_probs}")
    if (mp[0] > 0) != (mp[1] > 0):
        raise ValueError("grow and prune must both have positive probability (each is the other's reverse move)")
    s = sum(mp)
    return tuple(x / s for x in mp)


# ----------------------------------------------------------------------------- diagnostics
def _as_draws(x) -> np.ndarray:
    a = np.asarray(x.detach().cpu() if isinstance(x, torch.Tensor) else x, dtype=np.float64)
    if a.ndim == 1:
        a = a[None, :]
    if a.ndim != 2:
        raise ValueError(f"draws must be [chains, draws], got shape {a.shape}")
    return a


def rhat(draws) -> float:
    """Split R-hat (Gelman et al., BDA3 sec. 11.4) of ``draws [chains, n]``.

    Each chain is split in halves, so one chain gives a usable value too.
    Returns ``nan`` when fewer than 4 draws per chain or the draws are constant.

    Parameters
    ----------
    draws : array-like [chains, n] (or [n])

    Returns
    -------
    float
    """
    a = _as_draws(draws)
    n = a.shape[1] // 2
    if n < 2:
        return float("nan")
    s = np.concatenate([a[:, :n], a[:, a.shape[1] - n:]], 0)
    w = s.var(1, ddof=1).mean()
    b = n * s.mean(1).var(ddof=1)
    if not w > 0:
        return float("nan")
    var_hat = (n - 1) / n * w + b / n
    return float(np.sqrt(var_hat / w))


def chain_ess(draws) -> float:
    """Effective sample size of ``draws [chains, n]`` pooled over chains.

    Multi-chain autocorrelation (Stan's estimator) truncated with Geyer's
    initial monotone positive-pair sequence.

    Parameters
    ----------
    draws : array-like [chains, n] (or [n])

    Returns
    -------
    float in (0, chains * n * log10(chains * n)]; ``nan`` for fewer than 4 draws or constant draws.
    """
    a = _as_draws(draws)
    m, n = a.shape
    if n < 4:
        return float("nan")
    x = a - a.mean(1, keepdims=True)
    nfft = 1 << (2 * n - 1).bit_length()
    f = np.fft.rfft(x, nfft, axis=1)
    acov = np.fft.irfft(f * np.conj(f), nfft, axis=1)[:, :n] / n  # biased autocovariance per chain
    w = (acov[:, 0] * n / (n - 1)).mean()
    var_hat = (n - 1) / n * w + (a.mean(1).var(ddof=1) if m > 1 else 0.0)
    if not var_hat > 0:
        return float("nan")
    rho = 1.0 - (w - acov.mean(0)) / var_hat
    rho[0] = 1.0
    # Geyer: sum consecutive pairs while positive, enforcing monotone decrease.
    npair = n // 2
    pairs = rho[: 2 * npair].reshape(npair, 2).sum(1)
    pos = np.nonzero(pairs <= 0)[0]
    k = pos[0] if pos.size else npair
    pairs = np.minimum.accumulate(pairs[:k]) if k else pairs[:0]
    tau = -1.0 + 2.0 * pairs.sum()
    tau = max(tau, 1.0 / math.log10(max(m * n, 10)))
    return float(m * n / tau)


# ----------------------------------------------------------------------------- sampler
class MCMC:
    """Chipman et al. (1998) Metropolis-Hastings sampler, many chains as one batch.

    Parameters
    ----------
    prior : ChipmanPrior, PoissonPrior, "chipman" or "poisson", optional
        Default ``ChipmanPrior(alpha_split, beta_split)``.
    likelihood : DirichletMultinomial or NormalInverseGamma, optional
        Default from the data (Dirichlet-multinomial alpha=5, or data-scaled NIG).
    n_chains : int
        Chains run together as one batch.
    n_samples : int
        Kept draws per chain (after warm-up and thinning).
    n_warmup : int, optional
        Burn-in iterations per chain (default ``n_samples * thin``: half the run, as
        in paper 002).
    thin : int
        Keep every ``thin``-th iteration after warm-up.
    move_probs : 4 floats
        Probabilities of grow, prune, change, swap (default 0.25 each).
    init : {"root", "prior"}
        Start each chain at the root-only tree or at a draw from the Chipman prior.
    keep : {"samples", "all"}
        Predict with the kept draws, or with every iteration including warm-up
        (paper 001's baseline averages over all iterations).
    alpha_split, beta_split, poisson_lambda : float
        Prior hyperparameters when ``prior`` is given by name.
    use_likelihood : bool
        False samples the prior (labels ignored).
    device : str or torch.device, optional
        Default: the data's device.
    backend : None
        Multi-rank runs are not supported yet (chains are independent: split them).
    monitor_every : int
        Iterations between monitor reports.
    """

    def __init__(self, prior=None, likelihood=None, *, n_chains: int = 1, n_samples: int = 1000,
                 n_warmup: Optional[int] = None, thin: int = 1, move_probs: Sequence[float] = (0.25, 0.25, 0.25, 0.25),
                 init: str = "root", keep: str = "samples", alpha_split: float = 0.95, beta_split: float = 0.5,
                 poisson_lambda: float = 5.0, use_likelihood: bool = True, device=None, backend=None,
                 monitor_every: int = 100) -> None:
        if int(n_chains) < 1:
            raise ValueError(f"n_chains must be >= 1, got {n_chains}")
        if int(n_samples) < 1:
            raise ValueError(f"n_samples must be >= 1, got {n_samples}")
        if int(thin) < 1:
            raise ValueError(f"thin must be >= 1, got {thin}")
        if n_warmup is not None and int(n_warmup) < 0:
            raise ValueError(f"n_warmup must be >= 0, got {n_warmup}")
        if init not in ("root", "prior"):
            raise ValueError(f"init must be 'root' or 'prior', got {init!r}")
        if keep not in ("samples", "all"):
            raise ValueError(f"keep must be 'samples' or 'all', got {keep!r}")
        if backend is not None:
            raise NotImplementedError("multi-rank MCMC is not implemented yet; run independent chains per rank")
        self.prior = make_prior(prior, alpha_split, beta_split, poisson_lambda)
        self.likelihood = likelihood
        self.n_chains, self.n_samples, self.thin = int(n_chains), int(n_samples), int(thin)
        self.n_warmup = int(n_samples) * int(thin) if n_warmup is None else int(n_warmup)
        self.move_probs = check_move_probs(move_probs)
        self.init, self.keep = init, keep
        self.use_likelihood = bool(use_likelihood)
        self.device, self.backend = device, backend
        self.monitor_every = max(1, int(monitor_every))

    @property
    def n_iterations(self) -> int:
        """Iterations per chain: ``n_warmup + n_samples * thin``."""
        return self.n_warmup + self.n_samples * self.thin

    def run(self, data, *, seed=None, monitor=None) -> TreePosterior:
        """Run the chains on ``data``.

        Parameters
        ----------
        data : Data
        seed : int or torch.Generator, optional
        monitor : Monitor or list of Monitors, optional
            Receives ``mcmc/accept/<move>`` (running acceptance rate per move type),
            ``mcmc/accept``, ``mcmc/log_posterior_mean``, ``trees/leaves_mean``,
            ``trees/depth_mean``, ``time/seconds`` every ``monitor_every`` iterations.

        Returns
        -------
        TreePosterior
            Equal weights over kept draws x chains (identical trees merged);
            ``log_evidence`` is None. ``info`` holds acceptance rates, R-hat and ESS
            of the number of leaves and of the log posterior, iterations per second.
        """
        t0 = time.perf_counter()
        if self.device is not None and data.device != torch.device(self.device):
            data = data.to(self.device)
        lik = self.likelihood if self.likelihood is not None else default_likelihood(data)
        model = TreeModel(self.prior, lik, data, self.use_likelihood)
        seed_i = seed_to_int(seed)
        mon = as_monitor(monitor)
        watch = not isinstance(mon, NullMonitor)
        P, dev = self.n_chains, data.device
        if self.init == "prior":
            state, _ = sample_prior_state(model, P, derive_seed(seed_i, 1))
        else:
            state = TreeState.roots(model, P)
        gidx = torch.arange(P, device=dev)
        total, mp = self.n_iterations, self.move_probs
        mon.on_start({"sampler": "MCMC", "n_chains": P, "n_iterations": total, "n_warmup": self.n_warmup,
                      "thin": self.thin, "n": data.n, "d": data.d, "prior": repr(self.prior)})
        proposed = torch.zeros(4, dtype=torch.long, device=dev)
        accepted = torch.zeros(4, dtype=torch.long, device=dev)
        kept, trace_leaves, trace_lp = [], [], []
        useed = derive_seed(seed_i, 2)
        slots = torch.arange(N_SLOTS, device=dev)
        U = None
        for it in range(total):
            b = it % _BLOCK
            if b == 0:
                its = torch.arange(it, min(it + _BLOCK, total), device=dev)
                U = keyed_uniform(useed, 0, gidx[None, :, None], its[:, None, None] * N_SLOTS + slots)
            u = U[b]
            kind = draw_moves(u[:, 0], mp)
            prop = propose(state, model, kind, u, mp)
            acc = torch.log(u[:, 4]) < prop.log_accept_ratio
            state.accept_(prop, acc)
            proposed.index_add_(0, kind, torch.ones_like(kind))
            accepted.index_add_(0, kind, acc.long())
            post_warm = it >= self.n_warmup
            if self.keep == "all" or (post_warm and (it - self.n_warmup) % self.thin == self.thin - 1):
                kept.append(_snapshot(state.trees))
            if post_warm and (it - self.n_warmup) % self.thin == self.thin - 1:
                trace_leaves.append(state.trees.n_leaves())
                trace_lp.append(state.log_posterior(model))
            if watch and ((it + 1) % self.monitor_every == 0 or it + 1 == total):
                mon.on_step(it, _report(state, model, proposed, accepted, t0))
        elapsed = time.perf_counter() - t0
        trees = HardTrees.cat(kept)
        info = {"sampler": "MCMC", "n_chains": P, "n_samples": self.n_samples, "n_warmup": self.n_warmup,
                "thin": self.thin, "keep": self.keep, "n_iterations": total, "prior": repr(self.prior),
                "move_probs": list(mp), "seconds": elapsed,
                "iterations_per_second": total / max(elapsed, 1e-12)}
        info.update(_accept_info(proposed, accepted))
        leaves = torch.stack(trace_leaves, 1).double().cpu().numpy()  # [chains, draws]
        lp = torch.stack(trace_lp, 1).cpu().numpy()
        info.update(rhat_leaves=rhat(leaves), ess_leaves=chain_ess(leaves),
                    rhat_log_posterior=rhat(lp), ess_log_posterior=chain_ess(lp))
        post = TreePosterior(trees, torch.zeros(trees.n_trees, dtype=torch.float64, device=dev), lik, data.d,
                             classes=data.classes_, log_evidence=None, info=info)
        mon.on_end({"seconds": elapsed, "posterior": post, **{k: v for k, v in info.items() if k.startswith(("accept", "rhat", "ess"))}})
        return post


def _snapshot(trees: HardTrees) -> HardTrees:
    """Copy of the trees without the samplers' per-node caches."""
    return HardTrees(trees.feature.clone(), trees.threshold.clone(), trees.left.clone(), trees.right.clone(),
                     trees.parent.clone(), trees.depth.clone(), trees.status.clone(), trees.stats.clone(),
                     trees.n_nodes.clone())


def _accept_info(proposed: torch.Tensor, accepted: torch.Tensor) -> dict:
    pr, ac = proposed.cpu().tolist(), accepted.cpu().tolist()
    out = {f"accept/{m}": (a / p if p else float("nan")) for m, p, a in zip(MOVES, pr, ac)}
    out["accept/all"] = sum(ac) / max(sum(pr), 1)
    return out


def _report(state: TreeState, model: TreeModel, proposed, accepted, t0: float) -> dict:
    acc = _accept_info(proposed, accepted)
    out = {f"mcmc/{k}": v for k, v in acc.items()}
    out["mcmc/accept"] = out.pop("mcmc/accept/all")
    out["mcmc/log_posterior_mean"] = float(state.log_posterior(model).mean())
    out["trees/leaves_mean"] = float(state.trees.n_leaves().double().mean())
    out["trees/depth_mean"] = float(state.trees.max_depth().double().mean())
    out["time/seconds"] = time.perf_counter() - t0
    return out
