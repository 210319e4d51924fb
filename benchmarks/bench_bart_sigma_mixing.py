"""How fast sigma mixes in torchtree's BART and in the peers', the same chain length, several seeds.

One chain per run, 200 trees, single-leaf starts (no grow-from-root sweeps), ``--burn`` burn-in +
``--draws`` kept sweeps, seeds ``0 .. --seeds - 1``, split 0 of ``benchmarks/bart_data.py``. Each
run's sigma draws give its effective sample size (``torchtree.model.diagnostics.chain_ess``, the
same estimator for every library) and its autocorrelation at a few lags. torchtree runs in this
process (``BART(n_chains=1, n_gfr=0)``, one thread); stochtree 0.4.5 and bartz 0.13.0 through
``benchmarks/bart_competitors.py`` in their throw-away venv (``--peer-python``, see
``bench_bart_peers.py``); without it, torchtree alone.

The question it answers: is the slow mixing of sigma at the defaults a property of BART's
backfitting sampler or of this implementation? A single seed cannot say: one chain's ESS varies
several-fold between seeds in every library.

``--fx`` adds torchtree's chains' agreement on the fitted function itself: at the defaults (4 chains x
100 kept sweeps) and with 1,000 kept sweeps per chain, the split-R-hat and the ESS of ``f(x_i)`` at 100
training points drawn at random (the kept draws are sweep-major, chain-minor), summarised by
quantiles over the points; then the defaults' Monte Carlo error: over seeds 0-2, the test RMSE and
how far the posterior mean prediction moves between seeds, against the posterior sd of ``f``.

Command (from the repository root, about 10 min on a 2-core box)::

    .venv/bin/python benchmarks/bench_bart_sigma_mixing.py --peer-python /tmp/bartvenv/bin/python \\
        --out benchmarks/results/bart_sigma_mixing.txt
    .venv/bin/python benchmarks/bench_bart_sigma_mixing.py --seeds 0 --fx --out benchmarks/results/bart_fx_agreement.txt
"""
from __future__ import annotations

import argparse
import json
import subprocess
import sys
import time
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(HERE))
LAGS = (1, 10, 50)
# smoke-expect: ^\| friedman1_1000 \| torchtree \|


def acf(s: np.ndarray, lag: int) -> float:
    """Sample autocorrelation of one chain at ``lag``."""
    c = s - s.mean()
    return float((c[:-lag] * c[lag:]).mean() / c.var()) if lag < len(s) else float("nan")


def torchtree_sigma(data: str, seed: int, trees: int, burn: int, draws: int) -> tuple:
    """(sigma draws [draws], CPU s) of one torchtree chain."""
    import warnings

    import torch

    import bart_data
    from torchtree import BART, Data

    torch.set_num_threads(1)
    X, y = bart_data.load(data, 0)[:2]
    c0 = time.process_time()
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # the convergence warning: this script measures what it warns about
        post = BART(n_trees=trees, n_chains=1, n_gfr=0, n_warmup=burn, n_samples=draws).run(
            Data(X, y, task="regression"), seed=seed)
    return post.info["trace"]["sigma"][0], time.process_time() - c0


def peer_sigma(python: str, lib: str, data: str, seed: int, trees: int, burn: int, draws: int) -> tuple:
    """(sigma draws, CPU s) of one peer chain, run by bart_competitors.py in the peer venv."""
    cmd = [python, str(HERE / "bart_competitors.py"), "--lib", lib, "--data", data, "--seed", str(seed),
           "--n-trees", str(trees), "--n-burn", str(burn), "--n-draws", str(draws), "--threads", "1"]
    if lib == "stochtree":
        cmd += ["--stochtree-gfr", "0"]
    p = subprocess.run(cmd, capture_output=True, text=True, cwd=ROOT)
    rec = json.loads(p.stdout.strip().splitlines()[-1])
    if "error" in rec:
        raise RuntimeError(f"{lib}: {rec['error']}")
    return np.asarray(rec["sigma_draws"], dtype=np.float64), rec["cpu_s"]


