"""Cases shared by tests/test_smc_moves_dist.py and the rank processes it launches.

Pure functions of their arguments: a worker and the test build the same data and samplers
independently. 48 particles split over 1, 2, 3 or 4 ranks; ``ess_threshold`` high so that
particles are resampled (and move between ranks) often.
"""

from __future__ import annotations

from torchtree.monitor import CallbackMonitor
from torchtree.samplers.smc_moves import SMCSampler

from worker_common import estimator_result, posterior_result, toy_data

N_PARTICLES = 48
WORLD_SIZES = (2, 4)
SEED = 7

# name -> (task, SMCSampler keywords)
CASES = {
    "weights_multinomial": ("classification", dict(n_iterations=6, resampling="multinomial", ess_threshold=0.9)),
    "weights_systematic_rotational": ("classification", dict(n_iterations=5, resampling="systematic", ess_threshold=0.9,
                                                             redistribution="rotational")),
    "mh_stratified": ("classification", dict(n_iterations=5, resampling="stratified", mh_step=True, ess_threshold=1.0)),
    "tempering_residual": ("classification", dict(n_iterations=5, resampling="residual", tempering=True, ess_threshold=0.8)),
    "poisson": ("classification", dict(n_iterations=5, prior="poisson", poisson_lambda=6.0, ess_threshold=0.9)),
    "regression": ("regression", dict(n_iterations=5, ess_threshold=0.9)),
    "informed_cuts": ("classification", dict(n_iterations=5, cut_proposal="informed", ess_threshold=0.9)),
}


data = toy_data  # (Data, query points) with ties in one feature


def run_case(name: str, backend=None, monitor=None, **extra) -> dict:
    """Fit one case; returns what the test compares (plain tensors, floats and lists)."""
    task, kw = CASES[name]
    d, Xq = data(task)
    post = SMCSampler(n_particles=N_PARTICLES, backend=backend, **{**kw, **extra}).run(d, seed=SEED, monitor=monitor)
    pred = post.predict_proba(Xq) if task == "classification" else post.predict(Xq)
    info = {k: post.info[k] for k in ("n_resample", "final_ess", "ess_trace", "temperatures", "accept_fraction")}
    info["particle_counts"] = post.info["particle_counts"]
    info["resumed_from"] = post.info["resumed_from"]
    return posterior_result(post, pred, info)


def run_estimator(backend=None) -> dict:
    """The sklearn-style face with ``method="smc-moves", backend=``."""
    return estimator_result(backend, data("classification")[1], method="smc-moves", n_particles=N_PARTICLES,
                            n_iterations=4, ess_threshold=0.9, random_state=SEED)


class Stop(RuntimeError):
    """Raised by :func:`stop_after` to interrupt a run (a crash after a checkpoint)."""


def stop_after(k: int) -> CallbackMonitor:
    """A monitor that stops a run after iteration ``k``: at its checkpoint when one is saved
    there, else before the next iteration's report (so the checkpoint on disk is the last
    one at or before ``k``). Acts on every rank, so that all ranks stop at the same point."""

    def at_checkpoint(step):
        if step >= k:
            raise Stop(f"stopped after iteration {step} (its checkpoint is on disk)")

    def at_step(step, info):
        if step > k:
            raise Stop(f"stopped before reporting iteration {step}")

    return CallbackMonitor(on_checkpoint=at_checkpoint, on_step=at_step, all_ranks=True)
