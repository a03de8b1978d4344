"""Training on real text, paired seeds: does a configuration train as well as fp32?

A byte-level transformers GPT-2 (4 layers of 128, context 128, from a config) learns the next
byte of Python's help text (pydoc_data, ~465 KB; every 8th topic held out), AdamW with a
warm-up and a cosine decay, batches of 16 windows. Each configuration and seed trains in a
fresh process; the seed fixes the initial weights and the batches, so every configuration of a
seed sees the same ones (paired: the difference to fp32 within a seed is what is judged, not
against fp32's spread over seeds). Configurations: fp32, the 8-bit and 2-bit presets, and a
budget at the bytes the 2-bit run of the same seed held at its peak ("budget"). The held-out
loss is in nats per byte, beside the unigram and bigram entropies of the training bytes (what
a model that learned nothing of context would reach).

    python bench/text_convergence.py [--seeds 3] [--steps 500] [--jobs 2] [--quick]
                                     [--configs fp32,8bit,2bit,budget]

Writes docs/convergence/text_paired.md and .json (--quick: 2 seeds of 60 steps, a smoke run
that resolves nothing, printed only).
"""
from __future__ import annotations

import argparse
import concurrent.futures as cf
import json
import math
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
OUT = HERE.parent / "docs" / "convergence"
CONTEXT, WIDTH, LAYERS, BATCH, LR = 128, 128, 4, 16, 2e-3
EVALS = 6  # held-out losses along the run


def _data():
    sys.path.insert(0, str(HERE))
    import clients
    return clients.help_text(CONTEXT)


def _model(seed: int):
    import torch
    import transformers as tf

    tf.logging.set_verbosity_error()
    torch.manual_seed(seed)
    return tf.GPT2LMHeadModel(tf.GPT2Config(
        n_layer=LAYERS, n_embd=WIDTH, n_head=4, n_positions=CONTEXT, vocab_size=256,
        resid_pdrop=0.0, embd_pdrop=0.0, attn_pdrop=0.0, bos_token_id=0, eos_token_id=0))


# Where a preset's error comes from: the GPT-2 layout's saves kept at 8 bits by layer name
# (its linear layers are transformers' Conv1D, its GELU elementwise ops, op kind "other").
HIGHER = {"lin8": ("*.c_attn", "*.c_fc", "*.c_proj", "lm_head"), "act8": ("*.mlp.act",),
          "attn8": ("*.attn",)}


def policy(config: str):
    """A preset by name; "PRESET@stochastic" rounds stochastically, "PRESET+lin8" (or act8,
    attn8) keeps those saves at 8 bits."""
    import actcodec.torch as act

    name, _, rounding = config.partition("@")
    base, *higher = name.split("+")
    preset = act.Policy.preset(base)
    overrides = dict(preset.overrides)
    for h in higher:
        overrides.update({pattern: {"bits": 8} for pattern in HIGHER[h]})
    return act.Policy.preset(base, overrides=overrides,
                             **({"rounding": rounding} if rounding else {}))


