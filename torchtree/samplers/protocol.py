"""The sampler contract: a typed settings object and three pure-ish functions.

A sampler is a :class:`~torchtree.samplers.base.SamplerBase` subclass (every hook declared, with its default) with

* a :class:`SamplerConfig` (frozen dataclass of its settings, validated in one place;
  :func:`option` attaches the help text, the choices and whether a setting decides the
  result, so the estimators, the CLI and the checkpoint fingerprint all read the same table);
* ``init(ctx) -> state``: the starting state on ``ctx.data`` (a :class:`SamplerState`);
* ``step(state, ctx) -> (state, info)``: one transition; ``info`` is a dict of scalars for
  the monitors (``ctx.watch`` says whether anyone listens); ``state.done`` ends the run;
* ``finalize(state, ctx) -> posterior``.

Everything else about a run (device, seed, backend, checkpoints, monitors, time budget,
threads) belongs to :func:`torchtree.samplers.driver.run`. docs/writing_a_sampler.md walks
through a toy method.
"""
from __future__ import annotations

import dataclasses
import difflib
import typing
from dataclasses import MISSING, dataclass, field, fields
from typing import Any, Callable, Dict, List, Optional, Self, Sequence, Tuple, Union

import torch

from torchtree.core.threads import check_threads
from torchtree.core.validate import check_bool, check_choice, check_int, check_real
from torchtree.samplers.presets import AUTO, Preset, Resolved, RunShape, SettingsView

__all__ = ["SamplerConfig", "SamplerState", "TRANSIENT", "Option", "option", "Sampler", "HOOKS", "config_class_of",
           "base_type", "SettingsAsAttributes"]

_MISSING = dataclasses.MISSING


def option(default: Any = _MISSING, *, help: str, choices: Optional[Sequence] = None, low: Optional[float] = None,
           high: Optional[float] = None, low_open: bool = False, high_open: bool = False, result: bool = True,
           cli: bool = True, check: Optional[Callable[[str, Any], Any]] = None, kw_only: bool = False,
           presets: Sequence[Preset] = ()) -> Any:
    """A field of a :class:`SamplerConfig` with its documentation.

    Parameters
    ----------
    default : the default value (a value, or None)
    help : str, one line for ``--help`` and the docs
    choices : sequence, optional; the allowed values
    low, high : float, optional; bounds of a number (inclusive unless ``low_open`` / ``high_open``)
    result : bool
        Whether the setting decides the result (it enters the checkpoint fingerprint);
        False for the device, the checkpoint path, bounds on memory and the like.
    cli : bool
        Whether ``torchtree fit`` offers it as an option (generated from the table).
    check : callable ``(name, value) -> value``, optional
        Validation for a value the table cannot describe; raises ``ValueError`` naming ``name``.
    kw_only : bool
        Keyword-only in the constructor (a base class's field then leaves the positional
        order of its subclasses' fields alone).
    presets : sequence of :class:`~torchtree.samplers.presets.Preset`
        Data-dependent defaults, tried in order when the setting is ``"auto"`` (see
        :meth:`SamplerConfig.resolve`); the literal ``default`` applies when none holds.
    """
    meta = {"help": help, "choices": None if choices is None else tuple(choices), "low": low, "high": high,
            "low_open": low_open, "high_open": high_open, "result": result, "cli": cli, "check": check,
            "presets": tuple(presets)}
    return field(default=default, metadata=meta, kw_only=kw_only)


@dataclass(frozen=True)
class Option:
    """One setting of a sampler, as the faces see it."""

    name: str
    default: Any
    type: Any
    help: str
    choices: Optional[Tuple]
    low: Optional[float]
    high: Optional[float]
    result: bool
    cli: bool
    presets: Tuple[Preset, ...] = ()


