"""Defaults the estimators choose per method and table size (the samplers keep their papers' defaults).

Each was chosen by a benchmark (README, "Defaults"): top-down SMC's proposal for classification
(optimal on small tables, :func:`torchtree.samplers.topdown_starts.start_settings`) and its particles
on wide tables (:func:`~torchtree.samplers.topdown_starts.wide_table_particles`), where MCMC and SMC
with moves start (top-down SMC draws: MCMC on large or wide tables, SMC with moves always), how many
MCMC chains run on small tables, and DCC's time budget.
Settings the user gives are never changed.

Layer: faces (read by :mod:`torchtree.estimators` only).
"""
from __future__ import annotations

from typing import Any, Dict

from torchtree.samplers.topdown_starts import REGRESSION_ISLANDS, start_settings, wide_table_particles

__all__ = ["apply_method_defaults", "TOPDOWN_INIT_ROWS", "TOPDOWN_INIT_FEATURES",
           "MCMC_CHAINS_SMALL", "MCMC_SAMPLES_SMALL", "SMC_ISLANDS_REGRESSION", "DCC_MAX_SECONDS",
           "DCC_TARGET_ACCEPT_REGRESSION"]

#: rows from which ``method="mcmc"`` / ``"smc-moves"`` start at top-down SMC draws
#: (``init="topdown"`` / ``init_prior="topdown"``) unless that option is given
TOPDOWN_INIT_ROWS = 5000
#: ... and, for ``"mcmc"``, on more features (madelon's 500: root chains rarely find the informative ones)
TOPDOWN_INIT_FEATURES = 100

#: ``method="mcmc"`` below ``TOPDOWN_INIT_ROWS``: chains x kept draws, warm-up as long (README "Defaults")
MCMC_CHAINS_SMALL, MCMC_SAMPLES_SMALL = 16, 500
#: ``method="smc"`` islands for regression (independent filters of n_particles / n_islands each: their
#: average is wider than one filter's few surviving trees; abalone 90% coverage 0.887 -> 0.930)
SMC_ISLANDS_REGRESSION = REGRESSION_ISLANDS
#: ``method="dcc"``'s CPU-second budget unless ``max_seconds`` is given (None: the run's 60 iterations); the
#: estimators measure any budget in CPU seconds unless ``clock`` is given
DCC_MAX_SECONDS = 60.0
#: ``method="dcc"``'s NUTS target acceptance for regression unless ``target_accept`` is given (the sampler's
#: 0.8 diverged in 2.1-5.3% of transitions on abalone, cgm and wu; 0.9: 1.1-1.9%)
DCC_TARGET_ACCEPT_REGRESSION = 0.9


def apply_method_defaults(method: str, kwargs: Dict[str, Any], n: int, d: int, task: str = "classification",
                          n_classes: int = 2) -> None:
    """Add the estimators' defaults for ``method`` to the sampler settings ``kwargs`` (in place).

    Parameters
    ----------
    method : str, the estimator's method name
    kwargs : dict, the sampler's settings so far (what the user gave, plus the model objects)
    n, d : int, rows and features of the training data
    task : "classification" or "regression"
    n_classes : int, classes of a classification task
    """
    from torchtree.samplers.topdown import TopDownConfig

    # classification on small tables: the optimal proposal (README "Defaults"), for smc and for the top-down starts
    optimal = start_settings(n, d, task, 1, n_classes)["proposal"] == "optimal"
    if method == "smc" and task == "regression" and "n_islands" not in kwargs:
        particles = kwargs.get("n_particles", TopDownConfig.n_particles)
        if isinstance(particles, int) and particles % SMC_ISLANDS_REGRESSION == 0:  # islands must divide it
            kwargs["n_islands"] = SMC_ISLANDS_REGRESSION
    if method == "smc" and optimal and "proposal" not in kwargs:
        kwargs["proposal"] = "optimal"
    if (method == "smc" and task == "classification" and kwargs.get("proposal") != "optimal"
            and "n_particles" not in kwargs and "n_islands" not in kwargs):
        kwargs["n_particles"] = wide_table_particles(n, d, TopDownConfig.n_particles)  # wide tables (README "Defaults")
    if method == "mcmc" and n < TOPDOWN_INIT_ROWS:
        if "n_chains" not in kwargs and kwargs.get("engine") != "host":
            kwargs["n_chains"] = MCMC_CHAINS_SMALL
        if "n_samples" not in kwargs:
            kwargs["n_samples"] = MCMC_SAMPLES_SMALL
    if method == "dcc" and "max_seconds" not in kwargs:
        kwargs["max_seconds"] = DCC_MAX_SECONDS
    if method == "dcc" and "clock" not in kwargs:
        kwargs["clock"] = "cpu"  # one clock for the default budget and a given one (this process's CPU time)
    if method == "dcc" and task == "regression" and "target_accept" not in kwargs:
        kwargs["target_accept"] = DCC_TARGET_ACCEPT_REGRESSION
    start = {"mcmc": "init", "smc-moves": "init_prior"}.get(method)
    if (method == "smc-moves" and "mh_step" not in kwargs and not kwargs.get("tempering")
            and (task == "regression" or optimal)):
        # resample-move from a well-weighted start: reweighting after each move collapsed its spread of
        # trees onto a few (abalone RMSE 2.21 -> 2.31, iris log density -0.012); from the empirical
        # proposal's cruder start the reweighted moves did better (madelon +1.6 points; README "Defaults")
        kwargs["mh_step"] = True
    # SMC with moves at every size: from the prior its 10 iterations stay below top-down SMC; MCMC on
    # wide tables and for regression (from the root: abalone RMSE 2.32 against 2.21; README)
    always = method == "smc-moves" or (method == "mcmc" and (d > TOPDOWN_INIT_FEATURES or task == "regression"))
    if (start is not None and start not in kwargs and (n >= TOPDOWN_INIT_ROWS or always)
            and getattr(kwargs.get("prior"), "name", "chipman") == "chipman" and not kwargs.get("tempering")):
        kwargs[start] = "topdown"  # root / prior starts stay far below the posterior's trees (README)
