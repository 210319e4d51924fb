"""Bad settings of the hard-tree samplers fail at construction, with the setting's name.

Before ``torchtree.core.validate`` served these samplers, counts went through ``int()``:
``n_particles=2.5`` quietly ran 2 particles, ``n_particles=True`` one, ``n_chains="4"``
four chains, and ``max_stages=0`` gave a run that never grew a tree.
"""
from __future__ import annotations

import numpy as np
import pytest

from torchtree import MCMC, Data, SMCSampler, TopDownSMC
from torchtree.core.validate import check_choice


@pytest.mark.parametrize("kwargs, name", [
    (dict(n_particles=0), "n_particles"),
    (dict(n_particles=2.5), "n_particles"),
    (dict(n_particles=True), "n_particles"),
    (dict(n_particles="8"), "n_particles"),
    (dict(n_islands=0), "n_islands"),
    (dict(n_particles=8, n_islands=3), "n_islands"),
    (dict(proposal="greedy"), "proposal"),
    (dict(expansion=["node"]), "expansion"),
    (dict(resampling="residual-ish"), "resampling"),
    (dict(redistribution="mpi"), "redistribution"),
    (dict(ess_threshold=1.5), "ess_threshold"),
    (dict(ess_threshold=float("nan")), "ess_threshold"),
    (dict(max_stages=0), "max_stages"),
    (dict(checkpoint_every=0), "checkpoint_every"),
])
def test_topdown_smc_refuses(kwargs, name):
    with pytest.raises(ValueError, match=name):
        TopDownSMC(**kwargs)


@pytest.mark.parametrize("kwargs, name", [
    (dict(n_chains=0), "n_chains"),
    (dict(n_chains="4"), "n_chains"),
    (dict(n_samples=1.5), "n_samples"),
    (dict(thin=0), "thin"),
    (dict(n_warmup=-1), "n_warmup"),
    (dict(init="data"), "init"),
    (dict(keep="last"), "keep"),
    (dict(engine="gpu"), "engine"),
    (dict(checkpoint_every=0), "checkpoint_every"),
    (dict(cut_proposal="uniform-ish"), "cut_proposal"),
])
def test_mcmc_refuses(kwargs, name):
    with pytest.raises(ValueError, match=name):
        MCMC(**kwargs)


@pytest.mark.parametrize("kwargs, name", [
    (dict(n_particles=0), "n_particles"),
    (dict(n_particles=3.5), "n_particles"),
    (dict(n_iterations=-1), "n_iterations"),
    (dict(n_iterations=1.5), "n_iterations"),
    (dict(resampling="stratified-ish"), "resampling"),
    (dict(ess_threshold=-0.1), "ess_threshold"),
    (dict(redistribution="ring"), "redistribution"),
    (dict(checkpoint_every=0), "checkpoint_every"),
])
def test_smc_sampler_refuses(kwargs, name):
    with pytest.raises(ValueError, match=name):
        SMCSampler(**kwargs)


def test_integral_values_are_accepted_as_ints():
    # 8.0 and numpy integers are counts a user may well pass (e.g. from a config file)
    smc = TopDownSMC(n_particles=8.0, n_islands=np.int64(2))
    assert (smc.n_particles, smc.n_islands) == (8, 2)
    assert type(smc.n_particles) is int and type(smc.n_islands) is int
    mcmc = MCMC(n_chains=np.int32(3), n_samples=10, thin=2)
    assert (mcmc.n_chains, mcmc.n_warmup) == (3, 20)  # default warm-up: n_samples * thin


def test_check_choice():
    assert check_choice("mode", "a", ("a", "b")) == "a"
    assert check_choice("key", 2, {1: "x", 2: "y"}) == 2  # a dict's keys are the choices
    with pytest.raises(ValueError, match=r"mode must be one of \('a', 'b'\), got 'c'"):
        check_choice("mode", "c", ("a", "b"))
    # values whose == is not a plain bool (arrays) or that cannot be hashed (lists)
    with pytest.raises(ValueError, match="mode"):
        check_choice("mode", np.array(["a", "b"]), ("a", "b"))
    with pytest.raises(ValueError, match="mode"):
        check_choice("mode", ["a"], ("a", "b"))


def test_predict_interval_options_are_checked():
    g = np.random.default_rng(0)
    X = g.random((40, 2))
    post = TopDownSMC(n_particles=8).run(Data(X, 3 * X[:, 0] + 0.1 * g.standard_normal(40), task="regression"), seed=0)
    lo, hi = post.predict_interval(X[:3], level=0.8, n_draws=200).T
    assert np.all(lo < hi)
    for kwargs, name in [(dict(level=1.0), "level"), (dict(level=float("nan")), "level"), (dict(n_draws=0), "n_draws")]:
        with pytest.raises(ValueError, match=name):
            post.predict_interval(X[:3], **kwargs)


def test_every_dtype_setting_takes_a_torch_dtype_or_its_name():
    """BART, NUTS and DCC read ``dtype`` alike (torchtree.core.validate.check_float_dtype): either spelling is
    accepted and stored as the config's own type; anything else is refused naming the setting."""
    import pytest
    import torch

    from torchtree.samplers.bart import BARTConfig
    from torchtree.samplers.dcc.config import DCCConfig
    from torchtree.samplers.nuts import NUTSConfig

    for spelling in (torch.float64, "float64", "torch.float64"):
        assert BARTConfig(dtype=spelling).dtype == "float64"
        assert DCCConfig(dtype=spelling).dtype is torch.float64 and NUTSConfig(dtype=spelling).dtype is torch.float64
    for cls in (BARTConfig, DCCConfig, NUTSConfig):
        with pytest.raises(ValueError, match="dtype must be float32 or float64"):
            cls(dtype="float16")
