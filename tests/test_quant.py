"""Dynamic k-bit quantization against the numpy statement of the same math, on every SIMD path,
thread count and code<->float conversion; error bounds, unbiasedness, non-finite handling."""
import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st

import actcodec
import reference as ref
from strategies import DTYPES, as_dtype

BITS = [1, 2, 4, 8]


@pytest.fixture(params=[True, False], ids=["bittrick", "cast"])
def conversion(request):
    """The code <-> float conversion, a per-call option like the path and threads."""
    return request.param


@st.composite
def float_arrays(draw, max_len=3000):
    """(dtype name, bit patterns) of finite values: mixed magnitudes, constant runs, zeros."""
    name = draw(st.sampled_from(DTYPES))
    n = draw(st.one_of(st.integers(0, 70), st.sampled_from([255, 256, 257, 511, 4095, 4097]),
                       st.integers(0, max_len)))
    rng = np.random.default_rng(draw(st.integers(0, 2**32 - 1)))
    kind = draw(st.sampled_from(["normal", "wide", "constant", "relu", "tiny", "ties"]))
    if kind == "normal":
        x = rng.standard_normal(n) * draw(st.sampled_from([1e-3, 1.0, 50.0]))
    elif kind == "wide":
        x = rng.standard_normal(n) * 10.0 ** rng.integers(-4, 4, n)
    elif kind == "constant":
        x = np.full(n, draw(st.sampled_from([0.0, -0.0, 1.5, -3.25e4])))
    elif kind == "relu":
        x = np.maximum(rng.standard_normal(n), 0)
    elif kind == "tiny":
        x = rng.standard_normal(n) * 1e-40  # float32 subnormals (zero in float16)
    else:  # integer-spaced values make exact ties t = k + 0.5 likely
        x = rng.integers(-8, 8, n) * 0.5
    if name == "bfloat16":
        f = x.astype(np.float32).view(np.uint32)
        return name, (f >> np.uint32(16)).astype(np.uint16)
    with np.errstate(over="ignore"):
        arr = x.astype(name)
    arr[~np.isfinite(arr)] = 0
    return name, arr.view(ref.UINT[arr.itemsize])


GROUPS = st.sampled_from([32, 33, 100, 256, 1000, 65536, None])


def _check(name, bits, nbits, group, rounding, seed, opts=None, bittrick=None):
    opts = opts or {}
    x, tag = as_dtype(name, bits)
    enc = actcodec.quant.encode(x, nbits, group_size=group, rounding=rounding, seed=seed,
                                dtype=tag, bittrick=bittrick, **opts)
    codes, mins, scales = ref.quant_encode(bits, name, nbits, group, rounding, seed)
    packed = ref.quant_pack(codes, nbits) if bits.size else np.zeros(0, np.uint8)
    assert enc.buffers[0].tobytes() == packed.tobytes()
    assert enc.buffers[1].tobytes() == mins.tobytes()
    assert enc.buffers[2].tobytes() == scales.tobytes()
    want32 = ref.quant_decode(codes, mins, scales, group, bits.size)
    got32 = enc.decode(dtype="float32", **opts).reshape(-1)
    assert got32.tobytes() == want32.tobytes()
    got = enc.decode(**opts).reshape(-1).view(bits.dtype)
    assert got.tobytes() == ref.from_f32(want32, name).tobytes()
    return enc, want32


@given(float_arrays(), st.sampled_from(BITS), GROUPS, st.sampled_from(["nearest", "stochastic"]),
       st.integers(0, 2**64 - 1))
def test_matches_reference_every_path(opts, conversion, case, nbits, group, rounding, seed):
    _check(*case, nbits, group, rounding, seed, opts, conversion)


@pytest.mark.parametrize("nbits", BITS)
@pytest.mark.parametrize("group", [256, 1000, None])
@pytest.mark.parametrize("rounding", ["nearest", "stochastic"])
def test_large_arrays_cross_threads(opts, nbits, group, rounding):
    rng = np.random.default_rng(nbits)
    x = (rng.standard_normal(300_001) * 3).astype(np.float32)
    _check("float32", x.view(np.uint32), nbits, group, rounding, 12345, opts)


@pytest.mark.parametrize("nbits,group,rounding", [(2, 256, "stochastic"), (8, 64, "nearest"),
                                                  (4, 1024, "nearest")])
