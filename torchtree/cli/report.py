"""``torchtree summary`` and ``torchtree report`` (the summary and, with ``--plots DIR``, the plots of
:mod:`torchtree.plot` as PNG files), and loading saved posteriors."""
from __future__ import annotations

import json
import sys
from typing import Any, Callable, Dict, List, Optional, Sequence, Tuple

import numpy as np

from torchtree.cli.common import chain_rows, check_writable_dir, class_labels, fmt, printable, warn_by_position
from torchtree.model.loading import load_posterior
from torchtree.model.summary import SHOWN_FEATURES

def size_summary(post) -> Dict[str, float]:
    from torchtree.model.diagnostics import tree_sizes

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


def cli_schema(post) -> Dict[str, Any]:
    raw = getattr(post, "info", {}).get("cli")
    if isinstance(raw, str):
        try:
            return json.loads(raw)
        except json.JSONDecodeError:
            return {}
    return {}


def feature_names_of(post, schema: Dict[str, Any]) -> Optional[list]:
    """The input columns' names a posterior was fitted with: those ``torchtree fit`` recorded, else a Python fit's
    (a DataFrame's column names, ``feature_names``), else None (columns by position)."""
    names = schema.get("features") or getattr(post, "feature_names", None)
    return [str(v) for v in names] if names is not None else None


def n_features_of(post) -> int:
    """Input columns a posterior takes (a coded table's input columns, not its split columns)."""
    if getattr(post, "encoder", None) is not None:
        return int(post.encoder.n_inputs)
    n = getattr(post, "n_features", None)
    if n is None:
        n = post.data.n_features  # soft-tree posteriors
    return int(n)


def _indented(children: Callable[[int], Optional[Tuple[int, int]]], rule: Callable[[int], str],
              leaf: Callable[[int], str], indent: str = "") -> List[str]:
    """A tree as indented text from its root 0: ``children(node)`` is ``(yes, no)`` for an internal node,
    None for a leaf; ``rule`` and ``leaf`` give their lines."""
    lines: List[str] = []

    def walk(node: int, prefix: str, label: str, last: bool) -> None:
        branch = "" if not label else ("`-- " if last else "|-- ") + label + ": "
        kids = children(node)
        lines.append(f"{prefix}{branch}{rule(node) if kids else leaf(node)}")
        if kids:
            child_prefix = prefix + ("" if not label else ("    " if last else "|   "))
            walk(kids[0], child_prefix, "yes", False)
            walk(kids[1], child_prefix, "no", True)

    walk(0, indent, "", True)
    return lines


def _class_leaf(p, classes) -> str:
    """``label (p=..) [p_0, ...]`` of a leaf's class probabilities ``p``."""
    k = int(p.argmax())
    lab = classes[k] if classes is not None else k
    return f"{lab} (p={float(p[k]):.2f}) [" + ", ".join(f"{float(v):.2f}" for v in p) + "]"


def _soft_tree_text(post, i: int, names: Sequence[str], labels, shown: int = 3) -> List[str]:
    """Soft tree ``i`` (a topology of a DCC posterior) as indented text: each gate's heaviest ``shown``
    posterior-mean weights and its threshold, on the inputs scaled to [0, 1] by the training ranges."""
    g = post.gates(i, feature_names=names)
    t, names, w, tau = g["topology"], g["names"], g["weights"], g["thresholds"]

    def gate(n: int) -> str:
        order = w[n].argsort(descending=True).tolist()
        terms = [f"{float(w[n, f]):.2f} {names[f]}" for f in order[:shown] if float(w[n, f]) >= 0.005]
        rest = float(w[n, order[shown:]].sum()) if len(order) > shown else 0.0
        more = f" + {rest:.2f} ({len(order) - shown} more)" if rest >= 0.005 else ""
        return " + ".join(terms) + more + f" <= {float(tau[n]):.3f}"

    def leaf(n: int) -> str:
        v = g["leaves"][n]
        return "leaf: " + (_class_leaf(v, labels) if post.task == "classification" else f"mean {float(v):.4g}")

    head = ("soft oblique splits on the inputs scaled to [0, 1] by the training ranges: a point goes to 'yes' "
            "with probability above 1/2 where the weighted sum of its scaled inputs is at most the threshold")
    return [head] + _indented(lambda n: (2 * n + 1, 2 * n + 2) if n in t.internal else None, gate, leaf)


