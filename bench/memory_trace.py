"""Where a training step's memory goes: one model, one configuration, a fresh process. At
every block's forward entry and exit and every block's backward, it reads the process's RSS
and glibc's own statistics (mallinfo2: the heap's size, the bytes in use and free in it, the
bytes in mmapped chunks) and actcodec's store, and prints the trace and its peaks.

    python bench/memory_trace.py --model gpt2 --config 2bit [--steps 3] [--gpt2 batch=8,seq=512]
                                 [--allocator]

--config: fp32, checkpoint, a Policy preset, budget/N (a budget of 1/N of fp32's saves), or
offload (a budget of 0).

Live bytes are RSS less what the allocators hold free (glibc's free heap chunks, the store's
unused pages: actcodec.apps.process_memory.live); a sampling thread reads them every 2 ms
besides, for the peaks between block boundaries. --allocator installs actcodec's torch
allocator (actcodec.torch.allocator) first."""
from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

from actcodec.apps import configs, process_memory  # noqa: E402
from actcodec import store as stores  # noqa: E402


def sample(label: str, ctx=None) -> dict:
    """The process's memory now; `stored`: the bytes ctx (a compress_saved context) holds for
    backward at this moment."""
    out = {"t": time.perf_counter(), "at": label, "rss": process_memory.rss(),
           "live": process_memory.live(),
           "stored": getattr(getattr(ctx, "stats", None), "stored_bytes", 0)}
    out.update(process_memory.heap() or {})
    out.update(store_mapped=store_bytes("mapped_bytes"), store_used=store_bytes("used_bytes"))
    return out


def store_bytes(key: str) -> int:
    """One of Store.stats()'s byte counts, over the process's stores."""
    return sum(x.stats()[key] for x in stores.made())


def blocks_of(model):
    """The model's blocks: transformers' GPT-2 token embedding and h.*, ResNet's stem and its
    stages' layers."""
    found = []
    for name, m in model.named_modules():
        parts = name.split(".")
        if parts[-1] in ("wte", "embedder") or (
                len(parts) >= 2 and parts[-1].isdigit() and parts[-2] in ("h", "layers", "layer")):
            found.append((name, m))
    return found


class PeakSampler(process_memory.Sampler):
    """process_memory.Sampler that also notes where the step was (the last block boundary
    passed) and what the context held for backward when each new peak was read."""

    def __init__(self, where: list, ctx: list):
        super().__init__()
        self.where, self.ctx, self.at_peak, self.store_used = where, ctx, None, 0

    def run(self):
        while not self.stop.is_set():
            if self.on:
                self.store_used = max(self.store_used, store_bytes("used_bytes"))
                now = process_memory.live()
                if now > self.peak_live:
                    stored = getattr(getattr(self.ctx[0], "stats", None), "stored_bytes", 0)
                    self.peak_live, self.at_peak = now, (self.where[0], stored,
                                                         process_memory.rss() - now)
            time.sleep(self.period)


def run(model_name: str, config: str, steps: int, sizes: dict, allocator: bool = False) -> dict:
    import torch

    import clients

    torch.set_num_threads(2)
    if allocator:
        from actcodec.torch import allocator as alloc

        alloc.install()
    model, loss_fn = clients.build(model_name, **sizes)
    model.train()
    opt = torch.optim.SGD(model.parameters(), lr=1e-3)
    trace = []

    # plain: none; a budget: one context all along; a preset: a fresh one per step
    context = configs.step_contexts(config, model, loss_fn)
    if config == "checkpoint":
        clients.enable_checkpointing(model)
    step_no, current = [0], [None]

    where = ["start"]

    def hook(label):
        def fn(*args):
            where[0] = label
            trace.append({"step": step_no[0], **sample(label, current[0])})
        return fn

    def leave(name, out):
        hook(f"fwd< {name}")()
        out = getattr(out, "last_hidden_state", out)
        out = out[0] if isinstance(out, tuple) else out
        if isinstance(out, torch.Tensor) and out.requires_grad:  # backward reaches the block
            out.register_hook(lambda g: hook(f"bwd {name}")())

    for name, m in blocks_of(model):
        m.register_forward_pre_hook(lambda mod, a, n=name: hook(f"fwd> {n}")())
        m.register_forward_hook(lambda mod, a, o, n=name: leave(n, o))
    floor = None
    stats = []
    sampler = PeakSampler(where, current)
    sampler.start()
    for s in range(steps):
        step_no[0] = s
        configs.new_plain_step(config, allocator)
        if s == 1:  # the floor: after one step, libraries warm
            floor = process_memory.rss()
            process_memory.reset_peak()
            sampler.on = True
        trace.append({"step": s, **sample("start")})
        where[0] = "start"
        with context() as c:
            current[0] = c
            loss = loss_fn(model)
        trace.append({"step": s, **sample("loss")})
        loss.backward()
        trace.append({"step": s, **sample("after backward"),
                      "store_peak": store_bytes("peak_used_bytes")})
        opt.step()
        opt.zero_grad(set_to_none=True)
        if c is not None and hasattr(c, "stats"):
            stats.append({"saved_original": c.stats.original_bytes,
                          "saved_compressed": c.stats.compressed_bytes,
                          "stored_peak": getattr(c.stats, "peak_stored_bytes", None)})
        current[0] = None
        del loss, c
    sampler.stop.set()
    sampler.join()
    later = [r for r in trace if r["step"] >= 1]
    peak_live = max([r["live"] for r in later] + [sampler.peak_live])
    if sampler.at_peak and sampler.peak_live >= max(r["live"] for r in later):
        peak_at = {"after": sampler.at_peak[0], "stored": sampler.at_peak[1], "live": peak_live,
                   "free": sampler.at_peak[2]}
    else:
        top = max(later, key=lambda r: r["live"])
        peak_at = {"after": top["at"], "stored": top["stored"], "live": top["live"],
                   "free": top["rss"] - top["live"]}
    return {"model": model_name, "config": config, "sizes": sizes, "floor_rss": floor,
            "peak_rss": process_memory.peak_rss(), "peak_live": peak_live, "peak_at": peak_at,
            "peak_heap": max(r.get("heap", 0) for r in later), "stats": stats, "trace": trace,
            "store_mapped": store_bytes("mapped_bytes"),
            "store_used_sampled": sampler.store_used}


