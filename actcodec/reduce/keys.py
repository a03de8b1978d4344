"""Order-preserving integer keys of IEEE floats.

For the bits ``b`` of a float read as a signed integer of the same width W,
``key(b) = b ^ ((b >> (W-1)) & MAXPOS)`` flips the magnitude bits of negative values, so that
signed integer order on keys is the float order extended to every bit pattern:

    -NaN < -inf < ... < -0.0 < +0.0 < ... < +inf < +NaN

Integer min/max on keys vectorizes (float min/max loops do not, in Numba), needs no NaN
branch, and orders -0.0 below +0.0 exactly. ``key`` is its own inverse. A NaN anywhere shows
as a key above key(+inf) in the max or below key(-inf) in the min, so NaN detection is free.

The jitted ``key`` is generic over int16/int32/int64 (float16 and bfloat16, float32, float64)
and keeps the input width: Numba would otherwise widen int32 arithmetic to int64, and AVX2 has
no 64-bit integer min/max.
"""
from __future__ import annotations

import numpy as np
from numba import types
from numba.extending import overload
from numba.np.numpy_support import as_dtype


def key(bits):
    """The key of integer bits (a numpy array or scalar; signed, any width)."""
    shift = bits.dtype.itemsize * 8 - 1
    return bits ^ ((bits >> shift) & ((1 << shift) - 1))


@overload(key, inline="always")
def _key_jit(bits):
    if isinstance(bits, types.Integer) and bits.signed:
        int_t = as_dtype(bits).type
        shift = int_t(bits.bitwidth - 1)
        mask = int_t(np.iinfo(int_t).max)

        def impl(bits):
            return int_t(bits ^ ((bits >> shift) & mask))
        return impl
    return None


def inf_keys(float_dtype_name: str) -> tuple[int, int]:
    """(key of -inf, key of +inf) of a float format."""
    pos = {"float16": 0x7C00, "bfloat16": 0x7F80, "float32": 0x7F800000,
           "float64": 0x7FF0000000000000}[float_dtype_name]
    # key(-inf) = key(sign | pos) = -pos - 1: the magnitude bits are flipped below zero
    return -pos - 1, pos


def resolve_nan(lo_keys: np.ndarray, hi_keys: np.ndarray, float_dtype_name: str):
    """Bits of (min, max) per group from key arrays; a group holding a NaN gets that NaN in both.

    The NaN reported is the largest-keyed positive NaN if there is one, else the
    smallest-keyed negative NaN: one of the group's own bit patterns, never a made-up one."""
    neg_inf, pos_inf = inf_keys(float_dtype_name)
    pos_nan = hi_keys > pos_inf
    neg_nan = lo_keys < neg_inf
    nan_key = np.where(pos_nan, hi_keys, lo_keys)
    any_nan = pos_nan | neg_nan
    lo = np.where(any_nan, nan_key, lo_keys)
    hi = np.where(any_nan, nan_key, hi_keys)
    return key(lo), key(hi)
