"""scikit-learn style faces: ``BayesianTreeClassifier`` and ``BayesianTreeRegressor``.

``method=`` picks a sampler from the registry (``METHODS``); the estimator passes
each sampler exactly the keyword parameters its constructor accepts, so a new
sampler registered with :func:`register_method` works here (and in the CLI)
without special cases.
"""
from __future__ import annotations

from typing import Any, Dict, Optional, Unpack

import numpy as np

from torchtree._sklearn import DataConversionWarning, NotFittedError, RandomStateLike, seed_from_random_state
from torchtree.core.random import seed_to_int
from torchtree.core.threads import ThreadSetting
from torchtree.core.warn import warn
from torchtree.estimator_base import BayesianTreeBase, PriorSetting
from torchtree.methods import (  # METHODS, register_method, get_method, model_settings: re-exported
    METHODS,
    RegressorSamplerOptions,
    SamplerOptions,
    get_method,
    model_settings,
    register_method,
)
from torchtree.model.data import Data
from torchtree.model.likelihoods import DirichletMultinomial, NormalInverseGamma
from torchtree.model.inputs import ArrayLike, check_no_missing_labels

__all__ = ["BayesianTreeClassifier", "BayesianTreeRegressor", "METHODS", "NotFittedError", "DataConversionWarning",
           "register_method", "get_method",
           "model_settings"]


