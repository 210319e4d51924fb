"""The same seed on CPU and on CUDA: what the counter-based random numbers promise.

Every random number of the hard-tree samplers is a hash of (seed, stage, particle or chain,
slot) in integer arithmetic, which is exact on both devices (torchtree/core/random.py). So a
run on CUDA takes the same discrete decisions as the same run on the CPU: the trees are
compared with ``torch.equal``. Floating-point reductions may be summed in another order on
the GPU, so log weights, evidence and predictions are compared to 1e-9 (float64) instead of
exactly. A flipped decision (a uniform within 1e-15 of an acceptance probability) would make
the trees differ; with these seeds none does, and one would show as a failure here.

The soft-tree samplers draw their noise from a ``torch.Generator`` on the run's device, so
CUDA and CPU runs are different draws of the same posterior: they are compared on the
quantities that do not depend on the draw (the potential and its gradient at the same point,
in tests/test_soft_trees.py) and, here, on running end to end and keeping their output on the
devices the user asked for.

All tests here are marked ``cuda`` and skipped without a CUDA device.
"""
from __future__ import annotations

import numpy as np
import pytest
import torch

from torchtree import MCMC, BayesianTreeClassifier, BayesianTreeRegressor, Data, SMCSampler, TopDownSMC, set_memory_budget

