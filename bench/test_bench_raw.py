"""pytest-benchmark suite for the raw codec (the array stored as is): 64 MiB float32 and
float16, beside a 2-thread copy, numpy's copy (what raw runs) and torch's clone. Run:
    pytest bench/test_bench_raw.py --benchmark-group-by=param:dtype
The README's ratios come from `python -m actcodec bench` (interleaved rounds, one run)."""
import pytest

import actcodec
from actcodec import benchmark as acbench

MIB = 64


@pytest.fixture(scope="module", params=["float32", "float16"])
def dtype(request):
    return request.param


@pytest.fixture(scope="module")
def case(dtype):
    x = acbench.normal(MIB << 20, dtype)
    return x, actcodec.raw.encode(x)


@pytest.mark.parametrize("op", ["copy", "encode", "decode", "numpy_copy", "torch_clone"])
def test_raw(benchmark, case, op):
    x, enc = case
    if op == "torch_clone":
        torch = pytest.importorskip("torch")  # optional baseline
        torch.set_num_threads(2)
        fn = torch.from_numpy(x).clone
    else:
        fn = {"copy": lambda: acbench.threaded_copy(x), "encode": lambda: actcodec.raw.encode(x),
              "decode": enc.decode, "numpy_copy": x.copy}[op]
    result = benchmark(fn)
    if op == "decode":
        assert result.tobytes() == x.tobytes()
