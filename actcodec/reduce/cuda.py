"""CUDA min/max kernels (numba.cuda), on order-preserving keys (see keys.py).

A block reduces a span of THREADS_PER_BLOCK * ITEMS_PER_THREAD elements of one group: each
thread folds its elements (strided by the block width, so reads coalesce) into registers.
The strategies are DAF's (3.2, Figure 4):

- ``tree``: a shared-memory tree within the block (halving the active threads per step), block
  partials written to global memory, and the same kernel run again over the partials until
  one per group is left (DAF's parallel reduction).
- ``hybrid``: the shared-memory tree within the block, then one native integer atomic min/max
  per block into the group's slot (Figure 4).
- ``atomic``: threads fold into a shared slot with shared-memory atomics, then one atomic per
  block into the group's slot (DAF's atomics "first at the thread level and then at the block
  level").

Keys make native integer atomics exact, so the float-as-int compare-and-swap loop of DAF
Algorithm 1 is not needed here (the CPU path uses it, having no atomic min). float16 keys are
widened to int32, which CUDA has atomics for; float64 keys are int64.

Without a GPU these run under the Numba CUDA simulator (NUMBA_ENABLE_CUDASIM=1 set before
numba.cuda is first imported); use configure() to shrink the blocks there, as every
simulated thread is a Python thread. No warp shuffles, so the simulated code is the real code.
"""
from __future__ import annotations

import functools

import numpy as np
from numba import config, cuda, int32, int64
from numba.cuda.cudadrv.devicearray import is_cuda_ndarray

from .inputs import INT_OF
from .keys import inf_keys

STRATEGIES = ("tree", "atomic", "hybrid")
THREADS_PER_BLOCK = 256
ITEMS_PER_THREAD = 8

_launch = {"threads": THREADS_PER_BLOCK, "items": ITEMS_PER_THREAD}


def configure(threads_per_block: int | None = None, items_per_thread: int | None = None):
    """Set the launch shape (the block must be a power of two, for the tree); returns the
    previous (threads_per_block, items_per_thread)."""
    old = (_launch["threads"], _launch["items"])
    if threads_per_block is not None:
        if threads_per_block < 1 or threads_per_block & (threads_per_block - 1):
            raise ValueError(f"threads_per_block must be a power of two, got {threads_per_block}")
        _launch["threads"] = threads_per_block
    if items_per_thread is not None:
        if items_per_thread < 1:
            raise ValueError(f"items_per_thread must be >= 1, got {items_per_thread}")
        _launch["items"] = items_per_thread
    return old


def device_name() -> str:
    """Profile key of the current device."""
    if config.ENABLE_CUDASIM:
        return "cudasim"
    dev = cuda.get_current_device()
    name = dev.name.decode() if isinstance(dev.name, bytes) else str(dev.name)
    return f"cuda {name} cc{dev.compute_capability[0]}.{dev.compute_capability[1]}"


def _key_type(src_itemsize: int):
    return (int64, np.int64) if src_itemsize == 8 else (int32, np.int32)


@functools.lru_cache(maxsize=None)
def _block_kernel(tpb: int, items: int, src_itemsize: int, from_bits: bool,
                  thread_atomic: bool, block_atomic: bool):
    """One pass: block u reduces span u of its group. from_bits: the sources are the float
    bits (one array twice), else (min, max) key partials of an earlier pass. The result goes
    to lo/hi[u] (partials), or atomically to lo/hi[group] when block_atomic."""
    key_nb, key_np = _key_type(src_itemsize)
    kmax, kmin = key_np(np.iinfo(key_np).max), key_np(np.iinfo(key_np).min)
    shift = 8 * src_itemsize - 1
    mask = np.iinfo(INT_OF[src_itemsize]).max
    span = tpb * items

    # Conditional expressions, not min()/max(): those are overloads that Numba compiles as
    # device functions, which needs a GPU even just to emit PTX.
    @cuda.jit
    def kernel(src_lo, src_hi, n, group, per, lo, hi):
        s_lo = cuda.shared.array(tpb, key_nb)
        s_hi = cuda.shared.array(tpb, key_nb)
        t = cuda.threadIdx.x
        u = cuda.blockIdx.x
        g = u // per
        start = g * group + (u - g * per) * span
        stop = start + span
        end = (g + 1) * group
        stop = end if end < stop else stop
        stop = n if n < stop else stop
        k_lo = kmax
        k_hi = kmin
        for i in range(start + t, stop, tpb):
            if from_bits:
                b = src_lo[i]
                a = key_nb(b ^ ((b >> shift) & mask))
                z = a
            else:
                a = src_lo[i]
                z = src_hi[i]
            k_lo = a if a < k_lo else k_lo
            k_hi = z if z > k_hi else k_hi
        if thread_atomic:
            if t == 0:
                s_lo[0] = kmax
                s_hi[0] = kmin
            cuda.syncthreads()
            cuda.atomic.min(s_lo, 0, k_lo)
            cuda.atomic.max(s_hi, 0, k_hi)
            cuda.syncthreads()
        else:
            s_lo[t] = k_lo
            s_hi[t] = k_hi
            cuda.syncthreads()
            width = tpb // 2
            while width > 0:
                if t < width:
                    a = s_lo[t + width]
                    z = s_hi[t + width]
                    if a < s_lo[t]:
                        s_lo[t] = a
                    if z > s_hi[t]:
                        s_hi[t] = z
                cuda.syncthreads()
                width //= 2
        if t == 0:
            if block_atomic:
                cuda.atomic.min(lo, g, s_lo[0])
                cuda.atomic.max(hi, g, s_hi[0])
            else:
                lo[u] = s_lo[0]
                hi[u] = s_hi[0]
    return kernel


