"""Shared fixtures."""

import pytest
import torch


@pytest.fixture(scope="module")
def one_thread():
    """One torch thread for the module: its tensors are small, and on a shared 2-core machine extra intra-op threads
    only spin against each other (measured 3 min wall with 2 threads under load vs 20 s with one). Restored after."""
    before = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(before)
