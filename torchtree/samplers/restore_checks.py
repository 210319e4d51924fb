"""Checks of a checkpoint's sampler state against the run that resumes it, before any of it reaches a kernel.

A checkpoint's checksum (:mod:`torchtree.io.integrity`) finds damage, not edits: anyone can recompute it. The
compiled kernels index the data and their own arrays with the trees' fields unchecked (a split's feature picks
a column, a point's leaf a slot, a child pointer a node), so a restored state is checked here field by field:
shape, dtype and range against the run's data and settings, the trees' structure, finite values where the
samplers need them. A violation is a :class:`~torchtree.io.integrity.CheckpointError` naming the checkpoint and
the field; a state that does not fit together at all (a missing field, a value of the wrong type) is one too.

Every check is a few tensor operations per field (no loop over trees, nodes or rows), run once per resume.
"""
from __future__ import annotations

import contextlib
from typing import Any, Optional, Sequence

import torch

from torchtree.io.integrity import CheckpointError
from torchtree.model.tree_checks import check_pointers, holds
from torchtree.model.trees import INTERNAL, UNUSED, HardTrees

__all__ = ["StateFields", "rebuilding", "check_pointer_trees", "check_hard_trees", "check_tree_state"]


class StateFields:
    """The fields of the sampler state in checkpoint ``path``, checked one by one.

    Each method raises :class:`CheckpointError` ``"<path>: the checkpoint's field '<name>' <why>: it is damaged
    or edited; start afresh without it"`` when the field does not fit the run.
    """

    def __init__(self, path: Any) -> None:
        self.path = path

    def error(self, name: str, why: str) -> CheckpointError:
        return CheckpointError(f"{self.path}: the checkpoint's field {name!r} {why}: it is damaged or edited; "
                               "start afresh without it")

    def require(self, name: str, ok, why: str) -> None:
        """Raise :meth:`error` unless ``ok`` (a bool or a bool tensor, all of whose elements must hold)."""
        if not holds(ok):
            raise self.error(name, why)

    def tensor(self, name: str, value: Any, shape: Optional[Sequence[Optional[int]]] = None,
               dtype: Optional[torch.dtype] = None, kind: Optional[str] = None, low: Optional[float] = None,
               high: Optional[float] = None, finite: bool = False) -> torch.Tensor:
        """``value`` as it must be: a tensor of ``shape`` (None: any size on that axis), of ``dtype`` or of ``kind``
        (``"int"``: an integer dtype, ``"float"``: a floating one), its elements in ``[low, high]`` and finite."""
        if not isinstance(value, torch.Tensor):
            raise self.error(name, f"is a {type(value).__name__}, not a tensor")
        if shape is not None and (value.dim() != len(shape) or any(s is not None and int(n) != int(s)
                                                                    for n, s in zip(value.shape, shape))):
            want = "[" + ", ".join("*" if s is None else str(int(s)) for s in shape) + "]"
            raise self.error(name, f"has shape {list(value.shape)}, where this run needs {want}")
        if dtype is not None and value.dtype != dtype:
            raise self.error(name, f"holds {value.dtype}, where this run needs {dtype}")
        if kind == "int" and (value.dtype.is_floating_point or value.dtype.is_complex or value.dtype == torch.bool):
            raise self.error(name, f"holds {value.dtype}, not integers")
        if kind == "float" and not value.dtype.is_floating_point:
            raise self.error(name, f"holds {value.dtype}, not floating-point numbers")
        if value.numel() and (low is not None or high is not None):
            flat = value.reshape(-1)
            lo, hi = (float(v) for v in torch.aminmax(flat.to(torch.uint8) if flat.dtype == torch.bool else flat))
            if (low is not None and lo < low) or (high is not None and hi > high):
                raise self.error(name, f"holds values outside [{_num(low)}, {_num(high)}] ({_num(lo)} to {_num(hi)})")
        if finite and value.dtype.is_floating_point:
            self.require(name, torch.isfinite(value), "holds NaN or infinite values")
        return value

    def no_nan(self, name: str, value: torch.Tensor) -> torch.Tensor:
        """``value`` (floating) holds neither NaN nor +inf (log-probabilities: -inf is one)."""
        self.require(name, ~torch.isnan(value) & (value < float("inf")), "holds NaN or +inf values")
        return value

    def integer(self, name: str, value: Any, low: Optional[int] = None, high: Optional[int] = None) -> int:
        """``value`` as an int in ``[low, high]`` (a Python or 0-d tensor integer, not a bool)."""
        if isinstance(value, torch.Tensor) and value.numel() == 1 and not value.dtype.is_floating_point:
            value = int(value)
        if isinstance(value, bool) or not isinstance(value, int):
            raise self.error(name, f"is a {type(value).__name__}, not an integer")
        if (low is not None and value < low) or (high is not None and value > high):
            raise self.error(name, f"is {value}, outside [{_num(low)}, {_num(high)}]")
        return value


def _num(v) -> str:
    if v is None:
        return "..."
    return str(int(v)) if float(v) == int(v) else f"{v:g}"


@contextlib.contextmanager
def rebuilding(path: Any):
    """Around the rebuilding of a state from a checkpoint's dict: a field missing or of the wrong type (what
    the rebuilding raises as ``KeyError``, ``TypeError``, ...) is a :class:`CheckpointError` naming ``path``."""
    try:
        yield
    except CheckpointError:
        raise
    except (KeyError, TypeError, AttributeError, IndexError, ValueError, RuntimeError) as exc:
        what = f"lacks the field {exc.args[0]!r}" if isinstance(exc, KeyError) and exc.args else \
            f"does not fit together ({type(exc).__name__}: {str(exc)[:200]})"
        raise CheckpointError(f"{path}: the checkpoint's sampler state {what}: it is damaged or edited; start "
                              "afresh without it") from None


