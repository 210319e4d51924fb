"""``write_plots``: every plot that applies to a posterior, as PNG files in a folder (``torchtree report
POSTERIOR.pt --plots DIR``)."""
from __future__ import annotations

import os
import warnings
from typing import Any, Callable, List, Optional, Sequence, Tuple

import numpy as np

from torchtree.plot.checks import evidence_curves, plot_calibration, plot_evidence, plot_trace, trace_quantities
from torchtree.plot.common import input_names, kind_of, posterior_of, require_matplotlib, training_names
from torchtree.plot.effects import partial_dependence_importance, plot_ice, plot_importance, plot_pdp
from torchtree.plot.tree import collapse, plot_tree, tree_drawing

__all__ = ["write_plots", "PLOTS"]

#: the files :func:`write_plots` can write, in order: name -> what it shows
PLOTS = {
    "tree": "a tree of the posterior (the MAP tree; BART: tree 0 of the last draw; soft trees: the heaviest topology)",
    "importance": "posterior split share per feature with 90% intervals",
    "trace": "per-chain traces with R-hat and ESS",
    "evidence": "the hyperparameter search's evidence curves",
    "pdp": "partial dependence on one feature (default: the one the prediction moves most with), with a 90% credible band",
    "ice": "ICE curves of the feature of pdp",
    "calibration": "reliability diagram (classification) or PIT histogram and interval coverage (regression)",
}


#: the tree of :func:`write_plots` is drawn down to the depth that keeps it within these
TREE_DEPTH, TREE_LEAVES = 5, 20


def write_plots(posterior: Any, directory: str, X: Any = None, y: Any = None, *, feature: Any = None,
                feature_names: Optional[Sequence[str]] = None, dpi: int = 100) -> Tuple[List[Tuple[str, str]], List[Tuple[str, str]]]:
    """Write every plot of :data:`PLOTS` that applies to ``posterior`` as ``DIRECTORY/NAME.png``.

    The plots that need data (``pdp``, ``ice``: rows ``X``; ``calibration``: ``X`` and targets ``y``)
    are skipped without it; a plot that does not apply to the posterior (``trace`` without per-chain
    traces, ``evidence`` without a hyperparameter search) is skipped with the reason its function gives.
    Figures are made without pyplot (no window, no global state).

    Parameters
    ----------
    posterior : a posterior or a fitted estimator
    directory : str, created when missing
    X : array-like [M, D], optional
    y : array-like [M], optional
    feature : int or str, optional
        The feature of ``pdp`` and ``ice`` (default: the one whose partial dependence varies most over
        its values in ``X``, :func:`~torchtree.plot.partial_dependence_importance`).
    feature_names : sequence of str, optional
        One name per input column, for every plot (default: ``X``'s column names, else the names
        the posterior keeps, else ``x0, x1, ...``).
    dpi : int, default 100

    Returns
    -------
    (written, skipped): lists of ``(path, what it shows)`` and of ``(name, why it was skipped)``.
    """
    require_matplotlib()
    from matplotlib.figure import Figure

    post = posterior_of(posterior)
    os.makedirs(directory, exist_ok=True)
    written: List[Tuple[str, str]] = []
    skipped: List[Tuple[str, str]] = []

    def save(name: str, draw: Callable[[Any], Any], panels: int = 1, size: Optional[Tuple[float, float]] = None,
             what: Optional[str] = None):
        fig = Figure(figsize=size or (5.0 * panels, 3.8))
        axes = fig.subplots(1, panels, squeeze=False)[0]
        try:
            draw(axes[0] if panels == 1 else axes)
        except ValueError as exc:
            skipped.append((name, str(exc)))
            return
        path = os.path.join(directory, f"{name}.png")
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")  # tight_layout's notes on crowded panels
            fig.tight_layout()
        fig.savefig(path, format="png", dpi=dpi)
        written.append((path, what or PLOTS[name]))

    d = tree_drawing(post)
    which = {"hard": "the MAP tree", "bart": "tree 0 of the last draw", "soft": "the heaviest soft topology"}[kind_of(post)]
    names = input_names(post, X, feature_names)
    if feature is not None and not isinstance(feature, str) and not (
            isinstance(feature, (int, np.integer)) and not isinstance(feature, bool) and 0 <= feature < len(names)):
        raise ValueError(f"feature must be a column name or an index in 0..{len(names) - 1}, got {feature!r}")
    if isinstance(feature, str) and feature not in names:
        raise ValueError(f"feature {feature!r} is not one of the features {names}")
    shown = None
    if _depth(d) > TREE_DEPTH or len(d.leaves) > TREE_LEAVES:  # a readable picture: the top levels
        shown = next(k for k in range(TREE_DEPTH, -1, -1) if len(collapse(d, k).leaves) <= TREE_LEAVES)
        d = collapse(d, shown)
        which += f", down to depth {shown}"
    n_leaves, depth = max(1, len(d.leaves)), _depth(d)
    trained = training_names(post, X, feature_names)  # the tree's splits and the importances in the training order
    save("tree", lambda ax: plot_tree(post, feature_names=trained, max_depth=shown, ax=ax), 1,
         (max(4.0, 1.9 * n_leaves), max(2.8, 1.4 * (depth + 1))), which)
    save("importance", lambda ax: plot_importance(post, feature_names=trained, ax=ax), 1, (5.5, 0.35 * len(names) + 1.8))
    quantities = trace_quantities(post)
    if quantities:
        save("trace", lambda axes: plot_trace(post, ax=axes), len(quantities))
    else:
        save("trace", lambda ax: plot_trace(post, ax=ax))  # records plot_trace's reason
    try:
        n_curves = len([c for c in evidence_curves(post)["curves"].values() if len(c)])
    except ValueError as exc:
        skipped.append(("evidence", str(exc)))
    else:
        save("evidence", lambda axes: plot_evidence(post, ax=axes), n_curves)
    if X is None:
        skipped += [(n, "needs data rows X") for n in ("pdp", "ice")]
    else:
        chosen = "" if feature is not None else " (the feature the prediction moves most with)"
        if feature is None:
            feature = int(np.argmax(partial_dependence_importance(post, X, feature_names=names)["value"]))
        name = names[feature] if not isinstance(feature, str) else feature
        save("pdp", lambda ax: plot_pdp(post, X, feature, feature_names=names, ax=ax),
             what=f"partial dependence on {name}{chosen}, with a 90% credible band")
        save("ice", lambda ax: plot_ice(post, X, feature, feature_names=names, ax=ax), what=f"ICE curves of {name}{chosen}")
    if X is None or y is None:
        skipped.append(("calibration", "needs data rows X and their targets y"))
    else:
        what = ("reliability diagram and predicted probabilities" if post.task == "classification"
                else "PIT histogram and interval coverage")
        save("calibration", lambda axes: plot_calibration(post, X, y, ax=axes), 2, (10.0, 3.8), what)
    return written, skipped


def _depth(d) -> int:
    """Depth of a drawn tree (root at 0)."""
    depth, todo = 0, [(d.root, 0)]
    while todo:
        node, k = todo.pop()
        depth = max(depth, k)
        todo += [(c, k + 1) for c in d.children.get(node, ())]
    return depth

