"""Multi-rank MCMC: chains split over ranks, the same posterior as one process.

Every rank runs ``n_chains / W`` chains keyed by their global chain indices and returns the
global posterior; with the same seed it equals the one-process run's bit for bit (the
kept draws are gathered into the one-process order). Thread ranks
(``_dist_workers/thread_backend.py``) keep the test in-process; real gloo ranks of the same
code path are covered for the other samplers in test_topdown_dist / test_smc_moves_dist.
"""
from __future__ import annotations

import sys
from pathlib import Path

import numpy as np
import pytest
import torch

from torchtree import MCMC, Data, TraceMonitor
from torchtree.model.likelihoods import NormalInverseGamma

sys.path.insert(0, str(Path(__file__).resolve().parent / "_dist_workers"))
from thread_backend import run_threads  # noqa: E402


def _data(task="classification"):
    rng = np.random.default_rng(7)
    X = rng.normal(size=(80, 3))
    X[:, 2] = np.round(X[:, 2], 1)
    if task == "classification":
        return Data(X, ((X[:, 0] - X[:, 2] > 0) ^ (rng.random(80) < 0.1)).astype(int))
    return Data(X, X[:, 0] * 2 + (X[:, 1] > 0) + 0.3 * rng.normal(size=80), task="regression")


@pytest.mark.parametrize("world,task,init", [(2, "classification", "root"), (4, "classification", "prior"),
                                             (2, "regression", "prior")])
def test_ranks_equal_one_process(world, task, init):
    data = _data(task)
    kw = dict(n_chains=4, n_samples=30, n_warmup=20, init=init, engine="batched")
    ref = MCMC(**kw).run(data, seed=3)
    outs = run_threads(world, lambda b: MCMC(**kw, backend=b).run(data, seed=3), timeout=120)
    Xq = torch.as_tensor(data.X[:25])
    for post in outs:
        assert post.trees.n_trees == ref.trees.n_trees and post.n_particles == ref.n_particles
        assert np.array_equal(post.predict(Xq), ref.predict(Xq))
        assert np.array_equal(post.info["trace"]["n_leaves"], ref.info["trace"]["n_leaves"])
        assert np.array_equal(post.info["trace"]["log_posterior"], ref.info["trace"]["log_posterior"])
        assert post.info["accept/all"] == ref.info["accept/all"]
        assert post.info["world_size"] == world


def test_monitor_on_rank_zero_and_clear_errors():
    data = _data()
    mons = [TraceMonitor(), TraceMonitor()]
    run_threads(2, lambda b: MCMC(n_chains=2, n_samples=20, monitor_every=10, backend=b).run(
        data, seed=None, monitor=mons[b.rank]), timeout=120)
    assert mons[0].trace["mcmc/accept"] and not mons[1].trace
    with pytest.raises(ValueError, match="divisible by the number of ranks"):
        run_threads(2, lambda b: MCMC(n_chains=3, n_samples=5, backend=b).run(data, seed=0), timeout=60)
    with pytest.raises(ValueError, match="engine='host'"):
        run_threads(2, lambda b: MCMC(n_chains=2, n_samples=5, engine="host", backend=b).run(data, seed=0),
                    timeout=60)


def test_unconverged_chains_warn_and_converged_ones_do_not():
    """A short run from the root on separable data is far from converged (R-hat / ESS off
    their limits): a UserWarning names the diagnostics. Prior-only chains of one-split data
    mix fast: no warning."""
    data = _data()
    with pytest.warns(UserWarning, match="unconverged"):
        MCMC(n_chains=2, n_samples=30, n_warmup=0).run(data, seed=0)
    X = np.linspace(0, 1, 4)[:, None]
    flat = Data(X, (X[:, 0] > 0.5).astype(int))
    import warnings as _w

    with _w.catch_warnings():
        _w.simplefilter("error", UserWarning)
        post = MCMC(n_chains=4, n_samples=2000, use_likelihood=False, prior="poisson").run(flat, seed=0)
    assert post.info["rhat_leaves"] <= 1.1 and post.info["ess_leaves"] >= 100
