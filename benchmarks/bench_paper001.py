"""Benchmark of the top-down SMC (paper 001) on magic04, pendigits and madelon.

Paper settings: alpha=5, alpha_s=0.95, beta_s=0.5, ESS threshold 0.1, node-wise
expansion, 5 islands, multinomial resampling. For each dataset and number of
particles M it reports fit seconds, prediction seconds (test set, all trees),
test accuracy, mean test log p(y|x) and log evidence, plus scikit-learn CART
(gini, min_samples_leaf=10, Laplace-smoothed leaf probabilities with the same
alpha) on the same split.

Usage::

    python benchmarks/bench_paper001.py                      # everything, JSON to bench_paper001.json
    python benchmarks/bench_paper001.py --datasets magic04 --particles 100 500 2000
    python benchmarks/bench_paper001.py --smoke              # seconds, for the test-suite
"""
from __future__ import annotations

import argparse
import json
import sys
import time

import numpy as np
import torch

from torchtree.cli.options import parse_threads
from torchtree.datasets import load_table

# smoke-expect: ^magic04\s+0 SMC prior \[node\]\s+20\s
# smoke-expect: ^wrote \S+\.json



def _load(name: str):
    table = load_table(name)
    return table.X, table.y


def load_dataset(name: str, split_seed: int = 0):
    """(X_train, y_train, X_test, y_test) with the paper's splits."""
    if name == "magic04":
        X, y = _load("magic04")
        perm = np.random.default_rng(split_seed).permutation(len(y))
        n_tr = int(0.7 * len(y))
        return X[perm[:n_tr]], y[perm[:n_tr]], X[perm[n_tr:]], y[perm[n_tr:]]
    if name == "pendigits":
        Xtr, ytr = _load("pendigits_train")
        Xte, yte = _load("pendigits_test")
        return Xtr, ytr, Xte, yte
    if name == "madelon":
        Xtr, ytr = _load("madelon_train")
        Xte, yte = _load("madelon_valid")
        return Xtr, ytr, Xte, yte
    raise ValueError(f"unknown dataset {name!r}")


def cart(Xtr, ytr, Xte, yte, alpha=5.0):
    """scikit-learn CART with Laplace-smoothed leaf probabilities (same alpha)."""
    from sklearn.tree import DecisionTreeClassifier

    t0 = time.perf_counter()
    clf = DecisionTreeClassifier(criterion="gini", min_samples_leaf=10, random_state=0).fit(Xtr, ytr)
    fit_s = time.perf_counter() - t0
    K = len(clf.classes_)
    counts = np.zeros((clf.tree_.node_count, K))
    np.add.at(counts, (clf.apply(Xtr), np.searchsorted(clf.classes_, ytr)), 1)
    probs = (counts + alpha / K) / (counts.sum(1, keepdims=True) + alpha)
    t0 = time.perf_counter()
    p = probs[clf.apply(Xte)]
    pred_s = time.perf_counter() - t0
    return {
        "method": "CART", "M": None, "fit_s": fit_s, "predict_s": pred_s,
        "accuracy": float((clf.classes_[p.argmax(1)] == yte).mean()),
        "log_predictive": float(np.log(p[np.arange(len(yte)), np.searchsorted(clf.classes_, yte)]).mean()),
        "log_evidence": None,
    }


