"""A checkpointed SMCSampler run that a test kills with SIGKILL (tests/test_smc_moves_resume.py).

Usage::

    python smc_moves_kill_worker.py CKPT_PATH CASE BLOCK_AT

Runs ``smc_moves_cases.run_case(CASE, checkpoint=CKPT_PATH, checkpoint_every=1)``; a monitor
slows every iteration down (0.1 s) and, at iteration ``BLOCK_AT`` (after its checkpoint was
written), sleeps until killed, so the test can kill the process at a known point.
"""

from __future__ import annotations

import sys
import time

import torch

import smc_moves_cases as sc
from torchtree.samplers import smc_moves
from torchtree.monitor import Monitor


class Slow(Monitor):
    def __init__(self, block_at: int):
        self.block_at = block_at

    def on_step(self, step, values):
        time.sleep(0.1)

    def on_checkpoint(self, step):
        # called once the checkpoint of ``step`` is on disk
        if step == self.block_at:
            print(f"blocking at {step}", flush=True)
            time.sleep(600)


def main() -> int:
    path, case, block_at = sys.argv[1], sys.argv[2], int(sys.argv[3])
    torch.set_num_threads(1)
    task, kw = sc.CASES[case]
    d, _ = sc.data(task)
    smc_moves.SMCSampler(n_particles=sc.N_PARTICLES, checkpoint=path, checkpoint_every=1, **kw).run(
        d, seed=sc.SEED, monitor=Slow(block_at))
    print("finished (not expected)", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
