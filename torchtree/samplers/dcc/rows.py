"""DCC's row budget: fit on a seeded row subset when the time budget cannot afford all rows.

Every NUTS leapfrog step of DCC evaluates the soft trees' log density and its gradient on
every training row, so a warm-up costs ``transitions x leapfrog steps x cost(rows)``. At
10^5 rows one gradient of 4 topologies x 8 chains takes ~0.7 s on one CPU core, and the
first warm-up (150 transitions of up to 63 leapfrog steps) alone needs hours: with every row,
a run with ``max_seconds=300`` spends its budget before any warm-up ends. ``max_rows`` trades
rows for time:

* ``None``: every row;
* an int ``m``: a seeded uniform subset of ``m`` rows when the data has more;
* ``"auto"`` (default): with ``max_seconds``, the largest subset whose first warm-up is
  *estimated* to fit in :data:`BUDGET_SHARE` of the budget (the budget model below);
  without ``max_seconds``, every row.

Budget model. A pilot evaluates the gradient of the first warm-up's batch (the same
topologies and chains the run's first ``warmup`` call evaluates at once) on ``n2 =
min(N, PILOT_ROWS)`` rows and on ``n1 = n2 // 4`` rows, keeping the fastest of
:data:`PILOT_CALLS` calls each (so another process's interference counts least), read on the
budget's clock: on the work clock (:mod:`torchtree.core.work`) they are the cost model's counted
seconds, the same on every machine, and so is the subset. The cost
of one gradient is modelled as linear in the rows, ``t(m) = a + b m``, through these two
points (``a``: per-call overhead, ``b``: per-row work; when timing noise makes ``b <= 0``,
``t(m) = t(n2) m / n2``). What must fit is the first batch's warm-up and the draws that
make it count: ``W = n_warmup + MIN_DRAWS`` transitions of at most ``L = 2^max_tree_depth -
1`` leapfrog steps each. ``L`` is the NUTS cap, but not a loose one: the chains of a batch
advance in lockstep, so a transition lasts as long as its longest trajectory; counted on
2,000 rows of the scale benchmark's table, the first warm-up made ~57 full-batch gradient
calls per transition against a cap of 63. The chosen ``m`` is the largest with
``W L t(m) <= BUDGET_SHARE * max_seconds``: the rest of the budget goes to the draws,
LAIS updates and later activations, so that several iterations fit. Rows are never cut
below :data:`MIN_AUTO_ROWS`. When even ``min(N, MIN_AUTO_ROWS)`` rows do not fit, the
warm-up is shortened instead: ``W' = floor(BUDGET_SHARE * max_seconds / (L t(m)))``
transitions, of which ``n_warmup' = W' - MIN_DRAWS`` warm up (a warm-started topology's
``n_warmup_warm`` is capped by it too), with a warning. When not even
:data:`MIN_AUTO_WARMUP` warm-up iterations fit, the run is refused at once, after the
pilot (well under a second), instead of spending its budget and failing at the end.
Not modelled: LAIS (a few dozen gradients' worth per
visit), the step-size searches at the warm-up's window ends, ``init="data"``'s sweeps and
``compile=True`` (faster steps: the estimate is then conservative).

What the subset means. The target is the exact posterior given the subset,
``p(theta, m | y_S)``, not an approximation of the full-data posterior by noisy
gradients: it is wider than the full data's (less evidence), not biased. The subset keeps
the full data's input ranges (the [0, 1] scaling of the splits) and class coding; the
data-dependent hyperparameter defaults are resolved on the subset, so DCC with
``max_rows=m`` equals DCC with ``max_rows=None`` on :func:`subset_soft_data` of the same
rows (:func:`dcc_row_subset`). The rows are drawn from the run's seed, so a resumed run
recomputes them; the number of rows is kept in the checkpoint (``"auto"`` may time
another number on resume).
"""
from __future__ import annotations

import dataclasses
import math
import numbers
from typing import Callable, Iterable, List, Optional, Tuple

import torch

from torchtree.core.random import derive_seed, seed_to_int
from torchtree.core.threads import resolve_threads
from torchtree.model.soft_data import SoftData
from torchtree.model.soft_trees import SoftTrees
from torchtree.samplers.driver import work_size
from torchtree.steps.adaptation import sharpness_schedule
from torchtree.core.warn import warn

