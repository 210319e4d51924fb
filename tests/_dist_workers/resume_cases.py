"""Shared by tests/test_resume.py and the rank processes of its multi-rank case."""

from __future__ import annotations

import numpy as np

from torchtree import Data

SEED = 7
EVERY = 2
STOP_AT = 9  # the first run stops after the checkpoint of stage 9 (steps 1, 3, 5, 7, 9)

# 2 ranks: whole islands per rank (ranks finish at different stages), and one island
# spanning both ranks (particles move between ranks when resampling).
DIST_CASES = {
    "islands": dict(n_particles=32, n_islands=2, proposal="prior", ess_threshold=0.9),
    "gathered": dict(n_particles=32, n_islands=1, proposal="empirical", expansion="node", ess_threshold=0.9),
}


def data(n: int = 200, seed: int = 0):
    """(Data, query points): two classes from an XOR pattern with 10% label noise."""
    rng = np.random.default_rng(seed)
    X = rng.normal(size=(n, 4))
    y = ((X[:, 0] * X[:, 1] > 0) ^ (rng.random(n) < 0.1)).astype(int)
    return Data(X, y), rng.normal(size=(50, 4))


def summary(post, Xq) -> dict:
    """What the tests compare, as plain tensors and numbers."""
    return {"trees": {k: v.clone() for k, v in post.trees.as_dict().items()}, "log_weights": post.log_weights.clone(),
            "log_evidence": post.log_evidence, "proba": np.asarray(post.predict_proba(Xq)),
            "n_stages": post.info.get("n_stages")}
