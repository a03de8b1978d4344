"""A training loop under `act.Step`, measured from outside: real text, dynamic padding, AdamW.

    python bench/loop.py [--quick] [--models gpt2 llama] [--steps 60] [--out docs/limits]

The loop is the one people write: Python's own help text (the standard library's
`pydoc_data` topics) cut into samples of varying length at paragraph breaks, tokenized at the
byte level (vocab 256 + a pad id), a length-grouped random sampler (each step draws a length
group and a batch size), transformers' own DataCollatorForLanguageModeling (mlm=False) over a
byte tokenizer made in memory (pads to the batch's longest sample, attention_mask, labels
-100 on padding), a torch DataLoader, AdamW. Seeds are fixed: every configuration sees the
same batches.

Models: transformers' GPT2LMHeadModel and LlamaForCausalLM, built from a config (random init,
dropout off, vocab 257). Configurations, each in a fresh process, in this order:
  plain       plain PyTorch;
  checkpoint  non-reentrant checkpointing of every block (transformers' own switch);
  limit xF    act.Step(model, limit=L, optimizer=opt, exact=True) with
              L = floor + F x (plain's peak - floor), F = 1, 1/2, 1/3; floor: plain's RSS
              before its first step plus the bytes AdamW's state will take (two moments).

Memory is measured from outside the code under test: this process reads the worker's
/proc/<pid>/status VmRSS every millisecond, with the loop step the worker is in (a shared
page the worker writes its step index to), so every step's peak is known, the first step's
probes included; for plain and checkpoint also the worker's VmHWM at its end (Step resets
the kernel's high-water mark, so for Step runs only the sampled peak counts). `step.stats`
is not read. A step refused with MemoryLimitError is skipped (no optimizer step) and counted.
Step time: the median of the loop's steps after the first (forward, backward, optimizer
step), as a ratio to plain's median measured in the same run, and the median over steps of
each step's time over plain's on the same batch. On a shared machine two torch threads slow
several times over when another process takes a core, so each run also reports the cores
other processes kept busy during its loop, and a run above QUIET is run again (--retries),
the quietest kept; what every run measured against the limit is reported.

Output: a markdown table (printed, and written to OUT/loop.md, default docs/limits) and the
raw numbers beside it (OUT/loop.json); --quick writes nothing unless --out is given."""
from __future__ import annotations

import argparse
import collections
import hashlib
import json
import mmap
import os
import random
import shlex
import statistics
import struct
import subprocess
import sys
import tempfile
import time
import traceback
from pathlib import Path

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent
MiB = 1 << 20
PAD = 256  # the pad id; bytes are 0..255
VOCAB = 257
FRACTIONS = (1.0, 1 / 2, 1 / 3)
SETUP, DONE = -1, -2  # step markers outside the loop
SAMPLE_PERIOD = 0.001
QUIET = 0.25  # cores other processes may keep busy during a run whose step times count

# Sizes: the model and the loop. Full: under ~15 minutes on 2 cores for both models.
SIZES = {
    "full": {"layers": 4, "width": 256, "heads": 4, "max_len": 384, "batch": (2, 12),
             "steps": 60, "groups": 4},
    "quick": {"layers": 2, "width": 128, "heads": 4, "max_len": 256, "batch": (4, 16),
              "steps": 12, "groups": 3},
}
MODELS = ("gpt2", "llama")
NAMES = {"gpt2": "GPT-2 layout (GPT2LMHeadModel)", "llama": "Llama layout (LlamaForCausalLM)"}


# --- the data, as a loop gets it ------------------------------------------------------------

def text_samples(max_len: int, seed: int = 0) -> list:
    """Python's help topics cut into samples of varying length: each takes the next bytes of
    its topic up to a length drawn uniformly from 16..max_len, ending at the last paragraph
    break inside it where there is one; each is a list of byte ids."""
    from pydoc_data.topics import topics

    rng = random.Random(seed)
    samples = []
    for name in sorted(topics):
        text = topics[name].encode("utf-8")
        pos = 0
        while pos < len(text):
            window = text[pos:pos + rng.randint(16, max_len)]
            brk = window.rfind(b"\n\n")
            if brk >= 16 and pos + len(window) < len(text):
                window = window[:brk]
            pos += len(window)
            while text[pos:pos + 1] == b"\n":
                pos += 1
            if window.strip():
                samples.append(list(window))
    return samples


