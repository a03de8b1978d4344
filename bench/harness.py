"""Side-by-side timing for the benchmarks: candidates run interleaved, round after round, on
the same input, and each is quoted as its median over a yardstick's median. Ratios from one
run are what this shared, noisy machine can support.

Yardsticks: `copy` (torch's copy_ on the benchmark's threads into memory already in use: what
moving the array costs) and `read` (torch.aminmax over the array's bytes as 32-bit integers,
on the benchmark's threads: one threaded pass that only reads it, the least an encoder that
looks at every element can take).
Memory: our encoders write into an `Arena` (memory mapped once and reused every call, as
actcodec's store gives a training step), decoders and the copy into preallocated arrays; the
alternatives allocate as they do for their users."""
from __future__ import annotations

import importlib
import importlib.metadata
import importlib.util
import logging
import os
import platform
import random
import time
import warnings
from statistics import median
from types import SimpleNamespace

import numpy as np


class Arena:
    """An allocator (what actcodec's encoders take as `alloc=`) over memory mapped once: blocks
    are handed out one after another from its start, and `reset()` makes it start over, so
    every encode writes into the same pages, as in a training loop's steady state."""

    cuts_in_place = True

    def __init__(self, nbytes: int):
        self.buf = np.empty(nbytes, np.uint8)
        self.buf[::4096] = 0  # mapped from the start
        self.top = 0

    def reset(self) -> "Arena":
        self.top = 0
        return self

    def __call__(self, nbytes: int) -> np.ndarray:
        start = -(-self.top // 64) * 64
        if start + nbytes > self.buf.size:
            raise MemoryError("arena too small")
        self.top = start + nbytes
        return self.buf[start:start + nbytes]

    scratch = __call__

    def shrink(self, block: np.ndarray, nbytes: int) -> np.ndarray:
        if block.size and block.ctypes.data + block.size == self.buf.ctypes.data + self.top:
            self.top -= block.size - nbytes  # the last block: its tail is free again
        return block[:nbytes]


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


def copy_into(x: np.ndarray):
    """A callable copying x into a preallocated array with torch's threads."""
    import torch

    src = torch.from_numpy(np.ascontiguousarray(x).reshape(-1).view(np.uint8))
    dst = torch.empty_like(src)
    return lambda: dst.copy_(src)


def read_input(x: np.ndarray):
    """A callable making one threaded pass that only reads x: torch.aminmax on torch's threads
    over x's bytes as 32-bit integers (16 or 8 where the size asks). Integer min/max runs at
    the memory's bandwidth whatever the dtype, as the C core's float32 min/max pass does
    (measured side by side: 0.99-1.05x its time); torch's float aminmax takes about 1.5x."""
    import torch

    raw = np.ascontiguousarray(x).reshape(-1).view(np.uint8)
    width = next(w for w in (4, 2, 1) if raw.size % w == 0)
    t = torch.from_numpy(raw.view({4: np.int32, 2: np.int16, 1: np.uint8}[width]))
    return lambda: torch.aminmax(t)


def read_and_write(x: np.ndarray, nbytes: int):
    """A callable that moves what an encoder writing `nbytes` must at least move: it copies
    x's first `nbytes` into a preallocated array and reads the rest of x (torch.aminmax), both
    on torch's threads, so every input byte is read once and `nbytes` are written."""
    flat = np.ascontiguousarray(x).reshape(-1)
    k = min(flat.size, -(-nbytes // flat.itemsize))
    write = copy_into(flat[:k])
    read = read_input(flat[k:]) if k < flat.size else (lambda: None)
    return lambda: (write(), read())


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


_TORCHAO_MODULES = ("torchao.prototype.dtypes.uintx.bitpacking", "torchao.dtypes.uintx.bitpacking")


def load_torchao() -> SimpleNamespace:
    """torchao's CPU bit packing: `ok`, `status` (version and module, or why it is missing),
    and `pack(codes, bits)` / `unpack(packed, bits)` over 1-D uint8 code tensors. Its import
    logs failures to load CUDA-only libraries on CPU builds of torch; they are silenced."""
    if importlib.util.find_spec("torchao") is None:
        return SimpleNamespace(ok=False, status="not installed")
    quiet = [logging.getLogger(n) for n in ("torchao", "torch.utils._pytree")]
    levels = [lg.level for lg in quiet]
    mod = name = None
    try:
        for lg in quiet:
            lg.setLevel(logging.ERROR)
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            import torchao
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
        return SimpleNamespace(ok=False, status=f"{version}, no bit packing module found")
    import torch

    for bits in (1, 2, 4):  # the comparison means nothing if the round trip is wrong
        codes = torch.arange(64, dtype=torch.uint8) % (1 << bits)
        if not torch.equal(mod.unpack_cpu(mod.pack_cpu(codes, bits), bits), codes):
            return SimpleNamespace(ok=False, status=f"{version}: its round trip differs")
    return SimpleNamespace(ok=True, status=f"{version} ({name}.pack_cpu/unpack_cpu)",
                           pack=mod.pack_cpu, unpack=mod.unpack_cpu)


def machine(threads: int) -> dict:
    """Where and with what the numbers were taken."""
    import actcodec

    cpu = platform.processor() or platform.machine()
    try:
        with open("/proc/cpuinfo") as f:
            cpu = next((ln.split(":", 1)[1].strip() for ln in f
                        if ln.startswith("model name")), cpu)
    except OSError:
        pass
    versions = {"actcodec": actcodec.__version__, "python": platform.python_version(),
                "numpy": np.__version__}
    for name in ("torch", "transformers", "bitsandbytes", "torchao", "numba"):
        try:
            versions[name] = importlib.metadata.version(name)
        except importlib.metadata.PackageNotFoundError:
            versions[name] = "not installed"
    info = actcodec.simd_info()
    return {"cpu": cpu, "cores": os.cpu_count(), "threads": threads,
            "system": f"{platform.system()} {platform.release()}", "path": info["default"],
            "versions": versions,
            "load": os.getloadavg() if hasattr(os, "getloadavg") else None}