def fx_agreement(data: str, n_samples, seed: int = 0) -> tuple:
    """(R-hat quantiles 50 / 90 / 100 %, ESS quantiles 0 / 10 / 50 %, CPU s) of ``f(x_i)`` at 100 training
    points, torchtree's default BART (``n_samples`` kept sweeps per chain when given)."""
    import warnings

    import torch

    import bart_data
    from torchtree import BART, Data
    from torchtree.model.diagnostics import chain_ess, rhat

    torch.set_num_threads(1)
    X, y = bart_data.load(data, 0)[:2]
    c0 = time.process_time()
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        post = BART(**({} if n_samples is None else {"n_samples": n_samples})).run(Data(X, y, task="regression"),
                                                                                 seed=seed)
    cpu = time.process_time() - c0
    C = post.info["n_chains"]
    rows = np.random.default_rng(seed).choice(len(y), size=min(100, len(y)), replace=False)
    f = post.latent_draws(X[rows]).numpy()  # [S C, M], sweep-major
    f = f.reshape(f.shape[0] // C, C, -1).transpose(1, 0, 2)  # [C, S, M]
    rh = np.array([rhat(f[:, :, m]) for m in range(f.shape[2])])
    es = np.array([chain_ess(f[:, :, m]) for m in range(f.shape[2])])
    return np.quantile(rh, [0.5, 0.9, 1.0]), np.quantile(es, [0.0, 0.1, 0.5]), cpu


def seed_spread(data: str, seeds=(0, 1, 2)) -> tuple:
    """The defaults' Monte Carlo error on the test rows (up to 500): (test RMSE per seed, root mean square
    over the rows of the between-seed sd of the posterior mean, root mean square posterior sd of f)."""
    import warnings

    import torch

    import bart_data
    from torchtree import BART, Data

    torch.set_num_threads(1)
    X, y, Xt, yt = bart_data.load(data, 0)[:4]
    Xt, yt = Xt[:500], yt[:500]
    means, sds = [], []
    for seed in seeds:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            f = BART().run(Data(X, y, task="regression"), seed=seed).latent_draws(Xt).numpy()
        means.append(f.mean(0))
        sds.append(f.std(0))
    m = np.array(means)
    rmse = [float(np.sqrt(np.mean((mu - yt) ** 2))) for mu in m]
    return rmse, float(np.sqrt(m.var(0).mean())), float(np.sqrt((np.array(sds) ** 2).mean()))


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--datasets", nargs="+", default=["abalone", "friedman1_1000"])
    p.add_argument("--seeds", type=int, default=6, help="seeds per library (0: skip the sigma section)")
    p.add_argument("--trees", type=int, default=200)
    p.add_argument("--burn", type=int, default=300)
    p.add_argument("--draws", type=int, default=2000)
    p.add_argument("--peer-python", default=None, help="python of the peers' venv (stochtree, bartz)")
    p.add_argument("--out", default=None, help="also write the table to this file")
    p.add_argument("--fx", action="store_true", help="also torchtree's R-hat and ESS of f(x) at 100 training points")
    p.add_argument("--smoke", action="store_true", help="one small table, 2 seeds, tiny forests (tests)")
    a = p.parse_args()
    if a.smoke:
        a.datasets, a.seeds, a.trees, a.burn, a.draws, a.peer_python = ["friedman1_1000"], 2, 10, 5, 60, None
    from torchtree.model.diagnostics import chain_ess

    libs = ["torchtree"] + (["stochtree", "bartz"] if a.peer_python and Path(a.peer_python).exists() else [])
    lines = [f"# {' '.join(sys.argv)}",
             f"# one chain per run, {a.trees} trees, {a.burn} burn-in + {a.draws} kept sweeps, single-leaf starts, "
             f"seeds 0..{a.seeds - 1}, 1 thread; ESS by torchtree.model.diagnostics.chain_ess for every library",
             "",
             "| data | library | ESS per seed | median ESS | mean sigma (sd over seeds) | acf " +
             " / ".join(f"lag {k}" for k in LAGS) + " (mean over seeds) | CPU s per run |",
             "|---|---|---|---|---|---|---|"]
    print("\n".join(lines), flush=True)
    for data in a.datasets if a.seeds > 0 else []:  # --seeds 0: the f(x) section only
        for lib in libs:
            ess, means, acfs, cpu = [], [], [], []
            for seed in range(a.seeds):
                if lib == "torchtree":
                    s, c = torchtree_sigma(data, seed, a.trees, a.burn, a.draws)
                else:
                    s, c = peer_sigma(a.peer_python, lib, data, seed, a.trees, a.burn, a.draws)
                ess.append(chain_ess(s[None]))
                means.append(float(s.mean()))
                acfs.append([acf(s, k) for k in LAGS])
                cpu.append(c)
            row = (f"| {data} | {lib} | {' '.join(f'{e:.0f}' for e in ess)} | {np.median(ess):.0f} | "
                   f"{np.mean(means):.4f} ({np.std(means):.4f}) | "
                   f"{' / '.join(f'{v:.3f}' for v in np.nanmean(acfs, 0))} | {np.mean(cpu):.2f} |")
            lines.append(row)
            print(row, flush=True)
    if a.fx and not a.smoke:
        head = ["", "torchtree, 4 chains: the fitted function f(x_i) at 100 training points (split-R-hat and ESS over the "
                "kept draws of the chains, quantiles over the points):", "",
                "| data | kept sweeps per chain | R-hat median / 90% / max | ESS min / 10% / median (of all draws) | CPU s |",
                "|---|---|---|---|---|"]
        lines += head
        print("\n".join(head), flush=True)
        for data in a.datasets:
            for n_samples in (None, 1000):
                rh, es, cpu = fx_agreement(data, n_samples)
                row = (f"| {data} | {100 if n_samples is None else n_samples}{' (defaults)' if n_samples is None else ''} | "
                       f"{' / '.join(f'{v:.3f}' for v in rh)} | {' / '.join(f'{v:.1f}' for v in es)} | {cpu:.1f} |")
                lines.append(row)
                print(row, flush=True)
        head = ["", "torchtree's defaults over seeds 0-2 (the first 500 test rows):", "",
                "| data | test RMSE per seed | between-seed sd of the posterior mean (rms) | posterior sd of f (rms) |",
                "|---|---|---|---|"]
        lines += head
        print("\n".join(head), flush=True)
        for data in a.datasets:
            rmse, between, within = seed_spread(data)
            row = f"| {data} | {' '.join(f'{v:.4f}' for v in rmse)} | {between:.4f} | {within:.4f} |"
            lines.append(row)
            print(row, flush=True)
    if a.out:
        Path(a.out).write_text("\n".join(lines) + "\n")
    print("bench_bart_sigma_mixing: done")


if __name__ == "__main__":
    main()
