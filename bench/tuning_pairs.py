"""The tuning knobs against their alternatives, in paired rounds: each round times both
settings on the same input, in alternating order, and the table gives the median of the
per-round ratios (quartiles in brackets). Pairing inside one process is what makes a 10%
difference visible on a shared machine whose speed drifts by more than that between runs.

- quant encode: 512-element tiles ("short") against 4096 ("long"), for input evicted from
  the caches first ("cold") and input just rewritten ("hot", as a layer's output is);
- bitmap encode: threaded blocks growing to 2 MiB against blocks fixed at 128 KiB;
- bitmap encode: values written with non-temporal stores ("streamed") against ordinary ones,
  for input evicted first and input just written (its values may then stay in cache).

    python bench/tuning_pairs.py [--rounds 41] [--mib 4 16 64]

The defaults in csrc/ (short tiles from 16 MiB, blocks up to 2 MiB, streamed values from 8
MiB) come from this table.
"""
from __future__ import annotations

import argparse
import statistics
import time

import numpy as np

from actcodec import _ext, bitmap, quant
from actcodec.benchmark import memory_regime, normal, relu_like

EVICT_BYTES = 64 << 20  # larger than this machine's 32 MiB L3


def quartiles(xs):
    q = statistics.quantiles(xs, n=4, method="inclusive")
    return statistics.median(xs), q[0], q[2]


def paired(a, b, prepare, rounds):
    """Per-round time ratios a/b; `prepare` runs before every timed call."""
    ratios = []
    for r in range(rounds):
        times = {}
        for name in ((a, b) if r % 2 == 0 else (b, a)):
            prepare()
            t0 = time.perf_counter()
            name[1]()
            times[name[0]] = time.perf_counter() - t0
        ratios.append(times[a[0]] / times[b[0]])
    return ratios


def with_tuning(fn, **tuning):
    def run():
        saved = _ext.get_tuning()
        _ext.set_tuning(**tuning)
        try:
            fn()
        finally:
            _ext.set_tuning(**saved)
    return run


def evict():
    """A callable that pushes everything out of the caches (rewrites a buffer past L3)."""
    big, scratch = np.zeros(EVICT_BYTES, np.uint8), np.empty(EVICT_BYTES, np.uint8)
    return lambda: _ext.parallel_copy(scratch, big)


def temperatures(src, cold):
    """A copy x of src, and ("cold", cold: an evict()) and ("hot", rewrite x from src, as a
    layer writes its output just before it is encoded): what to run before each timed call."""
    x = np.empty_like(src)
    x[...] = src
    rewrite = lambda: _ext.parallel_copy(x.view(np.uint8), src.view(np.uint8))  # noqa: E731
    return x, (("cold", cold), ("hot", rewrite))


def quant_rows(mib_list, rounds):
    cold = evict()
    for mib in mib_list:
        x, temps = temperatures(normal(mib << 20), cold)
        for temp, prepare in temps:
            for bits in (2, 8):
                enc = lambda bits=bits: quant.encode(x, bits)  # noqa: E731, B023
                r = paired(("short", with_tuning(enc, quant_short_tiles_from=0)),
                           ("long", with_tuning(enc, quant_short_tiles_from=None)),
                           prepare, rounds)
                yield f"quant {bits}-bit encode, {mib} MiB, {temp}", "short / long", quartiles(r)


def bitmap_rows(mib_list, rounds):
    cold = evict()
    for mib in mib_list:
        for zeros in (0.1, 0.5, 0.9):
            x = relu_like(mib << 20, zeros)
            enc = lambda x=x: bitmap.encode(x)  # noqa: E731
            r = paired(("grown", with_tuning(enc, bitmap_block_max=2 << 20)),
                       ("fixed", with_tuning(enc, bitmap_block_max=128 << 10)),
                       cold, rounds)
            yield (f"bitmap encode, {mib} MiB, {zeros:.0%} zeros, cold", "2 MiB / 128 KiB blocks",
                   quartiles(r))


def stream_rows(mib_list, rounds):
    cold = evict()
    for mib in mib_list:
        x, temps = temperatures(relu_like(mib << 20, 0.5), cold)
        enc = lambda x=x: bitmap.encode(x)  # noqa: E731
        for temp, prepare in temps:
            r = paired(("streamed", with_tuning(enc, bitmap_stream_from=0)),
                       ("ordinary", with_tuning(enc, bitmap_stream_from=None)),
                       prepare, rounds)
            yield (f"bitmap encode, {mib} MiB, 50% zeros, {temp}", "streamed / ordinary",
                   quartiles(r))


def table(rows) -> str:
    lines = ["| case | ratio | median (quartiles) |", "|---|---|---|"]
    for case, what, (m, lo, hi) in rows:
        lines.append(f"| {case} | {what} | {m:.2f} ({lo:.2f}-{hi:.2f}) |")
    return "\n".join(lines)


def main(argv=None) -> str:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--rounds", type=int, default=41)
    ap.add_argument("--mib", type=int, nargs="+", default=[4, 16, 64])
    ap.add_argument("--threads", type=int, default=None)
    args = ap.parse_args(argv)
    if args.threads:
        _ext.set_num_threads(args.threads)
    with memory_regime("reused"):
        rows = list(quant_rows(args.mib, args.rounds))
        rows += list(bitmap_rows([m for m in args.mib if m >= 16] or args.mib[-1:], args.rounds))
        rows += list(stream_rows(sorted({*args.mib, 8}), args.rounds))
    out = (f"{_ext.get_num_threads()} threads, {args.rounds} paired rounds, "
           f"tuning defaults {_ext.get_tuning()}\n\n{table(rows)}")
    print(out)
    return out


if __name__ == "__main__":
    main()
