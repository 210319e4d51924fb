"""``Posterior``: the one protocol of a sampler's result, hard trees or soft.

:class:`~torchtree.model.posterior.TreePosterior` (weighted hard trees: top-down SMC, MCMC,
SMC with moves) and :class:`~torchtree.model.soft_posterior.SoftTreePosterior` (soft-tree
draws per topology: NUTS, DCC) both implement it and neither inherits the other. Code that
takes any posterior (the estimators, the CLI, benchmarks) uses only what is declared here;
what both compute the same way (``accuracy``, ``rmse``, label coding) is written once below.
"""
from __future__ import annotations

import os
from typing import TYPE_CHECKING, Any, Dict, Optional, Sequence, Union

import numpy as np
import torch

from torchtree.core.warn import warn
from torchtree.model.inputs import ArrayLike, check_no_missing_labels

__all__ = ["Posterior", "StrPath"]

#: a file path: ``str`` or ``os.PathLike[str]`` (``pathlib.Path``), as every ``save`` / ``load`` takes
StrPath = Union[str, os.PathLike[str]]


def dot_text(s) -> str:
    """``s`` inside a double-quoted Graphviz label: backslashes and double quotes escaped."""
    return str(s).replace("\\", "\\\\").replace('"', '\\"')


class Posterior:
    """What every posterior offers (see the module notes).

    Attributes
    ----------
    task : {"classification", "regression"}
    n_features : int, the number of input columns
    classes_ : numpy array [K] of the original labels, or None (regression)
    n_particles : int, draws or particles behind the posterior
    info : dict, the sampler's run facts and diagnostics
    log_evidence : float or None, the estimate of ``log p(y | X)`` where the method has one
    weights : Tensor [P] float64, the normalised weights of the posterior's members
    FORMAT : str, the format tag of the files :meth:`save` writes
    """

    FORMAT: str = ""
    info: Dict[str, Any]
    n_features: int
    classes_: Optional[np.ndarray]
    n_particles: int

    if TYPE_CHECKING:  # read-only to users of the protocol: an attribute of some kinds, a property of others
        @property
        def weights(self) -> torch.Tensor:
            """The normalised weights of the posterior's members, Tensor [P] float64."""

        @property
        def log_evidence(self) -> Optional[float]:
            """The estimate of ``log p(y | X)``, or None where the method has none."""

    # ------------------------------------------------------------- the protocol
    @property
    def task(self) -> str:
        """``"classification"`` or ``"regression"``."""
        raise NotImplementedError

    def predict_proba(self, X: ArrayLike) -> np.ndarray:
        """Posterior predictive class probabilities ``[M, K]`` (classification)."""
        raise NotImplementedError

    def predict(self, X: ArrayLike) -> np.ndarray:
        """Most probable class (original labels) or predictive mean, ``[M]``."""
        raise NotImplementedError

    def predict_interval(self, X: ArrayLike, level: float = 0.9, n_draws: int = 4000, seed: int = 0,
                         kind: str = "predictive") -> np.ndarray:
        """Equal-tailed posterior interval ``[M, 2]`` (regression) of a new ``y`` or, with ``kind="mean"``, of
        the regression function ``f(x)`` (:data:`~torchtree.model.interval.KINDS`), from ``n_draws`` Monte
        Carlo draws per row seeded by ``seed``."""
        raise NotImplementedError

    def log_predictive(self, X: ArrayLike, y: ArrayLike) -> float:
        """Mean log posterior predictive density of ``(X, y)``."""
        raise NotImplementedError

    def summary(self) -> Dict[str, Any]:
        """A dict of the posterior's statistics and the sampler's diagnostics."""
        raise NotImplementedError

    def to_dot(self, i: Optional[int] = None, feature_names: Optional[Sequence[str]] = None) -> str:
        """Graphviz DOT text of member ``i`` (default: the heaviest)."""
        raise NotImplementedError

    def save(self, path: StrPath) -> None:
        """Write the posterior to ``path`` (a ``str`` or ``os.PathLike``; checksummed, atomic)."""
        raise NotImplementedError

    @classmethod
    def load(cls, path: StrPath, device: Union[str, torch.device, None] = None) -> "Posterior":
        """Read a posterior that :meth:`save` wrote (``path`` a ``str`` or ``os.PathLike``; ``device`` where
        its tensors go, default the CPU): each kind's class reads its own files
        (``TreePosterior.load``, ``BARTPosterior.load``, ``SoftTreePosterior.load``);
        :func:`torchtree.load_posterior` reads a file of any kind."""
        raise NotImplementedError(f"{cls.__name__}.load: each kind of posterior reads its own files "
                                  "(TreePosterior.load, BARTPosterior.load, SoftTreePosterior.load); "
                                  "torchtree.load_posterior(path) reads a file of any kind")

    # ------------------------------------------------------- written once for both
    def accuracy(self, X: ArrayLike, y: ArrayLike) -> float:
        """Fraction of test points whose predicted class equals ``y``. Rows whose label was not seen in training
        (not among ``classes_``; without ``classes_``, not a class index the model predicts) count as errors,
        with a warning naming the labels, as the estimators' ``score``; a missing label is refused (``ValueError``)."""
        if self.task != "classification":
            raise ValueError("accuracy applies to classification")
        pred = self.predict(X)
        yn = np.asarray(y.cpu() if isinstance(y, torch.Tensor) else y)
        if yn.shape[0] != pred.shape[0]:
            raise ValueError(f"X has {pred.shape[0]} rows but y has {yn.shape[0]}")
        check_no_missing_labels(yn)
        if self.classes_ is not None:
            known = set(self.classes_.tolist())
        else:
            known = set(range(int(self.predict_proba(X[:1] if hasattr(X, "__getitem__") else X).shape[1])))
        unseen = sorted({v for v in yn.tolist() if v not in known}, key=str)
        if unseen:
            warn(f"y holds label(s) {unseen[:5]} not seen in training (classes: {sorted(known, key=str)}): their "
                 "rows count as errors", UserWarning)
        return float(np.mean(pred == yn))

    def rmse(self, X: ArrayLike, y: ArrayLike) -> float:
        """Root mean squared error of the posterior predictive mean (regression; a classification
        posterior raises ``ValueError``, as :meth:`accuracy` does for regression)."""
        if self.task != "regression":
            raise ValueError("rmse applies to regression; use accuracy (or log_predictive) for classification")
        pred = self.predict(X)
        yn = np.asarray(y.cpu() if isinstance(y, torch.Tensor) else y, dtype=np.float64)
        check_no_missing_labels(yn, what="target")
        return float(np.sqrt(np.mean((pred - yn) ** 2)))

    def _encode_y(self, y, M: int) -> torch.Tensor:
        yn = np.asarray(y.cpu() if isinstance(y, torch.Tensor) else y)
        if yn.ndim != 1 or yn.shape[0] != M:
            raise ValueError(f"y must be 1-D with {M} entries, got shape {yn.shape}")
        if self.task == "regression":
            yf = yn.astype(np.float64)
            check_no_missing_labels(yf, what="target")
            return torch.as_tensor(yf)
        check_no_missing_labels(yn)
        if self.classes_ is None:
            return torch.as_tensor(yn.astype(np.int64))
        lookup = {c: i for i, c in enumerate(self.classes_.tolist())}
        try:
            return torch.as_tensor([lookup[v] for v in yn.tolist()], dtype=torch.long)
        except KeyError as exc:
            raise ValueError(f"label {exc.args[0]!r} was not seen in training") from exc
