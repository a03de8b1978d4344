"""pytest-benchmark suite for the Numba min/max reductions: 64 MiB of float32 (and float16,
float64) on 2 threads, every strategy beside torch.aminmax and numpy min() + max(). Run:
    pytest bench/test_bench_reduce.py --benchmark-group-by=param:dtype
The quoted ratios come from actcodec.reduce.reduce_report() (interleaved rounds, one run)."""
import numpy as np
import pytest

numba = pytest.importorskip("numba")

from actcodec import reduce  # noqa: E402

MIB = 64
OPS = ["auto", "tree", "atomic", "hybrid", "torch_aminmax", "numpy_min_max"]


@pytest.fixture(scope="module", autouse=True)
def two_threads_fresh_profile():
    """2 threads for Numba and torch; "auto" profiles in this run, in memory only (neither
    read from nor written to the user's cache)."""
    old = numba.get_num_threads()
    numba.set_num_threads(2)
    try:
        import torch
    except ImportError:
        torch = None
    if torch is not None:
        old_torch = torch.get_num_threads()
        torch.set_num_threads(2)
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("ACTCODEC_CACHE_DIR", "off")
        mp.delenv("ACTCODEC_REDUCE_STRATEGY", raising=False)
        yield
    numba.set_num_threads(old)
    if torch is not None:
        torch.set_num_threads(old_torch)


@pytest.fixture(scope="module", params=["float32", "float16", "float64"])
def dtype(request):
    return request.param


@pytest.fixture(scope="module")
def data(dtype):
    x = np.random.default_rng(0).standard_normal(
        (MIB << 20) // np.dtype(dtype).itemsize, dtype=np.float32).astype(dtype)
    reduce.strategy_for(x)  # profile outside the timed runs
    return x, (float(x.min()), float(x.max()))


@pytest.mark.parametrize("op", OPS)
def test_minmax(benchmark, data, op):
    x, want = data
    if op == "torch_aminmax":
        torch = pytest.importorskip("torch")
        t = torch.from_numpy(x)
        lo, hi = benchmark(lambda: torch.aminmax(t))
        got = (float(lo), float(hi))
    elif op == "numpy_min_max":
        if x.dtype == np.float16:
            pytest.skip("numpy's float16 min/max is scalar code: seconds per round")
        got = tuple(float(v) for v in benchmark(lambda: (x.min(), x.max())))
    else:
        got = benchmark(lambda: reduce.minmax(x, strategy=op))
    assert got == want
