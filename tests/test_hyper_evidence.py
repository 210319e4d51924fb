"""Hyperparameters by evidence (``hyper="evidence"``, torchtree.samplers.tuning.evidence).

The search is a grid of top-down SMC pilot runs with one seed. Tested against exact answers:
on tiny data the evidence of every grid point is computed exactly by enumeration
(``torchtree.testing.exact_log_evidence``) and the pilots' estimates agree with it within
their Monte Carlo error (0.5 nats with 2000 particles on 12 rows, seeded), so the chosen value
is the exact type-II maximum-likelihood one; the estimator then fits with the chosen values,
keeps the ones the user set, and ``hyper="fixed"`` is the old behaviour.
"""
from __future__ import annotations

import os

import numpy as np
import pytest
import torch

from torchtree import BayesianTreeClassifier, BayesianTreeRegressor, TopDownSMC
from torchtree.model.data import Data
from torchtree.model.likelihoods import DirichletMultinomial, NormalInverseGamma
from torchtree.model.priors import ChipmanPrior
from torchtree.samplers.tuning.evidence import choose_by_evidence
from torchtree.testing import exact_log_evidence


def _tiny(task):
    rng = np.random.default_rng(4)
    X = np.round(rng.uniform(0, 1, size=(12, 2)), 1)
    if task == "classification":
        return Data(X, (X[:, 0] > 0.5).astype(int))
    return Data(X, np.where(X[:, 0] > 0.5, 3.0, 0.0) + 0.1 * rng.normal(size=12), task="regression")


@pytest.mark.parametrize("task", ["classification", "regression"])
def test_pilot_curve_matches_exact_evidence_and_picks_its_maximum(task):
    data = _tiny(task)
    grid = (0.5, 2.0, 20.0) if task == "classification" else (0.003, 0.3, 3.0)
    kw = dict(alpha_grid=grid) if task == "classification" else dict(noise_grid=tuple(g / float(data.y.var()) for g in grid))
    s = choose_by_evidence(data, fixed={}, n_particles=2000, seed=1, beta_split_grid=(0.5, 2.0), **kw)
    name = "alpha" if task == "classification" else "b0"
    exact = []
    for v, lz in s.curves[name]:
        lik = DirichletMultinomial(v) if task == "classification" else NormalInverseGamma(
            mu0=float(data.y.double().mean()), kappa0=0.1, a0=2.0, b0=v)
        ez = exact_log_evidence(data, ChipmanPrior(0.95, 0.5), lik)
        assert lz == pytest.approx(ez, abs=0.5)
        exact.append(ez)
    assert s.chosen[name] == s.curves[name][int(np.argmax(exact))][0]
    # the split prior's curve is searched with the chosen leaf prior, and its maximum is taken
    betas = s.curves["beta_split"]
    assert s.chosen["beta_split"] == max(betas, key=lambda p: p[1])[0]


def test_pilots_share_their_random_numbers():
    data = _tiny("classification")
    s = choose_by_evidence(data, fixed={}, n_particles=50, seed=3, alpha_grid=(1.0, 5.0), beta_split_grid=(0.5,))
    for v, lz in s.curves["alpha"]:
        direct = TopDownSMC(ChipmanPrior(0.95, 0.5), DirichletMultinomial(v), n_particles=50).run(data, seed=3)
        assert lz == direct.log_evidence


def test_estimator_uses_the_chosen_values_and_keeps_the_users():
    rng = np.random.default_rng(0)
    X = rng.normal(size=(200, 3))
    y = 2.0 * (X[:, 0] > 0) + 0.05 * rng.normal(size=200)  # little noise: a small b0 has more evidence
    reg = BayesianTreeRegressor(n_particles=50).fit(X, y)
    chosen = reg.hyper_search_.chosen
    assert set(chosen) == {"b0", "beta_split"}
    assert reg.posterior_.likelihood.b0 == chosen["b0"]
    assert reg.posterior_.info["hyper_search"]["chosen"] == chosen
    assert "evidence: b0=" in repr(reg.posterior_.summary())
    assert chosen["b0"] < 0.5 * float(np.var(y, ddof=1))  # below the fixed default's noise scale
    mine = BayesianTreeRegressor(n_particles=50, b0=1.0, beta_split=1.0).fit(X, y)
    assert mine.hyper_search_.chosen == {}
    assert mine.posterior_.likelihood.b0 == 1.0
    fixed = BayesianTreeRegressor(n_particles=50, hyper="fixed").fit(X, y)
    assert fixed.hyper_search_ is None
    assert fixed.posterior_.likelihood.b0 == pytest.approx(0.5 * float(np.var(y, ddof=1)))
    with pytest.raises(ValueError, match="hyper must be one of"):
        BayesianTreeClassifier(hyper="best").fit(X, (y > 1).astype(int))


def test_methods_without_the_estimators_prior_objects_are_not_searched():
    X = np.random.default_rng(1).normal(size=(60, 2))
    y = (X[:, 0] > 0).astype(int)
    clf = BayesianTreeClassifier("mcmc", n_samples=20, alpha=3.0).fit(X, y)
    assert clf.hyper_search_.chosen.keys() == {"beta_split"}  # alpha was given
    assert clf.posterior_.likelihood.alpha == 3.0


