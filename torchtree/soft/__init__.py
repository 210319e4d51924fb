"""Soft decision trees, batched HMC / NUTS, DCC-Tree and the Pyro bridge."""
