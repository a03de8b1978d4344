"""Numba min/max reductions (actcodec.reduce) on the CPU: every strategy against numpy, with
the documented NaN / -0.0 / empty semantics, on every dtype, layout and chunking. The CUDA
kernels are tested in test_reduce_cuda.py (under the simulator)."""
import json
from contextlib import contextmanager

import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st

numba = pytest.importorskip("numba")

from actcodec import reduce  # noqa: E402
from actcodec.reduce import cpu, inputs, keys  # noqa: E402
from actcodec.reduce.atomics import atomic_max, atomic_min  # noqa: E402
from actcodec.reduce import profile as rprofile  # noqa: E402
from strategies import bit_arrays  # noqa: E402

STRATS = ["tree", "atomic", "hybrid"]
INT_OF = {2: np.int16, 4: np.int32, 8: np.int64}
UINT_OF = {2: np.uint16, 4: np.uint32, 8: np.uint64}
NONEMPTY = st.one_of(st.integers(1, 70), st.sampled_from([1023, 1024, 1025, 4097]),
                     st.integers(1, 3000))


@pytest.fixture(autouse=True)
def isolated(tmp_path, monkeypatch):
    """Profiles go to a temporary directory, never the real home; nothing leaks between tests."""
    monkeypatch.setenv("ACTCODEC_CACHE_DIR", str(tmp_path / "cache"))
    monkeypatch.delenv("ACTCODEC_REDUCE_STRATEGY", raising=False)
    monkeypatch.setattr(rprofile, "_memory", {})
    monkeypatch.setattr(rprofile, "_forced", None)
    threads = numba.get_num_threads()
    yield
    numba.set_num_threads(threads)


@contextmanager
def chunk_elements(n, itemsize):
    """Shrink the unit of parallel work so that small arrays take the combining paths."""
    old = cpu.CHUNK_BYTES
    cpu.CHUNK_BYTES = n * itemsize
    try:
        yield
    finally:
        cpu.CHUNK_BYTES = old


# -- the reference -------------------------------------------------------------------------

def values_of(name, bits):
    """float64 values of bit patterns (exact for every format)."""
    with np.errstate(invalid="ignore"):  # signalling NaNs stay NaN
        if name == "bfloat16":
            return (bits.astype(np.uint32) << 16).view(np.float32).astype(np.float64)
        return bits.view(name).astype(np.float64)


def expected(name, bits):
    """(min, max) as float64 by the documented rules, or (nan, nan)."""
    v = values_of(name, bits)
    if np.isnan(v).any():
        return np.nan, np.nan
    lo, hi = v.min(), v.max()
    zero = v == 0
    if lo == 0:
        lo = -0.0 if (zero & np.signbit(v)).any() else 0.0
    if hi == 0:
        hi = 0.0 if (zero & ~np.signbit(v)).any() else -0.0
    return lo, hi


def same(got: float, want: float) -> bool:
    """Equal as floats and in the sign of zero, or both NaN."""
    if np.isnan(want):
        return np.isnan(got)
    return got == want and np.signbit(got) == np.signbit(want)


def check_minmax(name, bits, got):
    want = expected(name, bits)
    assert same(got[0], want[0]) and same(got[1], want[1]), (got, want)


def result_bits(arr):
    """Bit patterns of a result array (numpy, ml_dtypes or torch)."""
    if type(arr).__module__.startswith("torch"):
        import torch

        arr = arr.view({2: torch.int16, 4: torch.int32, 8: torch.int64}[arr.element_size()])
        arr = arr.numpy()
    return np.asarray(arr).view(UINT_OF[arr.itemsize])


