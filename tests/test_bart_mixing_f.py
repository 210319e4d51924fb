"""``BARTPosterior.mixing``: split-R-hat and ESS of the draws of f(x), per row, over the chains (the run's own
diagnostics cover sigma and the mean leaf count only; a QA pass found f mixing worse)."""
from __future__ import annotations

import warnings

import numpy as np
import torch

from torchtree import BART, Data
from torchtree.model.bart import LEAF


def _posterior():
    rng = np.random.default_rng(0)
    X = rng.uniform(size=(200, 3))
    data = Data(X, 3 * (X[:, 0] > 0.5) + 0.3 * rng.normal(size=200), task="regression")
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        return BART(n_trees=10, n_chains=4, n_warmup=30, n_samples=60).run(data, seed=1), X


def test_f_diagnostics_per_row_and_a_chain_apart_is_seen():
    post, X = _posterior()
    m = post.mixing(X[:6])
    assert m["rhat"].shape == (6,) and m["ess"].shape == (6,)
    assert np.isfinite(m["rhat"]).all() and (m["rhat"] > 0.9).all() and (m["ess"] > 0).all()
    # shift every draw of chain 0 by one scaled unit (each tree 0's leaves + 1): its f sits apart from the
    # other chains', which split-R-hat must see at every row (draw-major order: draw s of chain c is s C + c)
    feature, cut, value = post._main
    shifted = value.clone()
    rows = post.chain_of == 0
    leaves = (feature[:, 0] == LEAF) & rows[:, None]
    shifted[:, 0][leaves] += 1.0
    post._main = (feature, cut, shifted)
    apart = post.mixing(X[:6])
    assert (apart["rhat"] > 1.5).all() and (apart["ess"] < m["ess"]).all()
    f = post.latent_draws(X[:6])
    assert torch.allclose(f[rows].mean(0) - f[~rows].mean(0), torch.full((6,), float(post.prior.scale), dtype=f.dtype), atol=0.6)
