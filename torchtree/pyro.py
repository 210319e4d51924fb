"""Pyro integration: soft decision trees as ``PyroModule`` models.

``SoftTreeFunction`` is a random function usable inside any Pyro model (e.g. the mean
of a hierarchical regression); ``SoftTreeRegressor`` and ``SoftTreeClassifier`` are
complete models for ``pyro.infer.MCMC(pyro.infer.NUTS(model))`` or SVI. See
:mod:`torchtree.soft.pyro_model` and ``examples/pyro_soft_tree.py``.
"""
from .soft.pyro_model import SoftTreeClassifier, SoftTreeFunction, SoftTreeRegressor

__all__ = ["SoftTreeFunction", "SoftTreeRegressor", "SoftTreeClassifier"]