def check_groups(name, bits, group, got_lo, got_hi):
    lo_bits, hi_bits = result_bits(got_lo), result_bits(got_hi)
    ngroups = -(-bits.size // group)
    assert lo_bits.shape == hi_bits.shape == (ngroups,)
    for g in range(ngroups):
        part = bits[g * group:(g + 1) * group]
        want = expected(name, part)
        for got, w in ((lo_bits[g:g + 1], want[0]), (hi_bits[g:g + 1], want[1])):
            assert same(values_of(name, got)[0], w), (g, got, w)
            assert got[0] in part  # exact: one of the group's own bit patterns (NaN included)


def as_input(name, bits):
    return (bits, "bfloat16") if name == "bfloat16" else (bits.view(name), None)


# -- every strategy against the reference ----------------------------------------------------

@given(bit_arrays(lengths=NONEMPTY), st.sampled_from(STRATS), st.sampled_from([1, 3, 8, 64]))
def test_minmax_matches_reference(case, strategy, chunk):
    name, bits = case
    x, tag = as_input(name, bits)
    with chunk_elements(chunk, bits.itemsize):
        check_minmax(name, bits, reduce.minmax(x, strategy=strategy, dtype=tag))


@given(bit_arrays(lengths=NONEMPTY), st.sampled_from(STRATS), st.sampled_from([1, 5, 16]),
       st.integers(1, 80))
def test_group_minmax_matches_reference(case, strategy, chunk, group):
    name, bits = case
    x, tag = as_input(name, bits)
    with chunk_elements(chunk, bits.itemsize):
        lo, hi = reduce.group_minmax(x, group, strategy=strategy, dtype=tag)
    check_groups(name, bits, group, lo, hi)


@pytest.mark.parametrize("threads", [1, 2])
@pytest.mark.parametrize("strategy", STRATS)
@pytest.mark.parametrize("name", ["float16", "float32", "float64"])
@pytest.mark.parametrize("n", [1, 2, 7, 8, 9, 63, 64, 65, 1023, 1025])
def test_odd_sizes_and_tails(n, name, strategy, threads):
    numba.set_num_threads(threads)
    x = np.random.default_rng(n).standard_normal(n).astype(name)
    bits = x.view(UINT_OF[x.itemsize])
    with chunk_elements(4, x.itemsize):
        check_minmax(name, bits, reduce.minmax(x, strategy=strategy))
        for group in (1, 3, 8, n, n + 5):
            check_groups(name, bits, group, *reduce.group_minmax(x, group, strategy=strategy))


@pytest.mark.parametrize("strategy", ["auto"] + STRATS)
@pytest.mark.parametrize("name", ["float16", "bfloat16", "float32", "float64"])
def test_full_size_chunks(name, strategy):
    """The real chunk size: the threaded paths, with awkward values at chunk edges."""
    itemsize = 2 if name.endswith("16") else np.dtype(name).itemsize
    chunk = cpu.chunk_elements(itemsize)
    n = 5 * chunk + 3
    rng = np.random.default_rng(1)
    bits = rng.integers(0, 1 << 14, n).astype(UINT_OF[itemsize])  # small positive values
    neg_zero = UINT_OF[itemsize](1 << (8 * itemsize - 1))
    bits[[chunk - 1, 2 * chunk, n - 1]] = neg_zero
    x, tag = as_input(name, bits)
    check_minmax(name, bits, reduce.minmax(x, strategy=strategy, dtype=tag))
    for group in (1000, 2 * chunk + 7, n):  # whole groups per thread; groups over chunks
        check_groups(name, bits, group, *reduce.group_minmax(x, group, strategy=strategy,
                                                             dtype=tag))
    bits[chunk + 5] = {2: 0xFE01, 4: 0xFFC00001, 8: 0xFFF8000000000001}[itemsize]  # -NaN
    x, tag = as_input(name, bits)
    check_minmax(name, bits, reduce.minmax(x, strategy=strategy, dtype=tag))


# -- the documented semantics ----------------------------------------------------------------

@pytest.mark.parametrize("strategy", ["auto"] + STRATS)
@pytest.mark.parametrize("dt", [np.float16, np.float32, np.float64])
def test_signed_zero_nan_inf(dt, strategy):
    def mm(values):
        return reduce.minmax(np.array(values, dt), strategy=strategy)

    lo, hi = mm([0.0, -0.0])
    assert (lo, np.signbit(lo), hi, np.signbit(hi)) == (0.0, True, 0.0, False)
    lo, hi = mm([-0.0, -0.0])
    assert np.signbit(lo) and np.signbit(hi)
    assert mm([-np.inf, 1.0, np.inf]) == (-np.inf, np.inf)
    assert all(np.isnan(mm([1.0, np.nan, -2.0])))
    assert all(np.isnan(mm([np.nan])))
    assert mm([3.5] * 100) == (3.5, 3.5)
    np_lo = np.min(np.array([1.0, np.nan], dt))
    assert np.isnan(np_lo)  # what "NaN propagates like numpy" refers to


def test_nan_result_is_an_input_nan():
    bits = np.array([0x3F800000, 0xFFC00001, 0x7FC00002, 0x7F800005], np.uint32)
    lo, hi = reduce.group_minmax(bits.view(np.float32), 4)
    assert lo.view(np.uint32)[0] == hi.view(np.uint32)[0] == 0x7FC00002  # largest +NaN
    lo, hi = reduce.group_minmax(bits[:2].view(np.float32), 2)
    assert lo.view(np.uint32)[0] == hi.view(np.uint32)[0] == 0xFFC00001  # only a -NaN


def test_float16_results_exact():
    every = np.arange(1 << 16, dtype=np.uint32).astype(np.uint16)
    finite = every[np.isfinite(every.view(np.float16))]
    x = finite.view(np.float16)
    lo, hi = reduce.minmax(x)
    assert (lo, hi) == (-65504.0, 65504.0)
    lo, hi = reduce.group_minmax(x, 1)
    assert lo.dtype == np.float16 and lo.view(np.uint16).tobytes() == finite.tobytes()


def test_key_order_over_every_float16():
    bits = np.arange(1 << 16, dtype=np.uint32).astype(np.uint16).view(np.int16)
    k = keys.key(bits)
    assert np.array_equal(keys.key(k), bits)  # an involution
    order = bits[np.argsort(k, kind="stable")].view(np.float16).astype(np.float64)
    nan = np.isnan(order)
    n_neg_nan = np.argmin(nan)  # -NaNs first, +NaNs last, every number in between
    assert nan[:n_neg_nan].all() and nan[-n_neg_nan:].all()
    middle = order[n_neg_nan:-n_neg_nan]
    assert not np.isnan(middle).any() and (np.diff(middle) >= 0).all()
    zeros = np.flatnonzero(middle == 0)
    assert np.signbit(middle[zeros[0]]) and not np.signbit(middle[zeros[1]])


def test_empty_and_bad_arguments_raise():
    with pytest.raises(ValueError, match="empty"):
        reduce.minmax(np.array([], np.float32))
    with pytest.raises(ValueError, match="empty"):
        reduce.group_minmax(np.zeros((3, 0), np.float16), 4)
    x = np.ones(10, np.float32)
    with pytest.raises(ValueError):
        reduce.group_minmax(x, 0)
    with pytest.raises(TypeError):
        reduce.group_minmax(x, 2.0)
    with pytest.raises(TypeError):
        reduce.group_minmax(x, True)
    with pytest.raises(ValueError, match="strategy"):
        reduce.minmax(x, strategy="fastest")
    with pytest.raises(TypeError, match="unsupported dtype"):
        reduce.minmax(np.ones(4, np.int32))
    with pytest.raises(TypeError, match="unsupported dtype"):
        reduce.minmax(np.ones(4, np.complex64))
    with pytest.raises(TypeError):
        reduce.minmax(x, dtype="bfloat16")  # the tag is for 16-bit bit patterns
    with pytest.raises(ValueError):
        reduce.minmax(x, dtype="float8")
    with pytest.raises(ValueError):
        reduce.strategy_for(x, 0)
    with pytest.raises(ValueError, match="device"):
        reduce.profile_strategies("gpu")
    with pytest.raises(ValueError, match="dtype"):
        reduce.profile_strategies("cpu", "int8")


# -- inputs: layouts, torch, bfloat16 --------------------------------------------------------

def test_layouts():
    base = np.random.default_rng(2).standard_normal((37, 29)).astype(np.float32)
    f_order = np.asfortranarray(base)
    for x in (f_order, base.T, base[::3, 1::2], base[:, ::-1], np.float32(2.5)):
        want = (float(np.min(x)), float(np.max(x)))
        assert reduce.minmax(x) == want
        lo, hi = reduce.group_minmax(x, 5)
        flat = np.ascontiguousarray(x).reshape(-1)
        check_groups("float32", flat.view(np.uint32), 5, lo, hi)
    # whole-array reductions read any dense layout in place, group ones need C order
    assert np.shares_memory(inputs.host(f_order, None, any_order=True).bits, f_order)
    assert not np.shares_memory(inputs.host(f_order, None, any_order=False).bits, f_order)
    assert np.shares_memory(inputs.host(base, None, any_order=False).bits, base)


def test_array_interface_objects():
    class Exported:
        def __init__(self, a):
            self.__array_interface__ = a.__array_interface__
            self._keep = a

    a = np.array([2.0, -1.0, 7.0], np.float64)
    assert reduce.minmax(Exported(a)) == (-1.0, 7.0)
    assert reduce.minmax([1.5, -2.5]) == (-2.5, 1.5)


def test_bfloat16_inputs():
    ml_dtypes = pytest.importorskip("ml_dtypes")
    x = np.array([1.5, -3.0, 0.25, -0.0], ml_dtypes.bfloat16)
    assert reduce.minmax(x) == (-3.0, 1.5)
    assert reduce.minmax(x.view(np.uint16), dtype="bfloat16") == (-3.0, 1.5)
    lo, hi = reduce.group_minmax(x, 2)
    assert lo.dtype == ml_dtypes.bfloat16 and lo.tolist() == [-3.0, -0.0]
    assert np.signbit(np.float32(lo[1]))


@pytest.mark.parametrize("dtype", ["float16", "bfloat16", "float32", "float64"])
def test_torch_tensors(dtype):
    torch = pytest.importorskip("torch")
    tdt = getattr(torch, dtype)
    t = torch.randn(1001, dtype=torch.float32).to(tdt)
    t[17] = -0.0
    want = (float(t.min()), float(t.max()))
    assert reduce.minmax(t) == want
    assert reduce.minmax(t.requires_grad_(True)) == want
    lo, hi = reduce.group_minmax(t.view(7, 143), 10)
    assert isinstance(lo, torch.Tensor) and lo.dtype == tdt and lo.shape == (101,)
    flat = t.detach().reshape(-1)
    pad = torch.full((1010,), float("inf"), dtype=tdt)
    pad[:1001] = flat
    assert torch.equal(lo, pad.view(101, 10).amin(1))
    # zero-copy: the kernels read the tensor's own memory
    host = inputs.host(t, None, any_order=True)
    assert host.bits.__array_interface__["data"][0] == t.data_ptr()
    every_other = t.detach()[::2]
    assert reduce.minmax(every_other) == (float(every_other.min()), float(every_other.max()))


def test_torch_rejects_other_devices_and_dtypes():
    torch = pytest.importorskip("torch")
    with pytest.raises(TypeError, match="unsupported dtype"):
        reduce.minmax(torch.ones(4, dtype=torch.int32))
    with pytest.raises(TypeError):
        reduce.minmax(torch.ones(4, device="meta"))
    with pytest.raises(ValueError):
        reduce.minmax(torch.ones(4), dtype="bfloat16")


# -- the CPU atomics ------------------------------------------------------------------------

@numba.njit(parallel=True, cache=True)
def _contend(values, slots):
    for i in numba.prange(values.size):
        atomic_min(slots, 0, values[i])
        atomic_max(slots, 1, values[i])


def test_cas_loops_under_contention():
    numba.set_num_threads(2)
    values = np.random.default_rng(3).permutation(200_000).astype(np.int32) - 100_000
    slots = np.array([np.iinfo(np.int32).max, np.iinfo(np.int32).min], np.int32)
    _contend(values, slots)
    assert slots.tolist() == [values.min(), values.max()]


# -- auto strategy and its profile -----------------------------------------------------------

def big():
    return np.ones(2 * cpu.chunk_elements(4), np.float32)


def test_auto_profiles_once_and_caches_on_disk(tmp_path, monkeypatch):
    x = big()
    assert reduce.strategy_for(np.ones(100, np.float32)) is None  # one chunk: nothing to pick
    assert not (tmp_path / "cache").exists()  # and no profile was run for it
    picked = reduce.strategy_for(x)
    assert picked in STRATS
    path = tmp_path / "cache" / rprofile.FILENAME
    stored = json.loads(path.read_text())
    (entry,) = stored.values()
    assert entry["sizes"] == list(rprofile.SIZES)
    assert set(entry["ms"]) == set(STRATS) and len(entry["best"]) == len(rprofile.SIZES)

    # a new process (empty memory) reads the disk copy instead of measuring again
    monkeypatch.setattr(rprofile, "_memory", {})
    monkeypatch.setattr(rprofile, "_measure", lambda *a: pytest.fail("measured again"))
    assert reduce.strategy_for(x) == picked
    assert reduce.minmax(x) == (1.0, 1.0)


def test_profile_rerun_and_override(monkeypatch):
    entry = reduce.profile_strategies("cpu", "float64", rerun=True, sizes=(1 << 20, 2 << 20),
                                      rounds=2)
    assert entry["sizes"] == [1 << 20, 2 << 20] and all(b in STRATS for b in entry["best"])

    reduce.set_auto_strategy("atomic")
    assert reduce.strategy_for(big()) == "atomic"
    reduce.set_auto_strategy(None)
    monkeypatch.setenv("ACTCODEC_REDUCE_STRATEGY", "tree")
    assert reduce.strategy_for(big()) == "tree"
    with pytest.raises(ValueError):
        reduce.set_auto_strategy("auto")


def test_cache_off_keeps_the_profile_in_memory(tmp_path, monkeypatch):
    monkeypatch.setenv("ACTCODEC_CACHE_DIR", "off")
    assert rprofile.cache_dir() is None
    assert reduce.strategy_for(big()) in STRATS
    assert not list(tmp_path.iterdir())


def test_cache_dir_resolution_and_damaged_file(tmp_path, monkeypatch):
    monkeypatch.delenv("ACTCODEC_CACHE_DIR")
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "xdg"))
    assert rprofile.cache_dir() == tmp_path / "xdg" / "actcodec"
    monkeypatch.delenv("XDG_CACHE_HOME")
    monkeypatch.setenv("HOME", str(tmp_path / "home"))
    assert rprofile.cache_dir() == tmp_path / "home" / ".cache" / "actcodec"

    monkeypatch.setenv("ACTCODEC_CACHE_DIR", str(tmp_path / "c"))
    (tmp_path / "c").mkdir()
    (tmp_path / "c" / rprofile.FILENAME).write_text("{not json")
    assert reduce.strategy_for(big()) in STRATS  # measured again, file rewritten
    assert json.loads((tmp_path / "c" / rprofile.FILENAME).read_text())
