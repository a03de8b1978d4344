"""``python -m actcodec memory``: what a model's training takes in memory, as you see it, plain
and under compression, each configuration in a fresh process.

For every configuration it trains a few steps and reports: the bytes saved for backward per
step (counted exactly), the process's peak RSS, its peak of live bytes (RSS less the memory
the allocators hold free: glibc's free heap chunks, the store's unused pages) and their ratio,
the median step time, and measured/computed: how much of the saved-byte difference to the
plain run (with the same allocator) shows up as lower peak RSS.

Models: ``cnn`` (a ResNet-style CNN defined here, random data), ``gpt2`` and ``resnet``
(transformers models built from a config, random weights, nothing downloaded; needs
transformers), or ``package.module:function``, your own: a function returning
``(model, loss_fn)`` with ``loss_fn(model)`` a training loss. Configurations: ``fp32``, any
``Policy.preset`` name, ``checkpoint`` (built-in models), each with an optional ``+store``
suffix: actcodec's torch allocator installed (actcodec.torch.allocator). glibc (or whatever
allocator you preload) runs as your process has it: nothing is set in the environment.
"""
from __future__ import annotations

import argparse
import ctypes
import ctypes.util
import importlib
import json
import os
import statistics
import subprocess
import sys
import tempfile
import threading
import time

MiB = 2**20
DEFAULT_CONFIGS = "fp32,fp32+store,8bit+store,2bit+store,checkpoint"
BUILTIN = ("cnn", "gpt2", "resnet")


# ---- what the process holds ----

def _status_kib(field: str) -> int | None:
    try:
        with open("/proc/self/status") as f:
            for line in f:
                if line.startswith(field + ":"):
                    return int(line.split()[1])
    except OSError:
        pass
    return None


def rss() -> int:
    """The process's resident bytes now."""
    kib = _status_kib("VmRSS")
    return kib * 1024 if kib is not None else peak_rss()


def peak_rss() -> int:
    """The process's resident high-water mark (since the last reset_peak)."""
    kib = _status_kib("VmHWM")
    if kib is not None:
        return kib * 1024
    import resource

    r = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    return r if sys.platform == "darwin" else r * 1024  # bytes on macOS, KiB elsewhere


def reset_peak() -> bool:
    """Reset the kernel's high-water mark (Linux: VmHWM) to the current RSS."""
    try:
        with open("/proc/self/clear_refs", "w") as f:
            f.write("5")
    except OSError:
        return False
    hwm, now = _status_kib("VmHWM"), _status_kib("VmRSS")
    return hwm is not None and now is not None and hwm <= now + 1024


class _MallInfo2(ctypes.Structure):
    _fields_ = [(name, ctypes.c_size_t) for name in (
        "arena", "ordblks", "smblks", "hblks", "hblkhd", "usmblks", "fsmblks", "uordblks",
        "fordblks", "keepcost")]


def _mallinfo2():
    try:
        libc = ctypes.CDLL(ctypes.util.find_library("c"))
        fn = libc.mallinfo2
    except (OSError, AttributeError, TypeError):  # not glibc, or before 2.33
        return None
    fn.restype = _MallInfo2
    return fn


_MALLINFO2 = _mallinfo2()


def heap() -> dict | None:
    """glibc's own statistics now (mallinfo2): the heap's size, its bytes in use and free, and
    the bytes in mmapped chunks; None under another allocator or an older glibc."""
    if _MALLINFO2 is None:
        return None
    m = _MALLINFO2()
    return {"heap": m.arena, "heap_used": m.uordblks, "heap_free": m.fordblks,
            "mmapped": m.hblkhd}


def held_free() -> int:
    """Bytes the allocators hold but nothing uses: glibc's free heap chunks (0 elsewhere) and
    the actcodec store's mapped pages outside live blocks. Some of them may not be resident,
    so RSS less these underestimates live bytes, and RSS / live errs high."""
    h = heap()
    free = h["heap_free"] if h is not None else 0
    from . import store

    for made in store.made():
        st = made.stats()
        free += st["mapped_bytes"] - st["used_bytes"]
    return free


def live() -> int:
    """The process's live bytes now: RSS less held_free()."""
    return rss() - held_free()


