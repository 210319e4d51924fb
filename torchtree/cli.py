"""The ``torchtree`` command line (``python -m torchtree``).

Subcommands::

    torchtree fit DATA.csv [--target COL] [--method smc|smc-moves|mcmc|dcc] [sampler options]
                  [--task classification|regression] [--test-size 0.3 | --test TEST.csv]
                  [--device auto] [--logdir DIR] [--out posterior.pt] [--seed N]
    torchtree predict posterior.pt DATA.csv [--proba] [--level 0.9] [--out preds.csv]
    torchtree summary posterior.pt [--dot [--tree I]]
    torchtree demo [--seed N]
    torchtree bench NAME [--out FILE.json] [script options] | torchtree bench --list

Sampler options are generated from the constructor of the sampler registered
for ``--method`` (``torchtree.estimators.METHODS``): ``--n-particles 500`` sets
``n_particles=500``; values are parsed by the type of the default (``--flag`` /
``--no-flag`` for booleans, several values for tuples). ``torchtree fit --method
mcmc --help`` lists that method's options. A sampler registered with
``register_method`` gets its options here without changes to this file.

Errors a user can fix (bad files, bad options) print ``torchtree: error: ...``
on stderr and exit with status 2; ``--debug`` shows the traceback instead.
"""
from __future__ import annotations

import argparse
import inspect
import json
import math
import os
import re
import subprocess
import sys
import time
from pathlib import Path
from typing import Any, Dict, List, Optional, Sequence, Tuple

import numpy as np

__all__ = ["main", "demo", "build_parser", "sampler_options", "load_posterior"]

#: Exceptions that mean "the user can fix this": message only, exit status 2.
USER_ERRORS = (ValueError, FileNotFoundError, IsADirectoryError, NotADirectoryError, PermissionError, MemoryError, NotImplementedError)

#: Constructor parameters that are not command-line options (objects, or set by the CLI itself).
RESERVED = {"self", "prior", "likelihood", "backend", "monitor", "device", "seed", "random_state", "hyper", "data", "method", "checkpoint"}

#: Estimator parameters that the CLI sets itself.
ESTIMATOR_RESERVED = {"self", "method", "random_state", "device", "monitor"}

POSTERIOR_FORMAT = "torchtree.TreePosterior/1"


# ============================================================================ demo
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
    """Fit the README's main job on the embedded dataset and print a table.

    Returns
    -------
    list of (method, particles, seconds, accuracy, log_predictive) rows.
    """
    from .estimators import BayesianTreeClassifier

    Xtr, ytr, Xte, yte, name = _demo_data(seed)
    print(f"torchtree demo: {name}; train {len(ytr)}, test {len(yte)}", file=out)
    rows = []
    configs = [
        ("smc", dict(n_particles=100, n_islands=5, proposal="prior"), "top-down SMC, prior proposal"),
        ("smc", dict(n_particles=1000, n_islands=5, proposal="prior"), "top-down SMC, prior proposal"),
        ("smc", dict(n_particles=100, n_islands=5, proposal="optimal"), "top-down SMC, optimal proposal"),
    ]
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


# ============================================================== generated options
def _param_docs(obj) -> Dict[str, Tuple[str, str]]:
    """``name -> (type text, first line of the description)`` from a numpydoc ``Parameters`` section."""
    doc = inspect.getdoc(obj) or ""
    out: Dict[str, Tuple[str, str]] = {}
    lines = doc.splitlines()
    for i, line in enumerate(lines):
        m = re.match(r"^(\w+(?:\s*,\s*\w+)*)\s*:\s*(.*)$", line)
        if not m:
            continue
        names = [n.strip() for n in m.group(1).split(",")]
        kind = m.group(2).strip()
        para = []
        for nxt in lines[i + 1:]:
            if not nxt.startswith((" ", "\t")) or not nxt.strip():
                break
            para.append(nxt.strip())
        desc = " ".join(para)
        cut = re.search(r"(?<=\.)\s", desc)  # the first sentence
        if cut:
            desc = desc[: cut.start()]
        if len(desc) > 160:
            desc = desc[:157].rstrip() + "..."
        for n in names:
            out.setdefault(n, (kind, desc))
    return out


def _help_and_choices(doc: Tuple[str, str]) -> Tuple[str, Optional[List[str]]]:
    """Help text from a parameter's documentation; choices when its type is ``{"a", "b"}``."""
    kind, desc = doc
    choices = None
    m = re.match(r"^\{(.*)\}", kind)
    if m:
        opts = re.findall(r"[\"']([^\"']+)[\"']", m.group(1))
        if opts:
            choices = opts
    text = desc or (kind if not re.fullmatch(r"[\w\s,.\[\]()]*", kind) or "," in kind else "")
    if not desc and choices:
        text = ""
    return text.replace("``", "").strip(), choices


