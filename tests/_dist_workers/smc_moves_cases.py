"""Cases shared by tests/test_smc_moves_dist.py and the rank processes it launches.

Pure functions of their arguments: a worker and the test build the same data and samplers
independently. 48 particles split over 1, 2, 3 or 4 ranks; ``ess_threshold`` high so that
particles are resampled (and move between ranks) often.
"""

from __future__ import annotations

import numpy as np

from torchtree import BayesianTreeClassifier, Data
from torchtree.smc_moves import SMCSampler

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


def data(task: str):
    """(Data, query points) with ties in one feature."""
    rng = np.random.default_rng(0)
    n = 120
    X = rng.normal(size=(n, 3))
    X[:, 2] = np.round(X[:, 2], 1)
    Xq = rng.normal(size=(40, 3))
    if task == "classification":
        y = ((X[:, 0] * X[:, 1] > 0) ^ (rng.random(n) < 0.1)).astype(int)
        return Data(X, y), Xq
    y = 2 * X[:, 0] + np.sin(3 * X[:, 1]) + 0.2 * rng.normal(size=n)
    return Data(X, y, task="regression"), Xq


def run_case(name: str, backend=None, **extra) -> dict:
    """Fit one case; returns what the test compares (plain tensors, floats and lists)."""
    task, kw = CASES[name]
    d, Xq = data(task)
    post = SMCSampler(n_particles=N_PARTICLES, backend=backend, **{**kw, **extra}).run(d, seed=SEED)
    pred = post.predict_proba(Xq) if task == "classification" else post.predict(Xq)
    info = {k: post.info[k] for k in ("n_resample", "final_ess", "ess_trace", "temperatures", "accept_fraction")}
    info["particle_counts"] = post.info["particle_counts"]
    info["resumed_from"] = post.info["resumed_from"]
    return {"log_evidence": post.log_evidence, "pred": np.asarray(pred), "trees": post.trees.as_dict(),
            "log_weights": post.log_weights, "info": info}


def run_estimator(backend=None) -> dict:
    """The sklearn-style face with ``method="smc-moves", backend=``."""
    d, Xq = data("classification")
    X = d.X.double().numpy()
    y = d.y.numpy()
    est = BayesianTreeClassifier(method="smc-moves", n_particles=N_PARTICLES, n_iterations=4, ess_threshold=0.9,
                                 random_state=SEED, backend=backend).fit(X, y)
    return {"log_evidence": est.log_evidence_, "pred": np.asarray(est.predict_proba(Xq))}
