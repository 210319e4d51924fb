"""Metropolis-Hastings over decision trees (Chipman, George & McCulloch, 1998).

Any number of chains run as one batch: every iteration proposes one
grow / prune / change / swap move per chain (:mod:`torchtree.steps.moves`) and accepts it
with probability ``min(1, pi(t') q(t | t') / (pi(t) q(t' | t)))``. A single chain
is latency-bound: an iteration is a fixed number of small tensor operations,
random numbers are drawn in blocks of iterations, and nothing is synchronised
with the host except the subtree height that bounds the routing loop.

Diagnostics: acceptance rate per move type, and split-R-hat and effective sample
size (:func:`torchtree.model.diagnostics.rhat`, :func:`torchtree.model.diagnostics.chain_ess`,
re-exported here) of the number of leaves and of the log posterior over the kept
draws of all chains; the traces themselves are in ``info["trace"]``
(``[chains, draws]``), which :func:`torchtree.model.diagnostics.to_arviz` exports.
"""
from __future__ import annotations

import math
import time
from typing import Optional, Sequence

import numpy as np
import torch

from torchtree.model.diagnostics import chain_ess, rhat  # noqa: F401  (re-exported: the MCMC diagnostics)
from torchtree.model.likelihoods import DirichletMultinomial
from torchtree.core.memory import check_tree_memory
from torchtree.monitor import NullMonitor, as_monitor, notify_checkpoint
from torchtree.steps.moves import (_MAX_DEPTH, CHANGE, GROW, MOVES, N_SLOTS, PRUNE, SWAP, TreeModel, TreeState, check_cut_proposal,
                    draw_moves, propose, sample_prior_state)
from torchtree.model.posterior import TreePosterior
from torchtree.model.priors import make_prior
from torchtree.core.random import derive_seed, keyed_uniform, seed_to_int
from torchtree.io.checkpoint import Checkpointer, fingerprint
from torchtree.model.data import coerce_data, resolve_device
from torchtree.samplers.driver import default_likelihood, describe as _config, seed_key
from torchtree.model.trees import INTERNAL, LEAF, HardTrees
from torchtree.core.validate import check_choice, check_int, check_probabilities

__all__ = ["MCMC", "rhat", "chain_ess", "make_prior", "check_move_probs"]

_BLOCK = 512  # iterations whose uniforms are drawn in one call


