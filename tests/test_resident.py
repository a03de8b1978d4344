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
        monkeypatch.setattr(resident, "_reset_kernel_peak", lambda: False)
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


def test_a_nested_peak_does_not_erase_the_outer_ones():
    if not resident.reset_peak():
        pytest.skip("this kernel refuses to reset the peak counter")
    before = resident.rss()
    with resident.Peak() as outer:
        touch(300 * MiB)  # a spike, gone before the inner blocks start
        for _ in range(3):
            with resident.Peak() as inner:
                touch(8 * MiB)
            assert inner.nbytes - before < 200 * MiB
        resident.reset_peak()  # a bare reset too
    assert outer.nbytes - before >= 290 * MiB


def test_peaks_in_two_threads_keep_their_own_spikes():
    import threading

    if not resident.reset_peak():
        pytest.skip("this kernel refuses to reset the peak counter")
    before = resident.rss()
    seen = {}
    started, spiked = threading.Event(), threading.Event()

    def other():
        with resident.Peak() as p:
            started.set()
            spiked.wait(10)
            for _ in range(5):  # resets while the main thread's block is open
                with resident.Peak():
                    pass
        seen["other"] = p.nbytes

    t = threading.Thread(target=other)
    with resident.Peak() as mine:
        t.start()
        started.wait(10)
        touch(300 * MiB)
        spiked.set()
        t.join(30)
    assert mine.nbytes - before >= 290 * MiB
    assert seen["other"] - before >= 290 * MiB  # it was open during the spike
