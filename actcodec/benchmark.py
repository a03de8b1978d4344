"""Side-by-side timing for the benchmark report: candidates run interleaved, round after round,
on the same input, and each is quoted as its median time over a yardstick's median (a threaded
copy of the same array). Ratios from one run are what this shared, noisy machine can support."""
from __future__ import annotations

import ctypes
import ctypes.util
import random
import time
from contextlib import contextmanager
from statistics import median

import numpy as np

from . import _ext, bitmap


REGIMES = ("fresh", "reused")
_M_TRIM_THRESHOLD, _M_MMAP_MAX = -1, -4  # glibc mallopt parameters


@contextmanager
def memory_regime(regime: str):
    """'fresh': large outputs come newly mapped from the OS, so first-touch page faults are
    part of every call (glibc's default for arrays of 32 MiB and more). 'reused': glibc keeps
    freed memory and hands it out again, as it does for the smaller, recurring allocations of
    a training loop. Either way every candidate, copy included, uses the same allocator."""
    libc = ctypes.CDLL(ctypes.util.find_library("c")) if regime == "reused" else None
    if libc is not None and hasattr(libc, "mallopt"):
        libc.mallopt(_M_MMAP_MAX, 0)
        libc.mallopt(_M_TRIM_THRESHOLD, 2**30)
    try:
        yield
    finally:
        if libc is not None and hasattr(libc, "mallopt"):
            libc.mallopt(_M_MMAP_MAX, 65536)
            libc.mallopt(_M_TRIM_THRESHOLD, 128 * 1024)


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
    """np.empty_like + memcpy over actcodec's threads: what "a copy of the array" costs."""
    out = np.empty_like(x)
    _ext.parallel_copy(out.reshape(-1).view(np.uint8), x.reshape(-1).view(np.uint8))
    return out


def numpy_bitmap_encode(x: np.ndarray):
    """The numpy way: packbits of the nonzero mask plus boolean indexing."""
    bits = x.reshape(-1).view(np.uint32)
    nz = bits != 0
    return np.packbits(nz, bitorder="little"), bits[nz]


def numpy_bitmap_decode(packed, values, n: int) -> np.ndarray:
    nz = np.unpackbits(packed, count=n, bitorder="little").view(bool)
    out = np.zeros(n, np.uint32)
    out[nz] = values
    return out.view(np.float32)


