"""``mpiexec -n 2 python step_failure_worker.py``: rank 1's run raises at its third iteration, rank 0's goes on
into the next exchange. With the backend's ``abort_on_error`` the job ends at once; without it rank 0 waits
until the backend's timeout (argv[1] seconds)."""
import sys

import numpy as np

from torchtree import Data, SMCSampler
from torchtree.distributed import MPIBackend


class FailsOnRank1(SMCSampler):
    def step(self, state, ctx):
        if ctx.rank == 1 and int(state.step) == 2:
            raise RuntimeError("rank 1 failed mid-run on purpose")
        return super().step(state, ctx)


be = MPIBackend(timeout=float(sys.argv[1]), abort_on_error=sys.argv[2] == "abort")
rng = np.random.default_rng(0)
X = rng.uniform(size=(60, 2))
FailsOnRank1(n_particles=8, n_iterations=20, backend=be).run(Data(X, (X[:, 0] > 0.5).astype(int)), seed=0)
print(f"rank {be.rank}: finished", flush=True)