def _annotation_kind(annotation: Any) -> Optional[type]:
    if annotation is inspect.Parameter.empty:
        return None
    text = annotation if isinstance(annotation, str) else getattr(annotation, "__name__", None) or str(annotation)
    text = str(text)
    if re.search(r"\bfloat\b", text):
        return float
    if re.search(r"\bbool\b", text):
        return bool
    if re.search(r"\bint\b", text):
        return int
    if re.search(r"\bstr\b", text):
        return str
    return object


def _parse_auto(text: str):
    """An option value without a typed default: None, int, float, or the string."""
    if text.lower() in ("none", "null"):
        return None
    for conv in (int, float):
        try:
            return conv(text)
        except ValueError:
            pass
    return text


def _optional(conv):
    def parse(text: str):
        if text.lower() in ("none", "null"):
            return None
        return conv(text)

    parse.__name__ = getattr(conv, "__name__", "value")
    return parse


def _parse_dtype(text: str):
    import torch

    dt = getattr(torch, text.replace("torch.", ""), None)
    if not isinstance(dt, torch.dtype):
        raise argparse.ArgumentTypeError(f"not a torch dtype: {text!r} (e.g. float32, float64)")
    return dt


def _option_kwargs(param: inspect.Parameter, doc: Tuple[str, str] = ("", ""), note: str = "") -> Optional[Dict[str, Any]]:
    """argparse keywords for a constructor parameter, or None when it is not a CLI option."""
    import torch

    default = param.default
    if default is inspect.Parameter.empty:
        return None
    help_text, choices = _help_and_choices(doc)
    shown = default if not isinstance(default, torch.dtype) else str(default).replace("torch.", "")
    help_text = " ".join(x for x in (help_text, note, f"(default: {shown})") if x)
    kw: Dict[str, Any] = {"default": argparse.SUPPRESS, "help": help_text.replace("%", "%%")}
    if isinstance(default, bool):
        kw["action"] = argparse.BooleanOptionalAction
    elif isinstance(default, int):
        kw.update(type=int, metavar="INT")
    elif isinstance(default, float):
        kw.update(type=float, metavar="X")
    elif isinstance(default, str):
        if choices and default in choices:
            kw.update(type=str, choices=choices, metavar="{" + ",".join(choices) + "}")
        else:
            kw.update(type=str, metavar="STR")
    elif isinstance(default, torch.dtype):
        kw.update(type=_parse_dtype, metavar="DTYPE")
    elif isinstance(default, (tuple, list)) and default and all(isinstance(v, (int, float)) and not isinstance(v, bool) for v in default):
        conv = float if any(isinstance(v, float) for v in default) else int
        kw.update(type=conv, nargs="+", metavar="X" if conv is float else "INT")
    elif default is None:
        kind = _annotation_kind(param.annotation)
        if kind is bool:
            kw["action"] = argparse.BooleanOptionalAction
        elif kind in (int, float, str):
            kw.update(type=_optional(kind), metavar={int: "INT", float: "X", str: "STR"}[kind])
        elif kind is None:
            kw.update(type=_parse_auto, metavar="VALUE")
        else:
            return None  # an object (e.g. a hyperparameter dataclass): Python API only
    else:
        return None
    return kw


def sampler_options(cls) -> List[Tuple[str, Dict[str, Any]]]:
    """The command-line options of a sampler class: ``[(param name, argparse keywords)]``."""
    docs = _param_docs(cls)
    out = []
    for name, p in inspect.signature(cls.__init__).parameters.items():
        if name in RESERVED or p.kind in (p.VAR_POSITIONAL, p.VAR_KEYWORD):
            continue
        kw = _option_kwargs(p, docs.get(name, ("", "")))
        if kw is not None:
            out.append((name, kw))
    return out


def _estimator_options() -> List[Tuple[str, Dict[str, Any], str]]:
    """Options of the estimators (prior, likelihood): ``[(name, kwargs, task or "")]``."""
    from .estimators import BayesianTreeClassifier, BayesianTreeRegressor, _BayesianTreeBase

    out, seen = [], set()
    for cls, task in ((_BayesianTreeBase, ""), (BayesianTreeClassifier, "classification"), (BayesianTreeRegressor, "regression")):
        docs = _param_docs(cls)
        docs.update({k: v for k, v in _param_docs(BayesianTreeClassifier).items() if k not in docs})
        for name, p in inspect.signature(cls.__init__).parameters.items():
            if name in ESTIMATOR_RESERVED or name in seen or p.kind in (p.VAR_POSITIONAL, p.VAR_KEYWORD):
                continue
            kw = _option_kwargs(p, docs.get(name, ("", "")), f"[{task} only]" if task else "")
            if kw is not None:
                seen.add(name)
                out.append((name, kw, task))
    return out


def _flag(name: str) -> str:
    return "--" + name.replace("_", "-")


def _peek(argv: Sequence[str], option: str) -> Optional[str]:
    for i, a in enumerate(argv):
        if a == option and i + 1 < len(argv):
            return argv[i + 1]
        if a.startswith(option + "="):
            return a.split("=", 1)[1]
    return None


