"""``python -m actcodec memory``: what a model's training takes in memory, as you see it, plain
and under compression, each configuration in a fresh process.

For every configuration it trains a few steps and reports: the bytes saved for backward per
step (counted exactly), the process's peak RSS, its peak of live bytes (RSS less the memory
the allocators hold free: glibc's free heap chunks, the store's unused pages) and their ratio,
the median step time, and measured/computed: how much of the saved-byte difference to the
plain run (with the same allocator) shows up as lower peak RSS.

Models: ``cnn`` (a ResNet-style CNN, random data), ``gpt2`` and ``resnet`` (transformers
models built from a config, random weights, nothing downloaded; needs transformers), or
``package.module:function``, your own: a function returning ``(model, loss_fn)`` with
``loss_fn(model)`` a training loss (zoo.py). Configurations: ``fp32``, any ``Policy.preset``
name, ``checkpoint`` (built-in models), budget/N, offload (configs.py). compress_saved installs
actcodec's torch allocator (actcodec.torch.allocator) on first use, as for every user; a
``+store`` suffix installs it by hand (plain runs too), ``+heap`` keeps torch's
(``allocator=False``). glibc (or whatever allocator you preload) runs as your process has it:
nothing is set in the environment.

This module is the command: its options, the parent that starts one worker
(memory_worker.py) per configuration, and the table. It imports no torch itself.
"""
from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile

from . import configs
from .zoo import BUILTIN

MiB = 2**20
DEFAULT_CONFIGS = "fp32,fp32+store,8bit,2bit,8bit+heap,checkpoint"


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--model", default="cnn", help=f"{', '.join(BUILTIN)}, or module:function "
                   "returning (model, loss_fn) (default cnn)")
    p.add_argument("--configs", default=DEFAULT_CONFIGS,
                   help=f"comma-separated (default {DEFAULT_CONFIGS}): fp32, checkpoint, a "
                        "Policy preset, budget/N (a budget of 1/N of what fp32 saves), offload "
                        "(a budget of 0: every save paged out), limit=SIZE (act.Step within a "
                        "memory limit, e.g. limit=700MiB); "
                        "(compress_saved installs actcodec's torch allocator on first use); "
                        "'+store': installed by hand (plain runs too), '+heap': torch's kept")
    p.add_argument("--steps", type=int, default=3, help="measured steps after the warm-up")
    p.add_argument("--warm-up", type=int, default=1,
                   help="steps before the measured ones (a budget plans from its first step, "
                        "the store from the step before)")
    p.add_argument("--threads", type=int, default=2)
    p.add_argument("--threshold", type=int,
                   help="'+store': the smallest tensor in bytes actcodec's allocator serves "
                        "(default actcodec.torch.allocator.THRESHOLD, 1 MiB; smaller ones stay "
                        "in glibc's heap)")
    p.add_argument("--sizes", default="", help="the model's sizes, e.g. batch=8,seq=512")
    p.add_argument("--json", help="write the results here")
    p.add_argument("--worker", help=argparse.SUPPRESS)
    p.add_argument("--result", help=argparse.SUPPRESS)


def main(args) -> int:
    sizes = {k: int(v) for k, v in (kv.split("=") for kv in args.sizes.split(",") if kv)}
    if args.worker:
        from . import memory_worker

        result = memory_worker.run(args.model, args.worker, args.steps, sizes, args.threads,
                                   args.warm_up, args.threshold)
        with open(args.result, "w") as f:
            json.dump(result, f)
        return 0
    names = [c.strip() for c in args.configs.split(",") if c.strip()]
    for c in names:  # a clear error for an unknown name, before any worker runs
        configs.check(c)
    if args.warm_up < 1:
        raise SystemExit("--warm-up: at least 1 step")
    if args.threshold is not None and args.threshold < 1:
        raise SystemExit("--threshold: at least 1 byte")
    print(f"actcodec memory: {args.model} {args.sizes or '(default sizes)'}, {args.steps} steps "
          f"after {args.warm_up} warm-up step{'s' * (args.warm_up > 1)}, {args.threads} threads, "
          f"each configuration in a fresh process"
          + (f", '+store' from {args.threshold} bytes" if args.threshold is not None else ""),
          flush=True)
    results = []
    for c in names:
        r = _run_worker(args, c)
        if "error" in r:
            print(f"  {c:>14}: {r['error']}", flush=True)
            continue
        results.append(r)
        if "limit" in r:
            print(f"  {c:>14}: peak RSS {r['peak_rss'] / MiB:6.0f} MiB (every step's: "
                  f"{', '.join(str(p // MiB) for p in r['step_peaks'])}; within the limit: "
                  f"{'yes' if r['within'] else 'NO'}), {r['step_ms']:6.0f} ms/step; "
                  f"{r['plan']}", flush=True)
            continue
        print(f"  {c:>14}: saved {r['saved_bytes'] / MiB:7.0f} MiB/step, peak RSS "
              f"{r['peak_rss'] / MiB:6.0f} MiB, peak live {r['peak_live'] / MiB:6.0f} MiB, "
              f"{r['step_ms']:6.0f} ms/step", flush=True)
    print("\n" + format_table(results))
    for line in budget_lines(results):
        print(line)
    print("\nsaved: exact bytes held for backward (compressed: the step's peak; plain: the unique "
          "saved storages). live: RSS less the allocators' free memory. measured / computed: "
          "(peak RSS of fp32 - this) / (saved of fp32 - this), against fp32 with the same "
          "allocator.")
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"model": args.model, "sizes": sizes, "threshold": args.threshold,
                       "results": results}, f, indent=1)
    return 0


