"""Command line: ``python -m actcodec info`` prints the SIMD table and self-checks every path."""
from __future__ import annotations

import argparse
import sys

import numpy as np

import actcodec


def _sample(n: int = 100_003) -> np.ndarray:
    """A ReLU-like float32 sample (about half zeros) with the awkward values mixed in."""
    rng = np.random.default_rng(0)
    x = np.maximum(rng.standard_normal(n, dtype=np.float32), 0)
    x[:8] = [np.nan, -0.0, np.inf, -np.inf, 1e-45, -1e-45, 3.4e38, 0.0]
    return x


def _self_check(path: str, threads: int) -> tuple[bool, float]:
    actcodec.set_simd(path)
    actcodec.set_num_threads(threads)
    ok = True
    ratio = 0.0
    for dtype in (np.float16, np.float32, np.float64):
        with np.errstate(over="ignore"):  # 3.4e38 becomes inf in float16, on purpose
            x = _sample().astype(dtype)
        enc = actcodec.bitmap.encode(x)
        back = actcodec.from_bytes(enc.to_bytes()).decode()
        ok &= back.tobytes() == x.tobytes()
        if dtype == np.float32:
            ratio = enc.ratio
    return ok, ratio


def cmd_info(args) -> int:
    info = actcodec.simd_info()
    print(f"actcodec {actcodec.__version__}")
    print(f"cpu features : {' '.join(info['features']) or '(none detected)'}")
    print(f"openmp       : {'yes' if info['openmp'] else 'no (serial core)'}")
    print(f"threads      : {info['threads']}")
    print(f"best path    : {info['best']}   active: {info['active']}")
    print()
    print(f"{'path':8} {'available':10} {'self-check (bitmap round trip, 1 and 2 threads)'}")
    active, threads = info["active"], info["threads"]
    failed = False
    try:
        for path in ("scalar", "sse2", "avx2", "neon"):
            if path not in info["available"]:
                print(f"{path:8} {'no':10} -")
                continue
            results = [_self_check(path, t) for t in (1, 2)]
            good = all(ok for ok, _ in results)
            failed |= not good
            print(f"{path:8} {'yes':10} {'bit-exact' if good else 'FAILED'}"
                  f" (float32 sample compresses {results[0][1]:.2f}x)")
    finally:
        actcodec.set_simd(active)
        actcodec.set_num_threads(threads)
    return 1 if failed else 0


BENCH_CODECS = ("raw", "bitmap", "quant", "bitmap_quant", "auto", "reduce")
BENCH_DTYPES = ("float32", "float16")
BENCH_REGIMES = ("fresh", "reused")


def _bench_command(args) -> str:
    """The command line that reproduces this run, for the report's header."""
    parts = ["python -m actcodec bench", f"--mib {args.mib}", f"--rounds {args.rounds}"]
    if args.threads:
        parts.append(f"--threads {args.threads}")
    for name, default in (("codecs", BENCH_CODECS), ("dtypes", BENCH_DTYPES),
                          ("regimes", BENCH_REGIMES)):
        if list(getattr(args, name)) != list(default):
            parts.append(f"--{name} " + " ".join(getattr(args, name)))
    return " ".join(parts)


def cmd_bench(args) -> int:
    from . import bench_render, bench_report

    if args.threads:
        actcodec.set_num_threads(args.threads)

    def progress(row, seconds):
        params = " ".join(f"{k}={v}" for k, v in row.params.items())
        print(f"  {row.dtype} {row.memory:6} {row.codec} {params}: encode/copy "
              f"{row.vs_copy['encode']:.2f}, decode/copy {row.vs_copy['decode']:.2f} "
              f"({seconds:.1f} s)", file=sys.stderr, flush=True)

    rep = bench_report.run(args.mib, args.rounds, args.codecs, args.dtypes, args.regimes,
                           progress=progress)
    command = _bench_command(args)
    print(bench_render.markdown(rep, command), flush=True)
    paths = bench_render.write(rep, args.out, command)
    print(f"wrote {paths['md']}" + (f" and {paths['png']}" if paths["png"] else
                                    f"; {paths['png_note']}"), file=sys.stderr)
    return 0


def cmd_demo(args) -> int:
    from . import demo

    return demo.main(args)


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(prog="python -m actcodec")
    sub = parser.add_subparsers(dest="command", required=True)
    sub.add_parser("info", help="print the SIMD table and self-check every path")
    bench = sub.add_parser("bench", help="the codec report: ratios to a threaded copy, numpy, "
                           "torch, bitsandbytes, torchao; writes bench.md and bench.png")
    bench.add_argument("--mib", type=int, default=64, help="array size in MiB (default 64)")
    bench.add_argument("--rounds", type=int, default=9, help="interleaved rounds (default 9)")
    bench.add_argument("--threads", type=int, default=0, help="threads (default: all cores)")
    bench.add_argument("--codecs", nargs="+",
                       default=list(BENCH_CODECS), choices=BENCH_CODECS,
                       help="which sections (default: all; reduce needs numba)")
    bench.add_argument("--dtypes", nargs="+", default=list(BENCH_DTYPES), choices=BENCH_DTYPES,
                       help="element types (default: both)")
    bench.add_argument("--regimes", nargs="+", default=list(BENCH_REGIMES),
                       choices=BENCH_REGIMES, help="memory regimes (default: both)")
    bench.add_argument("--out", default="actcodec-bench",
                       help="directory for bench.md and bench.png (default ./actcodec-bench)")
    from . import demo  # its options only: torch and the rest are imported when it runs

    demo.add_arguments(sub.add_parser("demo", help="train a small CNN on digits once per "
                                      "storage of the saved activations; writes demo.md/png"))
    args = parser.parse_args(argv)
    return {"info": cmd_info, "bench": cmd_bench, "demo": cmd_demo}[args.command](args)


if __name__ == "__main__":
    sys.exit(main())
