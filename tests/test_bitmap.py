"""Sparse bitmap codec against the packbits/boolean-indexing reference, on every SIMD path
and thread count."""
import subprocess
import sys

import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st

import actcodec
import reference as ref
from strategies import ITEMSIZE, as_dtype, bit_arrays


def _check_roundtrip(name, bits, prune=0.0, opts=None):
    opts = opts or {}
    x, tag = as_dtype(name, bits)
    enc = actcodec.bitmap.encode(x, prune=prune, dtype=tag, **opts)
    thr = actcodec._dtypes.prune_abs_bits(prune, name)
    want_bitmap, want_values = ref.bitmap_encode(bits, thr)
    assert enc.buffers[0].tobytes() == want_bitmap.tobytes()
    assert enc.buffers[1].tobytes() == want_values.tobytes()
    assert enc.nbytes == want_bitmap.nbytes + want_values.nbytes
    back = enc.decode(**opts).reshape(-1).view(bits.dtype)
    want = ref.bitmap_decode(want_bitmap, want_values, bits.size, bits.itemsize)
    assert back.tobytes() == want.tobytes()
    if prune == 0.0:
        assert back.tobytes() == bits.tobytes()  # bit-exact, -0.0 and NaN payloads included
    return enc


@given(bit_arrays())
def test_matches_reference_every_path(opts, case):
    _check_roundtrip(*case, opts=opts)


@given(bit_arrays(), st.sampled_from([1e-30, 1e-6, 0.01, 0.5, 1.0, 3.0, 1e4, 1e300]))
def test_prune_matches_value_semantics(opts, case, t):
    name, bits = case
    enc = _check_roundtrip(name, bits, prune=t, opts=opts)
    back = enc.decode().reshape(-1).view(bits.dtype)
    assert back.tobytes() == ref.prune_by_value(bits.view(
        np.uint16 if name == "bfloat16" else name), t, name).tobytes()


# Large arrays cross block and thread boundaries (blocks are 128 KiB of input).
@pytest.mark.parametrize("name", ["float16", "float32", "float64"])
@pytest.mark.parametrize("p_zero", [0.0, 0.1, 0.5, 0.9, 1.0])
def test_large_arrays_cross_thread_splits(opts, name, p_zero):
    rng = np.random.default_rng(int(p_zero * 10))
    n = 1_000_003 if name != "float64" else 400_001
    x = rng.standard_normal(n).astype(name)
    x[rng.random(n) < p_zero] = 0
    _check_roundtrip(name, x.view(ref.UINT[x.itemsize]), opts=opts)


def test_all_paths_give_identical_bytes():
    rng = np.random.default_rng(7)
    x = np.maximum(rng.standard_normal(300_017, dtype=np.float32), 0)
    outputs = set()
    for path in actcodec.simd_info()["available"]:
        for threads in (1, 2):
            outputs.add(actcodec.bitmap.encode(x, threads=threads, simd=path).to_bytes())
    assert len(outputs) == 1


@pytest.mark.parametrize("view", [
    lambda a: a[::2], lambda a: a[::-1], lambda a: a.reshape(40, 25).T,
    lambda a: a.reshape(40, 25)[:, 3:17], lambda a: a[5:5],
])
def test_non_contiguous_input(view):
    base = np.maximum(np.random.default_rng(1).standard_normal(1000, dtype=np.float32), 0)
    x = view(base)
    enc = actcodec.bitmap.encode(x)
    assert enc.shape == x.shape
    np.testing.assert_array_equal(enc.decode(), x)


def test_shapes_and_scalars():
    for shape in [(), (0,), (3, 0, 2), (1,), (2, 3, 4)]:
        x = np.arange(int(np.prod(shape)), dtype=np.float32).reshape(shape)
        back = actcodec.bitmap.encode(x).decode()
        assert back.shape == x.shape and back.dtype == x.dtype
        np.testing.assert_array_equal(back, x)


def test_bfloat16_ml_dtypes_and_tag():
    import ml_dtypes
    x = np.array([0, 1.5, -0.0, np.nan, 0, -3], dtype=ml_dtypes.bfloat16)
    enc = actcodec.bitmap.encode(x)
    assert enc.dtype == "bfloat16"
    assert enc.decode().tobytes() == x.tobytes()
    tagged = actcodec.bitmap.encode(x.view(np.uint16), dtype="bfloat16")
    assert tagged.to_bytes() == enc.to_bytes()


