"""act.Step on a CUDA GPU: a limit on the device's reserved memory, beside plain training, torch
checkpointing and offloading every save to pinned host memory (act.offload_saved), on the
transformers GPT-2 and Llama layouts of bench/gpu.py (random init, dropout off, AdamW).
Each configuration builds its model afresh in this process (the cache emptied and the
counters reset between them) and runs `--steps` steps of the same batch; per step: the peak
reserved memory, the step's time (optimizer step included), and for the first step the
cosine of its gradient to plain's. Step runs exact, at half and a third of plain's peak
reserved memory and at the smallest limit the third's run names; and pinned to checkpointing's
plan (every block recomputed, one micro-batch), with its chunked loss and with the model's
whole one, so that what Step's own step costs beside checkpointing's shows apart from its
plan.

The copy bandwidth between pinned host memory and the device is measured first: the offload
row names the least time its bytes take on the link (`offload_floor_ms`).

Then `loop_ms`: the same steps run back to back without waiting for the device between them,
as a training loop runs them (see loop_ms).

Per step also the caching allocator's calls to the driver (`driver_calls`: blocks reserved,
freed, allocations retried), which wait for the device: a step under a limit that empties the
cache or frees at the memory fraction pays them where plain training does not.

The peak is read from outside Step: Step resets the device's peak counter for its own
readings, so here a thread samples the reserved bytes every 0.5 ms and the step's
end is read too (the caching allocator's reservation only falls when its cache is emptied,
which Step does only between its probes); plain, checkpointing and offload read
`max_memory_reserved()`.

    python bench/gpu_step.py [--models gpt2,llama] [--steps 5]

Writes docs/gpu/step.md and step.json.
"""
from __future__ import annotations

import argparse
import json
import statistics
import threading
import time
from pathlib import Path

import torch

import actcodec.torch as act

DOCS = Path(__file__).resolve().parent.parent / "docs" / "gpu"
MiB = 1 << 20
SHAPES = {"gpt2": (16, 1024), "llama": (8, 1024)}  # batch x tokens


def layout(name: str):
    import transformers as tf
    tf.logging.set_verbosity_error()
    if name == "gpt2":
        cfg = tf.GPT2Config(n_layer=12, n_embd=768, n_head=12, vocab_size=8192, resid_pdrop=0.0,
                            embd_pdrop=0.0, attn_pdrop=0.0)
        return tf.GPT2LMHeadModel(cfg), SHAPES[name], 8192
    cfg = tf.LlamaConfig(hidden_size=1024, intermediate_size=2816, num_hidden_layers=12,
                         num_attention_heads=16, num_key_value_heads=16, vocab_size=32000)
    return tf.LlamaForCausalLM(cfg), SHAPES[name], 32000


def reserved() -> int:
    """The reserved bytes, from the allocator's nested statistics: memory_reserved() flattens
    and sorts all of them in Python, a tenth of a millisecond with the GIL held, which every
    0.5 ms would take from the host work of the step it measures."""
    return torch.cuda.memory_stats_as_nested_dict().get("reserved_bytes", {}).get(
        "all", {}).get("current", 0)


class Sampler:
    """The device's reserved bytes, sampled every `period` seconds by a thread."""

    def __init__(self, period: float = 0.0005):
        self.period, self.peak = period, 0
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def _run(self):
        while not self._stop.wait(self.period):
            self.peak = max(self.peak, reserved())

    def take(self) -> int:
        peak, self.peak = max(self.peak, reserved()), 0
        return peak

    def __enter__(self):
        self._thread.start()
        return self

    def __exit__(self, *exc):
        self._stop.set()
        self._thread.join()


def cosine(a: list, b: list) -> float:
    dot = sum(float((x.double() * y.double()).sum()) for x, y in zip(a, b))
    na = sum(float(x.double().pow(2).sum()) for x in a) ** 0.5
    nb = sum(float(y.double().pow(2).sum()) for y in b) ** 0.5
    return dot / (na * nb)


