"""The CUDA reductions (actcodec.reduce on device arrays), against the same reference as the
CPU ones.

No GPU is attached here, so the kernels run under the Numba CUDA simulator, which must be
switched on before numba.cuda is first imported: in a plain `pytest` run,
test_kernels_under_the_simulator runs this file again in a subprocess with
NUMBA_ENABLE_CUDASIM=1, and the kernel tests of this process are skipped (on a machine with a
GPU they run here for real as well). test_kernels_compile_to_ptx checks, without a GPU, that
every kernel variant also compiles for real hardware when a CUDA toolkit (NVVM) is found.
"""
import itertools
import os
import subprocess
import sys
import threading
import traceback
from pathlib import Path

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

numba = pytest.importorskip("numba")

from actcodec import reduce  # noqa: E402
from actcodec.reduce import profile as rprofile  # noqa: E402
from strategies import bit_arrays  # noqa: E402
from test_reduce import check_groups, check_minmax  # noqa: E402

SIMULATED = bool(numba.config.ENABLE_CUDASIM)
STRATS = ["tree", "atomic", "hybrid"]
SMALL = st.one_of(st.integers(1, 40), st.sampled_from([63, 64, 65, 127, 129]))


def _gpu() -> bool:
    if SIMULATED:
        return True
    from numba import cuda

    return cuda.is_available()


kernel_test = pytest.mark.skipif(
    not _gpu(), reason="no GPU: run under the CUDA simulator by test_kernels_under_the_simulator")


@pytest.fixture(autouse=True)
def small_blocks(tmp_path, monkeypatch):
    """Tiny blocks (every simulated thread is a Python thread) and a fast GIL hand-over for
    the simulator's polling of its threads; profiles go to a temporary directory."""
    monkeypatch.setenv("ACTCODEC_CACHE_DIR", str(tmp_path / "cache"))
    monkeypatch.delenv("ACTCODEC_REDUCE_STRATEGY", raising=False)
    monkeypatch.setattr(rprofile, "_memory", {})
    if not SIMULATED:
        yield
        return
    from actcodec.reduce import cuda as rcuda

    from numba.cuda.simulator.kernelapi import FakeCUDAShared

    monkeypatch.setattr(FakeCUDAShared, "array", _shared_once(FakeCUDAShared.array))
    old = rcuda.configure(4, 8)
    interval = sys.getswitchinterval()
    sys.setswitchinterval(1e-4)
    yield
    sys.setswitchinterval(interval)
    rcuda.configure(*old)


def _shared_once(real):
    """The simulator's cuda.shared.array (`real`), made once per block and source line under
    a lock. Numba's own looks the line up and creates the array unlocked: two threads of a
    block can each make one, and the writes of the thread left with the array the dict
    dropped are lost (a tree reduction then misses that thread's values, now and then)."""
    from numba.core import types
    from numba.np import numpy_support

    lock = threading.Lock()

    def array(self, shape, dtype):
        if shape == 0:  # dynamic shared memory: one buffer, nothing created per line
            return real(self, shape, dtype)
        if isinstance(dtype, types.Type):
            dtype = numpy_support.as_dtype(dtype)
        caller = traceback.extract_stack(sys._getframe(1), limit=1)[-1][0:2]
        with lock:
            res = self._allocations.get(caller)
            if res is None:
                res = self._allocations[caller] = np.empty(shape, dtype)
        return res
    return array


def to_device(x):
    from numba import cuda

    return cuda.to_device(np.ascontiguousarray(x))


def device_case(case):
    """(name, bits, device array) for the float dtypes CUDA takes (bfloat16 only via torch)."""
    name, bits = case
    if name == "bfloat16":
        name = "float16"
    return name, bits, to_device(bits.view(name))


@kernel_test
@settings(max_examples=40)
@given(bit_arrays(lengths=SMALL), st.sampled_from(STRATS), st.one_of(st.none(),
                                                                     st.integers(1, 50)))