@dataclass(frozen=True)
class SamplerConfig:
    """Base of every sampler's settings (subclass it as a frozen dataclass).

    Subclasses declare their fields with :func:`option`; construction checks choices and bounds,
    then calls :meth:`check` for what a table cannot say (one setting against another).

    Every config has the run-level ``n_threads`` (keyword-only): torch intra-op threads during
    the run, ``"auto"`` (:func:`torchtree.core.threads.choose_threads`) or an int >= 1. It does
    not decide the result, so it is outside the checkpoint fingerprint: a run may resume with
    another thread count.

    A setting declared with ``presets`` may be ``"auto"``: such a config is checked field by field
    and :meth:`resolve` turns it into a complete one (its cross-setting :meth:`check` runs then).
    """

    n_threads: Union[str, int] = option("auto", help="torch intra-op threads: 'auto' (1 for small work; cores / "
                                        "local ranks for large) or an integer >= 1", result=False, cli=False,
                                        check=lambda name, v: check_threads(v, name), kw_only=True)

    @classmethod
    def of(cls, owner: str, **settings: Any) -> Self:
        """``cls(**settings)``, a setting it does not have refused with a ``TypeError`` that names
        ``owner`` (the sampler), the closest setting it has and all of them."""
        names = sorted(f.name for f in fields(cls))
        unknown = [k for k in settings if k not in names]
        if unknown:
            close = difflib.get_close_matches(unknown[0], names, 1)
            raise TypeError(f"{owner} has no setting {unknown[0]!r}" + (f"; did you mean {close[0]!r}?" if close else "")
                            + f" (its settings: {', '.join(names)})")
        return cls(**settings)

    def __post_init__(self) -> None:
        hints = typing.get_type_hints(type(self))
        for f in fields(self):
            meta = f.metadata
            value = getattr(self, f.name)
            if value is None and meta and not _allows_none(hints.get(f.name)):
                raise TypeError(f"{f.name}=None is not one of its values; leave it out for its default")
            if not meta or value is None or (meta.get("presets") and isinstance(value, str) and value == AUTO):
                continue
            kind = base_type(hints.get(f.name))
            if meta.get("check") is not None:
                value = meta["check"](f.name, value)
            elif meta.get("choices") is not None:
                value = check_choice(f.name, value, meta["choices"])
            elif kind is bool:
                value = check_bool(f.name, value)
            elif kind is int:
                value = check_int(f.name, value, int(meta["low"]) if meta.get("low") is not None else -(1 << 62),
                                  None if meta.get("high") is None else int(meta["high"]))
            elif kind is float:
                value = check_real(f.name, value, meta.get("low"), meta.get("high"), low_open=meta["low_open"],
                                   high_open=meta["high_open"])
            object.__setattr__(self, f.name, value)
        if not self.unresolved():
            self.check()

    def unresolved(self) -> List[str]:
        """The settings still ``"auto"`` that have presets (empty once :meth:`resolve` ran)."""
        return [f.name for f in fields(self) if (f.metadata or {}).get("presets")
                and isinstance(getattr(self, f.name), str) and getattr(self, f.name) == AUTO]

    def resolve(self, shape: RunShape) -> Self:
        """This config with every ``"auto"`` setting given its preset's value on ``shape``.

        Parameters
        ----------
        shape : RunShape (rows, features, task, classes, device, structure prior)

        Returns
        -------
        A complete config of the same class (checked again); its :attr:`resolution` says, per
        resolved setting, the value, the preset that chose it and why. ``self`` when nothing is ``"auto"``.
        """
        todo = self.unresolved()
        if not todo:
            return self
        presets = {f.name: f.metadata["presets"] for f in fields(self) if (f.metadata or {}).get("presets")}
        defaults = {f.name: f.default for f in fields(self) if f.name in presets}
        view = SettingsView({f.name: getattr(self, f.name) for f in fields(self)}, presets, defaults, shape)
        for name in todo:
            view[name]
        out = dataclasses.replace(self, **{k: r.value for k, r in view.resolved.items()})
        object.__setattr__(out, "_resolution", {k: view.resolved[k] for k in todo})
        return out

    @property
    def resolution(self) -> Dict[str, Resolved]:
        """``{setting: Resolved}`` for the settings :meth:`resolve` chose (empty otherwise)."""
        return dict(getattr(self, "_resolution", {}))

    def with_resolution_of(self, resolved: "SamplerConfig") -> Self:
        """This config, carrying the :attr:`resolution` record of ``resolved`` (a config with the same
        values, e.g. the one a sampler's constructor rebuilt from them)."""
        if any(getattr(self, k) != r.value for k, r in resolved.resolution.items()):
            raise ValueError("with_resolution_of: the configs' resolved values differ")
        object.__setattr__(self, "_resolution", resolved.resolution)
        return self

    def check(self) -> None:
        """Checks between settings (override); raise ``ValueError`` naming the settings."""

    @classmethod
    def options(cls) -> List[Option]:
        """The settings, in declaration order, with their help, choices and bounds."""
        hints = typing.get_type_hints(cls)
        out = []
        for f in fields(cls):
            meta = f.metadata or {}
            default = f.default if f.default is not _MISSING else None
            out.append(Option(f.name, default, hints.get(f.name), meta.get("help", ""), meta.get("choices"),
                              meta.get("low"), meta.get("high"), meta.get("result", True), meta.get("cli", True),
                              tuple(meta.get("presets", ()))))
        return out

    def result_settings(self) -> Dict[str, Any]:
        """The settings that decide the result (what the checkpoint fingerprint hashes)."""
        return {o.name: getattr(self, o.name) for o in self.options() if o.result}

    def replace(self, **changes: Any) -> Self:
        """A copy with some settings changed (validated again)."""
        return dataclasses.replace(self, **changes)


