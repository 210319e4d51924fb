"""Cases shared by tests/test_topdown_dist.py and the rank processes it launches.

Pure functions of their arguments: a worker and the test build the same data and samplers
independently. 48 particles split over 1, 2, 3 or 4 ranks; the islands cover both layouts
(whole islands per rank, and islands spanning ranks).
"""

from __future__ import annotations

from torchtree import TopDownSMC

from worker_common import estimator_result, posterior_result, toy_data

N_PARTICLES = 48
WORLD_SIZES = (2, 4)
SEED = 3

# name -> (task, TopDownSMC keywords); ess_threshold high so that particles move often.
CASES = {
    "node_i1_prior": ("classification", dict(n_islands=1, expansion="node", proposal="prior", resampling="multinomial", ess_threshold=0.9)),
    "layer_i1_empirical": ("classification", dict(n_islands=1, expansion="layer", proposal="empirical", resampling="systematic", ess_threshold=0.9)),
    "node_i4_prior": ("classification", dict(n_islands=4, expansion="node", proposal="prior", resampling="stratified", ess_threshold=0.9)),
    "layer_i4_optimal": ("classification", dict(n_islands=4, expansion="layer", proposal="optimal", resampling="residual", ess_threshold=1.0)),
    "node_i2_optimal": ("classification", dict(n_islands=2, expansion="node", proposal="optimal", resampling="multinomial", ess_threshold=1.0)),
    "layer_i3_prior": ("classification", dict(n_islands=3, expansion="layer", proposal="prior", resampling="multinomial", ess_threshold=0.9)),
    "regression_node_i2": ("regression", dict(n_islands=2, expansion="node", proposal="prior", resampling="systematic", ess_threshold=0.8)),
    "node_i2_optimal_partial": ("classification", dict(n_islands=2, expansion="node", proposal="optimal", resampling="multinomial", ess_threshold=0.9)),
}


data = toy_data  # (Data, query points) with ties in one feature


def run_case(name: str, backend=None) -> dict:
    """Fit one case; returns what the test compares (plain tensors and floats)."""
    task, kw = CASES[name]
    d, Xq = data(task)
    post = TopDownSMC(n_particles=N_PARTICLES, backend=backend, **kw).run(d, seed=SEED)
    pred = post.predict_proba(Xq) if task == "classification" else post.predict(Xq)
    info = {k: post.info[k] for k in ("n_stages", "n_resample", "island_log_evidence", "island_ess")}
    info.update({k: post.info.get(k) for k in ("layout", "particles_received")})
    return posterior_result(post, pred, info)


def run_estimator(backend=None) -> dict:
    """The sklearn-style face with ``backend=``."""
    return estimator_result(backend, data("classification")[1], method="smc", n_particles=N_PARTICLES,
                            n_islands=2, ess_threshold=0.9, random_state=SEED)
