"""pytest-benchmark suite for bitmap_quant (bitmap + k-bit nonzero values): 64 MiB float32 and
float16 ReLU-like activations (50% zeros), k = 2, 4, 8, group 256, 2 threads, beside a 2-thread
copy and numpy's bitmap followed by eager torch quantization of the nonzero values. Run:
    pytest bench/test_bench_bitmap_quant.py --benchmark-group-by=param:bits
The README's ratios come from `python -m actcodec bench` (interleaved rounds, one run)."""
import numpy as np
import pytest

import actcodec
from actcodec import benchmark as acbench

MIB = 64
BITS = [2, 4, 8]


@pytest.fixture(scope="module", params=["float32", "float16"])
def dtype(request):
    return request.param


@pytest.fixture(scope="module")
def x(dtype):  # whole groups of nonzero values, for the eager alternative
    return acbench.relu_like(MIB << 20, 0.5, dtype=dtype, nonzero_multiple=256)


@pytest.mark.parametrize("bits", BITS)
@pytest.mark.parametrize("op", ["copy", "encode", "decode"])
def test_actcodec(benchmark, x, bits, op):
    enc = actcodec.bitmap_quant.encode(x, bits)
    fn = {"copy": lambda: acbench.threaded_copy(x),
          "encode": lambda: actcodec.bitmap_quant.encode(x, bits), "decode": enc.decode}[op]
    result = benchmark(fn)
    if op == "decode":
        assert np.array_equal(result == 0, x == 0)  # zeros stay exact zeros


@pytest.mark.parametrize("bits", BITS)
@pytest.mark.parametrize("op", ["encode", "decode"])
def test_numpy_torch_eager(benchmark, x, bits, op):
    torch = pytest.importorskip("torch")  # optional baseline
    torch.set_num_threads(2)
    packed, values = acbench.numpy_bitmap_encode(x)
    q = acbench.torch_eager_quantize(torch.from_numpy(values.view(x.dtype)), bits)

    def encode():
        p, v = acbench.numpy_bitmap_encode(x)
        return p, acbench.torch_eager_quantize(torch.from_numpy(v.view(x.dtype)), bits)

    def decode():
        vals = acbench.torch_eager_dequantize(*q, bits).numpy()
        return acbench.numpy_bitmap_decode(packed, vals.view(values.dtype), x.size)
    result = benchmark({"encode": encode, "decode": decode}[op])
    if op == "decode":
        assert np.array_equal(result == 0, x == 0)
