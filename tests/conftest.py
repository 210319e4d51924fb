"""Shared test set-up.

Every test runs with one torch intra-op thread: results of the batched kernels then do
not depend on the machine's core count, and parallel test workers do not oversubscribe
the CI machine's two cores. The previous thread count is restored afterwards.
"""
import os

import pytest
import torch

# Checkpoint tests stop and resume runs right after the saves of given steps; the default
# cost-aware Checkpointer would skip saves by the clock. Child processes inherit this.
# Tests of the cost-aware default pass min_seconds explicitly or unset it.
os.environ.setdefault("TORCHTREE_CHECKPOINT_MIN_SECONDS", "0")


@pytest.fixture(scope="session", autouse=True)
def compiled_kernels():
    """Build (or load) torchtree's compiled CPU kernels once, before any test: a first build takes about a
    minute, which must not fall inside a test's own time limit (worker processes then load the build)."""
    from torchtree.kernels import native

    native.available()
    yield


@pytest.fixture(autouse=True)
def one_torch_thread():
    n = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(n)
