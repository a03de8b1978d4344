"""``python -m actcodec demo``: train a small CNN on scikit-learn's digits once per way of storing
the saved activations, each in a fresh process, and compare accuracy, exact saved bytes, peak
memory and step time.

Configurations: ``fp32`` (plain PyTorch), the `Policy.preset` names (``lossless``, ``8bit``,
``4bit``, ``2bit``, ``auto``, through `actcodec.torch.compress_saved`), ``checkpoint``
(non-reentrant `torch.utils.checkpoint` on every block, the memory alternative a user would pick
instead), and memory budgets: ``budget/N`` trains within 1/N of the bytes plain fp32 saves per
step (`compress_saved(budget=...)`, one context for the whole run), ``budget/N-halved`` halves
that budget half-way through training and trains on. The parent process starts one worker
per configuration (``python -m actcodec demo
--worker NAME``), reads its JSON result and writes the table (printed and ``demo.md``), a plot
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
"""
from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time

from . import demo_text

SPECIAL = ("fp32", "checkpoint")
DEFAULT_CONFIGS = "fp32,lossless,8bit,4bit,2bit,auto,checkpoint,budget/4,budget/8,budget/4-halved"
MiB = 2**20
# Defaults and --quick; explicit options override either.
FULL = {"width": 16, "batch_size": 128, "epochs": 12, "size": 32}
QUICK = {"width": 8, "batch_size": 64, "epochs": 4, "size": 16}
# --task text (actcodec.demo_text): width is the model's, size its context in bytes.
TEXT_FULL = {"width": 128, "batch_size": 32, "epochs": 2, "size": 128}
TEXT_QUICK = {"width": 32, "batch_size": 16, "epochs": 1, "size": 32}
SEED = 0  # the train/test split; training seeds are 0..--seeds-1
TEST_FRACTION = 0.5  # 899 test images: one image is 0.11 points


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--configs", default=DEFAULT_CONFIGS,
                   help=f"comma-separated configurations (default: {DEFAULT_CONFIGS}); any "
                        "Policy.preset name works besides fp32 and checkpoint")
    p.add_argument("--task", choices=("digits", "text"), default="digits",
                   help="digits: a CNN on scikit-learn's digits (default); text: a byte-level "
                        "language model on the standard library's pydoc_data topics")
    p.add_argument("--width", type=int, help=f"channels of the first block (default {FULL['width']})")
    p.add_argument("--batch-size", type=int, help=f"default {FULL['batch_size']}")
    p.add_argument("--epochs", type=int, help=f"default {FULL['epochs']}")
    p.add_argument("--size", type=int, help=f"image side after upsampling (default {FULL['size']})")
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
                         f"pip install \"actcodec[demo]\" (from a checkout: pip install -e \".[demo]\")")


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
    from .torch import Policy

    names = [c.strip() for c in text.split(",") if c.strip()]
    if not names:
        raise SystemExit("--configs is empty")
    for name in names:
        if name.startswith("budget/"):
            if _budget_fraction(name) is None:
                raise SystemExit(f"--configs: {name!r}: budget/N or budget/N-halved, N a whole "
                                 f"number >= 1")
        elif name not in SPECIAL:
            try:
                Policy.preset(name)
            except ValueError as e:
                raise SystemExit(f"--configs: {e}; or fp32, checkpoint") from None
    if len(set(names)) != len(names):
        raise SystemExit("--configs: a configuration is listed twice")
    return names


def _budget_fraction(name: str) -> int | None:
    """N of a "budget/N" or "budget/N-halved" configuration; None if the name is not one."""
    from .memory import budget_divisor

    return budget_divisor(name.removesuffix("-halved"))


def main(args) -> int:
    _require()
    if args.worker:
        if not args.data:
            raise SystemExit("--worker needs --data (the parent makes it)")
        result = _worker(args.worker, _settings(args), args.data, args.seed)
        with open(args.result, "w") as f:
            json.dump(result, f)
        return 0
    return _parent(args)


