"""The leaf-likelihood contract (torchtree.model.likelihood_protocol): the conformance checker on the
built-ins and on broken likelihoods, the refusal at a run's start, the registry that saving and loading
go through, and the same registry for priors."""
from __future__ import annotations

import re
import warnings

import pytest
import torch

from torchtree import (MCMC, BayesianTreeClassifier, ChipmanPrior, ConvergenceWarning, Data, DirichletMultinomial, LeafLikelihood,
                       NormalInverseGamma, SMCSampler, TopDownSMC, load_posterior, register_likelihood)
from torchtree.model.likelihood_protocol import LIKELIHOODS, OPTIONAL_HOOKS, REQUIRED_HOOKS, counts_hook, missing_hooks
from torchtree.model.likelihoods import likelihood_from_config
from torchtree.model.priors import PRIORS, prior_from_config, register_prior
from torchtree.testing import check_likelihood


@pytest.fixture(autouse=True)
def registries():
    """Registrations made by a test are undone after it."""
    saved = dict(LIKELIHOODS._classes), dict(PRIORS._classes)
    yield
    LIKELIHOODS._classes.clear()
    LIKELIHOODS._classes.update(saved[0])
    PRIORS._classes.clear()
    PRIORS._classes.update(saved[1])


def _classification(n=40, seed=0):
    g = torch.Generator().manual_seed(seed)
    X = torch.rand(n, 2, generator=g)
    return Data(X, (X[:, 0] > 0.5).long() + (X[:, 1] > 0.7).long())


def _regression(n=40, seed=0):
    g = torch.Generator().manual_seed(seed)
    X = torch.rand(n, 2, generator=g)
    return Data(X, torch.sin(4 * X[:, 0]) + 0.1 * torch.randn(n, generator=g), task="regression")


# ------------------------------------------------------------ the checker
@pytest.mark.parametrize("lik", [DirichletMultinomial(), DirichletMultinomial(0.3), NormalInverseGamma(),
                                 NormalInverseGamma(1.5, 0.2, 3.0, 0.4)], ids=repr)
def test_the_builtins_meet_the_contract(lik):
    assert isinstance(lik, LeafLikelihood) and missing_hooks(lik) == []
    check_likelihood(lik)
    check_likelihood(lik, n_points=3, seed=5)
    if lik.task == "classification":
        check_likelihood(lik, n_classes=2)
        check_likelihood(lik, _classification())
    else:
        check_likelihood(lik, _regression())
    assert set(REQUIRED_HOOKS).isdisjoint(OPTIONAL_HOOKS)


class _NoRows:
    """Every required hook but log_prob_rows."""

    task, stats_dtype = "regression", torch.float64

    def __init__(self):
        self.inner = NormalInverseGamma()

    def n_stats(self, data):
        return 3

    def point_stats(self, y, n_classes=None):
        return self.inner.point_stats(y)

    def log_marginal(self, stats):
        return self.inner.log_marginal(stats)

    def predictive_table(self, stats):
        return self.inner.predictive_table(stats)

    def config(self):
        return {"name": "_NoRows"}


class _MeanAndVariance(NormalInverseGamma):
    """predictive_table as (df, loc, scale^2): not what log_prob_rows reads."""

    def predictive_table(self, stats):
        t = super().predictive_table(stats)
        return torch.stack([t[..., 0], t[..., 1], t[..., 2] ** 2], -1)


class _Offset(NormalInverseGamma):
    def log_marginal(self, stats):
        return super().log_marginal(stats) + 1.0


class _IgnoresClasses(DirichletMultinomial):
    def point_stats(self, y, n_classes=None):
        return super().point_stats(y)  # max(y) + 1 columns, not the data's classes


class _WrongCounts(DirichletMultinomial):
    def log_marginal_counts(self, counts, n_max, totals=None):
        return super().log_marginal_counts(counts, n_max, totals) * 0.5


class _WrongMeanLoc(NormalInverseGamma):
    def mean_table(self, stats):
        t = super().mean_table(stats)
        return torch.stack([t[..., 0], t[..., 1] + 1.0, t[..., 2]], -1)


class _NotRegistered(NormalInverseGamma):
    """Inherits config(): it would be saved, and loaded, as a NormalInverseGamma."""


class _WrongClassCount(DirichletMultinomial):
    def n_stats(self, data):
        return 2


