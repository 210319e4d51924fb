"""Chains each stuck at its own value (no within-chain variance) have an infinite split-R-hat, as ArviZ says, and
the convergence warning names them; the R-hat was NaN, which the warning skips as "not applicable", so such
chains passed in silence unless their ESS was also off its limit."""
import numpy as np
import pytest
import torch

from torchtree.model.diagnostics import rhat, rhat_columns, unconverged, warn_if_unconverged
from torchtree.samplers.bart.mixing import diagnostics


def test_constant_chains_apart_give_inf_and_alike_give_nan():
    apart = np.repeat([[1.0], [2.0]], 10, axis=1)
    assert rhat(apart) == np.inf
    assert np.isnan(rhat(np.ones((2, 10))))
    jump = np.r_[np.zeros(5), np.ones(5)][None, :]  # one chain whose halves sit apart
    assert rhat(jump) == np.inf
    cols = rhat_columns(np.stack([apart, np.ones((2, 10)), np.random.default_rng(0).normal(size=(2, 10))], 2))
    assert cols[0] == np.inf and np.isnan(cols[1]) and np.isfinite(cols[2])
    pytest.importorskip("arviz")
    import arviz as az

    with np.errstate(divide="ignore"):
        assert az.rhat(apart, method="split") == np.inf


def test_the_warning_names_an_infinite_rhat():
    assert unconverged({"rhat_leaves": float("inf"), "rhat_sigma": float("nan"), "ess_leaves": 500.0}) == \
        ["rhat_leaves inf"]
    with pytest.warns(UserWarning, match=r"rhat_leaves inf"):
        warn_if_unconverged({"rhat_leaves": float("inf"), "ess_leaves": 500.0}, 10, "more")


def test_bart_summaries_keep_an_infinite_rhat():
    S, C, R = 12, 2, 10
    sig = torch.ones(S, C)
    leaves = torch.tensor([[3.0] * S, [5.0] * S])  # each chain's tree size constant, apart
    f = torch.zeros(S, C, R)
    f[:, 1] = 1.0  # every row's f stuck apart too
    d = diagnostics(sig, leaves, f.double(), np.arange(S), False, 1)
    assert d["rhat_leaves"] == np.inf and d["rhat_f"] == np.inf
