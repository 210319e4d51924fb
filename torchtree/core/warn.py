"""Warnings pointed at the user's line.

A torchtree warning is raised deep in the library (an encoder inside ``predict``, a sampler inside
``fit``), at a depth that varies with the call. :func:`warn` gives ``warnings.warn`` the stack level
of the first frame outside the ``torchtree`` package, so the warning names the user's call, and a
filter on the user's module applies to it.
"""
from __future__ import annotations

import sys
import warnings

__all__ = ["warn", "ConvergenceWarning"]


class ConvergenceWarning(UserWarning):
    """Chains that look unconverged (split-R-hat or effective sample size off their limits,
    :func:`torchtree.model.diagnostics.warn_if_unconverged`). A ``UserWarning``, so unfiltered code sees it
    as before; its own category lets a search over many short fits silence it alone::

        warnings.filterwarnings("ignore", category=torchtree.ConvergenceWarning)

    Each fit whose chains look unconverged warns, a re-run of the same line included (importing torchtree
    appends an ``"always"`` filter for this category; Python's default shows a warning once per text and
    line, so a notebook cell run again with the same seed would stay silent). Filters the user sets, or
    ``-W``, come before it and win.
    """


warnings.filterwarnings("always", category=ConvergenceWarning, append=True)


def _ours(frame) -> bool:
    return str(frame.f_globals.get("__name__", "")).split(".")[0] == "torchtree"


def warn(message: str, category: type = UserWarning) -> None:
    """``warnings.warn(message, category)`` attributed to the nearest caller outside torchtree (the
    outermost torchtree frame when every frame is ours, as under ``python -m torchtree``)."""
    frame, level = sys._getframe(1), 2
    while frame.f_back is not None and _ours(frame):
        frame, level = frame.f_back, level + 1
    warnings.warn(message, category, stacklevel=level if not _ours(frame) else level - 1)
