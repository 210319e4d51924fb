"""Reading a posterior file of any kind: the one entry point that needs no knowledge of which sampler
wrote it (:meth:`torchtree.Posterior.load`, ``torchtree report``, ``torchtree predict``)."""
from __future__ import annotations

import os
from typing import TYPE_CHECKING

from torchtree.model.posterior_base import StrPath

if TYPE_CHECKING:
    import torch

    from torchtree.model.bart_posterior import BARTPosterior
    from torchtree.model.posterior import TreePosterior
    from torchtree.model.soft_posterior import SoftTreePosterior

__all__ = ["load_posterior"]


def load_posterior(path: StrPath, device: str | torch.device | None = None
                   ) -> TreePosterior | BARTPosterior | SoftTreePosterior:
    """Load a posterior saved by any torchtree sampler: hard trees (top-down SMC, MCMC, SMC with
    moves), BART or soft trees (NUTS, DCC), chosen by the file's format tag.

    The file is first read with ``torch.load(weights_only=True)``: nothing in it can run code.

    Parameters
    ----------
    path : str or os.PathLike (a ``pathlib.Path``)
    device : str or torch.device, optional, where to place the tensors (default: as saved, on the CPU)

    Returns
    -------
    TreePosterior, BARTPosterior or SoftTreePosterior (each a :class:`~torchtree.Posterior`; ``isinstance``
    tells which, for the methods of one kind)

    Raises
    ------
    FileNotFoundError, IsADirectoryError
        No file at ``path``.
    ValueError
        An empty, damaged or truncated file, a run's checkpoint (named as such), or a file of another kind.
    """
    import torch

    path = os.fspath(path)
    if not os.path.exists(path):
        raise FileNotFoundError(f"{path}: no such file")
    if os.path.isdir(path):
        raise IsADirectoryError(f"{path}: is a directory, not a posterior file")
    if os.path.getsize(path) == 0:
        raise ValueError(f"{path}: not a torchtree posterior file: the file is empty (damaged or truncated)")
    try:
        payload = torch.load(path, map_location="cpu", weights_only=True)
    except Exception as exc:
        raise ValueError(f"{path}: not a torchtree posterior file: damaged, truncated or of another kind "
                         f"(torch.load cannot read it as plain tensors: {type(exc).__name__})") from None
    fmt = payload.get("format") if isinstance(payload, dict) else None
    kw = {} if device is None else {"device": device}
    from torchtree.model.posterior import READ_FORMATS, TreePosterior

    if fmt in READ_FORMATS:
        return TreePosterior.load(path, **kw)
    from torchtree.model.bart_posterior import BARTPosterior

    if fmt in BARTPosterior.READ_FORMATS:
        return BARTPosterior.load(path, **kw)
    if isinstance(payload, dict) and "topologies" in payload and "draws" in payload:
        from torchtree.model.soft_posterior import SoftTreePosterior

        return SoftTreePosterior.load(path, **kw)
    if isinstance(fmt, str) and "checkpoint" in fmt:
        raise ValueError(f"{path}: a run's checkpoint ({fmt}), not a posterior file: rerun the fit with it as "
                         "--checkpoint to finish the run; its --out file is the posterior")
    if isinstance(fmt, str) and fmt.startswith("torchtree.") and "Posterior/" in fmt:
        raise ValueError(f"{path}: a torchtree posterior file of a format this version does not read ({fmt}): "
                         "written by a newer torchtree? Load it with that version")
    raise ValueError(f"{path}: not a torchtree posterior file" + (f" (it holds {fmt})" if isinstance(fmt, str) else ""))
