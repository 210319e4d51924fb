"""The settings of BART (``BARTConfig``) and its named random streams."""
from __future__ import annotations

import enum
from dataclasses import dataclass
from typing import Optional

from torchtree.core.threads import WORK_PER_THREAD
from torchtree.core.validate import check_float_dtype
from torchtree.kernels import native
from torchtree.samplers.presets import Preset
from torchtree.samplers.protocol import SamplerConfig, option


__all__ = ["BARTConfig", "Stream", "gpu_chains", "many_chains_samples", "many_chains_thin"]


class Stream(enum.IntEnum):
    """BART's random streams: per sweep ``it``, ``keyed_uniform(seed, it * _STREAMS + stream, ...)``; before the
    first sweep, ``derive_seed(seed, INITIAL_LATENTS)``. The values are fixed: a seed gives the same draws
    in every release."""

    MOVES = 0  #: each tree's move type, node, rule and acceptance uniforms
    LEAVES = 1  #: the leaves' normal draws
    SIGMA = 2  #: the noise variance's gamma draw (regression)
    LATENTS = 3  #: the probit latents (classification)
    PARTICLE_GIBBS = 4  #: ``bart_sampler="pg"``: the conditional SMC's uniforms
    GROW_FROM_ROOT = 5  #: the grow-from-root sweeps' node decisions (and ``LEAVES`` their leaves)
    INITIAL_LATENTS = 7  #: the probit latents of the starting state



GFR_SWEEPS = 5  # grow-from-root sweeps of the default start (stochtree's default count)
GFR_WARMUP = 50  # burn-in sweeps after grow-from-root starts (n_gfr of them included)
ROOT_WARMUP = 250  # burn-in sweeps from single-leaf trees
CONVERGE_CAP = 10  # max_samples' default, in n_samples
DEFAULT_CHAINS = 4  # n_chains' literal default
DEFAULT_SAMPLES = 100  # n_samples' literal default: the posterior keeps DEFAULT_CHAINS x DEFAULT_SAMPLES draws
GPU_CHAINS_MAX = 64  # the most chains the CUDA preset runs
LAUNCH_BOUND_ELEMENTS = 1 << 22  # elements a GPU streams in about one kernel launch's time (4M x 4 bytes at ~3 TB/s)


def gpu_chains(n_rows: int, n_utilities: int = 1) -> int:
    """``n_chains``' default on CUDA: the largest power of two ``C <= GPU_CHAINS_MAX`` with
    ``C x n_utilities x n_rows <= LAUNCH_BOUND_ELEMENTS``, and at least ``DEFAULT_CHAINS``.

    A sweep on a GPU is a fixed sequence of kernel launches over every chain at once (the torch route's
    batched operations, or the CUDA kernel's block per chain): while one operation's elements take no
    longer to stream than its launch, more chains ride in the same launches at little cost. Past that
    bound a sweep's time grows with its chains, and so does the per-point state (each tree's leaf index
    of every point, ``2 n`` bytes per tree and chain): 64 chains up to 65,536 rows, 32 at 10^5, 4 from
    about 10^6 (divided by the class utilities of a multinomial probit)."""
    C = GPU_CHAINS_MAX
    while C > DEFAULT_CHAINS and C * max(1, n_utilities) * max(1, n_rows) > LAUNCH_BOUND_ELEMENTS:
        C //= 2
    return C


