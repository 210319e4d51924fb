"""BART posterior size and prediction time against the tree sizes it holds.

Fits BART with its defaults but 250 kept draws per chain (200 trees, 4 chains x 250 kept draws) on a table, then prints the
nodes the trees use, the slots the posterior stores (main block + deep trees apart,
``torchtree.model.bart_posterior``), the bytes of the saved file, and the CPU seconds of
``predict`` on the training rows, beside the dense ``[S, T, K]`` form (every tree at the deepest
tree's width, what the posterior stored before). One thread.

Usage::

    python benchmarks/bart_posterior_size.py                 # pima_diabetes (768 rows)
    python benchmarks/bart_posterior_size.py --table abalone --smoke
"""
from __future__ import annotations

import argparse
import os
import sys
import tempfile
import time
import warnings

import torch

# smoke-expect: ^nodes used
# smoke-expect: slots stored
# smoke-expect: ^bart_posterior_size: done


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--table", default="pima_diabetes")
    ap.add_argument("--smoke", action="store_true", help="10 trees, 20 + 20 sweeps (the test suite)")
    args = ap.parse_args(argv)
    torch.set_num_threads(1)
    from torchtree import BayesianTreeClassifier, BayesianTreeRegressor
    from torchtree.model.bart import forest_sum
    from torchtree.datasets import load_table

    t = load_table(args.table)
    # 4 x 250 kept draws, as the recorded figures (the estimator's default is now 4 x 100)
    kw = dict(n_trees=10, n_samples=20, n_warmup=20) if args.smoke else dict(n_samples=250)
    cls = BayesianTreeRegressor if t.task == "regression" else BayesianTreeClassifier
    y = t.y if t.task == "regression" else (t.y == t.y.max()).astype(int)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        c0 = time.process_time()
        post = cls(method="bart", random_state=0, **kw).fit(t.X, y).posterior_
        fit = time.process_time() - c0
    f, c, v = post.feature, post.cut, post.value  # the dense form, built for the comparison
    nodes = int((f >= -1).sum())
    stored = sum(a.numel() for a in post._main[:1]) + sum(a.numel() for a in post._deep[:1])
    with tempfile.TemporaryDirectory() as d:
        post.save(os.path.join(d, "p.pt"))
        size = os.path.getsize(os.path.join(d, "p.pt"))
    dense_bytes = f.numel() * (f.element_size() + c.element_size() + v.element_size())
    c0 = time.process_time()
    post.predict(t.X)
    pred = time.process_time() - c0
    Xb = post._bins(t.X)
    c0 = time.process_time()
    forest_sum(f, c, v, Xb)
    pred_dense = time.process_time() - c0
    S, T = post.n_particles, post.n_trees
    print(f"table {args.table}: {len(y)} rows; {S} draws x {T} trees; fit {fit:.1f} CPU s")
    print(f"nodes used      {nodes} ({nodes / (S * T):.2f} per tree, deepest tree {f.shape[-1]} heap slots)")
    print(f"slots stored    {stored} (main block {tuple(post._main[0].shape)}, {post._deep[0].shape[0]} deep trees "
          f"apart); dense form {f.numel()} slots")
    print(f"saved file      {size / 1e6:.1f} MB; dense form {dense_bytes / 1e6:.1f} MB")
    print(f"predict         {pred:.3f} CPU s; dense form {pred_dense:.3f} CPU s (forest sum alone)")
    print("bart_posterior_size: done")
    return 0


if __name__ == "__main__":
    sys.exit(main())