def _tree_text(post, i: int, names: Sequence[str], labels) -> List[str]:
    """The hard tree ``i`` as indented text."""
    from torchtree.model.encoding import rule_text
    from torchtree.model.trees import INTERNAL

    t = post.trees
    n = int(t.n_nodes[i])
    table = post.likelihood.predictive_table(t.stats[i, :n]).cpu()

    def leaf(node: int) -> str:
        if post.task == "classification":
            return f"leaf n={int(t.stats[i, node].sum())}: " + _class_leaf(table[node], labels)
        return f"leaf n={int(t.stats[i, node, 0])}: mean {float(table[node, 1]):.4g}"

    def rule(node: int) -> str:
        return rule_text(getattr(post, "encoder", None), names, int(t.feature[i, node]), float(t.threshold[i, node]))

    def children(node: int):
        return (int(t.left[i, node]), int(t.right[i, node])) if int(t.status[i, node]) == INTERNAL else None

    return _indented(children, rule, leaf, indent="  ")


def cmd_summary(args) -> int:
    post = load_posterior(args.posterior)
    schema = cli_schema(post)
    D = n_features_of(post)
    names = [printable(n) for n in feature_names_of(post, schema) or [f"x{d}" for d in range(D)]]  # names from the file
    if len(names) != D:
        names = [f"x{d}" for d in range(D)]
    if args.tree is not None and not args.dot:
        raise ValueError("--tree applies with --dot (the text summary shows the MAP tree)")
    if args.dot:
        try:
            dot = post.to_dot(args.tree, feature_names=names)
        except IndexError as exc:  # a user's --tree, not a bug: exit 2 with the message
            raise ValueError(f"--tree {args.tree}: {exc}") from exc
        print(dot)
        return 0
    s = post.summary()
    info = getattr(post, "info", {}) or {}
    task = post.task
    head = f"{args.posterior}: {task}"
    labels = [printable(v) for v in class_labels(post, schema)] or None
    if task == "classification" and labels is not None:
        cl = labels
        head += f", {len(cl)} classes ({', '.join(cl[:10])}{', ...' if len(cl) > 10 else ''})"
    head += f", {D} features"
    if schema.get("target"):
        head += f", target {printable(repr(schema['target']))}"
    print(head)
    sampler = printable(info.get("sampler") or type(post).__name__)
    rows: List[Tuple[str, str]] = []
    sizes = size_summary(post)
    if "n_particles" in s:
        unit = "draws" if "rhat_leaves" in info else "particles"
        ess_part = "" if unit == "draws" else f", ESS {fmt(s.get('ess'), '.1f')}"
        rows.append(("sampler", f"{sampler}{' (' + schema['method'] + ')' if schema.get('method') else ''}, {s['n_particles']} {unit}, "
                                f"{s.get('n_distinct_trees', sizes.get('n_distinct'))} distinct trees{ess_part}"))
    elif "n_trees" in s and "n_draws" in s:  # BART: every draw is a sum of trees
        rows.append(("sampler", f"{sampler}{' (' + schema['method'] + ')' if schema.get('method') else ''}, "
                                f"{s['n_draws']} draws of a sum of {s['n_trees']} trees"))
    else:
        rows.append(("sampler", f"{sampler}{' (' + schema['method'] + ')' if schema.get('method') else ''}, {sizes.get('n_distinct', '?')} distinct trees/topologies"))
    rows.append(("log evidence", fmt(s.get("log_evidence"))))
    rows += chain_rows(info)
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
    if usage is None and "split_share" in s:
        usage, label = s["split_share"], "feature usage (share of all splits, over draws and trees):"
    if usage is not None:
        u = np.asarray(usage, dtype=np.float64)
        order = np.argsort(-u, kind="stable")
        top = max(float(u.max()), 1e-12)
        nw = max(len(str(n)) for n in names)
        print(label)
        shown = [j for j in order if u[j] > 0][:SHOWN_FEATURES]
        for j in shown:
            print(f"  {names[j]:<{nw}}  {u[j]:7.3f}  {'#' * max(1, int(round(20 * u[j] / top)))}")
        rest = int((u > 0).sum()) - len(shown)
        unused = int((u == 0).sum())
        if rest > 0:
            print(f"  ... {rest} more")
        if unused:
            print(f"  ({unused} feature{'s' if unused > 1 else ''} never split on)")
    if "split_share" in s:  # a sum of trees: no tree of it is a posterior mode
        utilities = s.get("class_utilities")
        per = f"per class utility ({', '.join(map(str, utilities))}; reference class {s['reference_class']})" \
            if utilities else "per draw"
        print(f"sum of {s['n_trees']} trees {per}: no single MAP tree (torchtree summary {args.posterior} --dot "
              "--tree I draws tree I of the last forest)")
        return 0
    w = post.weights
    i = int(np.argmax(np.asarray(w.detach().cpu() if hasattr(w, "detach") else w)))
    print(f"MAP tree (tree {i} of {len(w)}, weight {float(w[i]):.3f}):")
    if hasattr(post, "trees") and hasattr(post.trees, "n_nodes"):
        print("\n".join(map(printable, _tree_text(post, i, names, labels))))  # level names from the file too
    else:
        print("\n".join(map(printable, _soft_tree_text(post, i, names, labels))))
    return 0


