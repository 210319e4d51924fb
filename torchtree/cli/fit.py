"""``torchtree fit`` and ``torchtree predict``."""
from __future__ import annotations

import json
import os
import re
import sys
import time
import warnings
from typing import Any, Dict, List, Tuple

import numpy as np

from torchtree.io.cells import is_missing_token
from torchtree.model.data import ASK_CLASSES  # an integer target with more values needs --task
from torchtree.model.encoding import MAX_SUBSET_LEVELS
from torchtree.model.posterior import attach_feature_names
from torchtree.cli.common import (chain_rows, check_writable, class_labels, fmt, option_flag, resolve_device_option,
                                  same_file, say, warn_by_position)
from torchtree.cli.report import cli_schema, feature_names_of, load_posterior, n_features_of, size_summary

def _split(y: np.ndarray, test_size: float, seed: int, stratify: bool) -> Tuple[np.ndarray, np.ndarray]:
    """Train / test indices: a seeded random split, per class for classification
    (every class with two or more rows keeps at least one in training)."""
    n = len(y)
    rng = np.random.default_rng(seed)
    if test_size <= 0:
        return np.arange(n), np.arange(0)
    if stratify:
        # Rows grouped by class with one stable sort (O(N log N); one scan per class was
        # O(N K)). Classes in sorted order, each class's rows ascending and one permutation
        # per class: the same draws, hence the same split, as the per-class scans gave.
        # A single-row class is skipped: it stays in training and permutation(1) draws nothing.
        _, inv = np.unique(y, return_inverse=True)
        order = np.argsort(inv.reshape(-1), kind="stable")
        counts = np.bincount(inv.reshape(-1))
        starts = np.cumsum(counts) - counts
        test = []
        for s, m in zip(starts[counts > 1].tolist(), counts[counts > 1].tolist()):
            idx = order[s : s + m]
            idx = idx[rng.permutation(m)]
            k = min(int(round(test_size * m)), m - 1)
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


def _check_classes(y: np.ndarray, path: str, target: str) -> None:
    """The class checks of ``torchtree.Data``, before the split and in the command line's words.

    Raises
    ------
    ValueError
        A single class, or more classes than half the rows (likely a real-valued target).
    """
    from torchtree.model.data import check_class_count

    classes = np.unique(y)
    if len(classes) < 2:
        raise ValueError(f"{path}: target {target!r} has a single class ({str(classes[0])!r}); a classifier needs "
                         "at least two (pick another --target, or --task regression for a numeric target)")
    check_class_count(len(classes), len(y), name=f"{path}: target {target!r}", advice="use --task regression")


#: a number written with a decimal comma (``-0,725``, ``1.234,5``)
_DECIMAL_COMMA = re.compile(r"[+-]?(\d{1,3}(\.\d{3})+|\d+),\d+")


