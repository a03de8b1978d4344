"""Where a training step's memory goes: RSS held after the forward pass (the saved
activations), the forward peak and the backward peak, each above the step's starting RSS, for
the demo's CNN under each configuration, every configuration in a fresh process.

    python bench/memory_phases.py [--configs fp32,lossless,8bit,2bit] [--malloc release|default]

The demo's table reports one peak per configuration; this splits it, to show what the saved
bytes explain and what they do not (docs/MEMORY.md).
"""
from __future__ import annotations

import argparse
import gc
import json
import os
import subprocess
import sys
import tempfile

MiB = 2**20


def measure(config: str, data: str, steps: int = 4) -> dict:
    import torch
    import torch.nn.functional as F

    from actcodec import demo
    from actcodec.torch import Policy, compress_saved

    torch.set_num_threads(os.cpu_count() or 1)
    x_train, y_train, _, _ = demo._data(data, 32)
    model = demo._model(16, use_checkpoint=False)
    opt = torch.optim.SGD(model.parameters(), lr=0.01, momentum=0.9)
    policy = None if config == "fp32" else Policy.preset(config)
    xb, yb = x_train[:128], y_train[:128]
    rows = []
    for _ in range(steps):  # the last step is reported: the first ones load lazy state
        ctx = compress_saved(policy) if policy is not None else None
        start = demo._rss()
        demo._reset_peak()
        if ctx is None:
            loss = F.cross_entropy(model(xb), yb)
        else:
            with ctx:
                loss = F.cross_entropy(model(xb), yb)
        held, fwd_peak = demo._rss(), demo._maxrss()
        demo._reset_peak()
        opt.zero_grad(set_to_none=True)
        loss.backward()
        bwd_peak = demo._maxrss()
        opt.step()
        saved = ctx.stats.compressed_bytes if ctx is not None else None
        del loss, ctx
        gc.collect()
        rows.append({"held_after_forward": held - start, "forward_peak": fwd_peak - start,
                     "backward_peak": bwd_peak - start, "compressed_bytes": saved})
    return {"config": config, **rows[-1]}


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--configs", default="fp32,lossless,8bit,4bit,2bit")
    ap.add_argument("--malloc", choices=("release", "default"), default="release")
    ap.add_argument("--worker", help=argparse.SUPPRESS)
    ap.add_argument("--data", help=argparse.SUPPRESS)
    a = ap.parse_args(argv)
    if a.worker:
        print(json.dumps(measure(a.worker, a.data)))
        return 0
    from actcodec import demo

    env = dict(os.environ)
    if a.malloc == "release":
        env.setdefault("MALLOC_MMAP_THRESHOLD_", "131072")
    print("| config | held after forward MiB | forward peak MiB | backward peak MiB | "
          "compressed MiB |\n|---|---|---|---|---|")
    with tempfile.TemporaryDirectory() as tmp:
        data = os.path.join(tmp, "digits.npz")
        demo._split_digits(data)
        for config in a.configs.split(","):
            out = subprocess.run([sys.executable, __file__, "--worker", config, "--data", data],
                                 env=env, check=True, capture_output=True, text=True).stdout
            r = json.loads(out.strip().splitlines()[-1])
            comp = "-" if r["compressed_bytes"] is None else f"{r['compressed_bytes'] / MiB:.1f}"
            print(f"| {config} | {r['held_after_forward'] / MiB:.0f} | "
                  f"{r['forward_peak'] / MiB:.0f} | {r['backward_peak'] / MiB:.0f} | {comp} |")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
