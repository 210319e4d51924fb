"""Saved files edited as anyone could: load the payload, change it, and seal it again with a valid checksum
(``torchtree.io.integrity.seal``; a checksum is not a signature), for tests of what the loaders refuse."""
from __future__ import annotations

import torch

from torchtree.io.integrity import seal


def edited(src, dst, edit):
    """Write ``dst``: the payload of ``src`` after ``edit(payload)`` (in place), sealed again. Returns ``dst``."""
    p = dict(torch.load(src, weights_only=True))
    p.pop("checksum")
    edit(p)
    torch.save(seal(p), dst)
    return dst