pytestmark = [pytest.mark.cuda, pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")]

TOL = dict(rtol=1e-9, atol=1e-9)


def _xor(n=300, seed=0, regression=False):
    rng = np.random.default_rng(seed)
    X = rng.normal(size=(n, 4))
    if regression:
        y = np.where(X[:, 0] > 0, 1.0, -1.0) + 0.5 * (X[:, 1] > 0.3) + 0.2 * rng.normal(size=n)
    else:
        y = ((X[:, 0] * X[:, 1] > 0) ^ (rng.random(n) < 0.1)).astype(int)
    return X, y, rng.normal(size=(80, 4))


def _same_posterior(cpu, gpu, Xq):
    """Trees equal, weights / evidence / predictions to float64 rounding."""
    a, b = cpu.trees.as_dict(), gpu.trees.as_dict()
    assert a.keys() == b.keys()
    for k in a:
        assert b[k].device.type == "cuda", k
        if a[k].is_floating_point():  # leaf statistics: sums, in the device's order
            torch.testing.assert_close(b[k].cpu(), a[k], rtol=1e-9, atol=1e-9)
        else:
            assert torch.equal(a[k], b[k].cpu()), f"tree field {k} differs between CPU and CUDA"
    torch.testing.assert_close(gpu.log_weights.cpu(), cpu.log_weights, **TOL)
    if cpu.log_evidence is not None:
        assert abs(gpu.log_evidence - cpu.log_evidence) <= 1e-9 * max(1.0, abs(cpu.log_evidence))
    pred = "predict_proba" if cpu.task == "classification" else "predict"
    np.testing.assert_allclose(np.asarray(getattr(gpu, pred)(Xq)), np.asarray(getattr(cpu, pred)(Xq)), rtol=1e-9, atol=1e-12)


@pytest.mark.parametrize("kw", [dict(proposal="prior", n_islands=2), dict(proposal="optimal", expansion="layer"),
                                dict(proposal="empirical", resampling="systematic")])
def test_topdown_smc_same_trees_on_cuda(kw):
    X, y, Xq = _xor()
    cpu = TopDownSMC(n_particles=128, **kw).run(Data(X, y), seed=3)
    gpu = TopDownSMC(n_particles=128, device="cuda", **kw).run(Data(X, y), seed=3)
    _same_posterior(cpu, gpu, Xq)


def test_topdown_smc_regression_same_trees_on_cuda():
    X, y, Xq = _xor(regression=True)
    cpu = TopDownSMC(n_particles=64).run(Data(X, y, task="regression"), seed=1)
    gpu = TopDownSMC(n_particles=64, device="cuda").run(Data(X, y, task="regression"), seed=1)
    _same_posterior(cpu, gpu, Xq)


def test_keyed_uniforms_same_bits_on_cuda():
    """The CPU's compiled keyed uniforms and CUDA's tensor hash give the same numbers (the counter-based
    random numbers that make a CUDA run take the CPU run's decisions)."""
    from torchtree.core.random import keyed_uniform, keyed_uniforms

    idx = torch.tensor([0, 1, 7, 2**40 + 3, -5, 2**63 - 1])
    slot = torch.arange(6)[:, None].expand(6, 6)
    for dev_slot in (3, slot):
        cpu = keyed_uniforms(2**61 + 9, [0, 5, 2**33], idx, dev_slot)
        gpu = keyed_uniforms(2**61 + 9, [0, 5, 2**33], idx.cuda(), dev_slot.cuda() if torch.is_tensor(dev_slot) else dev_slot)
        assert torch.equal(cpu, gpu.cpu())
    assert torch.equal(keyed_uniform(4, 2, idx, dtype=torch.float32), keyed_uniform(4, 2, idx.cuda(), dtype=torch.float32).cpu())


def test_pilot_islands_same_evidences_on_cuda():
    """The evidence pilots' islands (one run, each island its own prior and leaf prior) give the CPU's evidences."""
    from torchtree.model.likelihoods import DirichletMultinomial
    from torchtree.model.priors import ChipmanPrior
    from torchtree.samplers.topdown.sampler import variant_log_evidences

    X, y, _ = _xor()
    variants = [(ChipmanPrior(0.95, b), DirichletMultinomial(a)) for a in (0.5, 5.0) for b in (0.5, 2.0)]
    cpu = variant_log_evidences(Data(X, y), variants, 50, 2)
    gpu = variant_log_evidences(Data(X, y), variants, 50, 2, device="cuda")
    np.testing.assert_allclose(gpu, cpu, rtol=1e-12, atol=0)


def test_mcmc_batched_same_chains_on_cuda():
    X, y, Xq = _xor()
    kw = dict(n_chains=3, n_samples=60, n_warmup=40, engine="batched")
    cpu = MCMC(**kw).run(Data(X, y), seed=5)
    gpu = MCMC(device="cuda", **kw).run(Data(X, y), seed=5)
    _same_posterior(cpu, gpu, Xq)
    assert cpu.info["accept/all"] == gpu.info["accept/all"]


def test_mcmc_topdown_starts_same_chains_on_cuda():
    """Chains started at top-down SMC draws (a top-down run, then the move caches filled on the device)."""
    X, y, Xq = _xor()
    kw = dict(n_chains=3, n_samples=30, n_warmup=20, engine="batched", init="topdown")
    cpu = MCMC(**kw).run(Data(X, y), seed=5)
    gpu = MCMC(device="cuda", **kw).run(Data(X, y), seed=5)
    _same_posterior(cpu, gpu, Xq)


def test_smc_moves_same_particles_on_cuda():
    X, y, Xq = _xor()
    kw = dict(n_particles=64, n_iterations=5)
    cpu = SMCSampler(**kw).run(Data(X, y), seed=2)
    gpu = SMCSampler(device="cuda", **kw).run(Data(X, y), seed=2)
    _same_posterior(cpu, gpu, Xq)


@pytest.mark.parametrize("method", ["smc", "mcmc", "smc-moves"])
def test_estimator_on_cuda_matches_cpu(method):
    """``device="cuda"`` with numpy input: the fit runs on the GPU, predictions come back as numpy
    and equal the CPU fit's (hyper="fixed": the evidence pilots are compared in the tests above)."""
    X, y, Xq = _xor()
    kw = dict(method=method, random_state=0, hyper="fixed")
    if method == "mcmc":
        kw.update(n_chains=2, n_samples=40)
    elif method == "smc-moves":
        kw.update(n_particles=32, n_iterations=3)
    else:
        kw.update(n_particles=64)
    cpu = BayesianTreeClassifier(**kw).fit(X, y)
    gpu = BayesianTreeClassifier(device="cuda", **kw).fit(X, y)
    p_cpu, p_gpu = cpu.predict_proba(Xq), gpu.predict_proba(Xq)
    assert isinstance(p_gpu, np.ndarray)
    np.testing.assert_allclose(p_gpu, p_cpu, rtol=1e-9, atol=1e-12)
    assert np.array_equal(gpu.predict(Xq), cpu.predict(Xq))


def test_regressor_intervals_on_cuda_match_cpu():
    X, y, Xq = _xor(regression=True)
    kw = dict(method="smc", n_particles=64, random_state=0, hyper="fixed")
    cpu = BayesianTreeRegressor(**kw).fit(X, y)
    gpu = BayesianTreeRegressor(device="cuda", **kw).fit(X, y)
    for a, b in zip(cpu.predict_interval(Xq, 0.9), gpu.predict_interval(Xq, 0.9)):
        np.testing.assert_allclose(np.asarray(b), np.asarray(a), rtol=1e-7, atol=1e-7)


def test_chunked_prediction_on_cuda_equals_one_pass():
    """A tiny memory budget splits prediction into many chunks on the GPU; the answer is the same."""
    X, y, _ = _xor()
    Xq = np.random.default_rng(9).normal(size=(5000, 4))
    post = TopDownSMC(n_particles=200, device="cuda").run(Data(X, y), seed=0)
    whole = np.asarray(post.predict_proba(Xq))
    old = set_memory_budget(2**20)
    try:
        chunked = np.asarray(post.predict_proba(Xq))
    finally:
        set_memory_budget(old)
    np.testing.assert_allclose(chunked, whole, rtol=1e-12, atol=1e-12)


def test_dcc_runs_on_cuda():
    """DCC end to end on the GPU: evidence finite, predictions on the query rows. (Its evidence
    accumulator lives on the CPU by design; CUDA weights used to be added to it without a move.)"""
    from torchtree import DCC

    X, y, Xq = _xor(n=200)
    post = DCC(n_iterations=3, n_initial=5, n_chains=4, n_samples=10, n_warmup=20, n_parallel=2,
               activation_threshold=1, max_depth=2, device="cuda").run((X, y), seed=0)
    assert post.log_evidence is not None and np.isfinite(post.log_evidence)
    p = np.asarray(post.predict_proba(Xq))
    assert p.shape == (80, 2) and np.allclose(p.sum(1), 1.0)
    assert post.accuracy(X, y) > 0.6


@pytest.mark.parametrize("bart_sampler, compile", [("mcmc", "auto"), ("mcmc", "off"), ("pg", "auto")])
def test_bart_runs_on_cuda_close_to_cpu(bart_sampler, compile):
    """BART's residual sums are float32 adds in any order on CUDA (the kernel's atomics, which "auto" runs for
    backfitting MCMC, or the torch code's index_adds), so a CUDA run is the same chain only until a decision
    flips; compared here in what it predicts. (Particle Gibbs runs the torch code: a smaller run.)"""
    from torchtree import BART

    rng = np.random.default_rng(0)
    X = rng.uniform(size=(400, 5))
    f = 10 * np.sin(np.pi * X[:, 0] * X[:, 1]) + 10 * X[:, 3]
    y = f + rng.normal(size=400)
    kw = dict(n_trees=30, n_chains=4, n_warmup=40, n_samples=40, bart_sampler=bart_sampler, compile=compile)
    if bart_sampler == "pg":  # CPU RMSE 0.59-0.60 (seeds 0, 1) against 0.49-0.51 at 30 trees x 80 sweeps
        kw.update(n_trees=15, n_warmup=20, n_samples=20)
    cpu = BART(**kw).run(Data(X, y, task="regression"), seed=0)
    gpu = BART(**kw, device="cuda").run(Data(X, y, task="regression"), seed=0)
    assert gpu.value.device.type == "cuda"
    rm = lambda p: float(np.sqrt(np.mean((p.predict(X) - f) ** 2)))  # noqa: E731
    assert rm(gpu) < 1.0 and abs(rm(gpu) - rm(cpu)) < 0.3


@pytest.mark.parametrize("task", ["regression", "classification"])
def test_bart_graph_sweeps_match_the_eager_sweeps_on_cuda(task, monkeypatch):
    """``compile="graph"``: the sweeps recorded once as a CUDA graph and replayed make the same moves as the
    eager sweeps (the values and sigma to float32 rounding: the residual sums are atomic adds in either).
    The recorded update is the eager one here (torch.compile's build would take most of this file's time;
    on torch 2.11 Inductor failed to compile it on an H200: benchmarks/results/cuda_h200.txt), and a recording that
    fell back would warn: an error here."""
    import warnings

    from torchtree import BART
    from torchtree.samplers.bart import sampler as bart_module
    from torchtree.steps.bart_moves import tree_update

    monkeypatch.setitem(bart_module._COMPILED, "fn", lambda *args: tree_update(*args))
    rng = np.random.default_rng(1)
    X = rng.uniform(size=(300, 5))
    y = 4 * np.sin(3 * X[:, 0]) + 2 * X[:, 1] + rng.normal(size=300)
    if task == "classification":
        y = (y > np.median(y)).astype(int)
    kw = dict(n_trees=20, n_chains=4, n_warmup=15, n_samples=15, device="cuda")
    eager = BART(**kw, compile="off").run(Data(X, y, task=task), seed=2)
    with warnings.catch_warnings():
        warnings.simplefilter("error", RuntimeWarning)
        graphed = BART(**kw, compile="graph").run(Data(X, y, task=task), seed=2)
    assert torch.equal(graphed.feature.cpu(), eager.feature.cpu()) and torch.equal(graphed.cut.cpu(), eager.cut.cpu())
    torch.testing.assert_close(graphed.value.cpu(), eager.value.cpu(), rtol=1e-4, atol=1e-5)
    if task == "regression":
        torch.testing.assert_close(graphed.sigma.cpu(), eager.sigma.cpu(), rtol=1e-4, atol=1e-6)


@pytest.mark.parametrize("n_gfr", [0, 3])
@pytest.mark.parametrize("task", ["regression", "classification"])
def test_bart_native_runs_on_cuda_match_the_cpu_kernels(task, n_gfr):
    """``compile="native"`` on CUDA (one launch per sweep, kernels/csrc/bart_cuda.cu), from single leaves or after
    grow-from-root sweeps, against the CPU kernels' run, float64: the same trees and move counts; leaf values and
    sigma to 1e-9 (the sums add in the threads' order, the leaves' normals come from CUDA's normcdfinv)."""
    from torchtree import BART
    from torchtree.kernels import native

    assert native.cuda_available(), "the CUDA kernels did not build"
    rng = np.random.default_rng(3)
    X = rng.uniform(size=(500, 6))
    y = 10 * np.sin(np.pi * X[:, 0] * X[:, 1]) + 20 * (X[:, 2] - .5) ** 2 + 10 * X[:, 3] + rng.normal(size=500)
    if task == "classification":
        y = np.digitize(y, np.quantile(y, [0.33, 0.67]))  # three classes: a forest per class utility
    kw = dict(n_trees=20, n_chains=4, n_warmup=20, n_samples=20, n_gfr=n_gfr, dtype="float64", compile="native")
    cpu = BART(**kw).run(Data(X, y, task=task), seed=4)
    gpu = BART(**kw, device="cuda").run(Data(X, y, task=task), seed=4)
    assert gpu.value.device.type == "cuda" and gpu.info["n_gfr"] == cpu.info["n_gfr"] == n_gfr
    assert torch.equal(gpu.feature.cpu(), cpu.feature) and torch.equal(gpu.cut.cpu(), cpu.cut)
    assert all(gpu.info[k] == cpu.info[k] for k in cpu.info if k.startswith("accept/"))
    torch.testing.assert_close(gpu.value.cpu(), cpu.value, **TOL)
    torch.testing.assert_close(gpu.sigma.cpu(), cpu.sigma, **TOL)


@pytest.mark.parametrize("compile", ["off", "native"])
def test_bart_sweeps_do_not_synchronise_on_cuda(monkeypatch, compile):
    """Every BART sweep on CUDA runs without a host synchronisation (torch's sync debug mode set to
    raise), the kept draws' trimming moved out of the sweeps (it reads once per group)."""
    from torchtree import BART
    import torchtree.samplers.bart.sampler as bs

    rng = np.random.default_rng(0)
    X = rng.uniform(size=(300, 5))
    y = 10 * X[:, 0] + rng.normal(size=300)
    step = bs.BART.step

    def strict(self, state, ctx):
        torch.cuda.synchronize()
        torch.cuda.set_sync_debug_mode("error")
        try:
            return step(self, state, ctx)
        finally:
            torch.cuda.set_sync_debug_mode("default")

    monkeypatch.setattr(bs, "COMPACT_EVERY", 10**9)
    monkeypatch.setattr(bs.BART, "step", strict)
    for task, yy in (("regression", y), ("classification", (y > 5).astype(int))):
        post = BART(n_trees=20, n_chains=4, n_warmup=10, n_samples=10, device="cuda", compile=compile).run(
            Data(X, yy, task=task), seed=0)
        assert post.value.device.type == "cuda"


def test_coded_tables_on_cuda():
    """Missing values and a categorical column: top-down SMC draws the same trees on CUDA as on the CPU,
    and BART runs there (its coded grid and group-wise feature draw on the device)."""
    import pandas as pd

    from torchtree import BART

    rng = np.random.default_rng(0)
    n = 300
    x = rng.normal(size=n)
    c = rng.choice(list("uvw"), n)
    y = ((x > 0) ^ (c == "v")).astype(int)
    x[rng.random(n) < 0.2] = np.nan
    frame = pd.DataFrame({"x": x, "c": c, "z": rng.normal(size=n)})
    q = pd.DataFrame({"x": [np.nan, 0.5], "c": ["v", "zz"], "z": [0.0, 1.0]})
    cpu = TopDownSMC(n_particles=64).run(Data(frame, y), seed=3)
    gpu = TopDownSMC(n_particles=64, device="cuda").run(Data(frame, y), seed=3)
    np.testing.assert_allclose(np.asarray(gpu.predict_proba(q)), np.asarray(cpu.predict_proba(q)), rtol=1e-9)
    post = BART(n_trees=20, n_chains=2, n_warmup=30, n_samples=30, device="cuda").run(Data(frame, y), seed=0)
    assert post.accuracy(frame, y) > 0.7
