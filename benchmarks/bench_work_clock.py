"""How well the work clock's cost model tracks real CPU time (torchtree.core.work).

A DCC fit with ``clock="work"`` (the estimators' default) stops when the modelled seconds of its
soft-tree evaluations reach ``max_seconds``. This script runs such fits on the project's tables, one
thread, and prints for each the CPU seconds it took, the work seconds it counted and their ratio (1.0:
the model is exact on this machine; a faster machine shows less than 1). It also counts the
evaluations and refits the gradient's three constants, ``a + R N I (b + c D)`` seconds per call, to this
machine's CPU seconds by least squares on relative error: the values in
``torchtree.model.soft_trees`` (``GRAD_CALL_S``, ``GRAD_ELEMENT_S``, ``GRAD_FEATURE_S``) come from this fit on the
reference box.

    python benchmarks/bench_work_clock.py [--budget 20] [--tables iris pima_diabetes ...]
"""
# smoke-expect: ^\| iris \| \d+ \| \d+\.\d+ \| \d+\.\d+ \| \d+\.\d\d \|
# smoke-expect: ^refit: 
from __future__ import annotations

import argparse
import json
import time

import numpy as np
import torch

TABLES = ["iris", "pima_diabetes", "wine", "heart_statlog", "breast_cancer_wisconsin_original", "abalone", "raisin",
          "magic04"]


def run(name: str, budget: float, iterations: int, **settings):
    import torchtree.model.soft_trees as st
    from torchtree import BayesianTreeClassifier, BayesianTreeRegressor
    from torchtree.core.work import work_seconds
    from torchtree.datasets import load_table

    calls = {True: [0, 0.0, 0.0], False: [0, 0.0, 0.0]}
    counted = st.SoftTrees._count

    def count(self, rows, gradient):  # the evaluations' sizes, beside the clock's own count
        n = self.batch_size if rows is None else int(rows.shape[0])
        calls[gradient][0] += 1
        calls[gradient][1] += float(n) * self.X.shape[0] * self.layout.n_internal
        calls[gradient][2] += float(n) * self.X.shape[0] * self.layout.n_internal * self.X.shape[1]
        counted(self, rows, gradient)

    st.SoftTrees._count = count
    try:
        t = load_table(name)
        est = (BayesianTreeRegressor if t.task == "regression" else BayesianTreeClassifier)(
            method="dcc", verbose=0, n_threads=1, hyper="fixed", max_seconds=budget, n_iterations=iterations, **settings)
        c0, w0 = time.process_time(), work_seconds()
        est.fit(t.X, t.y)
        cpu, work = time.process_time() - c0, work_seconds() - w0
    finally:
        st.SoftTrees._count = counted
    return dict(name=name, rows=int(est.posterior_.info["rows_used"]), cpu=cpu, work=work, grad=calls[True],
                dens=calls[False])


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--budget", type=float, default=20.0, help="max_seconds of each fit (work clock)")
    p.add_argument("--iterations", type=int, default=60, help="n_iterations of each fit")
    p.add_argument("--tables", nargs="+", default=TABLES)
    p.add_argument("--smoke", action="store_true", help="one small fit (tests): iris, 2 chains, trees of depth 2, 4 s")
    a = p.parse_args()
    torch.set_num_threads(1)
    if a.smoke:
        a.tables, a.budget, a.iterations = ["iris"], 4.0, 2
    settings = dict(n_chains=2, max_tree_depth=2) if a.smoke else {}
    from torchtree.model.soft_trees import (DENSITY_CALL_S, DENSITY_ELEMENT_S, DENSITY_FEATURE_S, GRAD_CALL_S,
                                            GRAD_ELEMENT_S, GRAD_FEATURE_S)

    print(f"# bench_work_clock: DCC estimator fits, clock='work', max_seconds={a.budget:g}, one thread; model: "
          f"gradient {GRAD_CALL_S:.3g} + R N I ({GRAD_ELEMENT_S:.3g} + {GRAD_FEATURE_S:.3g} D) s, density "
          f"{DENSITY_CALL_S:.3g} + R N I ({DENSITY_ELEMENT_S:.3g} + {DENSITY_FEATURE_S:.3g} D) s")
    print("\n| table | rows used | CPU s | work s | CPU / work | gradient calls |\n|---|---|---|---|---|---|")
    out = []
    for name in a.tables:
        r = run(name, a.budget, a.iterations, **settings)
        out.append(r)
        print(f"| {name} | {r['rows']} | {r['cpu']:.2f} | {r['work']:.2f} | {r['cpu'] / r['work']:.2f} | "
              f"{r['grad'][0]} |", flush=True)
    if len(out) < 3:
        print("\nrefit: needs three tables or more")
        return
    cpu = np.array([r["cpu"] for r in out])
    # the density's per-feature term is half the gradient's (its forward half), so it joins that column
    dens = np.array([DENSITY_CALL_S * r["dens"][0] + DENSITY_ELEMENT_S * r["dens"][1] for r in out])
    F = np.array([[r["grad"][0], r["grad"][1], r["grad"][2] + 0.5 * r["dens"][2]] for r in out], dtype=float)
    coef = np.linalg.lstsq(F / cpu[:, None], 1.0 - dens / cpu, rcond=None)[0]
    pred = F @ coef + dens
    print(f"\nrefit: GRAD_CALL_S {coef[0]:.3g}, GRAD_ELEMENT_S {coef[1]:.3g}, GRAD_FEATURE_S {coef[2]:.3g}; refit "
          f"model / CPU {(pred / cpu).min():.2f}-{(pred / cpu).max():.2f}")
    for r in out:
        print("# raw:", json.dumps(r))


if __name__ == "__main__":
    main()
