"""The ``torchtree`` command line (``python -m torchtree``)."""
from __future__ import annotations

import argparse
import sys
import time
from typing import List, Optional

import numpy as np

__all__ = ["main", "demo"]


def _demo_data(seed: int = 0):
    """scikit-learn's bundled breast-cancer data (569 x 30) split 70/30, or, without
    scikit-learn, a synthetic axis-aligned problem of the same size."""
    rng = np.random.default_rng(seed)
    try:
        from sklearn.datasets import load_breast_cancer

        ds = load_breast_cancer()
        X, y, name = ds.data, ds.target, "breast-cancer (sklearn bundled, 569 x 30)"
    except ImportError:  # pragma: no cover - sklearn is in the test extra
        X = rng.uniform(size=(569, 30))
        y = ((X[:, 0] > 0.5) ^ (X[:, 1] > 0.3)).astype(int)
        flip = rng.uniform(size=569) < 0.05
        y = np.where(flip, 1 - y, y)
        name = "synthetic XOR (569 x 30)"
    perm = rng.permutation(len(y))
    n_tr = int(0.7 * len(y))
    return X[perm[:n_tr]], y[perm[:n_tr]], X[perm[n_tr:]], y[perm[n_tr:]], name


def _cart_row(Xtr, ytr, Xte, yte, alpha: float = 5.0):
    try:
        from sklearn.tree import DecisionTreeClassifier
    except ImportError:  # pragma: no cover
        return None
    t0 = time.perf_counter()
    clf = DecisionTreeClassifier(criterion="gini", min_samples_leaf=10, random_state=0).fit(Xtr, ytr)
    secs = time.perf_counter() - t0
    # Laplace-smoothed leaf probabilities with the same total concentration alpha.
    leaves_tr = clf.apply(Xtr)
    K = len(clf.classes_)
    counts = np.zeros((clf.tree_.node_count, K))
    np.add.at(counts, (leaves_tr, np.searchsorted(clf.classes_, ytr)), 1)
    probs = (counts + alpha / K) / (counts.sum(1, keepdims=True) + alpha)
    p = probs[clf.apply(Xte), np.searchsorted(clf.classes_, yte)]
    return ("CART (gini, min_samples_leaf=10)", "-", secs, clf.score(Xte, yte), float(np.log(p).mean()))


def demo(seed: int = 0, out=sys.stdout) -> List[tuple]:
    """Fit the README's main job on the embedded dataset and print a table.

    Returns
    -------
    list of (method, particles, seconds, accuracy, log_predictive) rows.
    """
    from .estimators import BayesianTreeClassifier

    Xtr, ytr, Xte, yte, name = _demo_data(seed)
    print(f"torchtree demo: {name}; train {len(ytr)}, test {len(yte)}", file=out)
    rows = []
    configs = [
        ("smc", dict(n_particles=100, n_islands=5, proposal="prior"), "top-down SMC, prior proposal"),
        ("smc", dict(n_particles=1000, n_islands=5, proposal="prior"), "top-down SMC, prior proposal"),
        ("smc", dict(n_particles=100, n_islands=5, proposal="optimal"), "top-down SMC, optimal proposal"),
    ]
    for method, opts, label in configs:
        clf = BayesianTreeClassifier(method, random_state=seed, **opts)
        t0 = time.perf_counter()
        clf.fit(Xtr, ytr)
        secs = time.perf_counter() - t0
        rows.append((label, opts.get("n_particles", "-"), secs, clf.score(Xte, yte), clf.log_predictive(Xte, yte)))
    cart = _cart_row(Xtr, ytr, Xte, yte)
    if cart:
        rows.append(cart)
    print(f"{'method':36s} {'particles':>9s} {'seconds':>8s} {'accuracy':>9s} {'log p(y|x)':>11s}", file=out)
    for r in rows:
        print(f"{r[0]:36s} {str(r[1]):>9s} {r[2]:8.2f} {r[3]:9.4f} {r[4]:11.4f}", file=out)
    return rows


def main(argv: Optional[List[str]] = None) -> int:
    """Entry point of the ``torchtree`` command."""
    parser = argparse.ArgumentParser(prog="torchtree", description="Bayesian decision trees as batched PyTorch tensors.")
    sub = parser.add_subparsers(dest="command")
    p_demo = sub.add_parser("demo", help="fit the embedded demo dataset and print a comparison table")
    p_demo.add_argument("--seed", type=int, default=0)
    args = parser.parse_args(argv)
    if args.command == "demo":
        demo(seed=args.seed)
        return 0
    parser.print_help()
    return 2


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
