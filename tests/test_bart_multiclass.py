"""Multiclass BART (K >= 3 classes): multinomial probit with latent utilities, against exact answers.

* the class probabilities (:func:`mnp_probabilities`, Gauss-Legendre quadrature) against the
  frequencies of the argmax of 400,000 simulated utilities, and ``Phi(f)`` exactly for two classes;
* the truncated-normal draws against the closed-form truncated mean; the utilities' Gibbs sweep keeps
  the observed class the argmax, and with one utility it is binary probit's latent in distribution;
* a prior-only run's class probabilities equal the prior predictive ``E[mnp_probabilities(f)]`` with
  ``f_u ~ N(offset_u, T tau^2)``, computed by simulation;
* the same draws after a checkpoint and resume, and on two ranks as on one; estimator, CLI-level
  round trip (save / load) and prediction on a 3-class table.

Tolerances are stated per test (several standard errors of the Monte Carlo estimate), seeded.
"""
from __future__ import annotations

import math
import sys
from pathlib import Path

import numpy as np
import pytest
import torch

from torchtree import BayesianTreeClassifier, Data
from torchtree.model.bart import mnp_offsets, mnp_probabilities
from torchtree.model.bart_posterior import BARTPosterior
from torchtree.samplers.bart import BART
from torchtree.steps.bart_moves import draw_latent, draw_utilities, truncated_normal


def _three_classes(n=240, seed=0):
    rng = np.random.default_rng(seed)
    X = rng.uniform(-1, 1, size=(n, 3))
    y = np.where(X[:, 0] + 0.5 * X[:, 1] > 0.3, 2, np.where(X[:, 0] < -0.2, 0, 1))
    return X, y


def test_class_probabilities_equal_the_argmax_of_simulated_utilities():
    g = torch.Generator().manual_seed(0)
    f = 1.5 * torch.randn(3, 6, generator=g, dtype=torch.float64)  # 3 utilities (4 classes), 6 points
    p = mnp_probabilities(f)
    n = 400_000
    W = torch.cat([torch.zeros(n, 1, 6, dtype=torch.float64),
                   f[None] + torch.randn(n, 3, 6, generator=g, dtype=torch.float64)], 1)
    freq = torch.nn.functional.one_hot(W.argmax(1), 4).double().mean(0).T  # [4, 6]
    assert torch.allclose(p.sum(0), torch.ones(6, dtype=torch.float64), atol=1e-12)
    assert float((p - freq).abs().max()) < 4e-3  # binomial standard error <= 8e-4 at 400,000 draws
    one = torch.randn(1, 5, generator=g, dtype=torch.float64)
    assert torch.allclose(mnp_probabilities(one)[1], torch.special.ndtr(one[0]), atol=0, rtol=0)


def test_offsets_are_binary_probits_against_the_reference_class():
    codes = torch.tensor([0] * 30 + [1] * 10 + [2] * 60)
    off = mnp_offsets(codes, 3)
    assert torch.allclose(off, torch.special.ndtri(torch.tensor([10 / 40, 60 / 90], dtype=torch.float64)))
    two = torch.tensor([0] * 30 + [1] * 10)
    assert abs(float(mnp_offsets(two, 2)[0]) - float(torch.special.ndtri(torch.tensor(0.25)))) < 1e-7


@pytest.mark.parametrize("lo,hi", [(1.0, math.inf), (-math.inf, -0.5), (-0.2, 0.8), (5.0, 6.0)])
def test_truncated_normal_has_the_truncated_mean(lo, hi):
    n, m = 200_000, 0.3
    u = torch.rand(n, generator=torch.Generator().manual_seed(1), dtype=torch.float64)
    x = truncated_normal(torch.full((n,), m, dtype=torch.float64), torch.full((n,), lo, dtype=torch.float64),
                         torch.full((n,), hi, dtype=torch.float64), u)
    a, b = lo - m, hi - m
    phi = lambda t: 0.0 if math.isinf(t) else math.exp(-t * t / 2) / math.sqrt(2 * math.pi)  # noqa: E731
    Phi = lambda t: 0.5 * (1 + math.erf(t / math.sqrt(2)))  # noqa: E731
    mean = m + (phi(a) - phi(b)) / (Phi(b) - Phi(a))
    assert float(x.min()) >= lo and float(x.max()) <= hi
    assert abs(float(x.mean()) - mean) < 5 * float(x.std()) / math.sqrt(n)


