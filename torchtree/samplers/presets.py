"""Data-dependent defaults: ``"auto"`` settings, the presets that resolve them, and the table sizes they read.

A sampler's config keeps its paper's literal defaults. A setting declared with presets
(``option(..., presets=(Preset(...), ...))``, written next to the field) may also be ``"auto"``:
:meth:`~torchtree.samplers.protocol.SamplerConfig.resolve` then gives it the value of the first
preset whose condition holds on the run's :class:`RunShape` (rows, features, task, classes,
device, structure prior), or the literal default when none does, and records which preset chose
it and why. The estimators and the command line ask for ``"auto"`` on every such setting the user
did not give; a sampler called directly runs its literal defaults unless given ``"auto"``.

A preset's condition and value read the other settings through a :class:`SettingsView`:
``view["proposal"]`` is that setting's final value (resolving it first when it is ``"auto"``),
``view.given("n_islands")`` says whether the user set it. So presets may depend on each other in
any order; a cycle is an error.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Callable, Dict, Mapping, Optional

from torchtree.model.data import resolve_device

__all__ = ["AUTO", "RunShape", "Preset", "Resolved", "SettingsView", "always", "SMALL_TABLE_ROWS",
           "OPTIMAL_MAX_CELLS", "REGRESSION_ISLANDS", "PARTICLES_PER_FEATURE", "WIDE_MAX_PARTICLES", "WIDE_MAX_WORK",
           "WIDE_TABLE_FEATURES", "small_table", "wide_table", "needs_more_particles",
           "optimal_proposal_fits", "wide_table_particles"]

#: the value that asks a preset setting to be resolved from the run's shape
AUTO = "auto"

#: below this many rows a table is "small": every cut of a node can be scored, prior-proposal cuts still land,
#: and chains started at the root reach the posterior's trees within a default run
SMALL_TABLE_ROWS = 5000
#: the one-step optimal proposal of top-down SMC scores every cut: affordable up to this many
#: rows x features x classes / 2 (its cost grows with all three)
OPTIMAL_MAX_CELLS = 10_000
#: independent filters for regression (one filter collapses onto few distinct trees)
REGRESSION_ISLANDS = 5
#: a top-down filter tries one feature per node and particle: at least this many particles per feature ...
PARTICLES_PER_FEATURE = 40
#: ... up to this many, and up to this many rows x particles (memory grows with both)
WIDE_MAX_PARTICLES = 8000
WIDE_MAX_WORK = 400_000_000
#: a table is "wide" for chains started at the root beyond this many features (they rarely find the informative ones)
WIDE_TABLE_FEATURES = 100


@dataclass(frozen=True)
class RunShape:
    """What data-dependent defaults may read about a run.

    Attributes
    ----------
    n_rows, n_features : int, of the training data
    task : ``"classification"`` or ``"regression"``
    n_classes : int, classes of a classification task (0 for regression)
    device : str, the device type the run will use (``"cpu"``, ``"cuda"``)
    prior : str, the structure prior's family (``"chipman"``, ``"poisson"``, or ``"other"``)
    world_size : int, the processes (ranks) the run is split over (1 outside ``torchrun`` / MPI)
    """

    n_rows: int
    n_features: int
    task: str
    n_classes: int = 0
    device: str = "cpu"
    prior: str = "chipman"
    world_size: int = 1

    @property
    def regression(self) -> bool:
        return self.task == "regression"

    @property
    def classification(self) -> bool:
        return self.task == "classification"

    @classmethod
    def of(cls, data, prior=None, device=None, world_size: int = 1) -> "RunShape":
        """The shape of ``data`` (a :class:`~torchtree.model.data.Data`) under ``prior`` (an object,
        a name or None for the Chipman default) on ``device`` (None: the data's), over ``world_size`` ranks."""
        dev = resolve_device(device, data.device)
        name = prior if isinstance(prior, str) else getattr(prior, "name", "chipman" if prior is None else "other")
        return cls(int(data.n), int(data.d), data.task, int(data.n_classes or 0) if data.task == "classification" else 0,
                   dev.type, str(name), max(1, int(world_size)))


def always(view: "SettingsView", shape: RunShape) -> bool:
    """A preset condition that always holds (a face's policy rather than a table's)."""
    return True


@dataclass(frozen=True)
class Preset:
    """One named data-dependent default of a setting.

    Attributes
    ----------
    name : str, short and stable (shown in summaries: ``"small-classification"``)
    why : str, one sentence: what the preset does for such tables
    when : callable ``(view, shape) -> bool``
    value : the value, or a callable ``(view, shape) -> value``
    """

    name: str
    why: str
    when: Callable[["SettingsView", RunShape], bool]
    value: Any

    def evaluate(self, view: "SettingsView", shape: RunShape) -> Any:
        return self.value(view, shape) if callable(self.value) else self.value


@dataclass(frozen=True)
class Resolved:
    """How an ``"auto"`` setting was resolved: its ``value``, the ``preset`` name (``"default"``
    when no preset applied: the literal default) and ``why``."""

    value: Any
    preset: str
    why: str

    def describe(self) -> str:
        return f"{self.value!r} ({self.preset}: {self.why})"


class SettingsView(Mapping):
    """The settings of a config being resolved: ``view[name]`` is the final value (``"auto"`` ones are
    resolved on first use), ``view.given(name)`` whether the user set it."""

    def __init__(self, values: Dict[str, Any], presets: Dict[str, tuple], defaults: Dict[str, Any],
                 shape: RunShape) -> None:
        self._values = dict(values)
        self._presets = presets
        self._defaults = defaults
        self._shape = shape
        self._busy: set = set()
        self.resolved: Dict[str, Resolved] = {}

    def given(self, name: str) -> bool:
        """Whether ``name`` was set (not left ``"auto"``)."""
        return not (name in self._presets and isinstance(self._values[name], str) and self._values[name] == AUTO)

    def __getitem__(self, name: str) -> Any:
        if name in self.resolved:
            return self.resolved[name].value
        value = self._values[name]
        if self.given(name):
            return value
        if name in self._busy:
            raise ValueError(f"the presets of {sorted(self._busy)} depend on each other in a cycle")
        self._busy.add(name)
        try:
            for preset in self._presets[name]:
                if preset.when(self, self._shape):
                    found = Resolved(preset.evaluate(self, self._shape), preset.name, preset.why)
                    break
            else:
                found = Resolved(self._defaults[name], "default", "the sampler's literal default")
        finally:
            self._busy.discard(name)
        self.resolved[name] = found
        return found.value

    def __iter__(self):
        return iter(self._values)

    def __len__(self) -> int:
        return len(self._values)


def small_table(shape: RunShape) -> bool:
    """Fewer than ``SMALL_TABLE_ROWS`` rows."""
    return shape.n_rows < SMALL_TABLE_ROWS


def wide_table(shape: RunShape) -> bool:
    """More than ``WIDE_TABLE_FEATURES`` features."""
    return shape.n_features > WIDE_TABLE_FEATURES


def needs_more_particles(shape: RunShape) -> bool:
    """Whether ``PARTICLES_PER_FEATURE`` particles per feature exceed 1000 (more than 25 features)."""
    return PARTICLES_PER_FEATURE * shape.n_features > 1000


def optimal_proposal_fits(shape: RunShape) -> bool:
    """Whether top-down SMC's one-step optimal proposal is the filter to run: a small
    classification table (fewer than ``SMALL_TABLE_ROWS`` rows, at most ``OPTIMAL_MAX_CELLS``
    rows x features x classes / 2), where scoring every cut leaves a nearly perfectly weighted filter."""
    return (shape.classification and small_table(shape)
            and shape.n_rows * shape.n_features * max(shape.n_classes, 2) / 2 <= OPTIMAL_MAX_CELLS)


def wide_table_particles(n: int, d: int, n_particles: int) -> int:
    """Particles for a classification filter without the optimal proposal on ``n`` rows x ``d``
    features: where ``PARTICLES_PER_FEATURE * d`` exceeds 1000 (more than 25 features),
    ``n_particles`` raised to it rounded up to thousands (what divides 1000, ranks or islands,
    still divides it), at most ``WIDE_MAX_PARTICLES`` and ``WIDE_MAX_WORK / n`` (thousands);
    on narrower tables ``n_particles`` as asked. A top-down filter's cost grows far slower than its
    particles (nodes shared by particles are scored once).

    Parameters
    ----------
    n, d : int, rows and features of the training data
    n_particles : int, particles asked for

    Returns
    -------
    int
    """
    need = PARTICLES_PER_FEATURE * d
    if need <= 1000:  # up to 25 features: as asked
        return n_particles
    return max(n_particles, min(WIDE_MAX_PARTICLES, -(-need // 1000) * 1000, WIDE_MAX_WORK // max(n, 1) // 1000 * 1000))


def describe_resolution(resolution: Optional[Mapping[str, Resolved]]) -> Dict[str, str]:
    """``{setting: "value (preset: why)"}`` for a posterior's ``info["settings"]``."""
    return {k: r.describe() for k, r in (resolution or {}).items()}
