"""Side-by-side timing for the benchmark report, its inputs and the alternatives it compares
against. Candidates run interleaved, round after round, on the same input, and each is quoted
as its median time over a yardstick's median (a threaded copy of the same array). Ratios from
one run are what this shared, noisy machine can support.

The report itself (which rows, which alternatives) is bench_report.py; its markdown and PNG
are bench_render.py. The pytest-benchmark suites in bench/ reuse the helpers here."""
from __future__ import annotations

import ctypes
import ctypes.util
import functools
import importlib
import importlib.util
import logging
import random
import time
import warnings
from contextlib import contextmanager
from statistics import median
from types import SimpleNamespace

import numpy as np

from . import _dtypes, _ext, _outputs

REGIMES = ("fresh", "reused")
_M_TRIM_THRESHOLD, _M_MMAP_THRESHOLD, _M_MMAP_MAX = -1, -3, -4  # glibc mallopt parameters


# --- timing ------------------------------------------------------------------------------

@functools.lru_cache(maxsize=None)
def _libc():
    return ctypes.CDLL(ctypes.util.find_library("c"))  # find_library runs a subprocess


@contextmanager
def memory_regime(regime: str):
    """'fresh': every output of 32 MiB or more comes newly mapped from the OS, so first-touch
    page faults are part of every call. That is glibc's default once a process has freed a
    few large arrays (its mmap threshold rises with each freed mapping up to 32 MiB); it is
    held fixed here, so the regime does not drift with what ran before. 'reused': glibc keeps
    freed memory and hands it out again, as it does for the smaller, recurring allocations of
    a training loop.

    Who allocates what: in 'reused' every output, ours and the yardsticks' and the
    alternatives', comes from glibc. In 'fresh' actcodec's decoders, the bitmap encoder's
    values buffer and the copy and fill yardsticks take a 2 MiB-aligned mapping of their own
    with huge pages asked for (actcodec._outputs), and the alternatives (numpy, torch) take
    glibc's fresh mapping, where numpy asks for huge pages on its aligned part.

    A 'reused' run leaves glibc's heap holding the outputs it freed, and glibc serves any
    later request from its free chunks before it maps anything, so a 'fresh' run after it
    would time the alternatives in reused memory (measured: a 64 MiB numpy output took 0 page
    faults there, 544 in a clean process). Run every 'fresh' row before the first 'reused'
    one (bench_report does); entering 'fresh' after a 'reused' run warns."""
    if regime not in REGIMES:
        raise ValueError(f"unknown memory regime {regime!r}; choose {', '.join(REGIMES)}")
    libc = _libc()
    if not hasattr(libc, "mallopt"):  # not glibc: the allocator does what it does
        yield
        return
    if regime == "fresh":
        if _HEAP_REUSED[0]:
            warnings.warn("a 'fresh' memory regime after a 'reused' one in the same process "
                          "reuses the heap that one left: its copy and alternatives may take "
                          "no page faults; time the fresh rows first", RuntimeWarning,
                          stacklevel=3)
        fixed_mmap_threshold()
        yield
        return
    _HEAP_REUSED[0] = True
    own = _outputs.get_own_mapping_bytes()
    libc.mallopt(_M_MMAP_MAX, 0)
    libc.mallopt(_M_TRIM_THRESHOLD, 2**30)
    # What a user who keeps glibc's memory does: decode outputs come from it as well.
    _outputs.set_own_mapping_bytes(None)
    try:
        yield
    finally:
        libc.mallopt(_M_MMAP_MAX, 65536)
        _outputs.set_own_mapping_bytes(own)
        fixed_mmap_threshold()


_HEAP_REUSED = [False]


_MMAP_THRESHOLD = 32 << 20  # where glibc's dynamic threshold stops rising (64-bit)


def fixed_mmap_threshold() -> None:
    """From now on map every allocation of 32 MiB or more on its own and keep the heap's top
    at most twice that (glibc's own pair once its threshold has risen all the way): call it
    before building a benchmark's inputs."""
    libc = _libc()
    if hasattr(libc, "mallopt"):
        libc.mallopt(_M_MMAP_THRESHOLD, _MMAP_THRESHOLD)
        libc.mallopt(_M_TRIM_THRESHOLD, 2 * _MMAP_THRESHOLD)
        libc.malloc_trim(0)


