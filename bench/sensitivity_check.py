"""The importance estimate against the gradient error it predicts: on transformers models
built from a config, a budget context's profile step measures each save's gain
(actcodec.torch.budget.sensitivity); then each save alone is stored at 2 bits (every other lossless)
and the sum over parameters of each one's relative gradient error energy is measured, against
the gain times the noise model's relative noise at 2 bits. Writes docs/fidelity/sensitivity.md
with, per model, the log-correlation and the median ratio of measured to predicted, and the
saves furthest off.

    python bench/sensitivity_check.py [--models gpt2 resnet vit bert]
"""
from __future__ import annotations

import argparse
import sys
from pathlib import Path

import numpy as np
import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
import budget_fidelity as bf  # noqa: E402
import clients  # noqa: E402

import actcodec.torch as act  # noqa: E402
from actcodec.torch.budget import budget as budgets  # noqa: E402

OUT = Path(__file__).resolve().parent.parent / "docs" / "fidelity" / "sensitivity.md"
BITS = 2


def check(name: str) -> tuple[list, str]:
    torch.manual_seed(0)
    model, loss_fn = clients.build(name)
    model.train()
    exact = bf.gradients(model, loss_fn)
    counted = [k for k in exact if k not in set(bf.negligible(exact))]
    ctx = act.compress_saved(model=model, budget=1 << 40)  # plans every save, makes no room
    for _ in range(2):  # the first step profiles, the second takes the gains in
        bf.gradients(model, loss_fn, ctx)
    rows, original = [], budgets.planner.plan
    try:
        for key, site in list(ctx.limit.sites.items()):
            budgets.planner.plan = lambda sites, room, k=key: {
                s: ((BITS, 64) if s == k else None) for s in sites}
            ctx.limit.planned_for = None
            got = bf.gradients(model, loss_fn, ctx)
            measured = sum(float((got[k] - exact[k]).double().square().sum()
                                 / exact[k].double().square().sum()) for k in counted)
            rows.append((key, measured, site.error((BITS, 64))))
    finally:
        budgets.planner.plan = original
    m = np.array([r[1] for r in rows])
    p = np.array([r[2] for r in rows])
    big = m > 1e-3 * m.max()  # saves whose error is not lost in the others' rounding
    corr = float(np.corrcoef(np.log(m[big]), np.log(p[big]))[0, 1])
    ratio = float(np.median(m[big] / p[big]))
    head = (f"| {name} | {len(rows)} | {int(big.sum())} | {corr:.3f} | {ratio:.2f} |")
    off = sorted(rows, key=lambda r: -abs(np.log((r[1] + 1e-30) / (r[2] + 1e-30))))[:3]
    lines = [f"| {name} | {k[0]} | {k[1]} | {k[4]} | {mm:.3g} | {pp:.3g} |"
             for k, mm, pp in off]
    return [head], "\n".join(lines)


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--models", nargs="+", default=["gpt2", "resnet", "vit", "bert"])
    args = p.parse_args(argv)
    torch.set_num_threads(2)
    heads, offs = [], []
    for name in args.models:
        head, off = check(name)
        heads += head
        offs.append(off)
        print(head[0], flush=True)
    text = "\n".join([
        "# The importance estimate against the gradient error it predicts",
        "",
        f"`python bench/sensitivity_check.py` (each save alone at {BITS} bits, every other "
        "lossless; measured: the sum over parameters of each one's relative gradient error "
        "energy; predicted: the save's measured gain times its relative noise at that "
        "choice; saves whose measured error is under 1e-3 of the largest left out of the "
        "statistics).",
        "",
        "| model | saves | compared | log-correlation | median measured / predicted |",
        "|---|---|---|---|---|", *heads, "",
        "The saves furthest off, per model:", "",
        "| model | op | layer | which of its kind | measured | predicted |",
        "|---|---|---|---|---|---|", *offs, ""])
    OUT.parent.mkdir(parents=True, exist_ok=True)
    OUT.write_text(text)
    print(f"wrote {OUT}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
