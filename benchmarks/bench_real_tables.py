"""Missing values and categories as they are: torchtree on raw tables against imputation + one-hot.

For each table (the raw tables of ``data/raw/``, with their missing cells and string columns,
and the synthetic ``missing_table`` with MCAR, MAR and MNAR missingness, n=2000 and a
100-level categorical) and each of ``--splits`` folds (stratified K-fold for
classification, K-fold for regression, shuffled with ``--seed``), fits

* ``hgb``: scikit-learn's HistGradientBoosting{Classifier,Regressor}
  (``categorical_features="from_dtype"``) on the frame with its string columns cast to
  pandas ``category`` (categories taken from the whole table: the vocabulary, not the labels);
* ``cart``: SimpleImputer (median for numeric columns, most frequent for string columns) +
  OneHotEncoder(handle_unknown="ignore") + DecisionTree{Classifier,Regressor}, with
  ``min_samples_leaf`` in {1, 5, 20} chosen by a 3-fold CV inside the training fold
  (log loss for classification, squared error for regression);
* ``M:raw`` for each torchtree method M: ``BayesianTree{Classifier,Regressor}(method=M)`` fit on
  the frame as is (missing values and categories left to the method; ``--raw-dtype``
  says whether string columns are passed as pandas ``category`` or as ``object`` strings);
* ``M:imputed``: the same method on the numeric matrix of the ``cart`` preprocessing
  (imputed + one-hot, fitted on the training fold).

Class labels are coded 0..K-1 (sorted source labels) for every model. Metrics on the test
fold: accuracy and log loss (the probability of the true class clipped at 1e-15, not
renormalised) for classification, RMSE for regression, and the CPU seconds of the fit
(``time.process_time``, every thread of the process) at ``--threads`` threads
(``torch.set_num_threads``, the estimators' ``n_threads`` and threadpoolctl's limit).

A model that raises is reported as ``error: <message>`` for that table and not run on the
remaining folds of the table, so the script runs before torchtree takes raw frames (the
``M:raw`` rows are then errors) and again after.

The output: per table x model, the mean and standard deviation over folds; then the
paired comparisons (per fold, then mean +- sd over folds): single-tree methods (smc, mcmc,
smc-moves) against ``cart`` (accuracy and log-loss differences, RMSE ratio), ``bart:raw``
against ``hgb``, and ``M:raw`` against ``M:imputed`` for every method.

Usage::

    python benchmarks/bench_real_tables.py --out benchmarks/results/bench_real_tables.json   # all (long)
    python benchmarks/bench_real_tables.py --quick --methods smc     # a small smoke run (< 1 min)
    python benchmarks/bench_real_tables.py --tables titanic synth_mnar --methods smc bart --splits 5
"""
from __future__ import annotations

import argparse
import json
import math
import subprocess
import sys
import time
import warnings
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

# smoke-expect: ^\| breast_cancer_ljubljana \| hgb \|
# smoke-expect: ^bench_real_tables: done

METHODS = ["smc", "mcmc", "smc-moves", "bart"]
SINGLE_TREE = ["smc", "mcmc", "smc-moves"]
MECHANISMS = ["mcar", "mar", "mnar"]
SYNTH = [f"synth_{m}" for m in MECHANISMS] + [f"synth_{m}_reg" for m in MECHANISMS]
DEFAULT_SYNTH = [f"synth_{m}" for m in MECHANISMS]
QUICK_TABLES = ["breast_cancer_ljubljana", "auto_mpg", "synth_mnar"]
LEAF_GRID = [1, 5, 20]
CLIP = 1e-15


# ---------------------------------------------------------------------------- data
def load(name: str, args):
    """(frame with NaN and object string columns, y, task) of a table by name."""
    from torchtree.datasets import load_raw_table, missing_table

    if name.startswith("synth_"):
        mech = name.split("_")[1]
        task = "regression" if name.endswith("_reg") else "classification"
        frame, y = missing_table(args.synth_n, mech, rate=args.synth_rate, n_levels=args.synth_levels, task=task,
                                 seed=args.seed)
        return frame, y, task
    t = load_raw_table(name)
    return t.frame, t.y, t.task


