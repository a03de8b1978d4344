"""Encoding, and the one codec choice: `actcodec.encode`, every codec module's `encode`, the
torch hooks and Functions, and the device path all come through here.

With codec="auto", the smallest encoding the caller's lossiness allows: `bits=None` allows the
lossless codecs (raw, bitmap, mask), `bits=k` adds k-bit quantization, dense and of the nonzero
values only (quant, bitmap_quant). Sizes are computed exactly from the element count, the
number of nonzero bit patterns and whether those are all one value (a mask); ties go to the
lossless codec. How the counts are found depends on where the data is:
- host memory (numpy, CPU tensors): arrays of 64Ki elements or more are sampled first (64 runs
  of 64 elements, in C); when even the sample's nonzero share minus five standard errors
  rules out every bitmap codec, the choice is made without the bitmap pass (which costs about
  a copy). Otherwise one bitmap pass gives the exact counts, and the bitmap and values it
  wrote are reused by the codec chosen. A wrong sample costs bytes, never exactness.
- other devices: one pass of torch ops counts everything on the device and the counts cross to
  the host once (actcodec.torch.device).
"""
from __future__ import annotations

import numpy as np

from . import _alloc, _arrays, _dtypes, _ext, _options, bitmap, container, mask, quant, raw

CODECS = ("auto", "raw", "bitmap", "mask", "quant", "bitmap_quant")
LOSSY = ("quant", "bitmap_quant")
SAMPLE_MIN = 64 * 1024


def sizes_from_counts(n: int, nnz: int, esize: int, bits: int | None,
                      group_size: int | None = 256, one_value: bool = False) -> dict:
    """Exact payload bytes of each codec `bits` allows, for n elements with nnz nonzero
    (one_value: all of them one bit pattern, so the mask codec applies)."""
    nb = (n + 7) // 8
    out = {"raw": n * esize, "bitmap": nb + nnz * esize}
    if one_value:
        out["mask"] = nb + esize
    if bits is not None:
        def q(count):
            return quant.packed_nbytes(count, bits) + 8 * quant.ngroups(count, group_size)
        out["quant"] = q(n)
        out["bitmap_quant"] = nb + q(nnz)
    return out


def smallest(sizes: dict) -> str:
    """The smallest codec; ties go to a lossless one."""
    return min(sizes, key=lambda c: (sizes[c], c in LOSSY))


def sizes(x, bits: int | None, group_size: int | None = 256, dtype: str | None = None) -> dict:
    """Exact payload bytes each allowed codec would produce for a numpy array x."""
    arr = np.asarray(x)
    name = _dtypes.dtype_name(arr, dtype)
    flat = _dtypes.bits_view(arr)
    nz = flat[flat != 0]
    one = nz.size > 0 and bool((nz == nz[0]).all())
    return sizes_from_counts(flat.size, nz.size, _dtypes.itemsize(name), bits, group_size, one)


def check(codec: str, bits, group_size, rounding, nonfinite, seed, prune) -> dict | None:
    """Validate a call's codec settings; the quantization parameters when `bits` is given."""
    if codec not in CODECS:
        raise ValueError(f"unknown codec {codec!r}; choose {', '.join(CODECS)}")
    if codec in LOSSY and bits is None:
        raise ValueError(f"codec {codec!r} is lossy: pass bits=1, 2, 4 or 8")
    if prune and codec != "bitmap":
        raise ValueError("prune applies to codec='bitmap' only")
    if bits is None:
        return None
    return quant.check_params(bits, group_size, rounding, nonfinite, seed)


