"""The machinery the estimators share: ``BayesianTreeBase`` (settings, ``fit``, prediction).

:class:`~torchtree.estimators.BayesianTreeClassifier` and
:class:`~torchtree.estimators.BayesianTreeRegressor` add their leaf likelihood and task-specific
methods; this module holds what they have in common: scikit-learn's parameter protocol, the
evidence search of ``hyper="evidence"``, building the sampler of ``method=`` from the settings,
``fit`` and the checks of prediction input.
"""
from __future__ import annotations

import inspect
import os
from typing import TYPE_CHECKING, Any, Dict, Optional, Self, Union

import numpy as np

from torchtree.core.random import seed_to_int
from torchtree.io.checkpoint import Checkpointer
from torchtree.core.threads import ThreadSetting, check_threads, resolve_threads, using_threads
from torchtree._sklearn import (DataConversionWarning, NotFittedError, PickledWithVersion, RandomStateLike,
                               seed_from_random_state, shape_of, short_repr, sklearn_flavoured)
from torchtree.methods import (HYPER_MODES, LIKELIHOOD_SETTINGS, METHODS, PRIOR_SETTINGS, accepted_settings, all_settings,
                               get_method, model_settings, name_hint)
from torchtree.model.data import Data, resolve_device
from torchtree.model.inputs import ArrayLike, check_name_types, frame_columns, in_training_order
from torchtree.model.posterior import attach_feature_names
from torchtree.model.posterior_base import Posterior
from torchtree.model.priors import ALPHA_SPLIT, BETA_SPLIT, ChipmanPrior, PoissonPrior, make_prior
from torchtree.monitor import as_monitor, progress_bars, progress_monitor
from torchtree.samplers.driver import DrawnSeed
from torchtree.samplers.presets import AUTO, RunShape
from torchtree.samplers.protocol import SamplerConfig, config_class_of
from torchtree.core.warn import warn

if TYPE_CHECKING:
    from torchtree.samplers.tuning.evidence import EvidenceSearch

__all__ = ["BayesianTreeBase", "PriorSetting"]

#: what ``prior=`` takes: ``"chipman"``, ``"poisson"`` or a prior object
PriorSetting = Union[str, ChipmanPrior, PoissonPrior]


def _process_rank(backend) -> Optional[int]:
    """This process's rank in the run of ``backend`` (None: one process). A backend given by name was
    opened and closed by the run, so its rank is read from the launcher's variables."""
    if backend is None or (isinstance(backend, str) and backend.lower() == "local"):
        return None
    if not isinstance(backend, str):
        return int(backend.rank)
    for var in ("RANK", "PMI_RANK", "OMPI_COMM_WORLD_RANK", "PMIX_RANK"):
        if os.environ.get(var, "").isdigit():
            return int(os.environ[var])
    return 0


def _write_curves(monitor, search, rank: Optional[int] = None) -> None:
    """The evidence curves of ``hyper="evidence"`` to every monitor that draws curves
    (:meth:`TensorBoardMonitor.add_curve`): tag ``hyper/<name>_log_evidence``. On ``rank`` > 0 only
    monitors created with ``all_ranks=True`` write, as during the run (:func:`as_monitor`)."""
    monitor = as_monitor(monitor, rank=rank)
    todo = list(monitor) if isinstance(monitor, (list, tuple)) else [monitor]
    while todo:
        m = todo.pop()
        if hasattr(m, "monitors"):  # a MonitorList
            todo.extend(m.monitors)
        elif callable(getattr(m, "add_curve", None)):
            for name, curve in search.curves.items():
                m.add_curve(f"hyper/{name}_log_evidence", [x for x, _ in curve], [lz for _, lz in curve])


