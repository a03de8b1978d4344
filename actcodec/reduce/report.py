"""Side-by-side numbers for the reductions: throughput against torch.aminmax and numpy, and
the first-call latency of a fresh process with Numba's cache cold and warm."""
from __future__ import annotations

import json
import os
import subprocess
import sys
import tempfile

import numba
import numpy as np


def reduce_report(mib: int = 64, rounds: int = 9, threads: int = 2,
                  dtype: str = "float32") -> list[dict]:
    """One row per strategy for a `mib` MiB array of `dtype` (float16/32/64) on `threads`
    threads: median time over interleaved rounds, and throughput ratios against torch.aminmax
    (if torch is installed), numpy's min() + max() of the same array and a threaded copy of
    it (> 1: faster). numpy's float16 min/max is scalar code: seconds per round at 64 MiB."""
    from actcodec import _dtypes
    from actcodec.benchmark import threaded_copy, time_interleaved

    from . import STRATEGIES, minmax, strategy_for

    try:
        import torch
    except ImportError:
        torch = None
    old_numba = numba.get_num_threads()
    old_torch = torch.get_num_threads() if torch is not None else None
    numba.set_num_threads(threads)
    if torch is not None:
        torch.set_num_threads(threads)
    try:
        x = np.random.default_rng(0).standard_normal(
            (mib << 20) // np.dtype(dtype).itemsize, dtype=np.float32).astype(dtype, copy=False)
        picked = strategy_for(x)  # profiles now if needed, outside the timed rounds
        want = (float(x.min()), float(x.max()))
        for s in STRATEGIES:
            got = minmax(x, strategy=s)
            if got != want:
                raise RuntimeError(f"strategy {s} gives {got}, numpy {want}")
        candidates = {s: (lambda s=s: minmax(x, strategy=s)) for s in STRATEGIES}
        candidates["numpy"] = lambda: (x.min(), x.max())
        # The C pass the quantizer's per-tensor mode runs (csrc/quant.c), for the comparison.
        from actcodec import _ext
        wire_id, esize, _ = _dtypes.DTYPES[x.dtype.name]
        candidates["C"] = lambda: _ext.minmax(x.view(np.uint8), wire_id, esize)
        candidates["copy"] = lambda: threaded_copy(x)
        if torch is not None:
            t = torch.from_numpy(x)
            candidates["torch"] = lambda: torch.aminmax(t)
        times = time_interleaved(candidates, rounds=rounds)
    finally:
        numba.set_num_threads(old_numba)
        if torch is not None:
            torch.set_num_threads(old_torch)
    rows = []
    for s in (*STRATEGIES, "C"):
        sec = times[s]
        label = {"auto": f"auto ({picked})", "C": "C core (quant per-tensor pass)"}.get(s, s)
        rows.append({
            "strategy": label, "ms": sec * 1e3,
            "GBs": x.nbytes / sec / 1e9, "threads": threads, "mib": mib, "dtype": x.dtype.name,
            "vs_copy": times["copy"] / sec, "copy_ms": times["copy"] * 1e3,
            "vs_torch": times["torch"] / sec if torch is not None else None,
            "vs_numpy": times["numpy"] / sec,
            "torch_ms": times["torch"] * 1e3 if torch is not None else None,
            "numpy_ms": times["numpy"] * 1e3,
        })
    return rows


def format_reduce_report(rows: list[dict]) -> str:
    r0 = rows[0]
    lines = [
        f"min/max of {r0['mib']} MiB {r0.get('dtype', 'float32')}, {r0['threads']} threads "
        f"(medians of interleaved rounds; throughput ratios, > 1 is faster). torch.aminmax: "
        + (f"{r0['torch_ms']:.2f} ms" if r0["torch_ms"] is not None else "not installed")
        + f", numpy min()+max(): {r0['numpy_ms']:.2f} ms",
        "",
        "| strategy | ms | GB/s | vs torch.aminmax | vs numpy min+max |",
        "|---|---|---|---|---|",
    ]
    for r in rows:
        vs_torch = f"{r['vs_torch']:.2f}x" if r["vs_torch"] is not None else "-"
        lines.append(f"| {r['strategy']} | {r['ms']:.2f} | {r['GBs']:.1f} | {vs_torch} | "
                     f"{r['vs_numpy']:.2f}x |")
    return "\n".join(lines)


_CHILD = """
import json, time
t0 = time.perf_counter()
import numpy as np
from actcodec import reduce
t1 = time.perf_counter()
x = np.ones(1 << 20, np.float32)  # 4 MiB: the threaded path
reduce.minmax(x, strategy="hybrid")
t2 = time.perf_counter()
reduce.minmax(x)  # auto: profiles float32, which needs every strategy's kernel
t3 = time.perf_counter()
reduce.minmax(x, strategy="hybrid")
t4 = time.perf_counter()
print(json.dumps({"import": t1 - t0, "first_call": t2 - t1, "first_auto": t3 - t2,
                  "next_call": t4 - t3}))
"""


def first_call_latency(timeout: float = 300.0) -> dict:
    """Seconds to import actcodec.reduce and make the first calls in a fresh process, with an
    empty Numba cache and profile directory ("cold": everything compiles, "first_auto"
    includes the profile), then again with what that run left there ("warm")."""
    with tempfile.TemporaryDirectory(prefix="actcodec-latency-") as tmp:
        env = dict(os.environ, NUMBA_CACHE_DIR=os.path.join(tmp, "numba"),
                   ACTCODEC_CACHE_DIR=os.path.join(tmp, "profile"))
        env.pop("ACTCODEC_REDUCE_STRATEGY", None)
        out = {}
        for label in ("cold", "warm"):
            proc = subprocess.run([sys.executable, "-c", _CHILD], env=env, capture_output=True,
                                  text=True, timeout=timeout, check=True)
            out[label] = json.loads(proc.stdout.strip().splitlines()[-1])
    return out


def format_latency(lat: dict) -> str:
    lines = ["First calls in a fresh process, seconds (4 MiB float32; import includes actcodec)",
             "", "| cache | import | first call | first auto (profile) | next call |",
             "|---|---|---|---|---|"]
    for label, d in lat.items():
        lines.append(f"| {label} | {d['import']:.3f} | {d['first_call']:.3f} | "
                     f"{d['first_auto']:.3f} | {d['next_call'] * 1e3:.2f} ms |")
    return "\n".join(lines)
