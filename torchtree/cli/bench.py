"""``torchtree demo`` and ``torchtree bench``."""
from __future__ import annotations

import os
import subprocess
import sys
import time
from pathlib import Path
from typing import Any, Dict, List, Tuple

import numpy as np

from torchtree.cli.common import say

def _demo_data(seed: int = 0):
    """scikit-learn's bundled breast-cancer data (569 x 30) split 70/30, or, without
    scikit-learn, a synthetic axis-aligned problem of the same size."""
    rng = np.random.default_rng(seed)
    try:
        from sklearn.datasets import load_breast_cancer

        ds = load_breast_cancer()
        X, y, name = ds.data, ds.target, "breast-cancer (sklearn bundled, 569 x 30)"
    except ImportError:  # pragma: no cover - sklearn is in the test extra
        X = rng.uniform(size=(569, 30))
        y = ((X[:, 0] > 0.5) ^ (X[:, 1] > 0.3)).astype(int)
        flip = rng.uniform(size=569) < 0.05
        y = np.where(flip, 1 - y, y)
        name = "synthetic XOR (569 x 30)"
    perm = rng.permutation(len(y))
    n_tr = int(0.7 * len(y))
    return X[perm[:n_tr]], y[perm[:n_tr]], X[perm[n_tr:]], y[perm[n_tr:]], name


def _cart_row(Xtr, ytr, Xte, yte, alpha: float = 5.0):
    try:
        from sklearn.tree import DecisionTreeClassifier
    except ImportError:  # pragma: no cover
        return None
    t0 = time.perf_counter()
    clf = DecisionTreeClassifier(criterion="gini", min_samples_leaf=10, random_state=0).fit(Xtr, ytr)
    secs = time.perf_counter() - t0
    # Laplace-smoothed leaf probabilities with the same total concentration alpha.
    leaves_tr = clf.apply(Xtr)
    K = len(clf.classes_)
    counts = np.zeros((clf.tree_.node_count, K))
    np.add.at(counts, (leaves_tr, np.searchsorted(clf.classes_, ytr)), 1)
    probs = (counts + alpha / K) / (counts.sum(1, keepdims=True) + alpha)
    p = probs[clf.apply(Xte), np.searchsorted(clf.classes_, yte)]
    return ("CART (gini, min_samples_leaf=10)", "-", secs, clf.score(Xte, yte), float(np.log(p).mean()))


def demo(seed: int = 0, out=sys.stdout) -> List[tuple]:
    """Fit the demo table (embedded in the package) with a few top-down SMC settings and print a table.

    Returns
    -------
    list of (method, particles, seconds, accuracy, log_predictive) rows.
    """
    from torchtree.estimators import BayesianTreeClassifier

    Xtr, ytr, Xte, yte, name = _demo_data(seed)
    print(f"torchtree demo: {name}; train {len(ytr)}, test {len(yte)}", file=out)
    rows = []
    configs: List[Tuple[str, Dict[str, Any], str]] = [
        ("smc", dict(n_particles=100, n_islands=5, proposal="prior"), "top-down SMC, prior proposal"),
        ("smc", dict(n_particles=1000, n_islands=5, proposal="prior"), "top-down SMC, prior proposal"),
        ("smc", dict(n_particles=100, n_islands=5, proposal="optimal"), "top-down SMC, optimal proposal"),
    ]
    # One-time costs (first use of each kernel, allocator growth, lazy imports) are paid by a
    # tiny fit of every configuration first and reported on their own line, so that the
    # table's rows compare like with like whatever their order.
    t0 = time.perf_counter()
    for method, opts, _ in configs:
        BayesianTreeClassifier(method, random_state=seed, **{**opts, "n_particles": 10, "n_islands": 1}).fit(
            Xtr[:60], ytr[:60])
    print(f"one-time start-up (first use of the kernels, paid once per process): {time.perf_counter() - t0:.2f} s",
          file=out)
    for method, opts, label in configs:
        clf = BayesianTreeClassifier(method, random_state=seed, **opts)
        t0 = time.perf_counter()
        clf.fit(Xtr, ytr)
        secs = time.perf_counter() - t0
        rows.append((label, opts.get("n_particles", "-"), secs, clf.score(Xte, yte), clf.log_predictive(Xte, yte)))
    cart = _cart_row(Xtr, ytr, Xte, yte)
    if cart:
        rows.append(cart)
    print(f"{'method':36s} {'particles':>9s} {'seconds':>8s} {'accuracy':>9s} {'log p(y|x)':>11s}", file=out)
    for r in rows:
        print(f"{r[0]:36s} {str(r[1]):>9s} {r[2]:8.2f} {r[3]:9.4f} {r[4]:11.4f}", file=out)
    return rows


