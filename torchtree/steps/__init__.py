"""Markov pieces: one transition each, on typed state.

growth       top-down growth and its proposals (paper 001)
moves        grow / prune / change / swap proposals on batched trees (paper 002, Chipman 1998)
cut_proposals  how those moves draw a cut ("prior", "data", "informed") and the draws' densities
host_moves   the same moves for one chain on the host (latency-bound single chains)
hmc, nuts    batched HMC and multinomial NUTS steps; ``nuts_async`` the lock-free variant
adaptation   dual averaging, Welford mass matrix, warm-up windows, sharpness schedule
soft_init    informed starting points for soft trees

Layer: above the model; imports nothing from samplers or faces.
"""
