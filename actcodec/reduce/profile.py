"""The one-time profile behind ``strategy="auto"`` (DAF 3.2.2: "profiling can be performed
offline to determine and configure the optimal reduction strategy").

For each (device, element width, thread count) the strategies are timed side by side on one
group of each bucket size, in interleaved rounds, and the fastest per bucket is kept: in
memory for the process, and as JSON in the cache directory for the next one:

    $ACTCODEC_CACHE_DIR            if set ("off": keep the profile in memory only)
    $XDG_CACHE_HOME/actcodec       else
    ~/.cache/actcodec              else

A group falls in the first bucket at least its size (the last bucket takes everything larger).
On the CPU the whole profile reads about 1 GiB, tens of milliseconds, plus any JIT compiles
that Numba's cache has not kept.
"""
from __future__ import annotations

import json
import os
import threading
import time
from bisect import bisect_left
from pathlib import Path
from statistics import median
from typing import Callable

import numba

FORMAT = 1  # bump when the kernels change enough to invalidate stored profiles
SIZES = (1 << 20, 4 << 20, 16 << 20, 32 << 20)  # bytes per group, one bucket each
ROUNDS = 5
FILENAME = "reduce-profile.json"

_memory: dict[str, dict] = {}
_lock = threading.Lock()
_forced: str | None = None


def cache_dir() -> Path | None:
    """Where the profile is stored, or None when disk caching is off."""
    env = os.environ.get("ACTCODEC_CACHE_DIR")
    if env is not None:
        return None if env.strip().lower() == "off" else Path(env)
    base = os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache"
    return Path(base) / "actcodec"


def entry_key(device: str, itemsize: int) -> str:
    return f"{device}|{8 * itemsize}-bit|numba {numba.__version__}|v{FORMAT}"


def force(strategy: str | None) -> None:
    """Make "auto" mean `strategy` in this process (None: back to the profile). The
    ACTCODEC_REDUCE_STRATEGY environment variable does the same from outside."""
    global _forced
    _forced = strategy


def forced() -> str | None:
    return _forced or os.environ.get("ACTCODEC_REDUCE_STRATEGY") or None


def pick(entry: dict, nbytes: int) -> str:
    sizes = entry["sizes"]
    return entry["best"][min(bisect_left(sizes, nbytes), len(sizes) - 1)]


def get(device: str, itemsize: int, bench: Callable, strategies, *, rerun: bool = False,
        sizes=SIZES, rounds: int = ROUNDS) -> dict:
    """The profile entry of a device and element width: from memory, else from disk, else
    measured now (and stored). `bench(nbytes)` returns {strategy: zero-argument callable that
    reduces one group of nbytes}; `rerun` measures again and replaces what was stored."""
    key = entry_key(device, itemsize)
    with _lock:  # one measurement at a time: they would disturb each other
        if not rerun:
            entry = _memory.get(key) or _load(key)
            if entry is not None and list(entry["sizes"]) == list(sizes):
                _memory[key] = entry
                return entry
        entry = _measure(bench, tuple(strategies), sizes, rounds)
        _memory[key] = entry
        _store(key, entry)
        return entry


def _measure(bench, strategies, sizes, rounds) -> dict:
    ms = {s: [] for s in strategies}
    for nbytes in sizes:
        runs = bench(nbytes)
        times = {s: [] for s in strategies}
        for fn in runs.values():  # warm-up: compile or load the kernels, fault the pages in
            fn()
        for r in range(rounds):  # interleaved, rotating who goes first
            for s in strategies[r % len(strategies):] + strategies[:r % len(strategies)]:
                t0 = time.perf_counter()
                runs[s]()
                times[s].append(time.perf_counter() - t0)
        for s in strategies:
            ms[s].append(median(times[s]) * 1e3)
    best = [min(strategies, key=lambda s: ms[s][i]) for i in range(len(sizes))]
    return {"sizes": list(sizes), "best": best, "ms": ms, "threads": numba.get_num_threads(),
            "measured": time.strftime("%Y-%m-%dT%H:%M:%S")}


def _path() -> Path | None:
    d = cache_dir()
    return None if d is None else d / FILENAME


def _load(key: str) -> dict | None:
    path = _path()
    if path is None:
        return None
    try:
        return json.loads(path.read_text()).get(key)
    except (OSError, ValueError, AttributeError):  # missing or damaged: measure again
        return None


def _store(key: str, entry: dict) -> None:
    path = _path()
    if path is None:
        return
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        try:
            data = json.loads(path.read_text())
            if not isinstance(data, dict):
                data = {}
        except (OSError, ValueError):
            data = {}
        data[key] = entry
        tmp = path.with_name(f"{path.name}.{os.getpid()}.tmp")
        tmp.write_text(json.dumps(data, indent=1, sort_keys=True))
        os.replace(tmp, path)  # atomic: a concurrent reader sees the old or the new file
    except OSError:  # a read-only home must not break reductions: the memory copy serves
        pass