def time_interleaved(candidates: dict, rounds: int = 9, seed: int = 0) -> dict:
    """Median seconds per candidate; each round runs every candidate once, in a fresh order."""
    times = {name: [] for name in candidates}
    order = list(candidates)
    rng = random.Random(seed)
    for fn in candidates.values():  # warm-up: page in code, let allocators settle
        fn()
    for _ in range(rounds):
        rng.shuffle(order)
        for name in order:
            t0 = time.perf_counter()
            candidates[name]()
            times[name].append(time.perf_counter() - t0)
    return {name: median(ts) for name, ts in times.items()}


def threaded_copy(x: np.ndarray) -> np.ndarray:
    """memcpy over actcodec's threads into a new array: what "a copy of the array" costs.

    The output is allocated as our decode's is (`_outputs.empty`), so in either memory regime
    the copy writes into the same kind of memory as the codec it is compared with. numpy's
    own allocation would not do: where the kernel places a fresh 64 MiB mapping decides
    whether it takes 33 page faults (huge pages throughout) or 544 (small pages at both ends),
    and that changed from process to process by a fifth of the copy's time. The copy starts
    at the source's offset within a 4 KiB page: glibc's memcpy slows by up to a fifth when
    source and destination sit at different offsets (measured at 0 and 2048 bytes apart)."""
    src = np.ascontiguousarray(x).reshape(-1).view(np.uint8)
    buf = _outputs.empty((src.size + 4096,), np.uint8)
    lead = (src.ctypes.data - buf.ctypes.data) % 4096
    out = buf[lead:lead + src.size]
    _ext.parallel_copy(out, src)
    return out.view(x.dtype).reshape(x.shape)


def threaded_fill(nbytes: int) -> np.ndarray:
    """A memset over actcodec's threads into an output allocated as decode's is: the least a
    decoder can spend on writing `nbytes`. Into newly mapped memory it writes as our decoders
    do, each 2 MiB stretch faulted at its end first (csrc/first_touch.h), and there it is
    mostly the kernel's zeroing of the new pages; into memory already mapped, one memset."""
    out = _outputs.empty((nbytes,), np.uint8)
    _ext.parallel_fill(out, 0)
    return out


def read_input(x: np.ndarray):
    """A callable making one threaded pass that only reads x (the C core's min/max): the least
    an encoder that looks at every element can take."""
    wire_id, esize, _ = _dtypes.DTYPES[x.dtype.name]
    flat = x.reshape(-1).view(np.uint8)
    return lambda: _ext.minmax(flat, wire_id, esize)


# --- inputs ------------------------------------------------------------------------------