class BayesianTreeClassifier(BayesianTreeBase):
    """Bayesian decision-tree classifier.

    Parameters
    ----------
    method : str
        ``"smc"`` (top-down SMC, default), ``"mcmc"``, ``"smc-moves"``, ``"dcc"``,
        ``"bart"`` (a sum of trees, :class:`~torchtree.samplers.bart.BART`; classification
        through a probit link: binary probit, or multinomial probit for three classes and
        more), or any name added with :func:`register_method`.
    alpha : float, optional
        Dirichlet concentration of the leaves (total; alpha/K per class). None (default): chosen
        by the evidence (``hyper="evidence"``); 5 with ``hyper="fixed"``.
    prior : {"chipman", "poisson"} or a prior object (``ChipmanPrior``, ``PoissonPrior``)
        Tree structure prior (default ``"chipman"``: a node at depth d splits with probability
        ``alpha_split (1 + d)^-beta_split``; ``"poisson"``: a zero-truncated Poisson number of leaves).
    alpha_split, beta_split : float, optional
        Chipman prior parameters. None (default): ``alpha_split`` 0.95, ``beta_split`` chosen by
        the evidence (0.5 with ``hyper="fixed"``); samplers that build their own priors from these
        names (``dcc``, ``bart``) keep their own defaults.
    poisson_lambda : float, optional
        Rate of the Poisson prior (default 5).
    hyper : {"evidence", "fixed"} or a sampler's hyperparameter object
        ``"evidence"`` (default): for the methods that use this estimator's prior and likelihood
        objects (``smc``, ``mcmc``, ``smc-moves``), the leaf prior (``alpha``, or ``b0`` for
        regression) and ``beta_split`` are chosen among a few values by the evidence of short
        top-down SMC pilot runs, keeping those you set (``hyper_search_`` records the search);
        ``"fixed"``: the defaults above. A ``SoftTreeHyper`` is passed to ``dcc`` as its
        hyperparameters.
    random_state : int, numpy RandomState or Generator, optional
        Seed of the sampler, an int in ``[0, 2**63 - 1]`` (default 0); None draws a fresh seed for every fit from
        torch's default generator (``posterior_.info["seed"]`` records it; after ``torch.manual_seed`` the draws
        repeat, as scikit-learn's None follows ``numpy.random.seed``); a numpy ``RandomState`` / ``Generator``
        gives one draw per fit, as in scikit-learn. An int leaves torch's and numpy's global generators alone.
    device : str, optional
        ``"cpu"``, ``"cuda"`` or ``"auto"`` (CUDA if present). None (default): the
        data's device, as for every sampler (the CPU for numpy input).
    monitor : Monitor or list of monitors, optional
        Receives the run's reports (e.g. ``TensorBoardMonitor``, ``TraceMonitor``). None (default):
        a progress bar, as ``verbose`` says.
    verbose : int
        Progress bars (tqdm) on standard error for each phase of the fit: the evidence pilots, the
        run (when ``monitor`` is None) and its nested runs (top-down starts), each with its total and
        an ETA. 1 (default): a phase's bar appears once it has run ``PROGRESS_DELAY`` (2) seconds,
        and only when standard error is a terminal or a Jupyter notebook (a widget there); 0: none;
        2 or more: every bar at once, on any stream.
    categorical_features : "from_dtype" (default), None, or column indices / names / boolean mask
        Categorical columns, split by subsets of their levels; ``"from_dtype"``: pandas
        ``category`` columns and columns holding text. Missing values (NaN, None) are modelled
        in every column, and so is text spelling a missing value (``"n/a"``, ``"?"``, ...:
        ``torchtree.io.cells.MISSING_TOKENS``) in a column of numbers. The hard-tree methods and
        ``bart`` take both; the soft trees (``dcc``) refuse them. The model: :mod:`torchtree.model.encoding`.
    n_threads : "auto" or int
        torch intra-op threads during ``fit`` (the previous count is restored after it).
        ``"auto"`` (default): one thread unless the work (rows x particles or chains) is
        large, then at most the cores divided by the ranks on the node and never more than
        ``OMP_NUM_THREADS`` (:mod:`torchtree.core.threads`; the documentation's threads how-to).
    **sampler_options
        Passed to the sampler by name (``n_particles``, ``n_islands``, ``proposal``,
        ``expansion``, ``resampling``, ``ess_threshold``, ``n_chains``, ...); a
        ``likelihood=`` object is used as is (instead of ``alpha`` / ``mu0`` / ...).
        Every sampler setting declared with presets that is not given is ``"auto"``: it is
        resolved from the training table's shape when ``fit`` runs
        (:meth:`~torchtree.samplers.protocol.SamplerConfig.resolve`; the presets are written next to
        the settings in each sampler's config, and ``torchtree fit --method M --help`` lists them).
        ``sampler_config_`` keeps the resolved config and ``posterior_.info["settings"]`` says which
        preset chose each value and why. A sampler called directly keeps its literal defaults.
        Type checkers read the options of the built-in methods and their types from
        :class:`~torchtree.methods.SamplerOptions` (a misspelt name is an error there too).

    Attributes
    ----------
    posterior_ : the fitted posterior
    sampler_config_ : the sampler's config as run (None for a sampler without a config class)
    hyper_search_ : EvidenceSearch or None, what ``hyper="evidence"`` chose
    log_evidence_, n_features_in_, feature_names_in_, classes_ : as in :meth:`fit`

    Notes
    -----
    A DataFrame fit with string column names is read at prediction by those names, in any order (scikit-learn
    refuses reordered columns); other inputs are read by position.

    Examples
    --------
    >>> clf = BayesianTreeClassifier(n_particles=500, n_islands=5).fit(X, y)  # doctest: +SKIP
    >>> clf.predict_proba(X_test)  # doctest: +SKIP
    """

    _task = "classification"
    _estimator_type = "classifier"  # scikit-learn < 1.6 reads this attribute
    classes_: np.ndarray  # fitted: the labels seen at fit, sorted

    # the base's parameters spelled out (same defaults), so that IDEs and type checkers see them
    def __init__(self, method: str = "smc", *, alpha: Optional[float] = None, prior: PriorSetting = "chipman",
                 alpha_split: Optional[float] = None, beta_split: Optional[float] = None,
                 poisson_lambda: Optional[float] = None, random_state: RandomStateLike = 0,
                 device: Optional[str] = None, monitor: Any = None, hyper: Any = "evidence",
                 n_threads: ThreadSetting = "auto", verbose: int = 1, categorical_features: Any = "from_dtype",
                 **sampler_options: Unpack[SamplerOptions]) -> None:
        super().__init__(method, prior=prior, alpha_split=alpha_split, beta_split=beta_split,
                         poisson_lambda=poisson_lambda, random_state=random_state, device=device, monitor=monitor,
                         hyper=hyper, n_threads=n_threads, verbose=verbose, categorical_features=categorical_features,
                         **sampler_options)
        self.alpha = alpha

    def _extra_params(self) -> Dict[str, Any]:
        return {"alpha": self.alpha}

    def _make_likelihood(self, data: Data):
        alpha = self._tuned_value("alpha")
        return DirichletMultinomial(5.0 if alpha is None else alpha)


    def predict_proba(self, X: ArrayLike) -> np.ndarray:
        """Posterior predictive class probabilities ``[M, K]`` (columns follow ``classes_``)."""
        self._check_fitted()
        return self.posterior_.predict_proba(self._check_columns(X))

    def predict_log_proba(self, X: ArrayLike) -> np.ndarray:
        """``log(predict_proba(X))`` ``[M, K]`` (``-inf`` where a probability is 0)."""
        with np.errstate(divide="ignore"):
            return np.log(self.predict_proba(X))

    def score(self, X: ArrayLike, y: ArrayLike, sample_weight: Optional[ArrayLike] = None) -> float:
        """Accuracy on ``(X, y)``: the share of rows whose predicted label is ``y``'s, as scikit-learn's
        ``accuracy_score(y, predict(X), sample_weight=sample_weight)`` (``sample_weight`` [M] non-negative:
        a weighted share; ``fit`` takes no weights). Rows whose label was not seen at ``fit`` count as errors
        (the model gives them probability 0), with a warning naming the labels; a missing label (None, NaN,
        ``pd.NA``) is refused (``ValueError``), as ``fit`` refuses it."""
        self._check_fitted()
        yn = self._target(X, y)
        check_no_missing_labels(yn)
        w = self._score_weights(sample_weight, len(yn))
        known = set(self.classes_.tolist())
        unseen = sorted({v for v in yn.tolist() if v not in known}, key=str)
        if unseen:
            warn(f"y holds label(s) {unseen[:5]} not seen at fit (classes_: {self.classes_.tolist()}): their rows "
                 "count as errors", UserWarning)
            pred = np.asarray(self.predict(X), dtype=object)
            right = np.array([p == t for p, t in zip(pred.tolist(), yn.tolist())], dtype=np.float64)
            return float(np.average(right, weights=w)) if len(right) else float("nan")
        if w is None:
            return self.posterior_.accuracy(self._check_columns(X), yn)
        right = np.asarray(self.predict(X) == yn, dtype=np.float64)
        return float(np.average(right, weights=w))


