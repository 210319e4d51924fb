"""DCC-Tree (paper 004): topology search, LAIS evidence, utility, the sampler.

config    ``DCCConfig``: the settings table (help, choices, bounds)
records   per-topology bookkeeping, its checkpoint form, warm-start inheritance
lais      layered adaptive importance sampling evidence
utility   the utility that picks the topologies to refine (eq. 10)
rows      the budget plan: a row subset and a warm-up the time budget affords
state     ``DCCState``: the run between two iterations and its checkpoint form
sampler   ``DCC`` (init / step / finalize through the driver)
"""
from torchtree.samplers.dcc.config import DCCConfig
from torchtree.samplers.dcc.sampler import DCC
from torchtree.samplers.dcc.state import DCCState

__all__ = ["DCC", "DCCConfig", "DCCState"]