def test_decode_into_out():
    x = np.maximum(np.random.default_rng(2).standard_normal((64, 33)), 0).astype(np.float32)
    enc = actcodec.bitmap.encode(x)
    out = np.full_like(x, 7.0)
    assert enc.decode(out=out) is out
    np.testing.assert_array_equal(out, x)
    with pytest.raises(ValueError, match="shape"):
        enc.decode(out=np.empty((33, 64), np.float32))
    with pytest.raises(TypeError, match="dtype"):
        enc.decode(out=np.empty((64, 33), np.float64))
    with pytest.raises(ValueError, match="contiguous"):
        enc.decode(out=np.empty((64, 66), np.float32)[:, ::2])
    ro = np.empty_like(x)
    ro.flags.writeable = False
    with pytest.raises(ValueError, match="read-only"):
        enc.decode(out=ro)


@pytest.mark.parametrize("bad", [np.arange(4, dtype=np.int32), np.zeros(2, np.complex64),
                                 np.zeros(4, np.uint8), np.array(["a"]), np.zeros(3, object)])
def test_wrong_dtype_is_a_clear_error(bad):
    with pytest.raises(TypeError, match="unsupported dtype"):
        actcodec.bitmap.encode(bad)


def test_bool_takes_the_mask_codec_not_the_bitmap():
    with pytest.raises(TypeError, match="the bitmap codec encodes float16"):
        actcodec.bitmap.encode(np.zeros(3, bool))


@pytest.mark.parametrize("prune", [-1.0, float("nan"), float("inf")])
def test_bad_prune_threshold(prune):
    with pytest.raises(ValueError, match="prune"):
        actcodec.Bitmap(prune=prune)
    if prune != float("inf"):
        with pytest.raises(ValueError, match="prune"):
            actcodec.bitmap.encode(np.ones(3, np.float32), prune=prune)


def test_bad_dtype_tag():
    with pytest.raises(TypeError, match="uint16"):
        actcodec.bitmap.encode(np.ones(3, np.float32), dtype="bfloat16")
    with pytest.raises(ValueError, match="tag"):
        actcodec.bitmap.encode(np.ones(3, np.uint16), dtype="int4")


def test_compressed_size_is_exact():
    x = np.zeros(1001, np.float32)
    x[::4] = 1.0
    enc = actcodec.bitmap.encode(x)
    assert enc.nbytes == 126 + 251 * 4
    assert enc.buffers[1].base is None or enc.buffers[1].nbytes == 251 * 4


def _run(code, **env):
    import os
    full = {**os.environ, **env}
    return subprocess.run([sys.executable, "-c", code], env=full, capture_output=True, text=True)


def test_env_override_selects_path_and_threads():
    for path in actcodec.simd_info()["available"]:
        r = _run("import actcodec; print(actcodec.get_simd(), actcodec.get_num_threads())",
                 ACTCODEC_SIMD=path, ACTCODEC_NUM_THREADS="1")
        assert r.returncode == 0, r.stderr
        assert r.stdout.split() == [path, "1"]


def _unavailable_path():
    known = ["scalar", "sse2", "avx2", "neon"]
    return next(p for p in known if p not in actcodec.simd_info()["available"])


@pytest.mark.parametrize("kind", ["unknown", "unavailable"])
def test_env_override_bad_path_is_a_clear_error(kind):
    value = "avx512" if kind == "unknown" else _unavailable_path()
    r = _run("import actcodec", ACTCODEC_SIMD=value)
    assert r.returncode != 0
    assert "ACTCODEC_SIMD" in r.stderr and value in r.stderr


def test_set_simd_and_threads_errors():
    with pytest.raises(ValueError, match="unknown SIMD path"):
        actcodec.set_simd("avx9000")
    with pytest.raises(ValueError, match="threads must be an int from 1 to 1024"):
        actcodec.set_num_threads(0)
    with pytest.raises(ValueError, match="threads must be"):
        actcodec.bitmap.encode(np.ones(3, np.float32), threads=True)


def test_simd_info():
    info = actcodec.simd_info()
    assert "scalar" in info["available"]
    assert info["default"] in info["available"] and info["best"] in info["available"]
    assert info["threads"] >= 1
    if "avx2" in info["features"]:
        assert "avx2" in info["available"]
