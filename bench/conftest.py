import pytest

import actcodec


@pytest.fixture(autouse=True, scope="session")
def two_threads():
    actcodec.set_num_threads(2)