class _Raises(NormalInverseGamma):
    def predictive_table(self, stats):
        raise IndexError("out of range")


@pytest.mark.parametrize("lik, hook", [
    (_NoRows(), "log_prob_rows: missing required hook"),
    (_MeanAndVariance(), "log_marginal: log_marginal(s + point) - log_marginal(s)"),
    (_Offset(), "log_marginal: must be 0 for empty statistics"),
    (_IgnoresClasses(), "point_stats: must be a tensor"),
    (_WrongCounts(), "log_marginal_counts: must equal log_marginal"),
    (_WrongMeanLoc(), "mean_table: loc must be"),
    (_NotRegistered(), "config: cannot save"),
    (_WrongClassCount(), "point_stats: must be a tensor"),
    (_Raises(), "predictive_table raised IndexError"),
], ids=lambda v: type(v).__name__ if not isinstance(v, str) else "")
def test_the_checker_names_the_broken_hook(lik, hook):
    with pytest.raises(AssertionError, match=re.escape(f"{type(lik).__name__}.{hook}")):
        check_likelihood(lik)


def test_counts_hook_is_not_inherited_past_an_overridden_log_marginal():
    assert counts_hook(DirichletMultinomial()) is not None and counts_hook(NormalInverseGamma()) is None

    class Tempered(DirichletMultinomial):
        def log_marginal(self, stats):
            return 0.5 * super().log_marginal(stats)

    class TemperedBoth(Tempered):
        def log_marginal_counts(self, counts, n_max, totals=None):
            return 0.5 * DirichletMultinomial.log_marginal_counts(self, counts, n_max, totals)

    class Off(DirichletMultinomial):
        log_marginal_counts = None

    assert counts_hook(Tempered()) is None and counts_hook(Off()) is None
    assert counts_hook(TemperedBoth()).__func__ is TemperedBoth.log_marginal_counts


def test_samplers_score_a_subclass_by_its_own_log_marginal():
    """A subclass overriding log_marginal alone is scored by it, on every engine (not by its parent's
    lookup tables): a likelihood flat in the labels gives the prior's tree sizes, as use_likelihood=False."""
    class Flat(DirichletMultinomial):
        def log_marginal(self, stats):
            return torch.zeros(stats.shape[:-1], dtype=torch.float64, device=stats.device)

    data = _classification(60)
    runs = [lambda **kw: TopDownSMC(n_particles=16, **kw)]
    runs += [lambda e=engine, c=cut, **kw: MCMC(n_chains=1, n_warmup=40, n_samples=20, engine=e, cut_proposal=c, **kw)
             for engine, cut in (("host", "prior"), ("batched", "prior"), ("batched", "informed"))]
    for make in runs:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", ConvergenceWarning)  # short chains
            a = make(likelihood=Flat()).run(data, seed=1)
            b = make(likelihood=DirichletMultinomial(), use_likelihood=False).run(data, seed=1)
        assert torch.equal(a.trees.n_nodes.sort().values, b.trees.n_nodes.sort().values)
        assert torch.equal(a.log_weights, b.log_weights)


# ------------------------------------------------------------ refused at the start of a run
@pytest.mark.parametrize("make", [lambda lik: TopDownSMC(likelihood=lik, n_particles=4),
                                  lambda lik: MCMC(likelihood=lik, n_chains=1, n_warmup=2, n_samples=2),
                                  lambda lik: SMCSampler(likelihood=lik, n_particles=4, n_iterations=1)],
                         ids=["smc", "mcmc", "smc-moves"])
def test_a_run_refuses_a_likelihood_without_its_hooks(make):
    class Partial:
        task = "classification"

        def log_marginal(self, stats):
            return stats.sum(-1).double()

    with pytest.raises(TypeError, match="lacks stats_dtype, n_stats, point_stats, predictive_table, log_prob_rows, "
                                        "config"):
        make(Partial()).run(_classification(), seed=0)
    with pytest.raises(TypeError, match="lacks log_prob_rows"):
        make(_NoRows()).run(_regression(), seed=0)


def test_the_estimator_refuses_it_too():
    X, y = torch.rand(20, 2), torch.arange(20) % 2
    with pytest.raises(TypeError, match="lacks"):
        BayesianTreeClassifier("smc", likelihood=object(), n_particles=4, verbose=0).fit(X, y)