def relu_like(nbytes: int, zero_fraction: float, seed: int = 0) -> np.ndarray:
    """float32 activations with the given fraction of exact zeros at random positions."""
    rng = np.random.default_rng(seed)
    x = np.abs(rng.standard_normal(nbytes // 4, dtype=np.float32)) + np.float32(0.01)
    x[rng.random(x.size) < zero_fraction] = 0
    return x


def bitmap_report(mib: int = 64, zero_fractions=(0.1, 0.5, 0.9), rounds: int = 9) -> list[dict]:
    """Bitmap encode/decode vs a threaded copy and vs numpy, one row per zero fraction."""
    rows = []
    for regime, zf in [(r, z) for r in REGIMES for z in zero_fractions]:
        x = relu_like(mib << 20, zf)
        enc = bitmap.encode(x)
        packed, values = numpy_bitmap_encode(x)
        with memory_regime(regime):
            t = time_interleaved({
                "copy": lambda: threaded_copy(x),
                "encode": lambda: bitmap.encode(x),
                "decode": lambda: enc.decode(),
                "numpy encode": lambda: numpy_bitmap_encode(x),
                "numpy decode": lambda: numpy_bitmap_decode(packed, values, x.size),
            }, rounds=rounds)
        gbs = lambda s: x.nbytes / s / 1e9  # noqa: E731
        rows.append({
            "memory": regime, "zeros": zf, "ratio": enc.ratio, "copy_ms": t["copy"] * 1e3,
            "copy_GBs": gbs(t["copy"]),
            "encode_vs_copy": t["encode"] / t["copy"], "decode_vs_copy": t["decode"] / t["copy"],
            "encode_speedup_vs_numpy": t["numpy encode"] / t["encode"],
            "decode_speedup_vs_numpy": t["numpy decode"] / t["decode"],
            "encode_GBs": gbs(t["encode"]), "decode_GBs": gbs(t["decode"]),
        })
    return rows


def format_bitmap_report(rows: list[dict], mib: int, threads: int, path: str) -> str:
    lines = [
        f"Sparse bitmap, {mib} MiB float32, {threads} threads, {path} path "
        f"(medians of interleaved rounds; time ratios, lower is better for 'vs copy')",
        "",
        "| memory | zeros | size ratio | encode / copy | decode / copy | encode vs numpy | "
        "decode vs numpy | encode GB/s | decode GB/s | copy GB/s |",
        "|---|---|---|---|---|---|---|---|---|---|",
    ]
    for r in rows:
        lines.append(
            f"| {r['memory']} | {r['zeros']:.0%} | {r['ratio']:.2f}x | {r['encode_vs_copy']:.2f} | "
            f"{r['decode_vs_copy']:.2f} | {r['encode_speedup_vs_numpy']:.1f}x faster | "
            f"{r['decode_speedup_vs_numpy']:.1f}x faster | {r['encode_GBs']:.1f} | "
            f"{r['decode_GBs']:.1f} | {r['copy_GBs']:.1f} |")
    return "\n".join(lines)


def torch_eager_quantize(xt, bits: int, group: int = 256):
    """What a user writes in eager torch: per-group min-max, round, pack (same layout)."""
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
    import torch

    mask = (1 << bits) - 1
    planes = [(packed >> (bits * i)) & mask for i in range(8 // bits)]
    codes = torch.stack(planes, dim=1).view(-1, group).to(torch.float32)
    return (mn + codes * scale).view(-1)


def quant_report(mib: int = 64, bits_list=(1, 2, 4, 8), rounds: int = 9) -> list[dict]:
    """k-bit encode/decode (G=256) vs a threaded copy, eager torch, bitsandbytes (8-bit), and
    the bit-trick vs cast conversion paths."""
    from . import _ext as ext
    from . import quant

    try:
        import torch
    except ImportError:  # pragma: no cover - torch is optional
        torch = None
    try:
        import bitsandbytes.functional as bnbf
    except Exception:  # pragma: no cover - optional, and may fail to load
        bnbf = None
    rng = np.random.default_rng(0)
    x = rng.standard_normal((mib << 20) // 4, dtype=np.float32)
    xt = torch.from_numpy(x) if torch is not None else None
    def with_conversion(on, fn):
        def run():
            ext.set_bittrick(on)
            try:
                return fn()
            finally:
                ext.set_bittrick(None)
        return run

    rows = []
    for regime, bits in [(r, b) for r in REGIMES for b in bits_list]:
        enc = quant.encode(x, bits)
        cands = {
            "copy": lambda: threaded_copy(x),
            "encode": lambda: quant.encode(x, bits),
            "decode": lambda: enc.decode(),
            "encode trick": with_conversion(True, lambda: quant.encode(x, bits)),
            "encode cast": with_conversion(False, lambda: quant.encode(x, bits)),
            "decode trick": with_conversion(True, lambda: enc.decode()),
            "decode cast": with_conversion(False, lambda: enc.decode()),
        }
        if torch is not None:
            tq = torch_eager_quantize(xt, bits)
            cands["torch encode"] = lambda: torch_eager_quantize(xt, bits)
            cands["torch decode"] = lambda: torch_eager_dequantize(*tq, bits)
        if bnbf is not None and bits == 8:
            bq = bnbf.quantize_blockwise(xt, blocksize=256)
            cands["bnb encode"] = lambda: bnbf.quantize_blockwise(xt, blocksize=256)
            cands["bnb decode"] = lambda: bnbf.dequantize_blockwise(*bq)
        with memory_regime(regime):
            t = time_interleaved(cands, rounds=rounds)
        row = {
            "memory": regime, "bits": bits, "ratio": enc.ratio, "nbytes": enc.nbytes,
            "encode_vs_copy": t["encode"] / t["copy"], "decode_vs_copy": t["decode"] / t["copy"],
            "trick_vs_cast_encode": t["encode trick"] / t["encode cast"],
            "trick_vs_cast_decode": t["decode trick"] / t["decode cast"],
        }
        if torch is not None:
            row["encode_speedup_vs_torch"] = t["torch encode"] / t["encode"]
            row["decode_speedup_vs_torch"] = t["torch decode"] / t["decode"]
        if "bnb encode" in t:
            row["encode_speedup_vs_bnb"] = t["bnb encode"] / t["encode"]
            row["decode_speedup_vs_bnb"] = t["bnb decode"] / t["decode"]
        rows.append(row)
    return rows


def format_quant_report(rows: list[dict], mib: int, threads: int, path: str, trick: bool) -> str:
    fmt = lambda r, k: f"{r[k]:.1f}x faster" if k in r else "-"  # noqa: E731
    lines = [
        f"k-bit quantization, {mib} MiB float32, group 256, nearest, {threads} threads, {path} "
        f"path, {'bit-trick' if trick else 'cast'} conversion by default",
        "",
        "| memory | bits | size ratio | encode / copy | decode / copy | encode vs torch eager | "
        "decode vs torch eager | encode vs bitsandbytes | decode vs bitsandbytes | "
        "trick / cast (enc, dec) |",
        "|---|---|---|---|---|---|---|---|---|---|",
    ]
    for r in rows:
        lines.append(
            f"| {r['memory']} | {r['bits']} | {r['ratio']:.2f}x | {r['encode_vs_copy']:.2f} | "
            f"{r['decode_vs_copy']:.2f} | {fmt(r, 'encode_speedup_vs_torch')} | "
            f"{fmt(r, 'decode_speedup_vs_torch')} | {fmt(r, 'encode_speedup_vs_bnb')} | "
            f"{fmt(r, 'decode_speedup_vs_bnb')} | {r['trick_vs_cast_encode']:.2f}, "
            f"{r['trick_vs_cast_decode']:.2f} |")
    return "\n".join(lines)