def test_the_utilities_sweep_keeps_the_observed_class_the_largest():
    g = torch.Generator().manual_seed(2)
    C, U, N = 3, 3, 500
    y = torch.randint(0, U + 1, (N,), generator=g)
    fit = torch.randn(C, U, N, generator=g, dtype=torch.float64)
    W = fit.clone()
    for _ in range(3):
        W = draw_utilities(fit, W, y, torch.rand(C, U, N, generator=g, dtype=torch.float64))
        full = torch.cat([torch.zeros(C, 1, N, dtype=torch.float64), W], 1)
        assert torch.equal(full.argmax(1), y.expand(C, N))


def test_one_utility_is_binary_probits_latent_in_distribution():
    n = 200_000
    g = torch.Generator().manual_seed(3)
    fit = torch.full((1, n), 0.4, dtype=torch.float64)
    y = (torch.rand(n, generator=g) < 0.5).long()
    a = draw_utilities(fit[:, None], fit[:, None], y, torch.rand(1, 1, n, generator=g, dtype=torch.float64))[:, 0]
    b = draw_latent(fit, y.bool(), torch.rand(1, n, generator=g, dtype=torch.float64))
    for cls in (0, 1):
        sa, sb = a[0, y == cls], b[0, y == cls]
        se = math.sqrt(float(sa.var()) / sa.numel() + float(sb.var()) / sb.numel())
        assert abs(float(sa.mean() - sb.mean())) < 5 * se
        qa, qb = torch.quantile(sa[:50_000], torch.tensor([0.1, 0.5, 0.9], dtype=torch.float64)), \
            torch.quantile(sb[:50_000], torch.tensor([0.1, 0.5, 0.9], dtype=torch.float64))
        assert float((qa - qb).abs().max()) < 0.03


@pytest.mark.slow
def test_prior_only_class_probabilities_are_the_prior_predictive():
    X, y = _three_classes(90)
    data = Data(X, y)
    T, C, S = 10, 4, 400
    post = BART(n_trees=T, n_chains=C, n_warmup=50, n_samples=S, thin=2, use_likelihood=False).run(data, seed=4)
    assert post.n_utilities == 2 and post.n_particles == C * S
    draws = post.class_probability_draws(X[:1])[..., 0]  # [C S, 3]; every point has the same prior predictive
    assert np.allclose(draws.mean(0).numpy(), post.predict_proba(X[:1])[0])
    off = mnp_offsets(torch.as_tensor(y), 3)
    g = torch.Generator().manual_seed(5)
    f = off[None, :, None] + math.sqrt(T) * post.prior.tau * torch.randn(200_000, 2, 1, generator=g,
                                                                          dtype=torch.float64)
    expect = mnp_probabilities(f)[..., 0].mean(0).numpy()  # E[class probabilities] under the prior, +- 1e-3
    per_chain = draws.view(S, C, 3).mean(0)  # draws are sweep-major, chains inner
    se = per_chain.std(0, unbiased=True).numpy() / math.sqrt(C)
    got = per_chain.mean(0).numpy()
    assert np.all(np.abs(got - expect) < 5 * se + 0.005), (got, expect, se)


def test_resume_and_two_ranks_draw_what_one_process_draws(tmp_path):
    from torchtree.monitor import CallbackMonitor

    X, y = _three_classes(60, 1)
    data = Data(X, y)
    kw = dict(n_trees=6, n_chains=4, n_warmup=4, n_samples=4)
    one = BART(**kw).run(data, seed=7)

    class Stop(Exception):
        pass

    def hook(step):
        if step >= 4:
            raise Stop

    ck = str(tmp_path / "mc.ckpt")
    with pytest.raises(Stop):
        BART(**kw, checkpoint=ck, checkpoint_every=1).run(data, seed=7, monitor=CallbackMonitor(on_checkpoint=hook))
    resumed = BART(**kw, checkpoint=ck).run(data, seed=7)
    assert torch.equal(resumed.value, one.value) and torch.equal(resumed.feature, one.feature)
    sys.path.insert(0, str(Path(__file__).parent / "_dist_workers"))
    from thread_backend import run_threads

    outs = run_threads(2, lambda be: BART(**kw, backend=be).run(data, seed=7), timeout=120)
    for o in outs:
        assert torch.equal(o.value, one.value) and torch.equal(o.feature, one.feature)
        assert np.array_equal(o.predict_proba(X), one.predict_proba(X))