@functools.lru_cache(maxsize=None)
def _finish_kernel(name: str):
    """Per group: a NaN in the group becomes both results (the positive NaN if there is
    one, as keys.resolve_nan), and keys go back to float bits of the input width."""
    itemsize = 8 if name == "float64" else 4 if name == "float32" else 2
    out_t = INT_OF[itemsize].type
    shift = out_t(8 * itemsize - 1)
    mask = out_t(np.iinfo(out_t).max)
    neg_inf, pos_inf = inf_keys(name)

    @cuda.jit
    def kernel(lo, hi, out_lo, out_hi):
        g = cuda.grid(1)
        if g < lo.size:
            a = lo[g]
            b = hi[g]
            if b > pos_inf:
                a = b
            elif a < neg_inf:
                b = a
            ka = out_t(a)  # widened keys of narrow floats fit their own width again
            kb = out_t(b)
            out_lo[g] = out_t(ka ^ ((ka >> shift) & mask))
            out_hi[g] = out_t(kb ^ ((kb >> shift) & mask))
    return kernel


def _spans(n: int, group: int, span: int) -> tuple[int, int]:
    per = -(-group // span)
    ngroups = -(-n // group)
    return per, (ngroups - 1) * per + -(-(n - (ngroups - 1) * group) // span)


def reduce(bits, name: str, group: int, strategy: str):
    """(min, max) device arrays of dtype `name` (its bits' int dtype for bfloat16) per group
    of a flat device array of int bits."""
    if strategy not in STRATEGIES:
        raise ValueError(f"unknown CUDA strategy {strategy!r}; choose from {STRATEGIES}")
    tpb, items = _launch["threads"], _launch["items"]
    itemsize = bits.dtype.itemsize
    _, key_np = _key_type(itemsize)
    n = bits.size
    ngroups = -(-n // group)
    per, units = _spans(n, group, tpb * items)
    thread_atomic = strategy == "atomic"
    if strategy == "tree":
        kernel = _block_kernel(tpb, items, itemsize, True, False, False)
        src_lo = src_hi = bits
        while True:
            lo = cuda.device_array(units, key_np)
            hi = cuda.device_array(units, key_np)
            kernel[units, tpb](src_lo, src_hi, n, group, per, lo, hi)
            if per == 1:  # one partial per group left
                break
            n, group, src_lo, src_hi = units, per, lo, hi
            per, units = _spans(n, group, tpb * items)
            kernel = _block_kernel(tpb, items, itemsize, False, False, False)
    else:
        info = np.iinfo(key_np)
        lo = cuda.to_device(np.full(ngroups, info.max, key_np))
        hi = cuda.to_device(np.full(ngroups, info.min, key_np))
        kernel = _block_kernel(tpb, items, itemsize, True, thread_atomic, True)
        kernel[units, tpb](bits, bits, n, group, per, lo, hi)
    out_dtype = bits.dtype if name == "bfloat16" else np.dtype(name)
    out_lo = cuda.device_array(ngroups, out_dtype)
    out_hi = cuda.device_array(ngroups, out_dtype)
    _finish_kernel(name)[-(-ngroups // tpb), tpb](
        lo, hi, out_lo.view(bits.dtype), out_hi.view(bits.dtype))
    return out_lo, out_hi


def as_device_bits(x):
    """(flat int bits device array, dtype name, result wrapper) of a CUDA array."""
    if type(x).__module__.split(".", 1)[0] == "torch":
        return _torch_bits(x)
    d = x if is_cuda_ndarray(x) else cuda.as_cuda_array(x)
    name = np.dtype(d.dtype).name
    if name not in ("float16", "float32", "float64"):
        raise TypeError(f"unsupported dtype {d.dtype}; CUDA reductions take float16, float32, "
                        f"float64 (and bfloat16 torch tensors)")
    return _flat(d).view(INT_OF[d.dtype.itemsize]), name, lambda out: out


def _flat(d):
    if d.size == 0:
        raise ValueError("min/max of an empty array is undefined")
    if not d.is_c_contiguous():
        raise ValueError("CUDA reductions need a C-contiguous device array")
    return d.reshape(d.size)


def _torch_bits(t):
    import torch

    t = t.detach()
    names = {torch.float16: "float16", torch.bfloat16: "bfloat16", torch.float32: "float32",
             torch.float64: "float64"}
    if t.dtype not in names:
        raise TypeError(f"unsupported dtype {t.dtype}; the reductions take float16, bfloat16, "
                        f"float32, float64")
    name = names[t.dtype]
    ints = {2: torch.int16, 4: torch.int32, 8: torch.int64}[t.element_size()]
    d = cuda.as_cuda_array(t.view(ints))

    def wrap(out):
        res = torch.as_tensor(out, device=t.device)
        return res.view(t.dtype) if name == "bfloat16" else res
    return _flat(d), name, wrap
