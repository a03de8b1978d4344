"""``python -m actcodec demo``: train a small CNN on scikit-learn's digits once per way of storing
the saved activations, each in a fresh process, and compare accuracy, exact saved bytes, peak
memory and step time.

Configurations: ``fp32`` (plain PyTorch), the `Policy.preset` names (``lossless``, ``8bit``,
``4bit``, ``2bit``, ``auto``, through `actcodec.torch.compress_saved`), ``checkpoint``
(non-reentrant `torch.utils.checkpoint` on every block, the memory alternative a user would pick
instead), and memory budgets: ``budget/N`` trains within 1/N of the bytes plain fp32 saves per
step (`compress_saved(budget=...)`, one context for the whole run), ``budget/N-halved`` halves
that budget half-way through training and trains on. The parent process starts one worker
per configuration (``python -m actcodec demo --worker NAME``, demo_train.py), reads its JSON
result and writes the table (printed and ``demo.md``), a plot
(``demo.png``) and the raw results (``demo.json``) into ``--out``.

How each number is measured:

- saved MiB/step: the unique tensors autograd saves in one training step, parameters excluded.
  fp32 and checkpoint: a counting-only ``saved_tensors_hooks`` pass after training sums the
  storages of the unique saved tensors (inside a checkpointed block checkpoint's own hooks hold
  nothing, so only what is saved outside the blocks counts). Compressed: ``SavedStats``'s exact
  compressed bytes per step (mean over the steps) plus the bytes of the tensors the context kept
  as they are (small ones, e.g. BatchNorm's statistics), taken from the same counting pass.
- peak RSS: the process's lifetime high-water mark (VmHWM). Above floor: the floor is the RSS
  once data, model and optimizer exist and a 2-image warm-up step on a throwaway copy of the
  model has loaded the libraries' lazy state; then ``/proc/self/clear_refs`` resets VmHWM and
  the peak of training is read after the last step. Where that reset is not possible the
  lifetime peak (``ru_maxrss``) minus the floor is used and the table says so.
- step ms: median wall time of one training step (forward, backward, optimizer).
- allocator: the workers allocate as your process does (glibc at its defaults unless you
  preload another; nothing is set in the environment). ``--allocator store`` installs
  `actcodec.torch.allocator` in every configuration, fp32 included, so that torch's large
  tensors take pages of actcodec's store and the process's memory follows live memory (see
  ``python -m actcodec memory`` and docs/MEMORY.md).
- checkpoint: the recomputation in backward runs BatchNorm in training mode a second time, which
  would update its running statistics twice per step; the demo restores them after backward, so
  checkpoint trains exactly like fp32.
- measured/computed: (peak above floor of fp32 - of the config) / (saved of fp32 - of the
  config): the share of the saved bytes that shows up as lower peak memory; n/a for fp32 and
  where the computed savings are under 1 MiB.

This module is the command: its options and settings, and the parent that splits the data
(demo_digits.py, demo_text.py), starts the workers and writes the output (demo_table.py). It
imports no torch itself.
"""
from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time

from . import configs, demo_digits, demo_limits, demo_long, demo_table, demo_text

