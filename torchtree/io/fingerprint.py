"""Run fingerprints: short hashes of a run's data, settings and seed, which its checkpoints store.

:mod:`torchtree.io.checkpoint` stores them with every save and refuses a checkpoint of another run; these
functions are exported there too.
"""
from __future__ import annotations

from typing import Any, Dict, Sequence

from torchtree.io.integrity import feed_hash

__all__ = ["fingerprint", "fingerprint_parts", "differing_parts"]


def fingerprint(*parts: Any) -> str:
    """A short hash identifying a run: its data, settings and seed.

    A sampler stores it in its checkpoints and refuses to resume from a checkpoint
    whose fingerprint differs (resuming another run's state would silently mix
    two runs).

    Parameters
    ----------
    *parts : tensors, numpy arrays, numbers, strings, and (nested) lists, tuples, dicts

    Returns
    -------
    str, 16 hex digits
    """
    import hashlib

    h = hashlib.sha256()
    for p in parts:
        feed_hash(h, p)
    return h.hexdigest()[:16]


def fingerprint_parts(settings: Dict[str, Any], seed_key: Any, data: Sequence[Any], world_size: int) -> Dict[str, Any]:
    """Fingerprints of a run's parts, stored beside its whole :func:`fingerprint` so that a refused
    checkpoint can say what differs: ``{"settings": {name: fingerprint}, "values": {name: value}, "seed": ...,
    "data": ..., "ranks": world_size}`` (``values``: the settings that are plain numbers, strings or None, which
    a refusal shows)."""
    plain = {str(k): v for k, v in settings.items() if v is None or isinstance(v, (bool, int, float, str))}
    return {"settings": {str(k): fingerprint(v) for k, v in settings.items()}, "values": plain,
            "seed": fingerprint(seed_key), "data": fingerprint(*data), "ranks": int(world_size)}


def differing_parts(saved: Any, mine: Any) -> str:
    """What differs between two :func:`fingerprint_parts`, with its verb (``"the seed differs"``, ``"the seed
    and the setting n_warmup differ"``), or ``""`` when either is missing (a checkpoint of an earlier
    version) or nothing differs."""
    if not (isinstance(saved, dict) and isinstance(mine, dict)):
        return ""
    out = [f"the {label}" for key, label in (("data", "training data"), ("seed", "seed"), ("ranks", "number of ranks"))
           if saved.get(key) != mine.get(key)]
    a, b = saved.get("settings") or {}, mine.get("settings") or {}
    changed = sorted(k for k in set(a) | set(b) if a.get(k) != b.get(k))
    if changed:
        shown = ", ".join(changed[:6]) + (", ..." if len(changed) > 6 else "")
        out.append(f"the setting{'s' if len(changed) > 1 else ''} {shown}")
    if not out:
        return ""
    plural = len(out) > 1 or out[0].startswith("the settings ")
    va, vb = saved.get("values") or {}, mine.get("values") or {}
    values = "; ".join(f"{k} {va[k]!r} in the checkpoint, {vb[k]!r} in this run" for k in changed[:6]
                       if k in va and k in vb)
    return " and ".join(out) + (" differ" if plural else " differs") + (f": {values}" if values else "")