def _run_worker(args, config: str) -> dict:
    """One configuration in a fresh process (``python -m actcodec memory --worker``)."""
    with tempfile.TemporaryDirectory(prefix="actcodec-memory-") as tmp:
        path = os.path.join(tmp, "result.json")
        cmd = [sys.executable, "-m", "actcodec", "memory", "--model", args.model,
               "--steps", str(args.steps), "--warm-up", str(args.warm_up),
               "--threads", str(args.threads),
               "--sizes", args.sizes, "--worker", config, "--result", path]
        if args.threshold is not None:
            cmd += ["--threshold", str(args.threshold)]
        proc = subprocess.run(cmd)
        if proc.returncode != 0:
            raise SystemExit(f"the {config} worker failed (exit {proc.returncode})")
        with open(path) as f:
            return json.load(f)


# ---- the table ----

def _runs_of(results: list[dict], name: str) -> dict:
    """The runs of configuration `name` by the allocator torch's large tensors come from:
    "" (torch's) or "store" (actcodec's, installed by hand)."""
    return {_allocator(r): r for r in results if r["config"].partition("+")[0] == name}


def _allocator(run: dict) -> str:
    """"store" for a run whose suffix installed actcodec's allocator by hand, else "" (a plain
    run, or "+heap": torch's allocator; compress_saved's own install counts as the user's)."""
    return "store" if run["config"].partition("+")[2] == "store" else ""


def format_table(results: list[dict]) -> str:
    plain = _runs_of(results, "fp32")
    head = ["config", "saved MiB/step", "peak RSS MiB", "peak live MiB", "RSS / live",
            "step ms", "measured / computed"]
    lines = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    for r in results:
        base = plain.get(_allocator(r))
        ratio = "-"
        if base is not None and base is not r and "limit" not in r:
            computed = base["saved_bytes"] - r["saved_bytes"]
            if abs(computed) >= MiB:
                ratio = f"{(base['peak_rss'] - r['peak_rss']) / computed:.2f}"
        saved = "-" if r["saved_bytes"] is None else f"{r['saved_bytes'] / MiB:.0f}"
        lines.append(f"| {r['config']} | {saved} | "
                     f"{r['peak_rss'] / MiB:.0f} | {r['peak_live'] / MiB:.0f} | "
                     f"{r['peak_rss'] / max(r['peak_live'], 1):.2f} | {r['step_ms']:.0f} | "
                     f"{ratio} |")
    return "\n".join(lines)


def budget_lines(results: list[dict]) -> list[str]:
    """For each budget run: its peak RSS above the plain run's floor (its live bytes before a
    measured step, same allocator: parameters, gradients, libraries) = the budget + the rest.
    With an offload run beside it (same allocator), the ops' working set as RSS sees it: the
    peak above the floor of a step that holds nothing in memory for backward, so that the
    budget's cost is its peak RSS over offload's, at most the budget when it is kept."""
    plain, offload = _runs_of(results, "fp32"), _runs_of(results, configs.OFFLOAD)
    out = []
    for r in results:
        allocator = _allocator(r)
        base = plain.get(allocator)
        if r.get("budget") is None or base is None or base.get("floor_live") is None:
            continue
        above = r["peak_rss"] - base["floor_live"]
        line = (f"{r['config']}: budget {r['budget'] / MiB:.0f} MiB, held at most "
                f"{r['saved_bytes'] / MiB:.0f}; peak RSS above the plain floor "
                f"{above / MiB:.0f} MiB = the budget + {(above - r['budget']) / MiB:.0f}")
        nothing = offload.get(allocator)
        if nothing is not None and nothing is not r:
            working = nothing["peak_rss"] - base["floor_live"]
            line += (f"; the ops' working set (offload's peak above the floor) {working / MiB:.0f}"
                     f" MiB, so budget + working set {(r['budget'] + working) / MiB:.0f} MiB")
        out.append(line)
    return out