DEFAULT_CONFIGS = "fp32,lossless,8bit,4bit,2bit,auto,checkpoint,budget/4,budget/8,budget/4-halved"
MiB = 2**20
# Defaults and --quick; explicit options override either.
FULL = {"width": 16, "batch_size": 128, "epochs": 12, "size": 32}
QUICK = {"width": 8, "batch_size": 64, "epochs": 4, "size": 16}
# --task text (demo_text.py): width is the model's, size its context in bytes.
TEXT_FULL = {"width": 128, "batch_size": 32, "epochs": 2, "size": 128}
TEXT_QUICK = {"width": 32, "batch_size": 16, "epochs": 1, "size": 32}


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--configs", default=DEFAULT_CONFIGS,
                   help=f"comma-separated configurations (default: {DEFAULT_CONFIGS}); any "
                        "Policy.preset name works besides fp32 and checkpoint")
    p.add_argument("--task", choices=("limits", "digits", "text"), default="limits",
                   help="limits (default): a byte-level GPT on Python's own help text at a "
                        "series of memory limits (act.Step) beside plain training and "
                        "checkpointing (demo_limits.py); digits: a CNN on scikit-learn's digits "
                        "once per way of storing activations; text: the same on a byte-level "
                        "language model")
    p.add_argument("--layers", type=int, help="limits: the model's blocks (default "
                   f"{demo_limits.FULL['layers']})")
    p.add_argument("--steps", type=int, help="limits: training steps per configuration "
                   f"(default {demo_limits.FULL['steps']}, --quick {demo_limits.QUICK['steps']})")
    p.add_argument("--settings", help=argparse.SUPPRESS)  # limits: the parent's, as JSON
    p.add_argument("--width", type=int,
                   help=f"channels of the first block (default {FULL['width']})")
    p.add_argument("--batch-size", type=int, help=f"default {FULL['batch_size']}")
    p.add_argument("--epochs", type=int, help=f"default {FULL['epochs']}")
    p.add_argument("--size", type=int,
                   help=f"image side after upsampling (default {FULL['size']})")
    p.add_argument("--seeds", type=int, default=1,
                   help="train each configuration this many times, with seeds 0..N-1 for the "
                        "weights and the batch order (the split stays fixed), and report the "
                        "mean test accuracy and its range (default 1)")
    p.add_argument("--threads", type=int, default=0, help="threads for torch and actcodec "
                   "(default: all cores)")
    p.add_argument("--allocator", choices=("process", "store"), default="process",
                   help="how the workers allocate torch's CPU tensors: 'process' (default) as "
                        "your process does (glibc, or whatever you preload), 'store': "
                        "actcodec.torch.allocator installed in every configuration")
    p.add_argument("--out", default="actcodec-demo", help="output folder (default ./actcodec-demo)")
    p.add_argument("--quick", action="store_true", help="a small run (about a minute): width "
                   f"{QUICK['width']}, batch {QUICK['batch_size']}, {QUICK['epochs']} epochs, "
                   f"{QUICK['size']}x{QUICK['size']} images")
    p.add_argument("--worker", help=argparse.SUPPRESS)   # run one configuration, in this process
    p.add_argument("--result", help=argparse.SUPPRESS)   # where the worker writes its JSON
    p.add_argument("--data", help=argparse.SUPPRESS)     # the parent's split of the digits
    p.add_argument("--seed", type=int, default=0, help=argparse.SUPPRESS)  # the worker's seed


def _require() -> None:
    missing = []
    for module, package in (("torch", "torch"), ("sklearn", "scikit-learn"),
                            ("matplotlib", "matplotlib"), ("tqdm", "tqdm")):
        try:
            __import__(module)
        except ImportError:
            missing.append(package)
    if missing:
        raise SystemExit(f"python -m actcodec demo needs {', '.join(missing)}: "
                         f"pip install \"actcodec[demo]\" "
                         f"(from a checkout: pip install -e \".[demo]\")")


def _settings(args) -> dict:
    task = getattr(args, "task", "digits")
    base = {("digits", False): FULL, ("digits", True): QUICK, ("text", False): TEXT_FULL,
            ("text", True): TEXT_QUICK}[task, bool(args.quick)]
    s = {k: (getattr(args, k) if getattr(args, k) is not None else v) for k, v in base.items()}
    s["task"] = task
    s["threads"] = args.threads or os.cpu_count() or 1
    s["allocator"] = getattr(args, "allocator", "process")
    s["seeds"] = getattr(args, "seeds", 1)
    for k in ("width", "batch_size", "epochs", "size", "threads", "seeds"):
        if s[k] < 1:
            raise SystemExit(f"--{k.replace('_', '-')} must be at least 1")
    return s


def _configs(text: str) -> list[str]:
    names = [c.strip() for c in text.split(",") if c.strip()]
    if not names:
        raise SystemExit("--configs is empty")
    for name in names:
        if name.startswith("budget/"):
            if configs.budget_fraction(name) is None and configs.budget_preset(name) is None:
                raise SystemExit(f"--configs: {name!r}: budget/N or budget/N-halved, N a whole "
                                 f"number >= 1, or budget/PRESET (that preset's bytes)")
        elif name not in configs.PLAIN:
            try:
                configs.policy(name)
            except ValueError as e:
                raise SystemExit(f"--configs: {e}; or fp32, checkpoint") from None
    if len(set(names)) != len(names):
        raise SystemExit("--configs: a configuration is listed twice")
    return names