# ---------------------------------------------------------------------------------------------
# The worker: one configuration, in a fresh process

def _split_digits(path: str) -> None:
    """The fixed split of scikit-learn's digits (8x8, 0..16), saved for the workers: the parent
    makes it once, so no worker pays for importing scikit-learn."""
    import numpy as np
    from sklearn.datasets import load_digits
    from sklearn.model_selection import train_test_split

    digits = load_digits()  # ships with scikit-learn: no download
    x_train, x_test, y_train, y_test = train_test_split(
        digits.images.astype(np.float32), digits.target.astype(np.int64),
        test_size=TEST_FRACTION, random_state=SEED, stratify=digits.target)
    np.savez(path, x_train=x_train, y_train=y_train, x_test=x_test, y_test=y_test)


def _data(path: str, size: int):
    """Train and test tensors: upsampled bilinearly to size x size, normalized with the train
    set's mean and std."""
    import numpy as np
    import torch
    import torch.nn.functional as F

    with np.load(path) as d:
        arrays = {k: torch.from_numpy(d[k]) for k in d.files}

    def images(x):
        x = (x / 16.0).unsqueeze(1)
        return F.interpolate(x, size=(size, size), mode="bilinear", align_corners=False)

    x_train, x_test = images(arrays["x_train"]), images(arrays["x_test"])
    mean, std = x_train.mean(), x_train.std()
    return (((x_train - mean) / std).contiguous(), arrays["y_train"],
            ((x_test - mean) / std).contiguous(), arrays["y_test"])


def _model(width: int, use_checkpoint: bool, seed: int = 0):
    import torch
    from torch import nn
    from torch.utils.checkpoint import checkpoint

    def unit(cin, cout, stride=1):
        return [nn.Conv2d(cin, cout, 3, stride, 1, bias=False), nn.BatchNorm2d(cout), nn.ReLU()]

    class DemoCNN(nn.Module):
        """A stem, four blocks of two conv-BN-ReLU units (two at full resolution, then 1/2 and
        1/4 with twice and four times the channels) and a linear head."""

        def __init__(self):
            super().__init__()
            w = width
            self.stem = nn.Sequential(*unit(1, w))
            self.blocks = nn.ModuleList([
                nn.Sequential(*unit(w, w), *unit(w, w)),
                nn.Sequential(*unit(w, w), *unit(w, w)),
                nn.Sequential(*unit(w, 2 * w, 2), *unit(2 * w, 2 * w)),
                nn.Sequential(*unit(2 * w, 4 * w, 2), *unit(4 * w, 4 * w)),
            ])
            self.head = nn.Sequential(nn.AdaptiveAvgPool2d(1), nn.Flatten(), nn.Linear(4 * w, 10))

        def forward(self, x):
            x = self.stem(x)
            for block in self.blocks:
                if use_checkpoint and torch.is_grad_enabled():
                    x = checkpoint(block, x, use_reentrant=False)
                else:
                    x = block(x)
            return self.head(x)

    torch.manual_seed(seed)
    return DemoCNN()


