"""The model: what a tree is and what it scores.

data            ``Data``: validated training data (all input checks live here)
trees           ``HardTrees``: P trees in padded pointer arrays
priors          ``ChipmanPrior``, ``PoissonPrior``
likelihoods     ``DirichletMultinomial``, ``NormalInverseGamma``
target          ``TreeModel``: prior x likelihood on one data set, O(N D) data tables and
                per-node bitset kernels; ``quantile_binned`` (``max_bins``)
posterior       ``TreePosterior``: a weighted set of hard trees
diagnostics     R-hat, ESS, tree-size summaries, ArviZ export
soft_data       soft-tree inputs scaled to [0, 1]
topology        soft-tree topologies and their structure prior
soft_params     ``SoftTreeHyper`` (hyperparameters), ``ParamLayout`` (the blocks of theta)
soft_trees      ``SoftTrees``: batched differentiable trees and their potential (its
                hand-derived gradient is ``torchtree.kernels.soft_gradient``)
soft_posterior  ``SoftTreePosterior``

Layer: above ``torchtree.core``; imports nothing from steps, samplers or faces.
"""