# ============================================================================ parser
class _Formatter(argparse.RawDescriptionHelpFormatter):
    def __init__(self, prog):
        super().__init__(prog, max_help_position=32)


def build_parser(method: str = "smc") -> argparse.ArgumentParser:
    """The ``torchtree`` argument parser, with ``fit``'s sampler options for ``method``."""
    from . import __version__
    from .estimators import METHODS, get_method

    common = argparse.ArgumentParser(add_help=False)
    common.add_argument("--quiet", "-q", action="store_true", default=argparse.SUPPRESS, help="no progress bar or chatter; results only")
    common.add_argument("--debug", action="store_true", default=argparse.SUPPRESS, help="show tracebacks of errors")

    parser = argparse.ArgumentParser(
        prog="torchtree",
        description="Bayesian decision trees as batched PyTorch tensors.",
        epilog="Run 'torchtree COMMAND --help' for the options of a command.",
        parents=[common],
    )
    parser.add_argument("--version", action="version", version=f"torchtree {__version__}")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND")

    # ------------------------------------------------------------------ fit
    p = sub.add_parser(
        "fit", parents=[common], formatter_class=_Formatter, allow_abbrev=False,
        usage="torchtree fit DATA.csv [--target COL] [--method METHOD] [--task TASK] [--test-size FRAC | --test TEST.csv]\n"
              "                     [--device DEVICE] [--logdir DIR] [--out FILE] [--seed N] [model and sampler options]",
        help="sample a posterior over trees from a CSV file and save it",
        description=(
            "Sample a posterior over decision trees from DATA.csv, print a short report and save\n"
            "the posterior. The last column is the target unless --target names another.\n"
            "Sampler options come from the sampler of --method; see 'torchtree fit --method M --help'."
        ),
    )
    p.add_argument("data", metavar="DATA.csv", help="training data: CSV with a header row (.csv.gz accepted)")
    p.add_argument("--target", metavar="COL", help="target column name or index (default: the last column)")
    p.add_argument("--method", default="smc", choices=sorted(METHODS), help="sampler (default: smc)")
    p.add_argument("--task", choices=("classification", "regression"),
                   help="default: regression when the target is numeric with a non-integer value, else classification")
    g = p.add_mutually_exclusive_group()
    g.add_argument("--test-size", type=float, default=0.3, metavar="FRAC", help="fraction held out for testing, 0 for none (default: 0.3)")
    g.add_argument("--test", metavar="TEST.csv", help="test data in a separate file (same columns)")
    p.add_argument("--device", default="auto", help="cpu, cuda, cuda:1, or auto = CUDA when present (default: auto)")
    p.add_argument("--logdir", metavar="DIR", help="write a TensorBoard run to DIR")
    p.add_argument("--out", default="posterior.pt", metavar="FILE", help="where to save the posterior (default: posterior.pt)")
    p.add_argument("--seed", type=int, default=0, help="seed of the sampler and of the test split (default: 0)")
    est = p.add_argument_group("model options (prior and leaf likelihood)")
    taken = {"data", "target", "method", "task", "test_size", "test", "device", "logdir", "out", "seed", "quiet", "debug"}
    est_tasks: Dict[str, str] = {}
    for name, kw, task in _estimator_options():
        est.add_argument(_flag(name), dest=name, **kw)
        taken.add(name)
        est_tasks[name] = task
    try:
        cls = get_method(method)
        error = None
    except ValueError as exc:
        cls, error = None, str(exc)
    title = f"sampler options (--method {method}: {cls.__name__})" if cls is not None else f"sampler options (--method {method})"
    smp = p.add_argument_group(title, None if error is None else f"unavailable: {error}")
    names = []
    if cls is not None:
        for name, kw in sampler_options(cls):
            if name in taken:
                continue
            smp.add_argument(_flag(name), dest=name, **kw)
            names.append(name)
    p.set_defaults(func=_cmd_fit, _sampler_names=names, _estimator_tasks=est_tasks)

    # -------------------------------------------------------------- predict
    p = sub.add_parser(
        "predict", parents=[common], formatter_class=_Formatter,
        help="predict from a saved posterior, with uncertainty",
        description=(
            "Predict for every row of DATA.csv. Classification: the most probable label and its\n"
            "probability (--proba: every class's probability). Regression: the posterior predictive\n"
            "mean and an equal-tailed credible interval (--level, default 0.9).\n"
            "A target column in DATA.csv is ignored (matched by name, or by the number of columns)."
        ),
    )
    p.add_argument("posterior", metavar="POSTERIOR.pt")
    p.add_argument("data", metavar="DATA.csv")
    p.add_argument("--proba", action="store_true", help="classification: one probability column per class")
    p.add_argument("--level", type=float, default=0.9, help="regression: credible level of the interval (default: 0.9)")
    p.add_argument("--out", metavar="FILE", help="write CSV here (default: standard output)")
    p.set_defaults(func=_cmd_predict)

    # -------------------------------------------------------------- summary
    p = sub.add_parser(
        "summary", parents=[common], formatter_class=_Formatter,
        help="tree sizes, depth, feature usage and the MAP tree of a saved posterior",
    )
    p.add_argument("posterior", metavar="POSTERIOR.pt")
    p.add_argument("--dot", action="store_true", help="print the tree as Graphviz DOT instead (pipe to 'dot -Tpng')")
    p.add_argument("--tree", type=int, metavar="I", help="which tree (default: the heaviest, i.e. the MAP tree)")
    p.set_defaults(func=_cmd_summary)

    # ----------------------------------------------------------------- demo
    p = sub.add_parser("demo", parents=[common], help="fit the embedded demo dataset and print a comparison table")
    p.add_argument("--seed", type=int, default=0)
    p.set_defaults(func=_cmd_demo)

    # ---------------------------------------------------------------- bench
    p = sub.add_parser(
        "bench", parents=[common], formatter_class=_Formatter,
        help="run a benchmark script (examples/bench_NAME.py)",
        description=(
            "Run examples/bench_NAME.py with the options given after NAME (passed through),\n"
            "writing its JSON results to --out. 'torchtree bench --list' shows the benchmarks;\n"
            "'torchtree bench NAME --help' shows a benchmark's own options.\n"
            "The examples folder is $TORCHTREE_EXAMPLES, else the repository's examples/."
        ),
    )
    p.add_argument("name", nargs="?", metavar="NAME")
    p.add_argument("--list", action="store_true", help="list the available benchmarks")
    p.add_argument("--out", metavar="FILE.json", help="JSON output (passed to the script as --out)")
    p.set_defaults(func=_cmd_bench)
    return parser