def many_chains_samples(n_chains: int) -> int:
    """``n_samples``' default past ``DEFAULT_CHAINS`` chains: ``ceil(400 / n_chains)``, so the posterior keeps
    about the default's ``DEFAULT_CHAINS x DEFAULT_SAMPLES`` draws (its memory and its prediction cost)."""
    return -(-DEFAULT_CHAINS * DEFAULT_SAMPLES // n_chains)


def many_chains_thin(n_samples: int) -> int:
    """``thin``'s default past ``DEFAULT_CHAINS`` chains: ``100 // n_samples``, so each chain still runs about
    the default's ``DEFAULT_SAMPLES`` sweeps past its warm-up (at least 1)."""
    return max(1, DEFAULT_SAMPLES // n_samples)


def _utilities(shape) -> int:
    return shape.n_classes - 1 if shape.classification and shape.n_classes > 2 else 1


def _many_chains(view, shape) -> bool:
    return view["n_chains"] > DEFAULT_CHAINS


def gfr_cost(n: int, d: int, n_cuts: int) -> float:
    """What one grow-from-root sweep costs in backfitting MCMC sweeps, on ``n`` rows, ``d`` split columns
    and ``n_cuts`` cut points in all: ``(1.4 n d + 10 n_cuts) / (n + 2 d + 700)``. A grow-from-root node
    scores every cut of every column (``O(n d + n_cuts)``), an MCMC update one rule (``O(n + d)``); the
    constants are a least-squares fit (within 15%) to the compiled kernels' timings on eight tables of
    10-347 columns and 200-3,341 rows (Friedman #1, abalone, titanic, breast cancer, automobile,
    soybean, adult, mushroom)."""
    return (1.4 * n * d + 10.0 * n_cuts) / (n + 2.0 * d + 700.0)


def default_gfr_sweeps(n: int, d: int, n_cuts: int) -> int:
    """``n_gfr``'s default: ``GFR_SWEEPS`` when they cost no more than the burn-in sweeps they save
    (``ROOT_WARMUP - GFR_WARMUP``, by :func:`gfr_cost`), else 0 (wide coded tables: chains from single
    leaves)."""
    return GFR_SWEEPS if GFR_SWEEPS * gfr_cost(n, d, n_cuts) <= ROOT_WARMUP - GFR_WARMUP else 0


def _check_dtype(name: str, v):
    return check_float_dtype(name, v, as_name=True)


@dataclass(frozen=True)
class BARTConfig(SamplerConfig):
    """Settings of :class:`BART` (see the module notes)."""

    n_trees: int = option(200, help="trees in the sum (m)", low=1)
    n_chains: int = option(DEFAULT_CHAINS, help="chains run together as one batch", low=1, presets=(
        Preset("gpu-batch", "on CUDA, more chains ride in the same kernel launches while each launch streams at most "
               f"{LAUNCH_BOUND_ELEMENTS} elements (gpu_chains): up to {GPU_CHAINS_MAX} chains, for more effective draws "
               "and predictions averaged over more of the posterior's modes"
               "; under torchrun or MPI that many on each rank's GPU",
               lambda v, s: s.device == "cuda", lambda v, s: gpu_chains(s.n_rows, _utilities(s)) * s.world_size),))
    n_samples: int = option(DEFAULT_SAMPLES, help="kept sweeps per chain (after warm-up and thinning)", low=1, presets=(
        Preset("many-chains", f"past {DEFAULT_CHAINS} chains, {DEFAULT_CHAINS * DEFAULT_SAMPLES} kept draws in all "
               "(many_chains_samples): the default posterior's memory and prediction cost", _many_chains,
               lambda v, s: many_chains_samples(v["n_chains"])),))
    n_warmup: Optional[int] = option(None, help="burn-in sweeps per chain, the n_gfr grow-from-root sweeps included "
                                     f"(default: {GFR_WARMUP} when grow-from-root runs, {ROOT_WARMUP} when the "
                                     "chains start from single leaves)", low=0)
    thin: int = option(1, help="keep every thin-th sweep after warm-up", low=1, presets=(
        Preset("many-chains", f"past {DEFAULT_CHAINS} chains keeping the preset's fewer than {DEFAULT_SAMPLES} draws "
               f"each, every chain still runs about {DEFAULT_SAMPLES} sweeps past its warm-up (many_chains_thin; not "
               "where n_samples is given)",
               lambda v, s: _many_chains(v, s) and not v.given("n_samples") and v["n_samples"] < DEFAULT_SAMPLES,
               lambda v, s: many_chains_thin(v["n_samples"])),))
    min_ess: Optional[float] = option(None, help="run until converged: past n_samples, keep n_samples more sweeps per "
                                      "chain at a time until every diagnostic the run reports (sigma's, the mean "
                                      "leaves per tree's and the fitted function's at 100 training rows) has an ESS "
                                      "of at least min_ess and a split-R-hat of at most max_rhat, or max_samples are "
                                      "kept (None: exactly n_samples)",
                                      low=0.0, low_open=True)
    max_rhat: float = option(1.05, help="with min_ess: the split-R-hat the run goes on until", low=1.0, low_open=True)
    max_samples: Optional[int] = option(None, help="with min_ess: the most kept sweeps per chain (default "
                                        f"{CONVERGE_CAP} n_samples); a run stopped there warns", low=1)
    n_gfr: Optional[int] = option(None, help="grow-from-root sweeps (XBART's warm start: each tree regrown from the "
                                  "root with rules drawn in proportion to prior x marginal likelihood) that open the "
                                  "warm-up, counted in n_warmup (at most n_warmup of them); they run with the compiled "
                                  "kernels and backfitting MCMC, on the CPU or on CUDA (compile 'auto' or 'native') "
                                  "(elsewhere the chains start from single leaves). Default: "
                                  f"{GFR_SWEEPS} when they cost less than the burn-in they save (default_gfr_sweeps), "
                                  "else 0", low=0)
    bart_sampler: str = option("mcmc", help="how a tree is redrawn: grow/prune/change Metropolis-Hastings (mcmc) "
                               "or a conditional top-down SMC (pg, Particle Gibbs)", choices=("mcmc", "pg"))
    n_pg_particles: int = option(10, help="Particle Gibbs: particles per tree and chain, the kept tree included",
                                 low=2)
    alpha_split: Optional[float] = option(None, help="split prior alpha (1+depth)^-beta: alpha (default 0.95)",
                                          low=0.0, high=1.0, low_open=True, high_open=True)
    beta_split: Optional[float] = option(None, help="split prior: beta (default 2, BART's)", low=0.0)
    k: float = option(2.0, help="leaf prior: tau = half range / (k sqrt(n_trees)) (3 / (k sqrt(m)) for probit)",
                      low=0.0, low_open=True)
    nu: float = option(3.0, help="noise prior: sigma^2 ~ nu lambda / chi2_nu (regression)", low=0.0, low_open=True)
    q: float = option(0.9, help="noise prior: P(sigma < sigma_hat) (calibrates lambda)", low=0.0, high=1.0,
                      low_open=True, high_open=True)
    sigma_hat: Optional[float] = option(None, help="rough noise sd for the noise prior (default: residual sd of a "
                                        "linear fit; the sd of y, with a warning, where that fit is exact)",
                                        low=0.0, low_open=True)
    max_depth: int = option(8, help="deepest leaf (split probability 0 there)", low=1, high=14)
    max_cuts: int = option(100, help="cut points per feature (quantiles when a feature has more values)", low=1,
                           high=32000)
    use_likelihood: bool = option(True, help="False samples the prior (targets ignored)")
    dtype: str = option("float32", help="float type of residuals and leaf values", check=_check_dtype)
    compile: str = option("auto", help="how the tree update runs: 'native' (backfitting MCMC: on CPU one compiled "
                          "C++ kernel per sweep, on CUDA one kernel launch per sweep with a block of threads per "
                          "chain; torchtree.kernels.native, built on first use), 'on' (torch.compile "
                          "of the torch code, compiled once per process), 'off' (the torch "
                          "code as it is), 'graph' (backfitting MCMC on CUDA: 'on', and each sweep's tree updates "
                          "recorded once per run as a CUDA graph and replayed, one launch per sweep); "
                          "'auto': 'native' for MCMC when the kernels build (CPU, or CUDA's kernels on CUDA), "
                          "else 'on' on CPU when the run makes at least 40,000 tree updates (and for Particle "
                          "Gibbs levels), else 'off'",
                          choices=("auto", "native", "on", "off", "graph"), result=False)
    device: Optional[str] = option(None, help="torch device (None: the data's; 'auto': CUDA if present)",
                                   result=False)
    monitor_every: int = option(10, help="sweeps between monitor reports", low=1, result=False)
    checkpoint: Optional[str] = option(None, help="checkpoint file (resume when it exists)", result=False)
    checkpoint_every: int = option(10, help="save after every k-th sweep", low=1, result=False)
    max_seconds: Optional[float] = option(None, help="time budget in seconds (stops between sweeps; the draws kept "
                                          "so far make the posterior)", low=0.0, low_open=True, result=False)

    def thread_work(self, n_rows: int, world_size: int = 1, device=None) -> int:
        """Units of work of a run on one rank for the ``n_threads="auto"`` policy
        (:mod:`torchtree.core.threads`, which gives a thread per :data:`WORK_PER_THREAD` units).

        Where the compiled sweep runs (backfitting MCMC, ``compile`` ``"auto"`` or ``"native"``, CPU, the
        kernels built), a sweep is one parallel region whose tasks are the chains: one task per chain holds
        ``n_rows x n_trees`` point updates and every tree's proposal, far above a region's start-up cost,
        so each chain on the rank counts as a thread's work (the idle cores still cap it). Elsewhere a
        sweep is many small torch ops, and the work is rows x chains as for the other samplers.
        """
        chains = max(1, self.n_chains // max(1, int(world_size)))
        on_cpu = device is None or str(device).startswith("cpu")
        if on_cpu and self.bart_sampler == "mcmc" and self.compile in ("auto", "native") and native.available():
            return chains * WORK_PER_THREAD
        return int(n_rows) * chains

    def kept_cap(self) -> int:
        """The most kept sweeps per chain: ``n_samples``, or with ``min_ess`` ``max_samples`` (default
        ``CONVERGE_CAP * n_samples``) but never fewer than ``n_samples``."""
        if self.min_ess is None:
            return self.n_samples
        return max(self.n_samples, self.max_samples if self.max_samples is not None else CONVERGE_CAP * self.n_samples)

    def check(self) -> None:
        if (1 << (self.max_depth + 1)) - 1 > 32767:  # pragma: no cover - max_depth <= 14 by its bounds
            raise ValueError("max_depth too large")
        if 2 * self.n_chains * (1 << (self.max_depth + 1)) >= 1 << 31:  # the tree update's int32 cell indices
            raise ValueError(f"n_chains={self.n_chains} with max_depth={self.max_depth} is too large for one rank: "
                             "2 n_chains 2^(max_depth+1) must stay below 2^31; lower n_chains or max_depth")