def _categorical_columns(args, table):
    """``categorical_features`` for the estimator: the text columns (each with a one-line notice) and
    the columns ``--categorical`` names; ``"from_dtype"`` when there are none."""
    forced = [c.strip() for c in (getattr(args, "categorical", None) or "").split(",") if c.strip()]
    unknown = [c for c in forced if c not in table.feature_names]
    if unknown:
        raise ValueError(f"--categorical names {', '.join(map(repr, unknown))}, not feature columns of {args.data} "
                         f"({', '.join(table.feature_names)})")
    for name, (cell, line, count) in table.missing_tokens.items():
        say(args, f"torchtree fit: column {name!r}: {count} cell(s) such as {cell!r} (line {line}) read as missing "
                  "values")
    for name, (cell, line) in table.text_columns.items():
        if name not in forced:
            col = table.X[:, table.feature_names.index(name)]
            present = [v for v in col.tolist() if v == v]
            levels = len(set(present))
            numbers = sum(1 for v in present if not isinstance(v, str))
            hint = (f"; {numbers} of its {len(present)} cells are numbers: if {cell!r} marks a missing value, leave "
                    "those cells empty" if numbers * 2 > len(present) and levels > MAX_SUBSET_LEVELS else "")
            tokens = sorted({v for v in present if isinstance(v, str) and is_missing_token(v)})
            if tokens and not hint:
                one = len(tokens) == 1
                hint = (f"; {', '.join(map(repr, tokens[:3]))} "
                        + ("is a level of its own: if it marks a missing value" if one else
                           "are levels of their own: if they mark missing values")
                        + ", leave those cells empty")
            comma = sum(1 for v in present if isinstance(v, str) and _DECIMAL_COMMA.fullmatch(v))
            if comma * 2 > len(present):
                hint = (f"; its cells look like numbers written with a decimal comma ({cell!r}): the decimal mark "
                        "read is '.', so convert the file first (e.g. pandas.read_csv(path, sep=';', decimal=',')"
                        ".to_csv(new_path, index=False))")
            notice = (f"torchtree fit: column {name!r} holds text ({cell!r} at line {line}): categorical, {levels} "
                      f"levels (--categorical to name categorical columns yourself){hint}")
            if comma * 2 > len(present):  # -q or not: numbers read as labels fit a different model in silence
                print(notice, file=sys.stderr)
            else:
                say(args, notice)
    names = set(forced) | set(table.text_columns)  # from the whole file: a test split may hold a column's text
    return [j for j, n in enumerate(table.feature_names) if n in names] if names else "from_dtype"


def cmd_fit(args) -> int:
    """``torchtree fit``: one job over the launcher's ranks (``--backend``), or one process."""
    from torchtree.distributed import launcher_backend
    from torchtree.methods import accepted_settings, get_method

    cls = get_method(args.method)  # a clear error if the method cannot be imported
    device = resolve_device_option(args.device)
    try:
        backend, name = launcher_backend(getattr(args, "backend", "auto"), device=device,
                                         timeout=args.timeout)
    except (RuntimeError, ImportError) as exc:  # --backend gloo / mpi without its launcher or mpi4py
        raise ValueError(f"--backend {args.backend}: {exc}") from exc
    try:
        if backend.world_size > 1 and "backend" not in accepted_settings(cls):
            raise ValueError(f"--method {args.method} ({cls.__name__}) runs in one process, not across the "
                             f"{backend.world_size} ranks of this launch: start it without torchrun / mpiexec, or "
                             "give --backend local to run it on every rank alone")
        if backend.rank == 0:
            status = _fit(args, cls, device, backend if backend.world_size > 1 else None, name)
        else:
            args.quiet = True  # rank 0 speaks for the job: its notices, warnings, progress and report
            with warnings.catch_warnings():
                warnings.simplefilter("ignore")
                status = _fit(args, cls, device, backend, name)
    except BaseException:
        # no barrier: the other ranks may be in another exchange (a failure or an interrupt here), and a barrier
        # would hold this rank, and its message, until the timeout; they fail in theirs when this rank leaves
        backend.close(wait=False)
        raise
    backend.close()
    return status


