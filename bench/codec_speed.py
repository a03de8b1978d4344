"""The codec kernels beside their floors and the alternatives a user would pick: 64 MiB of
float32 (by default), the benchmark's threads, memory reused (encodes write into an arena
mapped once, as actcodec's store gives a training step; decode writes into a caller's
`out=`). Each row is one interleaved run of our encode and decode, the copy and read
yardsticks (harness.py) and the alternatives, on the same input.

    python bench/codec_speed.py [--mib 64] [--rounds 15] [--threads 2]"""
from __future__ import annotations

import argparse
import sys
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))
import harness  # noqa: E402

import actcodec  # noqa: E402

BITMAP_ZEROS = (0.1, 0.5, 0.9)
QUANT_BITS = (1, 2, 4, 8)
BITMAP_QUANT_BITS = (2, 4, 8)
GROUP = 256
ALTERNATIVES = {
    "numpy": "np.packbits of the nonzero mask + boolean indexing; decode np.unpackbits + masked "
             "assignment (one thread)",
    "torch eager": "the same per-group (256) min-max quantizer in eager torch ops, packed in the "
                   "same layout (torch's threads)",
    "bitsandbytes": "bitsandbytes.functional.quantize_blockwise / dequantize_blockwise, 8-bit, "
                    "blocksize 256, CPU",
    "torchao pack": "torchao's pack_cpu / unpack_cpu of the same number of k-bit codes held one "
                    "per byte: packing only, no min/max or scaling",
}


def _row(codec, params, x, kw, threads, rounds, alts=None):
    """Time our encode (into an arena) and decode (into a preallocated out) of `codec` with
    parameters `kw`, beside the yardsticks and `alts` ({label: (encode fn or None, decode fn
    or None)}), interleaved."""
    arena = harness.Arena(2 * x.nbytes + (1 << 20))

    def encode():
        return actcodec.encode(x, codec, threads=threads, alloc=arena.reset(), **kw)
    enc = actcodec.encode(x, codec, threads=threads, **kw)  # decoded from memory of its own
    out = np.empty(x.shape, np.float32 if codec != "mask" else x.dtype)
    if enc.dtype != "float32" and codec != "mask":
        out = np.empty(x.shape, x.dtype)
    cands = {"copy": harness.copy_into(x), "read": harness.read_input(x),
             "floor": harness.read_and_write(x, enc.nbytes),
             "encode": encode, "decode": lambda: enc.decode(out=out, threads=threads)}
    for label, fns in (alts or {}).items():
        for op, fn in zip(("encode", "decode"), fns):
            if fn is not None:
                cands[f"{label}: {op}"] = fn
    t = harness.time_interleaved(cands, rounds)
    return {"codec": codec, "params": params, "ratio": enc.ratio, "ms": {k: v * 1e3 for k, v in
                                                                          t.items()},
            "encode/read": t["encode"] / t["read"], "encode/copy": t["encode"] / t["copy"],
            "floor/read": t["floor"] / t["read"],
            "decode/copy": t["decode"] / t["copy"],
            "alts": {label: {op: t[f"{label}: {op}"] / t[op]
                             for op in ("encode", "decode") if f"{label}: {op}" in t}
                     for label in (alts or {})}}


def rows(mib: int = 64, rounds: int = 15, threads: int = 2, progress=print) -> list:
    import torch

    torch.set_num_threads(threads)
    bnb, torchao = harness.load_bitsandbytes(), harness.load_torchao()
    out = []
    n = mib << 20

    def add(row):
        out.append(row)
        progress(f"  {row['codec']} {row['params']}: encode/read {row['encode/read']:.2f}, "
                 f"decode/copy {row['decode/copy']:.2f}")

    for zf in BITMAP_ZEROS:
        x = harness.relu_like(n, zf)
        p, v = harness.numpy_bitmap_encode(x)
        alts = {"numpy": (lambda x=x: harness.numpy_bitmap_encode(x),
                          lambda x=x, p=p, v=v: harness.numpy_bitmap_decode(p, v, x.size))}
        add(_row("bitmap", f"{zf:.0%} zeros", x, {}, threads, rounds, alts))
    x = harness.normal(n)
    xt = torch.from_numpy(x)
    for k in QUANT_BITS:
        tq = harness.torch_eager_quantize(xt, k)
        alts = {"torch eager": (lambda k=k: harness.torch_eager_quantize(xt, k),
                                lambda k=k, tq=tq: harness.torch_eager_dequantize(*tq, k))}
        if bnb is not None and k == 8:
            bq = bnb.quantize_blockwise(xt, blocksize=GROUP)
            alts["bitsandbytes"] = (lambda: bnb.quantize_blockwise(xt, blocksize=GROUP),
                                    lambda bq=bq: bnb.dequantize_blockwise(*bq))
        if torchao.ok and k < 8:
            codes = torch.randint(0, 1 << k, (x.size,), dtype=torch.uint8)
            packed = torchao.pack(codes, k)
            alts["torchao pack"] = (lambda k=k, c=codes: torchao.pack(c, k),
                                    lambda k=k, p=packed: torchao.unpack(p, k))
        add(_row("quant", f"k={k}", x, {"bits": k}, threads, rounds, alts))
    x = harness.relu_like(n, 0.5, nonzero_multiple=GROUP)
    for k in BITMAP_QUANT_BITS:
        add(_row("bitmap_quant", f"k={k}, 50% zeros", x, {"bits": k}, threads, rounds))
    mask = np.where(np.random.default_rng(1).random(n // 4) < 0.5, np.float32(2), np.float32(0))
    alts = {"numpy": (lambda: np.packbits(mask != 0, bitorder="little"), None)}
    add(_row("mask", "dropout p=0.5", mask, {}, threads, rounds, alts))
    return out


def markdown(rows_: list) -> str:
    head = ["codec", "case", "size ratio", "encode / read", "floor / read", "encode / copy",
            "decode / copy",
            "vs numpy (enc, dec)", "vs torch eager (enc, dec)", "vs bitsandbytes (enc, dec)",
            "vs torchao pack (enc, dec)", "ms: copy, read, encode, decode"]
    lines = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    for r in rows_:
        def alt(label):
            a = r["alts"].get(label)
            if not a:
                return "-"
            return ", ".join(f"{a[op]:.1f}x" if op in a else "-" for op in ("encode", "decode"))
        ms = r["ms"]
        lines.append("| " + " | ".join([
            r["codec"], r["params"], f"{r['ratio']:.2f}x", f"{r['encode/read']:.2f}",
            f"{r['floor/read']:.2f}", f"{r['encode/copy']:.2f}", f"{r['decode/copy']:.2f}", alt("numpy"),
            alt("torch eager"), alt("bitsandbytes"), alt("torchao pack"),
            f"{ms['copy']:.1f}, {ms['read']:.1f}, {ms['encode']:.1f}, {ms['decode']:.1f}"]) + " |")
    return "\n".join(lines)


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--mib", type=int, default=64)
    p.add_argument("--rounds", type=int, default=15)
    p.add_argument("--threads", type=int, default=2)
    args = p.parse_args(argv)
    print(markdown(rows(args.mib, args.rounds, args.threads)))
    return 0


if __name__ == "__main__":
    sys.exit(main())
