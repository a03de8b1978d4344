"""One long sample per step (batch 1, how language models are fine-tuned on small machines),
measured from outside: plain PyTorch, torch checkpointing and `act.Step` at limits down to
the smallest it accepts.

    python bench/long_sequence.py [--quick] [--models llama gpt2] [--lengths 1024 2048]
                                  [--steps 5] [--out docs/limits]

Models: transformers' LlamaForCausalLM (untied head) and GPT2LMHeadModel (tied embeddings),
built from a config (random init, dropout off), 4 layers of width 256 and a vocabulary of
32000, where the head and the loss hold most of a long sample's memory; and the Llama with
LoRA adapters (peft, rank 16 on every linear layer of its blocks; only they train). The text is real:
Python's help topics (the standard library's pydoc_data) as bytes, each step the next
window of `length` of them, labels the inputs (the model shifts them); AdamW.

Configurations, each in a fresh process (bench/loop.py's worker harness: VmRSS read every
millisecond from outside, per loop step, the first step's probes included; `step.stats` is
not read):
  plain       model(**batch).loss, backward, AdamW;
  checkpoint  transformers' own non-reentrant checkpointing of every block;
  limit 1/2   act.Step(model, limit=L, optimizer=opt, exact=True), L = floor + (plain's peak
              - floor) / 2, floor: plain's RSS before its first step plus AdamW's state;
  smallest    Step at the smallest limit it accepted for every step in a bisection (SEARCH
              runs, each fresh) between the floor and the 1/2 limit.
Every step's peak against the limit; step time as the median of the steps after the first,
over plain's; the first step's time (probes included) over plain's median; and, for the
smallest limit, the peak it measured above the floor over the limit's room above it (the
model is not too cautious where this is near 1) and the first step's gradient there against
plain PyTorch's (cosine of the whole vector and of the worst parameter, in another fresh
process).

Output: a markdown table (printed, and written to OUT/long_sequence.md, default docs/limits)
and the raw numbers beside it (OUT/long_sequence.json); --quick writes nothing unless --out
is given."""
from __future__ import annotations

import argparse
import json
import mmap
import os
import statistics
import struct
import sys
import time
import traceback
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))
import loop  # noqa: E402  (the worker harness: fresh processes, VmRSS sampled from outside)

MiB = 1 << 20
VOCAB = 32000
SIZES = {"full": {"layers": 4, "width": 256, "heads": 4, "lengths": (1024, 2048), "steps": 5},
         "quick": {"layers": 2, "width": 128, "heads": 4, "lengths": (1024,), "steps": 3}}
SEARCH = 5  # runs that look for the smallest limit Step accepts (a bisection)
NAMES = {"llama": "Llama layout (untied head)", "gpt2": "GPT-2 layout (tied embeddings)",
         "llama_lora": "Llama layout, LoRA r=16 on every linear layer (peft)"}
LORA_TARGETS = ["q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"]


def text_bytes() -> bytes:
    """Python's help topics, concatenated: real text, the same on every machine."""
    from pydoc_data import topics
    return "\n\n".join(topics.topics[k] for k in sorted(topics.topics)).encode("utf-8")


def build_model(name: str, size: dict, length: int, seed: int = 0):
    import torch
    import transformers as tf

    tf.logging.set_verbosity_error()
    torch.manual_seed(seed)
    d, layers, heads = size["width"], size["layers"], size["heads"]
    if name == "gpt2":
        return tf.GPT2LMHeadModel(tf.GPT2Config(
            n_layer=layers, n_embd=d, n_head=heads, n_positions=length, vocab_size=VOCAB,
            resid_pdrop=0.0, embd_pdrop=0.0, attn_pdrop=0.0, bos_token_id=0, eos_token_id=0))
    if name in ("llama", "llama_lora"):
        model = tf.LlamaForCausalLM(tf.LlamaConfig(
            hidden_size=d, intermediate_size=int(d * 8 / 3) // 16 * 16, num_hidden_layers=layers,
            num_attention_heads=heads, num_key_value_heads=heads,
            max_position_embeddings=length, vocab_size=VOCAB, bos_token_id=0, eos_token_id=0))
        if name == "llama":
            return model
        import peft  # adapters on a frozen model: how small machines fine-tune
        return peft.get_peft_model(model, peft.LoraConfig(
            r=16, lora_alpha=32, lora_dropout=0.0, target_modules=LORA_TARGETS,
            task_type="CAUSAL_LM"))
    raise SystemExit(f"unknown model {name!r}; choose from {', '.join(NAMES)}")


