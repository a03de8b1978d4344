"""How close each policy's gradient is to the exact one on the demo's CNN, part-way through
training: the cosine of the whole gradient vector and of the worst parameter tensor. It tells
whether a policy's accuracy gap in the demo is degradation or run-to-run noise.

    python bench/gradient_cosine.py [--presets 8bit,4bit,2bit] [--warmup 20]
"""
from __future__ import annotations

import argparse
import os
import tempfile

import torch
import torch.nn.functional as F

from actcodec.apps import demo_digits
from actcodec.torch import Policy, compress_saved


def gradients(model, x, y, policy):
    model.zero_grad(set_to_none=True)
    if policy is None:
        loss = F.cross_entropy(model(x), y)
    else:
        with compress_saved(policy):
            loss = F.cross_entropy(model(x), y)
    loss.backward()
    return {n: p.grad.clone() for n, p in model.named_parameters()}


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--presets", default="8bit,4bit,2bit")
    ap.add_argument("--warmup", type=int, default=20, help="plain SGD steps before measuring")
    a = ap.parse_args(argv)
    torch.set_num_threads(os.cpu_count() or 1)
    with tempfile.TemporaryDirectory() as tmp:
        data = os.path.join(tmp, "digits.npz")
        demo_digits.split(data)
        x_train, y_train, _, _ = demo_digits.data(data, 32)
    model = demo_digits.model(16, use_checkpoint=False)
    opt = torch.optim.SGD(model.parameters(), lr=0.05, momentum=0.9)
    gen = torch.Generator().manual_seed(0)
    for _ in range(a.warmup):
        idx = torch.randint(0, len(y_train), (128,), generator=gen)
        opt.zero_grad()
        F.cross_entropy(model(x_train[idx]), y_train[idx]).backward()
        opt.step()
    x, y = x_train[:128], y_train[:128]
    state = {k: v.clone() for k, v in model.state_dict().items()}  # batch norm updates below
    exact = gradients(model, x, y, None)
    print("| preset | whole-gradient cosine | worst parameter (cosine) |\n|---|---|---|")
    for name in a.presets.split(","):
        model.load_state_dict(state)
        got = gradients(model, x, y, Policy.preset(name))
        whole = F.cosine_similarity(torch.cat([g.flatten() for g in exact.values()]),
                                    torch.cat([got[k].flatten() for k in exact]), 0).item()
        worst = min((F.cosine_similarity(exact[k].flatten(), got[k].flatten(), 0).item(), k)
                    for k in exact)
        print(f"| {name} | {whole:.6f} | {worst[1]} ({worst[0]:.5f}) |")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