def _worker(name: str, s: dict, data: str, seed: int = 0) -> dict:
    import contextlib
    import copy
    import gc
    import hashlib
    import statistics

    import torch
    import torch.nn.functional as F
    from tqdm import tqdm

    import actcodec
    from .memory import CountSaved, count_saved, peak_rss, reset_peak, rss
    from .torch import Policy, allocator, compress_saved

    t_start = time.perf_counter()
    torch.set_num_threads(s["threads"])
    actcodec.set_num_threads(s["threads"])
    if s["allocator"] == "store":
        allocator.install()
    budgeted = name.startswith("budget/")
    policy = None if name in SPECIAL or budgeted else Policy.preset(name)
    recomputes = name == "checkpoint"

    text = s["task"] == "text"
    if text:
        x_train, y_train, x_test, y_test = demo_text.data(data)
        model = demo_text.model(s["width"], s["size"], name == "checkpoint", seed)
    else:
        x_train, y_train, x_test, y_test = _data(data, s["size"])
        model = _model(s["width"], use_checkpoint=(name == "checkpoint"), seed=seed)

    def loss_of(logits, y):  # per image, or per byte of every window
        return F.cross_entropy(logits.reshape(-1, logits.shape[-1]), y.reshape(-1))
    batch = min(s["batch_size"], len(y_train))
    steps_per_epoch = len(y_train) // batch  # drop the last partial batch: equal steps
    total_steps = steps_per_epoch * s["epochs"]
    opt = torch.optim.SGD(model.parameters(), lr=0.05, momentum=0.9, weight_decay=5e-4,
                          nesterov=True)
    sched = torch.optim.lr_scheduler.OneCycleLR(opt, max_lr=0.2, total_steps=total_steps,
                                                pct_start=0.25)
    gen = torch.Generator().manual_seed(seed)  # the same batches in every configuration

    def context(pol):
        return contextlib.nullcontext() if pol is None else compress_saved(pol)

    # Warm up the libraries' lazy state (thread pools, kernels) on a throwaway copy, so the
    # floor is what the process holds before training; the real model is not touched.
    warm = copy.deepcopy(model)
    with context(Policy() if budgeted else policy and Policy.preset(name)):
        loss = loss_of(warm(x_train[:2]), y_train[:2])
    loss.backward()
    del loss
    budget = None
    if budgeted:  # 1/N of what plain fp32 saves for a training batch, counted on the copy
        # as the counting pass below: a batch of its own
        budget = count_saved(lambda m=warm: m(x_train[:batch].clone())) // _budget_fraction(name)
        budgeted_ctx = compress_saved(model=model, budget=budget)
    del warm
    gc.collect()

    floor = rss()
    lifetime_before = peak_rss()
    reset = reset_peak()

    step_seconds, compressed, original, codecs = [], [], [], {}
    losses, held, budgets, reencoded, paged_out = [], [], [], 0, 0
    diverged = None  # the step whose loss or activations were no longer finite
    model.train()
    bar = tqdm(total=total_steps, desc=f"{name:>10}", leave=False, disable=None, unit="step",
               dynamic_ncols=True)
    for _ in range(s["epochs"]):
        if diverged is not None:
            break
        order = torch.randperm(len(y_train), generator=gen)
        for i in range(steps_per_epoch):
            idx = order[i * batch:(i + 1) * batch]
            xb, yb = x_train[idx], y_train[idx]
            t0 = time.perf_counter()
            if budgeted and name.endswith("-halved") and len(losses) == total_steps // 2:
                budgeted_ctx.budget = budget // 2  # and training carries on
            # each entry is a new step of the policy
            ctx = budgeted_ctx if budgeted else context(policy)
            try:
                with ctx:
                    loss = loss_of(model(xb), yb)
            except actcodec.NonFiniteError:  # the activations blew up: training diverged
                diverged = len(losses)
                break
            if not torch.isfinite(loss):
                diverged = len(losses)
                break
            opt.zero_grad(set_to_none=True)
            if recomputes:
                # The recomputation in backward runs BatchNorm in training mode a second time:
                # keep the running statistics the forward left.
                buffers = [b.clone() for b in model.buffers()]
            loss.backward()
            if recomputes:
                with torch.no_grad():
                    for b, kept in zip(model.buffers(), buffers):
                        b.copy_(kept)
            opt.step()
            sched.step()
            step_seconds.append(time.perf_counter() - t0)
            if budgeted:
                held.append(ctx.stats.peak_stored_bytes)
                budgets.append(ctx.budget)
                reencoded += ctx.stats.reencoded
                paged_out += ctx.stats.spilled
            elif policy is not None:
                compressed.append(ctx.stats.compressed_bytes)
                original.append(ctx.stats.original_bytes)
                for k, v in ctx.stats.codecs.items():
                    codecs[k] = codecs.get(k, 0) + v
            losses.append(loss.item())
            del loss, ctx
            bar.update()
            bar.set_postfix(loss=f"{losses[-1]:.3f}", refresh=False)
    bar.close()
    train_seconds = time.perf_counter() - t_start
    peak = peak_rss()
    peak_process = max(peak, lifetime_before)

    model.eval()
    correct, test_loss = 0, 0.0
    with torch.no_grad():
        for i in range(0, len(y_test), 256):
            logits, y = model(x_test[i:i + 256]), y_test[i:i + 256]
            correct += int((logits.argmax(-1) == y).sum())
            test_loss += float(loss_of(logits, y)) * y.numel()
    accuracy, test_loss = correct / y_test.numel(), test_loss / y_test.numel()
    digest = hashlib.sha256()
    for p in model.parameters():
        digest.update(p.detach().numpy().tobytes())

    # The counting pass (after everything measured: it runs BatchNorm in training mode).
    model.train()
    with CountSaved() as counted:
        out = model(x_train[:batch].clone())  # a batch of its own, as in training
    del out
    if budgeted and held:  # what the step held at its peak, kept tensors included
        saved, saved_min, saved_max = statistics.mean(held), min(held), max(held)
        kept = 0
    elif policy is None:
        saved = saved_min = saved_max = counted.nbytes
        kept = 0
    else:
        kept = max(0, counted.nbytes - statistics.mean(original))
        saved = statistics.mean(compressed) + kept
        saved_min, saved_max = min(compressed) + kept, max(compressed) + kept

    return {
        "config": name, "seed": seed, "settings": s, "test_accuracy": accuracy,
        "test_loss": test_loss, "test_images": len(y_test),
        "train_images": len(y_train), "steps": total_steps,
        "final_loss": losses[-1] if losses else None,
        "saved_bytes": saved, "saved_bytes_min": saved_min, "saved_bytes_max": saved_max,
        "counted_bytes": counted.nbytes, "kept_bytes": kept,
        "original_bytes": statistics.mean(original) if original else None,
        "compressed_bytes": statistics.mean(compressed) if compressed else None,
        "codecs": codecs, "floor_rss": floor, "peak_rss": peak_process,
        "peak_above_floor": peak - floor, "peak_reset": reset,
        "step_ms": statistics.median(step_seconds) * 1e3 if step_seconds else float("nan"),
        "seconds": train_seconds,
        "weights_sha256": digest.hexdigest(), "torch": torch.__version__,
        "allocator": s["allocator"],
        "actcodec": actcodec.__version__,
        "budget_bytes": budgets or None, "held_bytes": held or None,
        "within_budget": all(h <= b for h, b in zip(held, budgets)) if budgeted else None,
        "reencoded": reencoded, "paged_out": paged_out, "diverged_at_step": diverged,
    }


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


