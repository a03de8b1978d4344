"""Encoding: `actcodec.encode`, every codec module's `encode`, and the torch adapters' save
path come through here, and go down to one codec's `encode` (actcodec.abc).

Arrays of a backend (actcodec.backends) in host memory are read through zero-copy numpy views
and their payloads handed back as the backend's arrays; arrays on a device are the backend's
to encode there.

With codec="auto" the codec is chosen from counts (actcodec.choice); the counts come from the
data, on the host:
- arrays of 64Ki elements or more are sampled first (64 runs of 64 elements, in C); when even
  the sample's nonzero share minus five standard errors rules out every bitmap codec, the
  choice is made without the bitmap pass (which costs about a copy);
- otherwise one bitmap pass gives the exact counts, and the bitmap and values it wrote are
  reused by the codec chosen. A wrong sample costs bytes, never exactness.
"""
from __future__ import annotations

import numpy as np

from . import _alloc, _dtypes, _ext, _options, backends, choice, container
from .registry import CODECS

SAMPLE_MIN = 64 * 1024


def check(codec: str, bits, group_size, rounding, nonfinite, seed, prune) -> dict | None:
    """Validate a call's codec settings; the quantization parameters when `bits` is given."""
    if codec not in choice.NAMES:
        raise ValueError(f"unknown codec {codec!r}; choose {', '.join(choice.NAMES)}")
    if codec in choice.LOSSY and bits is None:
        raise ValueError(f"codec {codec!r} is lossy: pass bits=1, 2, 4 or 8")
    if prune and codec != "bitmap":
        raise ValueError("prune applies to codec='bitmap' only")
    if bits is None:
        return None
    return CODECS["quant"].check_params(bits, group_size, rounding, nonfinite, seed)


def encode(x, codec: str = "auto", *, bits: int | None = None, group_size: int | None = 256,
           rounding: str = "nearest", seed: int = 0, nonfinite: str = "raise",
           prune: float = 0.0, dtype: str | None = None, threads: int | None = None,
           simd: str | None = None, bittrick: bool | None = None, keep_raw: bool = False,
           alloc=None):
    """Encode a numpy array or a backend's array (a torch tensor) with a named codec, or with
    codec="auto" the smallest one `bits` allows (None: lossless only).

    numpy input gives numpy buffers, a backend's arrays give the backend's (uint8 tensors on
    the tensor's device). threads, simd and bittrick are this call's settings (None: the
    defaults). keep_raw: return None where the choice is raw (the caller keeps the data
    itself). alloc: where payload buffers come from (host memory only; default numpy)."""
    p = check(codec, bits, group_size, rounding, nonfinite, seed, prune)
    backend = backends.of(x)
    wrap = None
    if backend is not None:
        if dtype is not None:
            raise ValueError("dtype tags are for numpy input; a tensor carries its dtype")
        host = backend.host_bits(x)
        if host is None:  # on a device: encoded there
            return backend.encode(x, codec, bits=bits, group_size=group_size,
                                  rounding=rounding, seed=seed, nonfinite=nonfinite,
                                  prune=prune, keep_raw=keep_raw)
        flat, name, shape = host
        wrap = backend.wrap
    else:
        arr = np.asarray(x)
        name = _dtypes.dtype_name(arr, dtype)
        flat, shape = _dtypes.bits_view(arr), tuple(arr.shape)
    return encode_bits(flat, name, shape, codec, p, _options.resolve(threads, simd),
                       _alloc.HEAP if alloc is None else alloc, prune=prune,
                       bittrick=_options.bittrick(bittrick), keep_raw=keep_raw, wrap=wrap)


def encode_bits(flat: np.ndarray, name: str, shape: tuple, codec: str, p: dict | None,
                opts: dict, alloc, *, prune: float = 0.0, bittrick: int = -1,
                keep_raw: bool = False, wrap=None):
    """The host path, for callers whose settings are checked (`check`, `_options.resolve`):
    a flat unsigned bit view of `name` elements in, an Encoded (or None, see keep_raw) out.
    wrap: turns each payload buffer into the caller's array type."""
    work = None
    if codec == "auto":
        codec, work = _survey(flat, name, p, opts, alloc)
    impl = CODECS[codec]
    if name not in impl.dtypes:
        raise TypeError(f"the {codec} codec encodes {', '.join(impl.dtypes)}, not {name}")
    if keep_raw and codec == "raw":
        return None
    params = p if impl.lossy else {"prune": float(prune)} if codec == "bitmap" else {}
    buffers, nnz = impl.encode(flat, name, params, opts, alloc, work, bittrick)
    if wrap is not None:
        buffers = tuple(wrap(b) for b in buffers)
    return container.Encoded(codec, name, shape, params, tuple(buffers), nnz)


def sizes(x, bits: int | None, group_size: int | None = 256, dtype: str | None = None) -> dict:
    """Exact payload bytes each allowed codec would produce for a numpy array x (counted
    with numpy: a reference for the survey's counts)."""
    arr = np.asarray(x)
    name = _dtypes.dtype_name(arr, dtype)
    flat = _dtypes.bits_view(arr)
    nz = flat[flat != 0]
    one = nz.size > 0 and bool((nz == nz[0]).all())
    return choice.sizes_from_counts(flat.size, nz.size, _dtypes.itemsize(name), bits,
                                    group_size, one)


def _survey(flat, name, p, opts, alloc):
    """(codec, the work already done for it, or None) for host data: the mask pass's
    (bitmap, value, nnz, one value) or the bitmap pass's (bitmap, values, nnz)."""
    if name == "bool":
        return "mask", None
    bits, group = (p["bits"], p["group_size"]) if p is not None else (None, None)
    n, esize = flat.size, flat.itemsize
    if n >= SAMPLE_MIN:
        low, one = _ext.nonzero_share_floor(flat.view(np.uint8), esize)
        if one:  # the sample's nonzero elements are one value: a mask, perhaps
            work = CODECS["mask"].scan(flat, opts, alloc)
            if work[3]:
                return "mask", work
        elif low > 0:
            sizes = choice.sizes_from_counts(n, int(low * n), esize, bits, group)
            if not choice.sparse_can_win(sizes):  # skip the bitmap pass
                return choice.smallest(sizes), None
    # Left in scratch where cutting would copy: bitmap_quant, the likelier outcome, only
    # reads it.
    work = CODECS["bitmap"].scan(flat, 0, opts, alloc, keep=alloc.cuts_in_place)
    values = work[1].view(flat.dtype)
    codec = choice.smallest(choice.sizes_from_counts(n, work[2], esize, bits, group,
                                                     _one_value(values)))
    return codec, work


def _one_value(values: np.ndarray) -> bool:
    """Whether a non-empty run of bit patterns holds one value only. Activations differ
    within their first few values, so a short prefix settles most before the full pass."""
    if not values.size:
        return False
    first = values[0]
    return bool((values[:64] == first).all() and (values == first).all())
