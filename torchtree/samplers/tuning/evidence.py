"""Hyperparameters by evidence (type-II maximum likelihood) from top-down SMC pilot runs.

Top-down SMC estimates the evidence ``p(y | X, theta)`` of the tree model, so the leaf prior
and the split prior can be chosen by maximising it. :func:`choose_by_evidence` runs one
small top-down SMC per candidate value on a coarse grid, all with the same seed (common
random numbers: the runs differ only through ``theta``, which keeps the comparison's noise
far below the differences between grid points), first over the leaf prior, then over the
split prior's depth decay with the chosen leaf prior. The pilots of each of the two grids run
as the islands of one top-down SMC run, each island with its own prior and leaf prior and the
random numbers of its pilot alone
(:func:`~torchtree.samplers.topdown.sampler.variant_log_evidences`), so a stage's shared work
is done once:

* classification: the Dirichlet concentration ``alpha`` (total over the classes);
* regression: the prior mean of the leaves' noise variance as a fraction ``f`` of var(y)
  (``b0 = max(a0 - 1, 0.5) f var(y)``; the default prior has ``f = 0.5``);
* both: ``beta_split`` of the Chipman prior (``alpha_split`` stays at 0.95).

Settings the user gave are kept and not searched. On more than ``max_rows`` rows the pilots
run on a random subset of that many rows (the choice is then an approximation of the
evidence maximiser on all rows; the evidence itself is not reported from it).
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Dict, List, Optional, Sequence

import torch

from torchtree.model.data import Data
from torchtree.model.likelihoods import DirichletMultinomial, NormalInverseGamma, target_scale
from torchtree.model.priors import ALPHA_SPLIT, BETA_SPLIT, ChipmanPrior
from torchtree.monitor import closed_on_error, progress_monitor

__all__ = ["EvidenceSearch", "choose_by_evidence", "ALPHA_GRID", "NOISE_GRID", "BETA_SPLIT_GRID"]

#: the pilots' row subset is drawn with the seed plus this (the pilots themselves take the seed)
PILOT_ROWS_OFFSET = 7919
#: Dirichlet concentrations tried (classification)
ALPHA_GRID = (0.5, 1.0, 2.0, 5.0, 10.0, 20.0)
#: prior mean of the leaf noise variance, as a fraction of var(y), tried (regression)
NOISE_GRID = (0.01, 0.03, 0.1, 0.25, 0.5)
#: depth decays of the Chipman split prior tried
BETA_SPLIT_GRID = (0.25, 0.5, 1.0, 2.0)


@dataclass
class EvidenceSearch:
    """What :func:`choose_by_evidence` chose and why.

    Attributes
    ----------
    chosen : dict, the selected settings by estimator name (``alpha`` or ``b0``, ``beta_split``)
    curves : dict name -> list of (value, log evidence of the pilot), in grid order
    n_rows : int, rows the pilots ran on
    n_particles : int, particles of each pilot
    seconds : float, wall time of all pilots
    seed : int, the pilots' common seed
    """

    chosen: Dict[str, float]
    curves: Dict[str, List[tuple]] = field(default_factory=dict)
    n_rows: int = 0
    n_particles: int = 0
    seconds: float = 0.0
    seed: int = 0

    def as_dict(self) -> Dict[str, Any]:
        """Plain values (for ``posterior.info`` and summaries)."""
        return {"chosen": dict(self.chosen), "curves": {k: [list(p) for p in v] for k, v in self.curves.items()},
                "n_rows": self.n_rows, "n_particles": self.n_particles, "seconds": self.seconds,
                "seed": self.seed}


def _pilot_evidence(data: Data, prior, likelihood, n_particles: int, seed: int, n_threads="auto", device=None) -> float:
    from torchtree.samplers.topdown import TopDownSMC

    post = TopDownSMC(prior, likelihood, n_particles=n_particles, n_threads=n_threads, device=device).run(data, seed=seed)
    return float(post.log_evidence)


def _pilot_evidences(data: Data, variants, n_particles: int, seed: int, n_threads="auto", device=None) -> List[float]:
    """:func:`_pilot_evidence` of each (prior, likelihood) in ``variants``, from one run whose islands are the
    pilots (:func:`~torchtree.samplers.topdown.sampler.variant_log_evidences`: each island draws the
    numbers of its pilot alone; the stage's work is shared)."""
    from torchtree.samplers.topdown.sampler import variant_log_evidences

    if not variants:
        return []
    return variant_log_evidences(data, variants, n_particles, seed, n_threads=n_threads, device=device)


def _subset(data: Data, max_rows: int, seed: int) -> Data:
    if data.n <= max_rows:
        return data
    g = torch.Generator().manual_seed(int(seed) + PILOT_ROWS_OFFSET)
    rows = torch.randperm(data.n, generator=g)[:max_rows].sort().values.to(data.X.device)
    return data.subset(rows)


def choose_by_evidence(data: Data, *, fixed: Dict[str, Any], a0: float = 2.0, kappa0: float = 0.1,
                       mu0: Optional[float] = None, alpha_split: float = ALPHA_SPLIT, beta_split: float = BETA_SPLIT,
                       search_split: bool = True, n_particles: int = 100,
                       max_rows: int = 5000, seed: int = 0, alpha_grid: Sequence[float] = ALPHA_GRID,
                       noise_grid: Sequence[float] = NOISE_GRID,
                       beta_split_grid: Sequence[float] = BETA_SPLIT_GRID, n_threads="auto",
                       device=None) -> EvidenceSearch:
    """Choose the leaf prior and the split prior's depth decay by the evidence of pilot runs.

    Parameters
    ----------
    data : Data (classification or regression)
    fixed : dict, leaf settings the user gave (``alpha``, ``b0``; None = search it)
    a0, kappa0, mu0 : regression leaf prior settings kept as they are (``mu0`` None: mean(y))
    alpha_split, beta_split : float, the Chipman prior of the pilots (``beta_split`` is the
        value kept when ``search_split`` is False, and the search's starting point)
    search_split : bool, also search ``beta_split``
    n_particles : int, particles of each pilot top-down SMC
    max_rows : int, pilots run on a random subset of this many rows when the data has more
    seed : int, the pilots' common seed
    alpha_grid, noise_grid, beta_split_grid : the values tried
    n_threads : "auto" or int, the pilots' thread setting
    device : str, torch.device or None, the pilots' device (None: the data's)

    Returns
    -------
    EvidenceSearch
    """
    import time

    t0 = time.perf_counter()
    pilot = _subset(data, max_rows, seed)
    search = EvidenceSearch(chosen={}, n_rows=pilot.n, n_particles=n_particles, seed=int(seed))
    beta = float(beta_split)
    y = pilot.y.double()
    var = target_scale(y)
    centre = float(y.mean()) if mu0 is None else float(mu0)

    def leaf(value):
        if pilot.task == "classification":
            return DirichletMultinomial(value)
        return NormalInverseGamma(mu0=centre, kappa0=kappa0, a0=a0, b0=value)

    if pilot.task == "classification":
        name, given = "alpha", fixed.get("alpha")
        grid = list(alpha_grid)
    else:
        name, given = "b0", fixed.get("b0")
        grid = [max(a0 - 1.0, 0.5) * f * var for f in noise_grid]
        if given is None and not (y.numel() > 1 and float(y.var()) > 0):
            # targets with no spread (one row, all equal) sit at the prior mean, whose evidence then grows
            # without bound as the noise shrinks: nothing to choose from, the default scale stays
            given = NormalInverseGamma.default_for(y, kappa0=kappa0, a0=a0).b0
    n_split = len(beta_split_grid) - (beta in beta_split_grid and given is None) if search_split else 0
    bar = progress_monitor("evidence pilots", total=(len(grid) if given is None else 0) + n_split)
    if bar is not None:
        bar.on_start({})
    done = [0]

    def evidences(variants):  # pilots of several (prior, likelihood), one run; counted on the bar
        out = _pilot_evidences(pilot, variants, n_particles, seed, n_threads, device)
        for lz in out:
            if bar is not None:
                bar.on_step(done[0], {"log_evidence": lz})
            done[0] += 1
        return out

    with closed_on_error(bar):  # an interrupted search closes its bar
        if given is None:
            curve = list(zip(grid, evidences([(ChipmanPrior(alpha_split, beta), leaf(v)) for v in grid])))
            search.curves[name] = curve
            best_leaf = max(curve, key=lambda p: p[1])[0]
            search.chosen[name] = best_leaf
        else:
            best_leaf = float(given)
        if search_split:
            known = {b: lz for b in beta_split_grid if b == beta
                     for v, lz in search.curves.get(name, []) if v == best_leaf}
            todo = [b for b in beta_split_grid if b not in known]
            known.update(zip(todo, evidences([(ChipmanPrior(alpha_split, b), leaf(best_leaf)) for b in todo])))
            curve = [(b, known[b]) for b in beta_split_grid]
            search.curves["beta_split"] = curve
            search.chosen["beta_split"] = max(curve, key=lambda p: p[1])[0]
    if bar is not None:
        bar.on_end({})
    search.seconds = time.perf_counter() - t0
    return search
