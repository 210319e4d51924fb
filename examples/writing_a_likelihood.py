"""A leaf likelihood of one's own (docs/writing_a_likelihood.md).

``WeightedDirichletMultinomial`` is the Dirichlet-multinomial leaf model with a prior that is not
symmetric: a leaf's class probabilities are ``Dirichlet(alpha * w)`` for prior class shares ``w``
(the built-in ``DirichletMultinomial`` is ``w`` uniform). With ``w`` the training shares of an
unbalanced table, a leaf with few points is pulled towards the overall class frequencies instead of
towards equal probabilities.

The script checks the class against the contract (``torchtree.testing.check_likelihood``), fits
top-down SMC with it and with the built-in leaf model on the Pima diabetes table (65% / 35%),
compares their test scores, then saves the posterior and loads it back: loading finds the class
because it is registered.

Usage::

    python examples/writing_a_likelihood.py            # 1000 particles
    python examples/writing_a_likelihood.py --smoke    # seconds, for the test-suite
"""
# smoke-expect: ^check_likelihood: passed$
# smoke-expect: ^weighted prior: accuracy 0\.\d+, log p\(y\|x\) -\d
# smoke-expect: ^reloaded WeightedDirichletMultinomial\(.*\): same probabilities: True$
from __future__ import annotations

import argparse
import os
import sys
import tempfile
from typing import Dict, Optional, Sequence

import numpy as np
import torch

from torchtree import register_likelihood

__all__ = ["WeightedDirichletMultinomial"]


@register_likelihood
class WeightedDirichletMultinomial:
    """Dirichlet-multinomial leaves with prior ``p_leaf ~ Dirichlet(alpha * w)``, ``w = weights / sum(weights)``.

    ``log l(m) = lgamma(A) - sum_k lgamma(a_k) + sum_k lgamma(m_k + a_k) - lgamma(sum_k m_k + A)`` with
    ``a = alpha * w``, ``A = alpha``; the predictive of a leaf with class counts ``m`` is
    ``(m_k + a_k) / (sum m + A)``. ``weights`` are in the order of the class codes (the estimator's
    ``classes_``, sorted labels).
    """

    task = "classification"
    stats_dtype = torch.float32  # class counts, exact up to 2^24 points

    def __init__(self, weights: Sequence[float], alpha: float = 5.0) -> None:
        w = torch.as_tensor(weights, dtype=torch.float64)
        if w.dim() != 1 or w.numel() < 2 or not bool((w > 0).all() & torch.isfinite(w).all()):
            raise ValueError(f"weights must be 2 or more positive numbers, got {weights!r}")
        if not float(alpha) > 0 or not np.isfinite(float(alpha)):
            raise ValueError(f"alpha must be a positive finite number, got {alpha}")
        self.weights, self.alpha = [float(v) for v in weights], float(alpha)  # as given: config() round-trips
        self.conc = float(alpha) * w / w.sum()  # a_k [K]

    def n_stats(self, data) -> int:
        """S = K, refusing data with another number of classes."""
        if data.n_classes != len(self.weights):
            raise ValueError(f"{len(self.weights)} class weights for data with {data.n_classes} classes")
        return len(self.weights)

    def point_stats(self, y: torch.Tensor, n_classes: Optional[int] = None) -> torch.Tensor:
        """One-hot rows ``[N] -> [N, K]``."""
        return torch.nn.functional.one_hot(y.long(), len(self.weights)).to(self.stats_dtype)

    def log_marginal(self, stats: torch.Tensor) -> torch.Tensor:
        """``[..., K] -> [...]`` float64."""
        m, a = stats.double(), self.conc.to(stats.device)
        return (torch.lgamma(a.sum()) - torch.lgamma(a).sum() + torch.lgamma(m + a).sum(-1)
                - torch.lgamma(m.sum(-1) + a.sum()))

    def predictive_table(self, stats: torch.Tensor) -> torch.Tensor:
        """Class probabilities ``[..., K] -> [..., K]``."""
        m, a = stats.double(), self.conc.to(stats.device)
        return (m + a) / (m.sum(-1, keepdim=True) + a.sum())

    def log_prob_rows(self, rows: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
        """``log rows[t, y_t]``: ``[T, K], [T] -> [T]`` float64."""
        return torch.gather(rows, 1, y.long()[:, None]).squeeze(1).double().log()

    def config(self) -> Dict:
        """``{"name", "weights", "alpha"}``: what a posterior file stores."""
        return {"name": "WeightedDirichletMultinomial", "weights": list(self.weights), "alpha": self.alpha}

    def __repr__(self) -> str:
        return f"WeightedDirichletMultinomial(weights={[round(v, 3) for v in self.weights]}, alpha={self.alpha:g})"


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--n-particles", type=int, default=1000)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--smoke", action="store_true", help="tiny run (for the test suite)")
    args = p.parse_args(argv)
    if args.smoke:
        args.n_particles = 50

    from torchtree import BayesianTreeClassifier, load_posterior
    from torchtree.datasets import load_table
    from torchtree.testing import check_likelihood

    t = load_table("pima_diabetes")
    perm = np.random.default_rng(args.seed).permutation(len(t.y))
    perm = perm[:300] if args.smoke else perm
    n_tr = int(0.7 * len(perm))
    tr, te = perm[:n_tr], perm[n_tr:]
    labels, counts = np.unique(t.y[tr], return_counts=True)
    lik = WeightedDirichletMultinomial(counts / counts.sum(), alpha=5.0)
    check_likelihood(lik, n_classes=len(labels))  # raises AssertionError naming the hook at fault
    print("check_likelihood: passed")

    fits = {}
    for name, extra in (("weighted prior", {"likelihood": lik}), ("symmetric prior", {"alpha": 5.0, "hyper": "fixed"})):
        clf = BayesianTreeClassifier("smc", n_particles=args.n_particles, random_state=args.seed, verbose=0, **extra)
        clf.fit(t.X[tr], t.y[tr])
        fits[name] = clf
        print(f"{name}: accuracy {clf.score(t.X[te], t.y[te]):.3f}, log p(y|x) {clf.log_predictive(t.X[te], t.y[te]):.4f}")

    post = fits["weighted prior"].posterior_
    with tempfile.TemporaryDirectory() as tmp:
        path = os.path.join(tmp, "weighted.pt")
        post.save(path)
        back = load_posterior(path)
    same = np.array_equal(back.predict_proba(t.X[te]), post.predict_proba(t.X[te]))
    print(f"reloaded {back.likelihood!r}: same probabilities: {same}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
