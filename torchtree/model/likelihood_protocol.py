"""The leaf-likelihood contract: what the samplers, the posterior, the plots and the files call of a likelihood.

A leaf likelihood scores the labels of the training points in one leaf through their *sufficient
statistics*: every point has a row ``point_stats(y) [N, S]``, a node's statistics ``stats [S]`` are the
sum of its points' rows, and everything else is a function of those sums. :class:`LeafLikelihood`
declares each hook with its contract; :data:`REQUIRED_HOOKS` and :data:`OPTIONAL_HOOKS` list them.
The samplers refuse a likelihood without a required hook when a run starts (:func:`check_hooks`,
``TypeError``), :func:`torchtree.testing.check_likelihood` exercises every hook on synthetic
statistics, and :func:`register_likelihood` lets saved posteriors find a likelihood class again.
docs/writing_a_likelihood.md walks through a complete example.

Conventions of both tasks:

* ``task == "classification"``: ``y`` holds class codes ``0 .. K-1`` (long), ``point_stats`` are the
  one-hot rows ``[N, K]`` (node statistics are class counts: the samplers cumulate them as integers,
  read a node's size as their sum and build per-class bitsets from the labels), and
  ``predictive_table`` gives each node's predictive class probabilities ``[..., K]``, rows summing to 1.
* ``task == "regression"``: ``y`` is float64, column 0 of ``point_stats`` is 1 for every point (a node's
  column 0 is its number of points, which the posterior's routing estimate, summaries and plots read),
  and ``predictive_table`` gives each node's predictive of a new ``y`` as a **Student-t ``(df, loc,
  scale)``** ``[..., 3]`` with ``df > 0`` and ``scale > 0``: ``predict`` averages ``loc`` (the
  predictive mean), ``predict_interval`` and the plots draw from and integrate these Student-t's, and
  ``log_prob_rows`` must be the Student-t log density of the rows it is given. A leaf model whose
  predictive is no Student-t (a Poisson-Gamma model's negative binomial, say) does not fit the
  regression posterior.
"""
from __future__ import annotations

import functools
from typing import Any, Callable, Dict, List, Optional, Protocol, TypeVar, overload, runtime_checkable

import torch

from torchtree.model.registry import ConfigRegistry

__all__ = ["LeafLikelihood", "REQUIRED_HOOKS", "OPTIONAL_HOOKS", "TASKS", "missing_hooks", "check_hooks",
           "counts_hook", "LIKELIHOODS", "register_likelihood", "likelihood_from_config"]

#: the values of ``task``
TASKS = ("classification", "regression")


