"""The codecs and a training step on a CUDA GPU: each codec's encode and decode against a device
copy of the same input, through the fused Triton kernels (for the quant codec also as the save
path calls them, its statistics read later: "fused-unread") and through the torch-op path, and one
training step (forward, backward) of transformers GPT-2 and Llama layouts under plain PyTorch,
activation checkpointing and the presets, with each step's peak allocated and reserved memory.
Writes docs/gpu/latest.md and .json (the figures quoted in docs/GPU.md come from it, or from
../shared/gpu/check.sh, which runs the same measurements).

    python bench/gpu.py [--elements 67108864] [--steps 5] [--models gpt2,llama]
"""
from __future__ import annotations

import argparse
import json
import time
from pathlib import Path

import torch

import actcodec.torch as act
from actcodec.torch.codecs import device as torchops
from actcodec.torch.codecs import fused

DOCS = Path(__file__).resolve().parent.parent / "docs" / "gpu"
CODECS = [("quant8", "auto", {"bits": 8}, False), ("quant2", "auto", {"bits": 2}, False),
          ("bitmap", "auto", {}, True), ("bitmap_quant8", "bitmap_quant", {"bits": 8}, True)]


def timed(f, n: int) -> float:
    f()
    torch.cuda.synchronize()
    t = time.perf_counter()
    for _ in range(n):
        f()
    torch.cuda.synchronize()
    return (time.perf_counter() - t) / n


def codecs(elements: int) -> dict:
    """Encode and decode of float32 normal values (ReLU'd for the bitmap codecs) over a copy."""
    dev = torch.device("cuda")
    x = torch.randn(elements, device=dev)
    relu, dst = x.clamp(min=0), torch.empty_like(x)
    t_copy = timed(lambda: dst.copy_(x), 20)
    rows = {"elements": elements, "copy_us": round(t_copy * 1e6, 1)}
    for name, codec, kw, sparse in CODECS:
        src = relu if sparse else x
        for path in (fused, torchops):
            enc = path.encode(src, codec, **kw)
            te = timed(lambda: path.encode(src, codec, **kw), 10)
            td = timed(lambda: path.decode_into(enc, dst, "float32"), 10)
            rows[f"{name} {'fused' if path is fused else 'torch ops'}"] = {
                "encode_vs_copy": round(te / t_copy, 2), "decode_vs_copy": round(td / t_copy, 2)}
        if not sparse:  # the save path's quant pass, its statistics read later (no wait)
            unread = fused.encode_unread(src, codec, **kw)
            te = timed(lambda: fused.encode_unread(src, codec, **kw), 10)
            td = timed(lambda: fused.decode_into(unread[0], dst, "float32"), 10)
            rows[f"{name} fused-unread"] = {"encode_vs_copy": round(te / t_copy, 2),
                                            "decode_vs_copy": round(td / t_copy, 2)}
    return rows


ENCODE_SHAPES = [(1024, 1), (1024, 2), (1024, 4), (2048, 2), (2048, 4), (4096, 4), (4096, 8),
                 (8192, 8)]
DECODE_SHAPES = [(1024, 2), (1024, 4), (2048, 4), (4096, 4), (4096, 8), (8192, 8)]


def tiles(elements: int) -> dict:
    """The quant kernels' tile (elements per program) and warps against a device copy, each
    as the encode and decode calls them (the encode with its buffers and statistics rows):
    which one fused.QUANT_TILE and DECODE_TILE should be on this GPU."""
    dev = torch.device("cuda")
    x = torch.randn(elements, device=dev)
    dst = torch.empty_like(x)
    t_copy = timed(lambda: dst.copy_(x), 20)
    flat = x.view(torch.int32)
    rows = {}
    for bits in (8, 2):
        p = {"bits": bits, "group_size": 256, "rounding": "nearest", "seed": 0}
        bufs = fused._quantize(flat, "float32", p)[0]
        for tile, warps in ENCODE_SHAPES:
            te = timed(lambda: fused._quantize(flat, "float32", p, tile, warps), 10)
            rows[f"{bits}-bit encode {tile} x {warps}"] = round(te / t_copy, 3)
        for tile, warps in DECODE_SHAPES:
            td = timed(lambda: fused._dequantize(bufs, elements, "float32", p, dst, tile, warps),
                       10)
            rows[f"{bits}-bit decode {tile} x {warps}"] = round(td / t_copy, 3)
    print("tiles:", rows, flush=True)
    return rows


