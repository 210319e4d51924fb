"""Classes by the name their objects' ``config()`` carries: how a saved description is rebuilt.

A prior or leaf likelihood describes itself as a plain dict, ``config() == {"name": NAME, **keywords}``;
a posterior file stores that dict, and loading it calls ``cls(**keywords)`` on the class registered
as ``NAME``. :class:`ConfigRegistry` is that table, one per kind of object
(:data:`torchtree.model.likelihood_protocol.LIKELIHOODS`, :data:`torchtree.model.priors.PRIORS`).
"""
from __future__ import annotations

from typing import Any, Callable, Dict, List, Optional

__all__ = ["ConfigRegistry"]


class ConfigRegistry:
    """``NAME -> class`` for the objects of one kind whose ``config()`` is ``{"name": NAME, **keywords}``.

    Parameters
    ----------
    kind : str
        What the objects are, for messages ("likelihood", "prior").
    register_with : str
        The public function that registers a class of this kind, named in messages.
    """

    def __init__(self, kind: str, register_with: str) -> None:
        self.kind, self.register_with = kind, register_with
        self._classes: Dict[str, type] = {}

    def register(self, cls: Optional[type] = None, *, name: Optional[str] = None) -> Any:
        """Register ``cls`` under ``name`` (default: ``cls.__name__``); returns ``cls``, so it is usable as
        ``@register`` and ``@register(name=...)``.

        Registering a name again with a class of the same module and qualified name (a class defined
        again, as a notebook cell re-run does) replaces it; another class under a taken name is refused
        (``ValueError``).
        """
        def add(c: type) -> type:
            if not isinstance(c, type):
                raise TypeError(f"{self.register_with} takes a class, got {c!r}")
            key = c.__name__ if name is None else str(name)
            old = self._classes.get(key)
            if old is not None and old is not c and (old.__module__, old.__qualname__) != (c.__module__, c.__qualname__):
                raise ValueError(f"the {self.kind} name {key!r} is taken by {old.__module__}.{old.__qualname__}; "
                                 f"register {c.__qualname__} under another name (its config()['name'])")
            self._classes[key] = c
            return c

        return add if cls is None else add(cls)

    def names(self) -> List[str]:
        """The registered names, sorted."""
        return sorted(self._classes)

    def get(self, name: str) -> Optional[type]:
        """The class registered as ``name``, or None."""
        return self._classes.get(name)

    def unknown(self, name: Any) -> ValueError:
        """The error for a name nobody registered: lists the known names and says how to register one."""
        return ValueError(f"unknown {self.kind} {name!r}; registered: {', '.join(self.names())}. A {self.kind} class "
                          f"of your own is found once registered: decorate it with @{self.register_with} (whose "
                          f"config() returns {{'name': <the registered name>, **constructor keywords}}) and "
                          "import its module before loading")

    def build(self, cfg: Dict[str, Any], check: Optional[Callable[[Any], None]] = None) -> Any:
        """The object ``cfg`` describes: ``cls(**keywords)`` of the class registered as ``cfg["name"]``.

        Raises
        ------
        ValueError
            ``cfg`` is no dict with a ``name``, the name is not registered, or the class refuses the keywords.
        """
        if not isinstance(cfg, dict) or "name" not in cfg:
            raise ValueError(f"a {self.kind} description is a dict with a 'name', got {cfg!r}")
        cfg = dict(cfg)
        name = cfg.pop("name")
        cls = self._classes.get(name) if isinstance(name, str) else None
        if cls is None:
            raise self.unknown(name)
        try:
            return cls(**cfg)
        except TypeError as exc:
            raise ValueError(f"{self.kind} {name!r} ({cls.__qualname__}) cannot be rebuilt from {cfg!r}: {exc}; its "
                             "config() must return its constructor's keywords") from None

    def check_saveable(self, obj: Any) -> Dict[str, Any]:
        """``obj.config()``, refused (``ValueError`` saying how to fix it) unless loading can rebuild ``obj``:
        its name must be registered, and for ``type(obj)`` itself (a subclass inheriting its parent's
        ``config()`` would load as the parent)."""
        cfg = obj.config()
        name = cfg.get("name") if isinstance(cfg, dict) else None
        cls = self._classes.get(name) if isinstance(name, str) else None
        if cls is type(obj):
            return cfg
        if cls is None:
            why = f"its config() names {name!r}, which is not a registered {self.kind}"
        else:
            why = (f"its config() names {name!r}, registered for {cls.__qualname__}, so it would load as a "
                   f"{cls.__qualname__}")
        raise ValueError(f"cannot save a posterior with the {self.kind} {obj!r} ({type(obj).__qualname__}): {why}. "
                         f"Give {type(obj).__qualname__} a config() returning {{'name': "
                         f"'{type(obj).__name__}', **its constructor keywords}} and register it with "
                         f"@{self.register_with}")
