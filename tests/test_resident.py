"""actcodec.resident: the process's RSS and the peak of a block, by the kernel's counter or,
where it cannot be reset, by sampling."""
import time

import numpy as np
import pytest

from actcodec import resident

MiB = 1 << 20


def touch(nbytes: int, hold: float = 0.0) -> None:
    a = np.ones(nbytes, np.uint8)  # written: resident
    time.sleep(hold)
    del a


def test_rss_and_its_peak():
    assert 0 < resident.rss() <= resident.peak_rss()


@pytest.mark.parametrize("kernel", [True, False], ids=["kernel counter", "sampled"])
def test_the_peak_of_a_block_sees_what_it_touched(kernel, monkeypatch):
    if not kernel:
        monkeypatch.setattr(resident, "reset_peak", lambda: False)
    elif not resident.reset_peak():
        pytest.skip("this kernel refuses to reset the peak counter: the sampled case covers it")
    before = resident.rss()
    with resident.Peak() as peak:
        touch(200 * MiB, hold=0.05)  # held long enough for a sampler reading every 1 ms
    assert peak.sampled is not kernel
    assert peak.nbytes - before >= 190 * MiB
    with resident.Peak() as quiet:
        pass
    assert quiet.nbytes - resident.rss() < 64 * MiB  # a fresh block starts from now
