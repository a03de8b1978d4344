"""pytest-benchmark suite for the sparse bitmap codec: 64 MiB float32 at 10/50/90% zeros,
beside a 2-thread copy of the same array and the numpy reference. Run:
    pytest bench/test_bench_bitmap.py --benchmark-group-by=param:case
The README's ratios come from `python -m actcodec bench` (interleaved rounds, one run)."""
import numpy as np
import pytest

import actcodec
from actcodec import benchmark as acbench

MIB = 64
ZEROS = [0.1, 0.5, 0.9]


@pytest.fixture(scope="module", params=ZEROS, ids=[f"{z:.0%}-zeros" for z in ZEROS])
def case(request):
    x = acbench.relu_like(MIB << 20, request.param)
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
        assert np.array_equal(result.view(np.uint32), x.view(np.uint32))