class BayesianTreeBase(PickledWithVersion):
    """Shared estimator logic (see the two public subclasses)."""

    _task = "classification"
    _estimator_type: str  # "classifier" or "regressor", set by each subclass
    # the fitted attributes (set by fit; declared without a value, so that an unfitted estimator has none)
    posterior_: Posterior
    log_evidence_: Optional[float]
    sampler_config_: Optional[SamplerConfig]
    hyper_search_: Optional[EvidenceSearch]
    n_features_in_: int
    feature_names_in_: np.ndarray

    def __init__(
        self,
        method: str = "smc",
        *,
        prior: PriorSetting = "chipman",
        alpha_split: Optional[float] = None,
        beta_split: Optional[float] = None,
        poisson_lambda: Optional[float] = None,
        random_state: RandomStateLike = 0,
        device: Optional[str] = None,
        monitor: Any = None,
        hyper: Any = "evidence",
        n_threads: ThreadSetting = "auto",
        verbose: int = 1,
        categorical_features: Any = "from_dtype",
        **sampler_options: Any,
    ) -> None:
        self.method = method
        self.hyper = hyper
        self.prior = prior
        self.alpha_split = alpha_split
        self.beta_split = beta_split
        self.poisson_lambda = poisson_lambda
        self.random_state = random_state
        self.device = device
        self.monitor = monitor
        self.n_threads = n_threads
        self.verbose = verbose
        self.categorical_features = categorical_features
        self._sampler_options = dict(sampler_options)

    @property
    def sampler_options(self) -> Dict[str, Any]:
        """The sampler options given to the constructor or ``set_params`` (a copy)."""
        return dict(self._sampler_options)

    # ------------------------------------------------------------ sklearn API
    def get_params(self, deep: bool = True) -> Dict[str, Any]:
        """Estimator parameters (the constructor's, sampler options flattened in)."""
        out = {k: getattr(self, k) for k in ("method", "prior", "alpha_split", "beta_split", "poisson_lambda", "random_state", "device", "monitor",
                                              "hyper", "n_threads", "verbose", "categorical_features")}
        out.update(self._extra_params())
        out.update(self._sampler_options)
        return out

    def _extra_params(self) -> Dict[str, Any]:
        return {}

    def _hyperparameters(self) -> Dict[str, Any]:
        """Hyperparameters the user set (None = leave the sampler's own default)."""
        out = {"alpha_split": self.alpha_split, "beta_split": self.beta_split, "poisson_lambda": self.poisson_lambda}
        if hasattr(self, "alpha"):
            out["alpha"] = self.alpha
        return {k: v for k, v in out.items() if v is not None}

    def set_params(self, **params: Any) -> Self:
        """Set parameters, as scikit-learn's ``set_params`` does.

        Parameters
        ----------
        **params
            Estimator parameters (``method``, ``prior``, ``alpha``, ...) and options of
            the sampler of ``method``. Names are checked here, values at ``fit``: a name that
            no method takes (a typo such as ``n_partciles``) or a nested ``a__b`` name raises a
            ValueError now; an option of another method than ``method`` raises at ``fit``.
            When ``method`` changes, the options set before that the new method does not take
            are removed, with a warning naming them (``n_particles`` after ``method="bart"``).

        Returns
        -------
        self

        Raises
        ------
        ValueError
            A name that is neither an estimator parameter nor an option of any method.
        """
        own = set(self.get_params()) - set(self._sampler_options)
        # the constructor's own names, its ``**`` one included: scikit-learn's checks set them all
        known = own | all_settings() | set(inspect.signature(type(self)).parameters)
        bad = [k for k in params if k not in known]
        if bad:
            def hint(k: str) -> str:
                if "__" in k:
                    return f"{k!r} (nested names: {k.partition('__')[0]!r} has no parameters of its own)"
                return name_hint(k, known)
            raise ValueError(f"invalid parameter(s) {', '.join(hint(k) for k in bad)} for {type(self).__name__}: "
                             "neither an estimator parameter nor an option of any method "
                             f"({sorted(METHODS)})")
        new_method = params.get("method")
        if isinstance(new_method, str) and not (isinstance(self.method, str) and new_method == self.method):
            self._drop_options_of_other_methods(new_method, keep=set(params))
        for k, v in params.items():
            if k in own:
                setattr(self, k, v)
            else:
                self._sampler_options[k] = v
        return self

    def _drop_options_of_other_methods(self, method: Any, keep: set) -> None:
        """Remove the sampler options set before that ``method`` does not take (warning), except those
        in ``keep`` (given beside the new method: ``fit`` refuses those by name)."""
        try:
            accepted = accepted_settings(get_method(method))
        except (ValueError, TypeError):  # an unknown method: fit names it
            return
        stale = sorted(k for k in self._sampler_options if k not in accepted and k not in keep)
        if stale:
            for k in stale:
                del self._sampler_options[k]
            warn(f"method {method!r} does not take {', '.join(stale)} (set for method {self.method!r}): removed",
                 UserWarning)

    def __repr__(self) -> str:
        """The constructor call with the parameters changed from their defaults, as scikit-learn prints
        estimators (sampler options are always shown: they have no default in the signature)."""
        defaults: Dict[str, Any] = {}
        for cls in type(self).__mro__:  # the subclass's own parameters, then the base's
            if "__init__" in vars(cls) and cls is not object:
                for k, p in inspect.signature(vars(cls)["__init__"]).parameters.items():
                    if p.default is not inspect.Parameter.empty:
                        defaults.setdefault(k, p.default)

        def changed(k, v) -> bool:
            if k not in defaults:
                return True
            d = defaults[k]
            try:
                return not (v is d or (type(v) is type(d) and bool(v == d)))
            except Exception:  # values that do not compare to one truth value (arrays)
                return True

        args = ", ".join(f"{k}={short_repr(v)}" for k, v in self.get_params().items() if changed(k, v))
        return f"{type(self).__name__}({args})"

    def __sklearn_tags__(self) -> Any:
        """Estimator tags for scikit-learn >= 1.6 (``cross_val_score``, ``GridSearchCV``).

        scikit-learn is not a dependency: it calls this, so it is installed then.
        """
        from sklearn.utils import ClassifierTags, InputTags, RegressorTags, Tags, TargetTags

        clf = self._task == "classification"
        soft = self.method == "dcc"  # soft trees: no model of missing values (torchtree.model.encoding)
        return Tags(estimator_type=self._estimator_type, target_tags=TargetTags(required=True),
                    input_tags=InputTags(allow_nan=not soft, categorical=not soft, string=not soft),
                    classifier_tags=ClassifierTags() if clf else None, regressor_tags=None if clf else RegressorTags())

    # ---------------------------------------------------------------- fitting
    def _make_prior(self):
        # settings left at None take make_prior's defaults (those of the samplers), or the
        # values chosen by evidence (hyper="evidence")
        given = {n: getattr(self, n) for n in PRIOR_SETTINGS[1:] if getattr(self, n) is not None}
        tuned = {n: v for n, v in getattr(self, "_tuned", {}).items() if n in PRIOR_SETTINGS and n not in given}
        return make_prior(self.prior, **given, **tuned)

    def _tuned_value(self, name: str):
        """The user's setting ``name``, else the value chosen by evidence, else None."""
        own = getattr(self, name, None)
        return own if own is not None else getattr(self, "_tuned", {}).get(name)

    def _searches(self, cls) -> bool:
        """Whether ``fit`` runs the evidence pilots for method ``cls`` (ValueError for an unknown ``hyper``)."""
        if isinstance(self.hyper, str) and self.hyper not in HYPER_MODES:
            raise ValueError(f"hyper must be one of {HYPER_MODES} (or a DCC SoftTreeHyper), got {self.hyper!r}")
        used = model_settings(cls)
        return (self.hyper == "evidence" and used.get("prior") == "object" and used.get("b0") == "object"
                and "likelihood" not in self._sampler_options)

    def _record_fixed_hyperparameters(self) -> None:
        """``posterior_.info["hyper"]`` with ``hyper="fixed"``: the values the search would have chosen
        among, as used (``fixed: beta_split=0.5, alpha=5``)."""
        info, lik = getattr(self.posterior_, "info", None), getattr(self.posterior_, "likelihood", None)
        if not isinstance(info, dict) or lik is None:
            return
        used = {k: v for k, v in self._make_prior().config().items() if k == "beta_split"}
        used.update({k: v for k, v in lik.config().items() if k in ("alpha", "b0") and isinstance(v, (int, float))})
        info["hyper"] = "fixed: " + ", ".join(f"{k}={v:.4g}" for k, v in used.items())

    def _search_hyperparameters(self, cls, data: Data):
        """``hyper="evidence"``: the leaf prior and ``beta_split`` chosen by the evidence of top-down
        SMC pilots (:func:`torchtree.samplers.tuning.evidence.choose_by_evidence`), for methods that take
        the estimator's prior and likelihood objects; None where nothing is searched."""
        if not self._searches(cls):
            return None
        from torchtree.samplers.tuning.evidence import choose_by_evidence

        fixed = {"alpha": getattr(self, "alpha", None), "b0": getattr(self, "b0", None)}
        seed = self._seed_
        # a Poisson or user-built prior has no beta_split to search
        kw = {"alpha_split": ALPHA_SPLIT if self.alpha_split is None else self.alpha_split,
              "beta_split": BETA_SPLIT if self.beta_split is None else self.beta_split,
              "search_split": self.prior == "chipman" and self.beta_split is None}
        if data.task == "regression":
            kw.update(a0=self.a0, kappa0=self.kappa0, mu0=self.mu0)
        return choose_by_evidence(data, fixed=fixed, seed=int(seed), n_threads=self.n_threads, device=self.device, **kw)

    def _make_likelihood(self, data: Data):
        raise NotImplementedError

    def _check_model_settings(self, cls) -> None:
        """ValueError for a bad ``prior`` and for settings changed from their defaults
        that the method would not use (they would otherwise be dropped silently)."""
        if isinstance(self.prior, str) and self.prior not in ("chipman", "poisson"):
            raise ValueError(f"prior must be 'chipman', 'poisson' or a prior object, got {self.prior!r}")
        used = model_settings(cls)
        defaults = {}
        for klass in reversed(type(self).__mro__):
            if "__init__" in vars(klass):
                defaults.update({n: p.default for n, p in inspect.signature(klass.__init__).parameters.items()})
        changed = [n for n in PRIOR_SETTINGS + LIKELIHOOD_SETTINGS
                   if n in defaults and getattr(self, n) != defaults[n]]
        if "likelihood" in self._sampler_options:
            # a likelihood object given as a sampler option is used as is
            own = [n for n in changed if n in LIKELIHOOD_SETTINGS]
            if own:
                raise ValueError(f"{', '.join(own)} do(es) not apply when likelihood= is given; set them on it")
        unused = [n for n in changed if n not in used]
        if unused:
            where = f"{cls.__name__}(hyper=...) and its other options" if "hyper" in accepted_settings(cls) else f"{cls.__name__}'s own options"
            raise ValueError(
                f"method {self.method!r} ({cls.__name__}) does not use {', '.join(unused)}: it builds its own "
                f"prior and leaf model; set them through {where}")
        if used.get("prior") == "object":
            self._make_prior()  # the other structure prior's settings would be dropped as well

    def _build_sampler(self, data: Data, checked: bool = False):
        return self._sampler_of(get_method(self.method), data, checked)

    def _sampler_of(self, cls, data: Data, checked: bool = False):
        """The sampler ``cls`` built from this estimator's settings (every option checked on the way)."""
        accepted = accepted_settings(cls)
        if not checked:  # fit checks before the evidence pilots
            self._check_model_settings(cls)
        kwargs = dict(self._sampler_options)
        unknown = [k for k in kwargs if k not in accepted]
        if unknown:
            if "backend" in unknown:  # a method without ranks (dcc): say so before the list
                raise ValueError(f"method {self.method!r} runs in one process and takes no backend= (ranks); "
                                 "drop backend=, or use a method that runs across ranks (smc, smc-moves, mcmc, bart)")
            raise ValueError(f"invalid parameter(s) {', '.join(name_hint(k, accepted) for k in unknown)} for "
                             f"{type(self).__name__}: method "
                             f"{self.method!r} does not take them; it takes {sorted(accepted - {'prior', 'likelihood'})}")
        # Hyperparameters the estimator owns go to samplers that take them by name
        # (e.g. DCC builds its own soft-tree priors from alpha / alpha_split / beta_split).
        # Settings that reach the sampler through the prior / likelihood object are not
        # passed by name as well: make_prior refuses a prior object plus changed settings.
        by_object = {n for n, how in model_settings(cls).items() if how == "object"}
        for name, value in self._hyperparameters().items():
            if name in accepted and name not in kwargs and name not in by_object:
                kwargs[name] = value
        if not isinstance(self.hyper, str) and self.hyper is not None and "hyper" in accepted:
            kwargs["hyper"] = self.hyper  # a sampler's own hyperparameter object (DCC's SoftTreeHyper)
        if "prior" in accepted:
            kwargs["prior"] = self._make_prior()
        if "likelihood" in accepted and "likelihood" not in kwargs:
            kwargs["likelihood"] = self._make_likelihood(data)
        if "device" in accepted and self.device is not None:
            kwargs["device"] = self.device
        if "n_threads" in accepted:
            kwargs["n_threads"] = self.n_threads
        config = self._resolved_config(cls, kwargs, data)
        sampler = cls(**kwargs)
        if config is not None:
            sampler.config.with_resolution_of(config)
        return sampler

    def _resolved_config(self, cls, kwargs: Dict[str, Any], data: Data):
        """The sampler's config with every preset setting the user left out resolved from the data's
        shape (``SamplerConfig.resolve``); ``kwargs`` takes the resolved values. None for a sampler
        without a config class."""
        config_cls = config_class_of(cls)
        if config_cls is None:
            return None
        names = {o.name for o in config_cls.options()}
        for o in config_cls.options():
            if o.presets and o.name not in kwargs:
                kwargs[o.name] = AUTO
        shape = RunShape.of(data, prior=kwargs.get("prior"), device=self.device)
        config = config_cls(**{k: v for k, v in kwargs.items() if k in names}).resolve(shape)
        kwargs.update({k: getattr(config, k) for k in list(kwargs) if k in names})
        return config

    def _make_data(self, X, y) -> Data:
        return Data(X, y, task=self._task, categorical_features=self.categorical_features)

    def fit(self, X: ArrayLike, y: ArrayLike) -> Self:
        """Sample the posterior over trees given training data.

        Parameters
        ----------
        X : array-like [N, D]
            A numpy array, a pandas DataFrame, a torch tensor or nested lists; NaN and None are
            missing values, and text or pandas ``category`` columns are categorical
            (``categorical_features``).
        y : array-like [N]
            Class labels of any type (classifier) or real targets (regressor).

        Returns
        -------
        self, with ``posterior_`` (a :class:`~torchtree.Posterior` whose class depends on
        ``method``: ``TreePosterior`` for ``smc``, ``mcmc``, ``smc-moves``; ``BARTPosterior``;
        ``SoftTreePosterior`` for ``dcc``), ``log_evidence_`` (None where the method estimates
        none), ``n_features_in_``, ``feature_names_in_`` when ``X`` is a DataFrame with string
        column names (then ``predict*``, ``score`` and ``log_predictive`` take a frame's columns by
        name and refuse unknown or missing names) and, for classifiers, ``classes_``.

        Raises
        ------
        ValueError
            Input the model cannot take (infinite values, a single class, a column of text where
            categories are refused, duplicate column names, ...; the documentation's refusals
            page lists them), an option the method does not take, or settings whose memory cannot
            fit; each message names what to change.
        """
        names = frame_columns(X)
        check_name_types(names)
        if names is not None and all(isinstance(c, str) for c in names):
            dup = sorted({c for c in names if names.count(c) > 1})
            if dup:  # predict* takes a frame's columns by name: which of two 'a' columns is 'a'?
                raise ValueError(f"X has duplicate column names {dup}; columns are matched by name at prediction, "
                                 "so give every column its own name")
        check_threads(self.n_threads)
        as_monitor(self.monitor)  # a wrong monitor= is said now, not after the evidence pilots
        if self.device is not None:
            resolve_device(self.device)  # an unavailable device is refused now, not after the evidence pilots
        y_shape = shape_of(y)
        if len(y_shape) == 2 and y_shape[1] == 1:
            warn("A column-vector y was passed when a 1d array was expected; it is flattened to shape "
                 f"({y_shape[0]},)", sklearn_flavoured(DataConversionWarning, "DataConversionWarning"))
        self._seed_ = seed_from_random_state(self.random_state)
        if self._seed_ is None:
            # one seed for the evidence pilots and the run, recorded in posterior_.info["seed"]; a checkpoint
            # keeps it, and the same call reads it back to resume (the pilots then choose as before)
            path = self._sampler_options.get("checkpoint")
            stored = Checkpointer(path).stored_seed() if path is not None else None
            self._seed_ = DrawnSeed(stored if stored is not None else seed_to_int(None))
        data = self._make_data(X, y)
        cls = get_method(self.method)
        self._check_model_settings(cls)
        self._tuned = {}
        if self._searches(cls):  # every sampler option checked before the evidence pilots, not after them
            self._sampler_of(cls, data, checked=True)
        with progress_bars(self.verbose):
            search = self._search_hyperparameters(cls, data)
            self._tuned = dict(search.chosen) if search is not None else {}
            sampler = self._build_sampler(data, checked=True)
            bar = progress_monitor(f"torchtree {self.method}")  # None unless verbose asks for bars
            mine = list(self.monitor) if isinstance(self.monitor, (list, tuple)) else [self.monitor]
            monitor = self.monitor if bar is None else bar if self.monitor is None else [*mine, bar]
            if "n_threads" in accepted_settings(type(sampler)):
                self.posterior_ = sampler.run(data, seed=self._seed_, monitor=monitor)
            else:  # a registered sampler outside the protocol: the estimator applies the setting
                with using_threads(resolve_threads(self.n_threads, data.n)):
                    self.posterior_ = sampler.run(data, seed=self._seed_, monitor=monitor)
        self.sampler_config_ = getattr(sampler, "config", None)  # with the posterior: a failed fit leaves the last fit's
        self.hyper_search_ = search
        if search is not None and isinstance(getattr(self.posterior_, "info", None), dict):
            chosen = ", ".join(f"{k}={v:.4g}" for k, v in search.chosen.items()) or "nothing left to choose"
            self.posterior_.info["hyper"] = f"evidence: {chosen}"
            self.posterior_.info["hyper_search"] = search.as_dict()
            _write_curves(self.monitor, search, _process_rank(self._sampler_options.get("backend")))
        elif self.hyper == "fixed" and model_settings(cls).get("prior") == "object":
            self._record_fixed_hyperparameters()
        attach_feature_names(self.posterior_, X)
        self.log_evidence_ = getattr(self.posterior_, "log_evidence", None)
        self.n_features_in_ = data.encoder.n_inputs if data.encoder is not None else data.d
        if names is not None and all(isinstance(c, str) for c in names):
            self.feature_names_in_ = np.asarray(names, dtype=object)
        elif hasattr(self, "feature_names_in_"):
            del self.feature_names_in_  # refitted on data without names
        if data.task == "classification":
            self.classes_ = data.classes_
        return self  # the training data is not kept (it would go into every pickle)

    def _check_columns(self, X):
        """``X`` with its columns in the training order when the estimator was fitted on
        named columns (a pandas DataFrame), as scikit-learn matches ``feature_names_in_``.

        A frame given to an estimator fitted without names, or the reverse, is taken by position
        with a UserWarning, as scikit-learn does.

        Raises
        ------
        ValueError
            ``X`` is a frame whose column names are not those seen at ``fit``.
        """
        fitted = getattr(self, "feature_names_in_", None)
        names = frame_columns(X)
        check_name_types(names)
        if fitted is None or names is None or not all(isinstance(c, str) for c in names):
            x_shape = shape_of(X)
            if len(x_shape) == 2 and x_shape[1] != self.n_features_in_:
                raise ValueError(f"X has {x_shape[1]} features, but {type(self).__name__} is expecting "
                                 f"{self.n_features_in_} features as input")
        if fitted is None:
            if names is not None and all(isinstance(c, str) for c in names):
                warn(f"X has feature names, but {type(self).__name__} was fitted without feature names; its "
                     "columns are taken by position", UserWarning)
            return X
        if names is None or not all(isinstance(c, str) for c in names):
            warn(f"X has no feature names, but this {type(self).__name__} was fitted with feature names "
                 f"{list(fitted)}; its columns are taken in that order", UserWarning)
            return X
        return in_training_order(X, fitted)

    @staticmethod
    def _target(X, y) -> np.ndarray:
        """``y`` as a vector [N] matching ``X``'s rows ([N, 1] columns are flattened, as
        ``fit`` does; anything else is an error rather than a silent broadcast)."""
        yn = np.asarray(y)
        if yn.ndim == 2 and yn.shape[1] == 1:
            warn(f"A column-vector y was passed when a 1d array was expected; it is flattened to shape "
                 f"({yn.shape[0]},)", sklearn_flavoured(DataConversionWarning, "DataConversionWarning"))
            yn = yn[:, 0]
        n = len(X)
        if yn.ndim != 1 or len(yn) != n:
            raise ValueError(f"y must have shape [{n}] (or [{n}, 1]) to match X, got {tuple(np.shape(y))}")
        return yn

    @staticmethod
    def _score_weights(sample_weight, n: int):
        """``score``'s ``sample_weight`` as float64 [n] (None stays None); refused when not 1-D of ``n``
        finite non-negative numbers with a positive sum."""
        if sample_weight is None:
            return None
        w = np.asarray(sample_weight, dtype=np.float64)
        if w.ndim != 1 or len(w) != n:
            raise ValueError(f"sample_weight must have shape [{n}] to match y, got {tuple(w.shape)}")
        if not (np.isfinite(w).all() and (w >= 0).all() and w.max(initial=0.0) > 0):
            raise ValueError("sample_weight must be finite and non-negative with a positive sum")
        # only the weights' ratios matter: weights whose sum (or weighted squares) would overflow are scaled down
        return w / w.max() if w.max() > 1e300 / max(n, 1) else w

    def get_metadata_routing(self) -> Any:
        """scikit-learn's metadata routing (``sklearn.set_config(enable_metadata_routing=True)``): ``score`` takes
        ``sample_weight``, not requested unless :meth:`set_score_request` asks; ``fit`` takes no metadata."""
        from sklearn.utils.metadata_routing import MetadataRequest

        req = getattr(self, "_metadata_request", None)
        if req is None:
            req = MetadataRequest(owner=type(self).__name__)
            req.score.add_request(param="sample_weight", alias=None)
        return req

    def set_score_request(self, *, sample_weight: Union[bool, str, None] = None) -> Self:
        """Whether a meta-estimator routes ``sample_weight`` to :meth:`score` (``True``, ``False``, ``None``: not
        requested, or an alias), as scikit-learn's ``set_score_request``; returns ``self``."""
        req = self.get_metadata_routing()
        req.score.add_request(param="sample_weight", alias=sample_weight)
        self._metadata_request = req  # the attribute scikit-learn's clone copies
        return self

    def __sklearn_is_fitted__(self) -> bool:
        """Fitted once ``fit`` has succeeded (``posterior_`` set): what scikit-learn's ``check_is_fitted`` asks."""
        return hasattr(self, "posterior_")

    def _check_fitted(self) -> None:
        if not hasattr(self, "posterior_"):
            raise sklearn_flavoured(NotFittedError, "NotFittedError")(
                f"this {type(self).__name__} is not fitted yet; call fit(X, y) first")

    @property
    def feature_importances_(self) -> np.ndarray:
        """Posterior share of the splits that use each feature ``[n_features_in_]`` (sums to 1; all
        zeros when the posterior's trees have no split): the weighted mean number of splits on a
        feature over the trees (hard trees), over draws and trees (BART), or in the heaviest
        topology (soft trees, DCC), divided by their sum. A count of use, not of gain (and not
        :func:`torchtree.plot.feature_importance`'s ``"share"``, the mean of each draw's shares)."""
        self._check_fitted()
        post = self.posterior_
        if hasattr(post, "variable_importance"):  # BART
            usage = np.asarray(post.variable_importance(), dtype=np.float64)
        else:  # hard trees: "feature_usage"; soft trees: the heaviest topology's, "feature_usage_top"
            s = post.summary()
            usage = np.asarray(s["feature_usage"] if "feature_usage" in s else s["feature_usage_top"],
                               dtype=np.float64).reshape(-1)
        total = usage.sum()
        return usage / total if total > 0 else np.zeros(self.n_features_in_)

    def predict(self, X: ArrayLike) -> np.ndarray:
        """Predicted labels (classifier: the most probable class, as in ``classes_``) or posterior
        predictive means (regressor).

        Parameters
        ----------
        X : array-like [M, D], the columns of ``fit`` (a DataFrame's by name)

        Returns
        -------
        numpy.ndarray [M]
        """
        self._check_fitted()
        return self.posterior_.predict(self._check_columns(X))

    def log_predictive(self, X: ArrayLike, y: ArrayLike) -> float:
        """Mean over rows of the log posterior predictive density (regression) or probability
        (classification) of ``y`` at ``X``: ``mean_m log p(y_m | x_m, training data)``.

        Parameters
        ----------
        X : array-like [M, D]
        y : array-like [M], labels seen at ``fit`` (classifier) or real targets (regressor)

        Returns
        -------
        float
        """
        self._check_fitted()
        return self.posterior_.log_predictive(self._check_columns(X), self._target(X, y))

