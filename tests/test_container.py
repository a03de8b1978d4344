"""The byte format: round trips, and corrupted input that must only ever raise ValueError."""
import struct

import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st

import actcodec
import reference as ref
from actcodec import _ext


def _sample_encodings():
    rng = np.random.default_rng(3)
    relu = np.maximum(rng.standard_normal((7, 9)), 0)
    return [
        actcodec.bitmap.encode(relu.astype(np.float32)),
        actcodec.bitmap.encode(relu.astype(np.float16).reshape(-1)),
        actcodec.bitmap.encode(relu),
        actcodec.bitmap.encode(np.zeros(0, np.float32)),
        actcodec.raw.encode(relu.astype(np.float32)),
        actcodec.quant.encode(relu.astype(np.float32) - 0.5, 2, group_size=32),
        actcodec.quant.encode(np.where(relu > 1, np.nan, relu), 4, nonfinite="keep"),
        actcodec.bitmap_quant.encode(relu.astype(np.float16), 8, group_size=32),
        actcodec.mask.encode(relu > 0.5),
        actcodec.mask.encode(np.where(relu > 0.5, 2.0, 0.0).astype(np.float32)),
    ]


SAMPLES = [e.to_bytes() for e in _sample_encodings()]


def _decode_or_valueerror(data):
    """The only acceptable outcomes for arbitrary bytes: a decoded array, or ValueError."""
    try:
        actcodec.from_bytes(data).decode()
    except ValueError:
        pass


def resign(data: bytearray) -> bytes:
    """Recompute the checksums of a (mutated) encoding so corruption reaches the semantic
    checks behind them. Leaves data alone where its lengths do not even fit."""
    ndim, nbuf = data[7], data[8]
    plen = int.from_bytes(data[12:16], "little")
    hlen = 16 + 8 * ndim + plen + 16 * nbuf + 8
    if hlen > len(data):
        return bytes(data)
    pos, off = hlen - 8 - 16 * nbuf, hlen
    for _ in range(nbuf):
        n = int.from_bytes(data[pos:pos + 8], "little")
        if off + n <= len(data):
            data[pos + 8:pos + 16] = _ext.checksum64(bytes(data[off:off + n])).to_bytes(8, "little")
        off, pos = off + n, pos + 16
    data[hlen - 8:hlen] = _ext.checksum64(bytes(data[:hlen - 8])).to_bytes(8, "little")
    return bytes(data)


def test_roundtrip_all_samples():
    for enc in _sample_encodings():
        back = actcodec.from_bytes(enc.to_bytes())
        assert (back.codec, back.dtype, back.shape, back.params) == \
            (enc.codec, enc.dtype, enc.shape, enc.params)
        assert back.decode().tobytes() == enc.decode().tobytes()
        assert back.nbytes == enc.nbytes


def test_resign_is_identity_on_valid_data():
    for data in SAMPLES:
        assert resign(bytearray(data)) == data


def test_every_truncation_raises():
    data = SAMPLES[0]
    for cut in range(len(data)):
        with pytest.raises(ValueError):
            actcodec.from_bytes(data[:cut])


