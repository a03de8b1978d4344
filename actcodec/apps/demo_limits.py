"""``python -m actcodec demo`` (``--task limits``, the default): a GPT-style byte-level language
model (demo_text.py) learns real text that ships with Python, at a series of memory limits for
the whole process, each in a fresh process:

- ``fp32``: plain PyTorch, no actcodec; its largest step peak RSS is the first limit;
- ``checkpoint``: torch.utils.checkpoint on every block, what users pick today;
- ``limit=...``: `actcodec.torch.Step(model, limit=...)` at the plain peak, at 1/2 and 1/3
  of it above the floor (the process before its first step, plus AdamW's state), and the
  smallest limit the library accepts once the optimizer's state exists
  (`Step.smallest_limit()` after the other limits' runs); and a limit far too small, refused
  with `MemoryLimitError` before the first step;
- then one long sample per step, a transformers Llama layout at batch 1 (demo_long.py).

Each reports every step's peak RSS (the probes of its first step and the optimizer's step
included), the median step time, the loss of every step and the held-out loss at the end;
the parent writes a table (printed and demo.md), a plot (demo.png) and demo.json.
"""
from __future__ import annotations

import json
import os
import tempfile
import time

from . import demo_long, demo_text, limits_process

MiB = 2**20
FULL = {"width": 384, "batch_size": 16, "size": 512, "layers": 6, "steps": 10}
QUICK = {"width": 256, "batch_size": 16, "size": 512, "layers": 2, "steps": 4}
TOO_SMALL = "1MiB"  # below what the process holds: refused before any probe runs
# The smallest limit tried: what the runs before named, plus room for the next process's
# floor (it differs from one process to the next by up to about 16 MiB)
ABOVE_NAMED, ABOVE_NAMED_BYTES = 1.02, 16 * MiB


def settings(args) -> dict:
    base = QUICK if args.quick else FULL
    s = {k: (getattr(args, k, None) if getattr(args, k, None) is not None else v)
         for k, v in base.items()}
    s["threads"] = args.threads or os.cpu_count() or 1
    for k, v in s.items():
        if v < 1:
            raise SystemExit(f"--{k.replace('_', '-')} must be at least 1")
    s["quick"] = bool(args.quick)
    if s["width"] % 4:
        raise SystemExit("--width must be a multiple of 4 (the model's 4 heads)")
    return s


# ---- the worker: one configuration in this process ----

def run(config: str, s: dict, data: str) -> dict:
    import torch
    import torch.nn.functional as F

    import actcodec.torch as act
    from .process_memory import Sampler, rss

    torch.set_num_threads(s["threads"])
    x_train, y_train, x_test, y_test = demo_text.data(data)
    model = demo_text.model(s["width"], s["size"], config == "checkpoint", layers=s["layers"])
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
    floor = rss() + sum(2 * p.numel() * p.element_size() for p in model.parameters())
    order = torch.randperm(len(x_train), generator=torch.Generator().manual_seed(0))

    def loss_fn(m, batch):
        x, y = batch
        return F.cross_entropy(m(x).flatten(0, 1), y.flatten())

    limit = config[len("limit="):] if config.startswith("limit=") else None
    step = act.Step(model, limit=limit, loss_fn=loss_fn, optimizer=opt) \
        if limit is not None else None
    peaks, times, losses = [], [], []
    # every step's peak (the optimizer's step included) as a thread that resets no counter
    # reads it, the same way for every configuration: not what Step reports of itself
    sampler = Sampler(period=0.001, live=False)  # its RSS alone is read
    sampler.start()
    sampler.on = True
    for i in range(s["steps"]):
        idx = order[(i * s["batch_size"]) % len(order):][:s["batch_size"]]
        batch = (x_train[idx], y_train[idx])
        t0 = time.perf_counter()
        sampler.take_rss()
        if step is None:
            loss = loss_fn(model, batch)
            loss.backward()
        else:
            try:
                loss = step(batch)
            except act.MemoryLimitError as exc:
                sampler.stop.set()
                return {"config": config, "limit": step.limit, "error": str(exc),
                        "needed": exc.needed, "step_peaks": peaks, "floor": floor}
        opt.step()
        opt.zero_grad(set_to_none=True)
        times.append(time.perf_counter() - t0)
        peaks.append(sampler.take_rss())
        losses.append(float(loss.detach()))
        print(f"    {config} step {i + 1}/{s['steps']}: loss {losses[-1]:.3f}, peak "
              f"{peaks[-1] / MiB:.0f} MiB, {times[-1]:.1f} s", flush=True)
    with torch.no_grad():
        test = float(loss_fn(model, (x_test[:s["batch_size"]], y_test[:s["batch_size"]])))
    return {**limits_process.summary(config, step, peaks, times, losses), "test_loss": test,
            "floor": floor}


# ---- the parent ----

def _worker(config: str, s: dict, tmp: str) -> dict:
    return limits_process.run(config, s, tmp, data=os.path.join(tmp, "text.npz"))


