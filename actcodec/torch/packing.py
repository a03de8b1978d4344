"""One saved tensor as the hooks and the Functions keep it: `Packed`, an encoding (an
actcodec `Encoded` whose buffers are uint8 tensors on the tensor's device) or the tensor kept
as it is, plus how many saves share it and the layout that restores it (actcodec.torch.layout).

Kept as they are: what the policy says to keep, tensors no codec takes (complex, integers that
do not narrow), tensors whose elements overlap in memory, and dense tensors under a lossless
policy (a copy would hold the same bytes). Integer tensors (max-pool indices) are kept in the
smallest integer type that holds their values; bool masks, and float tensors whose nonzero
elements are one value, take 1 bit per element (the mask codec).
"""
from __future__ import annotations

import time
from dataclasses import dataclass, replace

import torch

from .. import choice, quant
from .. import store as stores
from . import accounting
from . import layout as layouts
from . import tensors

DEFAULT_STORE = "default"  # the process's store (actcodec.store.default())


def _scratch(nbytes: int):
    """Worst-case encode buffers, from torch's allocator (a store of its own when
    actcodec.torch.allocator is installed): short-lived, like the ops' own tensors."""
    return torch.empty(nbytes, dtype=torch.uint8).numpy()


def store_of(store):
    """The Store a `store=` argument names: the default one, a given one, or None (heap)."""
    return stores.default() if store == DEFAULT_STORE else store

FLOATS = (torch.float16, torch.bfloat16, torch.float32, torch.float64)
_NARROWER = {torch.int64: (torch.int8, torch.int16, torch.int32),
             torch.int32: (torch.int8, torch.int16), torch.int16: (torch.int8,)}


@dataclass(frozen=True)
class Setting:
    """How to store one tensor. codec: "auto" (the smallest that `bits` allows), "raw",
    "bitmap", "mask", "quant", "bitmap_quant", or "keep" (store it uncompressed).
    bits=None: lossless. threads: codec threads (None: torch.get_num_threads())."""

    codec: str = "auto"
    bits: int | None = 8
    group_size: int | None = 256
    rounding: str = "nearest"
    seed: int = 0
    threads: int | None = None

    def __post_init__(self):
        if self.codec != "keep":
            choice.check(self.codec, self.bits, self.group_size, self.rounding, "raise",
                         self.seed % 2**64, 0.0)
        elif self.bits is not None:
            quant.check_params(self.bits, self.group_size, self.rounding, "raise",
                               self.seed % 2**64)

    def codec_kwargs(self) -> dict:
        if self.bits is None:
            return {}
        return {"bits": self.bits, "group_size": self.group_size, "rounding": self.rounding,
                "seed": self.seed % 2**64}

    def thread_count(self) -> int:
        return self.threads if self.threads is not None else max(1, torch.get_num_threads())


LOSSLESS = Setting(bits=None)
KEEP = Setting(codec="keep", bits=None)


