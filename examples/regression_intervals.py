"""Regression with credible intervals: are the intervals calibrated?

Fits a Bayesian regression tree (Normal-inverse-gamma leaves, top-down SMC) to the
abalone table of the repository's ``data/`` folder (target: ring count), then, on held-out data, prints the RMSE, the log
predictive density, and for several levels the fraction of test targets inside the
equal-tailed posterior predictive interval next to the level asked for, with the
mean interval width. A calibrated posterior covers about the level asked for.

Usage::

    python examples/regression_intervals.py                   # 2000 rows, 500 particles
    python examples/regression_intervals.py --rows 0 --n-particles 2000   # all rows
    python examples/regression_intervals.py --smoke

The same from the shell::

    torchtree fit data/abalone.csv.gz --task regression --n-particles 500 --out abalone.pt
    torchtree predict abalone.pt data/abalone.csv.gz --level 0.9
"""
from __future__ import annotations

import argparse
import sys
import time

import numpy as np


# smoke-expect: ^test RMSE\s+\d
# smoke-expect: ^\s*90%\s+0\.\d+
# smoke-expect: ^regression_intervals: done


def load():
    from torchtree.datasets import load_table, table_path

    t = load_table("abalone")
    return t.X, t.y, f"{table_path('abalone')} (target: rings)"


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--rows", type=int, default=2000, help="use this many rows (0: all)")
    p.add_argument("--n-particles", type=int, default=500)
    p.add_argument("--n-islands", type=int, default=5)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--smoke", action="store_true", help="tiny run (for the test suite)")
    args = p.parse_args(argv)
    if args.smoke:
        args.rows, args.n_particles, args.n_islands = 300, 20, 2

    from torchtree.estimators import BayesianTreeRegressor

    X, y, source = load()
    rng = np.random.default_rng(args.seed)
    perm = rng.permutation(len(y))
    if args.rows:
        perm = perm[: args.rows]
    n_tr = int(0.7 * len(perm))
    tr, te = perm[:n_tr], perm[n_tr:]
    print(f"data: {source}: {len(perm)} of {len(y)} rows, {X.shape[1]} features; train {len(tr)}, test {len(te)}")

    reg = BayesianTreeRegressor("smc", n_particles=args.n_particles, n_islands=args.n_islands, random_state=args.seed)
    t0 = time.perf_counter()
    reg.fit(X[tr], y[tr])
    print(f"fit time         {time.perf_counter() - t0:.2f} s ({args.n_particles} particles, {args.n_islands} islands)")
    post = reg.posterior_
    mean = reg.predict(X[te])
    baseline = float(np.sqrt(np.mean((y[te] - y[tr].mean()) ** 2)))
    print(f"test RMSE        {post.rmse(X[te], y[te]):.4f} (predicting the training mean: {baseline:.4f})")
    print(f"test log p(y|x)  {post.log_predictive(X[te], y[te]):.4f} per point")
    print(f"log evidence     {post.log_evidence:.4f}")
    print("interval coverage on the test data:")
    print(f"  {'level':>5s}  {'covered':>7s}  {'mean width':>10s}")
    for level in (0.5, 0.8, 0.9, 0.95):
        iv = reg.predict_interval(X[te], level=level)
        covered = float(np.mean((y[te] >= iv[:, 0]) & (y[te] <= iv[:, 1])))
        print(f"  {100 * level:4.0f}%  {covered:7.3f}  {float(np.mean(iv[:, 1] - iv[:, 0])):10.3f}")
    iv = reg.predict_interval(X[te[:3]], level=0.9)
    for row, m, (lo, hi) in zip(te[:3], mean[:3], iv):
        print(f"  test row {row}: true {y[row]:.3g}, predicted {m:.3f}, 90% interval [{lo:.3f}, {hi:.3f}]")
    print("regression_intervals: done")
    return 0


if __name__ == "__main__":
    sys.exit(main())