def main(argv=None) -> int:
    import clients

    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--model", default="gpt2", choices=clients.MODELS)
    p.add_argument("--config", default="2bit")
    p.add_argument("--steps", type=int, default=3)
    for name in clients.MODELS:
        p.add_argument(f"--{name}", default="")
    p.add_argument("--json", help="write the whole trace here")
    p.add_argument("--every", type=int, default=4, help="print every Nth sample of the last step")
    p.add_argument("--allocator", action="store_true", help="install actcodec's torch allocator")
    args = p.parse_args(argv)
    spec = getattr(args, args.model)
    sizes = {k: int(v) for k, v in (kv.split("=") for kv in spec.split(",") if kv)}
    r = run(args.model, args.config, args.steps, sizes, args.allocator)
    mib = 2**20
    last = [x for x in r["trace"] if x["step"] == args.steps - 1]
    print(f"{'at':28} {'rss':>7} {'heap':>7} {'used':>7} {'free':>7} {'mmap':>7} {'store':>7} "
          f"{'in use':>7} {'live':>7}")
    for i, x in enumerate(last):
        if i % args.every and x["at"] not in ("start", "loss", "after backward"):
            continue
        print(f"{x['at'][:28]:28} {x['rss'] / mib:7.0f} {x.get('heap', 0) / mib:7.0f} "
              f"{x.get('heap_used', 0) / mib:7.0f} {x.get('heap_free', 0) / mib:7.0f} "
              f"{x.get('mmapped', 0) / mib:7.0f} {x.get('store_mapped', 0) / mib:7.0f} "
              f"{x.get('store_used', 0) / mib:7.0f} {x['live'] / mib:7.0f}")
    print(f"{r['model']} {r['config']}{' +allocator' if args.allocator else ''}: floor "
          f"{r['floor_rss'] / mib:.0f} MiB, peak RSS {r['peak_rss'] / mib:.0f} MiB, peak live {r['peak_live'] / mib:.0f} MiB, peak "
          f"heap {r['peak_heap'] / mib:.0f} MiB, stores {r['store_mapped'] / mib:.0f} MiB "
          f"mapped; saved {r['stats'][-1] if r['stats'] else '-'}")
    start, pk = last[0]["live"], r["peak_at"]
    print(f"peak live {pk['live'] / mib:.0f} MiB (after {pk['after']}) = live at the step's start "
          f"{start / mib:.0f} + held for backward then {pk['stored'] / mib:.0f} + the ops' tensors "
          f"in flight {(pk['live'] - start - pk['stored']) / mib:.0f}; the allocators held "
          f"{pk['free'] / mib:.0f} MiB free then")
    print(f"the store's exact peak in use in the last step {last[-1]['store_peak'] / mib:.0f} MiB "
          f"(the samples saw at most {r['store_used_sampled'] / mib:.0f}): a sampler can miss a "
          f"short peak, so the peak live above is a lower bound")
    if args.json:
        Path(args.json).write_text(json.dumps(r))
    return 0


if __name__ == "__main__":
    sys.exit(main())