def subsample(frame, y, task, max_rows, seed):
    """At most ``max_rows`` rows (stratified for classification), in the table's order."""
    if max_rows is None or len(y) <= max_rows:
        return frame, y
    from sklearn.model_selection import train_test_split

    idx = np.arange(len(y))
    strat = y if task == "classification" and np.unique(y, return_counts=True)[1].min() >= 2 else None
    keep, _ = train_test_split(idx, train_size=max_rows, random_state=seed, stratify=strat)
    keep = np.sort(keep)
    return frame.iloc[keep].reset_index(drop=True), y[keep]


def string_columns(frame):
    from torchtree.datasets import raw_string_columns

    return raw_string_columns(frame)


def as_category(frame):
    """String columns cast to pandas ``category`` with the whole table's levels (sorted)."""
    import pandas as pd

    out = frame.copy()
    for c in string_columns(frame):
        levels = sorted(frame[c].dropna().unique())
        out[c] = pd.Categorical(frame[c], categories=levels)
    return out


def preprocessor(frame):
    """The ``cart`` preprocessing: median / most-frequent imputation, one-hot strings."""
    from sklearn.compose import ColumnTransformer
    from sklearn.impute import SimpleImputer
    from sklearn.pipeline import Pipeline
    from sklearn.preprocessing import OneHotEncoder

    strings = string_columns(frame)
    numeric = [c for c in frame.columns if c not in strings]
    parts = []
    if numeric:
        parts.append(("num", SimpleImputer(strategy="median"), numeric))
    if strings:
        parts.append(("cat", Pipeline([("impute", SimpleImputer(strategy="most_frequent")),
                                       ("onehot", OneHotEncoder(handle_unknown="ignore", sparse_output=False))]),
                      strings))
    return ColumnTransformer(parts, remainder="drop", sparse_threshold=0.0)


# ---------------------------------------------------------------------------- models
def fit_hgb(task, seed):
    from sklearn.ensemble import HistGradientBoostingClassifier, HistGradientBoostingRegressor

    cls = HistGradientBoostingClassifier if task == "classification" else HistGradientBoostingRegressor
    return cls(categorical_features="from_dtype", random_state=seed)


def fit_cart(task, seed, frame):
    from sklearn.model_selection import GridSearchCV, KFold, StratifiedKFold
    from sklearn.pipeline import Pipeline
    from sklearn.tree import DecisionTreeClassifier, DecisionTreeRegressor

    if task == "classification":
        tree, cv, scoring = DecisionTreeClassifier(random_state=seed), StratifiedKFold(3, shuffle=True,
                                                                                       random_state=seed), "neg_log_loss"
    else:
        tree, cv, scoring = DecisionTreeRegressor(random_state=seed), KFold(3, shuffle=True, random_state=seed), \
            "neg_mean_squared_error"
    pipe = Pipeline([("pre", preprocessor(frame)), ("tree", tree)])
    return GridSearchCV(pipe, {"tree__min_samples_leaf": LEAF_GRID}, cv=cv, scoring=scoring, error_score=np.nan)


#: ``--smoke``: each method at a tiny size (the full runs take the estimators' defaults); the ``imputed`` variant there
#: also skips the evidence search, which the ``raw`` one runs
SMOKE_OPTIONS = {"smc": {"n_particles": 50}, "mcmc": {"n_chains": 2, "n_samples": 20, "n_warmup": 20},
                 "smc-moves": {"n_particles": 20, "n_iterations": 2}, "bart": {"n_trees": 10, "n_samples": 10,
                                                                                "n_warmup": 10}}


def torchtree_estimator(task, method, seed, threads, options=None):
    from torchtree import BayesianTreeClassifier, BayesianTreeRegressor

    cls = BayesianTreeClassifier if task == "classification" else BayesianTreeRegressor
    kwargs = {"method": method, "random_state": seed, "n_threads": threads, **(options or {})}
    if "categorical_features" in cls().get_params():  # the raw-frame API, once it exists
        kwargs["categorical_features"] = "from_dtype"
    return cls(**kwargs)


