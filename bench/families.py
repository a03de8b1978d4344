"""`act.Step` on transformers language-model families the tests and the other benchmarks do
not use, as a new user would run it: the defaults, AdamW, each configuration in a fresh process,
every step's peak RSS read from outside.

    python bench/families.py [--quick] [--families qwen2 falcon ...] [--steps 3]
                             [--out docs/limits]

Models: built from a config (random init, dropout off, nothing downloaded), 4 layers of
width 256, 4 heads, an MLP of 1024 and a vocabulary of 8000, each family with its own
attention (grouped or multi-query keys, ALiBi, rotary, parallel blocks, Gemma 2's eager
soft-capped scores, mixtures of experts); and Qwen2 in bfloat16; two encoder-decoders (T5,
BART: as many decoder layers, labels of their own a quarter as long as the source); and two
masked LMs (BERT, ModernBERT: labels on a seeded 15% of the tokens). Batches: 8 x 512 tokens with the last third of every other
row padded (attention mask 0, labels -100), and one sample of 2048 tokens; random token
ids, seeded.

Per family and batch, in fresh processes (bench/loop.py's worker harness: VmRSS read every
millisecond from outside, per loop step, the first step's probes and the optimizer's step
included): plain training, then `act.Step(model, limit=L, optimizer=opt)` at L = floor +
(plain's peak - floor) / 2 and / 3 (one sample: / 2 only), floor: plain's RSS before its
first step plus AdamW's state. Where Step refuses its first step, it runs again at the limit
the error named. Each step's peak against its limit; the plan; and the first step's gradient
under Step at that limit against plain PyTorch's on the same batch and weights (cosine of
the whole vector and of the worst parameter whose gradient is not numerically zero, in
another fresh process). Timings are not the point here (bench/loop.py and
bench/long_sequence.py time steps).

Output: a markdown table (printed, and written to OUT/families.md, default docs/limits) and
the raw numbers (OUT/families.json); --quick writes nothing unless --out is given."""
from __future__ import annotations

import argparse
import json
import mmap
import os
import struct
import subprocess
import sys
import time
import traceback
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))
import loop  # noqa: E402  (the worker harness: fresh processes, VmRSS sampled from outside)

MiB = 1 << 20
VOCAB = 8000
SHAPES = {"full": ((8, 512), (1, 2048)), "quick": ((4, 256), (1, 1024))}
LAYERS = {"full": 4, "quick": 2}
WIDTH = dict(hidden_size=256, intermediate_size=1024, num_attention_heads=4,
             vocab_size=VOCAB, max_position_embeddings=4096)
# family: (model class, config class, config fields beyond WIDTH and the layer count)
FAMILIES = {
    "qwen2": ("Qwen2ForCausalLM", "Qwen2Config", {"num_key_value_heads": 2}),
    "qwen2_bf16": ("Qwen2ForCausalLM", "Qwen2Config", {"num_key_value_heads": 2}),
    "qwen3": ("Qwen3ForCausalLM", "Qwen3Config", {"num_key_value_heads": 2, "head_dim": 64}),
    "mistral": ("MistralForCausalLM", "MistralConfig", {"num_key_value_heads": 2}),
    "phi3": ("Phi3ForCausalLM", "Phi3Config", {"pad_token_id": 0}),
    "gemma": ("GemmaForCausalLM", "GemmaConfig", {"num_key_value_heads": 1, "head_dim": 64}),
    "stablelm": ("StableLmForCausalLM", "StableLmConfig", {}),
    "olmo": ("OlmoForCausalLM", "OlmoConfig", {"pad_token_id": 0}),
    "starcoder2": ("Starcoder2ForCausalLM", "Starcoder2Config",
                   {"num_key_value_heads": 2, "residual_dropout": 0.0,
                    "embedding_dropout": 0.0, "attention_dropout": 0.0}),
    "gpt_neox": ("GPTNeoXForCausalLM", "GPTNeoXConfig",
                 {"hidden_dropout": 0.0, "attention_dropout": 0.0}),
    "opt": ("OPTForCausalLM", "OPTConfig",
            {"ffn_dim": 1024, "word_embed_proj_dim": 256, "dropout": 0.0,
             "attention_dropout": 0.0}),
    "falcon": ("FalconForCausalLM", "FalconConfig",
               {"hidden_dropout": 0.0, "attention_dropout": 0.0,
                "new_decoder_architecture": False, "multi_query": True}),
    "gemma2": ("Gemma2ForCausalLM", "Gemma2Config",  # eager attention, soft caps
               {"num_key_value_heads": 2, "head_dim": 64, "sliding_window": 256}),
    "mixtral": ("MixtralForCausalLM", "MixtralConfig",  # a mixture of 4 experts, 2 per token
                {"num_key_value_heads": 2, "num_local_experts": 4, "num_experts_per_tok": 2}),
    "olmoe": ("OlmoeForCausalLM", "OlmoeConfig",
              {"num_key_value_heads": 2, "num_experts": 4, "num_experts_per_tok": 2,
               "pad_token_id": 0}),
    "bloom": ("BloomForCausalLM", "BloomConfig", {}),  # its own field names: build_model
    "t5": ("T5ForConditionalGeneration", "T5Config", {}),  # encoder-decoders: build_model
    "bart": ("BartForConditionalGeneration", "BartConfig", {}),
    "bert": ("BertForMaskedLM", "BertConfig",  # a masked LM
             {"hidden_dropout_prob": 0.0, "attention_probs_dropout_prob": 0.0}),
    "modernbert": ("ModernBertForMaskedLM", "ModernBertConfig",
                   {"pad_token_id": 0, "bos_token_id": 1, "eos_token_id": 2, "cls_token_id": 1,
                    "sep_token_id": 2}),
}
SEQ2SEQ = {"t5", "bart"}  # labels of their own, a quarter as long as the source
MASKED = {"bert", "modernbert"}  # labels on 15% of the tokens


