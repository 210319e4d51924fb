"""The model: what a tree is and what it scores.

data                 ``Data``: validated training data (all input checks live here)
inputs               checks of user features and labels (arrays, frames, tensors)
encoding, levels     ``TableEncoder``: missing values and categorical columns as numeric split columns
feature_groups       the draw of a split rule's column, uniform or group by group
trees                ``HardTrees``: P trees in padded pointer arrays
tree_checks          the trees' structural invariants (one statement)
tree_storage         compact trees for posterior files and checkpoints
priors               ``ChipmanPrior``, ``PoissonPrior``; ``register_prior``
likelihoods          ``DirichletMultinomial``, ``NormalInverseGamma``: the built-in leaf likelihoods
likelihood_protocol  ``LeafLikelihood`` (the hooks a leaf likelihood has), ``register_likelihood`` and
                     ``likelihood_from_config`` (the registry posterior files are loaded through)
likelihood_checks    ``check_likelihood``: a likelihood against its contract (``torchtree.testing``)
registry             ``ConfigRegistry``: classes by their ``config()`` name (likelihoods, priors)
target               ``TreeModel``: prior x likelihood on one data set, O(N D) data tables and
                     per-node bitset kernels; ``quantile_binned`` (``max_bins``)
routing              node bitsets of the move samplers
posterior_base       ``Posterior``: the protocol every sampler's result implements
posterior            ``TreePosterior``: a weighted set of hard trees
interval             equal-tailed predictive intervals from Monte Carlo draws
summary              ``PosteriorSummary``
loading              ``load_posterior``: a posterior file of any kind
diagnostics          R-hat, ESS, tree-size summaries, ArviZ export
soft_data            soft-tree inputs scaled to [0, 1]
topology             soft-tree topologies and their structure prior
soft_params          ``SoftTreeHyper`` (hyperparameters), ``ParamLayout`` (the blocks of theta)
soft_trees           ``SoftTrees``: batched differentiable trees and their potential (its
                     hand-derived gradient is ``torchtree.kernels.soft_gradient``)
soft_posterior       ``SoftTreePosterior``
bart                 BART's sum-of-trees model: ``BartPrior``, ``CutGrid``, heap trees, ``forest_sum``
bart_posterior       ``BARTPosterior``

Layer: above ``torchtree.core``; imports nothing from steps, samplers or faces.
"""
