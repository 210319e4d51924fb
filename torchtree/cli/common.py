"""Shared pieces of the command line: error classes, reserved names, small formatters."""
from __future__ import annotations

import math
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