def build_model(family: str, layers: int):
    import torch
    import transformers as tf

    tf.logging.set_verbosity_error()
    model_class, config_class, extra = FAMILIES[family]
    fields = {**WIDTH, "num_hidden_layers": layers, **extra}
    if family == "bloom":
        fields = {"hidden_size": 256, "n_layer": layers, "n_head": 4, "vocab_size": VOCAB,
                  "hidden_dropout": 0.0, "attention_dropout": 0.0}
    if family == "t5":
        fields = {"d_model": 256, "d_ff": 1024, "d_kv": 64, "num_heads": 4,
                  "num_layers": layers, "num_decoder_layers": layers, "vocab_size": VOCAB,
                  "dropout_rate": 0.0, "decoder_start_token_id": 0, "pad_token_id": 0}
    if family == "bart":
        fields = {"d_model": 256, "encoder_ffn_dim": 1024, "decoder_ffn_dim": 1024,
                  "encoder_layers": layers, "decoder_layers": layers,
                  "encoder_attention_heads": 4, "decoder_attention_heads": 4,
                  "vocab_size": VOCAB, "max_position_embeddings": 4096, "dropout": 0.0,
                  "attention_dropout": 0.0, "activation_dropout": 0.0}
    torch.manual_seed(0)
    model = getattr(tf, model_class)(getattr(tf, config_class)(**fields))
    return model.to(torch.bfloat16) if family.endswith("_bf16") else model


