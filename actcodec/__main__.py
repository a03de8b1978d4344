"""Command line: ``python -m actcodec info`` prints the SIMD table and self-checks every path;
``python -m actcodec demo`` trains a byte-level GPT at a series of memory limits (or, with
``--task digits``, a small CNN under each way of storing activations);
``python -m actcodec memory`` reports a model's peak memory, plain and compressed (both apps
live in actcodec.apps, on the library's public API)."""
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
    """Bitmap round trips of the sample through `path` on `threads` threads, bit for bit."""
    ok = True
    ratio = 0.0
    for dtype in (np.float16, np.float32, np.float64):
        with np.errstate(over="ignore"):  # 3.4e38 becomes inf in float16, on purpose
            x = _sample().astype(dtype)
        enc = actcodec.bitmap.encode(x, threads=threads, simd=path)
        back = actcodec.from_bytes(enc.to_bytes()).decode(threads=threads, simd=path)
        ok &= back.tobytes() == x.tobytes()
        if dtype == np.float32:
            ratio = enc.ratio
    return ok, ratio


def cmd_info(args) -> int:
    info = actcodec.simd_info()
    print(f"actcodec {actcodec.__version__}")
    print(f"cpu features : {' '.join(info['features']) or '(none detected)'}")
    print(f"openmp       : {'yes' if info['openmp'] else 'no (serial core)'}")
    print(f"threads      : {info['threads']} (default)")
    print(f"best path    : {info['best']}   default: {info['default']}")
    print()
    print(f"{'path':8} {'available':10} {'self-check (bitmap round trip, 1 and 2 threads)'}")
    failed = False
    for path in ("scalar", "sse2", "avx2", "neon"):
        if path not in info["available"]:
            print(f"{path:8} {'no':10} -")
            continue
        results = [_self_check(path, t) for t in (1, 2)]
        good = all(ok for ok, _ in results)
        failed |= not good
        print(f"{path:8} {'yes':10} {'bit-exact' if good else 'FAILED'}"
              f" (float32 sample compresses {results[0][1]:.2f}x)")
    return 1 if failed else 0


def cmd_demo(args) -> int:
    from .apps import demo

    return demo.main(args)


def cmd_memory(args) -> int:
    from .apps import memory

    return memory.main(args)


def main(argv=None) -> int:
    # The apps' command modules hold their options and import nothing heavy: torch and the
    # rest come in when a command runs (`python -m actcodec info` imports no torch).
    from .apps import demo, memory

    parser = argparse.ArgumentParser(prog="python -m actcodec")
    sub = parser.add_subparsers(dest="command", required=True)
    sub.add_parser("info", help="print the SIMD table and self-check every path")
    demo.add_arguments(sub.add_parser("demo", help="train a byte-level GPT at a series of "
                                      "memory limits; writes demo.md/png"))
    memory.add_arguments(sub.add_parser("memory", help="a model's peak memory, plain and "
                                        "compressed, each in a fresh process"))
    args = parser.parse_args(argv)
    return {"info": cmd_info, "demo": cmd_demo, "memory": cmd_memory}[args.command](args)


if __name__ == "__main__":
    sys.exit(main())
