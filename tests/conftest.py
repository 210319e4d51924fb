"""Shared test set-up.

Every test runs with one torch intra-op thread: results of the batched kernels then do
not depend on the machine's core count, and parallel test workers do not oversubscribe
the CI machine's two cores. The previous thread count is restored afterwards.
"""
import pytest
import torch


@pytest.fixture(autouse=True)
def one_torch_thread():
    n = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(n)