# ====================================================================== helpers
def _say(args, *msg) -> None:
    if not getattr(args, "quiet", False):
        print(*msg, file=sys.stderr)


def _resolve_device(device: str) -> str:
    import torch

    if device in (None, "auto"):
        return "cuda" if torch.cuda.is_available() else "cpu"
    try:
        dev = torch.device(device)
    except (RuntimeError, TypeError) as exc:
        raise ValueError(f"--device {device!r}: {exc}") from None
    if dev.type == "cuda" and not torch.cuda.is_available():
        raise ValueError(f"--device {device}: CUDA is not available on this machine (use --device cpu)")
    return str(dev)


def _split(y: np.ndarray, test_size: float, seed: int, stratify: bool) -> Tuple[np.ndarray, np.ndarray]:
    """Train / test indices: a seeded random split, per class for classification
    (every class with two or more rows keeps at least one in training)."""
    n = len(y)
    rng = np.random.default_rng(seed)
    if test_size <= 0:
        return np.arange(n), np.arange(0)
    if stratify:
        test = []
        for c in np.unique(y):
            idx = np.flatnonzero(y == c)
            idx = idx[rng.permutation(len(idx))]
            k = min(int(round(test_size * len(idx))), len(idx) - 1)
            test.append(idx[:k])
        te = np.sort(np.concatenate(test)) if test else np.arange(0)
    else:
        te = np.sort(rng.permutation(n)[: int(round(test_size * n))])
    mask = np.ones(n, dtype=bool)
    mask[te] = False
    tr = np.flatnonzero(mask)
    if len(tr) == 0:
        raise ValueError(f"--test-size {test_size} leaves no training rows")
    return tr, te


def _fmt(v: Any, spec: str = ".4f") -> str:
    if v is None:
        return "n/a"
    if isinstance(v, float) and not math.isfinite(v):
        return str(v)
    return format(v, spec)


def _sizes(post) -> Dict[str, float]:
    from .diagnostics import tree_sizes

    try:
        s = tree_sizes(post)
    except (TypeError, AttributeError):
        return {}
    w = s["weight"]
    return {
        "leaves_mean": float((w * s["n_leaves"]).sum()),
        "leaves_max": int(s["n_leaves"].max()),
        "depth_mean": float((w * s["depth"]).sum()),
        "depth_max": int(s["depth"].max()),
        "n_distinct": int(len(w)),
    }


def _schema(post) -> Dict[str, Any]:
    raw = getattr(post, "info", {}).get("cli")
    if isinstance(raw, str):
        try:
            return json.loads(raw)
        except json.JSONDecodeError:
            return {}
    return {}


def _n_features(post) -> int:
    n = getattr(post, "n_features", None)
    if n is None:
        n = post.data.n_features  # soft-tree posteriors
    return int(n)


