"""pytest-benchmark suite for the sparse bitmap codec: 64 MiB float32 and float16 at 10/50/90%
zeros, beside a 2-thread copy of the same array and the numpy reference. Run:
    pytest bench/test_bench_bitmap.py --benchmark-group-by=param:case
The README's ratios come from `python -m actcodec bench` (interleaved rounds, one run)."""
import numpy as np
import pytest

import actcodec
from actcodec import benchmark as acbench

MIB = 64
ZEROS = [0.1, 0.5, 0.9]
CASES = [(dt, z) for dt in ("float32", "float16") for z in ZEROS]


@pytest.fixture(scope="module", params=CASES, ids=[f"{dt}-{z:.0%}-zeros" for dt, z in CASES])
def case(request):
    dtype, zeros = request.param
    x = acbench.relu_like(MIB << 20, zeros, dtype=dtype)
    return x, actcodec.bitmap.encode(x), acbench.numpy_bitmap_encode(x)


@pytest.mark.parametrize("op", ["copy", "encode", "decode", "numpy_encode", "numpy_decode"])
def test_bitmap(benchmark, case, op):
    x, enc, (packed, values) = case
    fn = {
        "copy": lambda: acbench.threaded_copy(x),
        "encode": lambda: actcodec.bitmap.encode(x),
        "decode": lambda: enc.decode(),
        "numpy_encode": lambda: acbench.numpy_bitmap_encode(x),
        "numpy_decode": lambda: acbench.numpy_bitmap_decode(packed, values, x.size),
    }[op]
    result = benchmark(fn)
    if op in ("decode", "numpy_decode"):
        assert np.array_equal(result.view(values.dtype), x.view(values.dtype))
