"""The memory budget of prediction: how many bytes one chunk of rows may take.

Prediction (``predict``, ``predict_proba``, ``predict_interval``, ``log_predictive`` of
hard and soft posteriors) works through the rows in chunks sized so that the large
temporaries of one chunk fit in this budget, so its peak memory does not grow with the
number of rows. Each row is computed independently, so the chunk size changes no result.

Set it with :func:`set_memory_budget` (``torchtree.set_memory_budget("256M")``) or the
environment variable ``TORCHTREE_MEMORY_BUDGET``; the default is 1 GiB. A computation
whose smallest chunk (one row, or one block of rows of ``predict_interval``) needs more
than the budget is refused before it allocates, with a ``ValueError`` naming the setting.
"""
from __future__ import annotations

import os
from typing import Optional, Union

from torchtree.core.memory import available_bytes, format_bytes

__all__ = ["DEFAULT_BUDGET", "parse_bytes", "memory_budget", "set_memory_budget", "rows_per_chunk",
           "release_freed_memory"]

DEFAULT_BUDGET = 1 << 30
_UNITS = {"": 1, "K": 1 << 10, "M": 1 << 20, "G": 1 << 30, "T": 1 << 40}
_budget: Optional[int] = None


def parse_bytes(value: Union[int, float, str], name: str = "memory budget") -> int:
    """Bytes from ``1 << 28``, ``"256M"``, ``"1.5GiB"`` or ``"2G"`` (binary units).

    Raises
    ------
    ValueError
        Not a positive size.
    """
    if isinstance(value, bool):
        raise ValueError(f"{name} must be a positive number of bytes (e.g. '512M'), got {value!r}")
    if isinstance(value, (int, float)):
        n = float(value)
    else:
        raw = str(value).strip().upper().removesuffix("IB").removesuffix("B")
        unit = raw[-1] if raw and raw[-1] in _UNITS else ""
        try:
            n = float(raw[: len(raw) - len(unit)]) * _UNITS[unit]
        except ValueError:
            n = -1.0
    if not (n >= 1 and n < float(1 << 62)):
        raise ValueError(f"{name} must be a positive number of bytes (e.g. '512M'), got {value!r}")
    return int(n)


def memory_budget() -> int:
    """The prediction memory budget in bytes: :func:`set_memory_budget`'s value, else
    ``TORCHTREE_MEMORY_BUDGET``, else :data:`DEFAULT_BUDGET` (1 GiB)."""
    if _budget is not None:
        return _budget
    env = os.environ.get("TORCHTREE_MEMORY_BUDGET", "").strip()
    return parse_bytes(env, "TORCHTREE_MEMORY_BUDGET") if env else DEFAULT_BUDGET


def set_memory_budget(value: Union[int, float, str, None]) -> Optional[int]:
    """Set the bytes one chunk of a prediction may use (``None``: back to the default).

    Parameters
    ----------
    value : int, float, str or None
        Bytes, or a size such as ``"256M"`` / ``"2G"``.

    Returns
    -------
    int or None
        The previous explicit setting (pass it back to restore it).
    """
    global _budget
    previous = _budget
    _budget = None if value is None else parse_bytes(value)
    return previous


def rows_per_chunk(bytes_per_row: float, what: str, fixed: float = 0.0, rows_at_once: int = 1,
                   device=None, also: str = "") -> int:
    """Rows a chunk may hold so that ``fixed + rows * bytes_per_row`` fits the budget.

    Parameters
    ----------
    bytes_per_row : float
        Estimated bytes of the temporaries per row.
    what : str
        What is computed, for the refusal message.
    fixed : float
        Bytes independent of the rows (per-tree tables, ...).
    rows_at_once : int
        Rows that must be held together (a block of ``predict_interval``); the result
        is then this number.
    device : torch.device, optional
        The budget is also capped by the memory available there.
    also : str
        Other settings to name in the message (", or lower n_draws").

    Returns
    -------
    int >= 1

    Raises
    ------
    ValueError
        Even ``rows_at_once`` rows need more than the budget.
    """
    budget = memory_budget()
    avail = available_bytes(device)
    limit = budget if avail is None else min(budget, max(int(avail * 0.8), 1))
    need = fixed + rows_at_once * bytes_per_row
    if need > limit:
        where = "the prediction memory budget" if limit == budget else "the memory available"
        raise ValueError(
            f"{what} needs at least {format_bytes(need)} for {rows_at_once} row(s) at once, more than {where} "
            f"({format_bytes(limit)}); raise the budget with torchtree.set_memory_budget(...) or "
            f"TORCHTREE_MEMORY_BUDGET{also}"
        )
    if rows_at_once > 1:
        return rows_at_once
    return max(1, int((limit - fixed) // max(bytes_per_row, 1.0)))


def _load_trim():
    try:
        import ctypes

        return ctypes.CDLL("libc.so.6").malloc_trim
    except (OSError, AttributeError):
        return None


_trim = _load_trim()


def release_freed_memory() -> None:
    """Hand the C heap's freed pages back to the system (glibc ``malloc_trim``; a no-op
    elsewhere). Between two chunks of a long prediction, freed temporaries that glibc
    keeps would otherwise let the resident size creep up chunk after chunk."""
    if _trim is not None:
        _trim(0)
