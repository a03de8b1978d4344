"""pytest-benchmark suite for the codecs: 64 MiB of float32, 2 threads, beside torch's threaded
copy of the same array and the numpy and eager-torch alternatives (bench/harness.py). Run:
    pytest bench/test_bench_codecs.py --benchmark-group-by=param:case
The report's ratios come from `python bench/report.py` (interleaved rounds, one run)."""
import numpy as np
import pytest

import actcodec
import harness

MIB = 64
CASES = {
    "bitmap-50%": (lambda: harness.relu_like(MIB << 20, 0.5), "bitmap", {}),
    "bitmap-90%": (lambda: harness.relu_like(MIB << 20, 0.9), "bitmap", {}),
    "quant-2bit": (lambda: harness.normal(MIB << 20), "quant", {"bits": 2}),
    "quant-8bit": (lambda: harness.normal(MIB << 20), "quant", {"bits": 8}),
    "bitmap_quant-4bit": (lambda: harness.relu_like(MIB << 20, 0.5), "bitmap_quant", {"bits": 4}),
    "mask": (lambda: np.where(harness.relu_like(MIB << 20, 0.5) > 0, np.float32(2),
                              np.float32(0)), "mask", {}),
    "auto-8bit-relu": (lambda: harness.relu_like(MIB << 20, 0.5), "auto", {"bits": 8}),
}


@pytest.fixture(scope="module", params=list(CASES))
def case(request):
    make, codec, kw = CASES[request.param]
    x = make()
    enc = actcodec.encode(x, codec, **kw)
    return x, codec, kw, enc, np.empty(x.shape, enc.decode_dtype())


@pytest.mark.parametrize("op", ["copy", "encode", "decode"])
def test_codec(benchmark, case, op):
    x, codec, kw, enc, out = case
    fn = {"copy": harness.copy_into(x), "encode": lambda: actcodec.encode(x, codec, **kw),
          "decode": lambda: enc.decode(out=out)}[op]
    benchmark(fn)


@pytest.mark.parametrize("op", ["numpy_encode", "numpy_decode"])
def test_numpy_bitmap(benchmark, op):
    x = harness.relu_like(MIB << 20, 0.5)
    packed, values = harness.numpy_bitmap_encode(x)
    fn = {"numpy_encode": lambda: harness.numpy_bitmap_encode(x),
          "numpy_decode": lambda: harness.numpy_bitmap_decode(packed, values, x.size)}[op]
    benchmark(fn)


@pytest.mark.parametrize("bits", [2, 8])
@pytest.mark.parametrize("op", ["encode", "decode"])
def test_torch_eager_quant(benchmark, bits, op):
    torch = pytest.importorskip("torch")
    xt = torch.from_numpy(harness.normal(MIB << 20))
    q = harness.torch_eager_quantize(xt, bits)
    fn = {"encode": lambda: harness.torch_eager_quantize(xt, bits),
          "decode": lambda: harness.torch_eager_dequantize(*q, bits)}[op]
    benchmark(fn)
