"""Priors over decision trees.

``ChipmanPrior`` is the model of Chipman et al. (1998) as written in paper 001
(eq. 4-5): a node of depth ``q`` splits with probability ``alpha_s (1 + q)^-beta_s``
unless no dimension varies among its data, the cut dimension is uniform over the
varying dimensions ``D_p`` and the cut location uniform over the node's data
range ``I_p`` in that dimension.

``PoissonPrior`` is paper 002's eq. 14: a zero-truncated Poisson on the number of
leaves ``m``, ``p(T) = lam^m / ((e^lam - 1) m!)``; the split rules (eq. 13) use the
same data-dependent dimension and location densities as ``ChipmanPrior`` so that
the two priors differ only in the shape term. Like the paper's, it is not
normalised over tree shapes with the same number of leaves.
"""
from __future__ import annotations

import math
from typing import Any, Callable, Dict, Optional, Tuple, TypeVar, overload

import torch

from torchtree.model.feature_groups import choice_count
from torchtree.model.registry import ConfigRegistry

from torchtree.model.trees import INTERNAL, LEAF, OPEN, HardTrees
from torchtree.core.validate import check_real

#: the Chipman prior's defaults (Chipman, George & McCulloch 1998; paper 001): split probability
#: ``ALPHA_SPLIT (1 + depth)^-BETA_SPLIT``; and the Poisson prior's rate of leaves (paper 002)
ALPHA_SPLIT, BETA_SPLIT, POISSON_LAMBDA = 0.95, 0.5, 5.0

__all__ = ["ALPHA_SPLIT", "BETA_SPLIT", "POISSON_LAMBDA", "ChipmanPrior", "PoissonPrior", "check_split_prior", "node_ranges", "prior_from_config", "make_prior", "PRIORS", "register_prior"]

#: the prior classes a saved description can name (``config()["name"]``)
PRIORS = ConfigRegistry("prior", "torchtree.model.priors.register_prior")


C = TypeVar("C", bound=type)


@overload
def register_prior(cls: C, *, name: Optional[str] = None) -> C: ...


@overload
def register_prior(cls: None = None, *, name: Optional[str] = None) -> Callable[[C], C]: ...


def register_prior(cls: Optional[type] = None, *, name: Optional[str] = None) -> Any:
    """Register a tree-prior class so that :func:`prior_from_config` rebuilds it from its ``config()``
    (``{"name": NAME, **constructor keywords}``). A decorator (``@register_prior(name="chipman")``) or a call;
    the name defaults to the class's ``__name__`` and must be what ``config()["name"]`` returns. (Posterior
    files store no prior; a run's checkpoint fingerprint reads its ``config()``.)

    Returns
    -------
    ``cls`` (or, without ``cls``, a decorator)
    """
    return PRIORS.register(cls, name=name)