def normal(nbytes: int, dtype="float32", seed: int = 0) -> np.ndarray:
    """Dense N(0, 1) values (pre-activations): `nbytes` bytes of `dtype`."""
    dt = np.dtype(dtype)
    x = np.random.default_rng(seed).standard_normal(nbytes // dt.itemsize, dtype=np.float32)
    return x if dt == np.float32 else x.astype(dt)


def relu_like(nbytes: int, zero_fraction: float, seed: int = 0, dtype="float32",
              nonzero_multiple: int = 1) -> np.ndarray:
    """`nbytes` bytes of positive activations (|N(0,1)| + 0.01) with the given fraction of
    exact zeros at random positions. `nonzero_multiple` zeroes a few more elements so that the
    nonzero count is a multiple of it (whole quantization groups for the eager alternatives)."""
    dt = np.dtype(dtype)
    rng = np.random.default_rng(seed)
    x = np.abs(rng.standard_normal(nbytes // dt.itemsize, dtype=np.float32)) + np.float32(0.01)
    x[rng.random(x.size) < zero_fraction] = 0
    if nonzero_multiple > 1:
        nz = np.flatnonzero(x)
        x[nz[:nz.size % nonzero_multiple]] = 0
    return x if dt == np.float32 else x.astype(dt)


# --- alternatives --------------------------------------------------------------------------

_FLOAT_OF_SIZE = {2: np.float16, 4: np.float32, 8: np.float64}


def numpy_bitmap_encode(x: np.ndarray):
    """The numpy way: packbits of the nonzero mask plus boolean indexing (on the bit patterns,
    so -0.0 counts as nonzero, as in the codec)."""
    bits = x.reshape(-1).view(f"u{x.itemsize}")
    nz = bits != 0
    return np.packbits(nz, bitorder="little"), bits[nz]


def numpy_bitmap_decode(packed, values, n: int, dtype=None) -> np.ndarray:
    """Inverse of numpy_bitmap_encode; `dtype` defaults to the float type of values' width."""
    nz = np.unpackbits(packed, count=n, bitorder="little").view(bool)
    out = np.zeros(n, values.dtype)
    out[nz] = values
    return out.view(dtype or _FLOAT_OF_SIZE[values.itemsize])


def torch_eager_quantize(xt, bits: int, group: int = 256):
    """What a user writes in eager torch: per-group min-max, round, pack (same layout). Works
    in xt's dtype (float16 stays float16)."""
    import torch

    levels = (1 << bits) - 1
    g = xt.view(-1, group)
    mn, mx = torch.aminmax(g, dim=1, keepdim=True)
    scale = (mx - mn) / levels
    inv = torch.where(scale > 0, 1.0 / scale, torch.zeros_like(scale))
    codes = torch.round((g - mn) * inv).clamp_(0, levels).to(torch.uint8).view(-1, 8 // bits, 32)
    packed = codes[:, 0].clone()
    for i in range(1, 8 // bits):
        packed |= codes[:, i] << (bits * i)
    return packed, mn, scale


def torch_eager_dequantize(packed, mn, scale, bits: int, group: int = 256):
    """Inverse of torch_eager_quantize, to the dtype of the mins (the input's)."""
    import torch

    mask = (1 << bits) - 1
    planes = [(packed >> (bits * i)) & mask for i in range(8 // bits)]
    codes = torch.stack(planes, dim=1).view(-1, group).to(mn.dtype)
    return (mn + codes * scale).view(-1)


def load_bitsandbytes():
    """bitsandbytes.functional, or None (not installed, or fails to load)."""
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            import bitsandbytes.functional as bnbf
    except Exception:  # optional, and its native library may fail to load
        return None
    return bnbf


_TORCHAO_MODULES = ("torchao.prototype.dtypes.uintx.bitpacking",  # torchao >= 0.16 or so
                    "torchao.dtypes.uintx.bitpacking")            # older releases


def load_torchao() -> SimpleNamespace:
    """torchao's CPU bit packing: `ok`, `status` (version and module, or why it is missing),
    and `pack(codes, bits)` / `unpack(packed, bits)` over 1-D uint8 code tensors (one code
    per byte, length a multiple of 8). torchao's import logs failures to load its CUDA-only
    libraries on CPU builds of torch; they are silenced here (the packing is plain torch)."""
    if importlib.util.find_spec("torchao") is None:
        return SimpleNamespace(ok=False, status="not installed")
    quiet = [logging.getLogger(n) for n in ("torchao", "torch.utils._pytree")]
    levels = [lg.level for lg in quiet]
    try:
        for lg in quiet:
            lg.setLevel(logging.ERROR)
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            import torchao
            mod = name = None
            for name in _TORCHAO_MODULES:
                try:
                    mod = importlib.import_module(name)
                    break
                except ImportError:
                    continue
    except Exception as exc:  # installed but broken against this torch
        return SimpleNamespace(ok=False, status=f"incompatible ({type(exc).__name__}: {exc})")
    finally:
        for lg, level in zip(quiet, levels):
            lg.setLevel(level)
    version = getattr(torchao, "__version__", "?")
    if mod is None or not hasattr(mod, "pack_cpu"):
        return SimpleNamespace(ok=False, status=f"{version}, incompatible (no bit packing "
                                                f"module found)")
    import torch

    def pack(codes, bits):
        return mod.pack_cpu(codes, bits)

    def unpack(packed, bits):
        return mod.unpack_cpu(packed, bits)

    try:  # a self-check: the comparison means nothing if the round trip is wrong
        for bits in (1, 2, 4):
            codes = torch.arange(64, dtype=torch.uint8) % (1 << bits)
            if not torch.equal(unpack(pack(codes, bits), bits), codes):
                raise ValueError(f"{bits}-bit pack/unpack round trip differs")
    except Exception as exc:
        return SimpleNamespace(ok=False, status=f"{version}, incompatible ({type(exc).__name__}: "
                                                f"{exc})")
    return SimpleNamespace(ok=True, status=f"{version} ({name}.pack_cpu/unpack_cpu)",
                           version=version, pack=pack, unpack=unpack)