def _fit(args, cls, device, backend, backend_name: str) -> int:
    from torchtree.io.csv import infer_task, parse_target, read_csv
    from torchtree.estimators import BayesianTreeClassifier, BayesianTreeRegressor
    from torchtree.methods import accepted_settings
    from torchtree.monitor import ProgressMonitor, TensorBoardMonitor

    quiet = getattr(args, "quiet", False)
    rank = 0 if backend is None else backend.rank
    _check_outputs(args)
    target = args.target
    table = read_csv(args.data, target=target)
    task = args.task or infer_task(table.y)
    y = parse_target(table.y, task, table.lines, table.path, f"target {table.target_name!r}")
    if args.task is None and task == "classification" and y.dtype.kind in "iu" and len(np.unique(y)) > ASK_CLASSES:
        # counts, ages, ratings: integers with many values may be classes or a quantity; a guess either way
        # would fit the wrong model in silence (136 classes at accuracy 0.03, where regression was meant)
        raise ValueError(f"{args.data}: target {table.target_name!r} holds {len(np.unique(y))} distinct integers: "
                         "give --task classification (each value a class) or --task regression (a quantity)")
    X = table.X
    if task == "classification":
        _check_classes(y, args.data, table.target_name)
    categorical = _categorical_columns(args, table)
    if args.test:
        test = read_csv(args.test, target=table.target_name if args.target is None else args.target)
        if test.feature_names != table.feature_names:
            if sorted(test.feature_names) != sorted(table.feature_names):
                raise ValueError(f"{args.test}: feature columns {test.feature_names} differ from {args.data}'s "
                                 f"{table.feature_names}")
            # the same columns in another order: taken by name, as `torchtree predict` does
            test = read_csv(args.test, target=test.target_name, features=table.feature_names)
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
    est_kw: Dict[str, Any] = {k: given[k] for k in args._estimator_tasks if k in given}
    for k in est_kw:
        if args._estimator_tasks[k] and args._estimator_tasks[k] != task:
            raise ValueError(f"{option_flag(k)} applies to {args._estimator_tasks[k]} only; this is a {task} task")
    smp_kw: Dict[str, Any] = {k: (tuple(given[k]) if isinstance(given[k], list) else given[k]) for k in args._sampler_names if k in given}
    if args.checkpoint_every is not None and not args.checkpoint:
        raise ValueError("--checkpoint-every applies with --checkpoint FILE")
    if args.checkpoint:
        args.checkpoint_every = 1 if args.checkpoint_every is None else args.checkpoint_every
        if "checkpoint" not in accepted_settings(cls):
            raise ValueError(f"--method {args.method} ({cls.__name__}) cannot checkpoint; drop --checkpoint")
        if args.checkpoint_every < 1:
            raise ValueError(f"--checkpoint-every must be >= 1, got {args.checkpoint_every}")
        ck_dir = os.path.dirname(os.path.abspath(args.checkpoint))
        if not os.path.isdir(ck_dir):
            raise FileNotFoundError(f"--checkpoint {args.checkpoint}: directory {ck_dir} does not exist")
        smp_kw.update(checkpoint=args.checkpoint, checkpoint_every=args.checkpoint_every)
        if os.path.exists(args.checkpoint) or os.path.exists(args.checkpoint + ".manifest.json"):
            say(args, f"torchtree fit: resuming from {args.checkpoint}")
    if backend is not None:
        smp_kw["backend"] = backend
    monitors: List[Any] = [ProgressMonitor(desc=f"torchtree fit [{args.method}]", disable=True if quiet else None)]
    if args.logdir:
        try:
            monitors.append(TensorBoardMonitor(args.logdir))
        except ValueError as exc:
            raise ValueError(f"--logdir {args.logdir}: {str(exc).split(' ', 1)[1]}") from None
    Est = BayesianTreeClassifier if task == "classification" else BayesianTreeRegressor
    model = Est(args.method, random_state=args.seed, device=device, monitor=monitors, n_threads=args.threads,
                categorical_features=categorical, verbose=0 if quiet else 1, **est_kw, **smp_kw)
    n_cls = ""
    labels = {}
    if task == "classification":
        labels = _label_texts(table.y, y)
        if args.test:
            labels = {**_label_texts(test.y, yte), **labels}
        classes = np.unique(ytr)
        shown = ", ".join(labels.get(c, str(c)) for c in classes[:8].tolist()) + (", ..." if len(classes) > 8 else "")
        n_cls = f", {len(classes)} classes: {shown}"
    opts = " ".join(f"{k}={v}" for k, v in {**est_kw, **smp_kw}.items() if k != "backend")
    ranks = "" if backend is None else f", {backend.world_size} ranks ({backend_name})"
    rows: List[Tuple[str, str]] = [
        ("data", f"{args.data}: {table.n_rows} rows, {table.n_features} features, target {table.target_name!r} ({task}{n_cls})"),
        ("split", split),
        ("method", f"{args.method} ({cls.__name__}){' ' + opts if opts else ''}, device {device}{ranks}, seed {args.seed}"),
    ]
    t0 = time.perf_counter()
    try:
        model.fit(Xtr, ytr)
    except ValueError as exc:
        # the estimator sees bare arrays: put the file's column names into "X column j",
        # and the target column's name for "y"
        named = re.sub(r"\bX column (\d+)\b", lambda m: f"{args.data}: column {m[1]} ({table.feature_names[int(m[1])]!r})"
                       if int(m[1]) < len(table.feature_names) else m[0], str(exc))
        named = re.sub(r"^y\b", f"{args.data}: target {table.target_name!r}", named)
        named = re.sub(r"^X has\b", f"{args.data} has", named)
        if named == str(exc):
            raise
        raise ValueError(named) from exc
    secs = time.perf_counter() - t0
    if rank > 0:
        return 0  # every rank holds the job's posterior; rank 0 reports and saves it
    post = model.posterior_
    info = getattr(post, "info", {}) or {}
    rows.append(("time", f"{secs:.2f} s"))
    if info.get("hyper"):  # what the evidence search chose (the options' defaults when it was off)
        rows.append(("hyperparameters", str(info["hyper"])))
    le = getattr(post, "log_evidence", None)
    rows.append(("log evidence", fmt(le) if le is not None else f"n/a ({args.method} does not estimate it)"))
    ess = getattr(post, "ess", None)
    n_part = getattr(post, "n_particles", None)
    sizes = size_summary(post)
    if "n_distinct" in sizes:
        distinct = f" ({sizes['n_distinct']} distinct trees)"
    else:  # BART: every draw is a sum of trees
        distinct = f" of a sum of {post.summary()['n_trees']} trees" if hasattr(post, "variable_importance") else ""
    if "rhat_leaves" in info and n_part:
        rows.append(("samples", f"{n_part} draws{distinct}"))
    elif isinstance(ess, (int, float)) and n_part:
        if "n_distinct" in sizes and hasattr(post, "weights"):  # and how many distinct trees carry the weight
            w = post.weights.double()
            distinct = f" ({sizes['n_distinct']} distinct trees, ESS {float(1.0 / (w * w).sum()):.1f} over them)"
        rows.append(("ESS", f"{ess:.1f} of {n_part} particles{distinct}"))
    rows += chain_rows(info)
    schema = {
        "features": table.feature_names,
        "target": table.target_name,
        "task": task,
        "method": args.method,
        "options": {k: (v if isinstance(v, (int, float, str, bool, type(None))) else str(v))
                    for k, v in {**est_kw, **smp_kw}.items() if k != "backend"},
        "data": os.path.basename(args.data),
    }
    if task == "classification" and getattr(post, "classes_", None) is not None:
        # the labels as the file wrote them (007, 1e3, 1.0), which predict and summary write back
        schema["class_labels"] = [labels.get(c, str(c)) for c in np.asarray(post.classes_).tolist()]
    post.info["cli"] = json.dumps(schema)
    attach_feature_names(post, None, table.feature_names)
    encoder = getattr(post, "encoder", None)  # hard trees and BART (soft trees take no categorical columns)
    if encoder is not None and encoder.frame_names is None:
        encoder.frame_names = list(table.feature_names)  # its messages name the file's columns
    saved_to, status = _save_or_rescue(post, args.out)
    if len(yte):
        rows.extend(_evaluate(post, task, Xte, yte, ytr, debug=getattr(args, "debug", False)))
    if sizes:
        rows.append(("trees", f"leaves mean {sizes['leaves_mean']:.2f} (max {sizes['leaves_max']}), depth mean {sizes['depth_mean']:.2f} (max {sizes['depth_max']})"))
    rows.append(("saved", saved_to + (f"; TensorBoard run in {args.logdir}" if args.logdir else "")))
    width = max(len(k) for k, _ in rows)
    for k, v in rows:
        print(f"{k:<{width}}  {v}")
    return status