def test_inputs_from_16_mib_take_short_tiles(opts, nbits, group, rounding):
    # 16 MiB of input and more is encoded in shorter tiles: the bytes must not change.
    rng = np.random.default_rng(nbits)
    x = (rng.standard_normal((16 << 20) // 4 + 1001) * 3).astype(np.float32)
    _check("float32", x.view(np.uint32), nbits, group, rounding, 777, opts)


@given(float_arrays(), st.sampled_from(BITS), GROUPS, st.sampled_from(["nearest", "stochastic"]))
def test_error_bound(case, nbits, group, rounding):
    name, bits = case
    x32 = ref.to_f32(bits, name).astype(np.float64)
    x, tag = as_dtype(name, bits)
    enc = actcodec.quant.encode(x, nbits, group_size=group, rounding=rounding, dtype=tag)
    y = enc.decode(dtype="float32").reshape(-1).astype(np.float64)
    if not bits.size:
        return
    G = group or bits.size
    scale = enc.buffers[2].view("<f4").astype(np.float64)[np.arange(bits.size) // G]
    mn = enc.buffers[1].view("<f4").astype(np.float64)[np.arange(bits.size) // G]
    # float32 rounding of (x - mn) * inv and of mn + c * scale: a few ulps of the magnitudes.
    slop = 4 * np.finfo(np.float32).eps * (np.abs(mn) + np.abs(x32) + scale * 2**nbits)
    err = np.abs(y - x32)
    if rounding == "nearest":
        assert (err <= scale / 2 + slop).all()
    else:  # strictly below scale; a constant group (scale 0) is exact
        assert ((err < scale + slop) | (err == 0)).all()


@pytest.mark.parametrize("name", DTYPES)
@pytest.mark.parametrize("nbits", BITS)
def test_constant_and_zero_groups_exact(name, nbits):
    for value in [0.0, 1.5, -2.0, 1e-3]:
        bits = np.full(1000, value, np.float32)
        if name == "bfloat16":
            bits = (bits.view(np.uint32) >> np.uint32(16)).astype(np.uint16)
        else:
            bits = bits.astype(name).view(ref.UINT[np.dtype(name).itemsize])
        x, tag = as_dtype(name, bits)
        enc = actcodec.quant.encode(x, nbits, group_size=64, dtype=tag)
        assert enc.decode().reshape(-1).view(bits.dtype).tobytes() == bits.tobytes()


def test_stochastic_rounding_is_unbiased():
    """Mean of the decoded values over 256 seeds converges to x. Each decoded value is
    floor(t)+{0,1} times scale with P(up) = frac(t) (to 2^-24 plus float32 rounding), so its
    error has mean ~0 and standard deviation <= scale/2. Over S = 256 seeds the per-element mean
    error has sd <= scale/32: we allow 5 sd (scale * 0.16) per element, a tail probability of
    ~6e-7 each, ~0.2% for all 4096 elements under independence; the seeds are fixed, so the
    outcome is deterministic. The grand mean over all elements (sd <= scale/2048) gets 5 sd."""
    rng = np.random.default_rng(0)
    x = rng.uniform(-1, 1, 4096).astype(np.float32)
    seeds = range(1000, 1256)
    acc = np.zeros(x.size)
    scale = None
    for s in seeds:
        enc = actcodec.quant.encode(x, 2, group_size=None, rounding="stochastic", seed=s)
        acc += enc.decode().astype(np.float64)
        scale = float(enc.buffers[2].view("<f4")[0])
    mean_err = acc / len(seeds) - x
    assert np.abs(mean_err).max() <= 5 * scale / 32
    assert abs(mean_err.mean()) <= 5 * scale / 2048
    # and nearest rounding of the same data is biased where frac(t) != 1/2: stochastic is not
    near = actcodec.quant.encode(x, 2, group_size=None).decode().astype(np.float64) - x
    assert np.abs(near).mean() > 10 * np.abs(mean_err).mean()


def test_stochastic_draws_match_reference():
    idx = np.array([0, 1, 2, 2**32 - 1, 2**32, 2**40 + 7, 2**64 - 1], np.uint64)
    for seed in [0, 1, 2**63 + 5]:
        want = ref.uniform(seed, idx)
        got = np.array([actcodec._ext.uniform(seed, int(i)) for i in idx], np.float32)
        assert got.tobytes() == want.tobytes()
        assert (got >= 0).all() and (got < 1).all()


def test_different_seeds_give_different_codes():
    x = np.random.default_rng(1).standard_normal(10_000).astype(np.float32)
    a = actcodec.quant.encode(x, 2, rounding="stochastic", seed=1).buffers[0]
    b = actcodec.quant.encode(x, 2, rounding="stochastic", seed=2).buffers[0]
    c = actcodec.quant.encode(x, 2, rounding="stochastic", seed=1).buffers[0]
    assert a.tobytes() != b.tobytes() and a.tobytes() == c.tobytes()


@pytest.mark.parametrize("bad,index", [(np.nan, 5), (np.inf, 700), (-np.inf, 0)])
def test_nonfinite_raises_with_first_index(opts, bad, index):
    x = np.zeros(300_000, np.float32)
    x[index] = bad
    x[200_000] = np.nan
    with pytest.raises(actcodec.NonFiniteError, match=f"element {index} ") as info:
        actcodec.quant.encode(x, 4, **opts)
    assert info.value.index == index


def test_float64_beyond_float32_range_is_nonfinite():
    x = np.ones(10)
    x[3] = 1e39
    with pytest.raises(ValueError, match="element 3 "):
        actcodec.quant.encode(x, 8)


def test_group_range_overflow_is_reported():
    x = np.array([-3e38, 3e38] + [0.0] * 62, np.float32)
    with pytest.raises(ValueError, match="element 0 "):
        actcodec.quant.encode(x, 8, group_size=64)


@pytest.mark.parametrize("name", DTYPES)
def test_nonfinite_keep_escapes_exactly(name):
    x = np.random.default_rng(2).standard_normal(5000).astype(np.float32)
    x[[3, 100, 4999]] = [np.nan, np.inf, -np.inf]
    if name == "bfloat16":
        bits = (x.view(np.uint32) >> np.uint32(16)).astype(np.uint16)
        arr, tag = bits, "bfloat16"
    else:
        arr, tag = x.astype(name), None
        bits = arr.view(ref.UINT[arr.itemsize])
    enc = actcodec.quant.encode(arr, 8, nonfinite="keep", dtype=tag)
    assert len(enc.buffers) == 5
    back = actcodec.from_bytes(enc.to_bytes()).decode().reshape(-1).view(bits.dtype)
    assert back[[3, 100, 4999]].tobytes() == bits[[3, 100, 4999]].tobytes()
    as32 = enc.decode(dtype="float32")
    assert np.isnan(as32[3]) and as32[100] == np.inf and as32[4999] == -np.inf
    finite = np.ones(5000, bool)
    finite[[3, 100, 4999]] = False
    x32 = ref.to_f32(bits, name)
    assert np.abs(as32[finite] - x32[finite]).max() < 0.1


def test_compressed_size():
    n = 16 << 20  # elements, 64 MiB of float32
    x = np.random.default_rng(3).standard_normal(n).astype(np.float32)
    for nbits in BITS:
        enc = actcodec.quant.encode(x, nbits)
        assert enc.nbytes == n * nbits // 8 + 8 * (n // 256)


@pytest.mark.parametrize("kwargs,match", [
    ({"bits": 3}, "bits"), ({"bits": 16}, "bits"), ({"bits": True}, "bits"),
    ({"group_size": 31}, "group_size"), ({"group_size": 65537}, "group_size"),
    ({"group_size": 2.5}, "group_size"), ({"rounding": "up"}, "rounding"),
    ({"nonfinite": "ignore"}, "nonfinite"), ({"seed": -1}, "seed"), ({"seed": 2**64}, "seed"),
])
def test_bad_parameters(kwargs, match):
    kw = {"bits": 4, **kwargs}
    with pytest.raises(ValueError, match=match):
        actcodec.quant.encode(np.ones(10, np.float32), kw.pop("bits"), **kw)


def test_decode_dtype_options():
    x = np.random.default_rng(4).standard_normal((10, 30)).astype(np.float16)
    enc = actcodec.quant.encode(x, 8)
    assert enc.decode().dtype == np.float16
    assert enc.decode(dtype="float32").dtype == np.float32
    out = np.empty((10, 30), np.float32)
    assert enc.decode(out=out, dtype=np.float32) is out
    with pytest.raises(ValueError, match="decodes to float16 or float32"):
        enc.decode(dtype="float64")
    with pytest.raises(ValueError, match="decodes to float32, not float16"):
        actcodec.bitmap.encode(x.astype(np.float32)).decode(dtype="float16")


def test_all_paths_identical_bytes():
    x = np.random.default_rng(5).standard_normal(200_003).astype(np.float32)
    seen = set()
    for path in actcodec.simd_info()["available"]:
        for threads in (1, 2):
            for trick in (True, False, None):
                for rounding in ("nearest", "stochastic"):
                    seen.add((rounding, actcodec.quant.encode(
                        x, 4, rounding=rounding, seed=9, threads=threads, simd=path,
                        bittrick=trick).to_bytes()))
    assert len(seen) == 2


def test_bad_bittrick_option():
    with pytest.raises(ValueError, match="bittrick"):
        actcodec.quant.encode(np.ones(10, np.float32), 4, bittrick=1)


# ---- the combined codec and the automatic choice ----

@given(float_arrays(), st.sampled_from(BITS), GROUPS, st.sampled_from([0.0, 0.5, 0.9]))
def test_bitmap_quant_matches_reference(case, nbits, group, p_zero):
    name, bits = case
    bits = bits.copy()
    bits[np.random.default_rng(bits.size).random(bits.size) < p_zero] = 0
    x, tag = as_dtype(name, bits)
    enc = actcodec.bitmap_quant.encode(x, nbits, group_size=group, seed=5, dtype=tag)
    nz = bits != 0
    assert enc.buffers[0].tobytes() == np.packbits(nz, bitorder="little").tobytes()
    values = bits[nz]
    codes, mins, scales = ref.quant_encode(values, name, nbits, group, "nearest", 5)
    if values.size:
        assert enc.buffers[1].tobytes() == ref.quant_pack(codes, nbits).tobytes()
        assert enc.buffers[2].tobytes() == mins.tobytes()
    want32 = np.zeros(bits.size, np.float32)
    want32[nz] = ref.quant_decode(codes, mins, scales, group, values.size)
    got32 = actcodec.from_bytes(enc.to_bytes()).decode(dtype="float32").reshape(-1)
    assert got32.tobytes() == want32.tobytes()
    assert (got32[~nz] == 0).all()


def test_auto_picks_the_smallest_allowed():
    rng = np.random.default_rng(6)
    dense = rng.standard_normal(100_000).astype(np.float32)
    sparse = np.where(rng.random(100_000) < 0.9, 0, dense).astype(np.float32)
    assert actcodec.encode(dense).codec == "raw"          # lossless, nothing to gain
    assert actcodec.encode(dense, keep_raw=True) is None  # the caller keeps the array
    assert actcodec.encode(sparse).codec == "bitmap"
    assert actcodec.encode(dense, bits=4).codec == "quant"
    assert actcodec.encode(sparse, bits=4).codec == "bitmap_quant"
    assert actcodec.encode(sparse, bits=8).codec == "bitmap_quant"
    mask = np.where(rng.random(100_000) < 0.5, 0, 2.0).astype(np.float32)
    assert actcodec.encode(mask).codec == actcodec.encode(mask, bits=2).codec == "mask"
    for x in (dense, sparse, mask):
        for bits in (None, 1, 2, 4, 8):
            sizes = actcodec.encoder.sizes(x, bits)
            enc = actcodec.encode(x, bits=bits)
            assert enc.nbytes == sizes[enc.codec] == min(sizes.values())
            assert set(sizes) - {"mask"} == ({"raw", "bitmap"} if bits is None else
                                             {"raw", "bitmap", "quant", "bitmap_quant"})


def test_encode_named_codecs_and_errors():
    x = np.ones(100, np.float32)
    for codec in ("raw", "bitmap", "mask", "quant", "bitmap_quant"):
        kw = {"bits": 4} if "quant" in codec else {}
        assert actcodec.encode(x, codec, **kw).codec == codec
    with pytest.raises(ValueError, match="lossy"):
        actcodec.encode(x, "quant")
    with pytest.raises(ValueError, match="unknown codec"):
        actcodec.encode(x, "zstd")
    with pytest.raises(ValueError, match="prune applies to codec='bitmap'"):
        actcodec.encode(x, "auto", prune=0.5)
    with pytest.raises(ValueError, match="not a mask"):
        actcodec.encode(np.arange(100, dtype=np.float32), "mask")


@pytest.mark.parametrize("dtype", ["float16", "float32", "float64"])
def test_c_minmax_matches_numpy(opts, dtype):
    x = (np.random.default_rng(8).standard_normal(300_001) * 100).astype(dtype)
    c = actcodec._options.resolve(opts["threads"], opts["simd"])
    mn, mx = actcodec._ext.minmax(x.view(np.uint8), {"float16": 1, "float32": 3, "float64": 4}[dtype],
                                  x.itemsize, **c)
    assert mn == np.float32(x.min()) and mx == np.float32(x.max())
    x[123_456] = np.nan
    with pytest.raises(actcodec.NonFiniteError, match="element 123456 "):
        actcodec._ext.minmax(x.view(np.uint8), 3 if dtype == "float32" else
                             {"float16": 1, "float64": 4}[dtype], x.itemsize)