def check_move_probs(move_probs: Sequence[float]) -> tuple:
    """Validate mixture probabilities (grow, prune, change, swap); returns them normalised."""
    mp = check_probabilities("move_probs (grow, prune, change, swap)", move_probs, 4)
    if (mp[0] > 0) != (mp[1] > 0):
        raise ValueError("grow and prune must both have positive probability (each is the other's reverse move)")
    return mp


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
    engine : {"auto", "batched", "host"}
        ``"batched"`` runs all chains as one batch of tensor operations on the data's
        device; ``"host"`` runs one chain with numpy on the CPU (a single chain is
        latency-bound; same moves, same random numbers, same chain); ``"auto"`` picks
        ``"host"`` for one chain.
    checkpoint : str, optional
        Path of a checkpoint file (see :mod:`torchtree.io.checkpoint`). When it exists,
        :meth:`run` resumes from it and returns exactly what an uninterrupted run with
        the same seed returns on the same kind of device (the uniforms are keyed by seed, chain and iteration, so
        the chains' trees, the acceptance counters, the kept draws and the traces so
        far are the whole state); it is (re)written every ``checkpoint_every``
        iterations and after the last one, so re-running a finished run returns its
        posterior at once. A checkpoint of another run (other data, settings, seed or
        engine) raises :class:`~torchtree.io.checkpoint.CheckpointError`. With
        ``seed=None`` the seed drawn by the first run is stored and reused. Every save
        holds all the draws kept so far: with many draws, use a ``checkpoint_every``
        of hundreds of iterations or more. None (default): no checkpoints, no cost.
    checkpoint_every : int
        Save after every ``checkpoint_every``-th iteration (iterations ``k-1, 2k-1, ...``).
    cut_proposal : {"prior", "data", "informed"}
        How grow / change moves draw a cut (:func:`torchtree.steps.moves.propose`): uniform on
        the node's data range as the prior draws it, a gap between consecutive
        distinct values uniform among the node's gaps, then uniform in it, or a cell of
        the range chosen by the likelihood of the split it makes (``"informed"``). Same
        target; the MH ratio carries the proposal density ratio. Anything but
        ``"prior"`` runs the batched engine (also for one chain: the host engine
        implements ``"prior"`` only), about 20x slower per iteration for one chain.
    """


    def __init__(self, prior=None, likelihood=None, *, n_chains: int = 1, n_samples: int = 1000,
                 n_warmup: Optional[int] = None, thin: int = 1, move_probs: Sequence[float] = (0.25, 0.25, 0.25, 0.25),
                 init: str = "root", keep: str = "samples", alpha_split: float = 0.95, beta_split: float = 0.5,
                 poisson_lambda: float = 5.0, use_likelihood: bool = True, device=None, backend=None,
                 monitor_every: int = 100, engine: str = "auto", checkpoint: Optional[str] = None,
                 checkpoint_every: int = 1, cut_proposal: str = "prior") -> None:
        n_chains = check_int("n_chains", n_chains, 1)
        n_samples = check_int("n_samples", n_samples, 1)
        thin = check_int("thin", thin, 1)
        n_warmup = n_samples * thin if n_warmup is None else check_int("n_warmup", n_warmup, 0)
        check_choice("init", init, ("root", "prior"))
        check_choice("keep", keep, ("samples", "all"))
        check_choice("engine", engine, ("auto", "batched", "host"))
        if engine == "host" and n_chains != 1:
            raise ValueError(f"engine='host' runs a single chain; got n_chains={n_chains} (use engine='batched' "
                             f"or 'auto' for several)")
        checkpoint_every = check_int("checkpoint_every", checkpoint_every, 1)
        if backend is not None:
            raise NotImplementedError("multi-rank MCMC is not implemented yet; run independent chains per rank")
        self.prior = make_prior(prior, alpha_split, beta_split, poisson_lambda)
        self.likelihood = likelihood
        self.n_chains, self.n_samples, self.thin, self.n_warmup = n_chains, n_samples, thin, n_warmup
        self.move_probs = check_move_probs(move_probs)
        self.init, self.keep = init, keep
        self.use_likelihood = bool(use_likelihood)
        self.device, self.backend = device, backend
        self.monitor_every = max(1, int(monitor_every))
        self.engine = engine
        self.checkpoint, self.checkpoint_every = checkpoint, checkpoint_every
        self.cut_proposal = check_cut_proposal(cut_proposal)
        if self.cut_proposal != "prior":
            if engine == "host":
                raise ValueError("engine='host' implements cut_proposal='prior' only; use engine='batched'")
            self.engine = "batched"  # the host engine implements the prior proposal only

    def _checkpointer(self, data, lik, seed, host: bool) -> Checkpointer:
        """Checkpoints of this run; the fingerprint covers what decides the result (not the
        device, monitor or checkpoint options)."""
        fp = None
        if self.checkpoint is not None:
            settings = {"prior": _config(self.prior), "likelihood": _config(lik), "n_chains": self.n_chains,
                        "n_samples": self.n_samples, "n_warmup": self.n_warmup, "thin": self.thin,
                        "move_probs": list(self.move_probs), "init": self.init, "keep": self.keep,
                        "use_likelihood": self.use_likelihood, "engine": "host" if host else "batched",
                        "task": data.task}
            if self.cut_proposal != "prior":
                settings["cut_proposal"] = self.cut_proposal
            fp = fingerprint("MCMC", settings, seed_key(seed), data.X, data.y, 1)
        return Checkpointer(self.checkpoint, self.checkpoint_every, fingerprint=fp)

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
        data = coerce_data(data)
        dev = resolve_device(self.device) if self.device is not None else data.device
        if data.device != dev:
            data = data.to(dev)
        lik = self.likelihood if self.likelihood is not None else default_likelihood(data)
        model = TreeModel(self.prior, lik, data, self.use_likelihood)
        P, dev = self.n_chains, data.device
        host = self.engine == "host" or (self.engine == "auto" and P == 1)
        check_tree_memory("MCMC", P, data, "n_chains (or n_samples)", kept_per_tree=0 if host else self.n_samples,
                          per_tree=0 if host else min(_BLOCK, self.n_iterations) * N_SLOTS * 8)  # a block of uniforms
        ck = self._checkpointer(data, lik, seed, host)
        saved = ck.load() if ck.enabled else None
        seed_i = int(saved["seed"]) if saved is not None else seed_to_int(seed)
        mon = as_monitor(monitor)
        watch = not isinstance(mon, NullMonitor)
        if saved is not None:
            state = None  # the engine restores it
        elif self.init == "prior":
            state, _ = sample_prior_state(model, P, derive_seed(seed_i, 1))
        else:
            state = TreeState.roots(model, P)
        total, mp = self.n_iterations, self.move_probs
        start_info = {"sampler": "MCMC", "n_chains": P, "n_iterations": total, "total": total, "n_warmup": self.n_warmup,
                      "thin": self.thin, "n": data.n, "d": data.d, "prior": repr(self.prior),
                      "engine": "host" if host else "batched"}
        if saved is not None:
            start_info["resumed_at_iteration"] = int(saved["it"]) + 1
        mon.on_start(start_info)
        useed = derive_seed(seed_i, 2)
        ckpt = (ck, saved, seed_i) if ck.enabled else None
        if host:
            trees, logw, n_kept, proposed, accepted, leaves, lp = self._run_host(state, model, useed, mon, watch, t0, ckpt)
        else:
            trees, logw, n_kept, proposed, accepted, leaves, lp = self._run_batched(state, model, useed, mon, watch, t0, ckpt)
        elapsed = time.perf_counter() - t0
        info = {"sampler": "MCMC", "engine": "host" if host else "batched", "n_chains": P,
                "n_samples": self.n_samples, "n_warmup": self.n_warmup, "thin": self.thin, "keep": self.keep,
                "n_iterations": total, "prior": repr(self.prior), "move_probs": list(mp), "seconds": elapsed,
                "iterations_per_second": total / max(elapsed, 1e-12)}
        info.update(_accept_info(proposed, accepted))
        info.update(rhat_leaves=rhat(leaves), ess_leaves=chain_ess(leaves),
                    rhat_log_posterior=rhat(lp), ess_log_posterior=chain_ess(lp),
                    trace={"n_leaves": leaves, "log_posterior": lp})
        post = TreePosterior(trees.to(dev), logw.to(dev), lik, data.d, classes=data.classes_, log_evidence=None, info=info)
        post.n_particles = n_kept
        mon.on_end({"seconds": elapsed, "posterior": post, **{k: v for k, v in info.items() if k.startswith(("accept", "rhat", "ess"))}})
        return post

    def _kept(self, it: int):
        """(keep for prediction, record in the diagnostics trace) at iteration ``it``."""
        sample = it >= self.n_warmup and (it - self.n_warmup) % self.thin == self.thin - 1
        return self.keep == "all" or sample, sample

    def _run_batched(self, state, model, useed, mon, watch, t0, ckpt=None):
        P, dev, mp = self.n_chains, model.X.device, self.move_probs
        gidx = torch.arange(P, device=dev)
        proposed = torch.zeros(4, dtype=torch.long, device=dev)
        accepted = torch.zeros(4, dtype=torch.long, device=dev)
        kept, trace_leaves, trace_lp = [], [], []
        slots = torch.arange(N_SLOTS, device=dev)
        U, total, start = None, self.n_iterations, 0
        ck, saved, seed_i = ckpt if ckpt is not None else (None, None, None)
        if saved is not None:
            state = TreeState(HardTrees.from_dict(saved["trees"]).to(dev))
            proposed, accepted = saved["proposed"].to(dev), saved["accepted"].to(dev)
            if saved["kept"] is not None:
                kept = [HardTrees.from_dict(saved["kept"]).to(dev)]
            trace_leaves = [] if saved["trace_leaves"] is None else list(saved["trace_leaves"].to(dev).unbind(0))
            trace_lp = [] if saved["trace_lp"] is None else list(saved["trace_lp"].to(dev).unbind(0))
            start = int(saved["it"]) + 1

        def snapshot(it):
            if len(kept) > 1:  # concatenating in pieces gives the same trees as at the end
                kept[:] = [HardTrees.cat(kept)]
            return {"it": it, "seed": seed_i, "trees": {k: v.clone() for k, v in state.trees.as_dict().items()},
                    "proposed": proposed.clone(), "accepted": accepted.clone(),
                    "kept": kept[0].as_dict() if kept else None,
                    "trace_leaves": torch.stack(trace_leaves) if trace_leaves else None,
                    "trace_lp": torch.stack(trace_lp) if trace_lp else None}

        for it in range(start, total):
            b = it % _BLOCK
            if b == 0 or it == start:
                b0 = it - b
                its = torch.arange(b0, min(b0 + _BLOCK, total), device=dev)
                U = keyed_uniform(useed, 0, gidx[None, :, None], its[:, None, None] * N_SLOTS + slots)
            u = U[b]
            kind = draw_moves(u[:, 0], mp)
            prop = propose(state, model, kind, u, mp, self.cut_proposal)
            acc = torch.log(u[:, 4]) < prop.log_accept_ratio
            state.accept_(prop, acc)
            proposed.index_add_(0, kind, torch.ones_like(kind))
            accepted.index_add_(0, kind, acc.long())
            keep, record = self._kept(it)
            if keep:
                kept.append(_snapshot(state.trees))
            if record:
                trace_leaves.append(state.trees.n_leaves())
                trace_lp.append(state.log_posterior(model))
            if watch and ((it + 1) % self.monitor_every == 0 or it + 1 == total):
                mon.on_step(it, _report(proposed, accepted, state.log_posterior(model), state.trees.n_leaves(),
                                        state.trees.max_depth(), t0))
            if ck is not None and ck.maybe_save(it, lambda: snapshot(it), last=it + 1 == total):
                notify_checkpoint(mon, it)
        trees = HardTrees.cat(kept)
        leaves = torch.stack(trace_leaves, 1).double().cpu().numpy()  # [chains, draws]
        lp = torch.stack(trace_lp, 1).cpu().numpy()
        return trees, torch.zeros(trees.n_trees, dtype=torch.float64), trees.n_trees, proposed, accepted, leaves, lp

    def _run_host(self, state, model, useed, mon, watch, t0, ckpt=None):
        chain = _HostChain(model, self.move_probs)
        proposed, accepted = np.zeros(4, np.int64), np.zeros(4, np.int64)
        snaps, counts, trace_leaves, trace_lp = [], [], [], []
        version, snap_version = 0, -1
        zero = torch.zeros(1, dtype=torch.long)
        slots = torch.arange(N_SLOTS)
        total, start = self.n_iterations, 0
        ck, saved, seed_i = ckpt if ckpt is not None else (None, None, None)
        if saved is None:
            t = state.trees.to("cpu")
            chain.load(t, t.leaf_index(model.X.cpu())[0].numpy())
        else:
            chain.load_state_dict(saved["chain"])
            proposed, accepted = saved["proposed"].numpy().copy(), saved["accepted"].numpy().copy()
            snaps, counts = _unpack_snaps(saved["snaps"]), list(saved["counts"])
            trace_leaves, trace_lp = list(saved["trace_leaves"]), list(saved["trace_lp"])
            version, snap_version = int(saved["version"]), int(saved["snap_version"])
            start = int(saved["it"]) + 1

        def snapshot(it):
            return {"it": it, "seed": seed_i, "chain": chain.state_dict(),
                    "proposed": torch.from_numpy(proposed.copy()), "accepted": torch.from_numpy(accepted.copy()),
                    "snaps": _pack_snaps(snaps), "counts": list(counts),
                    "trace_leaves": list(trace_leaves), "trace_lp": list(trace_lp),
                    "version": version, "snap_version": snap_version}

        for it in range(start, total):
            b = it % _BLOCK
            if b == 0 or it == start:
                b0 = it - b
                its = torch.arange(b0, min(b0 + _BLOCK, total))
                U = keyed_uniform(useed, 0, zero[None, :, None], its[:, None, None] * N_SLOTS + slots)[:, 0].numpy()
            kind, acc = chain.step(U[b])
            proposed[kind] += 1
            if acc:
                accepted[kind] += 1
                version += 1
            keep, record = self._kept(it)
            if keep:
                # Consecutive identical draws are stored once with a count.
                if version != snap_version:
                    snaps.append(chain.snapshot())
                    counts.append(0)
                    snap_version = version
                counts[-1] += 1
            if record:
                trace_leaves.append(int(chain.leaf[: chain.n].sum()))
                trace_lp.append(chain.log_posterior())
            if watch and ((it + 1) % self.monitor_every == 0 or it + 1 == total):
                n = chain.n
                mon.on_step(it, _report(torch.from_numpy(proposed), torch.from_numpy(accepted),
                                        torch.tensor([chain.log_posterior()]), torch.tensor([int(chain.leaf[:n].sum())]),
                                        torch.tensor([int(chain.depth[:n][chain.leaf[:n]].max())]), t0))
            if ck is not None and ck.maybe_save(it, lambda: snapshot(it), last=it + 1 == total):
                notify_checkpoint(mon, it)
        trees = _host_trees(snaps, chain.dt, model.likelihood.stats_dtype)
        logw = torch.log(torch.tensor(counts, dtype=torch.float64))
        return (trees, logw, int(sum(counts)), torch.from_numpy(proposed), torch.from_numpy(accepted),
                np.asarray(trace_leaves, np.float64)[None], np.asarray(trace_lp)[None])


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


def _report(proposed, accepted, log_post, leaves, depth, t0: float) -> dict:
    acc = _accept_info(proposed, accepted)
    out = {f"mcmc/{k}": v for k, v in acc.items()}
    out["mcmc/accept"] = out.pop("mcmc/accept/all")
    out["mcmc/log_posterior_mean"] = float(log_post.mean())
    out["trees/leaves_mean"] = float(leaves.double().mean())
    out["trees/depth_mean"] = float(depth.double().mean())
    out["time/seconds"] = time.perf_counter() - t0
    return out


# ----------------------------------------------------------------------------- host engine
class _HostChain:
    """One chain in numpy arrays on the host: the latency path of a single MCMC chain.

    A single chain is a sequence of tiny dependent steps, so its cost is per-operation
    overhead, not arithmetic. This engine runs the same moves as
    :func:`torchtree.steps.moves.propose` with numpy on the CPU, keeping the leaf of every
    training point (``assign [N]``) and re-routing only the points under the rewritten
    node. It consumes the same uniforms in the same way (node and dimension choices
    in index order, the same cut formula in the data dtype), so it reproduces the
    batched engine's chain; the tests check that.

    Parameters
    ----------
    model : TreeModel
    move_probs : 4 floats (normalised)
    """

    def __init__(self, model: TreeModel, move_probs) -> None:
        self.m = model
        d = model.data
        self.X = d.X.cpu().numpy()
        self.dt = self.X.dtype
        self.N, self.D = self.X.shape
        self.S = model.S
        self.pst = model.pstats[:, : model.S].cpu().numpy()
        self.row_id = model.row_id.cpu().numpy()
        self.cp = np.cumsum(np.asarray(move_probs, dtype=np.float64))
        self.cp = self.cp / self.cp[-1]
        self.lg_ratio = math.log(max(move_probs[1], 1e-300) / max(move_probs[0], 1e-300))
        depths = torch.arange(_MAX_DEPTH + 2)
        lps, lpn = model.split_prior.log_split_probs(depths)
        self.lps, self.lpn = lps.numpy(), lpn.numpy()
        if not model.chipman:
            self.lps, self.lpn = np.zeros_like(self.lps), np.zeros_like(self.lpn)
            self.glob = model.prior.log_prob_leaves(torch.arange(self.N + 2)).numpy()
        else:
            self.glob = np.zeros(self.N + 2)
        lik = model.likelihood
        self.dm = isinstance(lik, DirichletMultinomial) and model.use_likelihood
        if self.dm:
            K = self.S
            a = lik.alpha / K
            cnt = torch.arange(self.N + 1, dtype=torch.float64)
            self.lg_a, self.lg_b = torch.lgamma(cnt + a).numpy(), torch.lgamma(cnt + lik.alpha).numpy()
            self.lg_c = math.lgamma(lik.alpha) - K * math.lgamma(a)
        C = 64
        self.feat = np.full(C, -1, np.int64)
        self.thr = np.zeros(C, self.dt)
        self.left = np.full(C, -1, np.int64)
        self.right = np.full(C, -1, np.int64)
        self.parent = np.full(C, -1, np.int64)
        self.depth = np.zeros(C, np.int64)
        self.leaf = np.zeros(C, bool)
        self.heap = np.zeros(C, np.int64)
        self.term = np.zeros(C, np.float64)
        self.stats = np.zeros((C, self.S), np.float64)
        self.n = 1
        self.assign = np.zeros(self.N, np.int64)

    # ------------------------------------------------------------------ helpers
    def loglik(self, stats: np.ndarray) -> np.ndarray:
        if not self.m.use_likelihood:
            return np.zeros(stats.shape[0])
        if self.dm:
            c = stats.astype(np.int64)
            return self.lg_c + self.lg_a[c].sum(1) - self.lg_b[c.sum(1)]
        return self.m.likelihood.log_marginal(torch.from_numpy(stats)).numpy()

    def leaf_terms(self, depth, nonconst, stats) -> np.ndarray:
        return self.loglik(stats) + np.where(nonconst, self.lpn[depth], 0.0)

    def internal_term(self, depth, nvary, rng):
        return self.lps[depth] + (-np.log(np.maximum(nvary, 1)) - np.log(np.maximum(rng, 1e-300)))

    def _iterm(self, depth: int, nvary: int, rng: float) -> float:
        return float(self.lps[depth]) + (-math.log(max(nvary, 1)) - math.log(max(rng, 1e-300)))

    def _ensure(self, need: int) -> None:
        C = self.feat.shape[0]
        if need <= C:
            return
        pad = C
        for name, fill in (("feat", -1), ("thr", 0), ("left", -1), ("right", -1), ("parent", -1), ("depth", 0),
                           ("leaf", False), ("heap", 0), ("term", 0.0)):
            a = getattr(self, name)
            setattr(self, name, np.concatenate([a, np.full(pad, fill, a.dtype)]))
        self.stats = np.concatenate([self.stats, np.zeros((pad, self.S))])

    def load(self, trees: HardTrees, leaves: np.ndarray) -> None:
        """Start from tree 0 of ``trees`` (``leaves``: its leaf of every training point)."""
        n = int(trees.n_nodes[0])
        self._ensure(n)
        self.n = n
        self.feat[:n] = trees.feature[0, :n].numpy()
        self.thr[:n] = trees.threshold[0, :n].numpy()
        self.left[:n], self.right[:n] = trees.left[0, :n].numpy(), trees.right[0, :n].numpy()
        self.parent[:n], self.depth[:n] = trees.parent[0, :n].numpy(), trees.depth[0, :n].numpy()
        self.leaf[:n] = trees.is_leaf()[0, :n].numpy()
        self.heap[:n] = trees.extra["heap"][0, :n].numpy()
        self.term[:n] = trees.extra["term"][0, :n].numpy()
        self.stats[:n] = trees.stats[0, :n].double().numpy()
        self.assign[:] = leaves

    def log_posterior(self) -> float:
        return float(self.term[: self.n].sum() + self.glob[int(self.leaf[: self.n].sum())])

    _STATE = ("feat", "thr", "left", "right", "parent", "depth", "leaf", "heap", "term", "stats", "assign")

    def state_dict(self) -> dict:
        """The chain's arrays as tensors (copies) and its node count (for checkpoints)."""
        out = {name: torch.from_numpy(getattr(self, name).copy()) for name in self._STATE}
        out["n"] = int(self.n)
        return out

    def load_state_dict(self, state: dict) -> None:
        """Restore :meth:`state_dict` (the same model)."""
        for name in self._STATE:
            old = getattr(self, name)
            setattr(self, name, state[name].numpy().astype(old.dtype, copy=True))
        self.n = int(state["n"])

    def snapshot(self):
        n = self.n
        return (self.feat[:n].copy(), self.thr[:n].copy(), self.left[:n].copy(), self.right[:n].copy(),
                self.parent[:n].copy(), self.depth[:n].copy(), self.leaf[:n].copy(), self.stats[:n].copy())

    def _subtree(self, j: int) -> np.ndarray:
        n = self.n
        dj, hj = self.depth[j], self.heap[j]
        d = self.depth[:n]
        return (d >= dj) & ((self.heap[:n] >> np.maximum(d - dj, 0)) == hj)

    def _cut(self, lo, hi, u):
        rng = float(hi) - float(lo)
        thr = self.dt.type(float(lo) + u * rng)
        if not thr < hi:
            thr = np.nextafter(hi, self.dt.type(-np.inf))
        return max(thr, lo), rng

    # --------------------------------------------------------------------- step
    def step(self, u: np.ndarray):
        """One MH iteration with uniforms ``u [5]``; returns (move kind, accepted)."""
        kind = min(int(np.searchsorted(self.cp, u[0], side="right")), 3)
        n = self.n
        leaf = self.leaf[:n]
        internal = ~leaf
        if kind == GROW:
            cand = leaf
        elif kind == PRUNE:
            cand = internal & leaf[np.maximum(self.left[:n], 0)] & leaf[np.maximum(self.right[:n], 0)]
        elif kind == CHANGE:
            cand = internal
        else:
            cand = internal & (self.parent[:n] >= 0)
        idx = np.flatnonzero(cand)
        if idx.size == 0:
            return kind, False
        c = int(idx[min(int(u[1] * idx.size), idx.size - 1)])
        j = int(self.parent[c]) if kind == SWAP else c
        if kind == GROW:
            sub, pts = None, np.flatnonzero(self.assign == j)
        else:
            sub = self._subtree(j)
            pts = np.flatnonzero(sub[self.assign])
        xs = self.X[pts]
        lo, hi = xs.min(0), xs.max(0)
        vary = np.flatnonzero(hi > lo)
        nv = vary.size
        logu = math.log(u[4])
        if kind == GROW:
            return kind, self._grow(j, pts, xs, lo, hi, vary, u, logu)
        if kind == PRUNE:
            return kind, self._prune(j, pts, lo, hi, nv, cand, logu)
        if kind == CHANGE:
            f = int(vary[min(int(u[2] * nv), nv - 1)])
            thr, rng_new = self._cut(lo[f], hi[f], u[3])
            fo = int(self.feat[j])
            log_q = math.log(max(rng_new, 1e-300)) - math.log(max(float(hi[fo]) - float(lo[fo]), 1e-300))
            return kind, self._reroute(j, sub, pts, xs, {j: (f, thr)}, log_q, logu)
        fj, fc = int(self.feat[j]), int(self.feat[c])
        return kind, self._reroute(j, sub, pts, xs, {j: (fc, self.thr[c]), c: (fj, self.thr[j])}, 0.0, logu)

    def _grow(self, j, pts, xs, lo, hi, vary, u, logu) -> bool:
        nv = vary.size
        if nv == 0:
            return False
        f = int(vary[min(int(u[2] * nv), nv - 1)])
        thr, rng = self._cut(lo[f], hi[f], u[3])
        right = xs[:, f] > thr
        pl, pr = pts[~right], pts[right]
        st = np.stack([self.pst[pl].sum(0), self.pst[pr].sum(0)]).astype(np.float64)
        nc = np.array([self.row_id[pl].min() != self.row_id[pl].max(), self.row_id[pr].min() != self.row_id[pr].max()])
        d = int(self.depth[j])
        t_ch = self.leaf_terms(np.array([d + 1, d + 1]), nc, st)
        t_j = self._iterm(d, nv, rng)
        n = self.n
        n_leaves = int(self.leaf[:n].sum())
        leaf = self.leaf[:n]
        l_, r_ = self.left[:n], self.right[:n]
        n_prun = int((~leaf & leaf[np.maximum(l_, 0)] & leaf[np.maximum(r_, 0)]).sum())
        p = int(self.parent[j])
        if p >= 0:
            sib = int(self.right[p]) if int(self.left[p]) == j else int(self.left[p])
            n_prun_new = n_prun + 1 - int(bool(self.leaf[sib]))
        else:
            n_prun_new = n_prun + 1
        delta = t_j + t_ch.sum() - self.term[j] + self.glob[n_leaves + 1] - self.glob[n_leaves]
        log_q = self.lg_ratio + math.log(n_leaves) - math.log(n_prun_new) + math.log(nv) + math.log(max(rng, 1e-300))
        if not logu < delta + log_q:
            return False
        self._ensure(n + 2)
        self.feat[j], self.thr[j], self.left[j], self.right[j], self.leaf[j] = f, thr, n, n + 1, False
        self.term[j] = t_j
        h = int(self.heap[j])
        for k in (0, 1):
            c = n + k
            self.feat[c], self.thr[c], self.left[c], self.right[c] = -1, 0, -1, -1
            self.parent[c], self.depth[c], self.leaf[c], self.heap[c] = j, d + 1, True, 2 * h + k
            self.term[c], self.stats[c] = t_ch[k], st[k]
        self.assign[pl], self.assign[pr] = n, n + 1
        self.n = n + 2
        return True

    def _prune(self, j, pts, lo, hi, nv, prunable, logu) -> bool:
        n = self.n
        L, R = int(self.left[j]), int(self.right[j])
        f = int(self.feat[j])
        rng_old = float(hi[f]) - float(lo[f])
        rid = self.row_id[pts]
        d = int(self.depth[j])
        t_j = self.leaf_terms(np.array([d]), np.array([rid.min() != rid.max()]), self.stats[j:j + 1])[0]
        n_leaves = int(self.leaf[:n].sum())
        delta = t_j - self.term[j] - self.term[L] - self.term[R] + self.glob[n_leaves - 1] - self.glob[n_leaves]
        log_q = (-self.lg_ratio + math.log(int(prunable.sum())) - math.log(n_leaves - 1) - math.log(nv)
                 - math.log(max(rng_old, 1e-300)))
        if not logu < delta + log_q:
            return False
        self.feat[j], self.thr[j], self.left[j], self.right[j], self.leaf[j], self.term[j] = -1, 0, -1, -1, True, t_j
        self.assign[pts] = j
        keep = np.ones(n, bool)
        keep[[L, R]] = False
        newidx = np.cumsum(keep) - 1
        kept = np.flatnonzero(keep)
        for name in ("feat", "thr", "left", "right", "parent", "depth", "leaf", "heap", "term", "stats"):
            a = getattr(self, name)
            a[: n - 2] = a[kept]
        for a in (self.left, self.right, self.parent):
            v = a[: n - 2]
            a[: n - 2] = np.where(v >= 0, newidx[np.maximum(v, 0)], v)
        self.n = n - 2
        self.assign = newidx[self.assign]
        return True

    def _reroute(self, j, sub, pts, xs, rules, log_q, logu) -> bool:
        """Change / swap: new rules at the nodes of ``rules``; re-route the points under j."""
        n = self.n
        feat, thr = self.feat[:n].copy(), self.thr[:n].copy()
        for node, (f, t) in rules.items():
            feat[node], thr[node] = f, t
        node = np.full(pts.size, j, np.int64)
        nodes = np.flatnonzero(sub)
        for _ in range(int(self.depth[nodes].max()) - int(self.depth[j])):
            f = feat[node]
            act = f >= 0
            if not act.any():
                break
            go = xs[np.arange(pts.size), np.maximum(f, 0)] > thr[node]
            node = np.where(act, np.where(go, self.right[node], self.left[node]), node)
        order = np.argsort(node, kind="stable")
        ln = node[order]
        brk = np.empty(ln.size, bool)
        brk[0] = True
        np.not_equal(ln[1:], ln[:-1], out=brk[1:])
        starts = np.flatnonzero(brk)
        leaves_hit = ln[starts]
        sub_leaves = nodes[self.leaf[nodes]]
        if leaves_hit.size != sub_leaves.size:
            return False  # an empty leaf
        xo = xs[order]
        lo = np.empty((n, self.D), self.dt)
        hi = np.empty((n, self.D), self.dt)
        lo[leaves_hit], hi[leaves_hit] = np.minimum.reduceat(xo, starts), np.maximum.reduceat(xo, starts)
        stats = np.zeros((n, self.S))
        stats[leaves_hit] = np.add.reduceat(self.pst[pts[order]].astype(np.float64), starts)
        rid = self.row_id[pts[order]]
        nonconst = np.minimum.reduceat(rid, starts) != np.maximum.reduceat(rid, starts)
        t_new = np.zeros(n)
        t_new[leaves_hit] = self.leaf_terms(self.depth[leaves_hit], nonconst, stats[leaves_hit])
        internal = nodes[~self.leaf[nodes]]
        # Push leaf aggregates to every internal ancestor inside the subtree (all at once).
        dj = int(self.depth[j])
        src, dst = [], []
        ids, cur = leaves_hit, leaves_hit
        while cur.size:
            keep = self.depth[cur] > dj  # below j: the parent is inside the subtree
            ids, cur = ids[keep], self.parent[cur[keep]]
            src.append(ids)
            dst.append(cur)
        src, dst = np.concatenate(src), np.concatenate(dst)
        lo[internal], hi[internal] = np.inf, -np.inf
        np.minimum.at(lo, dst, lo[src])
        np.maximum.at(hi, dst, hi[src])
        stats[internal] = 0.0
        np.add.at(stats, dst, stats[src])
        fi = feat[internal]
        rng_i = hi[internal, fi].astype(np.float64) - lo[internal, fi].astype(np.float64)
        t_new[internal] = self.internal_term(self.depth[internal], (hi[internal] > lo[internal]).sum(1), rng_i)
        delta = float(t_new[nodes].sum() - self.term[nodes].sum())
        if not logu < delta + log_q:
            return False
        self.feat[:n], self.thr[:n] = feat, thr
        self.term[nodes], self.stats[nodes] = t_new[nodes], stats[nodes]
        self.assign[pts] = node
        return True


