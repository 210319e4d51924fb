"""Plots of a posterior over trees, drawn with matplotlib.

matplotlib is optional: ``pip install matplotlib``, or the ``plot`` extra of an install from the
repository (``pip install -e ".[plot]"``).

Every function takes a posterior (``TreePosterior``: smc, mcmc, smc-moves; ``BARTPosterior``;
``SoftTreePosterior``: nuts, dcc) or a fitted estimator (its ``posterior_``), draws on ``ax=`` when
given (else on a new pyplot figure) and returns the matplotlib Axes (an array of Axes for plots of
several panels). matplotlib is imported when a function is called, so ``import torchtree`` and
``import torchtree.plot`` never need it. A plot that does not apply to a posterior raises a
``ValueError`` that says what does.

* :func:`plot_tree`: one tree (the MAP tree or any draw) as boxes, with split rules and leaf
  values or class probabilities;
* :func:`plot_importance`: posterior split share or inclusion probability per feature, with intervals;
* :func:`plot_pdp`: partial dependence on one feature, the posterior mean and a credible band over
  the draws' curves;
* :func:`plot_ice`: ICE curves of single rows, with the partial dependence and its band;
* :func:`plot_trace`: per-chain traces (sigma, leaves, log posterior) with R-hat and ESS;
* :func:`plot_calibration`: reliability diagram (classification); PIT histogram and interval
  coverage (regression);
* :func:`plot_evidence`: the hyperparameter search's evidence curves;
* :func:`write_plots`: every plot that applies, as PNG files (``torchtree report --plots DIR``).

The numbers behind the plots are public too: :func:`partial_dependence`,
:func:`feature_importance`, :func:`partial_dependence_importance` (the spread of each feature's
partial dependence), :func:`predictive_cdf` (the PIT), :func:`prediction_draws` (each
draw's prediction and weight), :func:`split_counts` and :func:`tree_inclusion` (each draw's splits and
trees per feature) and :func:`evidence_curves`.
"""
from torchtree.plot.checks import evidence_curves, plot_calibration, plot_evidence, plot_trace, trace_quantities
from torchtree.plot.common import MATPLOTLIB_MISSING
from torchtree.plot.draws import prediction_draws, predictive_cdf, split_counts, tree_inclusion
from torchtree.plot.effects import (feature_importance, partial_dependence, partial_dependence_importance, plot_ice,
                                    plot_importance, plot_pdp)
from torchtree.plot.files import PLOTS, write_plots
from torchtree.plot.tree import plot_tree

__all__ = [
    "plot_tree", "plot_importance", "plot_pdp", "plot_ice", "plot_trace", "plot_calibration", "plot_evidence",
    "write_plots", "PLOTS", "partial_dependence", "partial_dependence_importance", "feature_importance",
    "predictive_cdf", "prediction_draws", "split_counts", "tree_inclusion", "evidence_curves", "trace_quantities", "MATPLOTLIB_MISSING",
]
