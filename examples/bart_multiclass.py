"""Three classes with BART: class probabilities with their posterior uncertainty.

``BayesianTreeClassifier(method="bart")`` fits a sum of trees per class but the first (multinomial
probit). Besides the predictive probabilities (the mean over the posterior draws), each draw's class
probabilities are available, so a prediction comes with a credible interval: wide where the classes
overlap, narrow where the data decide.

Usage::

    python examples/bart_multiclass.py            # iris, BART's defaults (about 30 CPU s)
    python examples/bart_multiclass.py --smoke    # seconds, for the test-suite
"""
# smoke-expect: ^bart multiclass: accuracy [0-9.]+, log predictive -?[0-9.]+
# smoke-expect: ^point \d+: class probabilities
from __future__ import annotations

import argparse

import numpy as np

from torchtree import BayesianTreeClassifier
from torchtree.datasets import load_table


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--smoke", action="store_true", help="a tiny run (the test-suite)")
    args = ap.parse_args(argv)
    t = load_table("iris")
    X, y = np.asarray(t.X, dtype=np.float64), np.asarray(t.y)
    perm = np.random.default_rng(0).permutation(len(y))
    tr, te = perm[:100], perm[100:]
    size = dict(n_trees=20, n_warmup=30, n_samples=30, n_chains=2) if args.smoke else {}
    clf = BayesianTreeClassifier(method="bart", random_state=0, **size).fit(X[tr], y[tr])
    acc = float((clf.predict(X[te]) == y[te]).mean())
    print(f"bart multiclass: accuracy {acc:.3f}, log predictive {clf.log_predictive(X[te], y[te]):.3f} "
          f"({len(clf.classes_)} classes, {clf.posterior_.n_particles} draws)")
    draws = clf.posterior_.class_probability_draws(X[te[:3]]).numpy()  # [draws, classes, points]
    for i in range(3):
        mean = draws[:, :, i].mean(0)
        lo, hi = np.quantile(draws[:, :, i], [0.05, 0.95], axis=0)
        cells = ", ".join(f"{c}: {m:.2f} [{a:.2f}, {b:.2f}]" for c, m, a, b in zip(clf.classes_, mean, lo, hi))
        print(f"point {te[i]}: class probabilities (mean [90% interval]) {cells}; true class {y[te[i]]}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
