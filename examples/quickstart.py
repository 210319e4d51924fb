"""Quickstart: fit a Bayesian decision-tree classifier and look at its uncertainty.

Reads a UCI table from the repository's ``data/`` folder
(``torchtree.datasets.load_table``), splits it 70/30,
fits top-down SMC (paper 001's settings: alpha=5, alpha_s=0.95, beta_s=0.5, ESS
threshold 0.1, 5 islands) and prints accuracy, test log predictive, the evidence,
the posterior's tree sizes and a few predicted class probabilities.

Usage::

    python examples/quickstart.py                      # wine, 500 particles
    python examples/quickstart.py --data iris --n-particles 2000
    python examples/quickstart.py --smoke              # tiny, for tests

The same job from the shell::

    torchtree fit data/wine.csv.gz --n-particles 500 --n-islands 5
"""
from __future__ import annotations

import argparse
import sys
import time

import numpy as np


# smoke-expect: ^test accuracy\s+0\.\d+
# smoke-expect: ^log evidence\s+-\d
# smoke-expect: ^quickstart: done


def load(name: str):
    """(X, y, feature names, source) of a table of the repository's ``data/`` folder."""
    from torchtree.datasets import load_table, table_path

    t = load_table(name)
    return t.X, t.y, t.feature_names, str(table_path(name))


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--data", default="wine", help="table name in data/ (default: wine)")
    p.add_argument("--n-particles", type=int, default=500)
    p.add_argument("--n-islands", type=int, default=5)
    p.add_argument("--proposal", default="prior", choices=("prior", "empirical", "optimal"))
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--smoke", action="store_true", help="tiny run (for the test suite)")
    args = p.parse_args(argv)
    if args.smoke:
        args.n_particles, args.n_islands = 20, 2

    from torchtree.estimators import BayesianTreeClassifier

    X, y, names, source = load(args.data)
    rng = np.random.default_rng(args.seed)
    perm = rng.permutation(len(y))
    if args.smoke:
        perm = perm[:150]
    n_tr = int(0.7 * len(perm))
    tr, te = perm[:n_tr], perm[n_tr:]
    print(f"data: {source}: {len(y)} rows, {X.shape[1]} features, {len(np.unique(y))} classes; train {len(tr)}, test {len(te)}")

    clf = BayesianTreeClassifier(
        "smc", n_particles=args.n_particles, n_islands=args.n_islands, proposal=args.proposal,
        alpha=5.0, alpha_split=0.95, beta_split=0.5, ess_threshold=0.1, random_state=args.seed,
    )
    t0 = time.perf_counter()
    clf.fit(X[tr], y[tr])
    secs = time.perf_counter() - t0
    post = clf.posterior_
    s = post.summary()
    print(f"fit time          {secs:.2f} s ({args.n_particles} particles, {args.n_islands} islands, {args.proposal} proposal)")
    print(f"test accuracy     {clf.score(X[te], y[te]):.4f}")
    print(f"test log p(y|x)   {clf.log_predictive(X[te], y[te]):.4f} per point")
    print(f"log evidence      {clf.log_evidence_:.4f}")
    print(f"ESS               {s['ess']:.1f} of {s['n_particles']} particles, {s['n_distinct_trees']} distinct trees")
    print(f"tree size         leaves {s['leaves_mean']:.2f} (max {s['leaves_max']}), depth {s['depth_mean']:.2f} (max {s['depth_max']})")
    usage = s["feature_usage"]
    top = np.argsort(-usage)[:3]
    print("most used features " + ", ".join(f"{names[j]} ({usage[j]:.2f} splits/tree)" for j in top))
    proba = clf.predict_proba(X[te[:3]])
    for row, p_row in zip(te[:3], proba):
        probs = ", ".join(f"{c}: {q:.2f}" for c, q in zip(clf.classes_, p_row))
        print(f"  test row {row}: true {y[row]}, predicted {clf.predict(X[row:row + 1])[0]} ({probs})")
    print("quickstart: done")
    return 0


if __name__ == "__main__":
    sys.exit(main())