class Sampler(threading.Thread):
    """The peak of live bytes (RSS less held_free), read every `period` seconds."""

    def __init__(self, period: float = 0.002):
        super().__init__(daemon=True)
        self.period, self.peak_live, self.on = period, 0, False
        self.stop = threading.Event()

    def run(self):
        while not self.stop.is_set():
            if self.on:
                self.peak_live = max(self.peak_live, live())
            time.sleep(self.period)


class CountSaved:
    """A counting-only saved_tensors_hooks pass: the unique storages of the saved tensors that
    are not parameters (what plain PyTorch keeps for backward)."""

    def __init__(self):
        import torch

        self.storages: dict = {}
        self._hooks = torch.autograd.graph.saved_tensors_hooks(self._pack, lambda t: t)

    def _pack(self, t):
        import torch

        if (t.is_leaf and t.requires_grad) or isinstance(t, torch.nn.Parameter):
            return t
        s = t.untyped_storage()
        if s.nbytes():
            self.storages[(t.device.type, s.data_ptr())] = s.nbytes()
        # Not t itself: an op's output that its own node keeps would form a reference cycle
        # through autograd's C++ objects, which Python's gc cannot break, and the graph of a
        # forward that never runs backward would never be freed.
        return t.detach()

    @property
    def nbytes(self) -> int:
        return sum(self.storages.values())

    def __enter__(self):
        self._hooks.__enter__()
        return self

    def __exit__(self, *exc):
        return self._hooks.__exit__(*exc)


def count_saved(forward) -> int:
    """Bytes plain PyTorch saves for backward while `forward()` runs (parameters excluded)."""
    with CountSaved() as counted:
        out = forward()
    del out
    return counted.nbytes


def budget_divisor(name: str) -> int | None:
    """N of a "budget/N" configuration (a budget of 1/N of what fp32 saves); None if the name
    is not one."""
    n = name[len("budget/"):] if name.startswith("budget/") else ""
    return int(n) if n.isdigit() and int(n) >= 1 else None


PLAIN = ("fp32", "checkpoint")  # torch saves what it saves; no compress_saved
OFFLOAD = "offload"  # a budget of 0: every save paged out, nothing held in memory for backward


def is_budget(name: str) -> bool:
    """Whether a configuration runs under a budget: budget/N, or offload (a budget of 0)."""
    return name == OFFLOAD or budget_divisor(name) is not None


def new_plain_step(name: str, allocator: bool) -> None:
    """At a step's start: a plain configuration with actcodec's allocator ends the store's
    period itself (actcodec.store.new_step), since no compress_saved does."""
    if allocator and name in PLAIN:
        from . import store

        store.new_step(None)


def budget_context(name: str, model, loss_fn):
    """For a budget configuration: compress_saved with a budget of 1/N of what plain fp32 saves
    for loss_fn(model) ("budget/N"), or of 0 ("offload"), to enter every step (the budget
    learns from the steps before)."""
    import actcodec.torch as act

    budget = 0 if name == OFFLOAD else count_saved(lambda: loss_fn(model)) // budget_divisor(name)
    return act.compress_saved(model=model, budget=budget)


# ---- models ----

def cnn(batch: int = 32, size: int = 64, width: int = 64):
    """A ResNet-style CNN (stem, four stages of two residual blocks) on random images."""
    import torch
    from torch import nn
    import torch.nn.functional as F

    def block(cin, cout, stride):
        body = nn.Sequential(nn.Conv2d(cin, cout, 3, stride, 1, bias=False), nn.BatchNorm2d(cout),
                             nn.ReLU(), nn.Conv2d(cout, cout, 3, 1, 1, bias=False),
                             nn.BatchNorm2d(cout))
        skip = nn.Sequential() if stride == 1 and cin == cout else nn.Sequential(
            nn.Conv2d(cin, cout, 1, stride, bias=False), nn.BatchNorm2d(cout))
        return body, skip

    class Net(nn.Module):
        def __init__(self):
            super().__init__()
            self.stem = nn.Sequential(nn.Conv2d(3, width, 3, 1, 1, bias=False),
                                      nn.BatchNorm2d(width), nn.ReLU())
            self.bodies, self.skips, cin = nn.ModuleList(), nn.ModuleList(), width
            for i, cout in enumerate([width, 2 * width, 4 * width, 8 * width]):
                for j in range(2):
                    body, skip = block(cin, cout, 2 if i and not j else 1)
                    self.bodies.append(body)
                    self.skips.append(skip)
                    cin = cout
            self.head = nn.Linear(cin, 10)

        def forward(self, x):
            x = self.stem(x)
            for body, skip in zip(self.bodies, self.skips):
                x = F.relu(body(x) + skip(x))
            return self.head(x.mean((2, 3)))

    torch.manual_seed(0)
    model = Net()
    gen = torch.Generator().manual_seed(1)
    x = torch.randn(batch, 3, size, size, generator=gen)
    y = torch.randint(0, 10, (batch,), generator=gen)
    return model, lambda m: F.cross_entropy(m(x), y)


