"""Paper 001 (Lakshminarayanan, Roy & Teh, ICML 2013), Figure 2 at a small size.

Top-down SMC on magic04 (random 70/30 split) or pen-digits (predefined split) from
the repository's ``data/``, with the paper's model (alpha=5, alpha_s=0.95, beta_s=0.5), ESS
threshold M/10, node-wise expansion and 5 islands; prior and optimal proposals over a
range of particle counts, plus CART as a reference. Prints the table behind Figure 2
(mean time, test accuracy, test log p(y|x)) and writes it as JSON.

By default it subsamples the training data (``--rows``) so that it finishes in a
minute or two on a laptop; ``--rows 0 --particles 10 100 1000 10000`` is the
paper's full sweep. When the lead's full benchmark (``benchmarks/bench_paper001.py``)
is present, ``--bench`` runs that instead, passing the remaining options through
(``torchtree bench paper001`` does the same).

Usage::

    python examples/paper001_reproduction.py                       # magic04, 2000 rows
    python examples/paper001_reproduction.py --dataset pendigits --particles 10 100 1000
    python examples/paper001_reproduction.py --out paper001_small.json
    python examples/paper001_reproduction.py --smoke
"""
from __future__ import annotations

import argparse
import json
import platform
import runpy
import sys
import time
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
BENCH = Path(__file__).resolve().parents[1] / "benchmarks" / "bench_paper001.py"

# smoke-expect: ^method\s+particles\s+seconds\s+accuracy\s+log p\(y\|x\)
# smoke-expect: ^SMC prior \[node\]\s+\d+
# smoke-expect: ^paper001_reproduction: done


