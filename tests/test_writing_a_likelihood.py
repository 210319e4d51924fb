"""The leaf likelihood of examples/writing_a_likelihood.py (docs/writing_a_likelihood.md): it meets the
contract, equals the built-in Dirichlet-multinomial at equal weights, runs through every hard-tree sampler
and the estimator, and its posteriors save and load; the page's code is the example's."""
from __future__ import annotations

import importlib.util
import re
import sys
import warnings
from pathlib import Path

import numpy as np
import pytest
import torch

from torchtree import (MCMC, BayesianTreeClassifier, ConvergenceWarning, Data, DirichletMultinomial, SMCSampler,
                       TopDownSMC, load_posterior)
from torchtree.model.likelihood_protocol import LIKELIHOODS
from torchtree.testing import check_likelihood

ROOT = Path(__file__).resolve().parents[1]
EXAMPLE = ROOT / "examples" / "writing_a_likelihood.py"
_spec = importlib.util.spec_from_file_location("writing_a_likelihood", EXAMPLE)
toy = importlib.util.module_from_spec(_spec)
sys.modules["writing_a_likelihood"] = toy  # pickles find the class by its module
_spec.loader.exec_module(toy)  # registers WeightedDirichletMultinomial
Weighted = toy.WeightedDirichletMultinomial


def _data(n=60, seed=0):
    g = torch.Generator().manual_seed(seed)
    X = torch.rand(n, 3, generator=g)
    y = ((X[:, 1] > 0.4) ^ (torch.rand(n, generator=g) < 0.1)).long()
    return X, y


def test_the_page_shows_the_example_code():
    page = (ROOT / "docs" / "writing_a_likelihood.md").read_text()
    blocks = re.findall(r"```python\n(.*?)```", page, re.S)
    cls = next(b for b in blocks if b.startswith("@register_likelihood"))
    assert cls in EXAMPLE.read_text(), "docs/writing_a_likelihood.md's class differs from the example's"


def test_it_meets_the_contract():
    assert LIKELIHOODS.get("WeightedDirichletMultinomial") is Weighted
    check_likelihood(Weighted([1.0, 3.0]), n_classes=2)
    check_likelihood(Weighted([0.2, 0.3, 0.1, 0.4], alpha=0.7), n_classes=4)
    X, y = _data()
    check_likelihood(Weighted([0.5, 0.5]), Data(X, y))
    with pytest.raises(AssertionError, match=r"WeightedDirichletMultinomial\.n_stats raised ValueError: 2 class "
                                             r"weights for data with 3 classes"):
        check_likelihood(Weighted([1.0, 1.0]))


@pytest.mark.parametrize("K, alpha", [(2, 1.0), (3, 5.0), (5, 0.3)])
def test_equal_weights_are_the_builtin_dirichlet_multinomial(K, alpha):
    counts = torch.randint(0, 9, (40, K), generator=torch.Generator().manual_seed(K)).float()
    ours, builtin = Weighted([1.0] * K, alpha), DirichletMultinomial(alpha)
    assert torch.allclose(ours.log_marginal(counts), builtin.log_marginal(counts), rtol=1e-12, atol=1e-10)
    assert torch.allclose(ours.predictive_table(counts).float(), builtin.predictive_table(counts), atol=1e-6)


def test_every_hard_tree_sampler_and_the_estimator_run_it(tmp_path):
    X, y = _data()
    lik = Weighted([0.6, 0.4], alpha=3.0)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", ConvergenceWarning)  # short chains
        posts = [TopDownSMC(likelihood=lik, n_particles=32).run((X, y), seed=0),
                 MCMC(likelihood=lik, n_chains=2, n_warmup=20, n_samples=20).run((X, y), seed=0),
                 MCMC(likelihood=lik, n_chains=2, n_warmup=20, n_samples=20, engine="batched",
                      cut_proposal="informed").run((X, y), seed=0),
                 SMCSampler(likelihood=lik, n_particles=16, n_iterations=3).run((X, y), seed=0)]
    for post in posts:
        post.trees.validate(Data(X, y), lik)
        p = post.predict_proba(X)
        assert p.shape == (60, 2) and np.allclose(p.sum(1), 1.0)
        path = tmp_path / "post.pt"
        post.save(path)
        back = load_posterior(path)
        assert type(back.likelihood) is Weighted and back.likelihood.config() == lik.config()
        assert np.array_equal(back.predict_proba(X), p)
    clf = BayesianTreeClassifier("smc", likelihood=lik, n_particles=16, verbose=0).fit(X.numpy(), y.numpy())
    assert clf.posterior_.likelihood is lik and clf.score(X.numpy(), y.numpy()) > 0.7
    with pytest.raises(ValueError, match="3 class weights for data with 2 classes"):
        TopDownSMC(likelihood=Weighted([1.0, 1.0, 1.0]), n_particles=8).run((X, y), seed=0)


def test_the_script_runs():
    """The script's own run (as tests/test_examples.py runs it, in this process)."""
    assert toy.main(["--smoke"]) == 0