def evaluate(model, X_test, y_test, task, n_classes):
    """Metrics of a fitted model on the test fold (labels coded 0..K-1)."""
    if task == "regression":
        pred = np.asarray(model.predict(X_test), dtype=np.float64).ravel()
        return {"rmse": float(np.sqrt(np.mean((pred - y_test) ** 2)))}
    proba = np.asarray(model.predict_proba(X_test), dtype=np.float64)
    full = np.zeros((len(y_test), n_classes))
    full[:, np.asarray(model.classes_).astype(int)] = proba
    p_true = np.clip(full[np.arange(len(y_test)), y_test], CLIP, 1.0)
    pred = np.asarray(model.predict(X_test)).astype(int).ravel()
    return {"accuracy": float(np.mean(pred == y_test)), "log_loss": float(-np.mean(np.log(p_true)))}


def one_fit(model_name, task, frame, cat_frame, y, train, test, args, seed, n_classes):
    """Fit one model on one fold: its metrics, CPU / wall seconds and warnings."""
    if model_name == "hgb":
        model, Xtr, Xte = fit_hgb(task, seed), cat_frame.iloc[train], cat_frame.iloc[test]
    elif model_name == "cart":
        model, Xtr, Xte = fit_cart(task, seed, frame), frame.iloc[train], frame.iloc[test]
    else:
        method, variant = model_name.rsplit(":", 1)
        smoke = dict(SMOKE_OPTIONS[method], **({"hyper": "fixed"} if variant == "imputed" else {}))
        model = torchtree_estimator(task, method, seed, args.threads, smoke if args.smoke else None)
        if variant == "raw":
            src = cat_frame if args.raw_dtype == "category" else frame
            Xtr, Xte = src.iloc[train], src.iloc[test]
        else:
            pre = preprocessor(frame).fit(frame.iloc[train])
            Xtr = np.ascontiguousarray(pre.transform(frame.iloc[train]), dtype=np.float64)
            Xte = np.ascontiguousarray(pre.transform(frame.iloc[test]), dtype=np.float64)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        c0, w0 = time.process_time(), time.perf_counter()
        model.fit(Xtr, y[train])
        cpu, wall = time.process_time() - c0, time.perf_counter() - w0
        out = evaluate(model, Xte, y[test], task, n_classes)
    out.update(cpu_s=cpu, wall_s=wall)
    if model_name == "cart":
        out["min_samples_leaf"] = int(model.best_params_["tree__min_samples_leaf"])
    msgs = sorted({f"{w.category.__name__}: {str(w.message).splitlines()[0][:160]}" for w in caught})
    if msgs:
        out["warnings"] = msgs[:3]
    return out


def error_text(exc: BaseException) -> str:
    first = (str(exc).strip().splitlines() or [""])[0]
    return f"error: {type(exc).__name__}: {first[:240]}"


# ---------------------------------------------------------------------------- summaries
METRICS = {"classification": ["accuracy", "log_loss"], "regression": ["rmse"]}


def summarise(splits, task):
    ok = [s for s in splits if "error" not in s]
    out = {"n_ok": len(ok), "mean": {}, "std": {}}
    for k in METRICS[task] + ["cpu_s", "wall_s"]:
        vals = [s[k] for s in ok]
        if vals:
            out["mean"][k] = float(np.mean(vals))
            out["std"][k] = float(np.std(vals, ddof=1)) if len(vals) > 1 else 0.0
    errs = [s["error"] for s in splits if "error" in s]
    out["error"] = errs[0] if errs else None
    return out


def compare(splits_a, splits_b, task):
    """Paired per-fold accuracy / log-loss differences (a - b) or RMSE ratio (a / b)."""
    pairs = [(a, b) for a, b in zip(splits_a, splits_b) if "error" not in a and "error" not in b]
    if not pairs:
        return None
    out = {"n_splits": len(pairs)}
    if task == "classification":
        for k in ("accuracy", "log_loss"):
            d = [a[k] - b[k] for a, b in pairs]
            out[f"{k}_diff"] = {"mean": float(np.mean(d)), "std": float(np.std(d, ddof=1)) if len(d) > 1 else 0.0}
    else:
        r = [a["rmse"] / b["rmse"] for a, b in pairs]
        out["rmse_ratio"] = {"mean": float(np.mean(r)), "std": float(np.std(r, ddof=1)) if len(r) > 1 else 0.0}
    return out


