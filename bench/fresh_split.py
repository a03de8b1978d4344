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
import resource
from statistics import median

from actcodec import bitmap, quant
from actcodec.benchmark import (fixed_mmap_threshold, memory_regime, normal, relu_like,
                                threaded_copy, threaded_fill, time_interleaved)


def candidates(nbytes: int) -> dict:
    sparse, dense = relu_like(nbytes, 0.5), normal(nbytes)
    b, q = bitmap.encode(sparse), quant.encode(dense, 2)
    return {"copy": lambda: threaded_copy(sparse),
            "fill (memset)": lambda: threaded_fill(sparse.nbytes),
            "bitmap decode, 50% zeros": b.decode,
            "bitmap encode, 50% zeros": lambda: bitmap.encode(sparse),
            "quant decode, 2-bit": q.decode,
            "quant encode, 2-bit": lambda: quant.encode(dense, 2)}


def measure(cands: dict, rounds: int) -> dict:
    """name -> (median wall ms, median faults, system CPU ms per call, user CPU ms per call),
    from benchmark.time_interleaved with each call's getrusage deltas taken around it."""
    usage = {name: [] for name in cands}

    def counted(name, fn):
        def run():
            r0 = resource.getrusage(resource.RUSAGE_SELF)
            fn()
            r1 = resource.getrusage(resource.RUSAGE_SELF)
            usage[name].append((r1.ru_minflt - r0.ru_minflt, r1.ru_stime - r0.ru_stime,
                                r1.ru_utime - r0.ru_utime))
        return run

    wall = time_interleaved({n: counted(n, fn) for n, fn in cands.items()}, rounds=rounds)
    out = {}
    for name, calls in usage.items():
        calls = calls[1:]  # the warm-up call
        out[name] = (wall[name] * 1e3, median(c[0] for c in calls),
                     sum(c[1] for c in calls) / len(calls) * 1e3,
                     sum(c[2] for c in calls) / len(calls) * 1e3)
    return out


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
