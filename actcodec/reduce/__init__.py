"""Min/max reductions for dynamic activation quantization (DAF 3.2), as Numba kernels.

    from actcodec import reduce
    lo, hi = reduce.minmax(x)                   # Python floats
    mins, maxs = reduce.group_minmax(x, 128)    # per group of 128 (C order), x's dtype

Inputs: float16, bfloat16, float32 and float64 numpy arrays (bfloat16 as ml_dtypes, or uint16
bit patterns with ``dtype="bfloat16"``), CPU torch tensors (read in place, zero-copy), and CUDA
arrays (numba device arrays, torch CUDA tensors, anything with ``__cuda_array_interface__``).

Results: ``minmax`` returns Python floats, which hold every value of these dtypes exactly.
``group_minmax`` returns two arrays of the input's kind and dtype: numpy for numpy input
(ml_dtypes.bfloat16 if installed, else uint16 bits, for bfloat16), torch for torch input,
numba device arrays for other CUDA input. The last group may be short.

Semantics (the same for every strategy and device):
- NaN propagates as in numpy: if a group holds a NaN, its min and max are both NaN (one of
  the group's own NaN bit patterns).
- -0.0 < +0.0: min of [0.0, -0.0] is -0.0, max is +0.0 (numpy may return either).
- Empty input raises ValueError. Results are exact: they are elements of the input.
- Layout: ``minmax`` reads any dense layout in place (element order does not matter);
  other strided inputs, and non-C-contiguous input to ``group_minmax``, are copied once.
  CUDA input must be C-contiguous.

Strategies (DAF 3.2.1-3.2.2; see cpu.py and cuda.py): ``"tree"``, ``"atomic"``, ``"hybrid"``,
or ``"auto"`` (the default), which takes the fastest per (device, element width, thread count,
group size bucket) from a one-time profile cached in memory and on disk (see profile.py).
CPU threads are Numba's: ``numba.set_num_threads`` or NUMBA_NUM_THREADS.

This package imports only numpy and numba (torch and numba.cuda when given such inputs).
"""
from __future__ import annotations

import functools
import numbers

import numpy as np

if not hasattr(np, "row_stack"):
    # numba-cuda (0.30.4, the newest) registers an overload of np.row_stack when numba.cuda
    # is first imported; NumPy 2.5 removed that alias of np.vstack, so that import fails.
    np.row_stack = np.vstack

import numba  # noqa: E402
from llvmlite import binding as _llvm  # noqa: E402

from . import cpu, keys, inputs  # noqa: E402
from . import profile as _profile  # noqa: E402

STRATEGIES = ("auto", "tree", "atomic", "hybrid")
SIMULATOR_STRATEGY = "hybrid"  # what "auto" runs under the CUDA simulator: its timings mean nothing


def minmax(x, *, strategy: str = "auto", dtype: str | None = None) -> tuple[float, float]:
    """(min, max) of all elements, as Python floats."""
    lo, hi, name, _ = _reduce(x, None, strategy, dtype)
    if not isinstance(lo, np.ndarray):  # device arrays: two elements back to the host
        lo, hi = lo.copy_to_host(), hi.copy_to_host()
    return _as_float(lo, name), _as_float(hi, name)


def group_minmax(x, group_size: int, *, strategy: str = "auto", dtype: str | None = None):
    """(mins, maxs) per group of `group_size` consecutive elements in C order."""
    lo, hi, _, wrap = _reduce(x, _checked_group(group_size), strategy, dtype)
    return wrap(lo), wrap(hi)


def strategy_for(x, group_size: int | None = None, *, dtype: str | None = None) -> str | None:
    """The strategy ``strategy="auto"`` runs for this input (profiling first if needed), or
    None when nothing is combined (the input, or every group, fits one chunk of work)."""
    if group_size is not None:
        group_size = _checked_group(group_size)
    if inputs.is_device(x):
        from . import cuda as _cuda

        bits, _, _ = _cuda.as_device_bits(x)
        group = bits.size if group_size is None else group_size
        return _resolve_cuda("auto", group, bits.dtype.itemsize)
    h = inputs.host(x, dtype, any_order=group_size is None)
    group = h.bits.size if group_size is None else group_size
    return _resolve_cpu("auto", h.bits.size, group, h.bits.itemsize)


def profile_strategies(device: str = "cpu", dtype: str = "float32", *, rerun: bool = False,
                       sizes=_profile.SIZES, rounds: int = _profile.ROUNDS) -> dict:
    """The auto profile of `device` ("cpu" or "cuda") for `dtype`: {"sizes": bucket bytes,
    "best": strategy per bucket, "ms": median milliseconds per strategy and bucket, ...}.
    Measures it now if there is none yet, or if `rerun`."""
    if dtype not in inputs.FLOATS:
        raise ValueError(f"dtype must be one of {', '.join(inputs.FLOATS)}, got {dtype!r}")
    itemsize = np.dtype(np.uint16 if dtype == "bfloat16" else dtype).itemsize
    if device == "cpu":
        return _profile.get(_cpu_device(), itemsize, _cpu_bench(itemsize), cpu.STRATEGIES,
                            rerun=rerun, sizes=sizes, rounds=rounds)
    if device == "cuda":
        from . import cuda as _cuda

        return _profile.get(_cuda.device_name(), itemsize, _cuda_bench(itemsize),
                            _cuda.STRATEGIES, rerun=rerun, sizes=sizes, rounds=rounds)
    raise ValueError(f"device must be 'cpu' or 'cuda', got {device!r}")