class BayesianTreeRegressor(BayesianTreeBase):
    """Bayesian decision-tree regressor with Normal-inverse-gamma leaves.

    Parameters
    ----------
    method : str
        As for :class:`BayesianTreeClassifier`.
    mu0 : float, optional
        Prior mean of a leaf's value. None (default): the mean of the training targets.
    kappa0 : float
        Prior strength of a leaf's mean, in pseudo-observations (default 0.1).
    a0 : float
        Shape of the inverse-gamma prior of a leaf's noise variance (default 2).
    b0 : float, optional
        Its scale. None (default): chosen by the evidence (``hyper="evidence"``); with
        ``hyper="fixed"``, half the targets' variance times ``max(a0 - 1, 0.5)``
        (``NormalInverseGamma.default_for``).
    prior, alpha_split, beta_split, poisson_lambda, hyper, random_state, device, monitor, verbose, categorical_features, n_threads
        As for :class:`BayesianTreeClassifier` (and its notes on a DataFrame's columns).
    **sampler_options
        As for :class:`BayesianTreeClassifier` (typed by :class:`~torchtree.methods.RegressorSamplerOptions`).

    Attributes
    ----------
    posterior_, sampler_config_, hyper_search_, log_evidence_, n_features_in_, feature_names_in_
        As for :class:`BayesianTreeClassifier` (no ``classes_``).
    """

    _task = "regression"
    _estimator_type = "regressor"

    def __init__(self, method: str = "smc", *, mu0: Optional[float] = None, kappa0: float = 0.1, a0: float = 2.0,
                 b0: Optional[float] = None, prior: PriorSetting = "chipman", alpha_split: Optional[float] = None,
                 beta_split: Optional[float] = None, poisson_lambda: Optional[float] = None,
                 random_state: RandomStateLike = 0, device: Optional[str] = None, monitor: Any = None,
                 hyper: Any = "evidence", n_threads: ThreadSetting = "auto", verbose: int = 1,
                 categorical_features: Any = "from_dtype", **sampler_options: Unpack[RegressorSamplerOptions]) -> None:
        super().__init__(method, prior=prior, alpha_split=alpha_split, beta_split=beta_split,
                         poisson_lambda=poisson_lambda, random_state=random_state, device=device, monitor=monitor,
                         hyper=hyper, n_threads=n_threads, verbose=verbose, categorical_features=categorical_features,
                         **sampler_options)
        self.mu0, self.kappa0, self.a0, self.b0 = mu0, kappa0, a0, b0

    def _extra_params(self) -> Dict[str, Any]:
        return {"mu0": self.mu0, "kappa0": self.kappa0, "a0": self.a0, "b0": self.b0}

    def _make_likelihood(self, data: Data):
        default = NormalInverseGamma.default_for(data.y, kappa0=self.kappa0, a0=self.a0)
        return NormalInverseGamma(
            mu0=default.mu0 if self.mu0 is None else self.mu0,
            kappa0=self.kappa0,
            a0=self.a0,
            b0=default.b0 if self._tuned_value("b0") is None else self._tuned_value("b0"),
        )

    def predict_interval(self, X: ArrayLike, level: float = 0.9, n_draws: int = 4000,
                         seed: RandomStateLike = 0, kind: str = "predictive") -> np.ndarray:
        """Equal-tailed posterior interval ``[M, 2]``: the ``(1 - level) / 2`` and ``(1 + level) / 2``
        quantiles of ``n_draws`` Monte Carlo draws per row, seeded by ``seed`` (the posterior's
        ``predict_interval``; what ``random_state`` takes: an int, None for a fresh seed, a numpy
        ``RandomState`` or ``Generator``). ``kind="predictive"`` (default) bounds a new observation ``y``
        at the row (the posterior predictive: the function's uncertainty and the noise); ``kind="mean"``
        bounds the regression function ``f(x) = E[y | x]`` (a credible interval of the mean, narrower).
        A bound's Monte Carlo error shrinks as ``1 / sqrt(n_draws)``. The random numbers are shared by all
        rows, so a row's interval is the same alone as among other rows."""
        self._check_fitted()
        s = seed_from_random_state(seed, "seed")
        return self.posterior_.predict_interval(self._check_columns(X), level=level, n_draws=n_draws,
                                                seed=seed_to_int(s), kind=kind)

    def score(self, X: ArrayLike, y: ArrayLike, sample_weight: Optional[ArrayLike] = None) -> float:
        """Coefficient of determination R^2 of the predictive mean, as scikit-learn's ``r2_score(y, predict(X),
        sample_weight=sample_weight)`` (``sample_weight`` [M] non-negative: weighted sums of squares about the
        weighted mean; ``fit`` takes no weights). For a constant ``y`` (no variance to explain) it is 1.0 where
        the predictions equal ``y`` and 0.0 otherwise."""
        self._check_fitted()
        yn = self._target(X, y).astype(np.float64)
        check_no_missing_labels(yn, what="target")
        w = self._score_weights(sample_weight, len(yn))
        w = np.ones_like(yn) if w is None else w
        pred = self.predict(X)
        mean = float(np.average(yn, weights=w)) if w.sum() > 0 else float(yn.mean())
        unit = float(np.abs(yn - mean).max()) or 1.0  # in units of y's spread: no square under- or overflows
        ss_res = float((w * ((yn - pred) / unit) ** 2).sum())
        ss_tot = float((w * ((yn - mean) / unit) ** 2).sum())
        if ss_tot > 0:
            return 1.0 - ss_res / ss_tot
        return 1.0 if ss_res == 0 else 0.0
