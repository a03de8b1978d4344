"""One training step (forward, backward) of real models under each way of storing the saved
activations, timed in interleaved rounds (a fresh order each round, so every configuration
sees the same machine). Quoted: each configuration's median step over the plain step's, and
the median of per-round ratios.

    python bench/step.py [--models gpt2 resnet] [--configs fp32,8bit,2bit] [--rounds 7]
                         [--gpt2 batch=8,seq=512] [--resnet batch=64,size=128]

Configurations: fp32 (plain PyTorch), any Policy.preset name through the saved-tensor hooks,
budget/N (compress_saved(budget=) at 1/N of the bytes plain fp32 saves) and checkpoint
(non-reentrant activation checkpointing); a "+store" suffix runs the step with actcodec's
torch allocator installed (actcodec.torch.allocator), removed again after it."""
from __future__ import annotations

import argparse
import copy
import random
import statistics
import sys
import time
from pathlib import Path

import torch

from actcodec.apps import configs

sys.path.insert(0, str(Path(__file__).resolve().parent))
import clients  # noqa: E402


def _context(name: str, model, loss_fn):
    """The context one configuration runs every step in (made once: a budget learns from the
    steps before)."""
    return configs.step_contexts(name, model, loss_fn)()


DESCRIPTION = ("GPT-2 layout (transformers GPT2LMHeadModel, 6 layers x 384, 6 heads), batch "
               "4 x 256 tokens; ResNet-18 layout (transformers ResNetForImageClassification), "
               "batch 32 x 3x128x128")


def step(model, loss_fn, name, ctx):
    """One forward and backward of `model` under configuration `name`, in context `ctx`."""
    base, _, store = name.partition("+")
    if store:
        from actcodec.torch import allocator

        allocator.install()
        configs.new_plain_step(base, True)
    try:
        with ctx:
            loss = loss_fn(model)
        loss.backward()
        for p in model.parameters():
            p.grad = None
    finally:
        if store:
            allocator.uninstall()


def run(model_name: str, configs: list[str], rounds: int, sizes: dict | None = None) -> dict:
    base, loss_fn = clients.build(model_name, **(sizes or {}))
    base.train()
    models = {}
    for name in configs:
        m = copy.deepcopy(base)
        if name.partition("+")[0] == "checkpoint":
            clients.enable_checkpointing(m)
        models[name] = m
    ctxs = {name: _context(name.partition("+")[0], models[name], loss_fn) for name in configs}
    for name in configs:  # warm-up: lazy state, first-call allocations, a budget's profile
        step(models[name], loss_fn, name, ctxs[name])
    times = {name: [] for name in configs}
    order = list(configs)
    rng = random.Random(0)
    for _ in range(rounds):
        rng.shuffle(order)
        for name in order:
            t0 = time.perf_counter()
            step(models[name], loss_fn, name, ctxs[name])
            times[name].append(time.perf_counter() - t0)
    return times


def table(model_name: str, times: dict) -> str:
    ref = "fp32" if "fp32" in times else next(iter(times))
    lines = [f"{model_name}: step ms (median), / {ref} (medians), per-round ratio (median)",
             "| config | step ms | / fp32 | per-round |", "|---|---|---|---|"]
    base = statistics.median(times[ref])
    for name, ts in times.items():
        per_round = statistics.median(t / r for t, r in zip(ts, times[ref]))
        lines.append(f"| {name} | {statistics.median(ts) * 1e3:.0f} | "
                     f"{statistics.median(ts) / base:.3f} | {per_round:.3f} |")
    return "\n".join(lines)


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--models", nargs="+", default=list(clients.MODELS), choices=clients.MODELS)
    p.add_argument("--configs", default="fp32,8bit,2bit")
    p.add_argument("--rounds", type=int, default=7)
    p.add_argument("--threads", type=int, default=2)
    for name in clients.MODELS:
        p.add_argument(f"--{name}", default="", help=f"sizes of the {name} case, e.g. batch=8")
    args = p.parse_args(argv)
    torch.set_num_threads(args.threads)
    configs = [c.strip() for c in args.configs.split(",") if c.strip()]
    for model_name in args.models:
        spec = getattr(args, model_name)
        sizes = {k: int(v) for k, v in (kv.split("=") for kv in spec.split(",") if kv)}
        times = run(model_name, configs, args.rounds, sizes)
        print(table(model_name, times), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