def worker(name: str, config: str, limit, size: dict, length: int, steps: int, threads: int,
           marker_path: str) -> dict:
    """One configuration's loop, marking the step it is in for the parent's sampler."""
    import torch

    fd = os.open(marker_path, os.O_RDWR)
    marker = mmap.mmap(fd, 8)
    os.close(fd)
    torch.set_num_threads(threads)
    text = torch.frombuffer(bytearray(text_bytes()), dtype=torch.uint8).long()
    model = build_model(name, size, length)
    model.train()
    trained = [p for p in model.parameters() if p.requires_grad]
    opt = torch.optim.AdamW(trained, lr=1e-4)
    step = None
    if config == "checkpoint":
        loop.enable_checkpointing(model)
    refusal = ()
    if config == "step":
        import actcodec.torch as act
        step = act.Step(model, limit=limit, optimizer=opt, exact=True)
        refusal = act.MemoryLimitError
    out = {"floor_rss": loop._status_kib("VmRSS") * 1024,
           "state_bytes": sum(2 * p.numel() * p.element_size() for p in trained),
           "times": [], "plans": [], "error": None, "refused": None}
    try:
        for i in range(steps):
            struct.pack_into("q", marker, 0, i)
            ids = text[i * length:(i + 1) * length][None]
            batch = {"input_ids": ids, "labels": ids}
            t0 = time.perf_counter()
            if step is not None:
                try:
                    step(batch)
                except refusal as exc:  # the limit is below what this step needs
                    out["refused"] = {"step": i, "needed": exc.needed}
                    break
            else:
                model(**batch).loss.backward()
            opt.step()
            opt.zero_grad(set_to_none=True)
            out["times"].append(time.perf_counter() - t0)
            if step is not None:
                plan = step.plan
                chunks = f", MLPs in {plan.chunks} chunks" if plan.chunks > 1 else ""
                out["plans"].append(f"{len(plan.recompute)}/{len(step.blocks)} recomputed"
                                    f"{chunks}, {plan.storage}")
    except Exception as exc:  # recorded as it is: the benchmark reports, it does not fix
        out["error"] = "".join(traceback.format_exception(exc))
    struct.pack_into("q", marker, 0, loop.DONE)
    return out


def cosine_worker(name: str, limit: int, size: dict, length: int, threads: int) -> float:
    """The first window's gradient under `act.Step` at `limit` against plain PyTorch's, as
    the cosine of the whole gradient vector and the worst parameter's (printed as JSON). Step
    runs first, in a process as fresh as the benchmark's, so the limit means the same."""
    import torch

    import actcodec.torch as act

    torch.set_num_threads(threads)
    text = torch.frombuffer(bytearray(text_bytes()), dtype=torch.uint8).long()
    model = build_model(name, size, length).train()
    ids = text[:length][None]
    batch = {"input_ids": ids, "labels": ids}
    try:
        with act.Step(model, limit=limit, exact=True) as step:
            step(batch)
    except act.MemoryLimitError as exc:  # this process's floor is not the benchmark's: the
        with act.Step(model, limit=exc.needed, exact=True) as step:  # smallest limit here
            step(batch)
    got = {n: p.grad.double() for n, p in model.named_parameters() if p.grad is not None}
    model.zero_grad(set_to_none=True)
    model(input_ids=ids, labels=ids).loss.backward()

    def cos(a, b):
        return float(a.flatten() @ b.flatten() / (a.norm() * b.norm()))
    exact = {n: p.grad.double() for n, p in model.named_parameters() if p.grad is not None}
    whole = cos(torch.cat([g.flatten() for g in got.values()]),
                torch.cat([exact[n].flatten() for n in got]))
    total = float(torch.cat([g.flatten() for g in exact.values()]).norm())
    worst = min(cos(got[n], exact[n]) for n in got if float(exact[n].norm()) > 1e-6 * total)
    print(json.dumps({"whole": whole, "worst": worst}))


def cosine(name: str, limit: int, size: dict, length: int, threads: int) -> dict:
    import subprocess
    call = (f"import long_sequence; long_sequence.cosine_worker({name!r}, {limit}, {size!r}, "
            f"{length}, {threads})")
    r = subprocess.run([sys.executable, "-c", call], cwd=HERE, capture_output=True, text=True)
    if r.returncode != 0:
        return {"error": r.stderr[-1500:]}
    return json.loads(r.stdout.strip().splitlines()[-1])


def run(name, config, limit, size, length, steps, threads, timeout=900) -> dict:
    call = (f"long_sequence.worker({name!r}, {config!r}, {limit!r}, {size!r}, {length}, "
            f"{steps}, {threads}, {{marker}})")
    r = loop.run_config(name, config, limit, size, steps, threads, timeout, call=call)
    if r.get("error"):
        print(f"  {config}: error\n{r['error'][-1500:]}", file=sys.stderr)
    return r


def summarize(r: dict, floor: int, plain_median: float | None) -> dict:
    times = r.get("times", [])
    median = statistics.median(times[1:]) if len(times) > 1 else None
    peaks = r.get("step_peaks", [])
    limit = r.get("limit")
    return {"limit_mib": None if limit is None else limit / MiB,
            "peaks_mib": [p / MiB for p in peaks],
            "peak_mib": max(peaks, default=0) / MiB,
            "over": None if limit is None else sum(p > limit for p in peaks),
            "time_x": None if not (median and plain_median) else median / plain_median,
            "first_x": None if not (times and plain_median) else times[0] / plain_median,
            "plans": sorted(set(r.get("plans", []))), "error": r.get("error"),
            "times": times,
            "floor_mib": floor / MiB}