def load_posterior(path: str):
    """Load a posterior saved by any torchtree sampler (hard trees or soft trees).

    The file is first read with ``torch.load(weights_only=True)``: nothing in it
    can run code.
    """
    import torch

    from .posterior import TreePosterior

    if not os.path.exists(path):
        raise FileNotFoundError(f"{path}: no such file")
    if os.path.isdir(path):
        raise IsADirectoryError(f"{path}: is a directory, not a posterior file")
    try:
        payload = torch.load(path, map_location="cpu", weights_only=True)
    except Exception as exc:
        raise ValueError(f"{path}: not a torchtree posterior file (torch.load cannot read it as plain tensors: {type(exc).__name__})") from exc
    if isinstance(payload, dict) and payload.get("format") == POSTERIOR_FORMAT:
        return TreePosterior.load(path)
    if isinstance(payload, dict) and "topologies" in payload and "draws" in payload:
        from .soft.posterior import SoftTreePosterior

        return SoftTreePosterior.load(path)
    raise ValueError(f"{path}: not a torchtree posterior file")


# ========================================================================= fit
def _cmd_fit(args) -> int:
    import torch

    from .csvio import infer_task, parse_target, read_csv
    from .estimators import BayesianTreeClassifier, BayesianTreeRegressor, get_method
    from .monitor import ProgressMonitor, TensorBoardMonitor

    quiet = getattr(args, "quiet", False)
    cls = get_method(args.method)  # a clear error if the method cannot be imported
    target = args.target
    table = read_csv(args.data, target=target)
    task = args.task or infer_task(table.y)
    y = parse_target(table.y, task, table.lines, table.path, f"target {table.target_name!r}")
    X = table.X
    if args.test:
        test = read_csv(args.test, target=table.target_name if args.target is None else args.target)
        if test.feature_names != table.feature_names:
            raise ValueError(f"{args.test}: feature columns {test.feature_names} differ from {args.data}'s {table.feature_names}")
        Xtr, ytr = X, y
        Xte, yte = test.X, parse_target(test.y, task, test.lines, test.path, f"target {test.target_name!r}")
        split = f"train {len(ytr)} ({args.data}), test {len(yte)} ({args.test})"
    else:
        if not 0 <= args.test_size < 1:
            raise ValueError(f"--test-size must lie in [0, 1), got {args.test_size}")
        tr, te = _split(y, args.test_size, args.seed, stratify=task == "classification")
        Xtr, ytr, Xte, yte = X[tr], y[tr], X[te], y[te]
        split = f"train {len(tr)}, test {len(te)} (--test-size {args.test_size:g}, seed {args.seed})"

    given = vars(args)
    est_kw = {k: given[k] for k in args._estimator_tasks if k in given}
    for k in est_kw:
        if args._estimator_tasks[k] and args._estimator_tasks[k] != task:
            raise ValueError(f"{_flag(k)} applies to {args._estimator_tasks[k]} only; this is a {task} task")
    smp_kw = {k: (tuple(given[k]) if isinstance(given[k], list) else given[k]) for k in args._sampler_names if k in given}
    device = _resolve_device(args.device)
    monitors: List[Any] = [ProgressMonitor(desc=f"torchtree fit [{args.method}]", disable=True if quiet else None)]
    if args.logdir:
        monitors.append(TensorBoardMonitor(args.logdir))
    Est = BayesianTreeClassifier if task == "classification" else BayesianTreeRegressor
    model = Est(args.method, random_state=args.seed, device=device, monitor=monitors, **est_kw, **smp_kw)
    out_dir = os.path.dirname(os.path.abspath(args.out))
    if not os.path.isdir(out_dir):
        raise FileNotFoundError(f"--out {args.out}: directory {out_dir} does not exist")

    n_cls = ""
    if task == "classification":
        classes = np.unique(ytr)
        shown = ", ".join(map(str, classes[:8])) + (", ..." if len(classes) > 8 else "")
        n_cls = f", {len(classes)} classes: {shown}"
    opts = " ".join(f"{k}={v}" for k, v in {**est_kw, **smp_kw}.items())
    rows: List[Tuple[str, str]] = [
        ("data", f"{args.data}: {table.n_rows} rows, {table.n_features} features, target {table.target_name!r} ({task}{n_cls})"),
        ("split", split),
        ("method", f"{args.method} ({cls.__name__}){' ' + opts if opts else ''}, device {device}, seed {args.seed}"),
    ]
    t0 = time.perf_counter()
    model.fit(Xtr, ytr)
    secs = time.perf_counter() - t0
    post = model.posterior_
    info = getattr(post, "info", {}) or {}
    rows.append(("time", f"{secs:.2f} s"))
    le = getattr(post, "log_evidence", None)
    rows.append(("log evidence", _fmt(le) if le is not None else f"n/a ({args.method} does not estimate it)"))
    ess = getattr(post, "ess", None)
    n_part = getattr(post, "n_particles", None)
    sizes = _sizes(post)
    if "rhat_leaves" in info and n_part:
        rows.append(("samples", f"{n_part} draws ({sizes.get('n_distinct', '?')} distinct trees)"))
    elif isinstance(ess, (int, float)) and n_part:
        rows.append(("ESS", f"{ess:.1f} of {n_part} particles ({sizes.get('n_distinct', '?')} distinct trees)"))
    if "rhat_leaves" in info or "ess_leaves" in info:
        rows.append(("chains", f"R-hat(leaves) {_fmt(info.get('rhat_leaves'), '.3f')}, ESS(leaves) {_fmt(info.get('ess_leaves'), '.1f')}"
                               + (f", accept {_fmt(info.get('accept/all'), '.3f')}" if "accept/all" in info else "")))
    schema = {
        "features": table.feature_names,
        "target": table.target_name,
        "task": task,
        "method": args.method,
        "options": {k: (v if isinstance(v, (int, float, str, bool, type(None))) else str(v)) for k, v in {**est_kw, **smp_kw}.items()},
        "data": os.path.basename(args.data),
    }
    post.info["cli"] = json.dumps(schema)
    post.save(args.out)
    if len(yte):
        rows.extend(_evaluate(post, task, Xte, yte, ytr, debug=getattr(args, "debug", False)))
    if sizes:
        rows.append(("trees", f"leaves mean {sizes['leaves_mean']:.2f} (max {sizes['leaves_max']}), depth mean {sizes['depth_mean']:.2f} (max {sizes['depth_max']})"))
    rows.append(("saved", args.out + (f"; TensorBoard run in {args.logdir}" if args.logdir else "")))
    width = max(len(k) for k, _ in rows)
    for k, v in rows:
        print(f"{k:<{width}}  {v}")
    return 0