def aggregate(runs: list[dict]) -> dict:
    """One configuration over its seeds: means of accuracy, bytes and memory, the median of
    the step times, the accuracy range, and every run as it was."""
    import statistics

    out = dict(runs[0])
    for key in ("test_accuracy", "test_loss", "saved_bytes", "peak_rss", "peak_above_floor",
                "floor_rss"):
        out[key] = statistics.mean(r[key] for r in runs)
    out["step_ms"] = statistics.median(r["step_ms"] for r in runs)
    out["saved_bytes_min"] = min(r["saved_bytes_min"] for r in runs)
    out["saved_bytes_max"] = max(r["saved_bytes_max"] for r in runs)
    out["accuracies"] = [r["test_accuracy"] for r in runs]
    out["weights_sha256"] = [r["weights_sha256"] for r in runs]
    out["peak_reset"] = all(r["peak_reset"] for r in runs)
    out["runs"] = runs
    return out


def _ratio(r: dict, base: dict | None) -> float | None:
    if base is None or r is base:
        return None
    computed = base["saved_bytes"] - r["saved_bytes"]
    if abs(computed) < MiB:
        return None
    return (base["peak_above_floor"] - r["peak_above_floor"]) / computed


def format_table(results: list[dict]) -> str:
    base = next((r for r in results if r["config"] == "fp32"), None)
    seeds = max(len(r.get("accuracies", [0])) for r in results)
    head = ["config", "test acc" if seeds == 1 else f"test acc (mean of {seeds})", "vs fp32",
            "test loss", "saved MiB/step", "saved vs fp32", "peak RSS MiB",
            "peak above floor MiB", "step ms", "measured/computed"]
    if seeds > 1:
        head.insert(2, "acc min-max")
    lines = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    for r in results:
        ratio = _ratio(r, base)
        gap = "-" if base is None or r is base else \
            f"{(r['test_accuracy'] - base['test_accuracy']) * 100:+.2f} pts"
        rel = "-" if base is None or r is base else f"{r['saved_bytes'] / base['saved_bytes']:.2f}x"
        loss = f"{r['test_loss']:.4f}" if "test_loss" in r else "-"
        cells = [r["config"], f"{r['test_accuracy'] * 100:.2f}%", gap, loss,
                 f"{r['saved_bytes'] / MiB:.1f}", rel, f"{r['peak_rss'] / MiB:.0f}",
                 f"{r['peak_above_floor'] / MiB:.0f}", f"{r['step_ms']:.0f}",
                 "n/a" if ratio is None else f"{ratio:.2f}"]
        if seeds > 1:
            accs = r.get("accuracies", [r["test_accuracy"]])
            cells.insert(2, f"{min(accs) * 100:.2f}-{max(accs) * 100:.2f}%")
        lines.append("| " + " | ".join(cells) + " |")
    return "\n".join(lines)


