"""The settings of MCMC over trees (``MCMCConfig``, with their presets) and its named random streams."""
from __future__ import annotations

import enum
from dataclasses import dataclass
from typing import Optional, Tuple

from torchtree.samplers.presets import SMALL_TABLE_ROWS, WIDE_TABLE_FEATURES, Preset, small_table, wide_table
from torchtree.samplers.protocol import SamplerConfig, option
from torchtree.steps.moves import CUT_PROPOSALS, check_move_probs


__all__ = ["MCMCConfig", "Stream", "SMALL_TABLE_CHAINS", "SMALL_TABLE_SAMPLES", "ENGINES", "HOST_MS", "BATCHED_MS",
           "HOST_MAX_CHAINS", "host_is_cheaper"]


class Stream(enum.IntEnum):
    """MCMC's random streams: ``derive_seed(run seed, stream)`` seeds each (fixed values: same draws as ever)."""

    PRIOR_START = 1  #: ``init="prior"``: each chain's starting tree
    MOVES = 2  #: every iteration's move type, cut and acceptance uniforms, keyed by chain and iteration
    TOPDOWN_START = 3  #: ``init="topdown"``: the top-down run and the draws from it

#: chains x kept draws of the "small-table" presets (below ``SMALL_TABLE_ROWS`` rows)
SMALL_TABLE_CHAINS, SMALL_TABLE_SAMPLES = 16, 500
ENGINES = ("auto", "batched", "host")

#: milliseconds per iteration, one thread, fitted to timings of both engines on 200-8000 rows of
#: magic04 (4 and 16 chains): the host engine's chains one after another cost ``P (h0 + h1 N)`` (an
#: iteration re-routes the points under the rewritten node), the batched engine ``b0 + b1 P + (b2 + b3 P)
#: N`` (a fixed count of tensor operations, then bitset work per chain). Only their ratio is used.
HOST_MS = (0.034, 7.1e-5)
BATCHED_MS = (1.70, 0.043, 5.6e-5, 3.5e-6)
#: the most chains the cost model speaks for: a batch's cost per chain falls as it grows (0.004-0.012 ms
#: per added chain from 64 to 256 chains, against 0.03-0.05 from 4 to 16), so from 64 chains on one batch
#: is cheaper on every table measured, and larger batches stay batched
HOST_MAX_CHAINS = 16


def host_is_cheaper(n_chains: int, n_rows: int) -> bool:
    """Whether ``engine="auto"`` runs the chains on the host: its cost model (:data:`HOST_MS`,
    :data:`BATCHED_MS`, up to :data:`HOST_MAX_CHAINS` chains) finds ``n_chains`` host chains one after
    another cheaper than one batch. One chain always is; 16 chains are below about 1,900 rows, 4 below
    8,000; more than 16 never."""
    h0, h1 = HOST_MS
    b0, b1, b2, b3 = BATCHED_MS
    P, N = n_chains, n_rows
    return P == 1 or (P <= HOST_MAX_CHAINS and P * (h0 + h1 * N) < b0 + b1 * P + (b2 + b3 * P) * N)


@dataclass(frozen=True)
class MCMCConfig(SamplerConfig):
    """Settings of :class:`MCMC` (see its docstring)."""

    n_chains: int = option(1, help="independent chains (one batch, or one after another on the host engine)", low=1, presets=(
        Preset("small-table", f"below {SMALL_TABLE_ROWS} rows, {SMALL_TABLE_CHAINS} shorter chains explore more "
               "trees than one long chain",
               lambda v, s: small_table(s) and v["engine"] != "host", SMALL_TABLE_CHAINS),))
    n_samples: int = option(1000, help="kept draws per chain (after warm-up and thinning)", low=1, presets=(
        Preset("small-table", f"below {SMALL_TABLE_ROWS} rows, {SMALL_TABLE_SAMPLES} kept draws per chain of "
               f"{SMALL_TABLE_CHAINS} (warm-up as long)", lambda v, s: small_table(s),
               SMALL_TABLE_SAMPLES),))
    n_warmup: Optional[int] = option(None, help="burn-in iterations per chain (default: n_samples * thin, half the "
                                                "run, as in paper 002)", low=0)
    thin: int = option(1, help="keep every thin-th iteration after warm-up", low=1)
    move_probs: Tuple[float, float, float, float] = option(
        (0.25, 0.25, 0.25, 0.25), help="probabilities of grow, prune, change, swap (normalised)")
    init: str = option("root", help="start each chain at the root-only tree, at a draw from the Chipman prior, or "
                                    "at a draw of a top-down SMC run (1000 particles, more on wide tables; big data)",
                       choices=("root", "prior", "topdown"), presets=(
        Preset("topdown-start", f"chains from the root stay far below the posterior's trees on {SMALL_TABLE_ROWS}+ "
               f"rows, more than {WIDE_TABLE_FEATURES} features, or regression targets",
               lambda v, s: s.prior == "chipman" and (not small_table(s) or s.regression or wide_table(s)),
               "topdown"),))
    keep: str = option("samples", help="predict with the kept draws, or with every iteration including warm-up "
                                       "(paper 001's baseline)", choices=("samples", "all"))
    use_likelihood: bool = option(True, help="False samples the prior (labels ignored)")
    device: Optional[str] = option(None, help="torch device (None: the data's; 'auto': CUDA if present)",
                                   result=False)
    monitor_every: int = option(100, help="iterations between monitor reports", low=1, result=False)
    engine: str = option("auto", help="batched: all chains as one batch of tensor ops on the data's device; host: "
                                      "each chain in numpy on the CPU, one after another (same chains, lower "
                                      "latency); auto: host with prior cuts on a numeric table for one chain, and "
                                      "on the CPU for several when its cost model finds it cheaper",
                         choices=ENGINES)
    checkpoint: Optional[str] = option(None, help="checkpoint file (resume when it exists)", result=False)
    checkpoint_every: int = option(1, help="save after every k-th iteration", low=1, result=False)
    cut_proposal: str = option("prior", help="how grow / change moves draw a cut: uniform on the node's range "
                                             "(prior), uniform among the gaps between distinct values (data), or "
                                             "by the likelihood of the split (informed); not prior runs the "
                                             "batched engine", choices=CUT_PROPOSALS)
    max_bins: Optional[int] = option(None, help="rank each feature into at most max_bins quantile bins and cut only "
                                                "between bins: a change of the split prior (cuts uniform over the "
                                                "grid's range, not the data's), for large data; None: the data "
                                                "(the paper's model)", low=2)

    def check(self) -> None:
        object.__setattr__(self, "move_probs", check_move_probs(self.move_probs))
        if self.engine == "host" and self.cut_proposal != "prior":
            raise ValueError("engine='host' implements cut_proposal='prior' only; use engine='batched'")