def test_evidence_curves_reach_tensorboard(tmp_path):
    """Each searched setting's curve is written as scalars (step i = grid point i) with the grid as
    text, next to the sampler's own tags; the values are the search's."""
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    from torchtree import TensorBoardMonitor

    rng = np.random.default_rng(1)
    X = rng.normal(size=(150, 3))
    y = (X[:, 0] > 0).astype(int)
    clf = BayesianTreeClassifier(n_particles=30, monitor=[TensorBoardMonitor(tmp_path)]).fit(X, y)
    acc = EventAccumulator(str(tmp_path), size_guidance={"scalars": 0, "tensors": 0})
    acc.Reload()
    for name, curve in clf.hyper_search_.curves.items():
        tag = f"hyper/{name}_log_evidence"
        got = [(e.step, e.value) for e in acc.Scalars(tag)]
        assert got == [(i, pytest.approx(lz, rel=1e-6)) for i, (_, lz) in enumerate(curve)]
    assert set(clf.hyper_search_.curves) == {"alpha", "beta_split"}
    # the run and its curves in one event file (the writer used to be closed after the run and
    # reopened per curve: three files), readable before the monitor is closed
    assert len([f for f in os.listdir(tmp_path) if f.startswith("events.out.tfevents")]) == 1
    assert {"log_evidence", "hyper/alpha_log_evidence"} <= set(acc.Tags()["scalars"])


@pytest.mark.parametrize("task", ["classification", "regression"])
def test_one_run_of_pilot_islands_equals_the_pilots_run_alone(task):
    """``variant_log_evidences`` runs the pilots as the islands of one run, each island with the random
    numbers of its pilot alone: the evidences equal the separate runs', bit for bit with class counts; with
    float targets a stage's cut sums run over all its nodes' lists, so to rounding (1e-10 relative)."""
    from torchtree.samplers.tuning.evidence import _pilot_evidence
    from torchtree.samplers.topdown.sampler import variant_log_evidences

    rng = np.random.default_rng(5)
    X = rng.normal(size=(300, 4))
    if task == "classification":
        data = Data(X, ((X[:, 0] * X[:, 1] > 0) ^ (rng.random(300) < 0.2)).astype(int) + (X[:, 2] > 1))
        variants = [(ChipmanPrior(0.95, b), DirichletMultinomial(a)) for a in (0.5, 2.0, 10.0) for b in (0.5, 2.0)]
    else:
        data = Data(X, np.sin(2 * X[:, 0]) + 0.3 * rng.normal(size=300), task="regression")
        variants = [(ChipmanPrior(0.95, 0.5), NormalInverseGamma(mu0=0.0, kappa0=0.1, a0=2.0, b0=b)) for b in (0.1, 1.0, 5.0)]
    for proposal in ("prior", "empirical"):
        alone = [_pilot_evidence_with(data, p, lik, proposal) for p, lik in variants]
        together = variant_log_evidences(data, variants, 40, 7, proposal=proposal)
        if task == "classification":
            assert together == alone, proposal
        else:
            np.testing.assert_allclose(together, alone, rtol=1e-10, atol=0)
        assert len(set(alone)) == len(alone)  # the variants do differ


def _pilot_evidence_with(data, prior, lik, proposal):
    return float(TopDownSMC(prior, lik, n_particles=40, proposal=proposal).run(data, seed=7).log_evidence)


def test_pilot_islands_refuse_the_optimal_proposal():
    from torchtree.samplers.topdown.sampler import variant_log_evidences

    data = _tiny("classification")
    with pytest.raises(ValueError, match="prior or empirical"):
        variant_log_evidences(data, [(ChipmanPrior(0.95, 0.5), DirichletMultinomial(1.0))] * 2, 10, 0,
                              proposal="optimal")


def test_the_command_line_reports_what_the_evidence_chose(tmp_path, capsys):
    from pathlib import Path

    from torchtree.cli import main

    data = str(Path(__file__).resolve().parents[1] / "data" / "iris.csv.gz")
    assert main(["fit", data, "--n-particles", "60", "--out", str(tmp_path / "p.pt"), "-q"]) == 0
    rows = dict(line.split(None, 1) for line in capsys.readouterr().out.splitlines() if line.startswith("hyperparameters"))
    assert set(rows) == {"hyperparameters"} and rows["hyperparameters"].startswith("evidence: alpha=")
    assert "beta_split=" in rows["hyperparameters"]
    assert main(["fit", data, "--n-particles", "60", "--hyper", "fixed", "--out", str(tmp_path / "p.pt"), "-q"]) == 0
    rows = [line for line in capsys.readouterr().out.splitlines() if line.startswith("hyperparameters")]
    assert rows == ["hyperparameters  fixed: beta_split=0.5, alpha=5"]  # the options' documented values, as used


def test_evidence_curves_are_written_on_rank_zero_only(monkeypatch):
    """On a multi-rank run every rank searches, but only rank 0 writes the curves (as during the run),
    unless the monitor was created with ``all_ranks=True``; a backend given by name takes the rank from
    the launcher's variables."""
    from types import SimpleNamespace

    from torchtree.estimator_base import _process_rank, _write_curves

    class Curves:
        def __init__(self, all_ranks=False):
            self.all_ranks, self.curves = all_ranks, []

        def on_start(self, *a):
            pass

        on_step = on_end = on_start

        def add_curve(self, tag, xs, ys):
            self.curves.append(tag)

    search = SimpleNamespace(curves={"alpha": [(1.0, -3.0), (2.0, -2.5)]})
    for rank, all_ranks, written in ((None, False, 1), (0, False, 1), (1, False, 0), (1, True, 1)):
        m = Curves(all_ranks)
        _write_curves([m], search, rank)
        assert len(m.curves) == written, (rank, all_ranks)
    assert _process_rank(None) is None and _process_rank(SimpleNamespace(rank=3)) == 3
    monkeypatch.setenv("RANK", "2")
    assert _process_rank("gloo") == 2
    assert _process_rank("local") is None  # independent runs under a launcher: each writes its own curves
