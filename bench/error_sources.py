"""Where a preset's gradient error comes from, per op kind: a byte-level transformers GPT-2
(from a config, random init) trained a few steps in fp32 on Python's help text, then for a few
fixed batches the exact gradient against the gradient with only one op kind compressed (every
other kind kept as it is; "input", which the policy keeps lossless, forced to the preset's
bits), and with all of them as the preset stores them.

    python bench/error_sources.py [--preset 8bit] [--warm 60] [--batches 8]

Per kind: the error's norm relative to the exact gradient's, per batch (mean) and summed over
the batches; "systematic": the summed error's norm over the root of the summed squared norms
(1 where the batches' errors are independent, sqrt(batches) where they are the same); "along
g": the summed error's component along the summed gradient (negative: it shortens the step).
Then the parameters with the largest relative error under the whole preset.
"""
from __future__ import annotations

import argparse
import math
import sys
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
import clients  # noqa: E402

import actcodec.torch as act  # noqa: E402
from actcodec.torch.save.policy import OP_KINDS  # noqa: E402

BATCH = 16


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--preset", default="8bit")
    p.add_argument("--warm", type=int, default=60, help="fp32 steps before measuring")
    p.add_argument("--batches", type=int, default=8)
    args = p.parse_args()
    torch.set_num_threads(2)
    x_train, y_train, _, _ = clients.help_text()
    model, loss = clients.byte_gpt2()
    gen = torch.Generator().manual_seed(1)

    def batch():
        i = torch.randint(0, x_train.shape[0], (BATCH,), generator=gen)
        return x_train[i], y_train[i]

    opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
    for _ in range(args.warm):
        loss(*batch()).backward()
        opt.step()
        opt.zero_grad()
    batches = [batch() for _ in range(args.batches)]
    params = list(model.parameters())

    def gradients(ctx=None) -> list:
        out = []
        for x, y in batches:
            if ctx is None:
                loss(x, y).backward()
            else:
                with ctx:
                    value = loss(x, y)
                value.backward()
            out.append(torch.cat([q.grad.flatten() for q in params]).double())
            model.zero_grad()
        return out

    exact = gradients()
    total = sum(exact)

    def report(name, got):
        errors = [a - b for a, b in zip(got, exact)]
        summed = sum(errors)
        per = sum(float(e.norm() / g.norm()) for e, g in zip(errors, exact)) / len(errors)
        spread = math.sqrt(sum(float(e.norm() ** 2) for e in errors))
        systematic = float(summed.norm()) / spread if spread else float("nan")
        along = float(summed @ total / (total @ total))
        print(f"| {name} | {per:.5f} | {float(summed.norm() / total.norm()):.5f} | "
              f"{systematic:.2f} | {along:+.5f} |", flush=True)
        return summed

    print(f"{args.preset}, transformers GPT-2 4 x 256 after {args.warm} fp32 steps, "
          f"{args.batches} batches of {BATCH} x {clients.TEXT_CONTEXT} bytes\n")
    print("| compressed | error per batch | error summed | systematic | along g |")
    print("|---|---|---|---|---|")
    summed = report("all kinds", gradients(act.compress_saved(act.Policy.preset(args.preset),
                                                              model=model)))
    bits = act.Policy.preset(args.preset).bits
    for kind in OP_KINDS:
        only = {k: None for k in OP_KINDS if k != kind}
        if kind == "input":  # stored lossless by default (Policy.exact): at the preset's bits
            only["input"] = {"bits": bits}
        ctx = act.compress_saved(act.Policy.preset(args.preset, overrides=only), model=model)
        got = gradients(ctx)
        if ctx.stats.tensors:
            report(f"{kind} only", got)
    print("\nlargest relative error per parameter (all kinds, summed over the batches):")
    offset, rows = 0, []
    for name, q in model.named_parameters():
        e, g = summed[offset:offset + q.numel()], total[offset:offset + q.numel()]
        rows.append((float(e.norm() / max(float(g.norm()), 1e-30)), name))
        offset += q.numel()
    for rel, name in sorted(rows, reverse=True)[:6]:
        print(f"  {name}: {rel:.4f}")


if __name__ == "__main__":
    main()
