"""scikit-learn's conventions for the estimators, without importing scikit-learn: its error and warning
classes when the user has loaded it, seeds from its ``random_state`` objects, shapes of array-likes."""
from __future__ import annotations

from typing import Any, Dict, Optional, Union

import numpy as np

from torchtree._version import __version__
from torchtree.core.warn import warn

__all__ = ["NotFittedError", "DataConversionWarning", "InconsistentVersionWarning", "RandomStateLike"]

#: what ``random_state`` (and ``predict_interval``'s ``seed``) takes: an int in ``[0, 2**63 - 1]``, None for a
#: fresh seed, a numpy ``RandomState`` or ``Generator`` (one draw from it). The numpy names are written as
#: text so that importing torchtree does not import ``numpy.random`` (a fit that is given one imports it)
RandomStateLike = Union[int, "np.integer[Any]", "np.random.RandomState", "np.random.Generator", None]


class NotFittedError(RuntimeError, ValueError, AttributeError):
    """An estimator used before ``fit``. A ValueError and an AttributeError like
    scikit-learn's ``NotFittedError``, and a RuntimeError as torchtree raised before. When
    scikit-learn is loaded, the error raised is also an instance of
    ``sklearn.exceptions.NotFittedError`` (scikit-learn is not imported for it)."""


class DataConversionWarning(UserWarning):
    """A column-vector ``y`` ``[N, 1]`` was flattened to ``[N]``. When scikit-learn is loaded, the
    warning is also an ``sklearn.exceptions.DataConversionWarning``."""


class InconsistentVersionWarning(UserWarning):
    """An estimator unpickled by another torchtree version than the one that pickled it (as scikit-learn
    warns of its own versions). Its fitted attributes may not work in this version: refit it, or keep
    posteriors in :meth:`~torchtree.Posterior.save` files, whose format this version reads or refuses by name."""


class PickledWithVersion:
    """Pickles (and deep copies) that record the torchtree version they were made by, under
    ``_torchtree_version``; unpickling one of another version, or of none recorded, warns with
    :class:`InconsistentVersionWarning` and loads it."""

    def __getstate__(self) -> dict:
        return {**self.__dict__, "_torchtree_version": __version__}

    def __setstate__(self, state: dict) -> None:
        state = dict(state)
        made_by = state.pop("_torchtree_version", None)
        if made_by != __version__:
            made = f"torchtree {made_by}" if made_by else "a torchtree version that did not record itself"
            warn(f"this {type(self).__name__} was pickled by {made} and is loaded by torchtree {__version__}: "
                 f"its fitted attributes may not work here; refit it, or keep posteriors in save() files",
                 InconsistentVersionWarning)
        self.__dict__.update(state)


_WITH_SKLEARN: Dict[type, type] = {}


def sklearn_flavoured(cls: type, sklearn_name: str) -> type:
    """``cls``, or (once scikit-learn has been imported by the user) a subclass of both ``cls`` and
    scikit-learn's class of that name, so that code catching either catches it."""
    import sys

    if "sklearn.exceptions" not in sys.modules:
        return cls
    if cls not in _WITH_SKLEARN:
        other = getattr(sys.modules["sklearn.exceptions"], sklearn_name)
        _WITH_SKLEARN[cls] = type(cls.__name__, (cls, other), {"__module__": cls.__module__, "__doc__": cls.__doc__})
    return _WITH_SKLEARN[cls]


def shape_of(a) -> tuple:
    """The shape of an array-like (a tensor's, a frame's, or that of ``numpy.asarray(a)``; () if none)."""
    shape = getattr(a, "shape", None)
    if shape is None:
        try:
            shape = np.asarray(a, dtype=object).shape
        except Exception:  # ragged or exotic input: the data checks say what is wrong
            return ()
    return tuple(int(v) for v in shape)


def seed_from_random_state(random_state: RandomStateLike, name: str = "random_state") -> Optional[int]:
    """An int seed from ``random_state``: an int, None (a fresh seed per fit, drawn by the sampler),
    or a ``numpy.random.RandomState`` / ``Generator`` (one draw from it, as scikit-learn's
    estimators use such an object)."""
    if random_state is None or isinstance(random_state, (int, np.integer)) and not isinstance(random_state, bool):
        if random_state is not None and not 0 <= int(random_state) < (1 << 63):
            raise ValueError(f"{name} must be None, an int in [0, 2**63 - 1], a numpy RandomState or "
                             f"Generator, got {random_state}: a negative or larger int would run as another seed")
        return None if random_state is None else int(random_state)
    if isinstance(random_state, np.random.RandomState):
        return int(random_state.randint(2**31 - 1))
    if isinstance(random_state, np.random.Generator):
        return int(random_state.integers(2**31 - 1))
    raise ValueError(f"{name} must be None, an int, a numpy RandomState or Generator, got {random_state!r}")


def short_repr(value: Any, limit: int = 120) -> str:
    """``repr(value)`` in at most about ``limit`` characters, as an estimator's ``repr`` shows its parameters:
    long arrays and lists by their ends (as numpy summarises), anything else cut in the middle."""
    if isinstance(value, np.ndarray):
        with np.printoptions(threshold=8, edgeitems=3):
            text = repr(value)
    elif isinstance(value, (list, tuple)) and len(value) > 8:
        ends = ", ".join(map(repr, value[:3])) + ", ..., " + ", ".join(map(repr, value[-3:]))
        text = f"[{ends}]" if isinstance(value, list) else f"({ends})"
    else:
        text = repr(value)
    return text if len(text) <= limit else f"{text[: limit // 2]}...{text[-(limit // 2 - 3):]}"
