"""The fused Triton kernels (actcodec.torch.codecs.fused) against the C path: the same bytes for
every codec, bit width, rounding, dtype and ragged size, the same decoded bits both ways, the
torch-op path taken for what they do not cover, one host read per encode. Without a GPU they
run on CPU tensors under Triton's interpreter (conftest.py sets TRITON_INTERPRET=1); where a
GPU is present every comparison also runs on it."""
import os

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

torch = pytest.importorskip("torch")
pytest.importorskip("triton")

import actcodec  # noqa: E402
from actcodec.torch.codecs import backend as bridge  # noqa: E402
from actcodec.torch.codecs import device, fused  # noqa: E402
from test_torch_device import (BITS, CASES, ROUNDINGS, SEEDS, case_values, codec_params,  # noqa: E402
                               from_values, layout, same_bits, tensors)

GPU = torch.device("cuda") if torch.cuda.is_available() else None
if GPU is None and os.environ.get("TRITON_INTERPRET") != "1":
    pytest.skip("no GPU and Triton's interpreter is off", allow_module_level=True)

# The interpreter computes masked-off lanes too (a constant group's 1 / 0, say) and numpy
# warns about them; the lanes are never stored.
pytestmark = pytest.mark.filterwarnings("ignore::RuntimeWarning")
POWERS = st.sampled_from([32, 64, 256, 1024, 8192, None])
NAMES = ["float32", "float16", "bfloat16"]


def here(t):
    """Where the kernels run: the GPU, or the CPU under the interpreter."""
    return t.to(GPU) if GPU else t


def places(t):
    return (here(t),)


def fused_check(t, codec, kw):
    """The kernels on t (and on the GPU): the C path's bytes, or its NonFiniteError index;
    the kernels' decode of the C encoding gives the C decode's bits. Returns the C encoding,
    or None where it raised."""
    try:
        c = actcodec.encode(t, codec, **kw)
    except actcodec.NonFiniteError as exc:
        for where in places(t):
            with pytest.raises(actcodec.NonFiniteError) as got:
                fused.encode(where, codec, **kw)
            assert got.value.index == exc.index
        return None
    for where in places(t):
        f = fused.encode(where, codec, **kw)
        assert all(b.device == where.device for b in f.buffers)
        assert (f.codec, f.nnz) == (c.codec, c.nnz)
        assert f.to("cpu").to_bytes() == c.to_bytes()
        for dtype in [None, torch.float32] if "quant" in c.codec else [None]:
            want = bridge.decode(c, dtype=dtype)
            target = c.decode_dtype(None if dtype is None else bridge.NAMES[dtype])
            out = torch.empty(c.shape, dtype=bridge.TORCH_DTYPES[target], device=where.device)
            fused.decode_into(c.to(where.device), bridge.memory_order(out), target)
            assert same_bits(out.cpu(), want)
    return c


@settings(max_examples=40)
@given(tensors(), codec_params())
def test_encode_and_decode_match_c(t, codec_kw):
    fused_check(t, *codec_kw)


@settings(max_examples=25)
@given(st.sampled_from(BITS), POWERS, ROUNDINGS, SEEDS, st.sampled_from(NAMES),
       st.sampled_from(["quant", "bitmap_quant", "auto"]),
       st.sampled_from([1, 31, 1023, 1024, 1025, 2047, 2049, 8191, 8193, 12345]))
def test_every_quant_setting_and_ragged_size(bits, group, rounding, seed, name, codec, n):
    # lengths around the tiles (1024 elements, or a group) and the 32-byte blocks
    rng = np.random.default_rng(n + bits)
    t = from_values(name, rng.standard_normal(n) * rng.integers(0, 2, n))
    kw = {"bits": bits, "group_size": group, "rounding": rounding, "seed": seed}
    assert fused_check(t, codec, kw) is not None


@settings(max_examples=12, deadline=None)
@given(st.sampled_from(BITS), st.sampled_from([32, 256, 2048, None]), ROUNDINGS,
       st.sampled_from(NAMES), st.sampled_from([1, 255, 1025, 4097, 9000]),
       st.sampled_from([256, 512, 2048, 8192]), st.sampled_from([1, 4, 8]))