def _transformers():
    import transformers

    transformers.logging.set_verbosity_error()
    return transformers


def gpt2(batch: int = 8, seq: int = 512, layers: int = 6, width: int = 384):
    """transformers' GPT2LMHeadModel from a config: `layers` blocks of `width`, 6 heads."""
    import torch

    tf = _transformers()
    torch.manual_seed(0)
    cfg = tf.GPT2Config(n_layer=layers, n_embd=width, n_head=6, n_positions=seq,
                        vocab_size=8192, resid_pdrop=0.0, embd_pdrop=0.0, attn_pdrop=0.0)
    model = tf.GPT2LMHeadModel(cfg)
    ids = torch.randint(0, cfg.vocab_size, (batch, seq), generator=torch.Generator().manual_seed(1))
    return model, lambda m: m(input_ids=ids, labels=ids).loss


def resnet(batch: int = 64, size: int = 128, channels_last: bool = False):
    """transformers' ResNetForImageClassification from a config: a ResNet-18 layout."""
    import torch

    tf = _transformers()
    torch.manual_seed(0)
    cfg = tf.ResNetConfig(depths=[2, 2, 2, 2], hidden_sizes=[64, 128, 256, 512],
                          layer_type="basic", num_labels=10)
    model = tf.ResNetForImageClassification(cfg)
    gen = torch.Generator().manual_seed(1)
    x = torch.randn(batch, 3, size, size, generator=gen)
    y = torch.randint(0, 10, (batch,), generator=gen)
    if channels_last:
        model = model.to(memory_format=torch.channels_last)
        x = x.contiguous(memory_format=torch.channels_last)
    return model, lambda m: m(pixel_values=x, labels=y).loss


def build(spec: str, sizes: dict | None = None):
    """(model, loss_fn) for a built-in name or a 'module:function' factory."""
    sizes = sizes or {}
    if spec in BUILTIN:
        return {"cnn": cnn, "gpt2": gpt2, "resnet": resnet}[spec](**sizes)
    module, _, name = spec.partition(":")
    if not name:
        raise SystemExit(f"--model: {spec!r} is neither {', '.join(BUILTIN)} nor module:function")
    return getattr(importlib.import_module(module), name)(**sizes)


def enable_checkpointing(model) -> None:
    """Non-reentrant activation checkpointing as a user would turn it on: transformers' switch
    where the model has one, else torch.utils.checkpoint around each repeated block."""
    if getattr(model, "supports_gradient_checkpointing", False):
        kwargs = {"use_reentrant": False}
        if hasattr(model, "activation_checkpointing_enable"):
            model.activation_checkpointing_enable(activation_checkpointing_kwargs=kwargs)
        else:  # before transformers 5
            model.gradient_checkpointing_enable(gradient_checkpointing_kwargs=kwargs)
        return
    from torch.utils.checkpoint import checkpoint

    blocks = getattr(getattr(getattr(model, "resnet", None), "encoder", None), "stages", None)
    if blocks is None:
        blocks = getattr(model, "bodies", None)
    if blocks is None:
        raise SystemExit("checkpoint: this model has no blocks this command knows to wrap")
    for block in blocks:
        plain = block.forward
        block.forward = lambda x, plain=plain: checkpoint(plain, x, use_reentrant=False)


# ---- one configuration, in a fresh process ----

def _measure_from_here(sampler) -> tuple:
    """Starts the measured steps: (RSS now, live bytes now, the warm-up's peak RSS)."""
    warm_up = peak_rss()
    reset_peak()
    sampler.on = True
    return rss(), live(), warm_up


