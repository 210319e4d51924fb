"""A toy method written against the sampler protocol (docs/writing_a_sampler.md).

``PriorStumps`` is importance sampling over decision stumps: each step draws
``batch_size`` stumps (a feature uniformly, a cut uniformly on its range) and weighs
each by the marginal likelihood of its two leaves. Finished, it is a weighted posterior
over stumps and a Monte Carlo estimate of the stump model's evidence. It is small on
purpose (and costs O(batch_size x N) memory per step): the point is what it does NOT
write, since the driver (``torchtree.samplers.driver.run``) gives it

* ``seed=None`` fresh randomness and an int that reproduces, on any number of ranks
  (draws are keyed by the stump's global index, ``torchtree.core.random``);
* checkpoints (``checkpoint=path``): saving and resuming the state, the fingerprint that
  refuses another run's file;
* monitors (TensorBoard, progress, traces), a time budget (``max_seconds``), the device;
* the estimator (``BayesianTreeClassifier(method="stumps")`` after ``register_method``)
  and the CLI's options with their help text, both read from ``StumpsConfig``;
* multi-rank runs: with a backend of two ranks each rank draws half of every batch.

Usage::

    python examples/writing_a_sampler.py            # fit iris-like data, print accuracy
    python examples/writing_a_sampler.py --smoke    # seconds, for the test-suite
"""
# smoke-expect: ^stumps: accuracy [0-9.]+, log evidence -?[0-9.]+, 2 ranks agree: True
from __future__ import annotations

import argparse
import math
from dataclasses import dataclass
from typing import Any, Dict, Optional, Tuple

import torch

from torchtree import TreePosterior, register_method
from torchtree.core.random import keyed_uniform
from torchtree.model.trees import INTERNAL, LEAF, HardTrees
from torchtree.samplers import driver
from torchtree.samplers.base import SamplerBase
from torchtree.samplers.presets import Preset
from torchtree.samplers.protocol import SamplerConfig, SamplerState, option

__all__ = ["StumpsConfig", "StumpsSetup", "StumpsState", "PriorStumps"]

#: the "many-features" preset of ``batch_size``: stumps per feature and step
STUMPS_PER_FEATURE = 8