def test_interval_of_the_mean_needs_mean_table():
    class NoMeanTable(NormalInverseGamma):
        mean_table = None

    post = TopDownSMC(likelihood=NoMeanTable(), n_particles=4).run(_regression(), seed=0)
    assert post.predict_interval(_regression().X[:3], n_draws=50).shape == (3, 2)
    with pytest.raises(ValueError, match="mean_table"):
        post.predict_interval(_regression().X[:3], kind="mean")


# ------------------------------------------------------------ saving and loading
class Shifted(NormalInverseGamma):
    """A user subclass with a setting of its own: the prior mean moved by ``shift``."""

    def __init__(self, shift=0.0, **kw):
        self.shift = float(shift)
        super().__init__(**kw)

    def point_stats(self, y, n_classes=None):
        return super().point_stats(y - self.shift, n_classes)

    def predictive_table(self, stats):
        t = super().predictive_table(stats)
        return torch.stack([t[..., 0], t[..., 1] + self.shift, t[..., 2]], -1)

    def mean_table(self, stats):
        t = super().mean_table(stats)
        return torch.stack([t[..., 0], t[..., 1] + self.shift, t[..., 2]], -1)

    def config(self):
        return {**super().config(), "name": "Shifted", "shift": self.shift}


def test_save_refuses_what_load_could_not_rebuild_and_a_registered_class_round_trips(tmp_path):
    data = _regression()
    lik = Shifted(2.0, b0=0.5)
    post = TopDownSMC(likelihood=lik, n_particles=8).run(data, seed=0)
    path = tmp_path / "shifted.pt"
    with pytest.raises(ValueError, match=r"'Shifted', which is not a registered likelihood.*register_likelihood"):
        post.save(path)
    assert not path.exists()
    inherited = TopDownSMC(likelihood=_NotRegistered(), n_particles=8).run(data, seed=0)
    with pytest.raises(ValueError, match="registered for NormalInverseGamma, so it would load as a NormalInverseGamma"):
        inherited.save(path)
    assert not path.exists()

    assert register_likelihood(Shifted) is Shifted
    check_likelihood(lik)
    post.save(path)
    back = load_posterior(path)
    assert type(back.likelihood) is Shifted and back.likelihood.config() == lik.config()
    X = data.X[:5]
    assert (back.predict(X) == post.predict(X)).all()
    assert (back.predict_interval(X, kind="mean") == post.predict_interval(X, kind="mean")).all()

    LIKELIHOODS._classes.pop("Shifted")  # a process that has not imported the class
    with pytest.raises(ValueError, match=r"unknown likelihood 'Shifted'; registered: DirichletMultinomial, "
                                         r"NormalInverseGamma[^.]*\. .*@torchtree\.register_likelihood"):
        load_posterior(path)


def test_register_likelihood_forms_and_conflicts():
    @register_likelihood(name="MyDM")
    class Mine(DirichletMultinomial):
        def config(self):
            return {**super().config(), "name": "MyDM"}

    assert type(likelihood_from_config({"name": "MyDM", "alpha": 2.0})) is Mine

    class Mine(DirichletMultinomial):  # noqa: F811  the same class defined again (a re-run cell) replaces it
        pass

    register_likelihood(Mine, name="MyDM")
    assert LIKELIHOODS.get("MyDM") is Mine

    class Other(NormalInverseGamma):
        pass

    with pytest.raises(ValueError, match="the likelihood name 'NormalInverseGamma' is taken"):
        register_likelihood(Other, name="NormalInverseGamma")
    with pytest.raises(TypeError, match="takes a class"):
        register_likelihood(DirichletMultinomial())
    with pytest.raises(ValueError, match="cannot be rebuilt from"):
        likelihood_from_config({"name": "DirichletMultinomial", "beta": 1.0})
    with pytest.raises(ValueError, match="a dict with a 'name'"):
        likelihood_from_config({"alpha": 1.0})


def test_priors_use_a_registry_too():
    with pytest.raises(ValueError, match=r"unknown prior 'uniform'; registered: chipman, poisson\. .*register_prior"):
        prior_from_config({"name": "uniform"})

    @register_prior(name="shallow")
    class Shallow(ChipmanPrior):
        def __init__(self, alpha_split=0.5):
            super().__init__(alpha_split, 2.0)

        def config(self):
            return {"name": "shallow", "alpha_split": self.alpha_split}

    back = prior_from_config(Shallow(0.4).config())
    assert type(back) is Shallow and back.config() == Shallow(0.4).config()