def _check_outputs(args) -> None:
    """Refuse, before reading and fitting, output paths that cannot be written or that would overwrite an
    input or one another."""
    outputs = [("--out", args.out)] + ([("--checkpoint", args.checkpoint)] if args.checkpoint else [])
    inputs = [("the training data", args.data)] + ([("the --test file", args.test)] if args.test else [])
    for option, path in outputs:
        for what, source in inputs:
            if same_file(path, source):
                raise ValueError(f"{option} {path} is {what} ({source}): writing it would destroy the data; give "
                                 "another path")
    if args.checkpoint and same_file(args.checkpoint, args.out):
        raise ValueError(f"--checkpoint {args.checkpoint} is the --out file: the posterior would replace the "
                         "checkpoint, so the same command could not resume or rerun; give them two paths")
    check_writable(args.out, "--out")
    if args.checkpoint and args.checkpoint.endswith(("/", os.sep)):
        raise ValueError(f"--checkpoint {args.checkpoint}: names a directory; give a file name")


def _label_texts(raw, y: np.ndarray) -> dict:
    """Each class of ``y`` (the parsed target) -> its text in the file (``raw``, the cells as read): the first
    spelling of a class written two ways (``1`` and ``1.0``, one class)."""
    if raw is None or len(y) == 0:
        return {}
    classes, first = np.unique(y, return_index=True)
    return {c: str(raw[i]).strip() for c, i in zip(classes.tolist(), first.tolist())}


