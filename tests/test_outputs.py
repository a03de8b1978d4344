"""Large decode outputs in mappings of their own (actcodec._outputs, csrc/pages.c): the arrays
behave as numpy's own, decoding into them gives the same bytes, and the memory goes back to the
system with the last array on it."""
import gc

import numpy as np
import pytest

import actcodec
from actcodec import _ext, _outputs


def owner(a):
    """The object at the bottom of an array's base chain (through a memoryview)."""
    while isinstance(a, np.ndarray):
        a = a.base
    return a.obj if isinstance(a, memoryview) else a


def test_small_arrays_come_from_numpy():
    a = _outputs.empty((3, 5), np.float32)
    assert a.base is None and a.shape == (3, 5) and a.dtype == np.float32


@pytest.mark.parametrize("shape", [(0,), (1,), (7, 3), (4096,)])
def test_own_mapping_for_any_size_when_asked(monkeypatch, shape):
    monkeypatch.setattr(_outputs, "OWN_MAPPING_BYTES", 0)
    a = _outputs.empty(shape, np.float64)
    assert a.shape == shape and a.dtype == np.float64
    assert a.flags.c_contiguous and a.flags.writeable and a.flags.aligned
    if a.size:
        assert isinstance(owner(a), _ext.PageBuffer)
        a[...] = 2.5
        assert (a == 2.5).all()


def test_large_arrays_get_their_own_mapping():
    a = _outputs.empty(_outputs.OWN_MAPPING_BYTES // 4, np.float32)
    assert isinstance(owner(a), _ext.PageBuffer)
    assert a.ctypes.data % 4096 == 0
    a[:] = 1.0
    assert float(a.sum(dtype=np.float64)) == a.size


def test_page_buffer_rejects_nothing_it_cannot_map():
    with pytest.raises(MemoryError):
        _ext.PageBuffer(0)


@pytest.mark.parametrize("codec", ["bitmap", "quant", "bitmap_quant", "raw"])
def test_decode_into_own_mapping_is_identical(monkeypatch, codec):
    rng = np.random.default_rng(0)
    x = np.maximum(rng.standard_normal((33, 257)).astype(np.float32), 0)
    kw = {} if codec in ("bitmap", "raw") else {"bits": 4}
    enc = actcodec.encode(x, codec, **kw)
    want = enc.decode()
    monkeypatch.setattr(_outputs, "OWN_MAPPING_BYTES", 0)
    got = enc.decode()
    assert isinstance(owner(got), _ext.PageBuffer)
    assert got.tobytes() == want.tobytes() and got.shape == want.shape


def test_mapping_is_freed_with_the_last_array():
    a = _outputs.empty(_outputs.OWN_MAPPING_BYTES // 8, np.float64)
    view = a[10:20]
    buf = owner(a)
    import weakref
    ref = weakref.ref(buf)
    del a, buf
    gc.collect()
    assert ref() is not None  # the view still holds it
    del view
    gc.collect()
    assert ref() is None


def test_torch_decode_sits_on_own_mapping(monkeypatch):
    torch = pytest.importorskip("torch")
    from actcodec.torch import bridge
    monkeypatch.setattr(_outputs, "OWN_MAPPING_BYTES", 0)
    for dtype in (torch.float32, torch.bfloat16, torch.float16):
        t = torch.randn(17, 33).to(dtype)
        back = bridge.decode_tensor(bridge.encode_tensor(t, "bitmap"))
        assert back.dtype == dtype and back.shape == t.shape
        assert torch.equal(back.view(torch.int16) if dtype != torch.float32 else back,
                           t.view(torch.int16) if dtype != torch.float32 else t)


def test_threshold_knob(monkeypatch):
    monkeypatch.setattr(_outputs, "OWN_MAPPING_BYTES", _outputs.OWN_MAPPING_BYTES)
    actcodec.set_own_mapping_bytes(None)
    assert actcodec.get_own_mapping_bytes() is None
    assert not isinstance(owner(_outputs.empty(1 << 23, np.float32)), _ext.PageBuffer)
    actcodec.set_own_mapping_bytes(1024)
    assert isinstance(owner(_outputs.empty(256, np.float32)), _ext.PageBuffer)
    for bad in (-1, 1.5, True, "32"):
        with pytest.raises(ValueError):
            actcodec.set_own_mapping_bytes(bad)


def test_reused_regime_leaves_outputs_to_glibc():
    from actcodec import benchmark
    before = actcodec.get_own_mapping_bytes()
    with benchmark.memory_regime("reused"):
        assert actcodec.get_own_mapping_bytes() is None
    assert actcodec.get_own_mapping_bytes() == before


@pytest.mark.parametrize("zeros", [0.0, 0.5, 1.0])
@pytest.mark.parametrize("dtype", [np.float16, np.float32, np.float64])
def test_bitmap_encode_into_own_mapping_is_identical(monkeypatch, zeros, dtype):
    """Encoded values in a mapping of their own, cut to what was written: the same bytes as
    numpy's buffer, and the mapping holds exactly the values."""
    rng = np.random.default_rng(1)
    x = rng.standard_normal(50_001).astype(dtype)
    x[rng.random(x.size) < zeros] = 0
    want = actcodec.bitmap.encode(x)
    monkeypatch.setattr(_outputs, "OWN_MAPPING_BYTES", 0)
    got = actcodec.bitmap.encode(x)
    _, values = got.buffers
    if np.count_nonzero(x):
        assert isinstance(owner(values), _ext.PageBuffer)
        assert len(memoryview(owner(values))) == values.nbytes
    assert got.to_bytes() == want.to_bytes() and got.nbytes == want.nbytes
    np.testing.assert_array_equal(got.decode(), x)


def test_bitmap_encode_below_threshold_uses_numpy(monkeypatch):
    x = np.ones(1000, np.float32)
    monkeypatch.setattr(_outputs, "OWN_MAPPING_BYTES", x.nbytes + 1)
    _, values = actcodec.bitmap.encode(x).buffers
    assert not isinstance(owner(values), _ext.PageBuffer)


def test_threshold_beyond_size_t_means_never(monkeypatch):
    """A threshold no array reaches, even one past size_t, leaves encode to numpy."""
    monkeypatch.setattr(_outputs, "OWN_MAPPING_BYTES", 2**64)
    _, values = actcodec.bitmap.encode(np.ones(1 << 16, np.float32)).buffers
    assert not isinstance(owner(values), _ext.PageBuffer)
    assert not isinstance(owner(_outputs.empty(1 << 16, np.float32)), _ext.PageBuffer)
