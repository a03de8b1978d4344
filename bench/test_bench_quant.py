"""pytest-benchmark suite for k-bit quantization: 64 MiB float32, group 256, 2 threads, beside a
2-thread copy, eager torch and bitsandbytes (8-bit blockwise) where installed. Run:
    pytest bench/test_bench_quant.py --benchmark-group-by=param:bits
The README's ratios come from `python -m actcodec bench` (interleaved rounds, one run)."""
import numpy as np
import pytest

import actcodec
from actcodec import benchmark as acbench

MIB = 64


@pytest.fixture(scope="module")
def x():
    return np.random.default_rng(0).standard_normal((MIB << 20) // 4, dtype=np.float32)


@pytest.fixture(scope="module")
def xt(x):
    torch = pytest.importorskip("torch")  # optional baseline
    torch.set_num_threads(2)
    return torch.from_numpy(x)


@pytest.mark.parametrize("bits", [1, 2, 4, 8])
@pytest.mark.parametrize("op", ["copy", "encode", "decode"])
def test_actcodec(benchmark, x, bits, op):
    enc = actcodec.quant.encode(x, bits)
    fn = {"copy": lambda: acbench.threaded_copy(x), "encode": lambda: actcodec.quant.encode(x, bits),
          "decode": enc.decode}[op]
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
    bnbf = pytest.importorskip("bitsandbytes.functional")  # optional baseline
    q = bnbf.quantize_blockwise(xt, blocksize=256)
    fn = {"encode": lambda: bnbf.quantize_blockwise(xt, blocksize=256),
          "decode": lambda: bnbf.dequantize_blockwise(*q)}[op]
    benchmark(fn)