def worker(config: str, seed: int, steps: int, budget: int | None) -> dict:
    """One training run; its held-out losses, the saves' peak held bytes, seconds."""
    import torch

    import actcodec.torch as act

    torch.set_num_threads(1)
    x_train, y_train, x_test, y_test = _data()
    model = _model(seed).train()
    opt = torch.optim.AdamW(model.parameters(), lr=LR, weight_decay=0.01)
    warm = max(1, steps // 20)
    sched = torch.optim.lr_scheduler.LambdaLR(opt, lambda s: min(1.0, (s + 1) / warm) * (
        0.1 + 0.45 * (1 + math.cos(math.pi * min(1.0, s / steps)))))
    gen = torch.Generator().manual_seed(1000 + seed)
    if config == "fp32":
        ctx = None
    elif config == "budget":
        ctx = act.compress_saved(model=model, budget=budget)
    else:
        ctx = act.compress_saved(policy(config), model=model)

    def loss_of(x, y):
        logits = model(input_ids=x).logits
        return torch.nn.functional.cross_entropy(logits.flatten(0, 1), y.flatten())

    def held_out() -> float:
        model.eval()
        with torch.no_grad():
            total = sum(float(loss_of(x_test[j:j + 64], y_test[j:j + 64])) * len(x_test[j:j + 64])
                        for j in range(0, len(x_test), 64))
        model.train()
        return total / len(x_test)

    curve, held, t0 = [], 0, time.perf_counter()
    for step in range(steps):
        i = torch.randint(0, x_train.shape[0], (BATCH,), generator=gen)
        if ctx is None:
            loss_of(x_train[i], y_train[i]).backward()
        else:
            with ctx:
                value = loss_of(x_train[i], y_train[i])
            value.backward()
            held = max(held, ctx.stats.peak_stored_bytes)
        opt.step()
        sched.step()
        opt.zero_grad(set_to_none=True)
        if (step + 1) % max(1, steps // EVALS) == 0 or step + 1 == steps:
            curve.append((step + 1, held_out()))
    profiles = ctx.limit.schedule.profiles if ctx is not None and ctx.limit else None
    return {"config": config, "seed": seed, "test_loss": curve[-1][1], "curve": curve,
            "held_bytes": held, "budget": budget, "seconds": time.perf_counter() - t0,
            "profiles": profiles}


def _launch(config: str, seed: int, steps: int, budget: int | None) -> dict:
    call = (f"import sys; sys.path.insert(0, {str(HERE)!r}); import json, text_convergence as t;"
            f" print(json.dumps(t.worker({config!r}, {seed}, {steps}, {budget!r})))")
    r = subprocess.run([sys.executable, "-c", call], capture_output=True, text=True)
    if r.returncode != 0:
        raise SystemExit(f"{config} seed {seed} failed:\n{r.stderr[-2000:]}")
    out = json.loads(r.stdout.strip().splitlines()[-1])
    print(f"  {config:7} seed {seed}: {out['test_loss']:.4f} ({out['seconds']:.0f} s)",
          flush=True)
    return out


def entropies() -> tuple[float, float]:
    """(unigram, bigram conditional) entropy of the training bytes, nats per byte."""
    import torch

    x, y, _, _ = _data()
    uni = torch.bincount(y.flatten(), minlength=256).double()
    p = uni / uni.sum()
    h1 = float(-(p[p > 0] * p[p > 0].log()).sum())
    pairs = torch.bincount((x.flatten() * 256 + y.flatten()), minlength=65536).double()
    joint = pairs.view(256, 256)
    cond = joint / joint.sum(1, keepdim=True).clamp_min(1)
    pj = joint / joint.sum()
    mask = joint > 0
    h2 = float(-(pj[mask] * cond[mask].log()).sum())
    return h1, h2


def run(configs: list, seeds: int, steps: int, jobs: int) -> list:
    results = []
    with cf.ThreadPoolExecutor(jobs) as pool:
        pending = {pool.submit(_launch, c, s, steps, None): (c, s)
                   for s in range(seeds) for c in configs if not c.startswith("budget")}
        while pending:
            done, _ = cf.wait(pending, return_when=cf.FIRST_COMPLETED)
            for f in done:
                config, seed = pending.pop(f)
                out = f.result()
                results.append(out)
                for budgeted in (c for c in configs if c.startswith("budget")):
                    if config == "2bit":
                        pending[pool.submit(_launch, budgeted, seed, steps,
                                            out["held_bytes"])] = (budgeted, seed)
    return results


def table(results: list, configs: list, seeds: int, steps: int, h1: float, h2: float,
          seconds: float) -> str:
    by = {(r["config"], r["seed"]): r for r in results}
    fp32 = [by[("fp32", s)]["test_loss"] for s in range(seeds)]
    lines = [f"`python bench/text_convergence.py --seeds {seeds} --steps {steps}` "
             f"({seconds / 60:.0f} min on {os.cpu_count()} cores). Byte-level GPT-2 "
             f"{LAYERS} x {WIDTH}, context {CONTEXT}, batch {BATCH}, AdamW {LR:g} (warm-up, "
             f"cosine), {steps} steps; held-out help topics, nats per byte. The training "
             f"bytes' unigram entropy is {h1:.3f}, their bigram entropy {h2:.3f}.", "",
             "| config | held MiB | " + " | ".join(f"seed {s}" for s in range(seeds)) +
             " | mean | vs fp32, paired (per seed) | worst seed |",
             "|---|---|" + "---|" * seeds + "---|---|---|"]
    for c in configs:
        losses = [by[(c, s)]["test_loss"] for s in range(seeds)]
        held = max(by[(c, s)]["held_bytes"] for s in range(seeds)) / 2**20
        diffs = [(a - b) / b for a, b in zip(losses, fp32)]
        paired = "" if c == "fp32" else \
            f"{statistics.mean(diffs):+.2%} ({', '.join(f'{d:+.2%}' for d in diffs)})"
        worst = "" if c == "fp32" else f"{max(diffs):+.2%}"
        lines.append(f"| {c} | {held:.2f} | " + " | ".join(f"{v:.4f}" for v in losses) +
                     f" | {statistics.mean(losses):.4f} | {paired} | {worst} |")
    spread = max(fp32) - min(fp32)
    lines += ["", f"fp32's seed spread: {spread:.4f} ({spread / statistics.mean(fp32):.2%} of "
              f"its mean)."]
    for budgeted in (c for c in configs if c.startswith("budget") and "2bit" in configs):
        d = [(by[(budgeted, s)]["test_loss"] - by[("2bit", s)]["test_loss"])
             / by[("2bit", s)]["test_loss"] for s in range(seeds)]
        lines.append(f"{budgeted} at 2-bit's bytes against uniform 2-bit, per seed: "
                     f"{', '.join(f'{v:+.2%}' for v in d)}.")
    return "\n".join(lines) + "\n"


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--seeds", type=int, default=3)
    ap.add_argument("--steps", type=int, default=500)
    ap.add_argument("--jobs", type=int, default=2)
    ap.add_argument("--configs", default="fp32,8bit,2bit,budget")
    ap.add_argument("--quick", action="store_true")
    a = ap.parse_args(argv)
    if a.quick:
        a.seeds, a.steps = 2, 60
    configs = a.configs.split(",")
    if any(c.startswith("budget") for c in configs) and "2bit" not in configs:
        raise SystemExit("the budget is set at the 2bit run's bytes: include 2bit")
    t0 = time.perf_counter()
    results = run(configs, a.seeds, a.steps, a.jobs)
    h1, h2 = entropies()
    text = table(results, configs, a.seeds, a.steps, h1, h2, time.perf_counter() - t0)
    print(text)
    if not a.quick:
        OUT.mkdir(parents=True, exist_ok=True)
        (OUT / "text_paired.md").write_text("# Training on real text, paired seeds\n\n" + text)
        (OUT / "text_paired.json").write_text(json.dumps(results, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