def encode(x, codec: str = "auto", *, bits: int | None = None, group_size: int | None = 256,
           rounding: str = "nearest", seed: int = 0, nonfinite: str = "raise",
           prune: float = 0.0, dtype: str | None = None, threads: int | None = None,
           simd: str | None = None, bittrick: bool | None = None, keep_raw: bool = False,
           alloc=None):
    """Encode a numpy array or a torch tensor with a named codec, or with codec="auto" the
    smallest one `bits` allows (None: lossless only).

    numpy input gives numpy buffers, tensors give uint8 tensors on their device. threads,
    simd and bittrick are this call's settings (None: the defaults). keep_raw: return None
    where the choice is raw (the caller keeps the data itself). alloc: where payload buffers
    come from (host memory only; default numpy)."""
    p = check(codec, bits, group_size, rounding, nonfinite, seed, prune)
    if _arrays.is_tensor(x) and x.device.type != "cpu":
        from .torch import device

        return device.encode(x, codec, bits=bits, group_size=group_size, rounding=rounding,
                             seed=seed, nonfinite=nonfinite, prune=prune, keep_raw=keep_raw)
    flat, name, shape, wrap = _host_source(x, dtype)
    opts = _options.resolve(threads, simd)
    trick = _options.bittrick(bittrick)
    alloc = _alloc.HEAP if alloc is None else alloc
    work = None
    if codec == "auto":
        codec, work = _choose(flat, name, bits, group_size, opts, alloc)
    _dtypes.require(name, container.CODECS[codec].DTYPES, codec)
    if keep_raw and codec == "raw":
        return None
    buffers, nnz = _build(codec, flat, name, p, prune, opts, trick, alloc, work)
    params = p if codec in LOSSY else {"prune": float(prune)} if codec == "bitmap" else {}
    if wrap is not None:
        buffers = tuple(wrap(b) for b in buffers)
    return container.Encoded(codec, name, shape, params, tuple(buffers), nnz)


def _host_source(x, tag):
    """(flat C-contiguous bit view, dtype name, shape, buffer wrapper or None) of host data."""
    if _arrays.is_tensor(x):
        from .torch import tensors

        if tag is not None:
            raise ValueError("dtype tags are for numpy input; a tensor carries its dtype")
        flat, name = tensors.host_bits(x)
        return flat, name, tuple(int(d) for d in x.shape), tensors.wrap
    arr = np.asarray(x)
    name = _dtypes.dtype_name(arr, tag)
    return _dtypes.bits_view(arr), name, tuple(arr.shape), None


def _choose(flat, name, bits, group_size, opts, alloc):
    """(codec, the work already done for it, or None) for host data: a mask encode's
    (bitmap, value, nnz, one value) or the bitmap pass's (bitmap, values, nnz)."""
    if name == "bool":
        return "mask", None
    n, esize = flat.size, flat.itemsize
    if n >= SAMPLE_MIN:
        low, one = _ext.nonzero_share_floor(flat.view(np.uint8), esize)
        if one:  # the sample's nonzero elements are one value: a mask, perhaps
            work = mask.encode_flat(flat, opts, alloc)
            if work[3]:
                return "mask", work
        elif low > 0:
            guess = smallest(sizes_from_counts(n, int(low * n), esize, bits, group_size))
            if guess in ("quant", "raw"):  # no bitmap codec can win: skip the bitmap pass
                return guess, None
    # Left in scratch where cutting would copy: bitmap_quant, the likelier outcome, only
    # reads it.
    work = bitmap.encode_flat(flat, 0, opts, alloc, keep=alloc.cuts_in_place)
    values = work[1].view(flat.dtype)
    codec = smallest(sizes_from_counts(n, work[2], esize, bits, group_size,
                                       mask.one_value(values)))
    return codec, work


def _build(codec, flat, name, p, prune, opts, trick, alloc, work):
    """(buffers, nonzero count or None) of `codec` for host data."""
    if codec == "raw":
        return raw.encode_flat(flat, alloc), None
    if codec == "quant":
        return quant.quantize_flat(flat, name, p, opts, alloc, trick), None
    if codec == "mask":
        if work is None or len(work) != 4:
            work = mask.encode_flat(flat, opts, alloc)
        bm, value, nnz, one = work
        if not one:
            raise ValueError("not a mask: its nonzero elements differ (use bitmap)")
        return (bm, value), nnz
    if work is None:
        work = bitmap.encode_flat(flat, _dtypes.prune_abs_bits(prune, name), opts, alloc)
    elif codec == "bitmap" and not alloc.cuts_in_place:
        work = bitmap.kept(work, alloc)  # the choice's pass, still in scratch
    bm, values, nnz = work
    if codec == "bitmap":
        return (bm, values), nnz
    # bitmap_quant: the bitmap and the quantized values in a block of their own, so the full
    # values (in the bitmap pass's block) go with it
    return quant.quantize_flat(values.view(flat.dtype), name, p, opts, alloc, trick, bm), nnz