def _notes(results: list[dict], s: dict, total: float) -> str:
    r0 = results[0]
    base = next((r for r in results if r["config"] == "fp32"), None)
    same = [r["config"] for r in results
            if base is not None and r is not base and r["weights_sha256"] == base["weights_sha256"]]
    if s.get("task") == "text":
        task = (f"Text: the standard library's pydoc_data topics, {r0['train_images']} train / "
                f"{r0['test_images']} test windows of {s['size']} bytes (every "
                f"{demo_text.HELD_OUT_EVERY}th topic held out); byte-level language model of "
                f"width {s['width']}; test acc: next-byte accuracy, test loss: nats per byte; "
                f"batch {s['batch_size']}, ")
    else:
        task = (f"Digits (scikit-learn), {r0['train_images']} train / {r0['test_images']} test "
                f"images upsampled to {s['size']}x{s['size']}; CNN width {s['width']}, batch "
                f"{s['batch_size']}, ")
    lines = [
        task +
        f"{s['epochs']} epochs ({r0['steps']} steps), {s['threads']} threads, split seed {SEED}, "
        f"training seed{'s 0-' + str(s['seeds'] - 1) if s['seeds'] > 1 else ' 0'}; "
        f"every configuration in its own fresh process. torch {r0['torch']}, actcodec "
        f"{r0['actcodec']}. Total run time {total:.0f} s.",
    ]
    if same:
        lines.append(f"Final weights bit-identical to fp32: {', '.join(same)}.")
    if s["allocator"] == "store":
        lines.append("Allocator: actcodec.torch.allocator installed in every configuration "
                     "(--allocator store): torch's large CPU tensors take pages of the store.")
    else:
        lines.append("Allocator: the process's own (glibc at its defaults unless you preload "
                     "another); nothing set in the environment.")
    diverged = [f"{r['config']} at step {r['diverged_at_step']}" for r in results
                if r.get("diverged_at_step") is not None]
    if diverged:
        lines.append("Diverged (loss or activations no longer finite; training stopped there): "
                     + ", ".join(diverged) + ".")
    budgeted = [r for r in results if r.get("budget_bytes")]
    if budgeted:
        lines.append("Budgets: " + "; ".join(
            f"{r['config']}: {max(r['budget_bytes']) / MiB:.2f} MiB"
            + (f" then {min(r['budget_bytes']) / MiB:.2f}" if r["config"].endswith("-halved")
               else "")
            + f", held at most {max(r['held_bytes']) / MiB:.2f}, "
            + ("within it at every step" if r["within_budget"] else "NOT within it")
            + f" ({r['reencoded']} re-encoded, {r['paged_out']} paged out in all)"
            for r in budgeted) + ".")
    if not all(r["peak_reset"] for r in results):
        lines.append("The kernel's peak-RSS reset (/proc/self/clear_refs) was not available: "
                     "'above floor' is the lifetime peak minus the floor.")
    lines.append(
        "saved MiB/step: unique saved non-parameter tensors per step (compressed: SavedStats' "
        "exact bytes, mean over steps, plus the tensors kept as they are; fp32 and checkpoint: "
        "a counting-only saved_tensors_hooks pass). Floor: RSS with data, model and optimizer "
        "built, before training. measured/computed = (peak above floor of fp32 - config) / "
        "(saved of fp32 - config); n/a where undefined.")
    return "\n\n".join(lines)


