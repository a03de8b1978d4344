"""pytest-benchmark suite for k-bit quantization: 64 MiB float32 and float16, group 256,
2 threads, beside a 2-thread copy, eager torch, bitsandbytes (8-bit blockwise) and torchao's bit
packing (1/2/4-bit codes, one per byte, packed and unpacked: no quantization) where installed.
Run:
    pytest bench/test_bench_quant.py --benchmark-group-by=param:bits
The README's ratios come from `python -m actcodec bench` (interleaved rounds, one run)."""
import pytest

import actcodec
from actcodec import benchmark as acbench

MIB = 64


@pytest.fixture(scope="module", params=["float32", "float16"])
def dtype(request):
    return request.param


@pytest.fixture(scope="module")
def x(dtype):
    return acbench.normal(MIB << 20, dtype)


@pytest.fixture(scope="module")
def xt(x):
    torch = pytest.importorskip("torch")  # optional baseline
    torch.set_num_threads(2)
    return torch.from_numpy(x)


@pytest.mark.parametrize("bits", [1, 2, 4, 8])
@pytest.mark.parametrize("op", ["copy", "encode", "decode"])
def test_actcodec(benchmark, x, bits, op):
    enc = actcodec.quant.encode(x, bits)
    fn = {"copy": lambda: acbench.threaded_copy(x),
          "encode": lambda: actcodec.quant.encode(x, bits), "decode": enc.decode}[op]
    benchmark(fn)


@pytest.mark.parametrize("bits", [1, 2, 4, 8])
@pytest.mark.parametrize("op", ["encode", "decode"])
def test_torch_eager(benchmark, xt, bits, op):
    packed = acbench.torch_eager_quantize(xt, bits)
    fn = {"encode": lambda: acbench.torch_eager_quantize(xt, bits),
          "decode": lambda: acbench.torch_eager_dequantize(*packed, bits)}[op]
    benchmark(fn)


@pytest.mark.parametrize("bits", [8])
@pytest.mark.parametrize("op", ["encode", "decode"])
def test_bitsandbytes(benchmark, xt, bits, op):
    bnbf = acbench.load_bitsandbytes()
    if bnbf is None:
        pytest.skip("bitsandbytes is not installed or does not load")  # optional baseline
    q = bnbf.quantize_blockwise(xt, blocksize=256)
    fn = {"encode": lambda: bnbf.quantize_blockwise(xt, blocksize=256),
          "decode": lambda: bnbf.dequantize_blockwise(*q)}[op]
    benchmark(fn)


@pytest.mark.parametrize("bits", [1, 2, 4])
@pytest.mark.parametrize("op", ["pack", "unpack"])
def test_torchao_packing(benchmark, xt, bits, op):
    """torchao packs codes it is given: x.size codes of `bits` bits, one per byte."""
    import torch

    ta = acbench.load_torchao()
    if not ta.ok:
        pytest.skip(f"torchao: {ta.status}")  # optional baseline
    codes = torch.randint(0, 1 << bits, (xt.numel(),), dtype=torch.uint8)
    packed = ta.pack(codes, bits)
    fn = {"pack": lambda: ta.pack(codes, bits), "unpack": lambda: ta.unpack(packed, bits)}[op]
    result = benchmark(fn)
    if op == "unpack":
        assert torch.equal(result, codes)


@pytest.fixture(scope="module")
def x_cached():
    return acbench.normal(1 << 20, "float32")  # 1 MiB: stays in L2, as a step's tensors do


@pytest.mark.parametrize("group", [64, 256, 4096])
@pytest.mark.parametrize("op", ["encode", "decode"])
def test_cache_resident_kernels(benchmark, x_cached, group, op):
    """The C kernels on a cache-resident 1 MiB float32 array, 1 thread, 2-bit, through the
    bindings (no container): what a training step's small tensors see. The tile group kernels
    (one call per 4096 elements) made G=256 encode 2.3x faster here on 2026-11-23."""
    from actcodec import _ext
    src = x_cached.view("u1")
    out = x_cached.copy().view("u1")
    packed, mins, scales = _ext.quant_encode(src, 3, 4, 2, group, 0, 0)
    threads = actcodec.get_num_threads()
    actcodec.set_num_threads(1)
    try:
        fn = {"encode": lambda: _ext.quant_encode(src, 3, 4, 2, group, 0, 0),
              "decode": lambda: _ext.quant_decode(packed, mins, scales, 2, group, 3, 4, out)}[op]
        benchmark(fn)
    finally:
        actcodec.set_num_threads(threads)
