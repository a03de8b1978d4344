"""One training step of a ResNet-18-style CNN under each way of storing activations: plain
fp32, actcodec's policies through the hooks and through the module converter, the naive
eager-torch quantizer through the same hooks, and torch.utils.checkpoint. Step times are
medians of interleaved rounds (a fresh order each round) on the same batch; ratios to fp32 are
the claim, both of the medians and per round (with quartiles); saved bytes are exact (unique
storages autograd keeps).

    python -m actcodec.torch.stepbench [--batch 64] [--size 64] [--rounds 5]
"""
from __future__ import annotations

import argparse
import copy
import random
import statistics
import time

import torch
from torch import nn
from torch.utils.checkpoint import checkpoint

from ..benchmark import torch_eager_dequantize, torch_eager_quantize
from .convert import convert
from .hooks import Kept, compress_saved
from .models import ResNet18
from .policy import Policy


class SavedBytes:
    """Counts the unique bytes autograd keeps for backward through whatever pack/unpack it
    wraps: tensors by storage (parameters excluded), Packed and other objects by their
    payload. Use as a context manager around the forward pass."""

    def __init__(self, pack=None, unpack=None):
        self.nbytes = 0
        self._seen: set = set()
        self._pack, self._unpack = pack or (lambda t: t), unpack or (lambda p: p)
        self._hooks = torch.autograd.graph.saved_tensors_hooks(self._count, self._unpack)

    def _count(self, t):
        out = self._pack(t)
        if isinstance(out, Kept):  # the hooks kept the tensor as it is
            out = out.tensor
        if isinstance(out, torch.Tensor):
            if isinstance(out, nn.Parameter) or (out.is_leaf and out.requires_grad):
                return out
            key = out.untyped_storage().data_ptr()
            size = out.untyped_storage().nbytes()
        else:
            key = id(out)
            size = payload_nbytes(out)
        if key not in self._seen:
            self._seen.add(key)
            self.nbytes += size
        return out

    def __enter__(self):
        self._hooks.__enter__()
        return self

    def __exit__(self, *exc):
        return self._hooks.__exit__(*exc)


def payload_nbytes(obj) -> int:
    if hasattr(obj, "payload"):  # a Packed
        return obj.nbytes
    return sum(t.numel() * t.element_size() for t in obj if isinstance(t, torch.Tensor))


def naive_hooks(bits: int, group: int = 256, min_bytes: int = 16 * 1024):
    """The naive way: every saved float tensor through eager-torch per-group min-max
    quantization (padded to whole groups), restored the same way in backward."""
    def pack(t):
        if (t.is_leaf and t.requires_grad) or not t.is_floating_point() or \
                t.numel() * t.element_size() < min_bytes:
            return t
        flat = t.detach().reshape(-1)
        pad = (-flat.numel()) % group
        if pad:
            flat = torch.cat([flat, flat.new_zeros(pad)])
        packed, mn, scale = torch_eager_quantize(flat, bits, group)
        return (packed, mn, scale, t.shape, t.numel())

    def unpack(p):
        if isinstance(p, torch.Tensor):
            return p
        packed, mn, scale, shape, n = p
        return torch_eager_dequantize(packed, mn, scale, bits, group)[:n].view(shape)
    return pack, unpack


class Checkpointed(nn.Module):
    """The model with each residual block recomputed in backward (non-reentrant)."""

    def __init__(self, model: ResNet18):
        super().__init__()
        self.model = model

    def forward(self, x):
        m = self.model
        x = m.stem(x)
        for block in m.blocks:
            x = checkpoint(block, x, use_reentrant=False)
        return m.fc(torch.flatten(m.pool(x), 1))


def configs(model):
    """name -> (module to run, context factory or None, pack/unpack for the byte count)."""
    ckpt = Checkpointed(model)
    out = {"fp32": (model, None, None)}
    for name in ("8bit", "2bit"):
        pol = Policy.preset(name)
        out[f"actcodec {name}"] = (model, lambda pol=pol: compress_saved(pol, model=model),
                                   "hooks")
    for name in ("8bit", "2bit"):
        converted = convert(copy.deepcopy(model), Policy.preset(name))
        out[f"convert {name}"] = (converted, None, None)
    for bits in (8, 2):
        out[f"naive torch {bits}-bit"] = (model, lambda b=bits: _naive_ctx(b), naive_hooks(bits))
    out["checkpoint"] = (ckpt, None, None)
    return out


def _naive_ctx(bits):
    return torch.autograd.graph.saved_tensors_hooks(*naive_hooks(bits))


