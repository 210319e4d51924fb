"""Code a user who type-checks would write against torchtree: the README's snippets, the scikit-learn
workflow, posterior files, the lazily exported classes and a leaf likelihood of one's own.

Never run (it would fit models): ``make typecheck`` checks it with ``mypy --strict``, so that what a type
checker reads of the public API (return types, accepted argument types, attributes) keeps matching the
documentation. Each ``assert_type`` fails the check when an annotation drifts (``fit`` typed as returning
the base class, a lazily exported name seen as ``Any``, ...).
"""
from __future__ import annotations

from pathlib import Path
from typing import Any, assert_type

import numpy as np
import numpy.typing as npt
import torch
from sklearn.base import clone  # type: ignore[import-untyped, unused-ignore]
from sklearn.pipeline import Pipeline  # type: ignore[import-untyped, unused-ignore]
from sklearn.preprocessing import StandardScaler  # type: ignore[import-untyped, unused-ignore]

import torchtree
from torchtree import (BART, BARTPosterior, BayesianTreeClassifier, BayesianTreeRegressor, ChipmanPrior, Data,
                       DirichletMultinomial, LeafLikelihood, Posterior, SoftTreePosterior, TopDownSMC, TreePosterior,
                       load_posterior, register_likelihood)
from torchtree.datasets import load_table
from torchtree.samplers.protocol import SamplerConfig
from torchtree.testing import check_likelihood


def classification() -> None:
    t = load_table("pima_diabetes")
    idx = np.random.default_rng(0).permutation(len(t.y))
    tr, te = idx[:600], idx[600:]
    clf = BayesianTreeClassifier(method="smc", random_state=0).fit(t.X[tr], t.y[tr])
    assert_type(clf, BayesianTreeClassifier)  # fit returns Self
    acc: float = clf.score(t.X[te], t.y[te])
    lp: float = clf.log_predictive(t.X[te], t.y[te])
    proba: npt.NDArray[np.float64] = clf.predict_proba(t.X[te])
    labels: npt.NDArray[Any] = clf.predict(t.X[te])
    summary: dict[str, Any] = clf.posterior_.summary()
    classes: npt.NDArray[Any] = clf.classes_
    n_in: int = clf.n_features_in_
    evidence: float | None = clf.log_evidence_
    config: SamplerConfig | None = clf.sampler_config_
    print(acc, lp, proba.shape, labels.shape, summary, classes, n_in, evidence, config)
    # set_params keeps the concrete class; sampler options and the base parameters are keywords
    assert_type(clf.set_params(n_particles=100, random_state=None), BayesianTreeClassifier)
    assert_type(clf.set_score_request(sample_weight=True), BayesianTreeClassifier)
    BayesianTreeClassifier(prior=ChipmanPrior(0.95, 0.5), random_state=np.random.default_rng(0), n_threads=2,
                           categorical_features=[0, 2], verbose=0)


def regression(path: Path) -> None:
    a = load_table("abalone")
    reg = BayesianTreeRegressor(random_state=np.random.RandomState(0), mu0=0.0, prior="poisson", n_particles=50)
    reg = reg.fit(a.X, a.y)
    assert_type(reg, BayesianTreeRegressor)
    lo, hi = reg.predict_interval(a.X, level=0.9).T
    reg.predict_interval(a.X, seed=None)
    reg.predict_interval(a.X, seed=np.random.default_rng(1))
    mean: npt.NDArray[np.float64] = reg.predict(a.X)
    r2: float = reg.score(a.X, a.y)
    print(lo, hi, mean, r2)
    reg.posterior_.save(path)  # a Path, as every file API takes
    reg.posterior_.save(str(path))


def sklearn_workflow(X: npt.NDArray[np.float64], y: npt.NDArray[np.int64]) -> None:
    est = BayesianTreeClassifier(n_particles=20, verbose=0)
    params: dict[str, Any] = est.get_params()
    twin = clone(est)
    pipe = Pipeline([("scale", StandardScaler()), ("tree", BayesianTreeClassifier(verbose=0))])
    pipe.fit(X, y)
    print(params, twin)


