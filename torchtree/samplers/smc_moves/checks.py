"""A resumed SMC-with-moves checkpoint's state checked against the run (:mod:`torchtree.samplers.restore_checks`):
the moves and the compiled traversal index the data and the trees' arrays with the particles' features and
child pointers unchecked, so every field is checked before the first iteration."""
from __future__ import annotations

import math
from typing import Any, Dict

import torch

from torchtree.samplers.restore_checks import StateFields, check_tree_state, rebuilding
from torchtree.samplers.smc_moves.state import SMCSamplerState
from torchtree.steps.moves import MAX_DEPTH

__all__ = ["restored_state"]


def restored_state(saved: Dict[str, Any], ctx, path) -> SMCSamplerState:
    """The state a checkpoint's dict ``saved`` holds (this rank's particles), checked against the run (``ctx``:
    its RunContext). Raises :class:`~torchtree.io.integrity.CheckpointError` naming ``path`` and the field."""
    with rebuilding(path):
        st = SMCSamplerState.from_state_dict(saved, ctx.device)
    fields = StateFields(path)
    setup = ctx.setup
    P = setup.n_local
    fields.integer("iteration", saved["iteration"], low=-1)
    check_tree_state(fields, "trees", st.particles.trees, setup.model, P, MAX_DEPTH)
    fields.no_nan("logw", fields.tensor("logw", st.logw, shape=[P], dtype=torch.float64))
    if setup.tempered or st.ll is not None:
        fields.no_nan("ll", fields.tensor("ll", st.ll, shape=[P], dtype=torch.float64))
    for name in ("log_z", "phi"):
        value = getattr(st, name)
        fields.require(name, isinstance(value, (int, float)) and not isinstance(value, bool), "is not a number")
    fields.require("phi", 0.0 <= float(st.phi) <= 1.0, "is not a likelihood power in [0, 1]")
    fields.require("log_z", not math.isnan(float(st.log_z)), "is NaN")
    fields.integer("n_resample", st.n_resample, low=0)
    return st