def test_matches_reference(case, strategy, group):
    name, bits, d = device_case(case)
    if group is None:
        check_minmax(name, bits, reduce.minmax(d, strategy=strategy))
    else:
        lo, hi = reduce.group_minmax(d, group, strategy=strategy)
        assert lo.dtype == np.dtype(name) and lo.shape == (-(-bits.size // group),)
        check_groups(name, bits, group, lo.copy_to_host(), hi.copy_to_host())


@kernel_test
@pytest.mark.parametrize("strategy", STRATS)
@pytest.mark.parametrize("dt", [np.float16, np.float32, np.float64])
def test_semantics_and_tails(dt, strategy):
    def mm(values):
        return reduce.minmax(to_device(np.array(values, dt)), strategy=strategy)

    lo, hi = mm([0.0, -0.0, 0.0])
    assert (lo, np.signbit(lo), hi, np.signbit(hi)) == (0.0, True, 0.0, False)
    assert mm([-np.inf, 2.0, np.inf]) == (-np.inf, np.inf)
    assert all(np.isnan(mm([1.0, -np.nan, 3.0])))
    assert mm([7.0]) == (7.0, 7.0)
    x = np.random.default_rng(5).standard_normal(103).astype(dt)
    bits = x.view({2: np.uint16, 4: np.uint32, 8: np.uint64}[x.itemsize])
    for group in (1, 32, 33, 50, 103, 200):  # spans, group ends and the short last group
        lo, hi = reduce.group_minmax(to_device(x), group, strategy=strategy)
        check_groups(np.dtype(dt).name, bits, group, lo.copy_to_host(), hi.copy_to_host())


@kernel_test
def test_tree_takes_several_passes():
    # 4 threads x 8 items: 1100 elements are 35 block partials, then 2, then 1
    x = np.random.default_rng(6).standard_normal(1100).astype(np.float32)
    x[1099] = -9.0
    assert reduce.minmax(to_device(x), strategy="tree") == (-9.0, float(x.max()))


@kernel_test
def test_inputs_and_errors():
    from numba import cuda

    d = to_device(np.arange(12, dtype=np.float32).reshape(3, 4))
    assert reduce.minmax(d) == (0.0, 11.0)  # 2-D device arrays are read flat
    with pytest.raises(ValueError, match="empty"):
        reduce.minmax(cuda.device_array(0, np.float32))
    with pytest.raises(TypeError, match="unsupported dtype"):
        reduce.minmax(to_device(np.arange(4, dtype=np.int32)))
    with pytest.raises(ValueError, match="contiguous"):
        reduce.minmax(cuda.to_device(np.asfortranarray(np.ones((3, 4), np.float32))))
    with pytest.raises(ValueError):
        reduce.minmax(d, dtype="bfloat16")
    with pytest.raises(ValueError, match="strategy"):
        reduce.minmax(d, strategy="warp")


@kernel_test
def test_auto_and_profile(tmp_path):
    d = to_device(np.ones(50, np.float32))
    if SIMULATED:  # the simulator's timings say nothing about a GPU: a fixed choice
        assert reduce.strategy_for(d) == reduce.SIMULATOR_STRATEGY
    assert reduce.minmax(d) == (1.0, 1.0)
    reduce.set_auto_strategy("tree")
    try:
        assert reduce.strategy_for(d) == "tree"
    finally:
        reduce.set_auto_strategy(None)
    # the profiling machinery itself, on sizes the simulator can afford
    entry = reduce.profile_strategies("cuda", "float32", sizes=(64, 256), rounds=1)
    assert entry["sizes"] == [64, 256] and all(b in STRATS for b in entry["best"])
    assert (tmp_path / "cache" / rprofile.FILENAME).exists()


@kernel_test
def test_configure_validates():
    from actcodec.reduce import cuda as rcuda

    with pytest.raises(ValueError):
        rcuda.configure(threads_per_block=6)
    with pytest.raises(ValueError):
        rcuda.configure(items_per_thread=0)


# -- run from a plain pytest process ---------------------------------------------------------

@pytest.mark.skipif(SIMULATED, reason="already inside the simulator")
def test_kernels_under_the_simulator():
    env = dict(os.environ, NUMBA_ENABLE_CUDASIM="1")
    root = Path(__file__).resolve().parent.parent
    proc = subprocess.run(
        [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider",
         str(Path(__file__).resolve())],
        cwd=root, env=env, capture_output=True, text=True, timeout=240)
    assert proc.returncode == 0, proc.stdout[-6000:] + proc.stderr[-3000:]
    assert " passed" in proc.stdout and " failed" not in proc.stdout, proc.stdout[-2000:]


def _nvvm_found() -> bool:
    try:
        from numba.cuda.cudadrv import nvvm

        nvvm.NVVM()
        return True
    except Exception:  # no toolkit, or not found: set CUDA_HOME to run this check
        return False


@pytest.mark.skipif(SIMULATED, reason="compiles for real hardware, outside the simulator")
@pytest.mark.skipif(not SIMULATED and not _nvvm_found(),
                    reason="no CUDA toolkit (NVVM) found; set CUDA_HOME")
def test_kernels_compile_to_ptx():
    from numba import cuda, int16, int32, int64

    from actcodec.reduce import cuda as rcuda

    src = {2: int16, 4: int32, 8: int64}
    for itemsize, (from_bits, thread_atomic, block_atomic) in itertools.product(
            (2, 4, 8), [(True, False, False), (False, False, False), (True, False, True),
                        (True, True, True)]):
        key = int64 if itemsize == 8 else int32
        s = src[itemsize] if from_bits else key
        k = rcuda._block_kernel(256, 8, itemsize, from_bits, thread_atomic, block_atomic)
        ptx, _ = cuda.compile_ptx(k.py_func, (s[::1], s[::1], int64, int64, int64, key[::1],
                                              key[::1]), cc=(7, 5))
        if block_atomic:  # native integer atomics, not a compare-and-swap loop
            assert f"atom.global.min.s{key.bitwidth}" in ptx
    for name, itemsize in (("float16", 2), ("bfloat16", 2), ("float32", 4), ("float64", 8)):
        key = int64 if itemsize == 8 else int32
        cuda.compile_ptx(rcuda._finish_kernel(name).py_func,
                         (key[::1], key[::1], src[itemsize][::1], src[itemsize][::1]),
                         cc=(7, 5))
