"""``PosteriorSummary``: the dict every posterior's ``summary()`` returns, printed as a table."""
from __future__ import annotations

from typing import Any

import numpy as np
import torch

__all__ = ["PosteriorSummary", "SHOWN_FEATURES"]

#: feature rows a printed summary (and ``torchtree summary``) shows, most used first; the dict keeps every feature
SHOWN_FEATURES = 15


class PosteriorSummary(dict[str, Any]):
    """The dict of :meth:`TreePosterior.summary` with a readable ``repr``.

    Dict access is unchanged (``s["feature_usage"]`` is the array it always was);
    ``s["feature_names"]`` labels its entries, and printing the summary shows the
    scalars and the feature usage as a table: the :data:`SHOWN_FEATURES` (15) most used
    features, and a line counting the others and those never split on.
    """

    def __repr__(self) -> str:
        rows, tables = [], []
        for k, v in self.items():
            if k == "feature_names":
                continue
            if isinstance(v, (list, tuple, np.ndarray, torch.Tensor)) and (k.startswith("feature_usage") or k == "split_share"):
                tables.append((k, np.asarray(v.cpu() if isinstance(v, torch.Tensor) else v, dtype=np.float64)))
            elif isinstance(v, float):
                rows.append((k, f"{v:.6g}"))
            elif isinstance(v, (int, str, bool, type(None))):
                text = str(v)
                rows.append((k, text if len(text) <= 60 else text[:57] + "..."))
            elif isinstance(v, dict) and v and all(isinstance(e, str) for e in v.values()):
                # e.g. "settings": what each preset chose and why, one line each
                rows.extend((f"{k}.{name}", text if len(text) <= 100 else text[:97] + "...") for name, text in v.items())
            elif isinstance(v, dict) and v and all(isinstance(e, (int, float, str, bool, type(None))) for e in v.values()):
                text = ", ".join(f"{n}={e:.6g}" if isinstance(e, float) else f"{n}={e}" for n, e in v.items())
                rows.append((k, text if len(text) <= 100 else text[:97] + "..."))
            elif isinstance(v, (list, tuple)) and 0 < len(v) <= 6 and all(isinstance(e, (int, float)) for e in v):
                rows.append((k, "[" + ", ".join(f"{e:.6g}" for e in v) + "]"))
            elif isinstance(v, (list, tuple)):
                rows.append((k, f"[{len(v)} entries]" + (f" first: {v[0]}" if v and len(str(v[0])) <= 100 else "")))
            else:
                rows.append((k, f"<{type(v).__name__}>"))
        width = max((len(k) for k, _ in rows), default=0)
        lines = [f"{type(self).__name__}:"] + [f"  {k:<{width}}  {v}" for k, v in rows]
        for key, u in tables:
            names = self.get("feature_names")
            if names is None or len(names) != len(u):
                names = [f"x{d}" for d in range(len(u))]
            names = [str(n) for n in names]
            top = max(float(u.max()) if u.size else 0.0, 1e-12)
            order = np.argsort(-u, kind="stable")
            shown = order[:SHOWN_FEATURES]
            lines.append(f"  {key} (per feature, most used first):")
            nw = max((len(names[j]) for j in shown), default=1)
            for j in shown:
                lines.append(f"    {names[j]:<{nw}}  {u[j]:8.3f}  {'#' * int(round(20 * u[j] / top))}")
            if len(order) > len(shown):
                unused = int((u[order[len(shown):]] == 0).sum())
                lines.append(f"    ... {len(order) - len(shown)} more ({unused} never split on): summary[{key!r}] "
                             "holds every feature")
        return "\n".join(lines)

    def _repr_pretty_(self, p, cycle) -> None:  # IPython / Jupyter
        p.text(repr(self))
