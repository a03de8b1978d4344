"""CPU atomics for jitted code: LLVM ``cmpxchg`` and an atomic load as Numba intrinsics, and
DAF's Algorithm 1 on top of them.

Algorithm 1 updates a float minimum in place by compare-and-swap on the float's bits,
comparing as floats. Here the slot already holds an order-preserving integer key, so the
comparison is an integer one and -0.0 and NaN need no special case.
"""
from __future__ import annotations

from numba import njit, types
from numba.core import cgutils
from numba.extending import intrinsic


def _slot_pointer(context, builder, arrty, arr, idx):
    ary = context.make_array(arrty)(context, builder, arr)
    return cgutils.get_item_pointer(context, builder, arrty, ary, [idx])


@intrinsic
def _cas(typingctx, arr, idx, expected, new):
    """arr[idx] = new if arr[idx] == expected, atomically; returns what arr[idx] held."""
    if not (isinstance(arr, types.Array) and isinstance(arr.dtype, types.Integer)):
        return None
    sig = arr.dtype(arr, types.intp, arr.dtype, arr.dtype)

    def codegen(context, builder, signature, args):
        ptr = _slot_pointer(context, builder, signature.args[0], args[0], args[1])
        pair = builder.cmpxchg(ptr, args[2], args[3], "seq_cst", "seq_cst")
        return builder.extract_value(pair, 0)
    return sig, codegen


@intrinsic
def _load(typingctx, arr, idx):
    """arr[idx], read atomically (a plain load racing with cmpxchg is undefined in LLVM)."""
    if not (isinstance(arr, types.Array) and isinstance(arr.dtype, types.Integer)):
        return None
    sig = arr.dtype(arr, types.intp)

    def codegen(context, builder, signature, args):
        ptr = _slot_pointer(context, builder, signature.args[0], args[0], args[1])
        return builder.load_atomic(ptr, "monotonic", signature.return_type.bitwidth // 8)
    return sig, codegen


@njit(inline="always")
def atomic_min(arr, idx, value):
    """arr[idx] = min(arr[idx], value) by a compare-and-swap loop (DAF Algorithm 1)."""
    seen = _load(arr, idx)
    while value < seen:
        prev = _cas(arr, idx, seen, value)
        if prev == seen:
            return
        seen = prev


@njit(inline="always")
def atomic_max(arr, idx, value):
    """arr[idx] = max(arr[idx], value), as atomic_min."""
    seen = _load(arr, idx)
    while value > seen:
        prev = _cas(arr, idx, seen, value)
        if prev == seen:
            return
        seen = prev
