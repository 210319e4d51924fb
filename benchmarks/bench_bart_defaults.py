"""BART's default run length against the earlier one, on tables that did not choose it, one thread.

The defaults (``n_chains=4``, ``n_gfr=5`` grow-from-root sweeps opening ``n_warmup=50`` burn-in sweeps where
they cost less than the burn-in they save, else 250 burn-in sweeps from single leaves; ``n_samples=100``
kept) were picked on Friedman #1 (n = 10^3, 10^4) and abalone (``benchmarks/bench_bart_peers.py``); this
script confirms them on other tables, fold by fold, against
``old`` (4 chains of 250 + 250 sweeps from single leaves, the defaults before grow-from-root starts):

* regression: ``auto_mpg`` and ``automobile`` (raw tables: missing cells, text columns) and the
  synthetic MNAR table (``torchtree.datasets.missing_table``, 2,000 rows, a 100-level categorical);
* classification: ``pima_diabetes``, ``heart_statlog``, ``titanic`` (raw), ``breast_cancer_ljubljana`` (raw)
  and ``soybean`` (raw, 19 classes, 347 split columns).

``--configs new converge`` sets the defaults against ``converge``: the defaults run until converged
(``min_ess=100``: blocks of 100 kept sweeps per chain until the split-R-hat of sigma, the mean leaves and the
fitted function at 100 training rows (its 90% quantile over them) are at most 1.05 and their ESS (f's 10%
quantile) at least 100, at most 1,000 kept sweeps per chain), what convergence costs;
``converge_long`` allows 4,000.
``friedman1_<n>`` tables (Friedman #1, ``benchmarks/bart_data.py``'s generator) can be named too.

Many chains (what the estimators run on CUDA, measured on the CPU): ``root`` is 4 chains from single leaves (the
CUDA default before the ``gpu-batch`` preset), ``gpu`` the preset's 64 chains from single leaves with
``n_samples`` and ``thin`` left to the ``many-chains`` preset (7 kept of 98 sweeps), and the ``chains*``
configs the variants it was chosen against (16 or 64 chains, unthinned or thinned, after grow-from-root
starts or not)::

    .venv/bin/python benchmarks/bench_bart_defaults.py --folds 3 --configs new root gpu \
        --tables friedman1_1000 abalone auto_mpg automobile synth_mnar_reg pima_diabetes heart_statlog

Metrics on the held-out fold: regression RMSE, mean log predictive density (``lpd``) and 90% interval
coverage from the posterior draws; classification accuracy and log loss from ``predict_proba``; sigma's
R-hat and ESS (regression), the mean leaves' R-hat and ESS, f's (``rhat_f``, ``ess_f``), and the sweeps per chain: run, and kept (the
posterior's draws: what a run until converged moved to its warm-up is not kept). CPU seconds are ``time.process_time`` of fit + predict in this process
(the C++ kernels loaded before timing).

Command (from the repository root; about 20 minutes on a 2-core box, soybean half of it)::

    .venv/bin/python benchmarks/bench_bart_defaults.py --folds 3 --out benchmarks/results/bart_defaults.md
"""
from __future__ import annotations

import argparse
import json
import math
import sys
import time
import warnings

import numpy as np

CONFIGS = {"new": {}, "old": dict(n_gfr=0, n_warmup=250, n_samples=250), "converge": dict(min_ess=100.0),
           "converge_long": dict(min_ess=100.0, max_samples=4000), "root": dict(n_gfr=0),
           "chains16_root": dict(n_gfr=0, n_chains=16, n_samples=25),
           "chains64_root": dict(n_gfr=0, n_chains=64, n_samples=7), "chains64": dict(n_chains=64, n_samples=7),
           "chains64_root_thin": dict(n_gfr=0, n_chains=64, n_samples=6, thin=16),
           "chains64_thin": dict(n_chains=64, n_samples=6, thin=16), "gpu": dict(n_gfr=0, n_chains=64), "pg": dict(bart_sampler="pg")}
# smoke-expect: ^\| auto_mpg \| new \|
# smoke-expect: ^\| heart_statlog \| old \|
REGRESSION = ["auto_mpg", "automobile", "synth_mnar_reg"]
CLASSIFICATION = ["pima_diabetes", "heart_statlog", "titanic", "breast_cancer_ljubljana", "soybean"]


def load(name):
    from torchtree.datasets import RAW_TABLES, load_raw_table, load_table, missing_table

    if name.startswith("friedman1_"):
        import bart_data

        X, y = bart_data.friedman1(int(name.split("_")[1]), np.random.default_rng(1000))
        return X, y, "regression"
    if name == "synth_mnar_reg":
        frame, y = missing_table(2000, "mnar", task="regression", seed=0)
        return frame, np.asarray(y, dtype=np.float64), "regression"
    if name in RAW_TABLES:
        t = load_raw_table(name)
        return t.frame, t.y, t.task
    t = load_table(name)
    return t.X, t.y, t.task


