"""The MCMC estimator's default fit with ``engine="auto"`` against the batched engine, one thread.

On each table (a 70/30 split, seed 0) a default ``method="mcmc"`` estimator fits and predicts
with the engine forced to ``"batched"`` (what ``"auto"`` chose for several chains before it had
a cost model) and with ``"auto"``, alternated ``--repeats`` times in this process; CPU seconds
are ``time.process_time`` of fit + predict (minimum over repeats). The two engines run the same
chains, so the accuracy (RMSE) must agree. ``auto`` column: the engine it resolved to.

``--crossover`` checks the cost model behind ``"auto"``
(:func:`torchtree.samplers.mcmc.config.host_is_cheaper`, fitted on magic04's classification) on a
table that did not choose it: on the first rows of abalone's regression, the milliseconds per
iteration of one host chain (times 4 and 16) and of a batch of 4 and of 16 chains, with the model's
choice and the cheaper one measured.

``--held-out`` checks the same model's choice for the estimators' 16 chains on tables that did not choose it:
on the first 1,000 to 8,000 rows of each (a permutation, seed 0; ``friedman1`` is Friedman #1 with 10 inputs),
one host chain's milliseconds per iteration (times 16) against a batch of 16 chains, 100 + 100 iterations
after a short run that pays the set-up.

``--chain-grid`` measures why the host is chosen for few chains only: on the first 200, 1,000 and 4,000
rows of magic04, one host chain's milliseconds per iteration (200 iterations, set-up included) against a
batch of 4, 16, 64 and 256 chains.

Command (from the repository root)::

    .venv/bin/python benchmarks/bench_mcmc_engines.py --crossover 500 1000 2000 3000 \
        --out benchmarks/results/bench_mcmc_engines.txt
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
TABLES = ["iris", "wine", "heart_statlog", "heart_cleveland", "breast_cancer_wisconsin_original",
          "pima_diabetes", "raisin", "abalone"]
# smoke-expect: ^\| iris \|
# smoke-expect: ^\| 100 \|
# smoke-expect: ^\| 200 \| 4 \|
# smoke-expect: ^\| wine \| 100 \|


def split(name: str):
    from torchtree.datasets import load_table

    t = load_table(name)
    X, y = np.asarray(t.X, dtype=np.float64), np.asarray(t.y)
    if name == "abalone":
        y = y.astype(np.float64)
    idx = np.random.default_rng(0).permutation(len(y))
    k = int(0.7 * len(y))
    return X[idx[:k]], y[idx[:k]], X[idx[k:]], y[idx[k:]]


def one(engine: str, data, smoke: bool):
    """(CPU s of fit + predict, accuracy or RMSE, resolved engine)."""
    from torchtree import BayesianTreeClassifier, BayesianTreeRegressor

    Xtr, ytr, Xte, yte = data
    reg = ytr.dtype.kind == "f"
    cls = BayesianTreeRegressor if reg else BayesianTreeClassifier
    kw = dict(n_samples=10, n_chains=4) if smoke else {}
    c0 = time.process_time()
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # the convergence warning
        est = cls(method="mcmc", random_state=0, n_threads=1, engine=engine, **kw).fit(Xtr, ytr)
        p = est.predict(Xte)
    cpu = time.process_time() - c0
    score = float(np.sqrt(np.mean((p - yte) ** 2))) if reg else float((p == yte).mean())
    return cpu, score, est.posterior_.info["engine"]


def crossover(sizes, lines: list, smoke: bool) -> None:
    """Per-iteration cost of both engines on the first ``n`` rows of abalone (regression)."""
    from torchtree import MCMC, Data
    from torchtree.datasets import load_table
    from torchtree.samplers.mcmc.config import host_is_cheaper

    t = load_table("abalone")
    X, y = np.asarray(t.X, dtype=np.float64), np.asarray(t.y, dtype=np.float64)
    n_samples = 10 if smoke else 250
    head = ["", "Cost model check (abalone regression, first n rows; ms per iteration, 1 thread, "
            f"{2 * n_samples} iterations):", "",
            "| n | host, 1 chain | batch of 4 | batch of 16 | 4 chains: model / measured | 16 chains: model / measured |",
            "|---|---|---|---|---|---|"]
    lines += head
    print("\n".join(head), flush=True)
    for n in sizes:
        data = Data(X[:n], y[:n], task="regression")
        ms = {}
        for engine, chains in (("host", 1), ("batched", 4), ("batched", 16)):
            c0 = time.process_time()
            with warnings.catch_warnings():
                warnings.simplefilter("ignore")
                MCMC(n_chains=chains, n_samples=n_samples, engine=engine).run(data, seed=0)
            ms[chains] = (time.process_time() - c0) / (2 * n_samples) * 1e3
        pick = lambda p: "host" if host_is_cheaper(p, n) else "batched"  # noqa: E731
        best = lambda p: "host" if p * ms[1] < ms[p] else "batched"  # noqa: E731
        row = (f"| {n} | {ms[1]:.3f} | {ms[4]:.3f} | {ms[16]:.3f} | {pick(4)} / {best(4)} | "
               f"{pick(16)} / {best(16)} |")
        lines.append(row)
        print(row, flush=True)


def held_out(names, lines: list, smoke: bool) -> None:
    """The cost model's choice for 16 chains against the cheaper measured, on tables that did not choose it."""
    from torchtree import MCMC, Data
    from torchtree.datasets import load_table
    from torchtree.samplers.mcmc.config import host_is_cheaper

    head = ["", "Cost model on held-out tables (first n rows; ms per iteration, 1 thread, 100 + 100 iterations):", "",
            "| table | n | host, 1 chain | batch of 16 | 16 x host / batch | model / cheaper |", "|---|---|---|---|---|---|"]
    lines += head
    print("\n".join(head), flush=True)
    for name in names:
        if name == "friedman1":
            rng = np.random.default_rng(0)
            X = rng.uniform(size=(8000, 10))
            y = 10 * np.sin(np.pi * X[:, 0] * X[:, 1]) + 20 * (X[:, 2] - .5) ** 2 + 10 * X[:, 3] + 5 * X[:, 4] + rng.normal(size=8000)
        else:
            t = load_table(name)
            idx = np.random.default_rng(0).permutation(len(t.y))
            X, y = np.asarray(t.X, dtype=np.float64)[idx], np.asarray(t.y)[idx]
        task = "regression" if y.dtype.kind == "f" else "classification"
        for n in ((100,) if smoke else (1000, 2000, 4000, 8000)):
            if n > len(y):
                continue
            data, ms = Data(X[:n], y[:n], task=task), {}
            for engine, P in (("host", 1), ("batched", 16)):
                with warnings.catch_warnings():
                    warnings.simplefilter("ignore")
                    MCMC(n_chains=P, n_samples=5, n_warmup=5, engine=engine).run(data, seed=0)  # the set-up's cost
                    c0 = time.process_time()
                    its = 10 if smoke else 100
                    MCMC(n_chains=P, n_samples=its, engine=engine).run(data, seed=0)
                ms[P] = (time.process_time() - c0) / (2 * its) * 1e3
            row = (f"| {name} | {n} | {ms[1]:.3f} | {ms[16]:.3f} | {16 * ms[1] / ms[16]:.2f} | "
                   f"{'host' if host_is_cheaper(16, n) else 'batched'} / {'host' if 16 * ms[1] < ms[16] else 'batched'} |")
            lines.append(row)
            print(row, flush=True)


