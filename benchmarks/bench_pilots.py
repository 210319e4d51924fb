"""The evidence pilots run as the islands of one top-down SMC run, against one run per pilot.

``hyper="evidence"`` (the estimators' default) chooses the leaf prior and ``beta_split`` by the
evidence of top-down SMC pilot runs: a grid of 6 leaf-prior values, then 3 more ``beta_split``
values. :func:`torchtree.samplers.tuning.evidence.choose_by_evidence` runs each grid's pilots as
the islands of one run (:func:`torchtree.samplers.topdown.sampler.variant_log_evidences`); the
other setting here runs them one after another, as before. Both give the same evidences (bit for
bit with class counts, to rounding with float targets) and the same choice, which the table checks.

Each default estimator fit runs with both settings alternated ``--repeats`` times in this process,
one thread; CPU seconds of the fit (``time.process_time``, minimum over repeats) and the pilots'
own seconds (``hyper_search_.seconds``, wall, minimum).

Command (from the repository root)::

    .venv/bin/python benchmarks/bench_pilots.py --out benchmarks/results/bench_pilots.txt
"""
from __future__ import annotations

import argparse
import sys
import time
import warnings
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(Path(__file__).resolve().parent))
from bench_mcmc_engines import split  # noqa: E402  (the same 70/30 split, seed 0)
CASES = [("pima_diabetes", "smc"), ("pima_diabetes", "mcmc"), ("wine", "smc"), ("raisin", "smc-moves"),
         ("abalone", "smc"), ("magic04", "smc")]
# smoke-expect: ^\| iris \| smc \|
# smoke-expect: ^bench_pilots: done


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--repeats", type=int, default=3)
    p.add_argument("--out", default=None)
    p.add_argument("--smoke", action="store_true", help="iris, one repeat (tests)")
    a = p.parse_args()
    cases = [("iris", "smc")] if a.smoke else CASES
    repeats = 1 if a.smoke else a.repeats
    import torch

    import torchtree.samplers.tuning.evidence as ev
    from torchtree import BayesianTreeClassifier, BayesianTreeRegressor

    torch.set_num_threads(1)
    islands = ev._pilot_evidences

    def one_by_one(data, variants, n_particles, seed, n_threads="auto", device=None):
        return [ev._pilot_evidence(data, pr, lik, n_particles, seed, n_threads, device) for pr, lik in variants]

    lines = [f"# {' '.join(sys.argv)}", "# default estimator fits, one thread; CPU s of the fit and the pilots' wall s "
             "(minimum over repeats, the two settings alternated)", "",
             "| table | method | train rows | fit CPU s, islands | one by one | ratio | pilots s, islands | one by one "
             "| ratio | same curves | same choice |", "|---|---|---|---|---|---|---|---|---|---|---|"]
    print("\n".join(lines), flush=True)
    for name, method in cases:
        X, y = split(name)[:2]
        cls = BayesianTreeRegressor if y.dtype.kind == "f" else BayesianTreeClassifier
        fit, pil, got = {"islands": [], "one": []}, {"islands": [], "one": []}, {}
        with warnings.catch_warnings():  # an untimed fit first: the table's caches, torch's first calls
            warnings.simplefilter("ignore")
            cls(method=method, random_state=0, n_threads=1).fit(X, y)
        for _ in range(repeats):
            for mode in ("islands", "one"):
                ev._pilot_evidences = islands if mode == "islands" else one_by_one
                try:
                    c0 = time.process_time()
                    with warnings.catch_warnings():
                        warnings.simplefilter("ignore")
                        est = cls(method=method, random_state=0, n_threads=1).fit(X, y)
                    fit[mode].append(time.process_time() - c0)
                finally:
                    ev._pilot_evidences = islands
                hs = est.hyper_search_
                pil[mode].append(hs.seconds)
                got[mode] = (hs.curves, hs.chosen)
        curves = {k: np.array([v for _, v in c]) for k, c in got["islands"][0].items()}
        other = {k: np.array([v for _, v in c]) for k, c in got["one"][0].items()}
        same = all(np.allclose(curves[k], other[k], rtol=1e-10, atol=0) for k in curves)
        bits = all(np.array_equal(curves[k], other[k]) for k in curves)
        f1, f0, p1, p0 = min(fit["islands"]), min(fit["one"]), min(pil["islands"]), min(pil["one"])
        row = (f"| {name} | {method} | {len(y)} | {f1:.3f} | {f0:.3f} | {f1 / f0:.2f} | {p1:.3f} | {p0:.3f} | "
               f"{p1 / p0:.2f} | {'bit for bit' if bits else ('to 1e-10' if same else 'NO')} | "
               f"{got['islands'][1] == got['one'][1]} |")
        lines.append(row)
        print(row, flush=True)
    if a.out:
        Path(a.out).write_text("\n".join(lines) + "\n")
    print("bench_pilots: done")


if __name__ == "__main__":
    main()