def driver_calls() -> tuple:
    """The caching allocator's calls to the driver so far: blocks reserved, blocks freed (an
    emptied cache, or a retry at the memory fraction), allocations retried after freeing.
    Each is a device allocation or free, which waits for the device: a step that makes them
    pays for them in time."""
    s = torch.cuda.memory_stats()
    return (s.get("num_device_alloc", 0), s.get("num_device_free", 0),
            s.get("num_alloc_retries", 0))


LOOP_STEPS = 3


def forward_backward(m, batch, step, offload) -> None:
    if step is not None:
        step(batch)
    elif offload is not None:
        with offload:
            loss = m(**batch).loss
        loss.backward()
    else:
        m(**batch).loss.backward()


def train(m, batch, step, offload, opt) -> None:
    forward_backward(m, batch, step, offload)
    opt.step()
    opt.zero_grad(set_to_none=True)


def loop_ms(one_step, steps: int) -> float:
    """Milliseconds per step of `steps` steps run back to back, as a training loop runs them:
    no wait for the device between them (the per-step times above wait before and after
    each, so a step's host work before its first kernel counts in full there; here it
    overlaps the device's work on the step before, as it does for a user)."""
    torch.cuda.synchronize()
    t0 = time.perf_counter()
    for _ in range(steps):
        one_step()
    torch.cuda.synchronize()
    return round((time.perf_counter() - t0) * 1e3 / steps, 1)


def alternatives(step) -> dict:
    """What the solver's model says of a few plans at this profile (seconds, peak MiB above
    the floor): how it ranked micro-batches against recomputation."""
    from actcodec.torch.limit import limit_plan
    prof, got = step.profile, {}
    plain = next(s for s in prof.storages if s.name == "plain")
    every = tuple(range(len(prof.blocks)))
    for m, rec in ((1, ()), (1, every), (2, every), (4, ()), (6, ()), (16, ())):
        p = limit_plan.predict(prof, m, rec, plain, step._planning.measured, 1)
        got[f"{m} mb, {len(rec)} recomputed"] = (round(p.seconds, 3), round(p.peak / MiB))
    got["profile"] = repr(prof)
    return got