def _save_or_rescue(post, path: str) -> Tuple[str, int]:
    """Save ``post`` to ``path``; if that fails after the fit, save it to a new file in the
    working directory (else the system's temporary directory) so that the result is
    not lost, and say where. Returns (where it was saved, exit status)."""
    import tempfile

    try:
        post.save(path)
        return path, 0
    except (OSError, RuntimeError) as exc:  # torch's zip writer raises RuntimeError
        error = f"{type(exc).__name__}: {str(exc).splitlines()[0] if str(exc) else ''}"
    for directory in (os.getcwd(), tempfile.gettempdir()):
        rescue = None
        try:
            fd, rescue = tempfile.mkstemp(prefix="torchtree-posterior-", suffix=".pt", dir=directory)
            os.close(fd)
            post.save(rescue)
        except (OSError, RuntimeError):
            if rescue is not None and os.path.exists(rescue):
                os.unlink(rescue)
            continue
        print(f"torchtree: error: could not save the posterior to {path} ({error}); "
              f"saved it to {rescue} instead", file=sys.stderr)
        return rescue, 1
    print(f"torchtree: error: could not save the posterior to {path} ({error}), nor to a temporary file; "
          "the result is lost", file=sys.stderr)
    return "nowhere", 1


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


def _intervals(post, X: np.ndarray, level: float, kind: str = "predictive") -> np.ndarray:
    """Intervals of ``kind`` (the posterior works in blocks of rows within its memory budget)."""
    if len(X) == 0:
        return np.zeros((0, 2))
    return post.predict_interval(X, level=level, kind=kind)


def _check_cells(table, encoder) -> None:
    """ValueError naming the first cell of ``table`` the model cannot take: text in a column that was
    numeric in training, or an empty cell for a model without a coding (soft trees, older files)."""
    numeric = [encoder is None or c.source == "numeric" for c in (encoder.columns if encoder is not None
                                                                   else table.feature_names)]
    for i, row in enumerate(table.X.tolist()):
        for j, v in enumerate(row):
            text = isinstance(v, str)
            # a cell spelling a missing value (n/a) is one among numbers: the column's real culprit is its text
            if (text and numeric[j] and not is_missing_token(v)) or (encoder is None and not text and v != v):
                what = f"{v!r} is not a number" if text else "is empty (missing value)"
                why = ("the column held numbers in training" if encoder is not None else
                       "the model was fitted on a table of numbers only")
                raise ValueError(f"{table.path}: line {int(table.lines[i])}: column {table.feature_names[j]!r}: "
                                 f"{what}; {why}")