def step(module, ctx_factory, x, y, opt):
    opt.zero_grad(set_to_none=True)
    if ctx_factory is None:
        loss = nn.functional.cross_entropy(module(x), y)
    else:
        with ctx_factory():
            loss = nn.functional.cross_entropy(module(x), y)
    loss.backward()
    opt.step()


def saved_bytes(module, ctx_factory, how, x) -> int:
    """Exact unique bytes held for backward by one forward pass of this configuration."""
    if how == "hooks":  # count what the hooks return: payloads, and the tensors they keep
        ctx = ctx_factory()
        with ctx, SavedBytes(ctx._pack, ctx._unpack) as counter:
            module(x)
        return counter.nbytes
    pack, unpack = how if how else (None, None)
    with SavedBytes(pack, unpack) as counter:
        module(x)
    return counter.nbytes


def run(batch: int = 64, size: int = 64, rounds: int = 5, threads: int = 2,
        names: list | None = None) -> list[dict]:
    torch.set_num_threads(threads)
    torch.manual_seed(0)
    model = ResNet18()
    x, y = torch.randn(batch, 3, size, size), torch.randint(0, 10, (batch,))
    opt = torch.optim.SGD(model.parameters(), lr=0.0)  # lr 0: every round sees the same model
    cands = configs(model)
    if names:
        cands = {k: v for k, v in cands.items() if k in names}
    times = {k: [] for k in cands}
    for k, (module, ctx, _) in cands.items():  # warm-up
        step(module, ctx, x, y, opt)
    order, rng = list(cands), random.Random(0)
    for _ in range(rounds):
        rng.shuffle(order)  # no configuration always runs right after another
        for k in order:
            module, ctx, _ = cands[k]
            t0 = time.perf_counter()
            step(module, ctx, x, y, opt)
            times[k].append(time.perf_counter() - t0)
    rows = []
    base_t = statistics.median(times["fp32"]) if "fp32" in times else None
    sizes = {k: saved_bytes(m, c, how, x) for k, (m, c, how) in cands.items()}
    base_b = sizes.get("fp32")
    for k in cands:
        t = statistics.median(times[k])
        # Each round's step over fp32's step in the same round: the machine's slow spells
        # hit both, so these spread less than the step times themselves.
        ratios = ([a / b for a, b in zip(times[k], times["fp32"])] if base_t else [])
        q1, q3 = _quartiles(ratios)
        rows.append({"config": k, "step_ms": t * 1e3,
                     "time_vs_fp32": t / base_t if base_t else None,
                     "round_ratio": statistics.median(ratios) if ratios else None,
                     "round_ratio_q1": q1, "round_ratio_q3": q3,
                     "saved_MiB": sizes[k] / 2**20,
                     "smaller_than_fp32": base_b / sizes[k] if base_b and sizes[k] else None})
    return rows


def _quartiles(values: list) -> tuple:
    if not values:
        return None, None
    if len(values) == 1:
        return values[0], values[0]
    q = statistics.quantiles(values, n=4, method="inclusive")  # within the data
    return q[0], q[2]


def markdown(rows, batch, size, threads) -> str:
    lines = [f"ResNet-18-style CNN, batch {batch}, 3x{size}x{size}, {threads} threads, "
             f"medians of interleaved rounds",
             "", "| config | step ms | step / fp32 | per-round ratio (quartiles) | saved MiB | "
             "fp32 / saved |", "|---|---|---|---|---|---|"]
    for r in rows:
        rr = (f"{r['round_ratio']:.2f} ({r['round_ratio_q1']:.2f}-{r['round_ratio_q3']:.2f})"
              if r["round_ratio"] is not None else "-")
        vs = f"{r['time_vs_fp32']:.2f}" if r["time_vs_fp32"] is not None else "-"
        smaller = (f"{r['smaller_than_fp32']:.1f}x" if r["smaller_than_fp32"] is not None
                   else "-")
        lines.append(f"| {r['config']} | {r['step_ms']:.0f} | {vs} | {rr} | "
                     f"{r['saved_MiB']:.1f} | {smaller} |")
    return "\n".join(lines)


def main(argv=None):
    ap = argparse.ArgumentParser(prog="python -m actcodec.torch.stepbench",
                                 description=__doc__.split("\n\n")[0])
    ap.add_argument("--batch", type=int, default=64)
    ap.add_argument("--size", type=int, default=64)
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--configs", default="", help="comma list of config names (default all)")
    a = ap.parse_args(argv)
    names = [n.strip() for n in a.configs.split(",") if n.strip()] or None
    rows = run(a.batch, a.size, a.rounds, a.threads, names)
    print(markdown(rows, a.batch, a.size, a.threads))


if __name__ == "__main__":
    main()
