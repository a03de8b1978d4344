"""The torch device path (actcodec.torch.codecs.device) against the C path, on CPU tensors forced
through it: the same bytes for every codec and parameter, the same decoded bits both ways, the
same NonFiniteError index, one host read per encode, and the routing of non-CPU tensors."""
import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st

torch = pytest.importorskip("torch")

import actcodec  # noqa: E402
from actcodec import bitmap, container  # noqa: E402
from actcodec.torch.codecs import backend as bridge  # noqa: E402
from actcodec.torch.codecs import device  # noqa: E402
from strategies import LENGTHS, SPECIAL  # noqa: E402

TORCH = {"float16": torch.float16, "bfloat16": torch.bfloat16, "float32": torch.float32,
         "float64": torch.float64}
INT = {2: np.int16, 4: np.int32, 8: np.int64}
TINT = {2: torch.int16, 4: torch.int32, 8: torch.int64}
BITS = [1, 2, 4, 8]
GROUPS = st.sampled_from([32, 33, 64, 100, 256, 1000, 65536, None])
ROUNDINGS = st.sampled_from(["nearest", "stochastic"])
SEEDS = st.one_of(st.just(0), st.integers(0, 2**32), st.integers(0, 2**64 - 1))
F32_MAX = float(np.finfo(np.float32).max)


# ---- inputs ----

def from_values(name: str, x: np.ndarray) -> torch.Tensor:
    """A tensor of dtype `name` from float64 values (rounded to nearest)."""
    if name == "bfloat16":
        with np.errstate(over="ignore"):
            return torch.from_numpy(x.astype(np.float32)).to(torch.bfloat16)
    with np.errstate(over="ignore"):
        return torch.from_numpy(x.astype(name))


def from_bits(name: str, bits: np.ndarray) -> torch.Tensor:
    size = torch.empty(0, dtype=TORCH[name]).element_size()
    return torch.from_numpy(np.ascontiguousarray(bits).view(INT[size]).copy()).view(TORCH[name])


