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


_CWD_AT_START = None


def pytest_sessionstart(session):
    global _CWD_AT_START
    _CWD_AT_START = set(os.listdir(os.getcwd()))


def pytest_sessionfinish(session, exitstatus):
    """Tests write under tmp_path, never into the working directory (a user's clone): a file that appeared
    there during the session fails the run, named. (A CLI fit without --out writes posterior.pt.)"""
    if _CWD_AT_START is None or os.environ.get("PYTEST_XDIST_WORKER"):
        return  # workers share the controller's directory: the controller checks once
    new = sorted(n for n in set(os.listdir(os.getcwd())) - _CWD_AT_START
                 if not n.startswith(".") and n != "__pycache__")  # pytest's and Python's own caches
    if new:
        print(f"\nERROR: the tests wrote into the working directory {os.getcwd()}: {', '.join(new)} "
              "(write under tmp_path)")
        session.exitstatus = 1