def posterior_files(path: Path) -> None:
    post = load_posterior(path, device=torch.device("cpu"))
    if isinstance(post, BARTPosterior):  # a lazily exported class narrows
        assert_type(post, BARTPosterior)
        draws: torch.Tensor = post.latent_draws(np.zeros((2, 3)))
        print(draws.shape)
    elif isinstance(post, SoftTreePosterior):
        print(len(post.topologies))
    else:
        assert_type(post, TreePosterior)
        print(post.to_dot())
    again = TreePosterior.load(str(path), device="cpu")
    print(describe(post), describe(again))


def describe(p: Posterior) -> str:
    """Every attribute the ``Posterior`` protocol documents, as one line."""
    w: torch.Tensor = p.weights
    n: int = p.n_particles
    ev: float | None = p.log_evidence
    task: str = p.task
    info: dict[str, Any] = p.info
    return f"{task} {p.n_features} {n} {ev} {float(w.sum())} {sorted(info)}"


def samplers(X: npt.NDArray[np.float64], y: npt.NDArray[np.int64]) -> None:
    smc = TopDownSMC(n_particles=50)
    post = smc.run((X, y), seed=torch.Generator().manual_seed(0))
    assert_type(post, TreePosterior)
    bart = BART(n_trees=10, n_samples=20)
    assert_type(bart, BART)
    bpost = bart.run(Data(X, X[:, 0], task="regression"), seed=0)
    assert_type(bpost, BARTPosterior)
    assert_type(torchtree.NUTS(n_chains=2).run((X, y), seed=None), SoftTreePosterior)


def sampler_options(path: Path, grid: dict[str, Any]) -> None:
    """Sampler options as keywords: each method's own, with the types their configs take (``"auto"`` where a
    setting has presets); a misspelt name or a wrong type is an error (tests/test_typing.py checks that)."""
    BayesianTreeClassifier(method="smc", n_particles=500, n_islands=5, proposal="optimal", expansion="layer",
                           resampling="systematic", ess_threshold=0.5, max_memory_bytes=None)
    BayesianTreeClassifier(method="smc", n_particles="auto", checkpoint=str(path), checkpoint_every=10,
                           likelihood=torchtree.DirichletMultinomial(2.0), backend="local")
    BayesianTreeRegressor(method="mcmc", n_chains=4, n_samples=500, n_warmup=None, thin=2, init="topdown",
                          move_probs=[0.4, 0.4, 0.2, 0.0], cut_proposal="prior", engine="host", max_bins=64)
    BayesianTreeClassifier(method="smc-moves", n_particles=256, n_iterations=20, mh_step="auto", tempering=True,
                           init_prior=ChipmanPrior(0.95, 0.5), redistribution="auto")
    BayesianTreeRegressor(method="bart", n_trees=50, n_samples=200, n_chains="auto", k=2.0, nu=3.0, q=0.9,
                          sigma_hat=None, dtype="float64", compile="auto", max_seconds=60.0, min_ess=100.0)
    BayesianTreeRegressor(method="dcc", alpha=None, dtype=torch.float64, compile=False, max_rows="auto",
                          signed_splits=True, max_seconds="auto", target_accept=0.9)
    BayesianTreeClassifier(method="dcc", alpha=2.0, n_chains=4, max_seconds=30.0, clock="cpu", warm_start=True)
    BayesianTreeRegressor(**grid)  # a dict[str, Any] of options (a registered method's own, say) is taken as is


def leaf_likelihood(X: npt.NDArray[np.float64], y: npt.NDArray[np.int64]) -> None:
    @register_likelihood
    class Tempered(DirichletMultinomial):
        def log_marginal(self, stats: torch.Tensor) -> torch.Tensor:
            return 0.5 * super().log_marginal(stats)

        def config(self) -> dict[str, Any]:
            return {**super().config(), "name": "Tempered"}

    @register_likelihood(name="Tempered2")
    class Tempered2(Tempered):
        def config(self) -> dict[str, Any]:
            return {**super().config(), "name": "Tempered2"}

    lik = Tempered(2.0)
    assert_type(lik, Tempered)  # the decorator keeps the class, with and without a name
    assert_type(Tempered2(1.0), Tempered2)
    check_likelihood(lik, n_classes=2)
    ok: bool = isinstance(lik, LeafLikelihood)
    post = TopDownSMC(likelihood=lik, n_particles=20).run((X, y), seed=0)
    print(ok, post)
