import sys
from pathlib import Path

import pytest

import actcodec

sys.path.insert(0, str(Path(__file__).resolve().parent))


@pytest.fixture(autouse=True, scope="session")
def two_threads():
    actcodec.set_num_threads(2)  # the default of calls that name none
    try:
        import torch
    except ImportError:  # the codec suites run without it
        return
    torch.set_num_threads(2)
