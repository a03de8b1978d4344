"""``python -m actcodec demo``'s second case: one long sample per step (batch 1, how language
models are fine-tuned on small machines). A transformers Llama layout (random init, built
from a config, a 32k vocabulary) learns Python's own help text, each step the next window
of `tokens` bytes, at a series of limits, each in a fresh process:

- ``fp32``: plain PyTorch; ``checkpoint``: transformers' own checkpointing of every block;
- ``limit=...``: `act.Step` at half of plain's peak above the floor (the process before its
  first step, plus AdamW's state) and at the smallest limit that run names.

Where one sample is the batch, micro-batches cannot help: Step plans along the sequence (the
head and the loss in chunks of tokens, recomputed blocks). Each configuration reports every
step's peak RSS (read by a sampler thread every 5 ms and from the kernel's high-water mark
at the step's end, the first step's probes included) and the median step time. Skipped,
with a message, where transformers is not installed.
"""
from __future__ import annotations

import time

from . import limits_process

MiB = 2**20
FULL = {"tokens": 1024, "width": 256, "layers": 4, "vocab": 32000, "steps": 6}
# quick: the smallest where the head and the loss leave Step room to plan beside its margins
QUICK = {"tokens": 1024, "width": 64, "layers": 2, "vocab": 16384, "steps": 2}
# The smallest limit tried: what the 1/2 run named, plus room for the next process's floor
ABOVE_NAMED, ABOVE_NAMED_BYTES = 1.02, 16 * MiB


def available() -> bool:
    try:
        import transformers  # noqa: F401
    except ImportError:
        return False
    return True


def model(s: dict):
    import torch
    import transformers as tf

    tf.logging.set_verbosity_error()
    torch.manual_seed(0)
    d = s["width"]
    return tf.LlamaForCausalLM(tf.LlamaConfig(
        hidden_size=d, intermediate_size=int(d * 8 / 3) // 16 * 16,
        num_hidden_layers=s["layers"], num_attention_heads=4, num_key_value_heads=4,
        max_position_embeddings=s["tokens"], vocab_size=s["vocab"], bos_token_id=0,
        eos_token_id=0))


def run(config: str, s: dict) -> dict:
    """One configuration in this process."""
    import torch
    from pydoc_data import topics

    import actcodec.torch as act
    from .process_memory import Sampler, peak_rss, reset_peak, rss

    torch.set_num_threads(s["threads"])
    text = "\n\n".join(topics.topics[k] for k in sorted(topics.topics)).encode("utf-8")
    ids = torch.frombuffer(bytearray(text), dtype=torch.uint8).long()
    m = model(s)
    m.train()
    if config == "checkpoint":  # transformers' own switch, non-reentrant
        kwargs = {"use_reentrant": False}
        if hasattr(m, "activation_checkpointing_enable"):
            m.activation_checkpointing_enable(activation_checkpointing_kwargs=kwargs)
        else:
            m.gradient_checkpointing_enable(gradient_checkpointing_kwargs=kwargs)
    opt = torch.optim.AdamW(m.parameters(), lr=1e-3)
    floor = rss() + sum(2 * p.numel() * p.element_size() for p in m.parameters())
    limit = config[len("limit="):] if config.startswith("limit=") else None
    step = act.Step(m, limit=limit, optimizer=opt, exact=True) if limit else None
    # RSS alone (what the limit is on) every 5 ms, and the kernel's high-water mark at each
    # step's end: a thread reading /proc every millisecond takes the interpreter's lock
    # often enough to slow a step of many small Python calls (Step's hooks) twofold
    sampler = Sampler(period=0.005, live=False)
    sampler.start()
    sampler.on = True
    peaks, times, losses = [], [], []
    n = s["tokens"]
    for i in range(s["steps"]):
        window = ids[i * n:(i + 1) * n][None]
        batch = {"input_ids": window, "labels": window}
        t0 = time.perf_counter()
        sampler.take_rss()
        reset_peak()
        if step is None:
            loss = m(**batch).loss
            loss.backward()
        else:
            try:
                loss = step(batch)
            except act.MemoryLimitError as exc:
                sampler.stop.set()
                return {"config": config, "limit": step.limit, "error": str(exc),
                        "needed": exc.needed, "step_peaks": peaks, "floor": floor}
        opt.step()
        opt.zero_grad(set_to_none=True)
        times.append(time.perf_counter() - t0)
        peaks.append(max(sampler.take_rss(), peak_rss()))
        losses.append(float(loss.detach()))
        print(f"    long {config} step {i + 1}/{s['steps']}: loss {losses[-1]:.3f}, peak "
              f"{peaks[-1] / MiB:.0f} MiB, {times[-1]:.1f} s", flush=True)
    sampler.stop.set()
    return {**limits_process.summary(config, step, peaks, times, losses), "floor": floor,
            "times": times}


def _worker(config: str, s: dict, tmp: str) -> dict:
    return limits_process.run(f"long:{config}", s, tmp)


def parent(s: dict, tmp: str) -> list:
    """The case's runs, in order (empty where transformers is not installed)."""
    if not available():
        print("  one long sample: skipped (pip install transformers to run it)", flush=True)
        return []
    print(f"one long sample per step: a Llama layout ({s['layers']} x {s['width']}, vocabulary "
          f"{s['vocab']}), batch 1 x {s['tokens']} bytes of the same text", flush=True)

    def show(r):
        if "error" in r:
            print(f"  long {r['config']}: refused: {r['error']}", flush=True)
        else:
            print(f"  long {r['config']}: peak {r['peak'] / MiB:.0f} MiB, {r['step_s']:.2f} "
                  f"s/step" + (f"; {r['plan']}" if r["plan"] else ""), flush=True)
        return r

    plain = show(_worker("fp32", s, tmp))
    results = [plain, show(_worker("checkpoint", s, tmp))]
    half = int(plain["floor"] + (plain["peak"] - plain["floor"]) / 2)
    r = show(_worker(f"limit={half // MiB}MiB", s, tmp))
    results.append(r)
    named = r.get("smallest") or r.get("needed")
    refused = None  # the last try a fresh first step refused, not yet in the table
    for _ in range(2):  # where a fresh first step refuses what the 1/2 run named: once more
        least = int(named * ABOVE_NAMED) + ABOVE_NAMED_BYTES if named else half
        if least >= half:
            break
        r = show(_worker(f"limit={least // MiB}MiB", s, tmp))
        if "error" not in r:
            if refused is not None:  # the table shows the limit that ran, the try in it
                r["searched"], refused = limits_process.searched(refused), None
            results.append(r)
            break
        if refused is not None:
            results.append(refused)
        refused, named = r, r.get("needed")
    if refused is not None:
        results.append(refused)
    return results


def format_table(results: list) -> str:
    plain = results[0]
    lines = ["| config | every step's peak RSS MiB | within | step s | vs fp32 | plan |",
             "|---|---|---|---|---|---|"]
    for r in results:
        name = r["config"] if r.get("limit") is None else f"limit {r['limit'] / MiB:.0f} MiB"
        if "error" in r:
            lines.append(f"| {name} | refused: {r['error']} | | | | |")
            continue
        within = "-" if r["within"] is None else ("yes" if r["within"] else "NO")
        lines.append(f"| {name} | {', '.join(str(p // MiB) for p in r['step_peaks'])} | "
                     f"{within} | {r['step_s']:.2f} | {r['step_s'] / plain['step_s']:.2f}x | "
                     f"{r['plan'] or '-'}"
                     f"{' (' + r['searched'] + ')' if r.get('searched') else ''} |")
    return "\n".join(lines)