def _pack_snaps(snaps) -> dict:
    """Host snapshots (tuples of 8 arrays of the tree's length) as 8 flat tensors + lengths."""
    lengths = torch.tensor([s[0].shape[0] for s in snaps], dtype=torch.long)
    if not snaps:
        return {"lengths": lengths, "fields": []}
    return {"lengths": lengths, "fields": [torch.from_numpy(np.concatenate([s[i] for s in snaps])) for i in range(8)]}


def _unpack_snaps(packed: dict) -> list:
    """Inverse of :func:`_pack_snaps`."""
    lengths = packed["lengths"].tolist()
    if not lengths:
        return []
    cuts = np.cumsum(lengths)[:-1]
    cols = [np.split(f.numpy(), cuts) for f in packed["fields"]]
    return [tuple(c[q] for c in cols) for q in range(len(lengths))]


def _host_trees(snaps, dtype, stats_dtype) -> HardTrees:
    """Stack host snapshots (distinct consecutive trees) into HardTrees padded to the largest."""
    C = max(s[0].shape[0] for s in snaps)
    Q, S = len(snaps), snaps[0][7].shape[1]

    def pad(i, fill, dt):
        out = np.full((Q, C), fill, dt)
        for q, s in enumerate(snaps):
            out[q, : s[i].shape[0]] = s[i]
        return torch.from_numpy(out)

    stats = np.zeros((Q, C, S))
    status = np.zeros((Q, C), np.int8)
    for q, s in enumerate(snaps):
        stats[q, : s[7].shape[0]] = s[7]
        status[q, : s[6].shape[0]] = np.where(s[6], LEAF, INTERNAL)
    return HardTrees(pad(0, -1, np.int32), pad(1, 0, dtype), pad(2, -1, np.int32), pad(3, -1, np.int32),
                     pad(4, -1, np.int32), pad(5, 0, np.int32), torch.from_numpy(status),
                     torch.from_numpy(stats).to(stats_dtype), torch.tensor([s[0].shape[0] for s in snaps]))