class Packed:
    """A saved tensor: `enc` (an Encoded) and its `layout`, or `kept` (the tensor itself, or
    narrowed to a smaller integer type) with the version it had when saved."""

    __slots__ = ("enc", "layout", "kept", "version", "original_nbytes", "threads", "uses",
                 "on_decode", "_pending", "_decoded", "spill", "lock", "__weakref__")

    def __init__(self, enc=None, layout=None, kept=None, original_nbytes=0, threads=1):
        self.enc, self.layout, self.kept = enc, layout, kept
        self.version = kept._version if kept is not None else None
        self.original_nbytes, self.threads = original_nbytes, threads
        # Saves that hold this Packed (the hooks count a tensor several ops save), and how
        # many of them the current backward has still to unpack: the decoded tensor is kept
        # for those, so a ReLU output that the ReLU and the next convolution both saved is
        # decoded once per backward, and dropped with its last use. (A backward that skips
        # some of the uses, torch.autograd.grad on part of a graph, leaves the copy held
        # until the next unpack or until the graph is freed: memory, never wrong values.)
        self.uses, self._pending, self._decoded, self.on_decode = 1, 0, None, None
        # Under a budget (actcodec.torch.budget): the payload paged out, as (spill file,
        # where, the Encoded without buffers or a narrowed tensor's (dtype, shape)), and the
        # lock a budget change takes to re-encode or page it out while backward restores it.
        self.spill, self.lock = None, None

    @property
    def codec(self) -> str:
        if self.enc is not None:
            return self.enc.codec
        return "keep" if self.layout is None else str(self.kept.dtype).removeprefix("torch.")

    @property
    def nbytes(self) -> int:
        """Exact bytes held in memory: the payload buffers, or the kept tensor's elements (0
        once paged out)."""
        if self.spill is not None:
            return 0
        if self.enc is not None:
            return self.enc.nbytes
        return self.kept.numel() * self.kept.element_size()

    @property
    def is_kept(self) -> bool:
        return self.enc is None and self.layout is None

    def tensors(self) -> tuple:
        """What autograd should hold: the payload buffers, or the kept tensor."""
        return self.enc.buffers if self.enc is not None else (self.kept,)

    def with_tensors(self, saved) -> "Packed":
        """The same Packed over the tensors autograd gave back (Functions' backward)."""
        out = Packed(None, self.layout, None, self.original_nbytes, self.threads)
        if self.enc is not None:
            out.enc = replace(self.enc, buffers=tuple(saved))
        else:
            out.kept, out.version = saved[0], None  # autograd checks its own versions
        out.on_decode = self.on_decode
        return out

    def unpack(self) -> torch.Tensor:
        if self._pending <= 0:  # the first use in this backward
            self._pending = self.uses
        self._pending -= 1
        out = self._decoded
        if out is None:
            t0 = time.perf_counter()
            out = self._restore()
            if self.on_decode is not None:
                self.on_decode(time.perf_counter() - t0)
        self._decoded = out if self._pending > 0 else None
        return out

    def _restore(self) -> torch.Tensor:
        if self.lock is None:
            return self._restore_now()
        with self.lock:
            return self._restore_now()

    def _restore_now(self) -> torch.Tensor:
        enc, kept = self.enc, self.kept
        if self.spill is not None:
            spill, where, template = self.spill
            data = spill.read(where)
            if isinstance(template, tuple):  # a narrowed integer tensor: (dtype, shape)
                kept = data[0].view(template[0]).reshape(template[1])
            else:
                enc = replace(template, buffers=tuple(data))
        if enc is None:
            t = kept
            if self.version is not None and t._version != self.version:
                raise RuntimeError(
                    f"one of the variables needed for gradient computation has been modified "
                    f"by an inplace operation: [{t.dtype} {list(t.shape)}] is at version "
                    f"{t._version}; expected version {self.version} instead (a tensor "
                    f"actcodec kept uncompressed; plain PyTorch raises the same error)")
            return t if self.layout is None else t.to(self.layout.dtype)
        return layouts.restore(self.layout, lambda dest: tensors.decode(
            enc, out=dest, threads=self.threads))


def keep(t: torch.Tensor) -> Packed:
    return Packed(kept=t, original_nbytes=t.numel() * t.element_size())