def _evaluate(post, task: str, Xte, yte, ytr, debug: bool = False) -> List[Tuple[str, str]]:
    """Report rows of test metrics; a metric that fails is reported as n/a, not fatal
    (the posterior is saved already)."""
    rows: List[Tuple[str, str]] = []

    def add(name: str, fn) -> None:
        try:
            rows.append((name, fn()))
        except Exception as exc:
            if debug:
                raise
            rows.append((name, f"n/a ({type(exc).__name__}: {str(exc)[:120]})"))

    if task == "classification":
        add("test accuracy", lambda: f"{post.accuracy(Xte, yte):.4f}")
        classes = getattr(post, "classes_", None)
        seen = np.isin(yte, np.asarray(classes if classes is not None else np.unique(ytr)))
        if seen.all():
            add("test log p(y|x)", lambda: f"{post.log_predictive(Xte, yte):.4f} per point")
        else:
            rows.append(("test log p(y|x)", f"n/a ({int((~seen).sum())} test labels not seen in training)"))
    else:
        add("test RMSE", lambda: f"{post.rmse(Xte, yte):.4f}")
        add("test log p(y|x)", lambda: f"{post.log_predictive(Xte, yte):.4f} per point")

        def coverage() -> str:
            iv = _intervals(post, Xte, 0.9)
            cover = float(np.mean((yte >= iv[:, 0]) & (yte <= iv[:, 1])))
            return f"covers {cover:.3f} of test targets, mean width {float(np.mean(iv[:, 1] - iv[:, 0])):.4g}"

        add("90% interval", coverage)
    return rows


def _intervals(post, X: np.ndarray, level: float, chunk: int = 2048) -> np.ndarray:
    """Predictive intervals in chunks of rows (the Monte Carlo draws are [draws, rows])."""
    if len(X) == 0:
        return np.zeros((0, 2))
    return np.concatenate([post.predict_interval(X[s : s + chunk], level=level) for s in range(0, len(X), chunk)])


# ===================================================================== predict
def _cmd_predict(args) -> int:
    from .csvio import parse_target, read_features, write_csv

    post = load_posterior(args.posterior)
    schema = _schema(post)
    D = _n_features(post)
    table = read_features(args.data, D, schema.get("features"), schema.get("target"))
    X = table.X
    task = post.task
    if task == "classification":
        proba = post.predict_proba(X)
        classes = post.classes_ if getattr(post, "classes_", None) is not None else np.arange(proba.shape[1])
        classes = np.asarray(classes)
        codes = proba.argmax(1)
        pred = classes[codes]
        if args.proba:
            header = ["prediction"] + [f"p_{c}" for c in classes.tolist()]
            cols = [pred.tolist()] + [proba[:, k] for k in range(proba.shape[1])]
        else:
            header = ["prediction", "probability"]
            cols = [pred.tolist(), proba[np.arange(len(codes)), codes]]
    else:
        if args.proba:
            _say(args, "torchtree predict: --proba applies to classification; writing the mean and interval")
        if not 0 < args.level < 1:
            raise ValueError(f"--level must lie in (0, 1), got {args.level}")
        mean = post.predict(X)
        iv = _intervals(post, X, args.level)
        pct = f"{100 * args.level:g}"
        header = ["mean", f"lower_{pct}", f"upper_{pct}"]
        cols = [mean, iv[:, 0], iv[:, 1]]
    write_csv(args.out, header, cols, out=sys.stdout)
    if table.y is not None and not getattr(args, "quiet", False):
        try:
            y = parse_target(table.y, task, table.lines, table.path)
            if task == "classification":
                msg = f"accuracy {float(np.mean(pred.astype(str) == y.astype(str))):.4f}"
            else:
                msg = f"RMSE {float(np.sqrt(np.mean((mean - y) ** 2))):.4f}"
            print(f"torchtree predict: {len(X)} rows; target column {table.target_name!r} ignored for prediction; {msg}", file=sys.stderr)
        except ValueError:
            pass
    if args.out:
        _say(args, f"torchtree predict: wrote {len(X)} rows to {args.out}")
    return 0