def parent(s: dict, out: str) -> int:
    t0 = time.perf_counter()
    os.makedirs(out, exist_ok=True)
    print(f"actcodec demo: a byte-level GPT ({s['layers']} x {s['width']}, batch "
          f"{s['batch_size']} x {s['size']} bytes of Python's own help text) at memory limits, "
          f"{s['steps']} steps each in a fresh process, {s['threads']} threads", flush=True)
    results = []
    with tempfile.TemporaryDirectory(prefix="actcodec-demo-") as tmp:
        demo_text.split(os.path.join(tmp, "text.npz"), s["size"])

        def show(r):
            if "error" in r:
                print(f"  {r['config']}: refused: {r['error']}", flush=True)
            else:
                print(f"  {r['config']}: peak {r['peak'] / MiB:.0f} MiB, {r['step_s']:.2f} "
                      f"s/step, held-out loss {r['test_loss']:.3f}"
                      + (f"; {r['plan']}" if r["plan"] else ""), flush=True)
            return r

        plain = show(_worker("fp32", s, tmp))
        results += [plain, show(_worker("checkpoint", s, tmp))]
        top, floor = plain["peak"], plain["floor"]
        smallest = []
        for limit in (top, floor + (top - floor) // 2, floor + (top - floor) // 3):
            r = show(_worker(f"limit={limit // MiB}MiB", s, tmp))
            results.append(r)
            smallest.append(r.get("smallest") or r.get("needed"))
        named = [x for x in smallest if x]
        least = int(min(named) * ABOVE_NAMED) + ABOVE_NAMED_BYTES if named else None
        accepted = [r["limit"] for r in results if r.get("limit") and "error" not in r]
        if least is not None and (not accepted or least < min(accepted)):
            r = show(_worker(f"limit={least // MiB}MiB", s, tmp))
            # a fresh process's first step plans from its probes alone, more cautiously
            # than the runs that named the limit: where it refuses, once more at what it
            # names (the table shows the limit that ran, the refused try in its plan column)
            if "error" in r and r.get("needed"):
                again = int(r["needed"] * ABOVE_NAMED) + ABOVE_NAMED_BYTES
                if not accepted or again < min(accepted):
                    retry = show(_worker(f"limit={again // MiB}MiB", s, tmp))
                    if "error" not in retry:
                        retry["searched"] = limits_process.searched(r)
                        r = retry
                    else:
                        results.append(r)
                        r = retry
            results.append(r)
        results.append(show(_worker(f"limit={TOO_SMALL}", s, tmp)))
        long_settings = {**(demo_long.QUICK if s["quick"] else demo_long.FULL),
                         "threads": s["threads"]}
        long_runs = demo_long.parent(long_settings, tmp)
    total = time.perf_counter() - t0
    table = format_table(results, plain)
    text = "# actcodec demo: training within a memory limit\n\n" + table + "\n"
    if long_runs:
        text += (f"\n## One long sample per step\n\nA Llama layout ({long_settings['layers']} x "
                 f"{long_settings['width']}, vocabulary {long_settings['vocab']}), batch 1 x "
                 f"{long_settings['tokens']} tokens:\n\n" + demo_long.format_table(long_runs)
                 + "\n")
    print("\n" + text + f"\nTotal {total:.0f} s.")
    with open(os.path.join(out, "demo.md"), "w") as f:
        f.write(text)
    with open(os.path.join(out, "demo.json"), "w") as f:
        json.dump({"settings": s, "total_seconds": total, "results": results,
                   "long_settings": long_settings, "long": long_runs}, f, indent=1)
    plot(results, os.path.join(out, "demo.png"))
    print(f"wrote {os.path.join(out, 'demo.md')}, demo.png and demo.json")
    return 0


def _name(r: dict) -> str:
    limit = r.get("limit")
    return r["config"] if limit is None else f"limit {limit / MiB:.0f} MiB"


def format_table(results: list, plain: dict) -> str:
    lines = ["| config | every step's peak RSS MiB | within | step s | vs fp32 | held-out loss "
             "| plan |", "|---|---|---|---|---|---|---|"]
    for r in results:
        if "error" in r:
            lines.append(f"| {_name(r)} | refused: {r['error']} | | | | | |")
            continue
        within = "-" if r["within"] is None else ("yes" if r["within"] else "NO")
        lines.append(f"| {_name(r)} | {', '.join(str(p // MiB) for p in r['step_peaks'])} | "
                     f"{within} | {r['step_s']:.2f} | {r['step_s'] / plain['step_s']:.2f}x | "
                     f"{r['test_loss']:.3f} | {r['plan'] or '-'}"
                     f"{' (' + r['searched'] + ')' if r.get('searched') else ''} |")
    return "\n".join(lines)


def plot(results: list, path: str) -> None:
    from matplotlib.figure import Figure

    ran = [r for r in results if "error" not in r]
    fig = Figure(figsize=(12, 4.2), layout="constrained")
    ax1, ax2, ax3 = fig.subplots(1, 3)
    names = [_name(r) for r in ran]
    ax1.bar(names, [r["peak"] / MiB for r in ran], color="tab:blue", label="peak RSS")
    for i, r in enumerate(ran):
        if r["limit"] is not None:
            ax1.hlines(r["limit"] / MiB, i - 0.4, i + 0.4, color="tab:red",
                       label="limit" if i == 2 else None)
    ax1.set_ylabel("MiB")
    ax1.set_title("largest step's peak RSS against its limit")
    ax1.legend()
    ax2.bar(names, [r["step_s"] for r in ran], color="tab:gray")
    ax2.set_ylabel("median s per step")
    ax2.set_title("step time")
    for r, name in zip(ran, names):
        ax3.plot(range(1, len(r["losses"]) + 1), r["losses"], label=name)
    ax3.set_xlabel("step")
    ax3.set_ylabel("training loss")
    ax3.set_title("loss per step")
    ax3.legend(fontsize=8)
    for ax in (ax1, ax2):
        ax.tick_params(axis="x", rotation=30)
        ax.grid(axis="y", alpha=0.3)
    fig.savefig(path, dpi=110)
