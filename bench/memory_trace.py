"""Where a training step's memory goes: one model, one configuration, a fresh process. At
every block's forward entry and exit and every block's backward, it reads the process's RSS
and glibc's own statistics (mallinfo2: the heap's size, the bytes in use and free in it, the
bytes in mmapped chunks) and actcodec's store, and prints the trace and its peaks.

    python bench/memory_trace.py --model gpt2 --config 2bit [--steps 3] [--gpt2 batch=8,seq=512]

Live bytes are what the allocators hand out and have not got back (heap in use + mmapped +
the store's blocks in use); RSS above that is memory held but not used."""
from __future__ import annotations

import argparse
import contextlib
import ctypes
import ctypes.util
import json
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))


class _MallInfo2(ctypes.Structure):
    _fields_ = [(name, ctypes.c_size_t) for name in (
        "arena", "ordblks", "smblks", "hblks", "hblkhd", "usmblks", "fsmblks", "uordblks",
        "fordblks", "keepcost")]


_LIBC = ctypes.CDLL(ctypes.util.find_library("c"))
_HAS_MALLINFO2 = hasattr(_LIBC, "mallinfo2")
if _HAS_MALLINFO2:
    _LIBC.mallinfo2.restype = _MallInfo2
_PAGE = 4096


def rss() -> int:
    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * _PAGE


def peak_rss() -> int:
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith("VmHWM:"):
                return int(line.split()[1]) * 1024
    return 0


def reset_peak() -> None:
    with open("/proc/self/clear_refs", "w") as f:
        f.write("5")


def sample(label: str, store=None) -> dict:
    out = {"t": time.perf_counter(), "at": label, "rss": rss()}
    if _HAS_MALLINFO2:
        m = _LIBC.mallinfo2()
        out.update(heap=m.arena, heap_used=m.uordblks, heap_free=m.fordblks, mmapped=m.hblkhd)
    if store is not None:
        st = store.stats()
        out.update(store_mapped=st["mapped_bytes"], store_used=st["used_bytes"])
    out["live"] = out.get("heap_used", 0) + out.get("mmapped", 0) + out.get("store_used", 0)
    return out


def blocks_of(model):
    """The model's repeated blocks: transformers' GPT-2 h.*, ResNet stages' layers."""
    found = []
    for name, m in model.named_modules():
        parts = name.split(".")
        if len(parts) >= 2 and parts[-1].isdigit() and parts[-2] in ("h", "layers", "layer"):
            found.append((name, m))
    return found


def run(model_name: str, config: str, steps: int, sizes: dict) -> dict:
    import torch

    import clients

    torch.set_num_threads(2)
    model, inputs = clients.build(model_name, **sizes)
    model.train()
    opt = torch.optim.SGD(model.parameters(), lr=1e-3)
    store = None
    trace = []

    def context():
        if config in ("fp32", "checkpoint"):
            return contextlib.nullcontext()
        import actcodec.torch as act

        return act.compress_saved(act.Policy.preset(config), model=model)

    if config == "checkpoint":
        clients.enable_checkpointing(model)
    step_no = [0]

    def hook(label):
        def fn(*args):
            trace.append({"step": step_no[0], **sample(label, store)})
        return fn

    for name, m in blocks_of(model):
        m.register_forward_pre_hook(lambda mod, a, n=name: hook(f"fwd> {n}")())
        m.register_forward_hook(lambda mod, a, o, n=name: hook(f"fwd< {n}")())
        m.register_full_backward_hook(lambda mod, gi, go, n=name: hook(f"bwd {n}")())
    floor = None
    stats = []
    for s in range(steps):
        step_no[0] = s
        if s == 1:  # the floor: after one step, libraries warm
            floor = rss()
            reset_peak()
        trace.append({"step": s, **sample("start", store)})
        with context() as c:
            loss = model(**inputs).loss
        trace.append({"step": s, **sample("loss", store)})
        loss.backward()
        trace.append({"step": s, **sample("after backward", store)})
        opt.step()
        opt.zero_grad(set_to_none=True)
        if c is not None and hasattr(c, "stats"):
            stats.append({"saved_original": c.stats.original_bytes,
                          "saved_compressed": c.stats.compressed_bytes,
                          "stored_peak": getattr(c.stats, "peak_stored_bytes", None)})
        del loss, c
    later = [r for r in trace if r["step"] >= 1]
    return {"model": model_name, "config": config, "sizes": sizes, "floor_rss": floor,
            "peak_rss": peak_rss(), "peak_live": max(r["live"] for r in later),
            "peak_heap": max(r.get("heap", 0) for r in later), "stats": stats, "trace": trace}


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
    args = p.parse_args(argv)
    spec = getattr(args, args.model)
    sizes = {k: int(v) for k, v in (kv.split("=") for kv in spec.split(",") if kv)}
    r = run(args.model, args.config, args.steps, sizes)
    mib = 2**20
    last = [x for x in r["trace"] if x["step"] == args.steps - 1]
    print(f"{'at':28} {'rss':>7} {'heap':>7} {'used':>7} {'free':>7} {'mmap':>7} {'live':>7}")
    for i, x in enumerate(last):
        if i % args.every and x["at"] not in ("start", "loss", "after backward"):
            continue
        print(f"{x['at'][:28]:28} {x['rss'] / mib:7.0f} {x.get('heap', 0) / mib:7.0f} "
              f"{x.get('heap_used', 0) / mib:7.0f} {x.get('heap_free', 0) / mib:7.0f} "
              f"{x.get('mmapped', 0) / mib:7.0f} {x['live'] / mib:7.0f}")
    print(f"{r['model']} {r['config']}: floor {r['floor_rss'] / mib:.0f} MiB, peak RSS "
          f"{r['peak_rss'] / mib:.0f} MiB, peak live {r['peak_live'] / mib:.0f} MiB, peak heap "
          f"{r['peak_heap'] / mib:.0f} MiB; saved {r['stats'][-1] if r['stats'] else '-'}")
    if args.json:
        Path(args.json).write_text(json.dumps(r))
    return 0


if __name__ == "__main__":
    sys.exit(main())
