"""One rank of the multi-rank checkpoint/resume test (tests/test_resume.py), gloo, torchrun-style env.

Usage::

    RANK=r WORLD_SIZE=2 MASTER_ADDR=... MASTER_PORT=... python resume_worker.py OUT

For each case (islands layout and gathered layout): a checkpointed 2-rank TopDownSMC run is
stopped on every rank by an exception right after the checkpoint of stage ``STOP_AT`` (a crash
simulated in-process), then a new run with the same checkpoint resumes it. Rank ``r`` saves
the resumed posterior (and the steps saved before and after the stop) to ``OUT/rank{r}.pt``
for the test to compare with the uninterrupted one-process run.
"""

from __future__ import annotations

import os
import sys
import traceback

import torch

import torchtree.distributed as td
from torchtree import TopDownSMC
from torchtree.monitor import CallbackMonitor

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import resume_cases as rc  # noqa: E402


class Stop(Exception):
    pass


def main() -> int:
    out_dir = sys.argv[1]
    timeout = float(os.environ.get("TT_TEST_TIMEOUT", "60"))
    torch.set_num_threads(1)
    b = td.TorchDistBackend.from_env("gloo", timeout=timeout)
    results = {"rank": b.rank}
    try:
        data, Xq = rc.data()
        for name, kw in rc.DIST_CASES.items():
            path = os.path.join(out_dir, f"{name}.ckpt")
            first = TopDownSMC(**kw, backend=b, checkpoint=path, checkpoint_every=rc.EVERY)
            before = []

            def stop(step, before=before):
                before.append(step)
                if step >= rc.STOP_AT:
                    raise Stop

            try:
                first.run(data, seed=rc.SEED, monitor=CallbackMonitor(on_checkpoint=stop, all_ranks=True))
                stopped = False
            except Stop:
                stopped = True
            second = TopDownSMC(**kw, backend=b, checkpoint=path, checkpoint_every=rc.EVERY)
            after = []
            post = second.run(data, seed=rc.SEED, monitor=CallbackMonitor(on_checkpoint=after.append, all_ranks=True))
            results[name] = {"stopped": stopped, "before": before, "after": after, **rc.summary(post, Xq)}
    except Exception:  # report, then make the other rank fail fast instead of waiting
        traceback.print_exc()
        sys.stdout.flush()
        os._exit(1)
    torch.save(results, os.path.join(out_dir, f"rank{b.rank}.pt"))
    b.close()
    return 0


if __name__ == "__main__":
    sys.exit(main())
