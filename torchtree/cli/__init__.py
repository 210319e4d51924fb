"""The ``torchtree`` command line (``python -m torchtree``).

Subcommands::

    torchtree fit DATA.csv [--target COL] [--method smc|smc-moves|mcmc|dcc] [sampler options]
                  [--task classification|regression] [--test-size 0.3 | --test TEST.csv]
                  [--device auto] [--threads auto|N] [--logdir DIR] [--out posterior.pt] [--seed N]
                  [--backend auto|local|gloo|nccl|mpi]  (under torchrun / mpiexec: one job over the ranks)
    torchtree predict posterior.pt DATA.csv|- [--proba] [--level 0.9] [--kind mean] [--no-interval] [--out preds.csv|-]
    torchtree summary posterior.pt [--dot [--tree I]]
    torchtree report posterior.pt [--plots DIR [--data DATA.csv [--target COL]]]
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
import os
import signal
import sys
import threading
import warnings
from typing import Dict, List, Optional, Sequence, Tuple

from torchtree.cli.bench import cmd_bench, cmd_demo, demo
from torchtree.distributed.backend import DEFAULT_TIMEOUT, CollectiveError
from torchtree.cli.common import USER_ERRORS, option_flag
from torchtree.cli.fit import cmd_fit, cmd_predict
from torchtree.cli.options import estimator_options, parse_seed, parse_threads, parse_timeout, peek_option, sampler_options
from torchtree.cli.report import cmd_report, cmd_summary, load_posterior

__all__ = ["main", "demo", "build_parser", "sampler_options", "load_posterior"]


class _Formatter(argparse.RawDescriptionHelpFormatter):
    def __init__(self, prog):
        super().__init__(prog, max_help_position=32)


def build_parser(method: str = "smc") -> argparse.ArgumentParser:
    """The ``torchtree`` argument parser, with ``fit``'s sampler options for ``method``."""
    from torchtree._version import __version__
    from torchtree.estimators import METHODS, get_method, model_settings
    from torchtree.methods import HYPER_MODES, MODEL_SETTINGS_HELP

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
              "                     [--categorical COLS] [--device DEVICE] [--threads N] [--logdir DIR] [--out FILE]\n"
              "                     [--seed N] [--checkpoint FILE [--checkpoint-every K]] [--backend NAME]\n"
              "                     [--timeout SECONDS] [model and sampler options]",
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
    p.add_argument("--categorical", metavar="COLS", help="comma-separated feature columns to split by subsets of "
                   "their levels, numbers included (columns holding text are categorical anyway)")
    p.add_argument("--device", default="auto", help="cpu, cuda, cuda:1, or auto = CUDA when present (default: auto)")
    p.add_argument("--threads", default="auto", type=parse_threads, metavar="N",
                   help="torch intra-op threads while sampling: an integer >= 1, or auto = 1 for small work, at most "
                        "the cores / ranks on the node for large work, capped by OMP_NUM_THREADS (default: auto)")
    p.add_argument("--logdir", metavar="DIR", help="write a TensorBoard run to DIR")
    p.add_argument("--backend", default="auto", choices=("auto", "local", "gloo", "nccl", "mpi"),
                   help="the ranks to run across: auto = those of the torchrun or mpiexec that started this process "
                        "(one job over them: rank 0 prints and saves), else one process; local = one process "
                        "whatever the launcher (default: auto)")
    p.add_argument("--timeout", type=parse_timeout, default=DEFAULT_TIMEOUT, metavar="SECONDS",
                   help="across ranks: how long a rank waits for the others, at the start and at every exchange, "
                        f"before the run fails naming what it waited for (default: {DEFAULT_TIMEOUT:g})")
    p.add_argument("--out", default="posterior.pt", metavar="FILE", help="where to save the posterior (default: posterior.pt)")
    p.add_argument("--seed", type=parse_seed, default=0, metavar="N", help="seed of the sampler and of the test split (default: 0)")
    p.add_argument("--checkpoint", metavar="FILE",
                   help="save the sampler's state to FILE as it runs; if FILE exists (same data, options and seed) "
                        "the run resumes from it and ends with the result an uninterrupted run gives")
    p.add_argument("--checkpoint-every", type=int, default=None, metavar="K",
                   help="with --checkpoint: checkpoint every K stages / iterations (default: 1)")
    try:
        cls = get_method(method)
        error = None
    except ValueError as exc:
        cls, error = None, str(exc)
    # only the settings this method uses through the estimator's prior / likelihood
    # objects; settings it takes by name appear among its own options, with its defaults
    used = model_settings(cls) if cls is not None else None
    est = p.add_argument_group("model options (prior and leaf likelihood)")
    taken = {"data", "target", "method", "task", "test_size", "test", "device", "logdir", "out", "seed", "quiet", "debug",
             "checkpoint", "checkpoint_every", "threads", "n_threads", "backend"}
    est_tasks: Dict[str, str] = {}
    searched = used is not None and "object" in used.values()  # the estimator's evidence search applies
    for name, kw, task in estimator_options():
        if name == "hyper" and searched:
            kw = {**kw, "choices": list(HYPER_MODES), "metavar": "{" + ",".join(HYPER_MODES) + "}",
                  "help": MODEL_SETTINGS_HELP["hyper"]}  # its text states the default
        elif used is not None and used.get(name) != "object":
            continue
        est.add_argument(option_flag(name), dest=name, **kw)
        taken.add(name)
        est_tasks[name] = task
    title = f"sampler options (--method {method}: {cls.__name__})" if cls is not None else f"sampler options (--method {method})"
    smp = p.add_argument_group(title, None if error is None else f"unavailable: {error}")
    names = []
    if cls is not None:
        for name, kw in sampler_options(cls):
            if name in taken:
                continue
            smp.add_argument(option_flag(name), dest=name, **kw)
            names.append(name)
    p.set_defaults(func=cmd_fit, _sampler_names=names, _estimator_tasks=est_tasks)

    # -------------------------------------------------------------- predict
    p = sub.add_parser(
        "predict", parents=[common], formatter_class=_Formatter,
        help="predict from a saved posterior, with uncertainty",
        description=(
            "Predict for every row of DATA.csv. Classification: the most probable label and its\n"
            "probability (--proba: every class's probability). Regression: the posterior predictive\n"
            "mean and an equal-tailed interval (--level, default 0.9) of a new y (--kind predictive)\n"
            "or of the regression function, the mean itself (--kind mean).\n"
            "A target column in DATA.csv is ignored (matched by name, or by the number of columns)."
        ),
    )
    p.add_argument("posterior", metavar="POSTERIOR.pt")
    p.add_argument("data", metavar="DATA.csv", help="rows to predict (a pipe such as /dev/stdin works; - reads "
                   "standard input)")
    p.add_argument("--proba", action="store_true", help="classification: one probability column per class")
    p.add_argument("--level", type=float, default=None, help="regression: credible level of the interval (default: 0.9)")
    p.add_argument("--kind", choices=("predictive", "mean"), default="predictive",
                   help="regression: the interval of a new y (predictive) or a credible interval of the mean "
                        "function f(x) (mean; columns mean_lower_L, mean_upper_L)")
    p.add_argument("--no-interval", action="store_true",
                   help="regression: the mean only (an interval costs about 100 times the mean: it draws from the "
                        "predictive of every row)")
    p.add_argument("--out", metavar="FILE", help="write CSV here (default, or -: standard output)")
    p.set_defaults(func=cmd_predict)

    # -------------------------------------------------------------- summary
    p = sub.add_parser(
        "summary", parents=[common], formatter_class=_Formatter,
        help="tree sizes, depth, feature usage and the MAP tree of a saved posterior",
        description=(
            "Summarise a posterior saved by 'torchtree fit': its task, size and evidence, the\n"
            "distribution of tree sizes and depths, how often each feature is split on, and the\n"
            "heaviest (MAP) tree as text, or as Graphviz DOT with --dot."
        ),
    )
    p.add_argument("posterior", metavar="POSTERIOR.pt")
    p.add_argument("--dot", action="store_true", help="print the tree as Graphviz DOT instead (pipe to 'dot -Tpng')")
    p.add_argument("--tree", type=int, metavar="I", help="which tree (default: the heaviest, i.e. the MAP tree)")
    p.set_defaults(func=cmd_summary)

    # --------------------------------------------------------------- report
    p = sub.add_parser(
        "report", parents=[common], formatter_class=_Formatter,
        help="the summary of a saved posterior and, with --plots DIR, its plots as PNG files",
        description=(
            "Print the summary of a posterior saved by 'torchtree fit' and, with --plots DIR, write\n"
            "every plot that applies to it as a PNG file in DIR (one line per file): the MAP tree,\n"
            "feature importance, per-chain traces (mcmc, bart), the hyperparameter search's evidence\n"
            "curves; with --data also partial dependence and ICE curves of the feature the prediction\n"
            "moves most with and, when the file has the target column, a calibration plot. Needs\n"
            "matplotlib (pip install matplotlib)."
        ),
    )
    p.add_argument("posterior", metavar="POSTERIOR.pt")
    p.add_argument("--plots", metavar="DIR", help="write the plots as PNG files into DIR (created when missing)")
    p.add_argument("--data", metavar="DATA.csv",
                   help="rows for the plots that need data: the model's feature columns, and the target for calibration")
    p.add_argument("--target", metavar="COL", help="target column of --data (default: the one named in training)")
    p.set_defaults(func=cmd_report)

    # ----------------------------------------------------------------- demo
    p = sub.add_parser(
        "demo", parents=[common], formatter_class=_Formatter,
        help="fit the embedded demo dataset and print a comparison table",
        description=(
            "Fit the embedded demo data (no files needed) with three top-down SMC configurations\n"
            "(100 and 1000 particles with the prior proposal, 100 with the optimal one) and print\n"
            "accuracy, log predictive density and seconds beside a single CART tree."
        ),
    )
    p.add_argument("--seed", type=parse_seed, default=0, metavar="N", help="seed of the samplers and of the split (default: 0)")
    p.set_defaults(func=cmd_demo)

    # ---------------------------------------------------------------- bench
    p = sub.add_parser(
        "bench", parents=[common], formatter_class=_Formatter,
        help="run a benchmark script (benchmarks/bench_NAME.py)",
        description=(
            "Run benchmarks/bench_NAME.py with the options given after NAME (passed through),\n"
            "writing its JSON results to --out. 'torchtree bench --list' shows the benchmarks;\n"
            "'torchtree bench NAME --help' shows a benchmark's own options.\n"
            "The benchmarks folder is $TORCHTREE_BENCHMARKS, else the repository's benchmarks/."
        ),
    )
    p.add_argument("name", nargs="?", metavar="NAME")
    p.add_argument("--list", action="store_true", help="list the available benchmarks")
    p.add_argument("--out", metavar="FILE.json", help="JSON output (passed to the script as --out)")
    p.set_defaults(func=cmd_bench)
    return parser


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


