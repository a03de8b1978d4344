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


def take_free_chunks(libc, chunk: int) -> list:
    """Chunks of `chunk` bytes (not written) until one grows the heap: what earlier work left
    free in it, taken, so that what follows allocates from new heap (free them after)."""
    holes, size = [], resident.heap()["heap"]
    while len(holes) < 1 << 16:
        holes.append(libc.malloc(chunk))
        if resident.heap()["heap"] > size:
            break
    return holes


def test_trims_do_not_add_up():
    """What trims gave back is counted as free heap that is not resident once, not once per
    trim: the pages of one trim, reused and freed, given back by the next, are the same
    pages (summed, the count outgrew the free heap, and live() crept up by a trim's worth
    every training step). Bytes freed beyond the last trim's are resident free heap."""
    import ctypes

    if resident.heap() is None or resident._MALLOC_TRIM is None:
        pytest.skip("not glibc: no heap statistics or malloc_trim")
    libc = ctypes.CDLL(None)
    libc.malloc.restype, libc.malloc.argtypes = ctypes.c_void_p, [ctypes.c_size_t]
    libc.free.argtypes = [ctypes.c_void_p]
    chunk, count = 64 << 10, 512  # 32 MiB in chunks under glibc's mmap threshold: the heap

    def fill(n):
        blocks = [libc.malloc(chunk) for _ in range(n)]
        for b in blocks:
            ctypes.memset(b, 1, chunk)  # written: resident
        return blocks

    def free(blocks):
        for b in blocks:
            libc.free(b)

    # what earlier work left free in the heap is taken first (tensors freed by other tests:
    # a trim would count it, and the fill below reuse it unseen), so that the heap holds
    # what this test frees only
    holes = take_free_chunks(libc, chunk)
    pin = more = None
    try:
        for _ in range(4):  # reuse, free, trim: what each training step near its limit did
            blocks = fill(count)
            if pin is None:
                pin = libc.malloc(chunk)  # above them: the heap's top cannot take them back
            free(blocks)
            resident.trim_heap()
        assert resident._TRIMMED.nbytes <= resident.heap()["heap_free"]
        blocks = fill(2 * count)  # the trimmed pages and as many new ones, all written
        more = libc.malloc(chunk)  # above them too
        free(blocks)
        assert resident.held_free() >= 0.75 * chunk * count
    finally:
        libc.free(pin)
        libc.free(more)
        free(holes)


def test_free_heap_never_written_is_not_counted_as_held():
    """Chunks a heap grew by and nothing wrote, freed, are free heap that was never resident:
    counted as held free, live() fell below what the process had in use by as much (a test
    that left 850 MiB of them behind turned the rest of its process's limits wrong). In a
    process of its own: the free heap earlier tests leave behind (a GPT-2 step's) gave the
    bound on what is newly held free 86 MiB of slack once."""
    import subprocess
    import sys
    from pathlib import Path

    if resident.heap() is None or resident.main_heap() is None:
        pytest.skip("not glibc on Linux: no heap statistics or main heap to read")
    here = str(Path(__file__).resolve().parent)
    done = subprocess.run([sys.executable, "-c", f"import sys; sys.path.insert(0, {here!r}); "
                           "import test_resident; test_resident.free_heap_check()"],
                          capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-3000:]


def free_heap_check():
    """test_free_heap_never_written_is_not_counted_as_held's body, in a fresh process."""
    import ctypes

    libc = ctypes.CDLL(None)
    libc.malloc.restype, libc.malloc.argtypes = ctypes.c_void_p, [ctypes.c_size_t]
    libc.free.argtypes = [ctypes.c_void_p]
    chunk, count = 64 << 10, 4096  # 256 MiB in chunks under glibc's mmap threshold
    holes = take_free_chunks(libc, chunk)  # (free chunks left resident by earlier work)
    before_live, before_free = resident.live(), resident.held_free()
    blocks = [libc.malloc(chunk) for _ in range(count)]
    pin = libc.malloc(chunk)  # above them: the heap's top cannot take them back
    try:
        for b in blocks:
            libc.free(b)
        assert resident.heap()["heap_free"] >= 0.9 * chunk * count  # glibc counts them free
        # (a margin for free fragments too small for the holes taken: resident, and newly
        # counted as the bytes in use fall)
        assert resident.held_free() - before_free < 64 * MiB
        assert resident.live() > before_live - 64 * MiB
    finally:
        libc.free(pin)
        for b in holes:
            libc.free(b)


@pytest.mark.parametrize("events, expected", [
    ([("trim", 30, 40), ("seen", 40)], 30),          # a trim: its pages are not resident
    ([("trim", 30, 40), ("seen", 10)], 10),          # reused: resident again
    ([("trim", 30, 40), ("seen", 10), ("seen", 40)], 10),  # freed again: resident
    ([("trim", 30, 40), ("seen", 10), ("trim", 30, 40)], 40),  # one trim's count, not two
])
def test_the_count_of_trimmed_bytes(events, expected):
    t = resident._Trimmed()
    for event in events:
        if event[0] == "trim":
            t.nbytes += event[1]
            t.seen(event[2])
        else:
            t.seen(event[1])
    assert t.nbytes == expected
