"""Saves whose backward only asks which elements lie strictly between two constants.

Hardtanh's backward (ReLU6 is hardtanh(0, 6)) passes the incoming gradient where lo < x < hi
and zeros it elsewhere; hardsigmoid's passes a sixth of it where -3 < x < 3. What they save is
read only through that comparison, so it is stored as the comparison's result: a tensor of the
save's dtype holding one value inside (lo, hi) and one outside, one of them zero, which the
mask codec keeps exactly at 1 bit per element. Backward then computes the very gradient plain
PyTorch does. Quantizing the values instead moves elements across lo and hi and flips the mask
(8 bits in groups of 256 left a transformers MobileNetV2's gradient at a cosine of 0.95).

The op is found from the module running it (nn.Hardtanh and its subclasses, nn.Hardsigmoid,
whose forward is that one op): inside it every save is the op's own, its input or, in place,
its output, which backward compares the same way. The bounds are the module's.
"""
from __future__ import annotations

import torch


def bounds(module) -> tuple[float, float] | None:
    """(lo, hi) when the save happening inside `module` is read only as lo < x < hi."""
    if isinstance(module, torch.nn.Hardtanh):
        return float(module.min_val), float(module.max_val)
    if isinstance(module, torch.nn.Hardsigmoid) and not module.inplace:
        return -3.0, 3.0
    return None


def as_comparison(t: torch.Tensor, lo: float, hi: float) -> torch.Tensor | None:
    """A tensor with t's shape and dtype whose elements lie in (lo, hi) exactly where t's do,
    taking two values one of which is zero (None where t's dtype cannot hold such two)."""
    if not t.is_floating_point():
        return None
    inside, outside = _values(lo, hi, t.dtype)
    if inside is None:
        return None
    between = (t > lo) & (t < hi)  # NaN compares false: outside, as backward reads it
    return torch.where(between, torch.tensor(inside, dtype=t.dtype, device=t.device),
                       torch.tensor(outside, dtype=t.dtype, device=t.device))


def _values(lo: float, hi: float, dtype) -> tuple:
    """(a value inside (lo, hi), one outside), zero among them, both exact in `dtype`."""
    def between(v):
        x = float(torch.tensor(v, dtype=dtype))
        return lo < x < hi, x

    zero_inside, _ = between(0.0)
    if zero_inside:
        for candidate in (hi + 1.0, lo - 1.0, hi * 2.0, lo * 2.0):
            inside, value = between(candidate)
            if not inside and value != 0.0:
                return 0.0, value
        return None, None
    inside, value = between((lo + hi) / 2.0)
    if inside and value != 0.0:
        return value, 0.0
    return None, None
