"""Where the time of a call goes when its output lands in newly mapped memory (the report's
"fresh" regime, glibc's default for arrays of 32 MiB and more): wall time, page faults, and
the CPU time the kernel spends (mostly zeroing each new page at the first touch) against the
time spent in our code or in memcpy/memset, per call, for the copy and fill yardsticks and
the codecs, interleaved in rounds in one process.

    python bench/fresh_split.py [--mib 64] [--rounds 21]

System and user time come from getrusage over all rounds of a candidate (the kernel splits
them by sampling, so only the totals are meaningful) and count both threads' CPU time."""
from __future__ import annotations

import argparse
import random
import resource
import time
from statistics import median

from actcodec import bitmap, quant
from actcodec.benchmark import (fixed_mmap_threshold, memory_regime, normal, relu_like,
                                threaded_copy, threaded_fill)


def candidates(nbytes: int) -> dict:
    sparse, dense = relu_like(nbytes, 0.5), normal(nbytes)
    b, q = bitmap.encode(sparse), quant.encode(dense, 2)
    return {"copy": lambda: threaded_copy(sparse),
            "fill (memset)": lambda: threaded_fill(sparse.nbytes),
            "bitmap decode, 50% zeros": b.decode,
            "bitmap encode, 50% zeros": lambda: bitmap.encode(sparse),
            "quant decode, 2-bit": q.decode,
            "quant encode, 2-bit": lambda: quant.encode(dense, 2)}


def measure(cands: dict, rounds: int, seed: int = 0) -> dict:
    """name -> (median wall ms, median faults, system CPU ms per call, user CPU ms per call)"""
    wall = {n: [] for n in cands}
    faults = {n: [] for n in cands}
    cpu = {n: [0.0, 0.0] for n in cands}
    order, rng = list(cands), random.Random(seed)
    for fn in cands.values():
        fn()
    for _ in range(rounds):
        rng.shuffle(order)
        for name in order:
            r0 = resource.getrusage(resource.RUSAGE_SELF)
            t0 = time.perf_counter()
            cands[name]()
            wall[name].append(time.perf_counter() - t0)
            r1 = resource.getrusage(resource.RUSAGE_SELF)
            faults[name].append(r1.ru_minflt - r0.ru_minflt)
            cpu[name][0] += r1.ru_stime - r0.ru_stime
            cpu[name][1] += r1.ru_utime - r0.ru_utime
    return {n: (median(wall[n]) * 1e3, median(faults[n]), cpu[n][0] / rounds * 1e3,
                cpu[n][1] / rounds * 1e3) for n in cands}


def table(res: dict) -> str:
    copy = res["copy"][0]
    lines = ["| call | ms | / copy | faults | kernel CPU ms | own CPU ms | kernel share |",
             "|---|---|---|---|---|---|---|"]
    for name, (ms, flt, sys_ms, user_ms) in res.items():
        share = sys_ms / (sys_ms + user_ms) if sys_ms + user_ms else 0.0
        lines.append(f"| {name} | {ms:.2f} | {ms / copy:.2f} | {flt:.0f} | {sys_ms:.2f} | "
                     f"{user_ms:.2f} | {share:.0%} |")
    return "\n".join(lines)


def main(argv=None) -> str:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--mib", type=int, default=64)
    ap.add_argument("--rounds", type=int, default=21)
    args = ap.parse_args(argv)
    fixed_mmap_threshold()
    cands = candidates(args.mib << 20)
    with memory_regime("fresh"):
        out = table(measure(cands, args.rounds))
    print(f"{args.mib} MiB float32, fresh memory, {args.rounds} interleaved rounds:\n\n{out}")
    return out


if __name__ == "__main__":
    main()