def one(name, config, X, y, task, train, test, seed, smoke=False):
    from torchtree import BayesianTreeClassifier, BayesianTreeRegressor

    cls = BayesianTreeRegressor if task == "regression" else BayesianTreeClassifier
    take = (lambda idx: X.iloc[idx]) if hasattr(X, "iloc") else (lambda idx: X[idx])
    kw = {**CONFIGS[config], **(dict(n_trees=5, n_samples=3, n_chains=2) if smoke else {})}
    est = cls(method="bart", random_state=seed, n_threads=1, **kw)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        c0 = time.process_time()
        est.fit(take(train), y[train])
        out = {"table": name, "config": config, "seed": seed}
        post = est.posterior_
        if task == "regression":
            f = post.latent_draws(take(test)).cpu().numpy().astype(np.float64)
            sig = (post.sigma * post.prior.scale).cpu().numpy().astype(np.float64).reshape(-1, 1)
            yt = y[test]
            logpdf = -0.5 * ((yt - f) / sig) ** 2 - np.log(sig) - 0.5 * math.log(2 * math.pi)
            m = logpdf.max(0)
            pred = f + sig * np.random.default_rng(0).standard_normal(f.shape)
            lo, hi = np.quantile(pred, [0.05, 0.95], axis=0)
            out.update(rmse=float(np.sqrt(np.mean((f.mean(0) - yt) ** 2))),
                       lpd=float(np.mean(m + np.log(np.exp(logpdf - m).mean(0)))),
                       cov90=float(np.mean((yt >= lo) & (yt <= hi))),
                       rhat=float(post.info["rhat_sigma"]), ess=float(post.info["ess_sigma"]))
        else:
            p = np.asarray(est.predict_proba(take(test)), dtype=np.float64)
            codes = np.searchsorted(est.classes_, y[test])
            out.update(accuracy=float(np.mean(p.argmax(1) == codes)),
                       log_loss=float(-np.mean(np.log(np.clip(p[np.arange(len(codes)), codes], 1e-15, 1)))))
        out["cpu_s"] = time.process_time() - c0
        out.update(rhat_leaves=float(post.info["rhat_leaves"]), ess_leaves=float(post.info["ess_leaves"]),
                   rhat_f=float(post.info.get("rhat_f", np.nan)), ess_f=float(post.info.get("ess_f", np.nan)),
                   kept=int(post.info["n_samples"]), warmup=int(post.info["n_warmup"]),
                   sweeps=int(post.info["sweeps"]))
    return out


def table_md(recs):
    lines = ["| table | config | CPU s | RMSE / accuracy | lpd / log loss | cov90 | sigma R-hat | sigma ESS | "
             "leaves R-hat | leaves ESS | f R-hat | f ESS | sweeps per chain: run / kept |",
             "|---|---|---|---|---|---|---|---|---|---|---|---|---|"]
    for name in dict.fromkeys(r["table"] for r in recs):
        for config in CONFIGS:
            rs = [r for r in recs if r["table"] == name and r["config"] == config]
            if not rs:
                continue
            m = lambda k: np.mean([r[k] for r in rs])  # noqa: E731
            each = lambda k, f: " ".join(format(r[k], f) for r in rs) if k in rs[0] else ""  # noqa: E731
            runs = " ".join(f"{r['sweeps']}/{r['kept']}" for r in rs) if "sweeps" in rs[0] else ""
            chains = (f" {each('rhat_leaves', '.2f')} | {each('ess_leaves', '.0f')} | {each('rhat_f', '.2f')} | "
                      f"{each('ess_f', '.0f')} | {runs} |")
            if "rmse" in rs[0]:
                lines.append(f"| {name} | {config} | {m('cpu_s'):.2f} | {m('rmse'):.4f} | {m('lpd'):.4f} | "
                             f"{m('cov90'):.3f} | {each('rhat', '.2f')} | {each('ess', '.0f')} |" + chains)
            else:
                lines.append(f"| {name} | {config} | {m('cpu_s'):.2f} | {m('accuracy'):.4f} | {m('log_loss'):.4f} "
                             "| | | |" + chains)
    return "\n".join(lines)


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--tables", nargs="+", default=REGRESSION + CLASSIFICATION)
    p.add_argument("--folds", type=int, default=3)
    p.add_argument("--configs", nargs="+", default=["new", "old"], choices=list(CONFIGS))
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--out", default=None)
    p.add_argument("--smoke", action="store_true", help="two small tables, 2 folds, tiny forests (tests)")
    a = p.parse_args(argv)
    if a.smoke:
        a.tables, a.folds = ["auto_mpg", "heart_statlog"], 2
    import torch
    from sklearn.model_selection import KFold, StratifiedKFold

    from torchtree import BayesianTreeRegressor

    torch.set_num_threads(1)
    BayesianTreeRegressor(method="bart", n_trees=2, n_samples=2, n_warmup=2).fit(np.random.rand(20, 2), np.random.rand(20))
    recs = []
    for name in a.tables:
        X, y, task = load(name)
        cv = (KFold if task == "regression" else StratifiedKFold)(a.folds, shuffle=True, random_state=a.seed)
        for k, (train, test) in enumerate(cv.split(np.zeros(len(y)), y)):
            for config in a.configs:
                r = one(name, config, X, y, task, train, test, a.seed + k, a.smoke)
                r["fold"] = k
                recs.append(r)
                print(json.dumps(r), flush=True)
    text = (f"# {__doc__.splitlines()[0]}\n\ncommand: {' '.join(sys.argv)}\n\nMeans over {a.folds} folds "
            f"(seed {a.seed}); R-hat, ESS and kept sweeps fold by fold.\n\n{table_md(recs)}\n\nRaw records:\n\n" + "\n".join(json.dumps(r) for r in recs) + "\n")
    if a.out:
        open(a.out, "w").write(text)
    print(table_md(recs))
    return 0


if __name__ == "__main__":
    sys.exit(main())
