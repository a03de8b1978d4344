"""Step time of actcodec against an earlier checkout of it, in interleaved rounds: a training
step (forward, backward, SGD) of a transformers model under the default policy and under a
budget at the bytes the 2-bit preset holds, each in a fresh process per round, old and new
alternating, one context entered every step (after a warm-up step in a context of its own,
which installs the allocator). Reports per configuration the median ms of the steady steps
(the third on), the ratio new/old, the most the first two steps (where a profile step falls:
the budget's first, the guard's second) take above the steady step, and what a long run pays:
the steady ratio plus that extra spread over PROFILE_EVERY steps.

    python bench/step_time.py OLD_ROOT [--model gpt2] [--rounds 5] [--steps 10]

OLD_ROOT: a checkout of the older version whose actcodec imports (git worktree add, with the C
extension built or copied in).
"""
from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
NEW_ROOT = HERE.parent
CONFIGS = ("default", "budget")


def worker(model_name: str, config: str, steps: int) -> dict:
    import torch

    sys.path.insert(0, str(HERE))
    import clients
    import actcodec.torch as act

    torch.set_num_threads(2)
    model, loss_fn = clients.build(model_name)
    opt = torch.optim.SGD(model.parameters(), lr=1e-4)
    with act.compress_saved(model=model):  # warm-up: installs the allocator, never profiles
        loss = loss_fn(model)
    loss.backward()
    model.zero_grad(set_to_none=True)
    if config == "budget":
        probe = act.compress_saved(act.Policy.preset("2bit"), model=model)
        with probe:
            loss = loss_fn(model)
        loss.backward()
        model.zero_grad(set_to_none=True)
        ctx = act.compress_saved(model=model, budget=probe.stats.peak_stored_bytes)
    else:
        ctx = act.compress_saved(model=model)
    times = []
    for _ in range(steps + 2):
        t0 = time.perf_counter()
        with ctx:
            loss = loss_fn(model)
        loss.backward()
        opt.step()
        opt.zero_grad(set_to_none=True)
        times.append(time.perf_counter() - t0)
    steady = statistics.median(times[2:])
    return {"extra": max(times[:2]) - steady, "steady": steady}


def run(root: Path, model_name: str, config: str, steps: int) -> dict:
    code = (f"import sys, json; sys.path.insert(0, {str(root)!r}); "
            f"sys.path.insert(1, {str(HERE)!r}); import step_time; "
            f"print(json.dumps(step_time.worker({model_name!r}, {config!r}, {steps})))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                         check=True, cwd=str(root))
    return json.loads(out.stdout.strip().splitlines()[-1])


def _profile_every(root: Path) -> int:
    sys.path.insert(0, str(root))
    from actcodec.torch.budget import sensitivity

    return sensitivity.PROFILE_EVERY


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("old", type=Path)
    p.add_argument("--model", default="gpt2")
    p.add_argument("--rounds", type=int, default=5)
    p.add_argument("--steps", type=int, default=10)
    args = p.parse_args(argv)
    got = {(v, c): [] for v in ("old", "new") for c in CONFIGS}
    for r in range(args.rounds):
        for c in CONFIGS:
            order = ("old", "new") if r % 2 == 0 else ("new", "old")
            for v in order:
                root = args.old.resolve() if v == "old" else NEW_ROOT
                got[(v, c)].append(run(root, args.model, c, args.steps))
                print(f"round {r} {c} {v}: {got[(v, c)][-1]}", file=sys.stderr, flush=True)
    every = _profile_every(NEW_ROOT)
    print(f"| {args.model}, {args.rounds} rounds | old ms/step | new ms/step | new/old | "
          f"first two steps' extra, old ms | new ms | long run new/old |")
    print("|---|---|---|---|---|---|---|")
    for c in CONFIGS:
        med = {v: {k: statistics.median(x[k] for x in got[(v, c)]) * 1e3
                   for k in ("steady", "extra")} for v in ("old", "new")}
        ratio = med["new"]["steady"] / med["old"]["steady"]
        extra = max(0.0, med["new"]["extra"] - med["old"]["extra"])
        print(f"| {c} | {med['old']['steady']:.0f} | {med['new']['steady']:.0f} | {ratio:.3f} | "
              f"{med['old']['extra']:.0f} | {med['new']['extra']:.0f} | "
              f"{ratio + extra / every / med['old']['steady']:.3f} |")
    print(f"\n(long run: the steady ratio plus the new first steps' extra over the old's, spread "
          f"over {every} steps, the profile period)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
