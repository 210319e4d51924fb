"""``DCCConfig``: the settings of :class:`~torchtree.samplers.dcc.sampler.DCC`, in one table.

The estimators' parameters, ``torchtree fit --method dcc``'s options and help, and the
checkpoint fingerprint (the settings with ``result=True``) all read this table
(:mod:`torchtree.samplers.protocol`). Symbols in the help (T, T0, N_c, ...) are those of
paper 004 (Alg. 1, Table 5).
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Optional, Tuple, Union

import torch

from torchtree.core.validate import check_float_dtype, check_int, check_probabilities
from torchtree.model.soft_data import FLOAT_DTYPES, SoftData
from torchtree.model.soft_trees import SoftTreeHyper
from torchtree.samplers.dcc.rows import BUDGET_SHARE, check_max_rows
from torchtree.samplers.presets import Preset, always
from torchtree.samplers.nuts.config import soft_tree_option
from torchtree.samplers.protocol import SamplerConfig, option
from torchtree.steps.soft_init import INIT_MODES

__all__ = ["DCCConfig", "LOCAL_POSTERIORS", "LAIS_FORMS", "CLOCK_NAMES", "MIN_DRAWS"]

#: Draws per chain a visit needs to count (and the least ``n_samples``): LAIS builds each chain's
#: proposal covariance from its draws, and one draw has none.
MIN_DRAWS = 2

LOCAL_POSTERIORS = ("weighted", "chains", "draws")
#: the "bounded-fit" preset's budget (seconds of ``clock``)
BOUNDED_FIT_SECONDS = 60.0
LAIS_FORMS = ("spatial", "basic")
CLOCK_NAMES = ("wall", "cpu", "work")


def _check_n_samples(name: str, value) -> int:
    value = check_int(name, value, 1)
    if value < MIN_DRAWS:
        raise ValueError(f"DCC needs {name} >= {MIN_DRAWS}, got {value}: LAIS estimates each topology's evidence "
                         "with proposals whose covariance comes from each chain's draws at a visit, and one draw has "
                         "none, so no topology could ever finish")
    return value


@dataclass(frozen=True)
class DCCConfig(SamplerConfig):
    """Settings of :class:`~torchtree.samplers.dcc.sampler.DCC` (its docstring explains them).

    A frozen dataclass: ``DCC(**settings)`` builds one and exposes its fields as attributes;
    its option table (rendered in the reference and by ``torchtree fit --method dcc --help``)
    lists every setting with its default, allowed values and help (symbols as
    in paper 004, Alg. 1 and Table 5). Construction checks every value against its bounds and
    choices, then ``move_probs``.

    Raises
    ------
    ValueError
        A setting out of its bounds or choices, or ``move_probs`` that are not three
        non-negative numbers with a positive sum (grow, prune, stay).
    """

    # n_iterations only bounds the loop: not fingerprinted, so a finished checkpointed run
    # can be extended by resuming it with a larger value
    n_iterations: int = option(60, help="T, DCC iterations (paper: 500)", low=1, result=False)
    n_initial: int = option(100, help="T0, topologies drawn from the Chipman prior at the start", low=1)
    n_chains: int = option(8, help="N_c, NUTS chains per topology (paper code: 16)", low=1)
    n_samples: int = option(20, help=f"N_s, NUTS draws per chain at each visit of a topology (paper: 100; at least "
                            f"{MIN_DRAWS}: LAIS builds each chain's proposal covariance from them)", low=MIN_DRAWS,
                            check=_check_n_samples)
    n_warmup: int = option(150, help="N_init, warm-up iterations of a newly active topology (paper: 1000-5000)",
                           low=0)
    activation_threshold: int = option(5, help="C0, proposals a topology needs to become active", low=1)
    n_proposals: int = option(5, help="N_M, LAIS pseudo-samples per NUTS draw (paper: 10)", low=1)
    n_parallel: int = option(4, help="topologies refined together per iteration (1: the paper's algorithm)", low=1)
    max_depth: int = option(5, help="deepest leaf a topology may have", low=1)
    alpha_split: float = option(0.95, help="Chipman structure prior: split probability alpha at the root (paper: 0.95)",
                                low=0.0, high=1.0, low_open=True, high_open=True)
    beta_split: float = option(1.0, help="Chipman structure prior: depth decay beta, p(split) = alpha (1 + depth)^-beta",
                               low=0.0)
    # kept unnormalised: propose_topology scales by their sum, and dividing here would move
    # rounding and so change the draws of earlier runs
    move_probs: Tuple[float, float, float] = option(
        (0.6, 0.3, 0.1), help="weights of the grow, prune and stay moves of the global topology proposal")
    delta: float = option(0.5, help="utility: weight of exploration against exploitation (eq. 10)", low=0.0, high=1.0)
    optimism: float = option(1.0, help="utility: weight of the optimism boost of rarely refined topologies", low=0.0)
    kappa: float = option(0.0, help="utility: weight of the weight variance in the exploitation term")
    look_ahead: float = option(1000.0, help="utility: further weights the exploration term looks ahead to",
                               low=0.0, low_open=True)
    h_init: float = option(0.05, help="split sharpness at the start of a warm-up (annealed to h_final)",
                           low=0.0, low_open=True)
    h_final: float = option(0.025, help="split sharpness of the target (after warm-up)", low=0.0, low_open=True)
    max_tree_depth: int = option(6, help="NUTS trajectory depth cap", low=1)
    target_accept: float = option(0.8, help="acceptance rate the step-size adaptation aims at",
                                  low=0.0, high=1.0, low_open=True, high_open=True, presets=(
        Preset("regression", "smaller steps: regression's Normal likelihood is sharper, and 0.8 diverged in a few "
               "per cent of transitions", lambda v, s: s.regression, 0.9),))
    lais_form: str = option("spatial", help="LAIS proposal form", choices=LAIS_FORMS)
    hyper: Optional[SoftTreeHyper] = soft_tree_option("hyper")
    alpha: Optional[float] = soft_tree_option("alpha")
    split_concentration: Optional[float] = soft_tree_option("split_concentration")
    signed_splits: Optional[bool] = soft_tree_option("signed_splits")
    max_predict_draws: int = option(200, help="draws per topology kept in the posterior", low=1)
    local_posterior: str = option("weighted", help="each topology's posterior: LAIS pseudo-samples resampled by "
                                  "weight, NUTS draws weighted per chain by its evidence, or plain draws",
                                  choices=LOCAL_POSTERIORS)
    warm_start: bool = option(False, help="start a new topology's chains from those of the topology that proposed "
                              "it, with the shorter warm-up n_warmup_warm (not in the paper; not scikit-learn's "
                              "warm_start: every fit starts afresh)")
    compile: bool = option(False, help="run each NUTS leapfrog step as one torch.compile-d call (faster "
                           "steps after a compilation once per process and tree depth)")
    n_warmup_warm: Optional[int] = option(None, help="warm-up iterations of a warm-started topology "
                                          "(default: max(30, n_warmup // 3))", low=0)
    max_seconds: Optional[float] = option(None, help="stop after this many seconds of the clock (None: no "
                                          "limit), summed over resumed segments; read from the wall or CPU "
                                          "clock, the result then depends on the machine's speed",
                                          low=0.0, low_open=True, result=False, presets=(
        Preset("bounded-fit", f"a fit without a budget runs all n_iterations, which takes many minutes: stop after "
               f"{BOUNDED_FIT_SECONDS:g} s", always, BOUNDED_FIT_SECONDS),))
    clock: str = option("wall", help="what max_seconds measures: wall time, this process's CPU time, or "
                        "'work': the modelled seconds of the soft-tree evaluations made, on one thread of a "
                        "reference CPU (torchtree.core.work), which stop a seeded run at the same point on every "
                        "machine", choices=CLOCK_NAMES, result=False, presets=(
        Preset("work-clock", "a budget of seconds read from a real clock makes the result depend on the "
               "machine's speed and load; counted work gives the same draws for the same seed everywhere",
               always, "work"),))
    # decides the result (a subset is another target); "auto"'s number of rows depends on the
    # machine's speed like max_seconds (not with the work clock), and a checkpoint keeps the number a run chose
    max_rows: Union[str, int, None] = option(
        "auto", help="rows DCC fits: 'auto' (with max_seconds, a seeded uniform subset whose first warm-up a pilot "
        f"estimates on the budget's clock at {BUDGET_SHARE:g} of the budget, if all rows would take longer; every "
        "row without "
        "max_seconds), an integer m (a seeded uniform subset of m rows when there are more) or None (every row). "
        "A subset's posterior is the exact posterior given those rows: wider than the full data's, not biased "
        "by noisy gradients", check=check_max_rows)
    device: Optional[str] = option(None, help="torch device (default: the data's; 'auto': CUDA if present)",
                                   result=False)
    dtype: torch.dtype = option(torch.float32, help="float dtype of the scaled inputs and the parameters",
                                choices=FLOAT_DTYPES,
                                check=check_float_dtype)
    checkpoint: Optional[str] = option(None, help="checkpoint file (resume when it exists)", result=False)
    checkpoint_every: int = option(1, help="save after every k-th iteration", low=1, result=False)
    asynchronous: bool = option(False, help="draw each visit's NUTS samples with every chain at its own pace "
                                "(warm-up stays in lockstep)")
    init: str = option("prior", help="where a topology's chains start: prior draws, or splits fitted to the data "
                       "(then the warm-up runs at h_final)", choices=INIT_MODES)

    def check(self) -> None:
        check_probabilities("move_probs (grow, prune, stay)", self.move_probs, 3)
        object.__setattr__(self, "move_probs", tuple(float(p) for p in self.move_probs))

    @property
    def warmup_warm(self) -> int:
        """The warm-up length of a warm-started topology (``n_warmup_warm`` or its default)."""
        return self.n_warmup_warm if self.n_warmup_warm is not None else max(30, self.n_warmup // 3)

    def soft_hyper(self) -> SoftTreeHyper:
        """``hyper`` with the ``alpha`` / ``split_concentration`` / ``signed_splits`` overrides."""
        return SoftTreeHyper.with_overrides(self.hyper, alpha=self.alpha, split_concentration=self.split_concentration,
                                            signed_splits=self.signed_splits)

    def resolved_hyper(self, data: SoftData) -> SoftTreeHyper:
        """:meth:`soft_hyper` for a run on ``data``: a given regression prior converted into the
        units of its (standardised) targets, then the data-dependent defaults filled in."""
        return self.soft_hyper().in_target_units(data).resolve(data)
