"""DCC-Tree (paper 004): topology search, LAIS evidence, utility, the sampler."""
from torchtree.samplers.dcc.sampler import DCC

__all__ = ["DCC"]