@runtime_checkable
class LeafLikelihood(Protocol):
    """A conjugate leaf model scored from per-node sufficient statistics (the required hooks).

    Every tensor method broadcasts over leading dimensions: ``stats [..., S]`` may be one node
    (``[S]``), every node of a tree (``[C, S]``) or of every tree (``[P, C, S]``). ``S`` is
    :meth:`n_stats`; ``T`` below is the width of a predictive row: ``K`` (classification) or 3
    (regression, a Student-t ``(df, loc, scale)``).

    Classification: ``point_stats`` are the one-hot rows of the class codes, so node statistics are
    class counts. Regression: column 0 of ``point_stats`` is 1 (node statistics start with the node's
    number of points), and ``predictive_table`` is a Student-t ``(df, loc, scale)`` per node, which
    ``predict``, ``predict_interval`` and the plots read as such.

    Optional hooks, not declared here (:data:`OPTIONAL_HOOKS`): ``mean_table(stats)`` (regression: the
    Student-t posterior of the leaf's mean; ``predict_interval(kind="mean")`` is refused without it),
    ``log_marginal_counts(counts, n_max, totals=None)`` (classification: ``log_marginal`` of integral
    counts by lookup, which must equal it; the samplers call ``log_marginal`` without it) and
    ``log_predictive_point(table_rows, y)`` (``log_prob_rows`` over a batch; checked when present).

    Attributes
    ----------
    task : str
        ``"classification"`` or ``"regression"``; a run refuses data of the other task.
    stats_dtype : torch.dtype
        The floating dtype the samplers store node statistics in (the built-ins: float32 class
        counts, exact up to 2^24 points; float64 regression sums).
    """

    task: str
    stats_dtype: torch.dtype

    def n_stats(self, data: Any) -> int:
        """``S``, the statistics per point and node for ``data`` (a :class:`~torchtree.Data`: its
        ``n_classes`` for classification). Equals ``point_stats(data.y, data.n_classes).shape[1]``;
        the samplers' memory estimates read it before any statistics exist."""
        ...

    def point_stats(self, y: torch.Tensor, n_classes: Optional[int] = None) -> torch.Tensor:
        """Each point's statistics: ``y [N] -> [N, S]`` (cast to :attr:`stats_dtype` by the caller).

        ``n_classes`` is the data's number of classes ``K`` (classification; it may exceed
        ``max(y) + 1`` when a class has no training point), None for regression. Row ``n`` depends on
        ``y[n]`` only; a node's statistics are the sum of its points' rows."""
        ...

    def log_marginal(self, stats: torch.Tensor) -> torch.Tensor:
        """Log marginal likelihood of each node's labels, the leaf parameters integrated out:
        ``stats [..., S] -> [...]`` float64, finite. 0 for empty statistics (an empty node), and
        ``log_marginal(a + b) - log_marginal(a)`` is the log predictive of the points of ``b`` given
        those of ``a`` (the samplers' split and move ratios are differences of it)."""
        ...

    def predictive_table(self, stats: torch.Tensor) -> torch.Tensor:
        """Each node's posterior predictive of a new label: ``stats [..., S] -> [..., T]``.

        Classification: class probabilities ``[..., K]``, non-negative, rows summing to 1.
        Regression: a Student-t ``(df, loc, scale)`` ``[..., 3]``, ``df > 0``, ``scale > 0``, ``loc``
        the predictive mean (the posterior's ``predict``, intervals and plots read these columns)."""
        ...

    def log_prob_rows(self, rows: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
        """``log p(y_t | row_t)`` for predictive rows ``rows [T_rows, T]`` (rows of
        :meth:`predictive_table`) and labels ``y [T_rows]``: ``[T_rows]`` float64
        (``TreePosterior.log_predictive``). Regression: the Student-t log density of the row."""
        ...

    def config(self) -> Dict[str, Any]:
        """A plain description that a posterior file stores: ``{"name": NAME, **keywords}`` with ``NAME``
        registered (:func:`register_likelihood`) for this class and ``cls(**keywords)`` an equal
        likelihood; values plain (str, int, float, bool, None, lists and dicts of them). Also the
        run's checkpoint fingerprint reads it."""
        ...


#: the hooks every likelihood has (:class:`LeafLikelihood`)
REQUIRED_HOOKS = ("task", "stats_dtype", "n_stats", "point_stats", "log_marginal", "predictive_table",
                  "log_prob_rows", "config")

#: optional hooks -> what they are and what happens without them
OPTIONAL_HOOKS: Dict[str, str] = {
    "log_marginal_counts": (
        "log_marginal_counts(counts [..., K] integral, n_max: int, totals [...] = None) -> [...] float64: "
        "log_marginal of integral class counts (all <= n_max, as are their sums ``totals``) by table lookup. "
        "Classification only; it must equal log_marginal. Without it (or when a subclass overrides "
        "log_marginal but inherits it, see counts_hook) the samplers call log_marginal."),
    "mean_table": (
        "mean_table(stats [..., 3]) -> [..., 3]: regression only, each node's Student-t (df, loc, scale) "
        "posterior of the leaf's mean, loc equal to predictive_table's; scale > 0. Without it "
        "predict_interval(kind='mean') is refused (kind='predictive' needs only predictive_table)."),
    "log_predictive_point": (
        "log_predictive_point(table_rows [..., M, T], y [M]) -> [..., M] float64: log_prob_rows for a batch "
        "of gathered rows. Nothing in the package calls it; checked when present."),
}


def missing_hooks(likelihood: Any) -> List[str]:
    """The :data:`REQUIRED_HOOKS` that ``likelihood`` lacks (methods must be callable)."""
    out = []
    for h in REQUIRED_HOOKS:
        v = getattr(likelihood, h, None)
        if v is None or (h not in ("task", "stats_dtype") and not callable(v)):
            out.append(h)
    return out


def check_hooks(likelihood: Any) -> None:
    """Refuse (``TypeError``) a likelihood without a required hook, naming every missing one, or with a
    ``task`` that is neither of :data:`TASKS`."""
    missing = missing_hooks(likelihood)
    if missing:
        raise TypeError(f"the likelihood {likelihood!r} ({type(likelihood).__qualname__}) lacks "
                        f"{', '.join(missing)}: a leaf likelihood has {', '.join(REQUIRED_HOOKS)} "
                        "(torchtree.model.likelihood_protocol.LeafLikelihood; docs/writing_a_likelihood.md)")
    if likelihood.task not in TASKS:
        raise TypeError(f"the likelihood {likelihood!r} has task={likelihood.task!r}; it must be one of {TASKS}")


def _owner(cls: type, name: str) -> Optional[type]:
    return next((c for c in cls.__mro__ if name in vars(c)), None)


@functools.lru_cache(maxsize=None)
def _counts_overridden(cls: type) -> bool:
    """Whether ``cls`` overrides ``log_marginal`` below the class that defines its ``log_marginal_counts``
    (once per class: the samplers ask at every growth step)."""
    counts_cls, marginal_cls = _owner(cls, "log_marginal_counts"), _owner(cls, "log_marginal")
    return (counts_cls is not None and marginal_cls is not None and marginal_cls is not counts_cls
            and issubclass(marginal_cls, counts_cls))


def counts_hook(likelihood: Any) -> Optional[Callable[..., torch.Tensor]]:
    """``likelihood.log_marginal_counts`` where the samplers may use it instead of ``log_marginal``: present,
    not None, and not inherited from a class whose ``log_marginal`` this class overrides (a subclass that
    changes ``log_marginal`` alone would otherwise be scored by its parent's lookup tables)."""
    fn = getattr(likelihood, "log_marginal_counts", None)
    if fn is None or not callable(fn) or _counts_overridden(type(likelihood)):
        return None
    return fn


#: the likelihood classes a posterior file can name (``config()["name"]``)
LIKELIHOODS = ConfigRegistry("likelihood", "torchtree.register_likelihood")


C = TypeVar("C", bound=type)


@overload
def register_likelihood(cls: C, *, name: Optional[str] = None) -> C: ...


@overload
def register_likelihood(cls: None = None, *, name: Optional[str] = None) -> Callable[[C], C]: ...


def register_likelihood(cls: Optional[type] = None, *, name: Optional[str] = None) -> Any:
    """Register a leaf-likelihood class, so that a saved posterior that uses it loads again.

    Use as a decorator, ``@register_likelihood`` or ``@register_likelihood(name="...")``, or call
    ``register_likelihood(cls)``. The name (default: the class's ``__name__``) is what the objects'
    ``config()["name"]`` returns; loading a file calls ``cls(**keywords)`` with the rest of the saved
    ``config()``. A file can only be loaded in a process that has registered the class (imported the
    module that defines it); ``TreePosterior.save`` refuses a likelihood that is not registered.

    Parameters
    ----------
    cls : class, the likelihood class (omitted when used as ``@register_likelihood(name=...)``)
    name : str, optional

    Returns
    -------
    ``cls`` (or, without ``cls``, a decorator)

    Raises
    ------
    ValueError
        ``name`` is taken by another class.
    """
    return LIKELIHOODS.register(cls, name=name)


def likelihood_from_config(cfg: Dict[str, Any]) -> Any:
    """Inverse of ``likelihood.config()``: the registered class named by ``cfg["name"]``, built from the other
    keys (``ValueError`` listing the registered names for an unknown one)."""
    return LIKELIHOODS.build(cfg)