def _report_data(post, args):
    """``(X, y, names)`` of ``--data`` (``y`` None when the file has no target column; ``names`` the
    file's feature columns)."""
    from torchtree.io.csv import parse_target
    from torchtree.io.features import read_features

    schema = cli_schema(post)
    table = read_features(args.data, n_features_of(post), feature_names_of(post, schema),
                          args.target or schema.get("target"))
    warn_by_position(table, "report")
    if args.target and table.y is None:
        raise ValueError(f"--target {args.target}: {args.data} has no such column")
    # class labels stay as read (text): the calibration plot matches them to the model's labels as text
    y = None if table.y is None else parse_target(table.y, post.task, table.lines, table.path)
    return table.X, y, list(table.feature_names)


def cmd_report(args) -> int:
    """``torchtree report``: the summary, and with ``--plots DIR`` every applicable plot as PNG."""
    from argparse import Namespace

    if args.target and not args.data:
        raise ValueError("--target applies with --data")
    if args.data and not args.plots:
        raise ValueError("--data applies with --plots DIR (the data feed the plots)")
    if args.plots:
        check_writable_dir(args.plots, "--plots")
    status = cmd_summary(Namespace(posterior=args.posterior, dot=False, tree=None))
    if not args.plots:
        return status
    try:
        from torchtree.plot import write_plots
        from torchtree.plot.common import require_matplotlib

        require_matplotlib()
    except ImportError as exc:
        raise ValueError(str(exc)) from None
    post = load_posterior(args.posterior)
    X = y = names = None
    if args.data:
        X, y, names = _report_data(post, args)
        if getattr(post, "feature_names", None) is not None:
            names = None  # the names the posterior keeps from its training table
    written, skipped = write_plots(post, args.plots, X, y, feature_names=names)
    for path, what in written:
        print(f"wrote {path}: {what}")
    need_data = [name for name, why in skipped if why.startswith("needs data")]
    if need_data:
        print(f"torchtree report: skipped {', '.join(need_data)}: they need --data CSV"
              + (" with the target column" if args.data else ""), file=sys.stderr)
    for name, why in skipped:
        if name not in need_data and not getattr(args, "quiet", False):
            print(f"torchtree report: skipped {name}: {why}", file=sys.stderr)
    return status
