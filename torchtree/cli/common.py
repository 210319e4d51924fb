"""Shared pieces of the command line: error classes, reserved names, small formatters."""
from __future__ import annotations

import math
import os
import sys
from typing import Any


#: Exceptions that mean "the user can fix this": message only, exit status 2.
USER_ERRORS = (ValueError, FileNotFoundError, IsADirectoryError, NotADirectoryError, PermissionError, MemoryError, NotImplementedError)


#: Constructor parameters that are not command-line options (objects, or set by the CLI itself).
RESERVED = {"self", "prior", "likelihood", "backend", "monitor", "device", "seed", "random_state", "hyper", "data", "method", "checkpoint", "checkpoint_every", "n_threads"}


#: Estimator parameters that the CLI sets itself.
ESTIMATOR_RESERVED = {"self", "method", "random_state", "device", "monitor", "n_threads"}


def say(args, *msg) -> None:
    if not getattr(args, "quiet", False):
        print(*msg, file=sys.stderr)


def resolve_device_option(device: str) -> str:
    from torchtree.model.data import resolve_device

    if device is None:
        device = "auto"  # the option's default
    try:
        dev = resolve_device(device)
    except ValueError as exc:
        if "CUDA" in str(exc):
            raise ValueError(f"--device {device}: CUDA is not available on this machine (use --device cpu)") from None
        raise ValueError(f"--device {device!r}: {exc}") from None
    return str(dev)


def printable(text: Any) -> str:
    """``str(text)`` with every control or format character (newlines, terminal escape sequences, bidirectional
    overrides) written as its Python escape: names and labels read from a file cannot move the cursor, recolour
    the terminal or fake lines of the output."""
    text = str(text)
    if text.isprintable():
        return text
    return "".join(ch if ch.isprintable() else ch.encode("unicode_escape").decode("ascii") for ch in text)


def fmt(v: Any, spec: str = ".4f") -> str:
    if v is None:
        return "n/a"
    if isinstance(v, float) and not math.isfinite(v):
        return str(v)
    return format(v, spec)


def chain_rows(info: dict) -> list:
    """The summary rows of a chain sampler's diagnostics (MCMC, BART): R-hat and ESS of the leaf count, of
    sigma where it has one (BART regression), and whether a run until converged (``min_ess``) converged."""
    rows = []
    if "rhat_leaves" in info or "ess_leaves" in info:
        rows.append(("chains", f"R-hat(leaves) {fmt(info.get('rhat_leaves'), '.3f')}, ESS(leaves) {fmt(info.get('ess_leaves'), '.1f')}"
                               + (f", accept {fmt(info.get('accept/all'), '.3f')}" if "accept/all" in info else "")))
    sig = info.get("rhat_sigma")
    if isinstance(sig, float) and math.isfinite(sig):
        rows.append(("sigma", f"R-hat {fmt(sig, '.3f')}, ESS {fmt(info.get('ess_sigma'), '.1f')}"))
    if "converged" in info:
        rows.append(("converged", f"{'yes' if info['converged'] else 'no'} (min_ess): {info.get('n_samples')} kept "
                                  f"sweeps per chain after {info.get('n_warmup')} warm-up, {info.get('sweeps')} run"))
    return rows


def option_flag(name: str) -> str:
    return "--" + name.replace("_", "-")


def _probe(directory: str, option: str, path: str) -> None:
    """Create (and remove) a file in ``directory``: the only test of writability that holds everywhere
    (permission bits say nothing of read-only mounts, ACLs, or root)."""
    import tempfile

    try:
        fd, probe = tempfile.mkstemp(prefix=".torchtree-write-test-", dir=directory)
        os.close(fd)
        os.unlink(probe)
    except OSError as exc:
        raise ValueError(f"{option} {path}: cannot write in directory {directory} ({exc.strerror or exc}); "
                         "choose another path") from None


def check_writable(path: str, option: str) -> None:
    """Refuse, before any work, an output file that cannot be written: a path naming a directory
    (``out/``, or an existing directory), a missing directory, a directory that cannot be written in, or
    an existing file that cannot be overwritten.

    Raises
    ------
    ValueError, FileNotFoundError
        Naming ``option`` and ``path``.
    """
    path = os.fspath(path)
    if os.path.isdir(path):
        raise ValueError(f"{option} {path}: is a directory; give a file name")
    if path.endswith(("/", os.sep)):
        folder = path.rstrip("/" + os.sep) or path
        raise FileNotFoundError(f"{option} {path}: directory {folder} does not exist (and a path ending in "
                                f"{path[-1]} names a directory; give a file name)")
    directory = os.path.dirname(os.path.abspath(path))
    if not os.path.isdir(directory):
        raise FileNotFoundError(f"{option} {path}: directory {directory} does not exist")
    _probe(directory, option, path)
    if os.path.exists(path) and not os.access(path, os.W_OK):
        raise ValueError(f"{option} {path}: the file exists and cannot be overwritten; choose another path")


def check_writable_dir(path: str, option: str) -> None:
    """Refuse, before any work, an output directory (created when missing, with its parents) that cannot be
    made or written in: a file in its place, or a nearest existing ancestor that cannot be written in."""
    path = os.fspath(path)
    if os.path.exists(path) and not os.path.isdir(path):
        raise ValueError(f"{option} {path}: is a file; give a directory")
    existing = os.path.abspath(path)
    while not os.path.exists(existing):
        existing = os.path.dirname(existing)
    if not os.path.isdir(existing):
        raise ValueError(f"{option} {path}: {existing} is a file, so the directory cannot be made")
    _probe(existing, option, path)


def same_file(a: str, b: str) -> bool:
    """``a`` and ``b`` name one file (by real path: links and ``./`` resolved; an existing pair by inode)."""
    try:
        if os.path.exists(a) and os.path.exists(b):
            return os.path.samefile(a, b)
    except OSError:
        pass
    return os.path.realpath(a) == os.path.realpath(b)


def listed(names, k: int = 6) -> str:
    """The first ``k`` of ``names``, comma separated, and how many more."""
    names = list(names)
    return ", ".join(names[:k]) + (f", ... ({len(names) - k} more)" if len(names) > k else "")


def warn_by_position(table, command: str) -> None:
    """The warning (on stderr, ``-q`` or not: results from misplaced columns look like any others) for a
    file read by :func:`torchtree.io.features.read_features` whose columns were taken by position."""
    if not table.by_position:
        return
    cols = [h for h in table.header if h != table.target_name] or table.header
    print(f"torchtree {command}: warning: none of {table.path}'s columns ({listed(cols)}) is named as a training "
          f"feature ({listed(table.by_position)}): its columns are taken in their order as those features",
          file=sys.stderr)


def class_labels(post, schema: dict) -> list:
    """The class labels of a classification posterior as text: as the training file wrote them (``007``
    stays ``007``, not 7) where the command line recorded them, else the model's classes."""
    classes = getattr(post, "classes_", None)
    if classes is None:
        return []
    values = [str(c) for c in (classes.tolist() if hasattr(classes, "tolist") else list(classes))]
    texts = schema.get("class_labels")
    if isinstance(texts, list) and len(texts) == len(values) and all(isinstance(t, str) for t in texts):
        return list(texts)
    return values