def test_the_tile_a_program_takes_changes_no_byte(bits, group, rounding, name, n, tile, warps):
    """Any tile (bench/gpu.py compares them on a GPU) gives the default tile's encoding and
    statistics, and its decode the same bits."""
    rng = np.random.default_rng(n + bits)
    flat, name = device._flat_bits(here(from_values(name, rng.standard_normal(n))))
    p = {"bits": bits, "group_size": group, "rounding": rounding, "seed": 3}
    want, want_stats = fused._quantize(flat, name, p)
    got, got_stats = fused._quantize(flat, name, p, tile=tile, warps=warps)
    assert all(torch.equal(a, b) for a, b in zip(got, want))
    assert fused._read(got_stats) == fused._read(want_stats)
    out = [torch.empty(n, dtype=torch.float32, device=flat.device) for _ in range(2)]
    fused._dequantize(want, n, "float32", p, out[0])
    fused._dequantize(want, n, "float32", p, out[1], tile=max(256, tile // 2), warps=warps)
    assert torch.equal(out[0].view(torch.int32), out[1].view(torch.int32))
    with pytest.raises(ValueError, match="power of two"):
        fused._quantize(flat, name, p, tile=3000)


@pytest.mark.parametrize("name", NAMES)
@pytest.mark.parametrize("case", CASES)
def test_adversarial_values(case, name):
    t = from_values(name, case_values(case))
    for codec in ["bitmap", "mask", "auto"]:
        if codec != "mask" or case in ("constant", "negative_zeros"):
            fused_check(t, codec, {})
    for codec in ["quant", "bitmap_quant"]:
        for bits in BITS:
            for group, rounding in [(32, "nearest"), (None, "stochastic")]:
                fused_check(layout(t, "strided"), codec,
                            {"bits": bits, "group_size": group, "rounding": rounding})


def test_subnormal_ranges_divide_in_the_kernel(monkeypatch):
    # 1/scale overflows: the kernel divides, as the C path does, with no fallback
    monkeypatch.setattr(device, "encode", _no_fallback)
    t = from_values("float32", np.arange(3000) % 7 * 1.401298464324817e-45)
    for bits in BITS:
        for rounding in ["nearest", "stochastic"]:
            assert fused_check(t, "quant", {"bits": bits, "rounding": rounding}) is not None


def _no_fallback(*args, **kwargs):
    raise AssertionError("fell back to the torch-op path")


@pytest.mark.parametrize("codec,kw", [("auto", {"bits": 8}), ("auto", {"bits": 2}),
                                      ("auto", {}), ("bitmap", {}), ("mask", {}),
                                      ("bitmap_quant", {"bits": 4}),
                                      ("quant", {"bits": 1, "rounding": "stochastic"})])
def test_the_kernels_serve_what_they_cover(monkeypatch, codec, kw):
    monkeypatch.setattr(device, "encode", _no_fallback)
    monkeypatch.setattr(device, "decode_into", _no_fallback)
    x = torch.relu(torch.randn(5000, generator=torch.Generator().manual_seed(1)))
    if codec == "mask":
        x = (x > 0).float() * 3.0
    for name in NAMES:
        enc = fused.encode(here(x.to(bridge.TORCH_DTYPES[name])), codec, **kw)
        out = here(torch.empty(enc.shape, dtype=bridge.TORCH_DTYPES[name]))
        if enc.codec != "mask":
            fused.decode_into(enc, out, name)


@pytest.mark.parametrize("t,codec,kw", [
    (torch.tensor([1.0, float("nan")] * 600), "quant", {"bits": 8}),
    (torch.tensor([1.0, float("inf")] * 600), "auto", {"bits": 4, "nonfinite": "keep"}),
    (torch.randn(3000, dtype=torch.float64), "quant", {"bits": 8}),
    (torch.randn(3000), "quant", {"bits": 8, "group_size": 100}),
    (torch.randn(3000), "bitmap", {"prune": 0.5}),
    (torch.tensor([3e38, -3e38] * 600).relu(), "bitmap_quant", {"bits": 8}),
])
def test_what_they_do_not_cover_goes_to_the_torch_path(monkeypatch, t, codec, kw):
    calls = []
    real = device.encode
    monkeypatch.setattr(device, "encode", lambda *a, **k: calls.append(1) or real(*a, **k))
    try:
        got = fused.encode(here(t), codec, **kw).to("cpu").to_bytes()
    except actcodec.NonFiniteError:
        got = None
    assert calls == [1]
    try:
        assert got == actcodec.encode(t, codec, **kw).to_bytes()
    except actcodec.NonFiniteError:
        assert got is None


@pytest.mark.parametrize("offset", [1, 2, 3])
def test_quant_buffers_at_any_byte_offset_decode_the_same(offset):
    from dataclasses import replace
    x = here(torch.randn(3000, generator=torch.Generator().manual_seed(4)))
    enc = fused.encode(x, "quant", bits=4, group_size=64)
    want = here(torch.empty(3000))
    fused.decode_into(enc, want, "float32")
    moved = []
    for b in enc.buffers:  # each at `offset` bytes into a larger buffer of its own
        wide = here(torch.zeros(b.numel() + offset, dtype=torch.uint8))
        wide[offset:] = b
        moved.append(wide[offset:])
    got = here(torch.empty(3000))
    fused.decode_into(replace(enc, buffers=tuple(moved)), got, "float32")
    assert same_bits(got.cpu(), want.cpu())
    assert all(fused._aligned(b).data_ptr() % 4 == 0 for b in moved)  # what a GPU reads
    with pytest.raises(ValueError, match="contiguous"):
        fused.decode_into(enc, here(torch.empty(6000))[::2], "float32")


@pytest.mark.parametrize("codec,kw", [("auto", {"bits": 8}), ("auto", {}), ("bitmap", {}),
                                      ("mask", {}), ("quant", {"bits": 2}),
                                      ("bitmap_quant", {"bits": 8, "rounding": "stochastic"})])
def test_one_host_read_per_encode_and_none_to_decode(monkeypatch, codec, kw):
    x = torch.relu(torch.randn(5000, generator=torch.Generator().manual_seed(2)))
    if codec == "mask":
        x = (x > 0).float()
    reads = []
    for name in ("item", "tolist", "cpu", "numpy", "__bool__", "__int__", "__float__",
                 "nonzero"):
        real = getattr(torch.Tensor, name)
        monkeypatch.setattr(torch.Tensor, name, lambda self, *a, _n=name, _r=real, **k:
                            reads.append(_n) or _r(self, *a, **k))
    enc = fused.encode(here(x), codec, **kw)
    # one copy to the host, read there (rows in host memory already: read)
    assert reads == (["cpu", "numpy"] if GPU is not None else ["numpy"]), reads
    reads.clear()
    out = here(torch.empty(x.shape))
    fused.decode_into(enc, out, "float32")
    assert reads == [], reads
    monkeypatch.undo()
    assert same_bits(out.cpu(), actcodec.encode(x, codec, **kw).decode(dtype=torch.float32))


@pytest.mark.skipif(GPU is not None, reason="CPU tensors run the kernels only interpreted")
def test_device_tensors_route_to_the_kernels(monkeypatch):
    x = torch.randn(3000)
    assert not fused.applies(x) and fused.route(x) is device  # CPU tensors: the C path
    monkeypatch.setattr(fused, "applies", lambda t: True)
    monkeypatch.setattr(device, "encode", _no_fallback)
    enc = bridge.TorchBackend.encode(x, "auto", bits=8)
    assert enc.to_bytes() == actcodec.encode(x, bits=8).to_bytes()
    assert same_bits(bridge.decode(enc.to("cpu")), actcodec.encode(x, bits=8).decode())


def test_importing_actcodec_torch_leaves_triton_for_the_first_gpu_encode():
    # importing Triton takes seconds: a process that never encodes on a GPU does not pay them
    import subprocess
    import sys
    r = subprocess.run([sys.executable, "-c", "import sys, actcodec.torch, torch; "
                        "actcodec.encode(torch.randn(100), bits=8); "
                        "print('triton' in sys.modules)"], capture_output=True, text=True)
    assert r.returncode == 0, r.stderr
    assert r.stdout.strip() == "False"
