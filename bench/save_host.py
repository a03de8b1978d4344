"""The host's work per compressed save on a GPU, measured without one: a transformers GPT-2
step under a preset with its CPU tensors sent down the device path (actcodec.torch.codecs.
fused, as a CUDA tensor's saves go: the deferred quant pass, its statistics' window, the
decode at backward), the Triton launches replaced by stand-ins that do no work (the quant
pass's reports a dense input), against the same step without compression.

On a GPU this work is what a compressed step waits for: an H200 ran the kernels of the
GPT-2 step under `8bit` in 276 ms against plain's 257, and the step took 1.37-1.40x plain
(docs/GPU.md), about 220 saves each costing its host 0.5-1 ms. Here it is measured where
the save path is changed: microseconds of host time per save (the step's time over plain's,
over its saves) and the torch calls each save adds, counted three ways: all of them (nested
calls counted), the device allocations (`empty`, `empty_strided`), and the launches (the
other innermost calls that are not views or metadata, and the Triton launches). On a GPU a
view costs its host a few microseconds, an allocation or a launch 10-50 (a Triton launch
about 80 on that host). The stand-ins write no output, so the gradients are meaningless;
the stand-in launches are not timed as Triton's would be.

    python bench/save_host.py [--layers 4] [--steps 30] [--preset 8bit]
"""
from __future__ import annotations

import argparse
import statistics
import time
from unittest import mock

import torch
from torch.profiler import ProfilerActivity, profile

import actcodec.torch as act
from actcodec.torch.codecs import fused
from actcodec.torch.codecs import packed as packing


ALLOCATIONS = {"aten::empty", "aten::empty_strided"}
# innermost calls that make no device work: views, metadata, no-op conversions
METADATA = {"aten::view", "aten::as_strided", "aten::detach", "detach", "aten::to",
            "aten::resolve_neg", "aten::resolve_conj", "aten::_reshape_alias", "aten::alias",
            "aten::slice", "aten::select", "aten::permute", "aten::expand", "aten::t",
            "aten::transpose", "aten::unsqueeze", "aten::squeeze", "aten::_unsafe_view",
            "aten::lift_fresh", "aten::narrow", "aten::unbind", "aten::split"}


def stand_in_launch(kernel, programs, *args, **constants):
    """No work; a quant pass's statistics say: every element nonzero, not one value."""
    if getattr(kernel, "__name__", "") == "quant_encode" or "quant_encode" in repr(kernel):
        # written through numpy: no torch call of its own
        args[2].numpy()[0, :3] = (args[0].numel() + fused._ROW_START, 0, 1)


def device_decode(enc, dest, opts):
    fused.decode_into(enc, dest, enc.dtype)


def as_on_a_gpu():
    """CPU tensors take the device path, the kernels stood in for."""
    return [mock.patch.object(fused, "applies", lambda t: t.dtype in fused._TORCH),
            mock.patch.object(packing, "_host_path", lambda t: False),
            mock.patch.object(packing, "_decode_into", device_decode),
            mock.patch.object(fused, "_launch", stand_in_launch)]


def measure(layers: int = 4, steps: int = 30, preset: str = "8bit") -> dict:
    """Deferred saves a step, host microseconds and torch calls per save (see the module)."""
    import transformers as tf
    tf.logging.set_verbosity_error()
    torch.manual_seed(0)
    m = tf.GPT2LMHeadModel(tf.GPT2Config(n_layer=layers, n_embd=64, n_head=2, vocab_size=512,
                                         resid_pdrop=0.0, embd_pdrop=0.0,
                                         attn_pdrop=0.0)).train()
    ids = torch.randint(0, 512, (2, 64))
    policy = act.Policy.preset(preset)

    def plain():
        m(input_ids=ids, labels=ids).loss.backward()

    def compressed():
        with act.compress_saved(policy, model=m):
            loss = m(input_ids=ids, labels=ids).loss
        loss.backward()

    def seconds(f):
        for _ in range(3):
            f()
        runs = []
        for _ in range(5):
            t0 = time.perf_counter()
            for _ in range(steps):
                f()
            runs.append((time.perf_counter() - t0) / steps)
        return statistics.median(runs)

    def calls(f):
        """(torch calls, allocations, launches) of a step."""
        with profile(activities=[ProfilerActivity.CPU]) as prof:
            f()
        inner = [e.name for e in prof.events() if not e.cpu_children]
        return (len(prof.events()), sum(n in ALLOCATIONS for n in inner),
                sum(n not in ALLOCATIONS and n not in METADATA for n in inner))

    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    patches = as_on_a_gpu()
    for p in patches:
        p.start()
    try:
        saves, launched = [], []
        real = fused.encode_unread
        with mock.patch.object(fused, "encode_unread",
                               lambda *a, **k: saves.append(1) or real(*a, **k)), \
                mock.patch.object(fused, "_launch",
                                  lambda *a, **k: launched.append(1) or stand_in_launch(*a, **k)):
            compressed()
        t_plain, t_comp = seconds(plain), seconds(compressed)
        c_plain, c_comp = calls(plain), calls(compressed)
    finally:
        for p in reversed(patches):
            p.stop()
        torch.set_num_threads(threads)
    n = max(1, len(saves))
    return {"saves": len(saves), "host_us": (t_comp - t_plain) / n * 1e6,
            "calls": (c_comp[0] - c_plain[0]) / n, "allocations": (c_comp[1] - c_plain[1]) / n,
            "launches": (c_comp[2] - c_plain[2] + len(launched)) / n,
            "triton": len(launched) / n, "step_ms": t_comp * 1e3, "plain_ms": t_plain * 1e3,
            "step_calls": c_comp[0], "plain_calls": c_plain[0]}


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--layers", type=int, default=4)
    ap.add_argument("--steps", type=int, default=30)
    ap.add_argument("--preset", default="8bit")
    args = ap.parse_args()
    r = measure(args.layers, args.steps, args.preset)
    print(f"GPT-2 {args.layers} x 64, batch 2 x 64, preset {args.preset}: {r['saves']} "
          f"deferred saves a step")
    print(f"host us per save: {r['host_us']:.1f} (step {r['step_ms']:.2f} ms against "
          f"plain's {r['plain_ms']:.2f}: {r['step_ms'] - r['plain_ms']:.2f} ms a step more)")
    print(f"torch calls per save: {r['calls']:.1f} ({r['step_calls']} a step against "
          f"plain's {r['plain_calls']}, nested calls counted)")
    print(f"device allocations per save: {r['allocations']:.2f}; launches per save: "
          f"{r['launches']:.2f}, {r['triton']:.2f} of them Triton's")


if __name__ == "__main__":
    main()
