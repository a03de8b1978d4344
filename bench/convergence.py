"""Convergence on real data, 3 seeds: the demo's byte-level language model on Python's own
help text (demo_text.py) and its digits CNN (demo_digits.py), trained in fp32, under the 8, 4
and 2-bit presets and under a budget at the bytes the 2-bit preset holds (budget/2bit, bits
spent by importance). Each configuration and seed in a fresh process (python -m actcodec
demo); the held-out loss as the mean over seeds and the spread (max - min). Writes
docs/CONVERGENCE.md, and each task's table, plot and JSON to docs/convergence/<task>/.

    python bench/convergence.py [--seeds 3] [--tasks text digits] [--quick]

A smoke run at CI speed: it does not resolve differences between configurations (its text
model barely learns); bench/text_convergence.py does. A configuration "holds" where its seed
mean is within the fp32 runs' spread of fp32's mean, or within 2% of it, whichever is larger. One seed says little: on the text task two fp32 runs
that differ only in seed end 3% apart.
"""
from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
CONFIGS = "fp32,8bit,4bit,2bit,2bit@stochastic,budget/2bit"
TASKS = {  # 15 runs of each task, both in about 5 minutes on 2 cores (the default size: about an hour)
    "text": ["--task", "text", "--quick", "--width", "64", "--size", "128"],
    "digits": ["--task", "digits", "--quick"],
}
TOLERANCE = 0.02  # of fp32's mean, where the fp32 runs' own spread is smaller
SMOKE = ("This benchmark is a smoke run: its text model barely learns (2.61 nats per byte where "
         "the bytes' unigram entropy is 3.26), so it cannot tell configurations apart. Claims "
         "about training rest on `python bench/text_convergence.py` "
         "([convergence/text_paired.md](convergence/text_paired.md)), which resolves them.")


def run_task(task: str, seeds: int, out: Path) -> dict:
    out.mkdir(parents=True, exist_ok=True)
    cmd = [sys.executable, "-m", "actcodec", "demo", *TASKS[task], "--configs", CONFIGS,
           "--seeds", str(seeds), "--out", str(out)]
    print(" ".join(cmd[1:]), flush=True)
    subprocess.run(cmd, check=True, cwd=ROOT)
    return json.loads((out / "demo.json").read_text())


def summary(task: str, result: dict) -> list[dict]:
    rows = []
    for r in result["results"]:
        losses = [run["test_loss"] for run in r["runs"]]
        rows.append({"task": task, "config": r["config"], "losses": losses,
                     "mean": statistics.mean(losses), "spread": max(losses) - min(losses),
                     "saved_bytes": r["saved_bytes"]})
    base = next(row for row in rows if row["config"] == "fp32")
    allowed = max(base["spread"], TOLERANCE * base["mean"])
    for row in rows:
        row["vs_fp32"] = row["mean"] / base["mean"] - 1
        row["holds"] = abs(row["mean"] - base["mean"]) <= allowed
    return rows


def table(rows: list[dict]) -> str:
    lines = ["| task | config | held-out loss, seed mean | spread (max - min) | vs fp32 | "
             "saved vs fp32 | within fp32's spread or 2% |", "|---|---|---|---|---|---|---|"]
    for row in rows:
        base = next(r for r in rows if r["task"] == row["task"] and r["config"] == "fp32")
        lines.append(f"| {row['task']} | {row['config']} | {row['mean']:.4f} | "
                     f"{row['spread']:.4f} | {row['vs_fp32'] * 100:+.2f}% | "
                     f"{row['saved_bytes'] / base['saved_bytes']:.2f}x | "
                     f"{'yes' if row['holds'] else 'NO'} |")
    return "\n".join(lines)


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--seeds", type=int, default=3)
    p.add_argument("--tasks", nargs="+", default=list(TASKS), choices=list(TASKS))
    p.add_argument("--out", default=str(ROOT / "docs"))
    args = p.parse_args()
    t0 = time.perf_counter()
    rows = []
    for task in args.tasks:
        rows += summary(task, run_task(task, args.seeds, Path(args.out) / "convergence" / task))
    minutes = (time.perf_counter() - t0) / 60
    text = (f"# Convergence on real data, {args.seeds} seeds: a smoke run\n\n{SMOKE}\n\n"
            f"`python bench/convergence.py` ({minutes:.0f} minutes here): `python -m actcodec "
            f"demo` with `--configs {CONFIGS} --seeds {args.seeds}` and, per task, "
            + "; ".join(f"{t}: `{' '.join(a)}`" for t, a in TASKS.items() if t in args.tasks)
            + ". Each configuration and seed in a fresh process. Held-out loss: "
            f"nats per byte of held-out help topics (text), cross-entropy on the held-out "
            f"half of the digits (digits). budget/2bit: `compress_saved(budget=)` at the bytes "
            f"the 2-bit preset holds for a step.\n\n{table(rows)}\n\n"
            f"Per task and seed: [text](convergence/text/demo.md), "
            f"[digits](convergence/digits/demo.md) (tables, loss curves, JSON).\n")
    (Path(args.out) / "CONVERGENCE.md").write_text(text)
    print("\n" + table(rows) + f"\n\nwrote {Path(args.out) / 'CONVERGENCE.md'} ({minutes:.0f} min)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