def comparisons_for(models):
    """(kind, a, b) pairs of the models run: the targets' comparisons."""
    out = []
    for m in SINGLE_TREE:
        for variant in ("raw", "imputed"):
            if f"{m}:{variant}" in models and "cart" in models:
                out.append(("single tree vs cart", f"{m}:{variant}", "cart"))
    for variant in ("raw", "imputed"):
        if f"bart:{variant}" in models and "hgb" in models:
            out.append(("bart vs hgb", f"bart:{variant}", "hgb"))
    for m in METHODS:
        if f"{m}:raw" in models and f"{m}:imputed" in models:
            out.append(("raw vs imputed", f"{m}:raw", f"{m}:imputed"))
    return out


def fmt(mean, std, digits=3):
    if mean is None or (isinstance(mean, float) and math.isnan(mean)):
        return "n/a"
    return f"{mean:.{digits}f} ± {std:.{digits}f}"


def markdown(results):
    lines = ["| table | model | accuracy | log loss | RMSE | CPU s / fit | note |", "|---|---|---|---|---|---|---|"]
    for table, res in results.items():
        for model, s in res["models"].items():
            m, sd = s["mean"], s["std"]
            cells = [fmt(m.get(k), sd.get(k)) if k in m else "" for k in ("accuracy", "log_loss", "rmse")]
            cpu = fmt(m.get("cpu_s"), sd.get("cpu_s"), 2) if "cpu_s" in m else ""
            note = s["error"] or ""
            lines.append(f"| {table} | {model} | {' | '.join(cells)} | {cpu} | {note.replace('|', '/')} |")
    lines += ["", "| table | comparison | a | b | accuracy a-b | log loss a-b | RMSE a/b |", "|---|---|---|---|---|---|---|"]
    for table, res in results.items():
        for c in res["comparisons"]:
            r = c["result"]
            if r is None:
                cells = ["n/a (a model failed)", "", ""]
            else:
                cells = [fmt(r[k]["mean"], r[k]["std"]) if k in r else "" for k in
                         ("accuracy_diff", "log_loss_diff", "rmse_ratio")]
            lines.append(f"| {table} | {c['kind']} | {c['a']} | {c['b']} | {' | '.join(cells)} |")
    return "\n".join(lines)


# ---------------------------------------------------------------------------- main
def run_table(name, args, models):
    from sklearn.model_selection import KFold, StratifiedKFold

    frame, y_raw, task = load(name, args)
    frame, y_raw = subsample(frame, y_raw, task, args.max_rows, args.seed)
    if task == "classification":
        classes, y = np.unique(y_raw, return_inverse=True)
        n_classes = len(classes)
        folds = StratifiedKFold(args.splits, shuffle=True, random_state=args.seed)
    else:
        y, n_classes = np.asarray(y_raw, dtype=np.float64), 0
        folds = KFold(args.splits, shuffle=True, random_state=args.seed)
    cat_frame = as_category(frame)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # "least populated class" when a rare class has < splits rows
        split_list = list(folds.split(np.zeros(len(y)), y if task == "classification" else None))
    info = {"task": task, "rows": int(len(y)), "features": int(frame.shape[1]),
            "string_columns": len(string_columns(frame)),
            "missing_cells_pct": float(100 * frame.isna().to_numpy().mean()), "classes": int(n_classes),
            "models": {}, "comparisons": []}
    per_model = {}
    for model_name in models:
        splits = []
        for k, (train, test) in enumerate(split_list):
            try:
                splits.append(one_fit(model_name, task, frame, cat_frame, y, train, test, args, args.seed + k,
                                      n_classes))
            except Exception as exc:  # noqa: BLE001 - every failure is a result here
                splits.append({"error": error_text(exc)})
                break
        per_model[model_name] = splits
        info["models"][model_name] = summarise(splits, task) | {"splits": splits}
        s = info["models"][model_name]
        shown = s["error"] or ", ".join(f"{k} {v:.4g}" for k, v in s["mean"].items())
        print(f"  {name} {model_name}: {shown}", flush=True)
    for kind, a, b in comparisons_for(models):
        info["comparisons"].append({"kind": kind, "a": a, "b": b,
                                    "result": compare(per_model[a], per_model[b], task)})
    return info


def git_state():
    try:
        head = subprocess.run(["git", "rev-parse", "HEAD"], cwd=ROOT, capture_output=True, text=True).stdout.strip()
        dirty = bool(subprocess.run(["git", "status", "--porcelain", "--untracked-files=no"], cwd=ROOT,
                                    capture_output=True, text=True).stdout.strip())
        return {"commit": head or None, "dirty": dirty}
    except OSError:
        return {"commit": None, "dirty": None}