def cmd_demo(args) -> int:
    demo(seed=args.seed)
    return 0


def benchmarks_dir() -> Path:
    """Where benchmark scripts live: ``$TORCHTREE_BENCHMARKS``, else the repository's ``benchmarks/`` (an
    installed package has none: then nothing is listed or run). Never the current folder, whose scripts
    anyone who can write there could have put."""
    env = os.environ.get("TORCHTREE_BENCHMARKS")
    if env:
        return Path(env)
    return Path(__file__).resolve().parents[2] / "benchmarks"


def benchmarks() -> Dict[str, Path]:
    """``name -> script`` for every ``benchmarks/bench_NAME.py``."""
    d = benchmarks_dir()
    if not d.is_dir():
        return {}
    return {p.stem[len("bench_"):]: p for p in sorted(d.glob("bench_*.py"))}


def _first_doc_line(path: Path) -> str:
    import ast

    try:
        doc = ast.get_docstring(ast.parse(path.read_text()))
    except (SyntaxError, OSError, UnicodeDecodeError):
        return ""
    return (doc or "").strip().splitlines()[0] if doc else ""


def takes_option(path: Path, flag: str) -> bool:
    """Whether the benchmark script at ``path`` defines the option ``flag`` (``add_argument("--out", ...)``)."""
    import re

    try:
        text = path.read_text()
    except (OSError, UnicodeDecodeError):
        return False
    return re.search(r"""add_argument\(\s*(?:["']-[\w-]+["']\s*,\s*)*["']""" + re.escape(flag) + r"""["']""", text) is not None


def _value_of(extra: List[str], flag: str):
    """The value of ``flag`` among a script's arguments (``--out F`` or ``--out=F``), else None."""
    for i, a in enumerate(extra):
        if a == flag and i + 1 < len(extra):
            return extra[i + 1]
        if a.startswith(flag + "="):
            return a[len(flag) + 1:]
    return None


def _list(found: Dict[str, Path], out) -> None:
    width = max(len(n) for n in found)
    print(f"benchmarks in {benchmarks_dir()}:", file=out)
    for name, path in found.items():
        print(f"  {name:<{width}}  {_first_doc_line(path)}", file=out)


def cmd_bench(args) -> int:
    from torchtree.cli.common import check_writable

    found = benchmarks()
    extra = list(getattr(args, "_extra", []))
    if args.list or not args.name:
        out = sys.stdout if args.list else sys.stderr  # without NAME the list is an error's explanation
        if not found:
            print(f"no benchmarks found (no bench_*.py in {benchmarks_dir()}): the scripts come with a checkout "
                  "of the repository, not with an installed package; set TORCHTREE_BENCHMARKS to their folder", file=out)
            return 0 if args.list else 2
        _list(found, out)
        if not args.list:
            print("usage: torchtree bench NAME [--out FILE.json] [script options]", file=sys.stderr)
            return 2
        return 0
    name = args.name[len("bench_"):] if args.name.startswith("bench_") else args.name
    name = name[:-3] if name.endswith(".py") else name
    if name not in found:
        avail = ", ".join(found) or "none"
        raise ValueError(f"no benchmark named {args.name!r}; available: {avail} (torchtree bench --list)")
    script = found[name]
    for flag in ("-q", "--quiet", "--debug"):  # torchtree's own options, unless the script has them too
        if flag in extra and not takes_option(script, flag):
            extra.remove(flag)
            if flag != "--debug":
                args.quiet = True
    out = args.out or _value_of(extra, "--out")
    if out is not None:
        if not takes_option(script, "--out"):
            writers = [n for n, p in found.items() if takes_option(p, "--out")]
            json_flag = " (it writes JSON with --json FILE)" if takes_option(script, "--json") else ""
            raise ValueError(f"benchmark {name!r} takes no --out{json_flag}; those that write their results with "
                             f"--out FILE.json: {', '.join(writers) or 'none'}")
        check_writable(out, "--out")
    cmd = [sys.executable, str(script)]
    if args.out:
        cmd += ["--out", args.out]
    cmd += extra
    say(args, "torchtree bench: " + " ".join(cmd))
    rc = subprocess.call(cmd)
    if rc == 0 and out and os.path.exists(out):
        say(args, f"torchtree bench: wrote {out}")
    return rc