def load(dataset: str, rows: int, seed: int):
    """(Xtr, ytr, Xte, yte, description) with at most ``rows`` training rows (0: all)."""
    from torchtree.datasets import load_table

    rng = np.random.default_rng(seed)

    def read(name):
        t = load_table(name)
        return t.X, t.y

    if dataset == "pendigits":
        Xtr, ytr = read("pendigits_train.csv")
        Xte, yte = read("pendigits_test.csv")
        desc = "pen-digits (predefined split)"
    elif dataset == "magic04":
        X, y = read("magic04.csv")
        perm = rng.permutation(len(y))
        n_tr = int(round(0.7 * len(y)))
        Xtr, ytr, Xte, yte = X[perm[:n_tr]], y[perm[:n_tr]], X[perm[n_tr:]], y[perm[n_tr:]]
        desc = "magic04 (random 70/30 split)"
    else:
        raise SystemExit(f"unknown dataset {dataset!r}")
    if rows and rows < len(ytr):
        keep = rng.permutation(len(ytr))[:rows]
        Xtr, ytr = Xtr[keep], ytr[keep]
        te_keep = rng.permutation(len(yte))[: max(rows // 2, 1)]
        Xte, yte = Xte[te_keep], yte[te_keep]
        desc += f", subsampled to {len(ytr)} train / {len(yte)} test rows"
    return Xtr, ytr, Xte, yte, desc


def cart(Xtr, ytr, Xte, yte, alpha=5.0):
    try:
        from sklearn.tree import DecisionTreeClassifier
    except ImportError:
        return None
    t0 = time.perf_counter()
    clf = DecisionTreeClassifier(min_samples_leaf=10, random_state=0).fit(Xtr, ytr)
    secs = time.perf_counter() - t0
    K = len(clf.classes_)
    counts = np.zeros((clf.tree_.node_count, K))
    np.add.at(counts, (clf.apply(Xtr), np.searchsorted(clf.classes_, ytr)), 1)
    probs = (counts + alpha / K) / (counts.sum(1, keepdims=True) + alpha)
    known = np.isin(yte, clf.classes_)
    p = probs[clf.apply(Xte[known]), np.searchsorted(clf.classes_, yte[known])]
    return {"method": "CART (min_samples_leaf=10)", "particles": None, "seconds": secs,
            "accuracy": float(clf.score(Xte, yte)), "log_predictive": float(np.log(p).mean())}


def main(argv=None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    if "--bench" in argv:
        if not BENCH.exists():
            raise SystemExit(f"paper001_reproduction: --bench needs {BENCH}, which is not in this checkout")
        rest = [a for a in argv if a != "--bench"]
        sys.argv = [str(BENCH)] + rest
        runpy.run_path(str(BENCH), run_name="__main__")
        return 0
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--dataset", default="magic04", choices=("magic04", "pendigits"))
    p.add_argument("--rows", type=int, default=2000, help="training rows to use (0: all, as in the paper)")
    p.add_argument("--particles", type=int, nargs="+", default=[10, 50, 250], help="total particles (paper: 10 .. 10^4)")
    p.add_argument("--proposals", nargs="+", default=["prior", "optimal"], choices=("prior", "empirical", "optimal"))
    p.add_argument("--n-islands", type=int, default=5)
    p.add_argument("--repeats", type=int, default=1, help="seeds per configuration (times and scores are averaged)")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--out", help="write the table as JSON here")
    p.add_argument("--bench", action="store_true", help="run benchmarks/bench_paper001.py instead (options passed through)")
    p.add_argument("--smoke", action="store_true", help="tiny run (for the test suite)")
    args = p.parse_args(argv)
    if args.smoke:
        args.rows, args.particles, args.proposals, args.n_islands = 300, [10], ["prior"], 5

    from torchtree.estimators import BayesianTreeClassifier

    Xtr, ytr, Xte, yte, desc = load(args.dataset, args.rows, args.seed)
    print(f"data: {desc}; {Xtr.shape[1]} features, {len(np.unique(ytr))} classes")
    print("model: alpha=5, alpha_s=0.95, beta_s=0.5; ESS threshold M/10; node-wise expansion; "
          f"{args.n_islands} islands; {args.repeats} seed(s) per row")
    results = []
    for proposal in args.proposals:
        for M in args.particles:
            islands = args.n_islands if M % args.n_islands == 0 else 1
            secs, acc, lp = [], [], []
            for r in range(args.repeats):
                clf = BayesianTreeClassifier("smc", n_particles=M, n_islands=islands, proposal=proposal, expansion="node",
                                             ess_threshold=0.1, alpha=5.0, alpha_split=0.95, beta_split=0.5,
                                             random_state=args.seed + r)
                t0 = time.perf_counter()
                clf.fit(Xtr, ytr)
                secs.append(time.perf_counter() - t0)
                acc.append(clf.score(Xte, yte))
                lp.append(clf.log_predictive(Xte, yte))
            results.append({"method": f"SMC {proposal} [node]", "particles": M, "islands": islands,
                            "seconds": float(np.mean(secs)), "accuracy": float(np.mean(acc)),
                            "log_predictive": float(np.mean(lp))})
    c = cart(Xtr, ytr, Xte, yte)
    if c:
        results.append(c)
    print(f"{'method':28s} {'particles':>9s} {'seconds':>8s} {'accuracy':>9s} {'log p(y|x)':>11s}")
    for r in results:
        parts = "-" if r["particles"] is None else str(r["particles"])
        print(f"{r['method']:28s} {parts:>9s} {r['seconds']:8.2f} {r['accuracy']:9.4f} {r['log_predictive']:11.4f}")
    if args.out:
        import torch

        payload = {"benchmark": "paper001_reproduction", "dataset": args.dataset, "description": desc,
                   "config": {k: v for k, v in vars(args).items() if k not in ("out", "bench")},
                   "machine": {"python": platform.python_version(), "torch": torch.__version__,
                               "platform": platform.platform(), "threads": torch.get_num_threads()},
                   "results": results}
        Path(args.out).write_text(json.dumps(payload, indent=1) + "\n")
        print(f"wrote {args.out}")
    print("paper001_reproduction: done")
    return 0


if __name__ == "__main__":
    sys.exit(main())