class LengthGroupedBatches:
    """A batch sampler (torch DataLoader's batch_sampler=): `steps` batches; each step draws
    one of `groups` length groups (samples sorted by length, cut into equal parts) and a batch
    size in batch[0]..batch[1], then that many samples of the group at random. Shapes vary
    step to step in both samples and padded length; a fixed seed gives the same batches."""

    def __init__(self, lengths: list, steps: int, batch: tuple, groups: int, seed: int = 0):
        order = sorted(range(len(lengths)), key=lambda i: lengths[i])
        cut = len(order) // groups
        self.groups = [order[g * cut:(g + 1) * cut if g < groups - 1 else None]
                       for g in range(groups)]
        self.steps, self.batch, self.seed = steps, batch, seed

    def __len__(self) -> int:
        return self.steps

    def __iter__(self):
        rng = random.Random(self.seed)
        for _ in range(self.steps):
            group = rng.choice(self.groups)
            yield rng.sample(group, rng.randint(*self.batch))


def byte_tokenizer():
    """A transformers tokenizer over the 256 bytes plus a pad id (256), made in memory: what
    transformers' collators pad with. Text is tokenized as its UTF-8 bytes."""
    import tokenizers
    import transformers as tf

    vocab = {f"<{i}>": i for i in range(256)}
    vocab["<pad>"] = PAD
    model = tokenizers.models.WordLevel(vocab, unk_token="<pad>")
    return tf.PreTrainedTokenizerFast(tokenizer_object=tokenizers.Tokenizer(model),
                                      pad_token="<pad>")


def loader(size: dict, steps: int, seed: int = 0):
    """The loop's DataLoader: the samples, the length-grouped batch sampler, and transformers'
    DataCollatorForLanguageModeling(mlm=False) (pads to the batch's longest sample, gives
    attention_mask, and labels = input_ids with -100 on padding; the model shifts them)."""
    import torch
    import transformers as tf

    samples = [{"input_ids": s} for s in text_samples(size["max_len"], seed)]
    batches = LengthGroupedBatches([len(s["input_ids"]) for s in samples], steps,
                                   size["batch"], size["groups"], seed)
    collate = tf.DataCollatorForLanguageModeling(byte_tokenizer(), mlm=False)
    return torch.utils.data.DataLoader(samples, batch_sampler=batches, collate_fn=collate)


# --- the models ------------------------------------------------------------------------------