def node_ranges(trees: HardTrees, X: torch.Tensor, chunk_pairs: int = 1 << 22) -> Tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Data extent of every node: min and max of ``X`` over the points in it.

    Parameters
    ----------
    trees : HardTrees (P trees, capacity C)
    X : Tensor [N, D] training features

    Returns
    -------
    lo, hi : Tensor [P, C, D] (``+inf`` / ``-inf`` for empty nodes)
    count : LongTensor [P, C] points per node
    """
    P, C = trees.n_trees, trees.capacity
    N, D = X.shape
    dev = trees.device
    lo = torch.full((P, C, D), math.inf, dtype=X.dtype, device=dev)
    hi = torch.full((P, C, D), -math.inf, dtype=X.dtype, device=dev)
    count = torch.zeros(P, C, dtype=torch.long, device=dev)
    step = max(1, chunk_pairs // max(N, 1))
    feat, thr = trees.feature.long(), trees.threshold
    lch, rch = trees.left.long(), trees.right.long()
    for s in range(0, P, step):
        e = min(P, s + step)
        p = torch.arange(s, e, device=dev)[:, None].expand(-1, N).reshape(-1)
        pt = torch.arange(N, device=dev).repeat(e - s)
        node = torch.zeros_like(p)
        while p.numel():
            flat = p * C + node
            count.view(-1).index_add_(0, flat, torch.ones_like(flat))
            xs = X[pt]
            fidx = flat[:, None].expand(-1, D)
            lo.view(P * C, D).scatter_reduce_(0, fidx, xs, "amin")
            hi.view(P * C, D).scatter_reduce_(0, fidx, xs, "amax")
            f = feat[p, node]
            inner = f >= 0
            p, pt, node, f = p[inner], pt[inner], node[inner], f[inner]
            go_left = X[pt, f] <= thr[p, node]
            node = torch.where(go_left, lch[p, node], rch[p, node])
    return lo, hi, count


def check_split_prior(alpha_split: float, beta_split: float) -> Tuple[float, float]:
    """Validate the Chipman split probability ``p_split(d) = alpha_split (1 + d)**(-beta_split)``.

    ``alpha_split`` must lie in (0, 1): at 0 no tree splits, at 1 the root can never
    be a leaf and, with ``beta_split = 0``, no node ever stops. ``beta_split >= 0``.

    Returns
    -------
    (alpha_split, beta_split) as floats
    """
    return (check_real("alpha_split", alpha_split, 0.0, 1.0, high_open=True),
            check_real("beta_split", beta_split, 0.0, low_open=False))


@register_prior(name="chipman")
class ChipmanPrior:
    """Chipman et al. (1998) tree prior with data-dependent split support (paper 001 eq. 4-5).

    Parameters
    ----------
    alpha_split : float in (0, 1)
        ``alpha_s``: base split probability.
    beta_split : float >= 0
        ``beta_s``: depth penalty exponent.
    """

    name = "chipman"

    def __init__(self, alpha_split: float = ALPHA_SPLIT, beta_split: float = BETA_SPLIT) -> None:
        check_split_prior(alpha_split, beta_split)
        self.alpha_split, self.beta_split = float(alpha_split), float(beta_split)

    def split_prob(self, depth: torch.Tensor) -> torch.Tensor:
        """``alpha_s (1 + depth)^-beta_s`` elementwise, float64."""
        return self.alpha_split * (1.0 + depth.double()).pow(-self.beta_split)

    def log_split_probs(self, depth: torch.Tensor) -> Tuple[torch.Tensor, torch.Tensor]:
        """``(log p_split, log (1 - p_split))`` elementwise, float64."""
        p = self.split_prob(depth)
        return p.log(), torch.log1p(-p)

    def log_prob(self, trees: HardTrees, data) -> torch.Tensor:
        """Log prior density of complete trees (eq. 5).

        Open leaves are scored as stopped leaves. A split outside the support
        (no varying dimension, a cut outside ``[min, max)`` of the node's data in
        that dimension, an empty child) gets ``-inf``.

        Parameters
        ----------
        trees : HardTrees [P]
        data : Data (training data the prior is conditioned on)

        Returns
        -------
        Tensor [P] float64
        """
        rule, nvary = self._rule_terms(trees, data)
        return self._shape_terms(trees, nvary) + rule

    def _rule_terms(self, trees: HardTrees, data):
        lo, hi, count = node_ranges(trees, data.X)
        varying = hi > lo
        nvary = varying.sum(-1)
        internal = trees.status == INTERNAL
        f = trees.feature.long().clamp(min=0)
        lo_f = torch.gather(lo, 2, f[..., None]).squeeze(-1).double()
        hi_f = torch.gather(hi, 2, f[..., None]).squeeze(-1).double()
        rng = (hi_f - lo_f)
        thr = trees.threshold.double()
        ok = (nvary > 0) & (rng > 0) & (thr >= lo_f) & (thr < hi_f)
        n_choice = choice_count(varying, f, getattr(data, "groups", None))
        term = torch.where(ok, -torch.log(n_choice.clamp(min=1).double()) - torch.log(rng.clamp(min=1e-300)), torch.full_like(rng, -math.inf))
        rule = torch.where(internal, term, torch.zeros_like(term)).sum(1)
        used = trees.status != 0
        empty = (used & (count == 0)).any(1)
        rule = torch.where(empty, torch.full_like(rule, -math.inf), rule)
        return rule, nvary

    def _shape_terms(self, trees: HardTrees, nvary: torch.Tensor) -> torch.Tensor:
        lps, lpn = self.log_split_probs(trees.depth)
        leaf = (trees.status == LEAF) | (trees.status == OPEN)
        internal = trees.status == INTERNAL
        leaf_term = torch.where(leaf & (nvary > 0), lpn, torch.zeros_like(lpn))
        int_term = torch.where(internal, lps, torch.zeros_like(lps))
        return (leaf_term + int_term).sum(1)

    def config(self) -> Dict:
        """Plain description for saving."""
        return {"name": "chipman", "alpha_split": self.alpha_split, "beta_split": self.beta_split}

    def __repr__(self) -> str:
        return f"ChipmanPrior(alpha_split={self.alpha_split}, beta_split={self.beta_split})"


@register_prior(name="poisson")
class PoissonPrior:
    """Paper 002's prior: zero-truncated Poisson(``lam``) on the number of leaves (eq. 14).

    Parameters
    ----------
    lam : float > 0
        Poisson rate ``lambda``.
    """

    name = "poisson"

    def __init__(self, lam: float = 5.0) -> None:
        if not float(lam) > 0 or not math.isfinite(float(lam)):
            raise ValueError(f"poisson lambda must be positive and finite, got {lam}")
        self.lam = float(lam)
        self._rules = ChipmanPrior()

    def log_prob_leaves(self, n_leaves: torch.Tensor) -> torch.Tensor:
        """``log p(m) = m log lam - log(e^lam - 1) - log m!``, elementwise float64."""
        m = n_leaves.double()
        # log(e^lam - 1) = lam + log(1 - e^-lam): no overflow for large lam
        log_norm = self.lam + math.log(-math.expm1(-self.lam))
        return m * math.log(self.lam) - log_norm - torch.lgamma(m + 1)

    def log_prob(self, trees: HardTrees, data) -> torch.Tensor:
        """Log prior of complete trees: leaf-count term plus split-rule densities.

        Returns
        -------
        Tensor [P] float64
        """
        rule, _ = self._rules._rule_terms(trees, data)
        return self.log_prob_leaves(trees.n_leaves()) + rule

    def config(self) -> Dict:
        """Plain description for saving."""
        return {"name": "poisson", "lam": self.lam}

    def __repr__(self) -> str:
        return f"PoissonPrior(lam={self.lam})"


def prior_from_config(cfg: Dict):
    """Inverse of ``prior.config()``: the class registered (:func:`register_prior`) as ``cfg["name"]``, built
    from the other keys (``ValueError`` listing the registered names for an unknown one)."""
    return PRIORS.build(cfg)


_SPLIT_DEFAULTS = {"alpha_split": ALPHA_SPLIT, "beta_split": BETA_SPLIT, "poisson_lambda": POISSON_LAMBDA}


def make_prior(prior=None, alpha_split: float = _SPLIT_DEFAULTS["alpha_split"],
               beta_split: float = _SPLIT_DEFAULTS["beta_split"], poisson_lambda: float = _SPLIT_DEFAULTS["poisson_lambda"]):
    """Resolve a sampler's ``prior`` argument.

    Parameters
    ----------
    prior : ChipmanPrior, PoissonPrior, "chipman", "poisson" or None (= "chipman")
    alpha_split, beta_split : float, parameters of ``"chipman"``
    poisson_lambda : float, rate of ``"poisson"``

    Returns
    -------
    the prior object (an object is returned as is)

    Raises
    ------
    ValueError
        An unknown name, or a parameter changed from its default that the chosen
        prior does not take (it would otherwise be dropped without a word).
    """
    given = {"alpha_split": alpha_split, "beta_split": beta_split, "poisson_lambda": poisson_lambda}
    if prior is None or (isinstance(prior, str) and prior == "chipman"):
        unused, out = ["poisson_lambda"], None
    elif isinstance(prior, str) and prior == "poisson":
        unused, out = ["alpha_split", "beta_split"], None
    elif isinstance(prior, str):
        raise ValueError(f"prior must be 'chipman', 'poisson' or a prior object, got {prior!r}")
    else:
        unused, out = list(given), prior
    changed = [n for n in unused if given[n] != _SPLIT_DEFAULTS[n]]
    if changed:
        raise ValueError(f"{', '.join(changed)} do(es) not apply to prior={prior!r}; "
                         f"set them on the prior itself or pick the prior they belong to")
    if out is not None:
        return out
    if prior == "poisson":
        return PoissonPrior(poisson_lambda)
    return ChipmanPrior(alpha_split, beta_split)
