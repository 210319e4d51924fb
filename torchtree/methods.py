"""The methods the estimators and the command line can run: the registry (``method=`` name -> sampler
class, imported lazily), the keyword options a sampler class takes (and their types for type checkers,
:class:`SamplerOptions`), and how it uses the estimators' prior and leaf-model settings."""
from __future__ import annotations

import difflib
import functools
import importlib
import inspect
from typing import Any, Dict, Iterable, Literal, Optional, Sequence, TypedDict, Union

import torch

from torchtree.distributed.backend import Backend
from torchtree.model.likelihood_protocol import LeafLikelihood
from torchtree.model.priors import ALPHA_SPLIT, BETA_SPLIT, POISSON_LAMBDA, ChipmanPrior

__all__ = ["METHODS", "register_method", "get_method", "model_settings", "MODEL_SETTINGS_HELP", "HYPER_MODES",
           "R_BART_NAMES", "name_hint", "SamplerOptions", "RegressorSamplerOptions"]

# name -> "module:Class" (imported lazily so optional samplers cost nothing) or a class.
METHODS: Dict[str, Any] = {
    "smc": "torchtree.samplers.topdown:TopDownSMC",
    "mcmc": "torchtree.samplers.mcmc:MCMC",
    "smc-moves": "torchtree.samplers.smc_moves:SMCSampler",
    "dcc": "torchtree.samplers.dcc.sampler:DCC",
    "bart": "torchtree.samplers.bart:BART",
}


def register_method(name: str, sampler_cls: Any) -> None:
    """Make ``method=name`` available to the estimators and the CLI.

    Parameters
    ----------
    name : str
    sampler_cls : class or ``"module:Class"`` string
        Its constructor takes the prior and likelihood (keywords ``prior``,
        ``likelihood`` where it uses them) and sampler options by their
        option names (those of its config's option table); ``run(data, *, seed, monitor)`` returns a posterior.
    """
    METHODS[name] = sampler_cls


def get_method(name: str):
    """The sampler class registered as ``name`` (``ValueError`` listing the valid names)."""
    if name not in METHODS:
        raise ValueError(f"unknown method {name!r}; available: {sorted(METHODS)}")
    entry = METHODS[name]
    if isinstance(entry, str):
        mod, cls = entry.split(":")
        try:
            entry = getattr(importlib.import_module(mod), cls)
        except (ImportError, AttributeError) as exc:
            raise ValueError(f"method {name!r} is not available in this installation: {exc}") from exc
        METHODS[name] = entry
    return entry


@functools.lru_cache(maxsize=None)
def accepted_settings(cls) -> frozenset:
    """The keyword settings ``cls`` takes: its config's fields (protocol samplers) or its
    constructor's parameters (read once per class)."""
    from torchtree.samplers.protocol import config_class_of

    sig = inspect.signature(cls.__init__)
    config = config_class_of(cls)
    if config is not None:
        # the config's fields, and the model objects the constructor takes besides them
        # (TopDownSMC: prior, likelihood, backend; DCC builds its own priors: none)
        own = {n for n, p in sig.parameters.items() if n != "self" and p.kind not in (p.VAR_POSITIONAL, p.VAR_KEYWORD)}
        return frozenset({o.name for o in config.options()} | own)
    return frozenset(p for p in sig.parameters if p != "self")


def all_settings() -> frozenset:
    """The keyword settings some registered method takes (the union of :func:`accepted_settings`;
    a method that cannot be imported adds none)."""
    out = set()
    for name in list(METHODS):
        try:
            out |= accepted_settings(get_method(name))
        except ValueError:
            continue
    return frozenset(out)


#: ``"auto"``: what a setting with presets takes to be resolved from the training table (``SamplerConfig.resolve``)
Auto = Literal["auto"]


class SamplerOptions(TypedDict, total=False):
    """The sampler options the estimators take by keyword (their ``**sampler_options``), for type checkers.

    Every option of a built-in method (``smc``, ``mcmc``, ``smc-moves``, ``dcc``, ``bart``) that is not a
    parameter of the estimators themselves, with the types its method's config accepts (the union where
    methods differ); a setting with presets also takes ``"auto"``. Each method takes only its own options
    (:func:`accepted_settings`): ``fit`` refuses the others by name, with the options of the chosen method.
    The option tables of the samplers' configs describe each option.

    The options of a method added with :func:`register_method` are not listed: pass them in a
    ``dict[str, Any]`` (``**options``) or with ``set_params``.
    """

    activation_threshold: int
    asynchronous: bool
    backend: Union[str, Backend, None]
    bart_sampler: str
    checkpoint: Optional[str]
    checkpoint_every: int
    clock: str
    compile: Union[bool, str]
    cut_proposal: str
    delta: float
    dtype: Union[str, torch.dtype]
    engine: str
    ess_threshold: float
    expansion: str
    h_final: float
    h_init: float
    init: str
    init_prior: Union[str, ChipmanPrior, None]
    k: float
    kappa: float
    keep: str
    lais_form: str
    likelihood: Optional[LeafLikelihood]
    local_posterior: str
    look_ahead: float
    max_bins: Optional[int]
    max_cuts: int
    max_depth: int
    max_memory_bytes: Optional[int]
    max_predict_draws: int
    max_rhat: float
    max_rows: Union[str, int, None]
    max_samples: Optional[int]
    max_seconds: Union[float, Auto, None]
    max_stages: int
    max_tree_depth: int
    mh_step: Union[bool, Auto]
    min_ess: Optional[float]
    monitor_every: int
    move_probs: Sequence[float]
    n_chains: Union[int, Auto]
    n_gfr: Optional[int]
    n_initial: int
    n_islands: Union[int, Auto]
    n_iterations: int
    n_parallel: int
    n_particles: Union[int, Auto]
    n_pg_particles: int
    n_proposals: int
    n_samples: Union[int, Auto]
    n_trees: int
    n_warmup: Optional[int]
    n_warmup_warm: Optional[int]
    nu: float
    optimism: float
    proposal: str
    q: float
    redistribution: str
    resampling: str
    sigma_hat: Optional[float]
    signed_splits: Optional[bool]
    split_concentration: Optional[float]
    target_accept: Union[float, Auto]
    tempering: bool
    thin: Union[int, Auto]
    use_likelihood: bool
    warm_start: bool