def _worker(spec: str, config: str, steps: int, sizes: dict, threads: int,
            warm_up: int = 1, threshold: int | None = None) -> dict:
    import torch

    import actcodec.torch as act

    torch.set_num_threads(threads)
    name, _, store = config.partition("+")
    if store:
        act.allocator.install(threshold or act.allocator.THRESHOLD)
    model, loss_fn = build(spec, sizes)
    model.train()
    if name == "checkpoint":
        enable_checkpointing(model)
    opt = torch.optim.SGD(model.parameters(), lr=1e-4)
    if is_budget(name):  # one context all along
        ctx = budget_context(name, model, loss_fn)
        budget, policy, contexts = ctx.budget, ctx.policy, lambda: ctx
    else:
        budget = None
        policy = None if name in PLAIN else act.Policy.preset(name)
        contexts = lambda: act.compress_saved(policy, model=model)  # noqa: E731
    sampler = Sampler()
    sampler.start()
    times, held = [], []
    floor = floor_live = warm_up_peak = None
    for step in range(warm_up + steps):  # warm-up: lazy state, first allocations, a plan
        t0 = time.perf_counter()
        if policy is None:
            new_plain_step(name, bool(store))
            if step == warm_up:
                floor, floor_live, warm_up_peak = _measure_from_here(sampler)
            loss = loss_fn(model)
        else:
            with contexts() as ctx:
                if step == warm_up:  # after the store's step boundary gave back pages
                    floor, floor_live, warm_up_peak = _measure_from_here(sampler)
                loss = loss_fn(model)
            held.append(ctx.stats.peak_stored_bytes)
        loss.backward()
        opt.step()
        opt.zero_grad(set_to_none=True)
        del loss
        if step >= warm_up:
            times.append(time.perf_counter() - t0)
    sampler.stop.set()
    sampler.join()
    out = {"config": config, "peak_rss": peak_rss(), "floor_rss": floor, "floor_live": floor_live,
           "warm_up_peak_rss": warm_up_peak, "warm_up_steps": warm_up,
           "peak_live": sampler.peak_live, "step_ms": statistics.median(times) * 1e3,
           "budget": budget}
    if policy is None:
        out["saved_bytes"] = count_saved(lambda: loss_fn(model))
    else:
        out["saved_bytes"] = max(held)
    return out


def _run_worker(args, config: str) -> dict:
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


def _runs_of(results: list[dict], name: str) -> dict:
    """The runs of configuration `name` by allocator ("" or "store")."""
    return {r["config"].partition("+")[2]: r for r in results
            if r["config"].partition("+")[0] == name}


def format_table(results: list[dict]) -> str:
    plain = _runs_of(results, "fp32")
    head = ["config", "saved MiB/step", "peak RSS MiB", "peak live MiB", "RSS / live",
            "step ms", "measured / computed"]
    lines = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    for r in results:
        base = plain.get(r["config"].partition("+")[2])
        ratio = "-"
        if base is not None and base is not r:
            computed = base["saved_bytes"] - r["saved_bytes"]
            if abs(computed) >= MiB:
                ratio = f"{(base['peak_rss'] - r['peak_rss']) / computed:.2f}"
        lines.append(f"| {r['config']} | {r['saved_bytes'] / MiB:.0f} | "
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
    plain, offload = _runs_of(results, "fp32"), _runs_of(results, OFFLOAD)
    out = []
    for r in results:
        allocator = r["config"].partition("+")[2]
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


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--model", default="cnn", help=f"{', '.join(BUILTIN)}, or module:function "
                   "returning (model, loss_fn) (default cnn)")
    p.add_argument("--configs", default=DEFAULT_CONFIGS,
                   help=f"comma-separated (default {DEFAULT_CONFIGS}): fp32, checkpoint, a "
                        "Policy preset, budget/N (a budget of 1/N of what fp32 saves), offload "
                        "(a budget of 0: every save paged out); "
                        "'+store': actcodec's torch allocator installed")
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
        result = _worker(args.model, args.worker, args.steps, sizes, args.threads, args.warm_up,
                         args.threshold)
        with open(args.result, "w") as f:
            json.dump(result, f)
        return 0
    configs = [c.strip() for c in args.configs.split(",") if c.strip()]
    from .torch import Policy

    for c in configs:  # a clear error for an unknown name, before any worker runs
        name = c.partition("+")[0]
        if name.startswith("budget/"):
            if budget_divisor(name) is None:
                raise SystemExit(f"--configs: {c!r}: budget/N takes a whole N >= 1")
        elif name not in (*PLAIN, OFFLOAD):
            Policy.preset(name)
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
    for c in configs:
        r = _run_worker(args, c)
        results.append(r)
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
