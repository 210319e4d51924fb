"""torchtree: Bayesian decision trees as batched PyTorch tensors."""

__version__ = "0.1.0"