def run_case(name: str, length: int, size: dict, steps: int, threads: int) -> dict:
    print(f"{NAMES[name]}, 1 x {length} tokens", flush=True)
    plain = run(name, "plain", None, size, length, steps, threads)
    floor = plain["floor_rss"] + plain["state_bytes"]
    plain_peak = max(plain["step_peaks"])
    plain_median = statistics.median(plain["times"][1:])
    rows = {"plain": summarize(plain, floor, plain_median)}
    rows["checkpoint"] = summarize(run(name, "checkpoint", None, size, length, steps, threads),
                                   floor, plain_median)
    half = int(floor + (plain_peak - floor) / 2)
    rows["limit 1/2"] = summarize(run(name, "step", half, size, length, steps, threads),
                                  floor, plain_median)
    # the smallest limit accepted for every step: bisection between the floor and the 1/2
    # limit
    low, high, best, tried = int(floor), half, None, []
    if rows["limit 1/2"]["error"] is None:
        best = (half, rows["limit 1/2"])
    for _ in range(SEARCH):
        limit = (low + high) // 2
        r = run(name, "step", limit, size, length, steps, threads)
        tried.append(limit / MiB)
        if r.get("refused") is None and not r.get("error"):
            high, best = limit, (limit, summarize(r, floor, plain_median))
        else:
            low = limit
    if best is not None:
        r = best[1]
        r["room_used"] = (r["peak_mib"] - r["floor_mib"]) / (r["limit_mib"] - r["floor_mib"])
        r["tried_mib"] = tried
        r["cosine"] = cosine(name, best[0], size, length, threads)
        rows["smallest"] = r
    for config, r in rows.items():
        print(f"  {config:10} limit {r['limit_mib'] or 0:7.0f} peak {r['peak_mib']:7.0f} "
              f"over {r['over']} time {r['time_x'] or 0:.2f}x first {r['first_x'] or 0:.2f}x "
              f"{r['plans']}", flush=True)
    return {"model": name, "length": length, "floor_mib": floor / MiB, "rows": rows}


def table(cases: list) -> str:
    lines = ["| model | tokens | config | limit MiB | every step's peak MiB | over | step time "
             "| first step | plan |", "|---|---|---|---|---|---|---|---|---|"]
    for case in cases:
        for config, r in case["rows"].items():
            limit = "" if r["limit_mib"] is None else f"{r['limit_mib']:.0f}"
            peaks = " ".join(f"{p:.0f}" for p in r["peaks_mib"])
            time_x = "" if r["time_x"] is None else f"{r['time_x']:.2f}x"
            first = "" if r["first_x"] is None else f"{r['first_x']:.2f}x"
            over = "" if r["over"] is None else str(r["over"])
            if "room_used" in r:
                config += f" (uses {r['room_used']:.0%} of its room)"
            if "whole" in r.get("cosine", {}):
                config += (f"; gradient cosine {r['cosine']['whole']:.6f}, worst parameter "
                           f"{r['cosine']['worst']:.6f}")
            lines.append(f"| {NAMES[case['model']]} | 1 x {case['length']} | {config} | "
                         f"{limit} | {peaks} | {over} | {time_x} | {first} | "
                         f"{'; '.join(r['plans']) or ('error' if r['error'] else '')} |")
    return "\n".join(lines)


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--quick", action="store_true")
    ap.add_argument("--models", nargs="+", default=list(NAMES), choices=list(NAMES))
    ap.add_argument("--lengths", nargs="+", type=int)
    ap.add_argument("--steps", type=int)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--out", default=None)
    args = ap.parse_args(argv)
    size = dict(SIZES["quick" if args.quick else "full"])
    steps = args.steps or size["steps"]
    lengths = args.lengths or size["lengths"]
    cases = [run_case(m, n, size, steps, args.threads) for m in args.models for n in lengths]
    floors = ", ".join(f"{NAMES[c['model']]} 1 x {c['length']}: {c['floor_mib']:.0f} MiB"
                       for c in cases)
    text = (f"# One long sample per step\n\n`python bench/long_sequence.py"
            f"{' --quick' if args.quick else ''}` ({os.cpu_count()} cores, {args.threads} "
            f"torch threads; {steps} steps per configuration, each in a fresh process; peak "
            f"RSS read from outside every millisecond, the first step's probes included; "
            f"floors: {floors}).\n\n" + table(cases) + "\n")
    print(text)
    out = args.out or (None if args.quick else str(loop.ROOT / "docs" / "limits"))
    if out:
        os.makedirs(out, exist_ok=True)
        Path(out, "long_sequence.md").write_text(text)
        Path(out, "long_sequence.json").write_text(json.dumps(cases, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