def _method_class_name(method: str) -> str:
    from torchtree.estimators import get_method

    return get_method(method).__name__


def _close_flags(parser, flags: List[str]) -> str:
    """`` (did you mean --threads?)`` for the first of ``flags`` with a close option of ``fit``, else ``""``."""
    import argparse
    import difflib

    sub = next(a for a in parser._actions if isinstance(a, argparse._SubParsersAction)).choices["fit"]
    known = [o[2:] for a in sub._actions for o in a.option_strings if o.startswith("--")]
    for f in flags:  # compared without the dashes, which made --mu0 look like --out
        close = difflib.get_close_matches(f.lstrip("-"), known, n=1, cutoff=0.6)
        if close:
            return f" (did you mean --{close[0]}?)"
    return ""


def _terminate_as_interrupt(terminated: List[int]):
    """A SIGTERM handler that stops the command as Ctrl-C does: through the SIGINT handler in place (which
    holds the signal back while a checkpoint or posterior is being written), so that the run unwinds,
    releases its checkpoint's lock and exits with a message. Returns the previous handler, or None where
    SIGTERM is not ours to take (another thread, or a handler someone else installed)."""
    if threading.current_thread() is not threading.main_thread():
        return None
    try:
        if signal.getsignal(signal.SIGTERM) is not signal.SIG_DFL:
            return None
    except (ValueError, OSError, AttributeError):
        return None

    def on_term(signum, frame):
        terminated.append(signum)
        handler = signal.getsignal(signal.SIGINT)
        if callable(handler):
            handler(signal.SIGINT, frame)  # Python's raises KeyboardInterrupt; a write in progress holds it
        else:
            raise KeyboardInterrupt

    return signal.signal(signal.SIGTERM, on_term)