def test_every_single_bit_flip_raises():
    data = SAMPLES[1]
    for i in range(len(data) * 8):
        bad = bytearray(data)
        bad[i // 8] ^= 1 << (i % 8)
        with pytest.raises(ValueError):
            actcodec.from_bytes(bytes(bad))


def test_trailing_bytes_raise():
    with pytest.raises(ValueError, match="length mismatch"):
        actcodec.from_bytes(SAMPLES[0] + b"\0")


@given(st.sampled_from(SAMPLES), st.data(), st.booleans())
def test_fuzz_mutations_only_raise_valueerror(data, draw, resigned):
    bad = bytearray(data)
    for _ in range(draw.draw(st.integers(1, 4))):
        kind = draw.draw(st.sampled_from(["flip", "byte", "cut", "insert", "delete", "u64"]))
        i = draw.draw(st.integers(0, max(len(bad) - 1, 0)))
        if kind == "flip" and bad:
            bad[i] ^= 1 << draw.draw(st.integers(0, 7))
        elif kind == "byte" and bad:
            bad[i] = draw.draw(st.integers(0, 255))
        elif kind == "cut":
            del bad[i:]
        elif kind == "insert":
            bad[i:i] = draw.draw(st.binary(min_size=1, max_size=16))
        elif kind == "delete":
            del bad[i:i + draw.draw(st.integers(1, 16))]
        elif kind == "u64" and len(bad) >= i + 8:
            bad[i:i + 8] = draw.draw(st.sampled_from(
                [0, 1, 2**31, 2**32 + 1, 2**63, 2**64 - 1])).to_bytes(8, "little")
    if resigned and len(bad) >= 16:
        bad = bytearray(resign(bad))
    _decode_or_valueerror(bytes(bad))


def _field(data, fmt, offset, value):
    bad = bytearray(data)
    struct.pack_into(fmt, bad, offset, value)
    return resign(bad)


# A float32 bitmap encoding of shape (7, 9): header fields at known offsets.
BITMAP = SAMPLES[0]
SHAPE0, PARAMS = 16, 32  # shape dims at 16 and 24, then the 8-byte prune parameter
BUFS = PARAMS + 8        # (length, checksum) of the bitmap, then of the values


@pytest.mark.parametrize("offset,fmt,value,message", [
    (0, "<4s", b"ACTX", "magic"),
    (4, "<B", 2, "version"),
    (5, "<B", 99, "codec id"),
    (6, "<B", 99, "dtype id"),
    (10, "<B", 1, "reserved"),
    (SHAPE0, "<Q", 2**63, "bitmap has"),
    (SHAPE0, "<Q", 8, "bitmap has"),
    (PARAMS, "<d", float("nan"), "prune"),
    (PARAMS, "<d", -1.0, "prune"),
    (BUFS, "<Q", 7, "length mismatch"),
])
def test_semantic_corruption_has_clear_message(offset, fmt, value, message):
    with pytest.raises(ValueError, match=message):
        actcodec.from_bytes(_field(BITMAP, fmt, offset, value))


def test_absurd_header_counts():
    for offset, value, message in [(7, 33, "ndim"), (8, 17, "buffers"), (12, 5000, "parameter")]:
        bad = bytearray(BITMAP)
        struct.pack_into("<I" if offset == 12 else "<B", bad, offset, value)
        with pytest.raises(ValueError, match=message):
            actcodec.from_bytes(bytes(bad))


def test_absurd_shape_in_quantized_encodings():
    """Found by the fuzzer: a shape beyond size_t must be a ValueError, not an OverflowError."""
    for data in SAMPLES:
        bad = bytearray(data)
        if bad[7] == 0:
            continue
        struct.pack_into("<Q", bad, 16, 2**63 + 12345)
        with pytest.raises(ValueError):
            actcodec.from_bytes(resign(bad))


def test_python_size_formulas_match_c():
    from actcodec import quant
    for count in [0, 1, 31, 32, 33, 255, 256, 257, 1000, 65536, 10**6 + 7]:
        for bits in (1, 2, 4, 8):
            assert quant.packed_nbytes(count, bits) == _ext.quant_packed_nbytes(count, bits)
        for group in (None, 32, 33, 256, 65536):
            assert quant.ngroups(count, group) == _ext.quant_ngroups(count, group or 0)


def test_bitmap_inconsistent_with_values():
    hlen = len(BITMAP) - sum(b.nbytes for b in actcodec.from_bytes(BITMAP).buffers)
    bad = bytearray(BITMAP)
    bad[hlen] ^= 0x01  # flip a bitmap bit: popcount no longer matches the values
    with pytest.raises(ValueError, match="nonzero elements"):
        actcodec.from_bytes(resign(bad))


def test_padding_bits_must_be_zero():
    x = np.zeros(9, np.float32)  # 9 elements: 7 padding bits in the second bitmap byte
    x[0] = 1.0
    data = actcodec.bitmap.encode(x).to_bytes()
    enc = actcodec.from_bytes(data)
    hlen = len(data) - enc.nbytes
    bad = bytearray(data)
    bad[hlen + 1] |= 0x80           # a set padding bit ...
    bad[hlen] &= 0xFE               # ... with the element bit cleared keeps the count
    with pytest.raises(ValueError, match="corrupted"):
        actcodec.from_bytes(resign(bad))


def test_c_decoder_checks_counts_itself():
    """The binding is reachable without from_bytes; the C core must still refuse lies."""
    bitmap = np.array([0xFF], np.uint8)
    out = np.empty(8 * 4, np.uint8)
    with pytest.raises(ValueError, match="corrupted"):
        _ext.bitmap_decode(bitmap, np.zeros(4 * 7, np.uint8), 4, out)
    with pytest.raises(ValueError):
        _ext.bitmap_decode(np.zeros(2, np.uint8), np.zeros(0, np.uint8), 4, out)


def test_from_bytes_type_error():
    with pytest.raises(TypeError, match="bytes-like"):
        actcodec.from_bytes(12345)


@given(st.binary(max_size=200))
def test_checksum_matches_reference(data):
    assert _ext.checksum64(data) == ref.checksum64(data)
    assert _ext.checksum64(data, 5) == ref.checksum64(data, 5)


def test_quantized_metadata_corruption():
    """Resigned encodings whose group metadata decode to garbage are refused."""
    data = actcodec.quant.encode(np.linspace(-1, 1, 64, dtype=np.float32), 4, group_size=32).to_bytes()
    enc = actcodec.from_bytes(data)
    hlen = len(data) - enc.nbytes
    mins_at = hlen + enc.buffers[0].nbytes
    scales_at = mins_at + enc.buffers[1].nbytes
    for at, value in [(mins_at, np.nan), (scales_at, -1.0), (scales_at, np.inf), (mins_at, 3e38)]:
        bad = bytearray(data)
        bad[at:at + 4] = np.float32(value).tobytes()
        if value == 3e38:
            bad[scales_at:scales_at + 4] = np.float32(1e37).tobytes()
        with pytest.raises(ValueError, match="mins/scales"):
            actcodec.from_bytes(resign(bad))


@pytest.mark.parametrize("codec", [
    actcodec.Bitmap(), actcodec.Bitmap(prune=0.25), actcodec.Raw(), actcodec.Quant(8),
    actcodec.Quant(2, group_size=None, rounding="stochastic", seed=3), actcodec.BitmapQuant(4),
    actcodec.Auto(), actcodec.Auto(bits=4)])
def test_numcodecs_style_codec(codec):
    x = np.maximum(np.random.default_rng(4).standard_normal((16, 16)), 0).astype(np.float32)
    data = codec.encode(x)
    assert isinstance(data, bytes)
    back = codec.decode(data)
    config = codec.get_config()
    if "bits" in config and config["bits"] is not None:
        assert np.abs(back - x).max() < 0.5 ** config["bits"] * 8
    else:
        want = x if config.get("prune", 0) == 0 else np.where(x < 0.25, 0, x)
        np.testing.assert_array_equal(back, want)
    clone = type(codec).from_config(codec.get_config())
    assert clone == codec
    out = np.empty_like(x)
    assert codec.decode(data, out=out) is out
    if not isinstance(codec, actcodec.Auto):
        other = actcodec.Raw() if not isinstance(codec, actcodec.Raw) else actcodec.Bitmap()
        with pytest.raises(ValueError, match="cannot decode"):
            other.decode(data)
    with pytest.raises(ValueError, match="config is for"):
        type(codec).from_config({"id": "something.else"})
