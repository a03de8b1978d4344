"""Where a GPU step's time goes: the host time of the codec calls (at a size where the
device's work is microseconds, and at 64M elements), and `torch.profiler` profiles of
transformers GPT-2 12 x 768 steps at batch 16 x 1024 (AdamW, dropout off): plain, act.Step
at a limit, the 8-bit preset. Per step: the wall time under the profiler, the device's busy
time (the union of its kernels), kernels, the waits for the device and copies, and the ops
by host and by device time; with --trace, one step's Chrome trace per configuration
(gzipped). What the H200 runs of docs/GPU.md read their host-bound 8-bit step and their
micro-batches' kernel time from.

    python bench/gpu_profile.py OUT.txt [--configs codecs,plain,limit,8bit]
                                [--limit MiB] [--trace DIR]

--cpu runs it on the CPU at a tiny size (a check that it runs; no device times).
"""
from __future__ import annotations

import argparse
import gzip
import os
import time
import traceback

import torch
from torch.profiler import ProfilerActivity, profile

import actcodec.torch as act
from actcodec.torch.codecs import fused

# host-side calls that wait for the device, copy, or launch
WAITS = ("cudaStreamSynchronize", "cudaDeviceSynchronize", "cudaEventSynchronize",
         "aten::_local_scalar_dense", "cudaMemcpyAsync", "aten::item", "cudaLaunchKernel",
         "cuLaunchKernel", "cuLaunchKernelEx", "aten::copy_")


class Report:
    def __init__(self, path: str):
        self.file = open(path, "w")

    def say(self, *parts):
        line = " ".join(str(p) for p in parts)
        print(line, flush=True)
        self.file.write(line + "\n")
        self.file.flush()


def sync(dev):
    if dev.type == "cuda":
        torch.cuda.synchronize()


def host_and_total_us(f, dev, n: int = 30) -> tuple:
    """Microseconds per call: the host's (calls queued back to back), and until the device
    is done."""
    f()
    sync(dev)
    t = time.perf_counter()
    for _ in range(n):
        f()
    host = time.perf_counter() - t
    sync(dev)
    total = time.perf_counter() - t
    return round(host / n * 1e6, 1), round(total / n * 1e6, 1)


def codec_calls(report, dev, sizes):
    for elements in sizes:
        x = torch.randn(elements, device=dev)
        dst = torch.empty_like(x)
        flat = x.view(torch.int32)
        p = {"bits": 8, "group_size": 256, "rounding": "nearest", "seed": 0}
        enc = fused.encode(x, "auto", bits=8)
        calls = {
            "copy": lambda: dst.copy_(x),
            "_stats": lambda: fused._stats(dev),
            "_quantize": lambda: fused._quantize(flat, "float32", p),
            "encode_unread": lambda: fused.encode_unread(x, "auto", bits=8),
            "fused.encode": lambda: fused.encode(x, "auto", bits=8),
            "act.encode": lambda: act.encode(x, bits=8),
            "decode_into": lambda: fused.decode_into(enc, dst, "float32"),
        }
        for name, f in calls.items():
            report.say(f"codec {elements} {name}: host us, total us per call",
                       host_and_total_us(f, dev))


def busy_ms(prof) -> tuple:
    """(the union of the device's kernel intervals in ms, their count)."""
    spans = sorted((e.time_range.start, e.time_range.end) for e in prof.events()
                   if e.device_type == torch.autograd.DeviceType.CUDA)
    busy, current = 0, None
    for start, end in spans:
        if current is None or start > current[1]:
            if current:
                busy += current[1] - current[0]
            current = [start, end]
        else:
            current[1] = max(current[1], end)
    if current:
        busy += current[1] - current[0]
    return busy / 1e3, len(spans)


def gpt2(dev, cpu: bool):
    import transformers as tf
    tf.logging.set_verbosity_error()
    torch.manual_seed(0)
    if cpu:
        cfg = tf.GPT2Config(n_layer=2, n_embd=64, n_head=2, vocab_size=512, resid_pdrop=0.0,
                            embd_pdrop=0.0, attn_pdrop=0.0)
        return tf.GPT2LMHeadModel(cfg).to(dev).train(), (2, 64), 512
    from gpu_step import layout  # the GPT-2 layout bench/gpu_step.py measures
    m, shape, vocab = layout("gpt2")
    return m.to(dev).train(), shape, vocab


def step_profile(report, dev, config: str, limit_mib: int, trace: str | None, cpu: bool):
    m, shape, vocab = gpt2(dev, cpu)
    ids = torch.randint(0, vocab, shape, device=dev)
    batch = {"input_ids": ids, "labels": ids}
    opt = torch.optim.AdamW(m.parameters(), lr=1e-4)
    step = None
    if config == "limit":
        step = act.Step(m, limit="free" if cpu else limit_mib << 20, optimizer=opt, exact=True)

    def one():
        if step is not None:
            step(batch)
        elif config == "8bit":
            with act.compress_saved(act.Policy.preset("8bit"), model=m):
                loss = m(**batch).loss
            loss.backward()
        else:
            m(**batch).loss.backward()
        opt.step()
        opt.zero_grad(set_to_none=True)

    activities = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if dev.type == "cuda"
                                           else [])
    for _ in range(2):  # the first plans, compiles, warms the allocator
        one()
    sync(dev)
    if trace:
        with profile(activities=activities) as traced:
            one()
            sync(dev)
        path = os.path.join(trace, f"trace_{config}.json")
        traced.export_chrome_trace(path)
        with open(path, "rb") as raw, gzip.open(path + ".gz", "wb") as packed:
            packed.write(raw.read())
        os.remove(path)
    t = time.perf_counter()
    with profile(activities=activities) as prof:
        for _ in range(2):
            one()
        sync(dev)
    wall = (time.perf_counter() - t) / 2 * 1e3
    busy, kernels = busy_ms(prof)
    report.say(f"\n## {config}: wall {wall:.1f} ms/step (profiled), device busy "
               f"{busy / 2:.1f} ms/step, {kernels // 2} kernels/step"
               + (f"; plan: {step.describe()}" if step else ""))
    averages = prof.key_averages()
    for e in averages:
        if e.key in WAITS:
            report.say(f"  {e.key}: {e.count // 2}/step, host {e.cpu_time_total / 2e3:.2f} "
                       f"ms/step")
    report.say(averages.table(sort_by="self_cpu_time_total", row_limit=22,
                              max_name_column_width=60))
    if dev.type == "cuda":
        report.say(averages.table(sort_by="self_device_time_total", row_limit=22,
                                  max_name_column_width=60))
        torch.cuda.empty_cache()


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("out")
    ap.add_argument("--configs", default="codecs,plain,limit,8bit")
    ap.add_argument("--limit", type=int, default=10499, help="Step's limit in MiB")
    ap.add_argument("--trace", default=None, help="a folder for one step's trace each")
    ap.add_argument("--cpu", action="store_true")
    args = ap.parse_args()
    if not args.cpu and not torch.cuda.is_available():
        raise SystemExit("bench/gpu_profile.py profiles a CUDA GPU; none is here (--cpu)")
    dev = torch.device("cpu" if args.cpu else "cuda")
    report = Report(args.out)
    for config in args.configs.split(","):
        try:
            if config == "codecs":
                codec_calls(report, dev, (1 << 12,) if args.cpu else (1 << 12, 64 << 20))
            else:
                step_profile(report, dev, config, args.limit, args.trace, args.cpu)
        except Exception:  # one configuration's failure leaves the others' figures
            report.say(traceback.format_exc()[-2000:])


if __name__ == "__main__":
    main()