@dataclass(frozen=True)
class StumpsConfig(SamplerConfig):
    """Settings of :class:`PriorStumps`: the table the estimator, the CLI and checkpoints read."""

    n_steps: int = option(10, help="steps; each draws batch_size stumps", low=1)
    batch_size: int = option(64, help="stumps drawn per step, across ranks", low=1, presets=(
        Preset("many-features", f"a stump tries one feature: {STUMPS_PER_FEATURE} per feature and step, in blocks of 64",
               lambda v, s: STUMPS_PER_FEATURE * s.n_features > 64,
               lambda v, s: -(-STUMPS_PER_FEATURE * s.n_features // 64) * 64),))
    device: Optional[str] = option(None, help="torch device (None: the data's)", result=False)
    checkpoint: Optional[str] = option(None, help="checkpoint file (resume when it exists)", result=False)
    checkpoint_every: int = option(1, help="save after every k-th step", low=1, result=False)
    max_seconds: Optional[float] = option(None, help="time budget in seconds", low=0.0, low_open=True,
                                          result=False)


@dataclass
class StumpsState(SamplerState):
    """This rank's stumps so far: ``feature`` [k] long, ``threshold`` [k] and ``logw`` [k] float64."""

    step: int
    done: bool
    feature: torch.Tensor
    threshold: torch.Tensor
    logw: torch.Tensor


@dataclass(frozen=True)
class StumpsSetup:
    """What a run sets up once (before its seed is known): the leaf ``likelihood``. The driver keeps it
    as ``ctx.setup``."""

    likelihood: Any


class PriorStumps(SamplerBase):
    """Importance sampling of decision stumps from a uniform split prior (a toy method).

    ``run(data, seed=..., monitor=...)`` (inherited) goes through the one driver and returns a
    ``TreePosterior`` over stumps.
    """

    name = "PriorStumps"
    config_class = StumpsConfig

    def __init__(self, likelihood=None, *, backend=None, **settings: Any) -> None:
        self.config = StumpsConfig(**settings)
        self.likelihood = likelihood
        self.backend = backend

    # -------------------------------------------------------------- protocol
    def setup(self, ctx: driver.RunContext) -> StumpsSetup:
        if self.config.batch_size % ctx.world_size:
            raise ValueError(f"batch_size ({self.config.batch_size}) must be divisible by the number of ranks "
                             f"({ctx.world_size})")
        # the default for the data, or the given likelihood checked against the contract and the data's task
        return StumpsSetup(likelihood=driver.leaf_likelihood(self.likelihood, ctx.data))

    def settings(self, ctx: driver.RunContext) -> Dict[str, Any]:
        return {"likelihood": driver.describe(ctx.setup.likelihood)}

    def init(self, ctx: driver.RunContext) -> StumpsState:
        empty = torch.empty(0, dtype=torch.float64, device=ctx.device)
        return StumpsState(0, False, torch.empty(0, dtype=torch.long, device=ctx.device), empty, empty)

    def restore(self, saved: Dict[str, Any], ctx: driver.RunContext) -> StumpsState:
        return StumpsState.from_state_dict(saved, ctx.device)

    def step(self, state: StumpsState, ctx: driver.RunContext) -> Tuple[StumpsState, Optional[dict]]:
        data, B, W = ctx.data, self.config.batch_size, ctx.world_size
        # this rank's share of the step's global stump indices: the same draws on any number of ranks
        index = state.step * B + ctx.rank * (B // W) + torch.arange(B // W, device=ctx.device)
        feature = (keyed_uniform(ctx.seed, 0, index) * data.d).long().clamp_max(data.d - 1)
        lo, hi = data.feature_min.double()[feature], data.feature_max.double()[feature]
        threshold = lo + keyed_uniform(ctx.seed, 1, index) * (hi - lo)
        logw = self._leaf_stats_log_marginal(feature, threshold, ctx)
        state = StumpsState(state.step + 1, state.step + 1 >= self.config.n_steps,
                            torch.cat([state.feature, feature]), torch.cat([state.threshold, threshold]),
                            torch.cat([state.logw, logw]))
        if not ctx.watch:
            return state, None
        return state, {"stumps/drawn": int(state.logw.numel()) * W, "stumps/best_log_weight": float(logw.max())}

    def finalize(self, state: StumpsState, ctx: driver.RunContext) -> TreePosterior:
        feature, threshold, logw = state.feature, state.threshold, state.logw
        W = ctx.world_size
        if W > 1:  # every rank's stumps, in global index order: [W, steps, B/W] -> [steps, W, B/W]
            k = state.step
            parts = [ctx.backend.all_gather(t) for t in (feature.double(), threshold, logw)]
            feature, threshold, logw = (p.view(W, k, -1).transpose(0, 1).reshape(-1) for p in parts)
            feature = feature.long()
        trees = self._stumps(feature, threshold, ctx)
        log_evidence = float(torch.logsumexp(logw, 0) - math.log(logw.numel()))
        info = {"sampler": self.name, "n_steps": state.step}
        return TreePosterior(trees, logw, ctx.setup.likelihood, ctx.data.d, classes=ctx.data.classes_,
                             log_evidence=log_evidence, info=info)

    def end_info(self, post: TreePosterior) -> Dict[str, Any]:
        return {"log_evidence": post.log_evidence}

    # --------------------------------------------------------------- helpers
    def _split_stats(self, feature, threshold, ctx):
        data, lik = ctx.data, ctx.setup.likelihood
        points = lik.point_stats(data.y, getattr(data, "n_classes", None)).double()  # [N, S]
        goes_left = (data.X.double()[:, feature].T <= threshold[:, None]).double()  # [k, N]
        left = goes_left @ points
        return points.sum(0).expand_as(left), left, points.sum(0) - left

    def _leaf_stats_log_marginal(self, feature, threshold, ctx) -> torch.Tensor:
        lik = ctx.setup.likelihood
        _, left, right = self._split_stats(feature, threshold, ctx)
        return (lik.log_marginal(left) + lik.log_marginal(right)).double()

    def _stumps(self, feature, threshold, ctx) -> HardTrees:
        lik = ctx.setup.likelihood
        root, left, right = self._split_stats(feature, threshold, ctx)
        P = feature.numel()
        dev, i32 = ctx.device, dict(dtype=torch.int32, device=ctx.device)
        stats_dtype = getattr(lik, "stats_dtype", torch.float64)

        def rows(*values):
            return torch.tensor(values, **i32).expand(P, 3).clone()

        thr = torch.zeros(P, 3, dtype=ctx.data.X.dtype, device=dev)
        thr[:, 0] = threshold.to(thr.dtype)
        feat = rows(-1, -1, -1)
        feat[:, 0] = feature.to(torch.int32)
        return HardTrees(feature=feat, threshold=thr, left=rows(1, -1, -1), right=rows(2, -1, -1),
                         parent=rows(-1, 0, 0), depth=rows(0, 1, 1),
                         status=torch.tensor([INTERNAL, LEAF, LEAF], dtype=torch.int8, device=dev).expand(P, 3).clone(),
                         stats=torch.stack([root, left, right], 1).to(stats_dtype),
                         n_nodes=torch.full((P,), 3, dtype=torch.long, device=dev))


register_method("stumps", PriorStumps)


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--smoke", action="store_true", help="tiny run, for the test-suite")
    args = ap.parse_args(argv)
    import sys
    from pathlib import Path

    from torchtree import BayesianTreeClassifier

    sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests" / "_dist_workers"))
    from thread_backend import run_threads  # a 2-rank backend made of threads (the tests use it too)

    g = torch.Generator().manual_seed(0)
    X = torch.rand(300 if not args.smoke else 120, 3, generator=g)
    y = (X[:, 1] > 0.4).long()
    clf = BayesianTreeClassifier(method="stumps", n_steps=4 if args.smoke else 20, batch_size=32, random_state=0)
    clf.fit(X.numpy(), y.numpy())
    one = PriorStumps(n_steps=4, batch_size=32).run((X, y), seed=1)
    two = run_threads(2, lambda b: PriorStumps(n_steps=4, batch_size=32, backend=b).run((X, y), seed=1))
    agree = all(torch.equal(p.log_weights, one.log_weights) for p in two)
    print(f"stumps: accuracy {clf.score(X.numpy(), y.numpy()):.3f}, log evidence {clf.log_evidence_:.2f}, "
          f"2 ranks agree: {agree}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
