"""Eval tests run torch on one thread: on a shared 2-core machine, two threads per process
oversubscribe the cores and make these small models several times slower."""

import pytest
import torch


@pytest.fixture(autouse=True)
def one_thread():
    before = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(before)
