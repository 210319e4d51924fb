"""Soft trees on values float32 cannot hold (issue #20, the six DCC fuzz defects): a
regression target beyond 1e15 makes a float32 run switch to float64, and a test input
beyond float32's range is clamped finite before the cast instead of becoming inf / NaN."""
from __future__ import annotations

import numpy as np
import torch

from torchtree.model.soft_data import FLOAT32_TARGET_LIMIT, as_soft_data, run_dtype, scale_inputs
from torchtree.soft import DCC


def _reg(n=40, seed=0):
    g = np.random.default_rng(seed)
    X = g.normal(size=(n, 2))
    return X, X[:, 0] + 0.1 * g.normal(size=n)


def test_run_dtype_promotes_only_huge_regression_targets():
    y = torch.tensor([1.0, -3.0, 29.0], dtype=torch.float64)
    assert run_dtype(y, "regression", torch.float32) == torch.float32
    assert run_dtype(y * 1e20, "regression", torch.float32) == torch.float64
    assert run_dtype(torch.tensor([FLOAT32_TARGET_LIMIT], dtype=torch.float64), "regression", torch.float32) == torch.float32
    assert run_dtype(torch.tensor([0, 1]), "classification", torch.float32) == torch.float32
    X, y = _reg()
    assert as_soft_data(X, y).X.dtype == torch.float32
    y[3] = 1e39
    sd = as_soft_data(X, y)
    assert sd.X.dtype == torch.float64 and sd.y.dtype == torch.float64 and sd.y[3] == 1e39


def test_scale_inputs_clamps_beyond_float32_and_keeps_ordinary_values():
    lo, hi = torch.zeros(2, dtype=torch.float64), torch.ones(2, dtype=torch.float64)
    X = torch.tensor([[0.25, 1e39], [-1e39, 0.5], [2.0, -3.0]], dtype=torch.float64)
    got = scale_inputs(X, lo, hi, torch.float32)
    assert torch.isfinite(got).all()
    bound = torch.finfo(torch.float32).max * 1e-8
    assert got[0, 1] == torch.tensor(bound, dtype=torch.float32) and got[1, 0] == -got[0, 1]
    # values inside the bound are untouched (bit for bit what the cast gives)
    assert torch.equal(got[2], X[2].to(torch.float32)) and got[0, 0] == 0.25


def test_dcc_fits_a_1e39_target_and_predicts_finite_on_1e39_inputs():
    X, y = _reg()
    y[5] = 1e39
    post = DCC(n_iterations=1, n_initial=3, n_chains=2, n_samples=3, n_warmup=4, activation_threshold=1,
               max_depth=1, n_parallel=1).run((X, y), seed=0)
    # DCC samples the standardised target, which float32 holds: no promotion needed
    assert post.data.standardized and post.data.X.dtype == torch.float32
    assert np.isfinite(post.predict(X[:4])).all() and np.abs(post.predict(X[:4])).max() < 1e39
    Q = X[:4].copy()
    Q[1, 0] = 1e300
    assert np.isfinite(post.predict(Q)).all()
    Xc, yc = _reg(seed=1)
    post = DCC(n_iterations=1, n_initial=3, n_chains=2, n_samples=3, n_warmup=4, activation_threshold=1,
               max_depth=1, n_parallel=1).run((Xc, (yc > 0).astype(int)), seed=0)
    Q = Xc[:4].copy()
    Q[0, 1], Q[2, 0] = 1e39, -1e39
    p = post.predict_proba(Q)
    assert np.isfinite(p).all() and np.allclose(p.sum(1), 1.0)
