"""pytest-benchmark suite for the automatic codec choice: 64 MiB float32 and float16, lossless
and 4-bit, on dense N(0,1) values and ReLU-like activations (50% zeros), beside a 2-thread copy
and a direct call of the codec auto chooses (the difference is auto's counting pass). Run:
    pytest bench/test_bench_auto.py --benchmark-group-by=param:case
The README's ratios come from `python -m actcodec bench` (interleaved rounds, one run)."""
import pytest

import actcodec
from actcodec import benchmark as acbench

MIB = 64
# (bits, zero fraction, the codec auto must choose)
CASES = [(None, 0.0, "raw"), (None, 0.5, "bitmap"), (4, 0.5, "bitmap_quant"), (4, 0.0, "quant")]
PARAMS = [(dt, *c) for dt in ("float32", "float16") for c in CASES]


@pytest.fixture(scope="module", params=PARAMS,
                ids=[f"{dt}-{'lossless' if b is None else f'{b}bit'}-{z:.0%}-zeros"
                     for dt, b, z, _ in PARAMS])
def case(request):
    dtype, bits, zeros, chosen = request.param
    x = (acbench.relu_like(MIB << 20, zeros, dtype=dtype) if zeros
         else acbench.normal(MIB << 20, dtype))
    enc = actcodec.encode(x, bits=bits)
    assert enc.codec == chosen
    return x, bits, enc


@pytest.mark.parametrize("op", ["copy", "encode", "direct_encode", "decode"])
def test_auto(benchmark, case, op):
    x, bits, enc = case
    fn = {"copy": lambda: acbench.threaded_copy(x),
          "encode": lambda: actcodec.encode(x, bits=bits),
          "direct_encode": lambda: actcodec.encode(x, enc.codec, bits=bits),
          "decode": enc.decode}[op]
    benchmark(fn)