def config_class_of(cls) -> Optional[type]:
    """The :class:`SamplerConfig` subclass that ``cls``'s constructor takes, or None.

    A subclass that overrides ``__init__`` with its own parameters (and declares no config of
    its own) takes what its signature says, not its parent's config.
    """
    for base in cls.__mro__:
        if "config_class" in vars(base):
            return base.config_class if cls.__init__ is base.__init__ else None
    return None


class SettingsAsAttributes:
    """Mixin for a sampler class with a ``config_class``: its settings read as attributes
    (``sampler.n_chains``), and assigning one (``sampler.n_chains = 8``) replaces
    ``sampler.config`` by a validated copy, so the config stays the one description of the
    run (the checkpoint fingerprint, the CLI and the estimators read it)."""

    config_class: type

    def __getattr__(self, name: str):
        config = self.__dict__.get("config")
        if config is not None and name in type(config).__dataclass_fields__:
            return getattr(config, name)
        raise AttributeError(f"{type(self).__name__!r} object has no attribute {name!r}")

    def __setattr__(self, name: str, value: Any) -> None:
        config = self.__dict__.get("config")
        if config is not None and name in type(config).__dataclass_fields__:
            self.__dict__["config"] = config.replace(**{name: value})
        else:
            object.__setattr__(self, name, value)


def _allows_none(hint) -> bool:
    """Whether a setting's annotation admits None (``Optional[...]``, ``Any``, none given)."""
    return hint is None or hint is typing.Any or type(None) in typing.get_args(hint)


def base_type(hint):
    """``int`` for ``int`` and ``Optional[int]`` (likewise float, bool); None otherwise."""
    if hint in (int, float, bool):
        return hint
    args = [a for a in typing.get_args(hint) if a is not type(None)]
    return args[0] if len(args) == 1 and args[0] in (int, float, bool) else None


#: ``dataclasses.field(default=None, metadata=TRANSIENT)``: a state field that checkpoints do not save
TRANSIENT = {"transient": True}


class SamplerState:
    """Base of a sampler's state: a dataclass of tensors, numbers and nested states.

    ``state_dict()`` gives plain containers that ``torch.load(weights_only=True)`` reads back;
    ``load_state_dict()`` rebuilds the state. ``step`` counts the transitions done and ``done``
    ends the run. A field declared with :data:`TRANSIENT` metadata (and a default) is a cache
    derivable from the others: it is not saved, and a rebuilt state starts with its default.
    """

    step: int
    done: bool

    def state_dict(self) -> Dict[str, Any]:
        """The state as tensors, numbers, strings, lists and dicts (a checkpoint saves this)."""
        out = {}
        for f in fields(self):
            if f.metadata.get("transient"):
                continue
            v = getattr(self, f.name)
            if isinstance(v, SamplerState):
                v = v.state_dict()
            elif isinstance(v, torch.Tensor):
                v = v.clone()
            out[f.name] = v
        return out

    @classmethod
    def from_state_dict(cls, saved: Dict[str, Any], device: Optional[torch.device] = None) -> Self:
        """Rebuild a state from :meth:`state_dict` (tensors moved to ``device``)."""
        hints = typing.get_type_hints(cls)
        kw = {}
        for f in fields(cls):
            if f.metadata.get("transient"):
                continue
            if f.name not in saved and f.default_factory is not MISSING:  # a field added since the save
                continue
            v = saved[f.name]
            t = hints.get(f.name)
            if isinstance(t, type) and issubclass(t, SamplerState):
                v = t.from_state_dict(v, device)
            elif isinstance(v, torch.Tensor) and device is not None:
                v = v.to(device)
            kw[f.name] = v
        return cls(**kw)


#: every hook :func:`torchtree.samplers.driver.run` calls, in the order of a run
HOOKS = ("prepare", "setup", "settings", "init", "restore", "start_info", "step", "finalize", "end_info")


@typing.runtime_checkable
class Sampler(typing.Protocol):
    """What :func:`torchtree.samplers.driver.run` calls of a sampler
    (:class:`torchtree.samplers.base.SamplerBase` declares each hook with its default; subclass it)."""

    name: str
    config: SamplerConfig

    def prepare(self, data: Any, device: Any) -> Any: ...

    def setup(self, ctx: Any) -> Any: ...

    def settings(self, ctx: Any) -> Dict[str, Any]: ...

    def init(self, ctx: Any) -> SamplerState: ...

    def restore(self, saved: Dict[str, Any], ctx: Any) -> SamplerState: ...

    def start_info(self, ctx: Any) -> Dict[str, Any]: ...

    # ``state``: the method's own SamplerState subclass (what its init returns)
    def step(self, state: Any, ctx: Any) -> Tuple[SamplerState, Optional[Dict[str, Any]]]: ...

    def finalize(self, state: Any, ctx: Any) -> Any: ...

    def end_info(self, posterior: Any) -> Dict[str, Any]: ...