def parse(argv=None):
    from torchtree.datasets import RAW_TABLES

    every = sorted(RAW_TABLES) + SYNTH
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--tables", nargs="+", choices=every, metavar="TABLE",
                   help=f"tables (default: every raw table and {', '.join(DEFAULT_SYNTH)}); any of {', '.join(every)}")
    p.add_argument("--methods", nargs="+", choices=METHODS, help="torchtree methods (default: all; --quick: smc)")
    p.add_argument("--no-baselines", action="store_true", help="skip hgb and cart")
    p.add_argument("--variants", nargs="+", choices=["raw", "imputed"], default=["raw", "imputed"],
                   help="torchtree on the raw frame, on the imputed + one-hot matrix, or both (default)")
    p.add_argument("--raw-dtype", choices=["category", "object"], default="category",
                   help="string columns of the raw frame given to torchtree as pandas category (default) or object str")
    p.add_argument("--splits", type=int, default=5, help="folds (default 5)")
    p.add_argument("--seed", type=int, default=0, help="seed of the folds, the synthetic tables and the models")
    p.add_argument("--threads", type=int, default=1, help="threads for every fit (default 1)")
    p.add_argument("--max-rows", type=int, default=None, help="subsample larger tables to this many rows")
    p.add_argument("--synth-n", type=int, default=2000, help="rows of the synthetic tables (default 2000)")
    p.add_argument("--synth-rate", type=float, default=0.2, help="missing rate of the synthetic tables (default 0.2)")
    p.add_argument("--synth-levels", type=int, default=100, help="levels of the synthetic categorical (default 100)")
    p.add_argument("--out", type=Path, default=None, help="write the results as JSON here")
    p.add_argument("--quick", action="store_true",
                   help=f"small run: {', '.join(QUICK_TABLES)}, 2 folds, at most 400 rows, synthetic n=400, smc")
    p.add_argument("--smoke", action="store_true",
                   help="tiny run for the test suite (one small table, smc at 50 particles: SMOKE_OPTIONS)")
    args = p.parse_args(argv)
    if args.smoke:
        args.quick = True
        args.tables = args.tables or ["breast_cancer_ljubljana"]
    if args.quick:
        args.tables = args.tables or list(QUICK_TABLES)
        args.methods = args.methods or ["smc"]
        args.splits = 2 if args.splits == 5 else args.splits
        args.max_rows = args.max_rows or 400
        args.synth_n = min(args.synth_n, 400)
    args.tables = args.tables or (sorted(RAW_TABLES) + DEFAULT_SYNTH)
    args.methods = args.methods or list(METHODS)
    if args.splits < 2:
        p.error("--splits must be at least 2")
    return args


def main(argv=None) -> int:
    args = parse(argv)
    import torch
    from threadpoolctl import threadpool_limits

    torch.set_num_threads(args.threads)
    models = ([] if args.no_baselines else ["hgb", "cart"]) + [f"{m}:{v}" for m in args.methods for v in args.variants]
    config = {k: (str(v) if isinstance(v, Path) else v) for k, v in vars(args).items()}
    print(f"bench_real_tables: tables {', '.join(args.tables)}; models {', '.join(models)}; {args.splits} folds; "
          f"{args.threads} thread(s)", flush=True)
    results = {}
    t0 = time.perf_counter()
    with threadpool_limits(limits=args.threads):
        for name in args.tables:
            try:
                results[name] = run_table(name, args, models)
            except Exception as exc:  # noqa: BLE001 - a table that does not load is reported, the rest run
                print(f"  {name}: {error_text(exc)}", flush=True)
                results[name] = {"error": error_text(exc), "models": {}, "comparisons": []}
    out = {"config": config, "git": git_state(), "torch": torch.__version__, "seconds": time.perf_counter() - t0,
           "tables": results}
    print()
    print(markdown({k: v for k, v in results.items() if "task" in v}))
    if args.out is not None:
        args.out.parent.mkdir(parents=True, exist_ok=True)
        args.out.write_text(json.dumps(out, indent=1) + "\n")
        print(f"\nwrote {args.out}")
    print(f"bench_real_tables: done in {time.perf_counter() - t0:.1f} s")
    return 0


if __name__ == "__main__":
    sys.exit(main())