def batch(samples: int, tokens: int, seed: int = 1, family: str = "") -> dict:
    """Seeded token ids; with several samples, every other row's last third padded (an
    encoder-decoder's labels, a quarter as long, too)."""
    import torch

    gen = torch.Generator().manual_seed(seed)
    ids = torch.randint(0, VOCAB, (samples, tokens), generator=gen)
    mask = torch.ones(samples, tokens, dtype=torch.long)
    if samples > 1:
        mask[1::2, tokens - tokens // 3:] = 0
    labels = ids.masked_fill(mask == 0, -100)
    if family in MASKED:
        labels = labels.masked_fill(torch.rand(samples, tokens, generator=gen) >= 0.15, -100)
    if family in SEQ2SEQ:
        target = tokens // 4
        labels = torch.randint(0, VOCAB, (samples, target), generator=gen)
        if samples > 1:
            labels[1::2, target - target // 3:] = -100
    return {"input_ids": ids, "attention_mask": mask, "labels": labels}


def worker(family: str, config: str, limit, layers: int, shape: list, steps: int,
           marker_path: str) -> dict:
    """One configuration's loop (the same batch each step), marking the step it is in."""
    import torch

    fd = os.open(marker_path, os.O_RDWR)
    marker = mmap.mmap(fd, 8)
    os.close(fd)
    torch.set_num_threads(1)
    model = build_model(family, layers).train()
    data = batch(*shape, family=family)
    opt = torch.optim.AdamW(model.parameters(), lr=1e-4)
    step, refusal = None, ()
    if config == "step":
        import actcodec.torch as act
        step, refusal = act.Step(model, limit=limit, optimizer=opt), act.MemoryLimitError
    out = {"floor_rss": loop._status_kib("VmRSS") * 1024,
           "state_bytes": sum(2 * p.numel() * p.element_size() for p in model.parameters()),
           "times": [], "plans": [], "error": None, "refused": None}
    try:
        for i in range(steps):
            struct.pack_into("q", marker, 0, i)
            t0 = time.perf_counter()
            if step is not None:
                try:
                    step(data)
                except refusal as exc:
                    out["refused"] = {"step": i, "needed": exc.needed}
                    break
                out["plans"].append(step.describe().split("; predicted")[0])
            else:
                model(**data).loss.backward()
            opt.step()
            opt.zero_grad(set_to_none=True)
            out["times"].append(time.perf_counter() - t0)
    except Exception as exc:  # recorded as it is: the benchmark reports, it does not fix
        out["error"] = "".join(traceback.format_exception(exc))
    struct.pack_into("q", marker, 0, loop.DONE)
    return out


def cosine_worker(family: str, limit: int, layers: int, shape: list) -> None:
    """The first step's gradient under Step at `limit` against plain PyTorch's on the same
    batch and weights (printed as JSON)."""
    import torch

    import actcodec.torch as act

    torch.set_num_threads(1)
    model = build_model(family, layers).train()
    data = batch(*shape, family=family)
    opt = torch.optim.AdamW(model.parameters(), lr=1e-4)  # its state is planned for
    for _ in range(3):  # this process's floor and probes are not the benchmark's: where
        try:            # it refuses, at the limit it names
            with act.Step(model, limit=limit, optimizer=opt) as step:
                step(data)
            break
        except act.MemoryLimitError as exc:
            limit = exc.needed
    else:
        raise RuntimeError(f"refused three times, last at {limit / 2**20:.0f} MiB")
    got = {n: p.grad.double() for n, p in model.named_parameters() if p.grad is not None}
    model.zero_grad(set_to_none=True)
    model(**data).loss.backward()
    exact = {n: p.grad.double() for n, p in model.named_parameters() if p.grad is not None}

    def cos(a, b):
        return float(a.flatten() @ b.flatten() / (a.norm() * b.norm()))
    whole = cos(torch.cat([g.flatten() for g in got.values()]),
                torch.cat([exact[n].flatten() for n in got]))
    largest = max(float(g.abs().max()) for g in exact.values())
    worst = min((cos(got[n], exact[n]), n) for n in got
                if float(exact[n].abs().max()) > 1e-6 * largest)  # not numerically zero
    print(json.dumps({"whole": whole, "worst": worst[0], "worst_name": worst[1],
                      "plan": step.describe().split("; predicted")[0]}))


def cosine(family: str, limit: int, layers: int, shape: tuple) -> dict:
    call = (f"import families; families.cosine_worker({family!r}, {limit}, {layers}, "
            f"{list(shape)!r})")
    r = subprocess.run([sys.executable, "-c", call], cwd=HERE, capture_output=True, text=True,
                       env={**os.environ, "OMP_NUM_THREADS": "1"})
    if r.returncode != 0:
        return {"error": r.stderr[-1500:]}
    return json.loads(r.stdout.strip().splitlines()[-1])


def run(family, config, limit, layers, shape, steps) -> dict:
    call = (f"families.worker({family!r}, {config!r}, {limit!r}, {layers}, {list(shape)!r}, "
            f"{steps}, {{marker}})")
    r = loop.run_config(family, config, limit, {}, steps, 1, 900, call=call)
    if r.get("error"):
        print(f"  {config}: error\n{r['error'][-1500:]}", file=sys.stderr)
    return r


def row(r: dict, label: str) -> dict:
    limit, peaks = r.get("limit"), r.get("step_peaks", [])
    return {"config": label, "limit_mib": None if limit is None else limit / MiB,
            "peaks_mib": [round(p / MiB, 1) for p in peaks],
            "over": None if limit is None else sum(p > limit for p in peaks),
            "refused": r.get("refused"), "plans": sorted(set(r.get("plans", []))),
            "error": r.get("error")}


def run_case(family: str, shape: tuple, layers: int, steps: int) -> dict:
    print(f"{family}, {shape[0]} x {shape[1]} tokens", flush=True)
    plain = run(family, "plain", None, layers, shape, steps)
    floor = plain["floor_rss"] + plain["state_bytes"]
    peak = max(plain["step_peaks"])
    rows = [row(plain, "plain")]
    for share in (2, 3) if shape[0] > 1 else (2,):
        limit, label = int(floor + (peak - floor) / share), f"1/{share}"
        r = run(family, "step", limit, layers, shape, steps)
        if r.get("refused") and r["refused"]["step"] == 0 and r["refused"]["needed"]:
            rows.append(row(r, label))
            limit, label = int(r["refused"]["needed"]) + 1, f"{label}, named"
            r = run(family, "step", limit, layers, shape, steps)
        rows.append(row(r, label))
        if not r.get("refused") and not r.get("error"):
            rows[-1]["cosine"] = cosine(family, limit, layers, shape)
    for x in rows:
        cos = x.get("cosine", {})
        print(f"  {x['config']:12} limit {x['limit_mib'] or 0:6.0f} peaks {x['peaks_mib']} "
              f"over {x['over']} refused {x['refused']} {x['plans']} "
              f"cos {cos.get('whole', 0):.7f}/{cos.get('worst', 0):.6f}", flush=True)
    return {"family": family, "shape": list(shape), "floor_mib": floor / MiB, "rows": rows}


def table(cases: list) -> str:
    lines = ["| family | batch | floor | config | limit | step peaks | over | plan | gradient "
             "cosine, whole / worst |", "|---|---|---|---|---|---|---|---|---|"]
    for case in cases:
        first = True
        for x in case["rows"]:
            cos = x.get("cosine") or {}
            peaks = ", ".join(f"{p:.0f}" for p in x["peaks_mib"]) or "-"
            if x["refused"] is not None:
                needed = x["refused"]["needed"]
                peaks += f"; refused at step {x['refused']['step'] + 1}" + \
                    ("" if not needed else f", naming {needed / MiB:.0f}")
            if x["error"]:
                peaks += "; ERROR"
            cosines = "" if not cos else (
                "error" if "error" in cos else f"{cos['whole']:.7f} / {cos['worst']:.6f}")
            if cos.get("plan") and cos["plan"] not in x["plans"]:  # its own process's plan
                cosines += f" ({cos['plan']})"
            lines.append(
                f"| {case['family'] if first else ''} | "
                f"{'%d x %d' % tuple(case['shape']) if first else ''} | "
                f"{case['floor_mib']:.0f} | {x['config']} | "
                f"{'-' if x['limit_mib'] is None else '%.0f' % x['limit_mib']} | {peaks} | "
                f"{'' if x['over'] is None else x['over']} | {'; '.join(x['plans'])} | "
                f"{cosines} |")
            first = False
    return "\n".join(lines)


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--quick", action="store_true")
    parser.add_argument("--families", nargs="+", choices=sorted(FAMILIES))
    parser.add_argument("--steps", type=int, default=3)
    parser.add_argument("--out")
    parser.add_argument("--table", metavar="JSON", help="write the table of a run's JSON again")
    args = parser.parse_args(argv)
    size = "quick" if args.quick else "full"
    families = args.families or (["qwen2", "falcon"] if args.quick else list(FAMILIES))
    if args.table:
        cases = json.loads(Path(args.table).read_text())
    else:
        cases = [run_case(f, shape, LAYERS[size], args.steps)
                 for f in families for shape in SHAPES[size]]
    text = table(cases)
    print(text)
    out = args.out or (None if args.quick else str(HERE.parent / "docs" / "limits"))
    if out:
        Path(out).mkdir(parents=True, exist_ok=True)
        commit = subprocess.run(["git", "rev-parse", "--short", "HEAD"], cwd=HERE,
                                capture_output=True, text=True).stdout.strip()
        over = sum(x["over"] or 0 for c in cases for x in c["rows"])
        command = "python bench/families.py" + \
            ("" if not args.families else " --families " + " ".join(families))
        Path(out, "families.md").write_text(
            "# Step on transformers families the tests do not use\n\n"
            f"`{command}` at {commit} (2 cores, one torch thread per run, "
            f"fresh processes, every step's peak RSS read from outside every millisecond, "
            f"the first step's probes and the optimizer's step included; MiB). Steps over "
            f"their limit: {over}. Floor: plain's RSS before its first step plus AdamW's "
            f"state; `named`: a fresh Step at the limit the refusal named. Step runs with "
            f"its defaults (exact=False: a `budget` plan stores saves at 8 bits and more).\n\n"
            + text + "\n")
        Path(out, "families.json").write_text(json.dumps(cases, indent=1))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