class RegressorSamplerOptions(SamplerOptions, total=False):
    """:class:`SamplerOptions` and ``dcc``'s ``alpha``, which the regressor passes on by name (the
    classifier's ``alpha`` is its own parameter)."""

    alpha: Optional[float]


# estimator-level model settings, and the object the estimator builds from them
PRIOR_SETTINGS = ("prior", "alpha_split", "beta_split", "poisson_lambda")
LIKELIHOOD_SETTINGS = ("alpha", "mu0", "kappa0", "a0", "b0")

#: One line per model setting: the CLI's help text and the estimators' documentation read it
#: (the samplers' own settings are described by their configs).
MODEL_SETTINGS_HELP = {
    "prior": "tree structure prior: chipman (split probability alpha_split (1 + depth)^-beta_split) "
             "or poisson (zero-truncated Poisson number of leaves, paper 002)",
    "alpha_split": f"Chipman prior: probability that the root splits (default: {ALPHA_SPLIT:g})",
    "beta_split": f"Chipman prior: how fast the split probability falls with depth (default: chosen by the evidence, "
                  f"see hyper; {BETA_SPLIT:g} with hyper=fixed)",
    "poisson_lambda": f"Poisson prior: rate of the number of leaves (default: {POISSON_LAMBDA:g})",
    "alpha": "Dirichlet concentration of each leaf's class probabilities, total over the K classes (default: chosen "
             "by the evidence, see hyper; 5 with hyper=fixed)",
    "mu0": "prior mean of a leaf's value (default: the mean of the targets)",
    "kappa0": "prior strength of a leaf's mean, in pseudo-observations (default: 0.1)",
    "a0": "shape of the inverse-gamma prior of a leaf's noise variance (default: 2)",
    "b0": "scale of the inverse-gamma prior of a leaf's noise variance (default: chosen by the evidence, see hyper; "
          "with hyper=fixed, half the targets' variance times max(a0 - 1, 0.5))",
    "hyper": "evidence: choose the leaf prior (alpha or b0) and beta_split by the evidence of top-down SMC pilot "
             "runs, keeping those you set; fixed: the defaults above (default: evidence)",
}

#: what ``hyper=`` may be (a DCC ``SoftTreeHyper`` object is also passed through to DCC)
HYPER_MODES = ("evidence", "fixed")


def model_settings(cls) -> Dict[str, str]:
    """How a sampler class uses the estimators' prior and leaf-model settings.

    Parameters
    ----------
    cls : sampler class (see :func:`get_method`)

    Returns
    -------
    dict name -> ``"object"`` (through the ``prior`` / ``likelihood`` object the
    estimator builds) or ``"keyword"`` (passed to the sampler by name, which then
    applies its own default when the setting is left at ``None``). Settings not in
    the dict are not used by that sampler: DCC, for one, builds its own soft-tree
    priors and takes no ``prior`` or ``likelihood`` object.
    """
    accepted = accepted_settings(cls)
    out: Dict[str, str] = {}
    for group, obj in ((PRIOR_SETTINGS, "prior"), (LIKELIHOOD_SETTINGS, "likelihood")):
        for name in group:
            if obj in accepted:
                out[name] = "object"
            elif name in accepted:
                out[name] = "keyword"
    return out


#: R's BART / dbarts / bartMachine argument names -> the estimators' (docs/guides/bart.md, "Coming from R's BART")
R_BART_NAMES = {"ntree": "n_trees", "ndpost": "n_samples (per chain)", "nskip": "n_warmup", "keepevery": "thin",
                "base": "alpha_split", "power": "beta_split", "sigdf": "nu", "sigquant": "q", "sigest": "sigma_hat",
                "numcut": "max_cuts", "seed": "random_state", "num_trees": "n_trees", "num_burn_in": "n_warmup",
                "num_iterations_after_burn_in": "n_samples (per chain)"}


def name_hint(name: str, known: Iterable[str]) -> str:
    """``name`` quoted, with what it is called here when it is an R BART name, else the closest of ``known``."""
    if name in R_BART_NAMES:
        return f"{name!r} (R's name; here: {R_BART_NAMES[name]})"
    close = difflib.get_close_matches(name, sorted(known), n=1)
    return f"{name!r}" + (f" (did you mean {close[0]!r}?)" if close else "")