def build_model(name: str, size: dict, seed: int = 0):
    """A causal LM from a config, random init, dropout off (so every configuration computes
    the same function), over the byte vocabulary plus the pad id."""
    import torch
    import transformers as tf

    tf.logging.set_verbosity_error()
    torch.manual_seed(seed)
    d, layers, heads, n = size["width"], size["layers"], size["heads"], size["max_len"]
    if name == "gpt2":
        cfg = tf.GPT2Config(n_layer=layers, n_embd=d, n_head=heads, n_positions=n,
                            vocab_size=VOCAB, resid_pdrop=0.0, embd_pdrop=0.0, attn_pdrop=0.0,
                            pad_token_id=PAD, bos_token_id=PAD, eos_token_id=PAD)
        return tf.GPT2LMHeadModel(cfg)
    if name == "llama":
        cfg = tf.LlamaConfig(hidden_size=d, intermediate_size=int(d * 8 / 3) // 16 * 16,
                             num_hidden_layers=layers, num_attention_heads=heads,
                             num_key_value_heads=max(1, heads // 2), max_position_embeddings=n,
                             vocab_size=VOCAB, pad_token_id=PAD, bos_token_id=PAD,
                             eos_token_id=PAD, attention_dropout=0.0)
        return tf.LlamaForCausalLM(cfg)
    raise SystemExit(f"unknown model {name!r}; choose from {', '.join(MODELS)}")


def enable_checkpointing(model) -> None:
    """transformers' own switch, non-reentrant (its name before transformers 5 as fallback)."""
    kwargs = {"use_reentrant": False}
    if hasattr(model, "activation_checkpointing_enable"):
        model.activation_checkpointing_enable(activation_checkpointing_kwargs=kwargs)
    else:
        model.gradient_checkpointing_enable(gradient_checkpointing_kwargs=kwargs)


# --- the worker: one configuration in a fresh process ----------------------------------------

def _status_kib(field: str, pid="self") -> int | None:
    try:
        with open(f"/proc/{pid}/status") as f:
            for line in f:
                if line.startswith(field + ":"):
                    return int(line.split()[1])
    except (OSError, ValueError):
        pass
    return None


def worker(model_name: str, config: str, limit: int | None, size: dict, steps: int,
           threads: int, marker_path: str) -> dict:
    """Runs the loop under one configuration ('plain', 'checkpoint' or 'step'), writing the
    loop step it is in to the marker page for the parent's sampler. Imports actcodec only
    for 'step': plain and checkpoint runs are plain PyTorch and transformers."""
    import torch

    fd = os.open(marker_path, os.O_RDWR)
    marker = mmap.mmap(fd, 8)
    os.close(fd)

    def mark(i: int) -> None:
        struct.pack_into("q", marker, 0, i)

    torch.set_num_threads(threads)
    data = loader(size, steps)
    model = build_model(model_name, size)
    model.train()
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
    step, refusal_type = None, ()
    if config == "checkpoint":
        enable_checkpointing(model)
    elif config == "step":
        import actcodec.torch as act

        refusal_type = act.MemoryLimitError
        step = act.Step(model, limit=limit, optimizer=opt, exact=True)
    state_bytes = sum(2 * p.numel() * p.element_size() for p in model.parameters())
    floor_rss = _status_kib("VmRSS") * 1024
    out = {"floor_rss": floor_rss, "state_bytes": state_bytes, "times": [], "losses": [],
           "shapes": [], "refused": [], "plans": [], "error": None}
    try:
        for i, batch in enumerate(data):
            mark(i)
            out["shapes"].append(list(batch["input_ids"].shape))
            t0 = time.perf_counter()
            try:
                if step is not None:
                    loss = step(batch)
                else:
                    loss = model(**batch).loss
                    loss.backward()
            except refusal_type as exc:  # the step is skipped: .grad is as before it
                out["refused"].append({"step": i, "message": str(exc).splitlines()[0]})
                loss = None
            else:
                opt.step()
            opt.zero_grad(set_to_none=True)
            out["times"].append(time.perf_counter() - t0)
            out["losses"].append(None if loss is None else float(loss))
            if step is not None:
                out["plans"].append(None if loss is None else _plan_words(step))
    except Exception as exc:  # recorded as it is: the benchmark reports, it does not fix
        out["error"] = "".join(traceback.format_exception(exc))
    mark(DONE)
    out["vmhwm"] = _status_kib("VmHWM") * 1024
    return out


def _plan_words(step) -> dict:
    """The plan a step ran, without its prediction: micro-batches, blocks recomputed (of how
    many), storage."""
    plan = step.plan
    return {"micro_batches": plan.micro_batches, "recompute": len(plan.recompute),
            "blocks": len(getattr(step, "blocks", ())), "storage": plan.storage}


def plan_summary(plans: list) -> list:
    """Plans grouped by recomputation and storage: their micro-batch counts and steps."""
    groups: dict = {}
    for p in plans:
        if p is not None:
            key = (p["recompute"], p["blocks"], p["storage"])
            groups.setdefault(key, []).append(p["micro_batches"])
    out = []
    for (rec, blocks, storage), mbs in sorted(groups.items(), key=lambda g: -len(g[1])):
        span = f"{min(mbs)}" if min(mbs) == max(mbs) else f"{min(mbs)}-{max(mbs)}"
        what = f"recompute {rec}/{blocks}, {storage}" if rec else storage
        out.append(f"{what}, {span} micro-batch{'es' * (max(mbs) > 1)} "
                   f"({len(mbs)} step{'s' * (len(mbs) > 1)})")
    return out


# --- the parent: a fresh process per configuration, sampled from outside --------------------

def _cpu_times(pid: int) -> dict | None:
    """Seconds of CPU: the machine's busy time, the worker's and this process's; and now."""
    try:
        with open("/proc/stat") as f:
            fields = [int(x) for x in f.readline().split()[1:]]
        with open(f"/proc/{pid}/stat") as f:
            worker = f.read().rsplit(")", 1)[1].split()
    except (OSError, ValueError, IndexError):
        return None
    hz = os.sysconf("SC_CLK_TCK")
    own = os.times()
    return {"busy": (sum(fields[:8]) - fields[3] - fields[4]) / hz,  # less idle and iowait
            "worker": (int(worker[11]) + int(worker[12])) / hz, "own": own.user + own.system,
            "now": time.monotonic()}


def others_cores(start: dict | None, end: dict | None) -> float | None:
    """How many cores other processes kept busy, on average, while the worker's loop ran
    (the machine's busy time less the worker's and this sampler's): what makes its step
    times noisy on a shared machine."""
    if not start or not end or end["now"] <= start["now"]:
        return None
    other = sum(end[k] - start[k] if k == "busy" else start[k] - end[k]
                for k in ("busy", "worker", "own"))
    return max(0.0, other / (end["now"] - start["now"]))


def run_config(model_name: str, config: str, limit: int | None, size: dict, steps: int,
               threads: int, timeout: float, call: str | None = None) -> dict:
    """One configuration in a fresh process; its VmRSS read every SAMPLE_PERIOD seconds from
    here and attributed to the loop step the worker marks. `call`: another worker, a Python
    expression in `module.function(...)` form with `{marker}` where the marker page's path
    goes (bench/long_sequence.py); its dict result is kept as this one's is."""
    with tempfile.TemporaryDirectory() as tmp:
        marker_path, result_path = os.path.join(tmp, "marker"), os.path.join(tmp, "out.json")
        with open(marker_path, "wb") as f:
            f.write(struct.pack("q", SETUP))
        fd = os.open(marker_path, os.O_RDONLY)
        marker = mmap.mmap(fd, 8, access=mmap.ACCESS_READ)
        os.close(fd)
        if call is None:
            call = (f"loop.worker({model_name!r}, {config!r}, {limit!r}, {size!r}, {steps}, "
                    f"{threads}, {{marker}})")
        module = call.split(".", 1)[0]
        code = (f"import sys, json; sys.path.insert(0, {str(HERE)!r}); import {module}; "
                f"r = {call.replace('{marker}', repr(marker_path))}; "
                f"open({result_path!r}, 'w').write(json.dumps(r))")
        proc = subprocess.Popen([sys.executable, "-c", code], cwd=str(ROOT),
                                stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
        peaks: dict = {}  # marker -> the largest VmRSS read while the worker was there
        readings = collections.Counter()  # marker -> how many reads it got
        cpu = {}  # CPU times when the loop started and ended (see others_cores)
        start = time.monotonic()
        while proc.poll() is None:
            before = struct.unpack_from("q", marker, 0)[0]
            kib = _status_kib("VmRSS", proc.pid)
            after = struct.unpack_from("q", marker, 0)[0]
            # a read while the worker moved on from one step to the next counts for both
            for where in {before, after} if kib is not None else ():
                peaks[where] = max(peaks.get(where, 0), kib * 1024)
                readings[where] += 1
            phase = "start" if after >= 0 else "end" if after == DONE else None
            if phase and phase not in cpu:
                cpu[phase] = _cpu_times(proc.pid)
            if time.monotonic() - start > timeout:
                proc.kill()
                break
            time.sleep(SAMPLE_PERIOD)
        _, err = proc.communicate()
        marker.close()
        result = {"config": config, "limit": limit,
                  "wall": time.monotonic() - start, "returncode": proc.returncode,
                  "others_cores": others_cores(cpu.get("start"), cpu.get("end"))}
        if os.path.exists(result_path):
            with open(result_path) as f:
                result.update(json.load(f))
        else:
            result["error"] = (f"worker exited with {proc.returncode} and no result"
                               f"{' (timed out)' if time.monotonic() - start > timeout else ''}"
                               f":\n{err[-4000:]}")
    steps_run = len(result.get("times", []))
    result["step_peaks"] = [peaks.get(i, 0) for i in range(steps_run)]
    result["step_readings"] = [readings[i] for i in range(steps_run)]
    result["setup_peak"] = peaks.get(SETUP, 0)
    return result


def _ran(r: dict) -> dict:
    """Step index -> seconds, for the steps after the first that ran (not refused)."""
    return {i: t for i, (t, loss) in enumerate(zip(r.get("times", []), r.get("losses", [])))
            if i > 0 and loss is not None}


def summarize(r: dict, plain: dict | None = None, checkpoint: dict | None = None) -> dict:
    """The numbers a row shows. Step time: the median of the steps run after the first; over
    plain's (and checkpointing's) the same median, and, less moved by a burst of other work
    on the machine, the median over steps of this step's time over plain's on the same batch."""
    limit = r["limit"]
    step_peaks = r["step_peaks"]
    ran = _ran(r)
    median = statistics.median(ran.values()) if ran else None

    def ratio(other):
        if not median or other is None or not _ran(other):
            return None
        return median / statistics.median(_ran(other).values())

    same = [t / _ran(plain)[i] for i, t in ran.items() if i in _ran(plain)] if plain else []
    losses = [x for x in r.get("losses", [])[-10:] if x is not None]
    return {
        "first_peak": step_peaks[0] if step_peaks else None,
        "largest_peak": max(step_peaks) if step_peaks else None,
        "over": None if limit is None else sum(p > limit for p in step_peaks)
        + (r["setup_peak"] > limit),
        "most_over": None if limit is None else max(
            [p - limit for p in step_peaks] + [r["setup_peak"] - limit, 0]),
        "over_not_kept": None if limit is None else sum(
            sum(p > limit for p in t["step_peaks"]) for t in r.get("not_kept", [])),
        "unread": sum(n == 0 for n in r.get("step_readings", [])),
        "refused": len(r.get("refused", [])),
        "median": median,
        "vs_plain": ratio(plain),
        "vs_plain_same_batch": statistics.median(same) if same else None,
        "vs_checkpoint": ratio(checkpoint),
        "loss": statistics.mean(losses) if losses else None,
        "loop_seconds": sum(r.get("times", [])),
        "plans": plan_summary(r.get("plans", [])),
    }


def _mib(x) -> str:
    return "-" if x is None else f"{x / MiB:.0f}"


def table(results: dict, size: dict, steps: int) -> str:
    lines = [f"Python's help text at the byte level, samples of up to {size['max_len']} bytes, "
             f"batches of {size['batch'][0]}..{size['batch'][1]} samples from "
             f"{size['groups']} length groups padded to the batch's longest, {steps} steps, "
             f"AdamW; models of {size['layers']} layers x {size['width']}, random init. "
             f"Peaks: the worker's VmRSS read from outside every ms (and its VmHWM for plain "
             f"and checkpoint); over: steps whose peak exceeded the limit (VmRSS comes from "
             f"per-CPU counters and can be a fraction of a MiB off); step ms: the median "
             f"of the steps run after the first; / plain: that median over plain's, and in "
             f"brackets the median over steps of the step's time over plain's on the same "
             f"batch; loop s: all steps, the first's probes included; others: cores other "
             f"processes kept busy during the loop (timing noise; a run above {QUIET} is "
             f"run again, the quietest kept).",
             "",
             "| model | config | limit MiB | largest step peak MiB | first step peak MiB "
             "| over | refused | step ms | / plain | / checkpoint | loop s | others "
             "| loss, last 10 | plans (steps) |",
             "|---|---|---|---|---|---|---|---|---|---|---|---|---|---|"]
    fmt = lambda x, f: "-" if x is None else f.format(x)  # noqa: E731
    for model_name, runs in results.items():
        first = True
        for r in runs:
            s = r["summary"]
            label = r["label"]
            if r.get("error"):
                err = r["error"].strip().splitlines()[-1][:160].replace("|", "/")
                label += f" (crashed at step {len(r.get('times', []))}: {err})"
            peak = _mib(s["largest_peak"])
            if r["config"] in ("plain", "checkpoint"):
                peak += f" (VmHWM {_mib(r.get('vmhwm'))})"
            plans = "; ".join(s["plans"]) if s["plans"] else "-"
            unread = f" ({s['unread']} steps not read)" if s["unread"] else ""
            if s["over"]:
                unread += f", by up to {s['most_over'] / MiB:.1f} MiB"
            if s["over_not_kept"]:
                unread += f" ({s['over_not_kept']} in runs not kept)"
            same = "" if r["config"] == "plain" or s["vs_plain_same_batch"] is None else \
                f" ({s['vs_plain_same_batch']:.2f})"
            lines.append(
                f"| {NAMES[model_name] if first else ''} | {label} | {_mib(r['limit'])} | "
                f"{peak} | {_mib(s['first_peak'])} | {fmt(s['over'], '{}')}{unread} | "
                f"{s['refused']} | {fmt(s['median'] and s['median'] * 1e3, '{:.0f}')} | "
                f"{fmt(s['vs_plain'], '{:.2f}')}{same} | {fmt(s['vs_checkpoint'], '{:.2f}')} | "
                f"{s['loop_seconds']:.0f} | {fmt(r.get('others_cores'), '{:.1f}')} | "
                f"{fmt(s['loss'], '{:.3f}')} | {plans} |")
            first = False
    return "\n".join(lines)


def run_model(model_name: str, size: dict, steps: int, args, log) -> list:
    """Plain, checkpointing, then Step at the limits plain's peak gives, each in a fresh
    process. A run whose loop shared the machine (other processes kept more than QUIET cores
    busy) is run again, up to args.retries times, and the quietest kept: its step times are
    what the machine gives, not what another job left. What every run measured against the
    limit is kept (a limit exceeded in a run not kept still shows)."""
    runs = []

    def go(config, label, limit=None):
        tries = []
        for _ in range(1 + args.retries):
            r = run_config(model_name, config, limit, size, steps, args.threads, args.timeout)
            tries.append(r)
            log(f"{model_name} {label}: limit {_mib(limit)} MiB, largest step peak "
                f"{_mib(max(r['step_peaks'], default=None))} MiB, "
                f"{len(r.get('times', []))} steps, {r['wall']:.0f} s, others "
                f"{r.get('others_cores') or 0:.2f} cores{' ERROR' if r.get('error') else ''}")
            if r.get("error") or (r.get("others_cores") or 0) <= QUIET:
                break
        kept = tries[-1] if tries[-1].get("error") else min(
            tries, key=lambda t: t.get("others_cores") or 0)
        kept["label"] = label
        kept["not_kept"] = [{"others_cores": t.get("others_cores"),
                             "step_peaks": t["step_peaks"], "error": t.get("error")}
                            for t in tries if t is not kept]
        runs.append(kept)
        return kept

    plain = go("plain", "plain")
    if plain.get("error"):
        return runs
    go("checkpoint", "checkpoint (every block)")
    peak = max(max(plain["step_peaks"], default=0), plain.get("vmhwm", 0))
    floor = plain["floor_rss"] + plain["state_bytes"]
    for f in FRACTIONS:
        limit = int(floor + f * (peak - floor))
        name = {1.0: "1", 0.5: "1/2"}.get(f, "1/3")
        go("step", f"Step, limit floor + {name} x (plain - floor)", limit)
    for r in runs:
        r["summary"] = summarize(r, plain, runs[1])
    return runs


def _source() -> dict:
    """The checkout measured: its commit, the tracked files changed since, and a hash of
    what changed in the package (to see that it did not change during the run)."""
    def git(*cmd):
        out = subprocess.run(["git", *cmd], cwd=str(ROOT), capture_output=True, text=True)
        return out.stdout.strip() if out.returncode == 0 else None

    changed = git("diff", "--name-only", "HEAD")
    diff = git("diff", "HEAD", "--", "actcodec")
    return {"commit": git("rev-parse", "HEAD"), "changed": changed.split() if changed else [],
            "actcodec_diff_sha256": hashlib.sha256((diff or "").encode()).hexdigest()}


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--quick", action="store_true", help="smaller models, fewer steps")
    p.add_argument("--models", nargs="+", default=list(MODELS), choices=MODELS)
    p.add_argument("--steps", type=int, default=None)
    p.add_argument("--threads", type=int, default=2)
    p.add_argument("--timeout", type=float, default=600.0, help="seconds per configuration")
    p.add_argument("--retries", type=int, default=None,
                   help=f"runs again a configuration whose loop shared the machine (other "
                        f"processes busy on more than {QUIET} cores), keeping the quietest "
                        f"(default 2; with --quick 0)")
    p.add_argument("--out", type=Path, default=None,
                   help="where loop.md and loop.json go (default: docs/limits; with --quick, "
                        "nowhere: the table is printed)")
    args = p.parse_args(argv)
    size = SIZES["quick" if args.quick else "full"]
    if args.retries is None:
        args.retries = 0 if args.quick else 2
    steps = args.steps or size["steps"]

    def log(msg):
        print(msg, file=sys.stderr, flush=True)

    source = _source()  # each worker imports the checkout anew: it must not change meanwhile
    results = {m: run_model(m, size, steps, args, log)
               for m in args.models}
    for runs in results.values():  # a plain run that failed leaves no summary to compare
        for r in runs:
            r.setdefault("summary", summarize(r))
    command = shlex.join(["python", "bench/loop.py", *(sys.argv[1:] if argv is None else argv)])
    text = table(results, size, steps)
    print(text)
    if _source() != source:
        log(f"warning: the checkout changed during the run (from {source}); its numbers mix "
            f"two versions")
        source["changed_during_run"] = _source()
    out = args.out if args.out is not None or args.quick else ROOT / "docs" / "limits"
    if out is None:
        return 0
    out.mkdir(parents=True, exist_ok=True)
    (out / "loop.md").write_text(
        f"# A training loop under `act.Step`, measured from outside\n\n`{command}`\n\n"
        f"{text}\n")
    sys.path.insert(0, str(HERE))
    import harness

    raw = {"command": command, "source": source,
           "size": size, "steps": steps, "machine": harness.machine(args.threads),
           "results": results}
    (out / "loop.json").write_text(json.dumps(raw, indent=1) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
