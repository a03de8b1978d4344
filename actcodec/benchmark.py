"""Side-by-side timing for the benchmark report: candidates run interleaved, round after round,
on the same input, and each is quoted as its median time over a yardstick's median (a threaded
copy of the same array). Ratios from one run are what this shared, noisy machine can support."""
from __future__ import annotations

import random
import time
from statistics import median

import numpy as np

from . import _ext, bitmap


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
    for zf in zero_fractions:
        x = relu_like(mib << 20, zf)
        enc = bitmap.encode(x)
        packed, values = numpy_bitmap_encode(x)
        t = time_interleaved({
            "copy": lambda: threaded_copy(x),
            "encode": lambda: bitmap.encode(x),
            "decode": lambda: enc.decode(),
            "numpy encode": lambda: numpy_bitmap_encode(x),
            "numpy decode": lambda: numpy_bitmap_decode(packed, values, x.size),
        }, rounds=rounds)
        gbs = lambda s: x.nbytes / s / 1e9  # noqa: E731
        rows.append({
            "zeros": zf, "ratio": enc.ratio, "copy_ms": t["copy"] * 1e3,
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
        "| zeros | size ratio | encode / copy | decode / copy | encode vs numpy | "
        "decode vs numpy | encode GB/s | decode GB/s | copy GB/s |",
        "|---|---|---|---|---|---|---|---|---|",
    ]
    for r in rows:
        lines.append(
            f"| {r['zeros']:.0%} | {r['ratio']:.2f}x | {r['encode_vs_copy']:.2f} | "
            f"{r['decode_vs_copy']:.2f} | {r['encode_speedup_vs_numpy']:.1f}x faster | "
            f"{r['decode_speedup_vs_numpy']:.1f}x faster | {r['encode_GBs']:.1f} | "
            f"{r['decode_GBs']:.1f} | {r['copy_GBs']:.1f} |")
    return "\n".join(lines)