__all__ = ["check_max_rows", "dcc_row_subset", "subset_soft_data", "gradient_cost_model", "auto_rows", "use_rows",
           "auto_warmup", "BUDGET_SHARE", "MIN_AUTO_ROWS", "MIN_AUTO_WARMUP", "PILOT_ROWS", "PILOT_CALLS"]

#: Share of ``max_seconds`` the first warm-up (plus ``MIN_DRAWS`` draws) may take under "auto"
BUDGET_SHARE = 0.25
#: "auto" never fits fewer rows than this (a smaller table is never cut)
MIN_AUTO_ROWS = 500
#: "auto" never shortens the first warm-up below this many iterations (a budget that cannot
#: afford them on ``MIN_AUTO_ROWS`` rows is refused before the run starts)
MIN_AUTO_WARMUP = 30
#: Rows of the larger pilot (the smaller has a quarter of them)
PILOT_ROWS = 2000
#: Timed gradient calls per pilot size (after one untimed call)
PILOT_CALLS = 3
#: Key of the row subset's random stream, derived from the run's seed (the NUTS and
#: bookkeeping generators use the seed itself and seed + 1)
_ROWS_KEY = 0xDCC0



def _round_up(x: float) -> str:
    """``x`` rounded up to two significant digits, as text (``8.01`` -> ``8.1``, ``1234`` -> ``1300``)."""
    if not x > 0:
        return f"{x:g}"
    e = math.floor(math.log10(x)) - 1
    return f"{math.ceil(x / 10 ** e - 1e-9) * 10 ** e:.{max(0, -e)}f}"

def check_max_rows(name: str, value):
    """``max_rows`` checked: ``"auto"``, None or an int >= 1 (digits or ``"none"`` from the
    command line are read as the int or None); ValueError naming ``name`` otherwise."""
    if isinstance(value, str):
        text = value.strip().lower()
        if text in ("auto", "none", "null"):
            return None if text != "auto" else "auto"
        if text.isdigit():
            value = int(text)
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, numbers.Integral) or int(value) < 1:
        raise ValueError(f"{name} must be 'auto', None or an integer >= 1, got {value!r}")
    return int(value)


def dcc_row_subset(n: int, m: int, seed) -> torch.Tensor:
    """The rows a DCC run with ``max_rows=m`` and seed ``seed`` fits on ``n`` rows.

    Parameters
    ----------
    n : int, rows of the data
    m : int >= 1, rows to keep
    seed : int (the run's seed, as given to ``run``; reduced to 63 bits as the run does)

    Returns
    -------
    LongTensor [min(m, n)] on the CPU: a uniform draw without replacement, in increasing
    order; every row (``arange(n)``) when ``m >= n``.
    """
    if m >= n:
        return torch.arange(n)
    g = torch.Generator().manual_seed(derive_seed(seed_to_int(seed), _ROWS_KEY))
    return torch.randperm(n, generator=g)[:m].sort().values


def subset_soft_data(data: SoftData, rows: torch.Tensor) -> SoftData:
    """Rows ``rows`` (LongTensor [M]) of ``data``, keeping its input ranges, class count and
    class labels (so test inputs are scaled, and classes coded, as for the full data)."""
    rows = rows.to(data.X.device)
    return dataclasses.replace(data, X=data.X[rows], y=data.y[rows])