def chain_grid(lines: list, smoke: bool) -> None:
    """One host chain against batches of 4 to 256 chains on the first rows of magic04."""
    from torchtree import MCMC, Data

    Xtr, ytr = split("magic04")[:2]
    head = ["", "One host chain against a batch (magic04's first n rows, classification; ms per iteration, 1 thread, "
            "200 iterations with set-up):", "",
            "| n | chains | host, 1 chain | batch | chains x host / batch |", "|---|---|---|---|---|"]
    lines += head
    print("\n".join(head), flush=True)
    for n in ((200,) if smoke else (200, 1000, 4000)):
        data = Data(Xtr[:n], ytr[:n], task="classification")
        c0 = time.process_time()
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            MCMC(n_chains=1, n_samples=100, engine="host").run(data, seed=0)
        host = (time.process_time() - c0) / 200 * 1e3
        for P in ((4,) if smoke else (4, 16, 64, 256)):
            its = 100 if P <= 64 else 40
            c0 = time.process_time()
            with warnings.catch_warnings():
                warnings.simplefilter("ignore")
                MCMC(n_chains=P, n_samples=its // 2, engine="batched").run(data, seed=0)
            batch = (time.process_time() - c0) / its * 1e3
            row = f"| {n} | {P} | {host:.3f} | {batch:.3f} | {P * host / batch:.2f} |"
            lines.append(row)
            print(row, flush=True)


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--tables", nargs="*", default=TABLES)
    p.add_argument("--repeats", type=int, default=3)
    p.add_argument("--crossover", nargs="*", type=int, default=None, help="also check the cost model on these "
                   "numbers of abalone's rows")
    p.add_argument("--held-out", nargs="*", default=None, help="also check the model's choice for 16 chains on "
                   "these tables (friedman1: synthetic)")
    p.add_argument("--chain-grid", action="store_true", help="also one host chain against batches of 4-256 chains")
    p.add_argument("--out", default=None)
    p.add_argument("--smoke", action="store_true", help="iris, 4 short chains, one repeat (tests)")
    a = p.parse_args()
    if a.smoke:
        a.tables, a.repeats, a.crossover, a.held_out = ["iris"], 1, [100], ["wine"]
    import torch

    torch.set_num_threads(1)
    lines = [f"# {' '.join(sys.argv)}", "# CPU s of fit + predict, minimum over repeats (batched, auto alternated); "
             "accuracy or RMSE on the 30% test split", "",
             "| table | train rows | batched CPU s | auto CPU s | auto / batched | auto | score batched | score auto |",
             "|---|---|---|---|---|---|---|---|"]
    print("\n".join(lines), flush=True)
    for name in a.tables:  # --tables with no name: none
        data = split(name)
        runs = {"batched": [], "auto": []}
        for _ in range(a.repeats):
            for engine in ("batched", "auto"):
                runs[engine].append(one(engine, data, a.smoke))
        b, u = min(r[0] for r in runs["batched"]), min(r[0] for r in runs["auto"])
        row = (f"| {name} | {len(data[1])} | {b:.2f} | {u:.2f} | {u / b:.2f} | {runs['auto'][0][2]} | "
               f"{runs['batched'][0][1]:.4f} | {runs['auto'][0][1]:.4f} |")
        lines.append(row)
        print(row, flush=True)
    if a.crossover:
        crossover(a.crossover, lines, a.smoke)
    if a.held_out:
        held_out(a.held_out, lines, a.smoke)
    if a.chain_grid or a.smoke:
        chain_grid(lines, a.smoke)
    if a.out:
        Path(a.out).write_text("\n".join(lines) + "\n")
    print("bench_mcmc_engines: done")


if __name__ == "__main__":
    main()