def main(args) -> int:
    _require()
    if getattr(args, "task", "limits") == "limits":
        if args.worker and args.worker.startswith("long:"):
            result = demo_long.run(args.worker[len("long:"):], json.loads(args.settings))
            with open(args.result, "w") as f:
                json.dump(result, f)
            return 0
        if args.worker:
            result = demo_limits.run(args.worker, json.loads(args.settings), args.data)
            with open(args.result, "w") as f:
                json.dump(result, f)
            return 0
        return demo_limits.parent(demo_limits.settings(args), args.out)
    if args.worker:
        if not args.data:
            raise SystemExit("--worker needs --data (the parent makes it)")
        from . import demo_train

        result = demo_train.run(args.worker, _settings(args), args.data, args.seed)
        with open(args.result, "w") as f:
            json.dump(result, f)
        return 0
    return _parent(args)


# ---------------------------------------------------------------------------------------------
# The parent: one fresh process per configuration, then the table and the plot

def _run_worker(name: str, s: dict, tmp: str, seed: int = 0) -> dict:
    path = os.path.join(tmp, f"{name.replace('/', '_')}-{seed}.json")
    cmd = [sys.executable, "-m", "actcodec", "demo", "--worker", name, "--result", path,
           "--seed", str(seed),
           "--data", os.path.join(tmp, "digits.npz"),
           "--width", str(s["width"]), "--batch-size", str(s["batch_size"]),
           "--epochs", str(s["epochs"]), "--size", str(s["size"]),
           "--threads", str(s["threads"])]
    cmd += ["--allocator", s["allocator"], "--task", s["task"]]
    t0 = time.perf_counter()
    proc = subprocess.run(cmd)
    if proc.returncode != 0:
        raise SystemExit(f"the {name} worker failed (exit {proc.returncode}): {' '.join(cmd)}")
    with open(path) as f:
        result = json.load(f)
    result["process_seconds"] = time.perf_counter() - t0
    return result


def _parent(args) -> int:
    t0 = time.perf_counter()
    s = _settings(args)
    names = _configs(args.configs)
    os.makedirs(args.out, exist_ok=True)
    print(f"actcodec demo: {len(names)} configurations, each in a fresh process "
          f"(width {s['width']}, batch {s['batch_size']}, {s['epochs']} epochs, "
          f"{s['size']}x{s['size']}, {s['threads']} threads)", flush=True)
    runs: dict = {name: [] for name in names}
    with tempfile.TemporaryDirectory(prefix="actcodec-demo-") as tmp:
        if s["task"] == "text":
            demo_text.split(os.path.join(tmp, "digits.npz"), s["size"])
        else:
            demo_digits.split(os.path.join(tmp, "digits.npz"))
        for seed in range(s["seeds"]):  # seeds outside: the machine's drift hits every config
            for name in names:
                r = _run_worker(name, s, tmp, seed)
                runs[name].append(r)
                print(f"  {name:>10}{f' seed {seed}' if s['seeds'] > 1 else ''}: test acc "
                      f"{r['test_accuracy'] * 100:6.2f}%, saved "
                      f"{r['saved_bytes'] / MiB:7.1f} MiB/step, peak above floor "
                      f"{r['peak_above_floor'] / MiB:6.0f} MiB, {r['step_ms']:5.0f} ms/step "
                      f"({r['process_seconds']:.0f} s)", flush=True)
    results = [demo_table.aggregate(runs[name]) for name in names]
    total = time.perf_counter() - t0
    table = demo_table.format_table(results)
    notes = demo_table.notes(results, s, total)
    print("\n" + table + "\n\n" + notes)
    with open(os.path.join(args.out, "demo.md"), "w") as f:
        f.write("# actcodec demo\n\n" + table + "\n\n" + notes + "\n")
    with open(os.path.join(args.out, "demo.json"), "w") as f:
        json.dump({"settings": s, "total_seconds": total, "results": results}, f, indent=1)
    demo_table.plot(results, os.path.join(args.out, "demo.png"))
    print(f"\nwrote {os.path.join(args.out, 'demo.md')}, demo.png and demo.json "
          f"(total {total:.0f} s)")
    return 0