def gradient_cost_model(data: SoftData, topologies: List, n_chains: int, sharpness: float, hyper,
                        clock: Callable[[], float]) -> Tuple[float, float]:
    """Seconds of ``clock`` per potential-and-gradient call of the batch, ``t(m) = a + b m``.

    Parameters
    ----------
    data : SoftData [N rows]; the pilot uses its first ``min(N, PILOT_ROWS)`` rows
    topologies : list of Topology, the batch (as the first warm-up evaluates it)
    n_chains : int, chains per topology
    sharpness : float, the warm-up's starting sharpness
    hyper : SoftTreeHyper, resolved
    clock : callable, the budget's clock

    Returns
    -------
    (a, b): seconds per call and seconds per row per call, both >= 0.
    """
    n2 = min(int(data.X.shape[0]), PILOT_ROWS)
    sizes = sorted({max(n2 // 4, 1), n2})
    times = []
    for n in sizes:
        # its own generator: the pilot must leave the run's random streams untouched
        gen = torch.Generator(device=data.X.device).manual_seed(0)
        model = SoftTrees(subset_soft_data(data, torch.arange(n)), topologies, n_chains=n_chains,
                          sharpness=sharpness, hyper=hyper, dtype=data.X.dtype, generator=gen)
        theta = model.theta.data
        model.potential_and_grad(theta)  # the first call pays for allocations
        best = math.inf
        for _ in range(PILOT_CALLS):
            t0 = clock()
            model.potential_and_grad(theta)
            if theta.is_cuda:
                torch.cuda.synchronize(theta.device)
            best = min(best, clock() - t0)
        times.append(best)
    if len(sizes) == 2 and times[1] > times[0]:
        b = (times[1] - times[0]) / (sizes[1] - sizes[0])
        return max(times[1] - b * sizes[1], 0.0), b
    # one size, or timing noise hid the per-row work: all of it per row (over-estimates
    # larger subsets, the safe side)
    return 0.0, times[-1] / sizes[-1]


def auto_rows(n: int, budget: float, transitions: int, leapfrog: int, a: float, b: float) -> Optional[int]:
    """The rows "auto" fits: the largest ``m`` with ``transitions * leapfrog * (a + b m) <=
    BUDGET_SHARE * budget``, at least ``MIN_AUTO_ROWS``; None (every row) when ``m >= n`` or
    when even ``MIN_AUTO_ROWS`` rows would not fit."""
    per_call = BUDGET_SHARE * budget / max(transitions * leapfrog, 1)
    m = math.floor((per_call - a) / b) if b > 0 else n
    return None if m >= n or m < MIN_AUTO_ROWS else int(m)


def auto_warmup(m: int, budget: float, n_warmup: int, min_draws: int, leapfrog: int, a: float, b: float
                ) -> Optional[int]:
    """The warm-up "auto" runs on ``m`` rows: ``n_warmup`` when ``(n_warmup + min_draws)`` transitions
    fit :data:`BUDGET_SHARE` of ``budget``, else the most that fit, or None when fewer than
    :data:`MIN_AUTO_WARMUP` do (the budget cannot afford a useful warm-up at all)."""
    per_transition = leapfrog * (a + b * m)
    fits = math.floor(BUDGET_SHARE * budget / per_transition) - min_draws if per_transition > 0 else n_warmup
    if fits >= n_warmup:
        return n_warmup
    return int(fits) if fits >= min(MIN_AUTO_WARMUP, n_warmup) else None


def _first_batch(config, records: Iterable) -> List:
    """The topologies the first iteration warms up together first (as ``DCC.step`` and
    ``DCC._activate`` choose them: every topology proposed ``activation_threshold`` times,
    or the most proposed one, in batches of ``max(n_parallel, 4)``)."""
    records = list(records)
    new = [r for r in records if r.proposed >= config.activation_threshold]
    new = new or [max(records, key=lambda r: r.proposed)]
    return [r.topology for r in new[: max(config.n_parallel, 4)]]


def use_rows(config, ctx, records: Iterable, min_draws: int, saved: Optional[int] = None,
             saved_warmup: Optional[int] = None) -> int:
    """Apply ``max_rows`` to the run: replace ``ctx.data`` by its row subset when one is due, and
    shorten the warm-up when even the smallest subset cannot afford it (see the module notes).

    Parameters
    ----------
    config : DCCConfig
    ctx : driver.RunContext, after ``DCC.setup`` (``ctx.seed`` set); on a subset its
        ``data`` and thread count change; ``ctx.setup`` is replaced by a copy whose ``hyper``
        (resolved on the subset), ``n_warmup`` / ``n_warmup_warm``, their sharpness schedules and
        ``rows`` are this run's
    records : the run's topology records (the first warm-up's batch is timed by "auto")
    min_draws : int, ``MIN_DRAWS`` of the sampler (draws a warm-up needs to count)
    saved : int, optional; the rows a checkpointed run used (a resumed run keeps them)
    saved_warmup : int, optional; the warm-up length a checkpointed run used

    Returns
    -------
    int, the rows the run fits (``ctx.setup.rows = (used, total)`` as well).

    Raises
    ------
    ValueError
        "auto" with ``max_seconds``: the pilot's cost model says not even :data:`MIN_AUTO_WARMUP`
        warm-up iterations on ``min(N, MIN_AUTO_ROWS)`` rows fit the budget's share.
    """
    n = int(ctx.data.X.shape[0])
    m, why, n_warmup = None, "", config.n_warmup
    if saved is not None:
        m = int(saved) if int(saved) < n else None
        n_warmup = config.n_warmup if saved_warmup is None else int(saved_warmup)
    elif isinstance(config.max_rows, int):
        m = config.max_rows if config.max_rows < n else None
        why = f"max_rows={config.max_rows}; max_rows=None uses every row"
    elif config.max_rows == "auto" and config.max_seconds is not None:
        batch = _first_batch(config, records)
        a, b = gradient_cost_model(ctx.data, batch, config.n_chains, ctx.setup.h_start, ctx.setup.hyper,
                                   ctx.clock)
        transitions, leapfrog = config.n_warmup + min_draws, 2 ** config.max_tree_depth - 1
        full = transitions * leapfrog * (a + b * n)
        what = (f"the first warm-up ({len(batch)} topologies x {config.n_chains} chains, {transitions} transitions of "
                f"up to {leapfrog} gradients) on all {n} rows was estimated at {full:.3g} s, more than "
                f"{BUDGET_SHARE:g} of max_seconds={config.max_seconds:g} ({config.clock} clock)")
        if n > MIN_AUTO_ROWS:
            m = auto_rows(n, config.max_seconds, transitions, leapfrog, a, b)
            why = f"{what}; max_rows=None uses every row, a larger max_seconds more of them"
        if m is None and full > BUDGET_SHARE * config.max_seconds:
            floor_rows = min(n, MIN_AUTO_ROWS)
            n_warmup = auto_warmup(floor_rows, config.max_seconds, config.n_warmup, min_draws, leapfrog, a, b)
            if n_warmup is None:
                varies = ("the work clock's cost model: the same on every machine" if config.clock == "work" else
                          "the estimate is a timed cost model: it varies from run to run")
                need = (min(MIN_AUTO_WARMUP, config.n_warmup) + min_draws) * leapfrog * (a + b * floor_rows)
                raise ValueError(
                    f"DCC: max_seconds={config.max_seconds:g} ({config.clock} clock) cannot afford even "
                    f"{min(MIN_AUTO_WARMUP, config.n_warmup)} warm-up iterations of the first {len(batch)} topologies x "
                    f"{config.n_chains} chains on {floor_rows} rows (estimated {need:.3g} s, which must fit "
                    f"{BUDGET_SHARE:g} of the budget): raise max_seconds to {_round_up(1.5 * need / BUDGET_SHARE)} "
                    f"or more ({varies}), or lower n_chains or max_tree_depth")
            m = floor_rows if floor_rows < n else None
            why = (f"{what}; even on {floor_rows} rows only {n_warmup} of n_warmup={config.n_warmup} warm-up "
                   "iterations fit, so the warm-up is shortened too; a larger max_seconds restores them")
    chosen = {"n_warmup": n_warmup, "n_warmup_warm": min(config.warmup_warm, n_warmup), "rows": (n if m is None else m, n)}
    if n_warmup != config.n_warmup:
        h_start = ctx.setup.h_start
        chosen["schedule"] = sharpness_schedule(n_warmup, h_start, config.h_final)
        chosen["warm_schedule"] = sharpness_schedule(chosen["n_warmup_warm"], h_start, config.h_final)
    if m is not None:
        ctx.data = subset_soft_data(ctx.data, dcc_row_subset(n, m, ctx.seed))
        chosen["hyper"] = config.resolved_hyper(ctx.data)
        if config.n_threads == "auto":  # as many threads as a run on the subset itself would take
            ctx.n_threads = min(ctx.n_threads, resolve_threads("auto", work_size(config, m)))
            torch.set_num_threads(ctx.n_threads)  # the driver restores the caller's count afterwards
    if (m is not None or n_warmup != config.n_warmup) and saved is None:
        fits = f"DCC fits {m} of {n} rows (a seeded uniform subset)" if m is not None else f"DCC fits all {n} rows"
        short = f" with a warm-up of {n_warmup} iterations" if n_warmup != config.n_warmup else ""
        wider = ", wider than the full data's" if m is not None else ""
        adapts = "; a shorter warm-up adapts the step size and mass less well" if short else ""
        warn(f"{fits}{short}: {why}. The posterior is the exact one given these rows{wider}{adapts}.",
             UserWarning)
    ctx.setup = dataclasses.replace(ctx.setup, **chosen)
    return ctx.setup.rows[0]
