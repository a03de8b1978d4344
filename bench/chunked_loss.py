"""The chunked head and loss (act.chunked_cross_entropy) beside the unchunked loss (the full
logits, then F.cross_entropy) and Cut Cross-Entropy's `torch_compile` implementation: one
forward and backward of a language model's output projection and loss, float32 on the CPU,
each configuration in a fresh process, its peak RSS from the kernel (VmHWM, reset before
each step) and its time as a ratio to the unchunked loss measured in the same run.

    python bench/chunked_loss.py [--tokens 2048] [--vocab 32768] [--hidden 1024]
        [--chunks 128,256,512,1024] [--steps 3] [--rounds 1] [--cce-path DIR]

A step: hidden (tokens x hidden, requires grad) and weight (vocab x hidden, requires grad) to
the loss, then backward into hidden.grad and weight.grad, then both set to None. "floor": the
process's RSS before its first step (libraries, inputs, weight); "step": the highest peak RSS
of any step above that floor (what the head and loss add, the weight's gradient included);
"first" is the first step's, compilation included. Time: the median of the steps after each
process's first, all rounds pooled; "x unchunked": over the unchunked loss's median in the same
run. "loss", "gradient norms": the loss and the gradients' norms, to show every configuration
computes the same thing.

Cut Cross-Entropy (pip package cut-cross-entropy) imports triton on Linux even for its
torch_compile implementation; --cce-path DIR puts DIR on the worker's sys.path, for a copy
installed apart from the project's environment:
    pip install --no-deps --target DIR cut-cross-entropy==25.1.1 triton==3.9.0
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
MiB = 1 << 20


def worker(config: str, tokens: int, vocab: int, hidden_size: int, steps: int,
           cce_path: str | None) -> dict:
    import torch
    import torch.nn.functional as F

    from actcodec import resident
    import actcodec.torch as act

    if config == "cce":
        if cce_path:
            sys.path.insert(0, cce_path)
        try:
            from cut_cross_entropy import linear_cross_entropy
        except Exception as e:  # reported as it is: the table says why there is no row
            return {"config": config, "error": f"import cut_cross_entropy: {type(e).__name__}: {e}"}

        def loss_of(h, w, labels):
            return linear_cross_entropy(h, w, labels, impl="torch_compile")
    elif config == "unchunked":
        def loss_of(h, w, labels):
            return F.cross_entropy(h @ w.t(), labels)
    elif config.startswith("chunked:"):
        chunk = int(config.split(":")[1])

        def loss_of(h, w, labels):
            return act.chunked_cross_entropy(h, w, labels, chunk_tokens=chunk)
    else:
        raise ValueError(f"unknown configuration {config!r}")

    g = torch.Generator().manual_seed(0)
    h = torch.randn(tokens, hidden_size, generator=g).requires_grad_()
    w = (torch.randn(vocab, hidden_size, generator=g) / hidden_size ** 0.5).requires_grad_()
    labels = torch.randint(0, vocab, (tokens,), generator=g)
    floor = resident.rss()
    times, peaks = [], []
    for _ in range(steps):
        try:
            with resident.Peak() as peak:
                start = time.perf_counter()
                loss = loss_of(h, w, labels)
                loss.backward()
                times.append(time.perf_counter() - start)
        except Exception as e:
            return {"config": config, "error": f"{type(e).__name__}: {str(e).splitlines()[0]}"}
        peaks.append(peak.nbytes)
        grads = (float(h.grad.norm()), float(w.grad.norm()))
        h.grad = w.grad = None
    return {"config": config, "floor": floor, "peaks": peaks, "times": times,
            "loss": float(loss.detach()), "grad_norms": grads, "sampled": peak.sampled}



def run(config: str, args) -> dict:
    command = [sys.executable, __file__, "--worker", config, "--tokens", str(args.tokens),
               "--vocab", str(args.vocab), "--hidden", str(args.hidden),
               "--steps", str(args.steps)]
    if args.cce_path:
        command += ["--cce-path", args.cce_path]
    out = subprocess.run(command, capture_output=True, text=True)
    if out.returncode != 0:
        tail = (out.stderr.strip().splitlines() or ["(no output)"])[-1]
        return {"config": config, "error": f"worker exited {out.returncode}: {tail}"}
    return json.loads(out.stdout.strip().splitlines()[-1])


def steady_seconds(rounds: list) -> float:
    """The median of every step after each process's first, all rounds pooled."""
    return statistics.median(t for r in rounds for t in (r["times"][1:] or r["times"]))


def table(results: dict, args) -> str:
    base = steady_seconds(results["unchunked"])
    base_loss = results["unchunked"][0]["loss"]
    lines = [f"{args.tokens} tokens, vocabulary {args.vocab}, hidden {args.hidden}, float32, "
             f"{args.rounds} round(s) of {args.steps} steps per configuration",
             "",
             "| configuration | floor MiB | step MiB | first step MiB | step ms | x unchunked "
             "| loss | loss - unchunked | gradient norms (hidden, weight) |",
             "|---|---:|---:|---:|---:|---:|---:|---:|---:|"]
    for config, rounds in results.items():
        if "error" in rounds[0]:
            lines.append(f"| {config} | - | - | - | - | - | - | - | {rounds[0]['error']} |")
            continue
        floor = statistics.median(r["floor"] for r in rounds)
        step = max(max(r["peaks"][1:] or r["peaks"]) - r["floor"] for r in rounds)
        first = max(r["peaks"][0] - r["floor"] for r in rounds)
        ms = steady_seconds(rounds)
        norms = rounds[0]["grad_norms"]
        lines.append(f"| {config} | {floor / MiB:.0f} | {step / MiB:.0f} | {first / MiB:.0f} "
                     f"| {ms * 1e3:.0f} | {ms / base:.2f} | {rounds[0]['loss']:.6f} "
                     f"| {rounds[0]['loss'] - base_loss:.1e} "
                     f"| {norms[0]:.6g}, {norms[1]:.6g} |")
    return "\n".join(lines)


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--tokens", type=int, default=2048)
    parser.add_argument("--vocab", type=int, default=32768)
    parser.add_argument("--hidden", type=int, default=1024)
    parser.add_argument("--chunks", default="128,256,512,1024",
                        help="chunk sizes (tokens) of the chunked loss, comma-separated")
    parser.add_argument("--steps", type=int, default=3, help="steps per process (>= 2)")
    parser.add_argument("--rounds", type=int, default=1,
                        help="fresh processes per configuration, configurations interleaved")
    parser.add_argument("--cce-path", default=None)
    parser.add_argument("--no-cce", action="store_true")
    parser.add_argument("--json", default=None, help="also write every process's numbers here")
    parser.add_argument("--worker", default=None, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.worker:
        print(json.dumps(worker(args.worker, args.tokens, args.vocab, args.hidden, args.steps,
                                args.cce_path)))
        return
    configs = ["unchunked"] + [f"chunked:{c}" for c in args.chunks.split(",") if c]
    if not args.no_cce:
        configs.append("cce")
    results = {c: [] for c in configs}
    for _ in range(args.rounds):
        for config in configs:
            results[config].append(run(config, args))
            print(f"# {config}: {json.dumps(results[config][-1])}", file=sys.stderr)
    if args.json:
        Path(args.json).write_text(json.dumps({"args": vars(args), "results": results}))
    print(table(results, args))


if __name__ == "__main__":
    main()