def run(name: str, cfg: str, steps: int, limit: int | None = None, plain_grads=None) -> dict:
    dev = torch.device("cuda")
    torch.cuda.empty_cache()
    torch.manual_seed(0)
    m, shape, vocab = layout(name)
    m = m.to(dev).train()
    ids = torch.randint(0, vocab, shape, device=dev)
    batch = {"input_ids": ids, "labels": ids}
    opt = torch.optim.AdamW(m.parameters(), lr=1e-4)
    if cfg == "checkpoint":
        m.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": False})
    offload = act.offload_saved() if cfg == "offload" else None
    step = act.Step(m, limit=limit, optimizer=opt, exact=True) if limit else None
    if cfg.startswith("Step as checkpointing"):  # where Step's own time goes, at its plan
        from actcodec.torch.limit import limit_plan
        every = limit_plan.Plan(1, tuple(range(m.config.num_hidden_layers)))
        step = act.Step(m, limit="free", optimizer=opt, plan=every,
                        chunk_loss="whole loss" not in cfg)
    out = {"config": cfg, "limit_MiB": None if limit is None else limit // MiB,
           "peaks_MiB": [], "times_ms": [], "driver_calls": []}
    grads = None
    with Sampler() as sampler:
        for i in range(steps):
            torch.cuda.synchronize()
            torch.cuda.reset_peak_memory_stats()
            sampler.take()
            before = driver_calls()
            t0 = time.perf_counter()
            try:
                forward_backward(m, batch, step, offload)
            except act.MemoryLimitError as exc:
                out["refused"] = str(exc)
                out["alternatives"] = alternatives(step) if step.profile else None
                out["needed_MiB"] = None if exc.needed is None else -(-exc.needed // MiB)
                break
            if i == 0:
                grads = [p.grad.detach().clone() for p in m.parameters()]
            opt.step()
            opt.zero_grad(set_to_none=True)
            torch.cuda.synchronize()
            out["times_ms"].append(round((time.perf_counter() - t0) * 1e3, 1))
            out["driver_calls"].append([b - a for a, b in zip(before, driver_calls())])
            peak = sampler.take() if step is not None else torch.cuda.max_memory_reserved()
            out["peaks_MiB"].append(round(peak / MiB))
        if out["times_ms"] and "refused" not in out:
            try:
                out["loop_ms"] = loop_ms(lambda: train(m, batch, step, offload, opt),
                                         LOOP_STEPS)
            except act.MemoryLimitError as exc:
                out["loop_refused"] = str(exc)
            out["peaks_MiB"].append(round(sampler.take() / MiB))  # the loop's, sampled
    if out["times_ms"]:
        out["step_ms"] = statistics.median(out["times_ms"][1:] or out["times_ms"])
        out["peak_MiB"] = max(out["peaks_MiB"])
    if step is not None and step.profile is not None:
        out["alternatives"] = alternatives(step)
    if step is not None and out["times_ms"] and limit is not None:
        out["within"] = all(p * MiB <= limit for p in out["peaks_MiB"])
        out["plan"] = step.describe()
        out["smallest_MiB"] = (step.smallest_limit() or 0) // MiB
        out["step_stats_peak_MiB"] = step.stats.peak // MiB
    if step is not None:
        out.setdefault("plan", step.describe())
        step.close()
    if offload is not None:
        ran = len(out["times_ms"]) + (LOOP_STEPS if "loop_ms" in out else 0)
        out["offloaded_MiB"] = offload.stats["bytes"] // MiB // max(1, ran)  # per step
        out["prefetched"], out["on_demand"] = offload.stats["prefetched"], \
            offload.stats["on_demand"]
    if plain_grads is not None and grads is not None:
        out["cosine"] = round(cosine(grads, plain_grads), 7)
    print(name, out, flush=True)
    del m, opt, step, offload
    return out, grads


def link_gbps(nbytes: int = 256 * MiB, repeats: int = 5) -> dict:
    """GB/s of copies between pinned host memory and the device, each way (the median of
    `repeats`, timed by events): what offloading every save cannot beat."""
    host = torch.empty(nbytes, dtype=torch.uint8, pin_memory=True)
    dev = torch.empty(nbytes, dtype=torch.uint8, device="cuda")
    out = {}
    for way, (dst, src) in {"to_host": (host, dev), "to_device": (dev, host)}.items():
        times = []
        for _ in range(repeats):
            start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            start.record()
            dst.copy_(src, non_blocking=True)
            end.record()
            end.synchronize()
            times.append(start.elapsed_time(end) / 1e3)
        out[way] = round(nbytes / statistics.median(times) / 1e9, 1)
    del host, dev
    return out


def offload_floor_ms(offloaded_mib: float, link: dict) -> float:
    """The least time a step that offloads `offloaded_mib` spends on the link: every byte out
    in forward and back in backward (the two ways do not overlap each other in a step)."""
    nbytes = offloaded_mib * MiB
    return round(1e3 * (nbytes / (link["to_host"] * 1e9) + nbytes / (link["to_device"] * 1e9)), 1)


def layout_runs(name: str, steps: int) -> list:
    """Plain, then what the issues compare first (checkpointing, Step at a third of plain's
    peak, offload), then the rest: a run cut short by its device time keeps the first rows
    (each is printed as it ends)."""
    plain, grads = run(name, "fp32", steps)
    rows = [plain]
    limits = {div: plain["peak_MiB"] * MiB // div for div in (3, 2)}
    rows.append(run(name, "checkpoint", steps, plain_grads=grads)[0])
    rows.append(run(name, "limit 1/3", steps, limits[3], grads)[0])
    rows.append(run(name, "offload", steps, plain_grads=grads)[0])
    rows.append(run(name, "limit 1/2", steps, limits[2], grads)[0])
    for cfg in ("Step as checkpointing", "Step as checkpointing, whole loss"):
        rows.append(run(name, cfg, steps, plain_grads=grads)[0])
    smallest = None
    for r in rows[2], rows[4]:
        smallest = smallest or r.get("smallest_MiB") or r.get("needed_MiB")
    if smallest and smallest * MiB < limits[3]:
        rows.append(run(name, "limit smallest", steps, int(smallest * MiB * 1.02), grads)[0])
    del grads
    torch.cuda.empty_cache()
    return rows


def calls(r: dict) -> str:
    """The last step's driver calls: reserved / freed / retried."""
    last = (r.get("driver_calls") or [None])[-1]
    return "-" if not last else "/".join(map(str, last))


def loop(r: dict, plain: dict) -> str:
    """The loop's ms per step and its ratio to plain's loop (two cells)."""
    if "loop_ms" not in r or "loop_ms" not in plain:
        return f"{r.get('loop_refused', '-')[:60]} | -"
    return f"{r['loop_ms']} | {r['loop_ms'] / plain['loop_ms']:.2f}x"


def markdown(res: dict) -> str:
    lines = [f"# Step on a GPU: {res['gpu']}, torch {res['torch']}", "",
             "Written by `python bench/gpu_step.py`; peaks are the device's reserved memory "
             "read from outside Step, per step, AdamW's step included.", ""]
    if res.get("link"):
        lines += [f"Pinned host memory and the device: {res['link']['to_host']} GB/s to the "
                  f"host, {res['link']['to_device']} GB/s back (256 MiB copies).", ""]
    for name, rows in res["layouts"].items():
        plain = rows[0]["step_ms"]
        lines += [f"## {name}, batch {res['shapes'][name]}", "",
                  "| config | limit MiB | every step's peak MiB (the loop's last) | within | "
                  "step ms | vs plain | loop ms | vs plain | cosine to plain | "
                  "driver calls, last step | plan |",
                  "|---|---|---|---|---|---|---|---|---|---|---|"]
        for r in rows:
            if "refused" in r:
                lines.append(f"| {r['config']} | {r['limit_MiB']} | refused: {r['refused']} "
                             f"| | | | | | | | |")
                continue
            within = {True: "yes", False: "NO", None: "-"}[r.get("within")]
            if "offloaded_MiB" in r and res.get("link"):
                r = {**r, "plan": f"{r['offloaded_MiB']} MiB each way a step: at least "
                     f"{offload_floor_ms(r['offloaded_MiB'], res['link'])} ms on the link"}
            lines.append(f"| {r['config']} | {r['limit_MiB'] or '-'} | "
                         f"{', '.join(map(str, r['peaks_MiB']))} | {within} | {r['step_ms']} | "
                         f"{r['step_ms'] / plain:.2f}x | {loop(r, rows[0])} | "
                         f"{r.get('cosine', '-')} | "
                         f"{calls(r)} | {r.get('plan', '-')} |")
        lines.append("")
    return "\n".join(lines)


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--models", default="gpt2,llama")
    ap.add_argument("--steps", type=int, default=5)
    ap.add_argument("--out", default=str(DOCS / "step"))
    args = ap.parse_args()
    if not torch.cuda.is_available():
        raise SystemExit("bench/gpu_step.py measures a CUDA GPU; none is available here")
    names = args.models.split(",")
    res = {"gpu": torch.cuda.get_device_name(0), "torch": torch.__version__,
           "shapes": {n: "x".join(map(str, SHAPES[n])) for n in names},
           "link": link_gbps(), "layouts": {}}
    for n in names:
        res["layouts"][n] = layout_runs(n, args.steps)
        Path(args.out).parent.mkdir(parents=True, exist_ok=True)
        Path(args.out + ".json").write_text(json.dumps(res, indent=1))
        Path(args.out + ".md").write_text(markdown(res))
    print(markdown(res))


if __name__ == "__main__":
    main()