def model(name: str):
    import transformers as tf
    tf.logging.set_verbosity_error()
    if name == "gpt2":
        cfg = tf.GPT2Config(n_layer=12, n_embd=768, n_head=12, vocab_size=8192)
        return tf.GPT2LMHeadModel(cfg), (16, 1024), 8192
    cfg = tf.LlamaConfig(hidden_size=1024, intermediate_size=2816, num_hidden_layers=12,
                         num_attention_heads=16, num_key_value_heads=16, vocab_size=32000)
    return tf.LlamaForCausalLM(cfg), (8, 1024), 32000


def steps(name: str, configs: list[str], n: int) -> dict:
    dev = torch.device("cuda")
    out = {}
    for cfg in configs:
        torch.manual_seed(0)
        m, shape, vocab = model(name)
        m = m.to(dev).train()
        if cfg == "checkpoint":
            m.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": False})
        ids = torch.randint(0, vocab, shape, device=dev)

        def step():
            m.zero_grad(set_to_none=True)
            if cfg in ("fp32", "checkpoint"):
                loss = m(input_ids=ids, labels=ids).loss
            else:
                with act.compress_saved(act.Policy.preset(cfg), model=m):
                    loss = m(input_ids=ids, labels=ids).loss
            loss.backward()
        step()
        torch.cuda.synchronize()
        torch.cuda.reset_peak_memory_stats()
        t = timed(step, n)
        out[cfg] = {"step_ms": round(t * 1e3, 1),
                    "peak_allocated_MiB": round(torch.cuda.max_memory_allocated() / 2**20),
                    "peak_reserved_MiB": round(torch.cuda.max_memory_reserved() / 2**20)}
        print(name, cfg, out[cfg], flush=True)
        del m
        torch.cuda.empty_cache()
    return out


def markdown(res: dict) -> str:
    lines = [f"# GPU benchmark: {res['gpu']}, torch {res['torch']}, triton {res['triton']}",
             "", "Written by `python bench/gpu.py`.", "",
             f"## Codecs, {res['codecs']['elements']} float32 elements, time over a device copy",
             "", "| codec | path | encode | decode |", "|---|---|---|---|"]
    for key, row in res["codecs"].items():
        if isinstance(row, dict):
            codec, path = key.split(" ", 1)
            lines.append(f"| {codec} | {path} | {row['encode_vs_copy']}x | "
                         f"{row['decode_vs_copy']}x |")
    lines += ["", "## The quant kernels' tile x warps, time over a device copy "
              f"(defaults: encode {fused.QUANT_TILE}, decode {fused.DECODE_TILE})", "",
              "| kernel | tile x warps | vs copy |", "|---|---|---|"]
    for key, ratio in res["tiles"].items():
        kernel, shape = key.rsplit(" ", 3)[0], " ".join(key.rsplit(" ", 3)[1:])
        lines.append(f"| {kernel} | {shape} | {ratio}x |")
    for name, rows in res["steps"].items():
        plain = rows["fp32"]["step_ms"]
        lines += ["", f"## One training step, {name}", "",
                  "| config | step ms | vs plain | peak allocated MiB | peak reserved MiB |",
                  "|---|---|---|---|---|"]
        for cfg, r in rows.items():
            lines.append(f"| {cfg} | {r['step_ms']} | {r['step_ms'] / plain:.2f}x | "
                         f"{r['peak_allocated_MiB']} | {r['peak_reserved_MiB']} |")
    return "\n".join(lines) + "\n"


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--elements", type=int, default=64 << 20)
    ap.add_argument("--steps", type=int, default=5)
    ap.add_argument("--models", default="gpt2,llama")
    ap.add_argument("--configs", default="fp32,checkpoint,8bit,2bit")
    args = ap.parse_args()
    if not torch.cuda.is_available():
        raise SystemExit("bench/gpu.py measures a CUDA GPU; none is available here")
    import triton
    res = {"gpu": torch.cuda.get_device_name(0), "torch": torch.__version__,
           "triton": triton.__version__, "codecs": {}, "tiles": {}, "steps": {}}

    def write():  # after each part: a run its device time cuts short keeps what it measured
        DOCS.mkdir(parents=True, exist_ok=True)
        (DOCS / "latest.json").write_text(json.dumps(res, indent=1))
        (DOCS / "latest.md").write_text(markdown(res))

    res["codecs"] = codecs(args.elements)
    write()
    res["tiles"] = tiles(args.elements)
    write()
    for m in args.models.split(","):
        res["steps"][m] = steps(m, args.configs.split(","), args.steps)
        write()
    print(markdown(res))


if __name__ == "__main__":
    main()
