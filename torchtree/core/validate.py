"""Checks of user-facing settings, so that bad input fails at construction with a clear message.

A sampler given ``n_chains=0`` or a split probability above one would otherwise fail
deep inside a tensor operation (or, for a prior that can never split, loop forever);
these helpers turn such values into a ``ValueError`` that names the setting.
"""
from __future__ import annotations

import math
import operator
from numbers import Real
from typing import Iterable, Optional, Sequence

import numpy as np

__all__ = ["check_int", "check_real", "check_probabilities", "check_choice", "check_bool", "check_backend",
           "check_float_dtype"]


def check_int(name: str, value, minimum: int = 0, maximum: Optional[int] = None) -> int:
    """``value`` as an ``int``, required to lie in ``[minimum, maximum]``.

    Parameters
    ----------
    name : str, the setting's name (for the message)
    value : int-like (integers, integral floats; bools and other floats are refused)
    minimum, maximum : int, inclusive bounds (``maximum=None``: unbounded)

    Returns
    -------
    int
    """
    if isinstance(value, bool):
        raise ValueError(f"{name} must be an integer, got {value!r}")
    try:
        v = operator.index(value)  # ints, numpy and 0-d torch integers
    except TypeError:
        if not (isinstance(value, Real) and float(value).is_integer()):
            raise ValueError(f"{name} must be an integer, got {value!r}") from None
        v = int(value)
    if v < minimum or (maximum is not None and v > maximum):
        hi = "" if maximum is None else f" and <= {maximum}"
        raise ValueError(f"{name} must be >= {minimum}{hi}, got {value!r}")
    return v


def check_real(name: str, value, low: Optional[float] = None, high: Optional[float] = None,
               low_open: bool = True, high_open: bool = False) -> float:
    """``value`` as a finite ``float`` in the interval given by ``low`` / ``high``.

    Parameters
    ----------
    name : str
    value : real number
    low, high : float, optional, bounds (``None``: unbounded on that side)
    low_open, high_open : bool, whether the bound itself is excluded
        (default ``(low, high]``)

    Returns
    -------
    float
    """
    try:
        if isinstance(value, (str, bytes)):  # float("0.9") would parse it; the integer checks refuse text too
            raise TypeError
        v = float(value)
    except (TypeError, ValueError):
        raise ValueError(f"{name} must be a real number, got {value!r}") from None
    bad = not math.isfinite(v)
    if low is not None:
        bad |= v <= low if low_open else v < low
    if high is not None:
        bad |= v >= high if high_open else v > high
    if bad:
        lb = "(-inf" if low is None else ("(" if low_open else "[") + f"{low:g}"
        hb = "inf)" if high is None else f"{high:g}" + (")" if high_open else "]")
        raise ValueError(f"{name} must be finite and in {lb}, {hb}, got {value!r}")
    return v


def check_probabilities(name: str, values: Sequence[float], length: int) -> tuple:
    """``length`` non-negative finite numbers with a positive sum, normalised to sum to one.

    Returns
    -------
    tuple of float
    """
    try:
        vals = tuple(float(v) for v in values)
    except (TypeError, ValueError):
        raise ValueError(f"{name} must be {length} non-negative numbers, got {values!r}") from None
    if len(vals) != length or any(not math.isfinite(v) or v < 0 for v in vals) or sum(vals) <= 0:
        raise ValueError(f"{name} must be {length} non-negative numbers with a positive sum, got {values!r}")
    s = sum(vals)
    return tuple(v / s for v in vals)


def check_choice(name: str, value, choices: Iterable):
    """``value`` itself, required to be one of ``choices`` (compared with ``==``).

    Parameters
    ----------
    name : str, the setting's name (for the message)
    value : any
    choices : iterable of the allowed values (e.g. a tuple of strings or a dict's keys)

    Returns
    -------
    ``value`` unchanged
    """
    allowed = tuple(choices)
    try:
        ok = value in allowed
    except (TypeError, ValueError, RuntimeError):  # e.g. an array, whose == is elementwise
        ok = False
    if not ok:
        raise ValueError(f"{name} must be one of {allowed}, got {value!r}")
    return value


def check_bool(name: str, value) -> bool:
    """``value`` as a Python ``bool``: ``True`` / ``False`` or a numpy boolean.

    Integers and strings are refused (``1`` or ``"yes"`` for a flag is more often a
    slip than a choice).

    Parameters
    ----------
    name : str, the setting's name (for the message)
    value : any

    Returns
    -------
    bool
    """
    if isinstance(value, (bool, np.bool_)):
        return bool(value)
    raise ValueError(f"{name} must be True or False, got {value!r}")


def check_backend(backend) -> None:
    """``backend`` must be None, a backend name (str) or a ``torchtree.distributed.Backend``.

    Raises
    ------
    TypeError
        An object without the collective operations the samplers call.
    """
    if backend is None or isinstance(backend, str):
        return
    for attr in ("rank", "world_size", "all_reduce", "all_gather"):
        if not hasattr(backend, attr):
            raise TypeError(f"backend must be a torchtree.distributed.Backend (it lacks {attr!r}), got {backend!r}")


def check_float_dtype(name: str, value, as_name: bool = False):
    """A float dtype setting, spelled either way: ``torch.float32`` / ``torch.float64`` or the names
    ``"float32"`` / ``"float64"`` (``"torch.float32"`` too). One reading for every sampler's ``dtype``.

    Returns
    -------
    The ``torch.dtype``, or its name (``"float32"``) when ``as_name``.

    Raises
    ------
    ValueError naming ``name``, for anything else.
    """
    import torch

    names = {"float32": torch.float32, "float64": torch.float64}
    key = value.replace("torch.", "") if isinstance(value, str) else next(
        (k for k, dt in names.items() if value == dt), None)
    if key not in names:
        raise ValueError(f"{name} must be float32 or float64 (a torch dtype or its name), got {value!r}")
    return key if as_name else names[key]
