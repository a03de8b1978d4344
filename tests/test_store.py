"""The activation store (actcodec.store, csrc/store.c) from Python: blocks never overlap and
stay page-aligned, pages are reused and given back, and the torch adapters release everything
a step stored once its graph is gone, whatever happened in between."""
import gc
import threading

import numpy as np
import pytest
from hypothesis import given, strategies as st

from actcodec import store as stores
from actcodec._ext import Store

PAGE = 4096
MiB = 2**20


def pages(nbytes):
    return -(-nbytes // PAGE) * PAGE


@given(st.lists(st.tuples(st.booleans(), st.integers(1, 3 * MiB)), max_size=60))
def test_blocks_never_overlap_and_usage_is_exact(ops):
    s = Store(4 * MiB)
    live = []
    for is_alloc, n in ops:
        if is_alloc or not live:
            live.append(s.block(n))
            assert live[-1].address % PAGE == 0 and live[-1].nbytes == n
        else:
            live.pop(n % len(live))
        spans = sorted((b.address, b.address + pages(b.nbytes)) for b in live)
        assert all(end <= start for (_, end), (start, _) in zip(spans, spans[1:]))
        st_ = s.stats()
        assert st_["blocks"] == len(live)
        assert st_["used_bytes"] == sum(pages(b.nbytes) for b in live)
        assert st_["used_bytes"] <= st_["peak_used_bytes"] <= st_["mapped_bytes"]
    live.clear()
    assert s.stats()["used_bytes"] == 0 and s.stats()["blocks"] == 0


def test_blocks_hold_their_bytes_under_concurrent_use():
    s = Store(MiB)
    errors = []

    def worker(seed):
        rng = np.random.default_rng(seed)
        held = []
        for i in range(300):
            b = s.block(int(rng.integers(1, 300_000)))
            a = np.frombuffer(b, np.uint8)
            a[:] = seed
            held.append((a, seed))
            if len(held) > 8:
                a, v = held.pop(int(rng.integers(len(held))))
                if not (a == v).all():
                    errors.append(seed)
        for a, v in held:
            if not (a == v).all():
                errors.append(seed)

    threads = [threading.Thread(target=worker, args=(k,)) for k in range(1, 5)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert not errors
    gc.collect()
    assert s.stats()["blocks"] == 0 and s.stats()["used_bytes"] == 0


def test_pages_are_reused_and_given_back():
    s = Store(8 * MiB)
    first = [s.block(MiB) for _ in range(20)]  # 20 MiB: three regions
    addresses = [b.address for b in first]
    mapped = s.stats()["mapped_bytes"]
    del first
    again = [s.block(MiB) for _ in range(20)]  # the same step again: the same pages
    assert [b.address for b in again] == addresses
    assert s.stats()["mapped_bytes"] == mapped
    del again
    s.reset_peak()  # a new step: the last one's pages stay for it
    assert s.stats()["mapped_bytes"] == mapped
    b = s.block(MiB)  # it needs one block
    s.reset_peak()    # so at its end the store keeps what it needed and one grow step
    assert s.stats()["mapped_bytes"] <= 8 * MiB < mapped
    del b


def test_free_pages_below_a_live_block_are_given_back_on_request():
    """A reset gives back only the pages above the highest live block: the gradients a step
    leaves, made late in backward, keep what it freed below them resident. give_back_free
    returns those too (the meter's give_back calls it), and they stay usable."""
    s = Store(64 * MiB)
    low, high = s.block(8 * MiB), s.block(MiB)
    np.frombuffer(low, np.uint8)[:] = 1
    np.frombuffer(high, np.uint8)[:] = 2
    del low
    s.reset_peak()
    s.reset_peak()
    assert s.stats()["mapped_bytes"] == 9 * MiB
    assert s.give_back_free() == 8 * MiB
    assert s.stats()["mapped_bytes"] == s.stats()["used_bytes"] == MiB
    assert s.give_back_free() == 0
    assert (np.frombuffer(high, np.uint8) == 2).all()
    again = s.block(3 * MiB)
    np.frombuffer(again, np.uint8)[:] = 3
    assert s.stats()["mapped_bytes"] == 4 * MiB
    del again, high


def test_a_block_is_a_writable_buffer():
    s = Store()
    b = s.block(3 * PAGE + 5)
    a = np.frombuffer(b, np.uint8)
    a[:] = 7
    assert memoryview(b).nbytes == 3 * PAGE + 5 and not memoryview(b).readonly
    assert s.stats()["used_bytes"] == 4 * PAGE
    assert s.block(0).nbytes == 0


def test_store_alloc_keeps_exact_payloads_in_the_store():
    s = Store()
    alloc = stores.StoreAlloc(s)
    arr = alloc(10_000)
    assert arr.dtype == np.uint8 and arr.size == 10_000 and s.stats()["used_bytes"] == 3 * PAGE
    worst = alloc.scratch(10 * PAGE)          # sized for the worst case: not in the store
    assert s.stats()["blocks"] == 1
    worst[:100] = np.arange(100)
    cut = alloc.shrink(worst, 100)            # the cut is copied in, one page
    assert np.array_equal(cut, np.arange(100)) and s.stats()["used_bytes"] == 4 * PAGE


def test_impossible_sizes_raise():
    with pytest.raises(MemoryError):
        Store().block(2**62)


def test_default_store_is_one_per_process():
    assert stores.default() is stores.default()