def _plot(results: list[dict], path: str) -> None:
    from matplotlib.figure import Figure

    fig = Figure(figsize=(11, 4.2), layout="constrained")
    ax1, ax2 = fig.subplots(1, 2)
    placed: list = []
    for r in results:
        xv, yv = r["peak_above_floor"] / MiB, r["test_accuracy"] * 100
        accs = [a * 100 for a in r.get("accuracies", [r["test_accuracy"]])]
        if len(accs) > 1:  # the seeds' range
            ax1.errorbar(xv, yv, yerr=[[yv - min(accs)], [max(accs) - yv]], fmt="none",
                         ecolor="gray", alpha=0.5, capsize=3)
        ax1.scatter(xv, yv, s=40)
        # Points that coincide (8bit and auto, say) get their labels stacked, not overprinted.
        stack = sum(1 for px, py in placed if abs(px - xv) < 3 and abs(py - yv) < 0.1)
        placed.append((xv, yv))
        ax1.annotate(r["config"], (xv, yv), textcoords="offset points",
                     xytext=(5, 4 + 11 * stack), fontsize=9)
    ax1.set_xlabel("peak RSS above the pre-training floor (MiB)")
    ax1.set_ylabel("test accuracy (%)")
    ax1.set_title("accuracy vs training memory")
    ax1.grid(alpha=0.3)
    names = [r["config"] for r in results]
    ax2.bar(names, [r["step_ms"] for r in results], color="tab:gray")
    ax2.set_ylabel("median ms per training step")
    ax2.set_title("step time")
    ax2.tick_params(axis="x", rotation=30)
    ax2.grid(axis="y", alpha=0.3)
    fig.savefig(path, dpi=110)


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
            _split_digits(os.path.join(tmp, "digits.npz"))
        for seed in range(s["seeds"]):  # seeds outside: the machine's drift hits every config
            for name in names:
                r = _run_worker(name, s, tmp, seed)
                runs[name].append(r)
                print(f"  {name:>10}{f' seed {seed}' if s['seeds'] > 1 else ''}: test acc "
                      f"{r['test_accuracy'] * 100:6.2f}%, saved "
                      f"{r['saved_bytes'] / MiB:7.1f} MiB/step, peak above floor "
                      f"{r['peak_above_floor'] / MiB:6.0f} MiB, {r['step_ms']:5.0f} ms/step "
                      f"({r['process_seconds']:.0f} s)", flush=True)
    results = [aggregate(runs[name]) for name in names]
    total = time.perf_counter() - t0
    table = format_table(results)
    notes = _notes(results, s, total)
    print("\n" + table + "\n\n" + notes)
    with open(os.path.join(args.out, "demo.md"), "w") as f:
        f.write("# actcodec demo\n\n" + table + "\n\n" + notes + "\n")
    with open(os.path.join(args.out, "demo.json"), "w") as f:
        json.dump({"settings": s, "total_seconds": total, "results": results}, f, indent=1)
    _plot(results, os.path.join(args.out, "demo.png"))
    print(f"\nwrote {os.path.join(args.out, 'demo.md')}, demo.png and demo.json "
          f"(total {total:.0f} s)")
    return 0