def _interrupted(exc: BaseException) -> bool:
    """Whether ``exc`` was raised while a ``KeyboardInterrupt`` unwound (its causes and contexts)."""
    seen = set()
    while exc is not None and id(exc) not in seen:
        if isinstance(exc, KeyboardInterrupt):
            return True
        seen.add(id(exc))
        exc = exc.__cause__ or exc.__context__
    return False


def _stopped(args, terminated: List[int]) -> int:
    """Say that the command was interrupted (or terminated) and where its checkpoint is; the exit status."""
    from torchtree.io.checkpoint import Checkpointer

    what, status = ("terminated", 143) if terminated else ("interrupted", 130)  # 128 + SIGTERM, 128 + SIGINT
    ck = getattr(args, "checkpoint", None)
    if ck and Checkpointer(ck).exists():  # one file, or a multi-rank run's manifest
        print(f"torchtree: {what}; {ck} holds the run so far: the same command resumes it", file=sys.stderr)
    else:
        print(f"torchtree: {what}", file=sys.stderr)
    return status


def main(argv: Optional[List[str]] = None) -> int:
    """Entry point of the ``torchtree`` command; returns the exit status."""
    argv = list(sys.argv[1:] if argv is None else argv)
    debug = "--debug" in argv
    terminated: List[int] = []
    previous_term = _terminate_as_interrupt(terminated)
    shown = warnings.formatwarning
    if not debug:  # "torchtree: warning: ..." rather than Python's file:line: Category: form
        warnings.formatwarning = lambda message, category, *a, **k: f"torchtree: warning: {message}\n"
    try:
        command = _command_of(argv)
        method = peek_option(argv, "--method") if command == "fit" else None
        parser = build_parser(method or "smc")
        if command == "bench":
            head, extra = _split_bench(argv)
            args = parser.parse_args(head)
            args._extra = extra
        else:
            args, unknown = parser.parse_known_args(argv)
            if unknown and command == "fit" and getattr(args, "command", None) == "fit":
                flags = [u for u in unknown if u.startswith("-")] or unknown
                m = method or "smc"
                close = _close_flags(parser, [f.split("=", 1)[0] for f in flags])
                raise ValueError(f"{' '.join(flags)}: not an option of torchtree fit --method {m} "
                                 f"({_method_class_name(m)}){close}; its options: torchtree fit --method {m} --help")
            if unknown:
                args = parser.parse_args(argv)  # argparse's own message and exit status
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
        return _stopped(args if "args" in locals() else None, terminated)
    except CollectiveError as exc:
        # another rank left: interrupted as this one was (the launcher signals every rank), or it failed and
        # prints its own error
        if debug:
            raise
        if terminated or _interrupted(exc):
            return _stopped(args if "args" in locals() else None, terminated)
        print(f"torchtree: error: {exc}", file=sys.stderr)
        return 1
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
    finally:
        warnings.formatwarning = shown
        if previous_term is not None:
            signal.signal(signal.SIGTERM, previous_term)


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