def set_auto_strategy(strategy: str | None) -> None:
    """Make "auto" run `strategy` everywhere in this process, skipping the profile; None
    goes back to the profile. ACTCODEC_REDUCE_STRATEGY=name does the same from outside."""
    if strategy is not None:
        _check(strategy, STRATEGIES[1:])
    _profile.force(strategy)


def _checked_group(group_size) -> int:
    if isinstance(group_size, bool) or not isinstance(group_size, numbers.Integral):
        raise TypeError(f"group_size must be an integer, got {type(group_size).__name__}")
    if group_size < 1:
        raise ValueError(f"group_size must be >= 1, got {group_size}")
    return int(group_size)


def _check(strategy, allowed=STRATEGIES) -> str:
    if strategy not in allowed:
        raise ValueError(f"unknown strategy {strategy!r}; choose from {', '.join(allowed)}")
    return strategy


def _reduce(x, group, strategy, dtype):
    """(min, max) result arrays, dtype name, and the wrapper to the caller's array kind."""
    _check(strategy)
    if inputs.is_device(x):
        if dtype is not None:
            raise ValueError("dtype= tags host bit-pattern arrays, not device arrays")
        from . import cuda as _cuda

        bits, name, wrap = _cuda.as_device_bits(x)
        group = bits.size if group is None else group
        chosen = _resolve_cuda(strategy, group, bits.dtype.itemsize)
        lo, hi = _cuda.reduce(bits, name, group, chosen)
        return lo, hi, name, wrap
    h = inputs.host(x, dtype, any_order=group is None)
    group = h.bits.size if group is None else group
    chosen = _resolve_cpu(strategy, h.bits.size, group, h.bits.itemsize)
    lo, hi = keys.resolve_nan(*cpu.reduce_keys(h.bits, group, chosen), h.name)
    return lo, hi, h.name, h.wrap


def _resolve_cpu(strategy, n, group, itemsize):
    if strategy != "auto":
        return strategy
    if not cpu.needs_strategy(n, group, itemsize):
        return None
    forced = _profile.forced()
    if forced:
        return _check(forced, STRATEGIES[1:])
    entry = _profile.get(_cpu_device(), itemsize, _cpu_bench(itemsize), cpu.STRATEGIES)
    return _profile.pick(entry, group * itemsize)


def _resolve_cuda(strategy, group, itemsize):
    if strategy != "auto":
        return strategy
    forced = _profile.forced()
    if forced:
        return _check(forced, STRATEGIES[1:])
    if numba.config.ENABLE_CUDASIM:
        return SIMULATOR_STRATEGY
    from . import cuda as _cuda

    entry = _profile.get(_cuda.device_name(), itemsize, _cuda_bench(itemsize), _cuda.STRATEGIES)
    return _profile.pick(entry, group * itemsize)


@functools.lru_cache(maxsize=None)
def _host_cpu() -> str:
    return _llvm.get_host_cpu_name()  # an LLVM call of ~20 us: once, not per reduction


def _cpu_device() -> str:
    return f"cpu {_host_cpu()} {numba.get_num_threads()}t"


def _cpu_bench(itemsize):
    def bench(nbytes):
        bits = np.ones(nbytes // itemsize, inputs.INT_OF[itemsize])
        return {s: (lambda s=s: cpu.reduce_keys(bits, bits.size, s)) for s in cpu.STRATEGIES}
    return bench


def _cuda_bench(itemsize):
    from numba import cuda as nbcuda

    from . import cuda as _cuda

    name = {2: "float16", 4: "float32", 8: "float64"}[itemsize]

    def bench(nbytes):
        bits = nbcuda.to_device(np.ones(nbytes // itemsize, inputs.INT_OF[itemsize]))

        def run(s):
            _cuda.reduce(bits, name, bits.size, s)
            nbcuda.synchronize()
        return {s: (lambda s=s: run(s)) for s in _cuda.STRATEGIES}
    return bench


def _as_float(bits: np.ndarray, name: str) -> float:
    if name == "bfloat16":  # bfloat16 is the top half of a float32
        return float((bits.view(np.uint16).astype(np.uint32) << 16).view(np.float32)[0])
    return float(bits.view(name)[0])


__all__ = [
    "STRATEGIES", "group_minmax", "minmax", "profile_strategies", "set_auto_strategy",
    "strategy_for",
]
