"""Gradient fidelity for the bytes: on transformers models built from a config, the cosine of
the whole gradient and of the worst parameter to the exact (plain fp32) gradient, for the
uniform presets and for a budget set at the bytes the uniform 2-bit preset holds. Each runs a
few steps on the same batch (the first profiles: the presets' guard and the budget's gains
take effect after it) and reports the last.

    python bench/budget_fidelity.py [--models gpt2 resnet vit bert] [--steps 3]
                                    [--gpt2 batch=4,seq=256] [--resnet batch=32,size=128]
"""
from __future__ import annotations

import argparse
import sys
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
import clients  # noqa: E402

import actcodec.torch as act  # noqa: E402


def gradients(model, loss_fn, ctx=None) -> dict:
    model.zero_grad(set_to_none=True)
    if ctx is None:
        loss = loss_fn(model)
    else:
        with ctx:
            loss = loss_fn(model)
    loss.backward()
    return {n: p.grad.detach().clone() for n, p in model.named_parameters() if p.grad is not None}


OUT = Path(__file__).resolve().parent.parent / "docs" / "fidelity" / "gradients.md"
NEGLIGIBLE = 1e-6  # of the whole gradient's norm: a parameter whose exact gradient is below it


def negligible(exact: dict) -> list:
    """Parameters left out of the worst-parameter cosine: an exact gradient below NEGLIGIBLE of
    the whole one's norm (zero analytically, such as attention key biases, up to rounding)."""
    total = float(torch.cat([g.reshape(-1).double() for g in exact.values()]).norm())
    return sorted(k for k, g in exact.items() if float(g.double().norm()) < NEGLIGIBLE * total)


def cosines(got: dict, exact: dict, left_out: set) -> tuple:
    """(whole-vector cosine, worst parameter's cosine, its name), the worst among the
    parameters not `left_out`."""
    def cos(a, b):
        return float(torch.nn.functional.cosine_similarity(a.reshape(-1).double(),
                                                           b.reshape(-1).double(), dim=0))
    whole = cos(torch.cat([g.reshape(-1) for g in got.values()]),
                torch.cat([exact[k].reshape(-1) for k in got]))
    per = {k: cos(got[k], exact[k]) for k in got if k not in left_out}
    worst = min(per, key=per.get)
    return whole, per[worst], worst


def run(name: str, steps: int, sizes: dict) -> list:
    torch.manual_seed(0)
    model, loss_fn = clients.build(name, **sizes)
    model.train()
    exact = gradients(model, loss_fn)
    left_out = negligible(exact)
    rows = []
    for preset in ("8bit", "4bit", "2bit"):
        ctx = act.compress_saved(act.Policy.preset(preset), model=model)
        for _ in range(steps):  # the first profiles for the guard, later ones have it
            got = gradients(model, loss_fn, ctx)
        guarded = len(ctx.guard.lossless) if ctx.guard is not None else 0
        rows.append((preset, ctx.stats.peak_stored_bytes, *cosines(got, exact, set(left_out)),
                     f"guard: {guarded} lossless" if guarded else ""))
    two_bit = rows[-1][1]
    for label, budget in (("budget = 2bit's bytes", two_bit), ("budget = 2x that", 2 * two_bit)):
        ctx = act.compress_saved(model=model, budget=budget)
        for _ in range(steps):
            got = gradients(model, loss_fn, ctx)
        st = ctx.stats
        rows.append((label, st.peak_stored_bytes, *cosines(got, exact, set(left_out)),
                     f"re-encoded {st.reencoded}, paged out {st.spilled}"))
    return rows, left_out


def markdown(name: str, rows: list, left_out: list) -> str:
    lines = [f"{name}: gradient cosine to the exact one (worst parameter: "
             f"{len(left_out)} left out, exact gradient under {NEGLIGIBLE:g} of the whole: "
             f"{', '.join(left_out) or 'none'})",
             "| run | held MiB | whole | worst parameter | which | last step |",
             "|---|---|---|---|---|---|"]
    for label, held, whole, worst, which, note in rows:
        lines.append(f"| {label} | {held / 2**20:.2f} | {whole:.4f} | {worst:.4f} | {which} | "
                     f"{note} |")
    return "\n".join(lines)


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--models", nargs="+", default=list(clients.MODELS))
    p.add_argument("--steps", type=int, default=3)
    p.add_argument("--no-write", action="store_true", help=f"print only, not to {OUT.name}")
    for name in clients.MODELS:
        p.add_argument(f"--{name}", default="")
    args = p.parse_args(argv)
    torch.set_num_threads(2)
    parts = []
    for name in args.models:
        spec = getattr(args, name)
        sizes = {k: int(v) for k, v in (kv.split("=") for kv in spec.split(",") if kv)}
        parts.append(markdown(name, *run(name, args.steps, sizes)))
        print(parts[-1] + "\n", flush=True)
    if not args.no_write:
        OUT.parent.mkdir(parents=True, exist_ok=True)
        OUT.write_text("# Gradient cosines on transformers clients, and the budget at 2-bit's "
                       "bytes\n\n`python bench/budget_fidelity.py` (" + __doc__.split("\n\n")[0]
                       .replace("\n", " ") + ")\n\n" + "\n\n".join(parts) + "\n")
        print(f"wrote {OUT}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
