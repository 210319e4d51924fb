"""``SamplerBase``: the base class of every sampler, each hook of a run declared with its default
(the contract is :class:`torchtree.samplers.protocol.Sampler`; the runner :func:`torchtree.samplers.driver.run`)."""
from __future__ import annotations

from typing import Any, Dict, Optional, Tuple

import torch

from torchtree.model.data import coerce_data
from torchtree.samplers import driver
from torchtree.samplers.protocol import SamplerConfig, SamplerState, SettingsAsAttributes

__all__ = ["SamplerBase"]


class SamplerBase(SettingsAsAttributes):
    """Base class of a sampler: every hook of a run declared, with its default.

    A method subclasses it, sets ``name`` and ``config_class`` and builds ``self.config`` in its
    constructor, and overrides :meth:`init`, :meth:`step` and :meth:`finalize` (and :meth:`restore`
    when its config has a ``checkpoint`` setting). :func:`torchtree.samplers.driver.run` calls, in
    this order: ``prepare`` (the data on the run's device), ``setup`` (run objects that do not depend
    on the seed), ``settings`` (what besides the config decides the result: the checkpoint
    fingerprint), ``init`` or ``restore`` (the state, once the seed is known), ``start_info``, then
    ``step`` until ``state.done`` or the time budget, ``finalize`` and ``end_info``.
    """

    name: str = "sampler"
    config_class: type = SamplerConfig
    backend: Any = None

    def run(self, data: Any, *, seed: int | torch.Generator | None = None, monitor: Any = None,
            backend: Any = None) -> Any:
        """Run on ``data`` through :func:`torchtree.samplers.driver.run` (``backend``: default the
        one given at construction)."""
        return driver.run(self, data, seed=seed, monitor=monitor, backend=self.backend if backend is None else backend)

    def prepare(self, data, device):
        """The run's data: ``data`` (a ``Data`` or a pair ``(X, y)``) on ``device`` (None: its own)."""
        return driver.on_device(coerce_data(data), device)

    def setup(self, ctx: Any) -> Any:
        """The run objects that do not depend on the seed (the likelihood, the target, ...), as a frozen
        dataclass of the method; the driver keeps it as ``ctx.setup``. Default: None."""
        return None

    def settings(self, ctx) -> Dict[str, Any]:
        """What besides ``config.result_settings()`` decides the result (the prior, the likelihood, ...)."""
        return {}

    def growable_settings(self) -> Tuple[str, ...]:
        """Settings a checkpoint's run may be resumed with larger values of (more draws from a finished run):
        left out of the checkpoint's fingerprint; :meth:`restore` then continues the state to the new end.
        Default: none."""
        return ()

    def init(self, ctx) -> SamplerState:
        """The starting state (``ctx.seed`` is known)."""
        raise NotImplementedError(f"{type(self).__name__} must define init(ctx)")

    def restore(self, saved: Dict[str, Any], ctx) -> SamplerState:
        """The state a checkpoint saved (``state.state_dict()``)."""
        raise NotImplementedError(f"{type(self).__name__} does not resume from checkpoints")

    def start_info(self, ctx) -> Dict[str, Any]:
        """What ``Monitor.on_start`` receives besides the sampler's name and threads."""
        return {}

    def step(self, state: Any, ctx: Any) -> Tuple[SamplerState, Optional[Dict[str, Any]]]:
        """One transition (or several, see the driver): the state after it and the monitors' scalars."""
        raise NotImplementedError(f"{type(self).__name__} must define step(state, ctx)")

    def finalize(self, state: Any, ctx: Any) -> Any:
        """The posterior of the final state."""
        raise NotImplementedError(f"{type(self).__name__} must define finalize(state, ctx)")

    def end_info(self, posterior) -> Dict[str, Any]:
        """What ``Monitor.on_end`` receives besides the seconds and the posterior."""
        return {}