def check_pointer_trees(fields: StateFields, name: str, feature: torch.Tensor, left: torch.Tensor,
                        right: torch.Tensor, parent: torch.Tensor, depth: torch.Tensor, internal: torch.Tensor,
                        n_nodes: torch.Tensor, n_features: int, heap: Optional[torch.Tensor] = None,
                        threshold: Optional[torch.Tensor] = None, rename: Optional[dict] = None) -> None:
    """Trees in padded pointer arrays ``[P, C]`` restored from a checkpoint are trees of a run on ``n_features``
    columns: ``n_nodes`` integers in ``[1, C]``, then :func:`~torchtree.model.tree_checks.check_pointers`' invariants
    (with ``heap``, the nodes' heap codes; with ``threshold``, finite split thresholds). Fields are named
    ``<name>.<field>`` (``rename``: field -> its name in the checkpoint, where they differ)."""
    C = feature.shape[1]
    key = {k: f"{name}.{k}" for k in ("n_nodes", "status", "feature", "left", "right", "parent", "depth", "heap",
                                       "threshold")}
    key.update({k: f"{name}.{v}" for k, v in (rename or {}).items()})
    fields.tensor(key["n_nodes"], n_nodes, shape=[feature.shape[0]], kind="int", low=1, high=C)
    check_pointers(lambda field, ok, why: fields.require(key[field], ok, why), feature, left, right, parent, depth,
                   internal, n_nodes, n_features, heap=heap, threshold=threshold)


def check_hard_trees(fields: StateFields, name: str, trees: HardTrees, n_trees: Optional[int], n_features: int,
                     n_stats: Optional[int] = None, threshold_dtype: Optional[torch.dtype] = None,
                     heap: Optional[torch.Tensor] = None) -> None:
    """:class:`~torchtree.model.trees.HardTrees` restored from a checkpoint (``n_trees`` of them, None: any
    number) fit a run on ``n_features`` columns: every field ``[P, C]`` (``stats [P, C, n_stats]``) of its
    dtype kind, slots past ``n_nodes`` unused, :func:`check_pointer_trees` (with ``heap``, the nodes' heap
    codes), finite statistics."""
    feature = fields.tensor(f"{name}.feature", trees.feature, shape=[n_trees, None], kind="int")
    P, C = feature.shape
    for field in ("left", "right", "parent", "depth", "status"):
        fields.tensor(f"{name}.{field}", getattr(trees, field), shape=[P, C], kind="int")
    fields.tensor(f"{name}.threshold", trees.threshold, shape=[P, C], kind="float", dtype=threshold_dtype)
    stats = fields.tensor(f"{name}.stats", trees.stats, shape=[P, C, n_stats], finite=True)
    fields.require(f"{name}.stats", stats.dtype != torch.bool and not stats.dtype.is_complex, "holds no numbers")
    n_nodes = fields.tensor(f"{name}.n_nodes", trees.n_nodes, shape=[P], kind="int", low=1, high=C)
    status = fields.tensor(f"{name}.status", trees.status, low=UNUSED, high=INTERNAL)
    used = torch.arange(C, device=feature.device)[None, :] < n_nodes[:, None].to(feature.device)
    fields.require(f"{name}.status", (status != UNUSED) == used, "disagrees with the trees' node counts")
    check_pointer_trees(fields, name, feature, trees.left, trees.right, trees.parent, trees.depth,
                        status == INTERNAL, n_nodes, n_features, heap=heap, threshold=trees.threshold)


def check_tree_state(fields: StateFields, name: str, trees: HardTrees, model, n_trees: int,
                     max_depth: int) -> None:
    """The trees of a move sampler's :class:`~torchtree.steps.moves.TreeState` (MCMC chains, SMC-with-moves
    particles) fit ``model`` (:class:`~torchtree.model.target.TreeModel`): :func:`check_hard_trees`, depths
    at most ``max_depth``, and the caches the moves index with, ``extra``: ``term [P, C]`` float64 finite,
    ``heap [P, C]`` the nodes' paths, ``thr_rank [P, C]`` each split's threshold rank, ``bits [P, C, W]``
    (optional) no point past the data's."""
    P, C = fields.tensor(f"{name}.feature", trees.feature, shape=[n_trees, None], kind="int").shape
    extra = trees.extra
    for key in ("term", "heap", "thr_rank"):
        if key not in extra:
            raise fields.error(f"{name}.extra.{key}", "is missing")
    fields.no_nan(f"{name}.extra.term", fields.tensor(f"{name}.extra.term", extra["term"], shape=[P, C],
                                                     dtype=torch.float64))
    heap = fields.tensor(f"{name}.extra.heap", extra["heap"], shape=[P, C], dtype=torch.long)
    rank = fields.tensor(f"{name}.extra.thr_rank", extra["thr_rank"], shape=[P, C], dtype=torch.long)
    fields.tensor(f"{name}.depth", trees.depth, kind="int", low=0, high=max_depth)
    check_hard_trees(fields, name, trees, n_trees, model.D, model.S, model.X.dtype, heap=heap)
    internal = trees.status == INTERNAL
    pi, ni = internal.nonzero(as_tuple=True)
    if pi.numel():
        want = model.threshold_rank(trees.feature[pi, ni].long(), trees.threshold[pi, ni])
        fields.require(f"{name}.extra.thr_rank", rank[pi, ni] == want, "disagrees with the split thresholds")
    if "bits" in extra:
        bits = fields.tensor(f"{name}.extra.bits", extra["bits"], shape=[P, C, model.W], dtype=torch.long)
        fields.require(f"{name}.extra.bits", (bits & ~model.all_bits) == 0, "holds points past the data's")