def pack(t: torch.Tensor, setting: Setting, store=DEFAULT_STORE, keep_dense: bool = True) -> Packed:
    """Compress `t` as `setting` says (see the module docstring for what is kept). Payloads
    take memory from `store` (see store_of); the tensors backward decodes come from torch's
    allocator, like the ops' own (actcodec.torch.allocator serves both from a store).
    keep_dense=False: a dense tensor under a lossless setting is copied into a raw payload
    rather than kept (a budget can then page it out or re-encode it)."""
    t = t.detach()
    nbytes = t.numel() * t.element_size()
    if setting.codec == "keep" or t.is_complex() or t.is_sparse or t.is_quantized:
        return keep(t)
    if t.dtype in _NARROWER:
        return _narrow(t, nbytes, store_of(store) if t.device.type == "cpu" else None)
    if t.dtype not in FLOATS and t.dtype != torch.bool:
        return keep(t)
    captured = layouts.capture(t)
    if captured is None:
        return keep(t)
    lay, source = captured
    threads = setting.thread_count()
    store = store_of(store) if source.device.type == "cpu" else None
    enc = choice.encode(source, setting.codec, keep_raw=keep_dense, threads=threads,
                        alloc=None if store is None else stores.StoreAlloc(store, _scratch),
                        **setting.codec_kwargs())
    if enc is None:
        return keep(t)
    return Packed(enc, lay, original_nbytes=source.numel() * source.element_size(),
                  threads=threads)


def pack_mask(mask: torch.Tensor, threads: int | None = None, store=DEFAULT_STORE) -> Packed:
    """A bool tensor at 1 bit per element (ReLU and dropout masks)."""
    if mask.dtype != torch.bool:
        raise TypeError(f"pack_mask needs a bool tensor, got {mask.dtype}")
    return pack(mask, Setting(codec="mask", bits=None, threads=threads), store)


def _narrow(t: torch.Tensor, nbytes: int, store) -> Packed:
    """The smallest integer type holding every value (works on any device), in `store` when
    one is given."""
    if t.numel():
        lo, hi = (int(v) for v in torch.aminmax(t))
        for small in _NARROWER[t.dtype]:
            info = torch.iinfo(small)
            if info.min <= lo and hi <= info.max:
                lay = layouts.Layout(t, None)
                if store is None or not lay.dense:
                    narrow = t.to(small)
                else:  # same strides, as t.to would give
                    block = store.block(t.numel() * small.itemsize)
                    narrow = torch.frombuffer(block, dtype=small).as_strided(
                        t.shape, t.stride()).copy_(t)
                return Packed(kept=narrow, layout=lay, original_nbytes=nbytes)
    return keep(t)


def save(ctx, *items) -> None:
    """`ctx.save_for_backward` for a mix of Packed, tensors and None: payload tensors go to
    autograd (which frees them with the graph, and lets saved-tensor hooks and checkpointing
    see them); the rest of each Packed rides on ctx."""
    saved, slots = [], []
    acc = accounting.current()
    limit = acc.budgeted() if acc is not None else None
    for item in items:
        if limit is not None and isinstance(item, Packed) and item.lock is None and \
                not item.is_kept:  # a payload or narrowed integers: held through the budget
            limit.admit_fixed(item)
        if isinstance(item, Packed) and item.lock is not None:
            slots.append((item, 0))  # under a budget: it may be re-encoded or paged out later,
            continue                 # so ctx holds the Packed itself (counted by the budget)
        if isinstance(item, Packed):
            held = item.tensors()
            slots.append((item.with_tensors([None] * len(held)), len(held)))
            saved.extend(held)
        elif item is None:
            slots.append(None)
        else:
            slots.append((None, 1))
            saved.append(item)
    ctx.save_for_backward(*saved)
    ctx.actcodec_slots = slots
    held = [t for t in saved if t is not None and not (t.is_leaf and t.requires_grad)]
    if acc is not None and held:  # until autograd releases the saves (after backward)
        nbytes = sum(t.numel() * t.element_size() for t in held)
        if limit is not None:
            limit.reserve(nbytes)
        acc.hold(held[0], nbytes)


def load(ctx) -> list:
    """The items `save` stored, restored, in order (works for a second backward too)."""
    saved, out, i = ctx.saved_tensors, [], 0
    for slot in ctx.actcodec_slots:
        if slot is None:
            out.append(None)
            continue
        template, count = slot
        if template is not None and count == 0:  # a Packed held under a budget
            out.append(template.unpack())
            continue
        out.append(saved[i] if template is None else
                   template.with_tensors(saved[i:i + count]).unpack())
        i += count
    return out