def smc(Xtr, ytr, Xte, yte, M, proposal, expansion="node", n_islands=5, seed=0, threads="auto", device="cpu"):
    """One top-down SMC run with the paper's settings (``threads``: the sampler's ``n_threads``;
    ``device``: where the particles live)."""
    from torchtree import ChipmanPrior, Data, DirichletMultinomial, TopDownSMC
    from torchtree.monitor import CallbackMonitor

    data = Data(Xtr, ytr)
    sampler = TopDownSMC(ChipmanPrior(0.95, 0.5), DirichletMultinomial(5.0), n_particles=M, n_islands=n_islands,
                         proposal=proposal, expansion=expansion, resampling="multinomial", ess_threshold=0.1,
                         n_threads=threads, device=device)
    used = {}
    cuda = torch.device(device).type == "cuda"
    t0, c0 = time.perf_counter(), time.process_time()
    post = sampler.run(data, seed=seed, monitor=CallbackMonitor(on_start=used.update))
    if cuda:
        torch.cuda.synchronize()
    fit_s, fit_cpu = time.perf_counter() - t0, time.process_time() - c0
    t0, c0 = time.perf_counter(), time.process_time()
    proba = post.predict_proba(Xte)
    pred_s, pred_cpu = time.perf_counter() - t0, time.process_time() - c0
    codes = data.encode_y(yte).cpu().numpy()
    return {
        "method": f"SMC {proposal} [{expansion}]", "M": M, "fit_s": fit_s, "predict_s": pred_s,
        "fit_cpu_s": fit_cpu, "predict_cpu_s": pred_cpu,
        "accuracy": float((proba.argmax(1) == codes).mean()),
        "log_predictive": float(np.log(proba[np.arange(len(codes)), codes]).mean()),
        "log_evidence": post.log_evidence, "distinct_trees": len(post), "stages": post.info["n_stages"],
        "threads": used.get("n_threads"),
    }


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--datasets", nargs="+", default=["magic04", "pendigits", "madelon"])
    ap.add_argument("--particles", nargs="+", type=int, default=[100, 500, 2000])
    ap.add_argument("--proposals", nargs="+", default=["prior", "optimal"])
    ap.add_argument("--optimal-particles", nargs="+", type=int, default=[10, 50, 100],
                    help="M for the (costlier) optimal proposal")
    ap.add_argument("--splits", nargs="+", type=int, default=[0], help="magic04 split seeds")
    ap.add_argument("--threads", type=parse_threads, default="auto",
                    help="torch intra-op threads of the fits: auto (torchtree's policy, README 'Threads') or N")
    ap.add_argument("--device", default="cpu", help="where the particles live: cpu, cuda, cuda:1")
    ap.add_argument("--out", default="bench_paper001.json")
    ap.add_argument("--smoke", action="store_true", help="tiny run for the test-suite")
    args = ap.parse_args(argv)
    if args.threads != "auto":
        torch.set_num_threads(args.threads)  # predictions and CART too
    if args.smoke:
        args.datasets, args.particles, args.optimal_particles, args.splits = ["magic04"], [20], [5], [0]
    rows = []
    print(f"torch {torch.__version__}, device {args.device}, threads {args.threads} "
          f"(torch's default here: {torch.get_num_threads()})")
    if torch.device(args.device).type == "cuda":  # the CUDA context's start-up is not the first fit's
        torch.zeros(1, device=args.device).sum().item()
    hdr = (f"{'dataset':10s} {'split':>5s} {'method':22s} {'M':>5s} {'thr':>3s} {'fit s':>7s} {'fit cpu':>7s} {'pred s':>7s} "
           f"{'pred cpu':>8s} {'acc':>7s} {'log p':>8s} {'log Z':>9s}")
    print(hdr)
    for ds in args.datasets:
        for split in (args.splits if ds == "magic04" else [0]):
            Xtr, ytr, Xte, yte = load_dataset(ds, split)
            if args.smoke:
                Xtr, ytr, Xte, yte = Xtr[:800], ytr[:800], Xte[:300], yte[:300]
            runs = [cart(Xtr, ytr, Xte, yte)]
            for prop in args.proposals:
                for M in (args.optimal_particles if prop == "optimal" else args.particles):
                    runs.append(smc(Xtr, ytr, Xte, yte, M, prop, threads=args.threads, device=args.device))
            for r in runs:
                r.update(dataset=ds, split=split)
                rows.append(r)
                lz = "" if r["log_evidence"] is None else f"{r['log_evidence']:9.1f}"
                fc = f"{r['fit_cpu_s']:7.2f}" if "fit_cpu_s" in r else f"{'-':>7s}"
                pc = f"{r['predict_cpu_s']:8.3f}" if "predict_cpu_s" in r else f"{'-':>8s}"
                print(f"{ds:10s} {split:5d} {r['method']:22s} {str(r['M'] or '-'):>5s} {str(r.get('threads') or '-'):>3s} "
                      f"{r['fit_s']:7.2f} {fc} {r['predict_s']:7.3f} "
                      f"{pc} {r['accuracy']:7.4f} {r['log_predictive']:8.4f} {lz}", flush=True)
    with open(args.out, "w") as fh:
        json.dump({"torch": torch.__version__, "threads": args.threads, "device": args.device, "rows": rows}, fh, indent=1)
    print(f"wrote {args.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