# ===================================================================== summary
def _tree_text(post, i: int, names: Sequence[str]) -> List[str]:
    """The hard tree ``i`` as indented text."""
    from .trees import INTERNAL

    t = post.trees
    n = int(t.n_nodes[i])
    table = post.likelihood.predictive_table(t.stats[i, :n]).cpu()
    classes = post.classes_
    lines: List[str] = []

    def leaf(node: int) -> str:
        if post.task == "classification":
            p = table[node]
            k = int(p.argmax())
            lab = classes[k] if classes is not None else k
            cnt = int(t.stats[i, node].sum())
            return f"leaf n={cnt}: {lab} (p={float(p[k]):.2f}) [" + ", ".join(f"{float(v):.2f}" for v in p) + "]"
        cnt = int(t.stats[i, node, 0])
        return f"leaf n={cnt}: mean {float(table[node, 1]):.4g}"

    def walk(node: int, prefix: str, label: str, last: bool) -> None:
        branch = "" if not label else ("`-- " if last else "|-- ") + label + ": "
        if int(t.status[i, node]) == INTERNAL:
            lines.append(f"{prefix}{branch}{names[int(t.feature[i, node])]} <= {float(t.threshold[i, node]):.6g}")
            child_prefix = prefix + ("" if not label else ("    " if last else "|   "))
            walk(int(t.left[i, node]), child_prefix, "yes", False)
            walk(int(t.right[i, node]), child_prefix, "no", True)
        else:
            lines.append(f"{prefix}{branch}{leaf(node)}")

    walk(0, "  ", "", True)
    return lines


def _cmd_summary(args) -> int:
    post = load_posterior(args.posterior)
    schema = _schema(post)
    D = _n_features(post)
    names = schema.get("features") or [f"x{d}" for d in range(D)]
    if len(names) != D:
        names = [f"x{d}" for d in range(D)]
    if args.tree is not None and not args.dot:
        raise ValueError("--tree applies with --dot (the text summary shows the MAP tree)")
    if args.dot:
        print(post.to_dot(args.tree, feature_names=names))
        return 0
    s = post.summary()
    info = getattr(post, "info", {}) or {}
    task = post.task
    head = f"{args.posterior}: {task}"
    classes = getattr(post, "classes_", None)
    if task == "classification" and classes is not None:
        cl = [str(c) for c in np.asarray(classes).tolist()]
        head += f", {len(cl)} classes ({', '.join(cl[:10])}{', ...' if len(cl) > 10 else ''})"
    head += f", {D} features"
    if schema.get("target"):
        head += f", target {schema['target']!r}"
    print(head)
    sampler = info.get("sampler") or type(post).__name__
    rows: List[Tuple[str, str]] = []
    sizes = _sizes(post)
    if "n_particles" in s:
        unit = "draws" if "rhat_leaves" in info else "particles"
        ess_part = "" if unit == "draws" else f", ESS {_fmt(s.get('ess'), '.1f')}"
        rows.append(("sampler", f"{sampler}{' (' + schema['method'] + ')' if schema.get('method') else ''}, {s['n_particles']} {unit}, "
                                f"{s.get('n_distinct_trees', sizes.get('n_distinct'))} distinct trees{ess_part}"))
    else:
        rows.append(("sampler", f"{sampler}{' (' + schema['method'] + ')' if schema.get('method') else ''}, {sizes.get('n_distinct', '?')} distinct trees/topologies"))
    rows.append(("log evidence", _fmt(s.get("log_evidence"))))
    if "rhat_leaves" in info:
        rows.append(("chains", f"R-hat(leaves) {_fmt(info.get('rhat_leaves'), '.3f')}, ESS(leaves) {_fmt(info.get('ess_leaves'), '.1f')}"))
    if sizes:
        rows.append(("leaves", f"mean {sizes['leaves_mean']:.2f}, max {sizes['leaves_max']}"))
        rows.append(("depth", f"mean {sizes['depth_mean']:.2f}, max {sizes['depth_max']}"))
    width = max(len(k) for k, _ in rows)
    for k, v in rows:
        print(f"{k:<{width}}  {v}")
    usage = s.get("feature_usage")
    label = "feature usage (expected number of splits on each feature per tree):"
    if usage is None and "feature_usage_top" in s:
        usage, label = s["feature_usage_top"], "feature usage (mean split weight, heaviest topology):"
    if usage is not None:
        u = np.asarray(usage, dtype=np.float64)
        order = np.argsort(-u, kind="stable")
        top = max(float(u.max()), 1e-12)
        nw = max(len(str(n)) for n in names)
        print(label)
        shown = [j for j in order if u[j] > 0][:15]
        for j in shown:
            print(f"  {names[j]:<{nw}}  {u[j]:7.3f}  {'#' * max(1, int(round(20 * u[j] / top)))}")
        rest = int((u > 0).sum()) - len(shown)
        unused = int((u == 0).sum())
        if rest > 0:
            print(f"  ... {rest} more")
        if unused:
            print(f"  ({unused} feature{'s' if unused > 1 else ''} never split on)")
    w = post.weights
    i = int(np.argmax(np.asarray(w.detach().cpu() if hasattr(w, "detach") else w)))
    print(f"MAP tree (tree {i} of {len(w)}, weight {float(w[i]):.3f}):")
    if hasattr(post, "trees") and hasattr(post.trees, "n_nodes"):
        print("\n".join(_tree_text(post, i, names)))
    else:
        print(post.to_dot(i, feature_names=names))
    return 0