def layout(t: torch.Tensor, how: str) -> torch.Tensor:
    """The same elements (C order) as a contiguous, strided or transposed tensor."""
    n = t.numel()
    if how == "strided":  # every other element of a buffer twice as long
        base = torch.zeros(2 * n, dtype=t.dtype)
        base[::2] = t
        return base[::2]
    if how == "transposed" and n % 2 == 0 and n:
        return t.reshape(2, n // 2).t().contiguous().t()  # shape (2, n/2), column-major
    return t


@st.composite
def tensors(draw, finite=False):
    """A 1-D or 2-D tensor of adversarial values: mixed magnitudes, ties, zeros of both signs,
    subnormals, ranges near the float32 limits, or (unless finite) raw bit patterns with
    NaN/inf; contiguous or not."""
    name = draw(st.sampled_from(["float32", "float16", "bfloat16", "float32", "float64"]))
    n = draw(LENGTHS)
    rng = np.random.default_rng(draw(st.integers(0, 2**32 - 1)))
    kinds = ["normal", "wide", "relu", "ties", "constant", "subnormal", "huge", "tiny_range"]
    kind = draw(st.sampled_from(kinds + ([] if finite else ["bits"])))
    if kind == "bits":
        size = torch.empty(0, dtype=TORCH[name]).element_size()
        uint = {2: np.uint16, 4: np.uint32, 8: np.uint64}[size]
        bits = rng.integers(0, np.iinfo(uint).max, n, dtype=uint, endpoint=True)
        special = np.array(SPECIAL[size], dtype=uint)
        pick = rng.random(n) < 0.1
        bits[pick] = special[rng.integers(0, len(special), int(pick.sum()))]
        t = from_bits(name, bits)
    else:
        if kind == "normal":
            x = rng.standard_normal(n) * draw(st.sampled_from([1e-3, 1.0, 300.0]))
        elif kind == "wide":
            x = rng.standard_normal(n) * 10.0 ** rng.integers(-30, 30, n)
        elif kind == "relu":
            x = np.maximum(rng.standard_normal(n), 0)
        elif kind == "ties":  # integer-spaced values: t = k + 0.5 ties for round-to-even
            x = rng.integers(-8, 8, n) * 0.5
        elif kind == "constant":
            x = np.full(n, draw(st.sampled_from([0.0, -0.0, 1.5, -3.25e4, 1e-40])))
        elif kind == "subnormal":  # float32 subnormals: 1/scale overflows (division path)
            x = rng.integers(-50, 50, n) * 1.401298464324817e-45
        elif kind == "huge":  # near the float32 limits; mixed signs overflow the range
            x = rng.uniform(-1, 1, n) * draw(st.sampled_from([1e38, 3.4e38]))
            if draw(st.booleans()):
                x = np.abs(x)
        else:  # a tiny range around a large value
            x = 1e4 + rng.integers(0, 3, n) * 1e-3
        x = np.where(rng.random(n) < draw(st.sampled_from([0.0, 0.5])), 0.0, x)
        x = np.where(rng.random(n) < 0.05, -0.0, x)
        t = from_values(name, x)  # float16 overflows to inf: kept unless finite
    if finite:
        t = torch.where(torch.isfinite(t), t, torch.zeros_like(t))
    return layout(t, draw(st.sampled_from(["contiguous", "strided", "transposed"])))


@st.composite
def codec_params(draw, codecs=("raw", "bitmap", "quant", "bitmap_quant", "auto")):
    codec = draw(st.sampled_from(codecs))
    kw = {}
    if codec in ("quant", "bitmap_quant", "auto"):
        bits = draw(st.sampled_from(BITS + ([None] if codec == "auto" else [])))
        kw = {"bits": bits, "group_size": draw(GROUPS), "rounding": draw(ROUNDINGS),
              "seed": draw(SEEDS)}
    if codec == "bitmap" and draw(st.booleans()):
        kw["prune"] = draw(st.sampled_from([1e-3, 0.5, 1e-42]))
    return codec, kw


# ---- comparisons ----

def same_bits(a: torch.Tensor, b: torch.Tensor) -> bool:
    return (a.dtype == b.dtype and a.shape == b.shape and a.device == b.device
            and torch.equal(a.reshape(-1).view(TINT[a.element_size()]),
                            b.reshape(-1).view(TINT[b.element_size()])))


# Where a GPU is present every comparison also runs the device path on it.
GPU = torch.device("cuda") if torch.cuda.is_available() else None


def encode_both(t, codec, kw):
    """(C encoding, device encoding), or the NonFiniteError index both raised."""
    try:
        c = actcodec.encode(t, codec, **kw)
    except actcodec.NonFiniteError as exc:
        for where in (t, t.to(GPU)) if GPU else (t,):
            with pytest.raises(actcodec.NonFiniteError) as got:
                device.encode(where, codec, **kw)
            assert got.value.index == exc.index
        return None, None
    if GPU:
        assert_same_on_gpu(c, t, codec, kw)
    return c, device.encode(t, codec, **kw)


def assert_same_on_gpu(c: container.Encoded, t: torch.Tensor, codec, kw):
    """The device path on the GPU: the C path's bytes, and its decoded bits on the GPU."""
    g = device.encode(t.to(GPU), codec, **kw)
    assert all(b.device.type == GPU.type for b in g.buffers)
    assert g.to("cpu").to_bytes() == c.to_bytes()
    for dtype in decode_targets(c):
        assert same_bits(bridge.decode(g, dtype=dtype).cpu(), bridge.decode(c, dtype=dtype))


def assert_same_encoding(c: container.Encoded, d: container.Encoded, t: torch.Tensor):
    for enc in (c, d):
        assert enc.is_torch and all(b.dtype == torch.uint8 and b.dim() == 1
                                    and b.device == t.device for b in enc.buffers)
    assert (d.codec, d.dtype, d.shape, d.params, d.nnz) == (c.codec, c.dtype, c.shape,
                                                            c.params, c.nnz)
    assert d.nbytes == c.nbytes
    assert len(d.buffers) == len(c.buffers)
    for mine, theirs in zip(d.numpy().buffers, c.numpy().buffers):
        assert mine.dtype == np.uint8 and mine.tobytes() == theirs.tobytes()
    assert d.to_bytes() == c.to_bytes()


def device_decode(enc: container.Encoded, dtype=None) -> torch.Tensor:
    """The torch-op decode, forced for CPU buffers too."""
    target = enc.decode_dtype(None if dtype is None else bridge.NAMES[dtype])
    out = torch.empty(enc.shape, dtype=bridge.TORCH_DTYPES[target])
    device.decode_into(enc.to("cpu"), out, target)
    return out


def check(t, codec, kw, decode=True):
    """Both paths on t: the same bytes (and decoded bits), or the same error. Returns the C
    encoding, or None if both raised."""
    c, d = encode_both(t, codec, kw)
    if c is not None:
        assert_same_encoding(c, d, t)
        if decode:
            assert_decodes_agree(c, d)
    return c


def decode_targets(enc):
    return [None, torch.float32] if enc.codec in ("quant", "bitmap_quant") else [None]


def assert_decodes_agree(c: container.Encoded, d: container.Encoded):
    for dtype in decode_targets(c):
        # device decode of the C encoding, and C decode of the device encoding
        want = bridge.decode(c, dtype=dtype)
        assert same_bits(device_decode(c, dtype), want)
        assert same_bits(bridge.decode(d, dtype=dtype), device_decode(d, dtype))
        assert same_bits(device_decode(d, dtype), want)


# ---- properties ----

@given(tensors(), codec_params())
def test_encode_matches_c_bytes(t, codec_kw):
    check(t, *codec_kw, decode=False)


@given(tensors(finite=True), codec_params(("bitmap", "quant", "bitmap_quant")))
def test_decode_agrees_both_ways(t, codec_kw):
    check(t, *codec_kw)


@given(st.sampled_from(BITS), GROUPS, ROUNDINGS, SEEDS,
       st.sampled_from(["float32", "float16", "bfloat16"]),
       st.sampled_from(["quant", "bitmap_quant"]))
def test_every_quant_setting_matches(bits, group, rounding, seed, name, codec):
    # lengths over several unified-layout blocks, with a short last block and last group
    rng = np.random.default_rng(bits * 7 + (group or 0))
    x = rng.standard_normal(1000 + bits) * rng.integers(0, 2, 1000 + bits)
    t = from_values(name, x)
    kw = {"bits": bits, "group_size": group, "rounding": rounding, "seed": seed}
    assert check(t, codec, kw) is not None


def test_seeds_change_the_codes():
    # guards the comparison above: different seeds must give different stochastic bytes
    t = torch.randn(4096, generator=torch.Generator().manual_seed(0))
    a = device.encode(t, "quant", bits=2, rounding="stochastic", seed=1).to_bytes()
    b = device.encode(t, "quant", bits=2, rounding="stochastic", seed=2**40 + 1).to_bytes()
    assert a != b


# ---- adversarial cases, every codec and bit width ----

def case_values(case: str) -> np.ndarray:
    sub = 1.401298464324817e-45  # the smallest float32 subnormal
    return {
        "empty": np.zeros(0),
        "one": np.array([-2.5]),
        "constant": np.full(300, 7.25),
        "zeros": np.zeros(300),
        "negative_zeros": np.full(77, -0.0),
        "signed_zeros": np.tile([0.0, -0.0, -0.0, 0.0, 1.0], 60),
        "subnormals": np.arange(-150, 150) * sub,
        "subnormal_pair": np.tile([sub, 2 * sub, 0.0], 100),
        "huge_one_sign": np.linspace(1e38, 3.4e38, 300),
        "tiny": np.linspace(-1e-30, 1e-30, 300),
        "huge_and_tiny": np.tile([3e38, 1e-38, -1e-30, 2.0], 75),
    }[case]


CASES = ["empty", "one", "constant", "zeros", "negative_zeros", "signed_zeros", "subnormals",
         "subnormal_pair", "huge_one_sign", "tiny", "huge_and_tiny"]


@pytest.mark.parametrize("name", ["float32", "float16", "bfloat16", "float64"])
@pytest.mark.parametrize("case", CASES)
def test_adversarial_values(case, name):
    t = from_values(name, case_values(case))
    x = {how: layout(t, how) for how in ["contiguous", "strided"]}
    for codec in ["raw", "bitmap", "auto"]:
        for how in x:
            assert check(x[how], codec, {}) is not None
    configs = [(32, "nearest", 0), (None, "stochastic", 99), (100, "stochastic", 2**64 - 1)]
    for i, (codec, bits, (group, rounding, seed)) in enumerate(
            (c, b, g) for c in ["quant", "bitmap_quant"] for b in BITS for g in configs):
        kw = {"bits": bits, "group_size": group, "rounding": rounding, "seed": seed}
        check(x[["contiguous", "strided"][i % 2]], codec, kw)  # float16 "huge" is inf: raises


def test_division_fallback_is_taken_and_matches():
    # subnormal ranges: scale is so small that 1/scale overflows, and the C path divides
    sub = 1.401298464324817e-45
    t = from_values("float32", np.arange(300) % 7 * sub)
    for bits in BITS:
        for rounding in ["nearest", "stochastic"]:
            c = check(t, "quant", {"bits": bits, "rounding": rounding, "seed": 5})
            scales = c.numpy().buffers[2].view(np.float32)
            with np.errstate(divide="ignore", over="ignore"):
                assert np.isinf(np.float32(1) / scales).all()


@pytest.mark.parametrize("name", ["float32", "float16", "bfloat16", "float64"])
def test_bitmap_prune_at_the_threshold(name):
    # values at, just below and just above thresholds, of both signs, and non-finite ones
    x = np.array([0.5, -0.5, 0.49999, 0.50001, 0.1, -0.1, 0.0999, 1e-8, -0.0, np.inf, np.nan,
                  -np.inf, 3.0] * 5)
    t = from_values(name, x)
    for prune in [0.5, 0.1, 1e-8, 1e-300, 1e6]:
        c = check(t, "bitmap", {"prune": prune})
        assert c.params == {"prune": prune}


def test_zero_dim_and_requires_grad():
    t = torch.tensor(3.5, requires_grad=True)
    assert check(t, "quant", {"bits": 4}).shape == ()


def test_small_steps_cross_groups(monkeypatch):
    # The elementwise passes run in steps; small steps put step edges inside groups.
    monkeypatch.setattr(device, "_CPU_CHUNK", 64)
    x = torch.randn(3000, generator=torch.Generator().manual_seed(3))
    for group in [32, 100, 1000, None]:
        for codec in ["quant", "bitmap_quant"]:
            kw = {"bits": 4, "group_size": group, "rounding": "stochastic", "seed": 2**33 + 7}
            assert check(x.relu(), codec, kw) is not None


def test_uniform_matches_c_draws_beyond_2_32():
    # the hash key changes every 2^32 elements; check draws there without a 4G tensor
    for seed in [0, 1, 2**32 + 5, 2**64 - 1]:
        for start in [0, 2**32, 5 * 2**32 + 2**31]:
            got = device._uniform(seed, start, start + 300, "cpu").numpy()
            want = np.array([actcodec._ext.uniform(seed, start + i) for i in range(300)],
                            np.float32)
            assert got.tobytes() == want.tobytes()


# ---- non-finite input ----

@given(st.sampled_from(["float32", "float16", "bfloat16", "float64"]),
       st.integers(1, 1200), st.data(), GROUPS, st.sampled_from(["quant", "bitmap_quant"]))
def test_nonfinite_raises_same_index(name, n, data, group, codec):
    rng = np.random.default_rng(n)
    x = rng.standard_normal(n)
    bad = [float("nan"), float("inf"), -float("inf")] + ([1e39] if name == "float64" else [])
    for _ in range(data.draw(st.integers(1, 3))):
        x[data.draw(st.integers(0, n - 1))] = data.draw(st.sampled_from(bad))
    t = from_values(name, x)
    kw = {"bits": 4, "group_size": group}
    with pytest.raises(actcodec.NonFiniteError) as want:
        actcodec.encode(t, codec, **kw)
    with pytest.raises(actcodec.NonFiniteError) as got:
        device.encode(t, codec, **kw)
    assert isinstance(got.value, ValueError)
    assert got.value.index == want.value.index


def test_range_overflow_raises_at_group_start():
    t = torch.tensor([1.0] * 40 + [-3e38, 3e38] + [0.0] * 30)
    for group, index in [(32, 32), (None, 0)]:
        assert check(t, "quant", {"bits": 8, "group_size": group}) is None  # both raised
        with pytest.raises(actcodec.NonFiniteError) as got:
            device.encode(t, "quant", bits=8, group_size=group)
        assert got.value.index == index


@pytest.mark.parametrize("name", ["float32", "float16", "bfloat16", "float64"])
@pytest.mark.parametrize("codec", ["quant", "bitmap_quant"])
def test_nonfinite_keep_matches(name, codec):
    size = torch.empty(0, dtype=TORCH[name]).element_size()
    uint = {2: np.uint16, 4: np.uint32, 8: np.uint64}[size]
    rng = np.random.default_rng(size)
    t = from_values(name, np.maximum(rng.standard_normal(700), 0))
    bits = t.view(TINT[size]).numpy().view(uint).copy()
    exponent = {"float16": 0x7C00, "bfloat16": 0x7F80, "float32": 0x7F800000,
                "float64": 0x7FF0000000000000}[name]
    specials = [b for b in SPECIAL[size] if b & exponent == exponent]  # NaNs (payloads), infs
    where = rng.choice(700, 40, replace=False)
    bits[where] = rng.choice(np.array(specials, uint), 40)
    if name == "float64":  # beyond float32, escaped too
        bits[[3, 5]] = np.array([1e39, -F32_MAX * (1 + 2**-30)]).view(np.uint64)
    t = from_bits(name, bits)
    for group in [32, None]:
        kw = {"bits": 2, "group_size": group, "nonfinite": "keep", "rounding": "stochastic"}
        with np.errstate(invalid="ignore"):  # numpy warns when it converts signalling NaNs
            c = check(t, codec, kw)
        assert len(c.buffers) in (5, 6)  # escapes exist


# ---- routing and host reads ----

def test_non_cpu_tensors_take_the_device_path(monkeypatch):
    calls = []
    monkeypatch.setattr(device, "encode", lambda t, codec="auto", **kw: calls.append(
        (t.device.type, codec, kw["bits"])) or "routed")
    meta = torch.empty(10, device="meta")
    assert actcodec.encode(meta, "quant", bits=4) == "routed"
    assert calls == [("meta", "quant", 4)]
    assert actcodec.encode(torch.ones(10), "quant", bits=4).is_torch  # CPU: the C path
    assert len(calls) == 1


@pytest.mark.parametrize("codec,kw", [("auto", {}), ("auto", {"bits": 4}), ("bitmap", {}),
                                      ("mask", {}), ("quant", {"bits": 2}),
                                      ("bitmap_quant", {"bits": 8, "rounding": "stochastic"}),
                                      ("quant", {"bits": 4, "nonfinite": "keep"})])
def test_one_host_read_per_encode_and_none_to_decode(monkeypatch, codec, kw):
    """The counts cross to the host once per encode (the survey's .tolist()); nothing else
    asks the device for a value: no .item(), bool() or int() of a tensor, no boolean indexing
    or nonzero() with a data-dependent size."""
    x = torch.relu(torch.randn(5000)) * (2.0 if codec != "mask" else 0) + (torch.rand(5000) < 0.3)
    if kw.get("nonfinite") == "keep":
        x[[7, 99]] = float("nan")
    reads = []
    for name in ("item", "tolist", "__bool__", "__int__", "__float__", "nonzero"):
        real = getattr(torch.Tensor, name)
        monkeypatch.setattr(torch.Tensor, name, lambda self, *a, _n=name, _r=real, **k:
                            reads.append(_n) or _r(self, *a, **k))
    real_index = torch.Tensor.__getitem__

    def getitem(self, index):
        if isinstance(index, torch.Tensor) and index.dtype == torch.bool:
            reads.append("boolean index")
        return real_index(self, index)
    monkeypatch.setattr(torch.Tensor, "__getitem__", getitem)
    enc = device.encode(x, codec, **kw)
    assert reads == ["tolist"], reads
    reads.clear()
    out = torch.empty(x.shape, dtype=torch.float32)
    device.decode_into(enc, out, enc.decode_dtype("float32" if "quant" in enc.codec else None))
    assert reads == [], reads
    monkeypatch.undo()
    assert same_bits(out, actcodec.encode(x, codec, **kw).decode(dtype=out.dtype))


@pytest.mark.parametrize("n", [1, 7, 8, 4099])
@pytest.mark.parametrize("fill", ["random", "none", "all"])
def test_a_bool_mask_reads_nothing_back_either_way(monkeypatch, n, fill):
    # a dropout's mask: the C path's bytes with no count read, and decoded with none
    t = {"random": torch.rand(n) < 0.3, "none": torch.zeros(n, dtype=torch.bool),
         "all": torch.ones(n, dtype=torch.bool)}[fill]
    reads = []
    for name in ("item", "tolist", "cpu", "numpy", "__bool__", "__int__", "nonzero"):
        real = getattr(torch.Tensor, name)
        monkeypatch.setattr(torch.Tensor, name, lambda self, *a, _n=name, _r=real, **k:
                            reads.append(_n) or _r(self, *a, **k))
    enc = device.encode(t, "auto", bits=8)
    out = torch.empty(n, dtype=torch.bool)
    device.decode_into(enc, out, "bool")
    assert reads == [], reads
    monkeypatch.undo()
    c = actcodec.encode(t)
    assert enc.codec == c.codec == "mask" and enc.to_bytes() == c.to_bytes()
    assert torch.equal(out, t)
    assert bridge.decode(enc).equal(t) and bitmap.nonzero_count(enc, enc.buffers[0]) == c.nnz


def test_dense_lossless_keeps_the_tensor_and_masks_take_one_bit():
    dense = torch.randn(4096)
    assert device.encode(dense, keep_raw=True) is None
    assert device.encode(dense, bits=None).codec == "raw"
    mask = (torch.rand(4096) < 0.5).float() * 3.0
    assert device.encode(mask, bits=2).codec == "mask"
    assert device.encode(mask, bits=2).nbytes == 4096 // 8 + 4
    assert device.encode(torch.rand(4096) < 0.5).nbytes == 4096 // 8 + 1


def test_encoded_properties():
    x = torch.randn(64, 16)
    d = device.encode(x, "quant", bits=4, group_size=64)
    assert d.device == x.device and d.size == x.numel()
    assert d.nbytes == 64 * 16 // 2 + 8 * 16
    assert d.ratio == d.original_nbytes / d.nbytes == 4 * 1024 / d.nbytes
    assert container.from_bytes(d.to_bytes()).to_bytes() == d.to_bytes()
    assert same_bits(d.decode(), device_decode(d))
    moved = container.from_bytes(d.to_bytes()).to("cpu")
    assert moved.is_torch and same_bits(moved.decode(), d.decode())


# ---- bad input ----

def test_bad_input_raises_clearly():
    x = torch.randn(100)
    with pytest.raises(TypeError, match="torch.Tensor"):
        device.encode(np.zeros(3, np.float32))
    with pytest.raises(TypeError, match="dtype"):
        device.encode(torch.zeros(3, dtype=torch.int32))
    with pytest.raises(ValueError, match="unknown codec"):
        device.encode(x, "zip")
    with pytest.raises(ValueError, match="lossy"):
        device.encode(x, "quant")
    with pytest.raises(ValueError, match="group_size"):
        device.encode(x, "quant", bits=4, group_size=7)
    with pytest.raises(ValueError, match="bits"):
        device.encode(x, "auto", bits=3)
    with pytest.raises(ValueError, match="prune"):
        device.encode(x, "bitmap", prune=-1.0)
    with pytest.raises(ValueError, match="dtype tags"):
        actcodec.encode(x, "raw", dtype="bfloat16")
    with pytest.raises(TypeError, match="the bitmap codec encodes"):
        device.encode(torch.ones(3, dtype=torch.bool), "bitmap")
    d = device.encode(x, "bitmap")
    with pytest.raises(ValueError, match="decodes to float32, not float16"):
        d.decode(dtype=torch.float16)
    with pytest.raises(TypeError, match="cannot decode to"):
        bridge.decode(device.encode(x, "quant", bits=8), dtype=torch.int32)
    broken = container.Encoded("bitmap", "float32", (100,), {"prune": 0.0},
                               (d.buffers[0], d.buffers[1][:-4]))
    with pytest.raises(ValueError, match="nonzero"):
        device_decode(broken)
    with pytest.raises(ValueError, match="nonzero"):
        container.validate(broken)
