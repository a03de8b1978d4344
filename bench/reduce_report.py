"""The min/max reductions beside torch.aminmax and numpy: one row per strategy, medians of
interleaved rounds on the same array.

    python bench/reduce_report.py [--mib 64] [--rounds 9] [--threads 2]"""
from __future__ import annotations

import argparse
import sys
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))
import harness  # noqa: E402


def rows(mib: int = 64, rounds: int = 9, threads: int = 2, dtype: str = "float32") -> list:
    import numba
    import torch

    from actcodec.reduce import STRATEGIES, minmax, strategy_for

    numba.set_num_threads(threads)
    torch.set_num_threads(threads)
    x = np.random.default_rng(0).standard_normal(
        (mib << 20) // np.dtype(dtype).itemsize, dtype=np.float32).astype(dtype, copy=False)
    picked = strategy_for(x)  # profiles now if needed, outside the timed rounds
    want = (float(x.min()), float(x.max()))
    for s in STRATEGIES:
        if minmax(x, strategy=s) != want:
            raise RuntimeError(f"strategy {s} disagrees with numpy")
    t = torch.from_numpy(x)
    cands = {s: (lambda s=s: minmax(x, strategy=s)) for s in STRATEGIES}
    cands.update({"numpy": lambda: (x.min(), x.max()), "torch": lambda: torch.aminmax(t)})
    times = harness.time_interleaved(cands, rounds)
    out = []
    for s in STRATEGIES:
        label = {"auto": f"auto ({picked})"}.get(s, s)
        out.append({"strategy": label, "ms": times[s] * 1e3, "GBs": x.nbytes / times[s] / 1e9,
                    "vs_torch": times["torch"] / times[s], "vs_numpy": times["numpy"] / times[s]})
    return out


def markdown(rows_: list) -> str:
    lines = ["| strategy | ms | GB/s | vs torch.aminmax | vs numpy min+max |",
             "|---|---|---|---|---|"]
    for r in rows_:
        lines.append(f"| {r['strategy']} | {r['ms']:.2f} | {r['GBs']:.1f} | "
                     f"{r['vs_torch']:.2f}x | {r['vs_numpy']:.2f}x |")
    return "\n".join(lines)


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--mib", type=int, default=64)
    p.add_argument("--rounds", type=int, default=9)
    p.add_argument("--threads", type=int, default=2)
    args = p.parse_args(argv)
    print(markdown(rows(args.mib, args.rounds, args.threads)))
    return 0


if __name__ == "__main__":
    sys.exit(main())