# ======================================================================= bench
def examples_dir() -> Path:
    """Where benchmark scripts live: ``$TORCHTREE_EXAMPLES``, else the repository's ``examples/``,
    else ``./examples``."""
    env = os.environ.get("TORCHTREE_EXAMPLES")
    if env:
        return Path(env)
    repo = Path(__file__).resolve().parent.parent / "examples"
    if repo.is_dir():
        return repo
    return Path.cwd() / "examples"


def benchmarks() -> Dict[str, Path]:
    """``name -> script`` for every ``examples/bench_NAME.py``."""
    d = examples_dir()
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


def _cmd_bench(args) -> int:
    found = benchmarks()
    extra = list(getattr(args, "_extra", []))
    if args.list or not args.name:
        if not found:
            print(f"no benchmarks found (no bench_*.py in {examples_dir()})")
            return 0 if args.list else 2
        width = max(len(n) for n in found)
        print(f"benchmarks in {examples_dir()}:")
        for name, path in found.items():
            print(f"  {name:<{width}}  {_first_doc_line(path)}")
        if not args.list:
            print("usage: torchtree bench NAME [--out FILE.json] [script options]")
            return 2
        return 0
    name = args.name[len("bench_"):] if args.name.startswith("bench_") else args.name
    name = name[:-3] if name.endswith(".py") else name
    if name not in found:
        avail = ", ".join(found) or "none"
        raise ValueError(f"no benchmark named {args.name!r}; available: {avail} (torchtree bench --list)")
    cmd = [sys.executable, str(found[name])]
    if args.out:
        cmd += ["--out", args.out]
    cmd += extra
    _say(args, "torchtree bench: " + " ".join(cmd))
    rc = subprocess.call(cmd)
    if rc == 0 and args.out and os.path.exists(args.out):
        _say(args, f"torchtree bench: wrote {args.out}")
    return rc


def _cmd_demo(args) -> int:
    demo(seed=args.seed)
    return 0


# ======================================================================== main
def _command_of(argv: Sequence[str]) -> Optional[str]:
    for a in argv:
        if not a.startswith("-"):
            return a
    return None


def _split_bench(argv: Sequence[str]) -> Tuple[List[str], List[str]]:
    """``torchtree ... bench [opts] NAME rest``: everything after NAME goes to the script verbatim."""
    i = list(argv).index("bench") + 1
    while i < len(argv):
        a = argv[i]
        if a == "--out":
            i += 2
            continue
        if not a.startswith("-"):
            return list(argv[: i + 1]), list(argv[i + 1 :])
        i += 1
    return list(argv), []


def main(argv: Optional[List[str]] = None) -> int:
    """Entry point of the ``torchtree`` command; returns the exit status."""
    argv = list(sys.argv[1:] if argv is None else argv)
    debug = "--debug" in argv
    try:
        command = _command_of(argv)
        method = _peek(argv, "--method") if command == "fit" else None
        parser = build_parser(method or "smc")
        if command == "bench":
            head, extra = _split_bench(argv)
            args = parser.parse_args(head)
            args._extra = extra
        else:
            args = parser.parse_args(argv)
        if not getattr(args, "command", None):
            parser.print_help(sys.stderr)
            return 2
        return int(args.func(args) or 0)
    except BrokenPipeError:
        # The reader went away (torchtree summary x.pt | head): stop quietly, as cat does.
        try:
            devnull = os.open(os.devnull, os.O_WRONLY)
            os.dup2(devnull, sys.stdout.fileno())
        except (OSError, ValueError):
            pass
        return 141
    except KeyboardInterrupt:
        if debug:
            raise
        print("torchtree: interrupted", file=sys.stderr)
        return 130
    except USER_ERRORS as exc:
        if debug:
            raise
        msg = str(exc) or type(exc).__name__
        if isinstance(exc, OSError) and exc.filename and exc.strerror:
            msg = f"{exc.filename}: {exc.strerror}"
        if isinstance(exc, MemoryError):
            msg = f"out of memory: {msg}"
        print(f"torchtree: error: {msg}", file=sys.stderr)
        return 2


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