def test_estimator_fits_three_classes_and_the_posterior_round_trips(tmp_path):
    X, y = _three_classes(300, 2)
    labels = np.array(["low", "mid", "high"], dtype=object)[y]
    clf = BayesianTreeClassifier(method="bart", n_trees=30, n_chains=2, n_warmup=60, n_samples=60,
                                 random_state=0).fit(X[:200], labels[:200])
    p = clf.predict_proba(X[200:])
    assert p.shape == (100, 3) and np.allclose(p.sum(1), 1.0)
    assert list(clf.classes_) == sorted(set(labels.tolist()))
    acc = float((clf.predict(X[200:]) == labels[200:]).mean())
    assert acc > 0.85  # the rule is a few axis-aligned cuts; the majority class alone gets 0.4
    assert np.isfinite(clf.log_predictive(X[200:], labels[200:]))
    s = clf.posterior_.summary()
    assert s["reference_class"] == clf.classes_[0] and list(s["class_utilities"]) == list(clf.classes_[1:])
    assert f"utility of class {clf.classes_[2]}" in clf.posterior_.to_dot(3)  # forest 3 = draw 1, utility 2
    path = str(tmp_path / "mc.pt")
    clf.posterior_.save(path)
    back = BARTPosterior.load(path)
    assert back.n_utilities == 2 and np.array_equal(back.predict_proba(X[200:]), p)


def test_prediction_adds_each_utilitys_offset_to_its_forest():
    """Single-leaf trees of known values: every draw's utilities are ``offset_u + sum of leaves``, and the
    predictive is the draws' mean of their class probabilities (exact, no sampling)."""
    from torchtree.model.bart import LEAF, BartPrior, CutGrid

    X, y = _three_classes(40, 3)
    data = Data(X, y)
    prior = BartPrior.from_data(data.X, (data.y > 0).long(), "classification", n_trees=2)
    off = mnp_offsets(data.y, 3)
    S, U, T = 3, 2, 2
    feature = torch.full((S * U, T, 1), LEAF, dtype=torch.int16)
    value = torch.tensor([[0.2, 0.1], [-0.4, 0.0], [0.0, 0.0], [1.0, 0.5], [-1.0, -0.2], [0.3, 0.3]],
                         dtype=torch.float64)[..., None]  # forest s U + u: utility u + 1 of draw s
    post = BARTPosterior(prior, CutGrid.from_data(data), feature, torch.zeros_like(feature), value,
                         torch.ones(S * U, dtype=torch.float64), torch.arange(S * U) // U, 3, classes=[0, 1, 2],
                         n_utilities=U, offsets=off)
    f = value.sum(1)[:, 0].view(S, U) + off  # [S, U]
    expect = mnp_probabilities(f[..., None])[..., 0].mean(0).numpy()
    got = post.predict_proba(X[:4])
    assert np.allclose(got, expect[None, :], atol=1e-12, rtol=0)
    assert np.allclose(post.latent_draws(X[:2])[:, :, 0].numpy(), f.numpy())


def test_particle_gibbs_fits_three_classes():
    X, y = _three_classes(200, 4)
    clf = BayesianTreeClassifier(method="bart", bart_sampler="pg", n_trees=10, n_chains=2, n_warmup=30,
                                 n_samples=30, random_state=0).fit(X[:150], y[:150])
    p = clf.predict_proba(X[150:])
    assert p.shape == (50, 3) and np.allclose(p.sum(1), 1.0)
    assert float((clf.predict(X[150:]) == y[150:]).mean()) > 0.85


def test_to_dot_and_plot_tree_show_the_same_tree_by_default():
    """With three or more classes BART's to_dot showed the last forest (the last utility) and plot_tree utility 0
    of the last draw; both now show the latter, with yes/no edges as a hard tree's DOT (a QA pass)."""
    import re

    from torchtree.plot.tree import tree_drawing

    rng = np.random.default_rng(0)
    X = rng.normal(size=(90, 2))
    y = np.digitize(X[:, 0], [-0.5, 0.5])
    post = BART(n_trees=5, n_chains=1, n_samples=4, n_warmup=4).run((X, y), seed=0)
    dot = post.to_dot()
    assert dot == post.to_dot((post.n_particles - 1) * post.n_utilities)
    assert f"tree 0 of draw {post.n_particles - 1}: utility of class 1" in dot
    drawing = tree_drawing(post)
    assert "utility of class 1" in drawing.title
    assert all(re.search(r'\[label="(yes|no)"\]', ln) for ln in dot.splitlines() if "->" in ln)
    with pytest.raises(ValueError, match="tree must be"):  # was: a bare IndexError
        post.to_dot(tree=99)