def cmd_predict(args) -> int:
    from torchtree.io.csv import InputBytes, parse_target, write_csv
    from torchtree.io.features import read_features

    out = None if args.out in (None, "-") else args.out
    if out is not None:
        check_writable(out, "--out")
        for source in (args.data, args.posterior):
            if args.data != "-" and same_file(out, source):
                raise ValueError(f"--out {out} is the input {source}: writing it would destroy it; give another path")
    post = load_posterior(args.posterior)
    schema = cli_schema(post)
    D = n_features_of(post)
    data = InputBytes("<stdin>", sys.stdin.buffer.read()) if args.data == "-" else args.data
    table = read_features(data, D, feature_names_of(post, schema), schema.get("target"))
    X = table.X
    warn_by_position(table, "predict")
    if X.dtype == object:  # empty or text cells
        _check_cells(table, getattr(post, "encoder", None))
    task = post.task
    if task == "classification":
        if args.level is not None:
            say(args, "torchtree predict: --level applies to regression; writing the labels and probabilities")
        proba = post.predict_proba(X)
        classes = post.classes_ if getattr(post, "classes_", None) is not None else np.arange(proba.shape[1])
        classes = np.asarray(classes)
        texts = np.asarray(class_labels(post, schema) or [str(c) for c in classes.tolist()], dtype=object)
        codes = proba.argmax(1)
        pred = classes[codes]
        if args.proba:
            header = ["prediction"] + [f"p_{c}" for c in texts.tolist()]
            cols = [texts[codes].tolist()] + [proba[:, k] for k in range(proba.shape[1])]
        else:
            header = ["prediction", "probability"]
            cols = [texts[codes].tolist(), proba[np.arange(len(codes)), codes]]
    else:
        if args.proba:
            say(args, "torchtree predict: --proba applies to classification; writing the mean and interval")
        if args.level is None:
            args.level = 0.9
        if not 0 < args.level < 1:
            raise ValueError(f"--level must lie in (0, 1), got {args.level}")
        mean = post.predict(X)
        if getattr(args, "no_interval", False):
            header, cols = ["mean"], [mean]
        else:
            kind = getattr(args, "kind", "predictive")
            iv = _intervals(post, X, args.level, kind)
            pct, pre = f"{100 * args.level:g}", "mean_" if kind == "mean" else ""
            header = ["mean", f"{pre}lower_{pct}", f"{pre}upper_{pct}"]
            cols = [mean, iv[:, 0], iv[:, 1]]
    write_csv(out, header, cols, out=sys.stdout)
    if table.y is not None and not getattr(args, "quiet", False):
        try:
            y = parse_target(table.y, task, table.lines, table.path)
            if task == "classification":
                unseen = ~np.isin(y.astype(str), classes.astype(str))
                if unseen.any():
                    labels = ", ".join(map(repr, sorted({str(v).strip() for v in table.y[unseen].tolist()})[:5]))
                    say(args, f"torchtree predict: {int(unseen.sum())} rows have labels not seen in training "
                              f"({labels}); the accuracy counts them as errors")
                msg = f"accuracy {float(np.mean(pred.astype(str) == y.astype(str))):.4f}"
            else:
                msg = f"RMSE {float(np.sqrt(np.mean((mean - y) ** 2))):.4f}"
            print(f"torchtree predict: {len(X)} rows; target column {table.target_name!r} ignored for prediction; {msg}", file=sys.stderr)
        except ValueError:
            pass
    if out:
        say(args, f"torchtree predict: wrote {len(X)} rows to {out}")
    return 0
