"""One saved tensor as actcodec keeps it for backward: `Packed`, an encoding (an actcodec
`Encoded` whose buffers are uint8 tensors on the tensor's device) or the tensor kept as it
is, with the `Layout` that restores it, how many saves share it, and (under a budget) its
re-encoding and paging out.

Kept as they are: what the policy says to keep, tensors no codec takes (complex, integers that
do not narrow), tensors whose elements overlap in memory, dense tensors under a lossless
policy (a copy would hold the same bytes), and on a device float saves under 1 MiB stored
lossless (see DEVICE_NARROW_BYTES). Integer tensors (max-pool indices) are kept in the
smallest integer type that holds their values; bool masks, and float tensors whose nonzero
elements are one value, take 1 bit per element (the mask codec).

Layouts: saved tensors come back as they were saved: shape, strides (so memory format:
channels_last, transposes, slices of a wider tensor), dtype, the address's alignment within 64
bytes, and broadcast (stride-0) dimensions. Kernels pick their paths from layouts, so this is
what lets lossless compression leave every gradient bit as plain PyTorch computes it. What is
encoded is the tensor's elements in memory order: with its broadcast dimensions narrowed to
one element, a tensor whose elements are dense in memory (a permutation of a contiguous one)
is encoded in place, without a copy, and decoded straight into memory laid out as the
original; a tensor with gaps (a slice) is copied once to encode and restored through a copy
into memory with the original's gaps, allocated but never read.
"""
from __future__ import annotations

import time
from dataclasses import replace

import numpy as np
import torch

from ... import _alloc, _options, encoder
from . import fused
from ...registry import CODECS
from .dtypes import BITS, NAMES, UNSIGNED
from ..save.policy import Setting

ALIGN = 64  # bytes; the CPU allocator's alignment
FLOATS = (torch.float16, torch.bfloat16, torch.float32, torch.float64)
_NARROWER = {torch.int64: (torch.int8, torch.int16, torch.int32),
             torch.int32: (torch.int8, torch.int16), torch.int16: (torch.int8,)}
# On a device, an integer save narrows from this size up: its range is a read of the device,
# which waits for all the work queued before it (token ids, labels: a few hundred KiB kept
# as they are cost less than a stall of the step; a max-pool's indices are worth it). So
# does a float save stored lossless, whose codecs' sizes need its count (attention's
# log-sum-exp, dense: a read to learn that it is kept).
DEVICE_NARROW_BYTES = 1 << 20


def scratch(nbytes: int):
    """Worst-case encode buffers, from torch's allocator (a store of its own when
    actcodec.torch.allocator is installed): short-lived, like the ops' own tensors."""
    return torch.empty(nbytes, dtype=torch.uint8).numpy()


def store_alloc(store):
    """The payload allocator of a Store (None: numpy's heap)."""
    return _alloc.HEAP if store is None else _alloc.StoreAlloc(store, scratch)


class Packed:
    """A saved tensor: `enc` (an Encoded) and its `layout`, or `kept` (the tensor itself, or
    narrowed to a smaller integer type) with the version it had when saved."""

    __slots__ = ("enc", "layout", "kept", "version", "original_nbytes", "opts", "uses",
                 "on_decode", "_pending", "_decoded", "spill", "lock", "probe", "unsettled",
                 "__weakref__")

    def __init__(self, enc=None, layout=None, kept=None, original_nbytes=0, opts=None):
        self.enc, self.layout, self.kept = enc, layout, kept
        self.version = kept._version if kept is not None else None
        self.original_nbytes, self.opts = original_nbytes, opts
        # Saves that hold this Packed (the hooks count a tensor several ops save), and how
        # many of them the current backward has still to unpack: the decoded tensor is kept
        # for those, so a ReLU output that the ReLU and the next convolution both saved is
        # decoded once per backward, and dropped with its last use. (A backward that skips
        # some of the uses, torch.autograd.grad on part of a graph, leaves the copy held
        # until the next unpack or until the graph is freed: memory, never wrong values.)
        self.uses, self._pending, self._decoded, self.on_decode = 1, 0, None, None
        # Under a budget: the payload paged out, as (spill file, where, the Encoded without
        # buffers or a narrowed tensor's (dtype, shape)), and the lock the budget's keeper
        # holds while it re-encodes or pages this out and backward restores it.
        self.spill, self.lock = None, None
        self.probe = None  # the profile step's sensitivity.Probe that watches this save
        # A device encoding whose statistics have not been read (`pack(defer=True)`): the
        # saved tensor is held until `settle` reads them.
        self.unsettled: Unsettled | None = None

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
            return sum(b.nbytes for b in self.enc.buffers)
        return self.kept.numel() * self.kept.element_size()

    @property
    def is_kept(self) -> bool:
        return self.enc is None and self.layout is None

    def tensors(self) -> tuple:
        """What autograd should hold: the payload buffers, or the kept tensor."""
        return self.enc.buffers if self.enc is not None else (self.kept,)

    def with_tensors(self, saved) -> "Packed":
        """The same Packed over the tensors autograd gave back (Functions' backward)."""
        out = Packed(None, self.layout, None, self.original_nbytes, self.opts)
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
            out = self.restore()
            if self.on_decode is not None:
                self.on_decode(time.perf_counter() - t0)
        self._decoded = out if self._pending > 0 else None
        return out

    def restore(self) -> torch.Tensor:
        """The saved tensor, decoded (or read back, or as kept)."""
        if self.lock is None:
            return self._restore_now()
        with self.lock:
            return self._restore_now()

    def settle(self) -> None:
        """A deferred device encoding made final: kept where its statistics say `encode`
        would have given the same, else encoded again from the held tensor by `encode` (its
        choice of codec, or its error for a NaN/inf); then the tensor is let go. Until it
        succeeds the encoding stays unsettled, so nothing decodes bytes that were not checked.
        Waits for the device only where the statistics have not arrived."""
        u = self.unsettled
        if u is None:
            return
        before = (self.codec, self.nbytes)
        if not u.unread.same_as_encode():
            if u.source._version != u.version:
                raise RuntimeError(
                    f"a saved [{u.source.dtype} {list(u.source.shape)}] tensor was modified "
                    f"in place before actcodec read its device encoding's statistics (plain "
                    f"PyTorch refuses such a change at backward)")
            enc = fused.encode(u.source, u.unread.codec, keep_raw=u.keep_raw, **u.kwargs)
            if enc is None:
                self.enc, self.layout, self.kept, self.version = None, None, u.t, u.t_version
            else:
                self.enc = enc
        self.unsettled = None
        if u.on_settled is not None:
            u.on_settled(self, before)

    def _restore_now(self) -> torch.Tensor:
        self.settle()
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
        return self.layout.restore(lambda dest: _decode_into(enc, dest, self.opts))

    # ---- under a budget (actcodec.torch.keeper holds the lock) ----

    def reencode(self, setting: Setting, store) -> None:
        """Encode the saved tensor again as `setting` says (fewer bits)."""
        fresh = pack(self._restore_now(), setting, store, keep_dense=False, opts=self.opts)
        self.enc, self.layout = fresh.enc, fresh.layout

    def page_out(self, spill) -> None:
        """Write the payload (or narrowed integers) to `spill` and drop it from memory."""
        self.settle()
        if self.enc is not None:
            where = spill.write(self.enc.buffers)
            self.spill, self.enc = (spill, where, replace(self.enc, buffers=())), None
        else:
            where = spill.write([self.kept.reshape(-1).view(torch.uint8)])
            self.spill = (spill, where, (self.kept.dtype, tuple(self.kept.shape)))
            self.kept, self.version = None, None  # a copy of its own: nothing else changes it

    @property
    def pageable(self) -> bool:
        """Whether paging out frees memory this alone holds, on the CPU."""
        if self.spill is not None or self.nbytes == 0:
            return False
        if self.enc is not None:
            return all(b.device.type == "cpu" for b in self.enc.buffers)
        return self.layout is not None and self.kept.device.type == "cpu" and \
            self.kept.is_contiguous()


def _decode_into(enc, dest: torch.Tensor, opts) -> None:
    """Decode `enc` into `dest`, a contiguous tensor of its dtype on its buffers' device."""
    if dest.device.type != "cpu":
        fused.route(dest).decode_into(enc, dest, enc.dtype)
        return
    out = dest.reshape(-1).view(torch.uint8).numpy() if dest.numel() else np.empty(0, np.uint8)
    buffers = tuple(b.numpy() for b in enc.buffers)
    CODECS[enc.codec].decode_into(enc, buffers, out, enc.dtype,
                                  opts if opts is not None else _options.resolve())


class Unsettled:
    """What settling a deferred encoding needs: its statistics, the saved tensor (t) and the
    elements encoded (source), their versions then, and how `encode` was to be called;
    on_settled(packed, (codec, nbytes) before), if set, is told when it has settled (the
    save session's accounting follows a save encoded again)."""

    __slots__ = ("unread", "t", "source", "version", "t_version", "kwargs", "keep_raw",
                 "on_settled")

    def __init__(self, unread, t, source, kwargs: dict, keep_raw: bool):
        self.unread, self.t, self.source, self.kwargs = unread, t, source, kwargs
        self.version, self.keep_raw = source._version, keep_raw
        self.t_version = t._version if t is not None else None  # (a copy's is its own)
        self.on_settled = None

    @property
    def nbytes(self) -> int:
        """Bytes of the tensor held until settled."""
        return self.source.numel() * self.source.element_size()


def keep(t: torch.Tensor) -> Packed:
    return Packed(kept=t, original_nbytes=t.numel() * t.element_size())


def pack(t: torch.Tensor, setting: Setting, store=None, keep_dense: bool = True,
         opts: dict | None = None, alloc=None, defer: bool = False,
         rows: fused.Rows | None = None) -> Packed:
    """Compress `t` as `setting` says (see the module docstring for what is kept). Payloads
    take memory from `store` (an actcodec Store, or None for numpy's heap; `alloc`, its
    allocator, when the caller made one); the tensors backward decodes come from torch's
    allocator, like the ops' own (actcodec.torch.allocator serves both from a store).
    keep_dense=False: a dense tensor under a lossless setting is copied into a raw payload
    rather than kept (a budget can then page it out or re-encode it). opts: the codec
    call's resolved options (default: the setting's thread count). defer: on a device whose
    kernels take it, a quant encoding is returned before its statistics are read, unsettled
    (see `Packed.settle`; the caller settles it), its statistics into `rows` where given."""
    t = t.detach()
    nbytes = t.numel() * t.element_size()
    if setting.codec == "keep" or t.is_complex() or t.is_sparse or t.is_quantized:
        return keep(t)
    if t.dtype in _NARROWER:
        if not _host_path(t) and nbytes < DEVICE_NARROW_BYTES:
            return keep(t)
        return _narrow(t, nbytes, store if t.device.type == "cpu" else None)
    if t.dtype not in FLOATS and t.dtype != torch.bool:
        return keep(t)
    if t.dtype != torch.bool and setting.bits is None and setting.codec != "mask" and \
            nbytes < DEVICE_NARROW_BYTES and not _host_path(t):
        return keep(t)
    captured = capture(t)
    if captured is None:
        return keep(t)
    lay, source = captured
    if opts is None:
        opts = _options.resolve(setting.thread_count())
    if _host_path(source):
        if source.is_neg():
            source = source.resolve_neg()
        flat = source.reshape(-1).view(BITS[source.dtype]).numpy()
        enc = encoder.encode_bits(
            flat.view(UNSIGNED[flat.itemsize]), NAMES[source.dtype], tuple(source.shape),
            setting.codec, setting.params, opts, alloc if alloc is not None else
            store_alloc(store), keep_raw=keep_dense, wrap=torch.from_numpy)
    else:
        kwargs = setting.codec_kwargs()
        unread = fused.encode_unread(source, setting.codec, rows=rows, **kwargs) \
            if defer and fused.applies(source) else None
        if unread is not None:
            packed = Packed(unread[0], lay, original_nbytes=source.numel() *
                            source.element_size(), opts=opts)
            packed.unsettled = Unsettled(unread[1], t, source, kwargs, keep_dense)
            return packed
        enc = fused.route(source).encode(source, setting.codec, keep_raw=keep_dense, **kwargs)
    if enc is None:
        return keep(t)
    return Packed(enc, lay, original_nbytes=source.numel() * source.element_size(), opts=opts)


def _host_path(t: torch.Tensor) -> bool:
    """Whether t goes to the C codecs (host memory) rather than to torch ops on its device."""
    return t.device.type == "cpu"


def _narrow(t: torch.Tensor, nbytes: int, store) -> Packed:
    """The smallest integer type holding every value (works on any device), in `store` when
    one is given."""
    if t.numel():
        lo, hi = (int(v) for v in torch.aminmax(t))
        for small in _NARROWER[t.dtype]:
            info = torch.iinfo(small)
            if info.min <= lo and hi <= info.max:
                lay = Layout(t, None)
                if store is None or not lay.dense:
                    narrow = t.to(small)
                else:  # same strides, as t.to would give
                    block = store.block(t.numel() * small.itemsize)
                    narrow = torch.frombuffer(block, dtype=small).as_strided(
                        t.shape, t.stride()).copy_(t)
                return Packed(kept=narrow, layout=lay, original_nbytes=nbytes)
    return keep(t)


class Layout:
    """How to rebuild one saved tensor (see the module docstring)."""

    __slots__ = ("shape", "stride", "dtype", "device", "align", "order", "dense", "expand",
                 "in_order")

    def __init__(self, base: torch.Tensor, expand: tuple | None):
        self.shape, self.stride = tuple(base.shape), tuple(base.stride())
        self.dtype, self.device, self.expand = base.dtype, base.device, expand
        self.align = base.data_ptr() % ALIGN
        self.order = memory_order(self.shape, self.stride)
        self.in_order = self.order == list(range(len(self.order)))  # no permutation
        self.dense = _dense(self.shape, self.stride, self.order)

    def empty(self) -> torch.Tensor:
        """Uninitialized memory laid out as the original (before any broadcast)."""
        item = self.dtype.itemsize
        if self.align == 0 or self.align % item:
            storage_offset = 0
        else:
            storage_offset = self.align // item
        span = 1 + sum((s - 1) * st for s, st in zip(self.shape, self.stride)) if all(
            self.shape) else 0
        if storage_offset == 0 and self.dense:
            return torch.empty_strided(self.shape, self.stride, dtype=self.dtype,
                                       device=self.device)
        storage = torch.empty(storage_offset + span, dtype=self.dtype, device=self.device)
        return storage.as_strided(self.shape, self.stride, storage_offset)

    def in_memory_order(self, t: torch.Tensor) -> torch.Tensor:
        """t's dimensions permuted into memory order (contiguous when t is dense)."""
        return t if self.in_order else t.permute(self.order)

    def finish(self, t: torch.Tensor) -> torch.Tensor:
        """The broadcast dimensions put back (a view, nothing copied)."""
        return t.expand(self.expand) if self.expand is not None else t

    def restore(self, fill) -> torch.Tensor:
        """A tensor laid out as this, whose elements `fill(dest)` writes into `dest`, a
        contiguous tensor in memory order (the new memory itself when the layout is dense)."""
        out = self.empty()
        ordered = self.in_memory_order(out)
        if ordered.is_contiguous():
            fill(ordered)
        else:
            dense = torch.empty(ordered.shape, dtype=self.dtype, device=self.device)
            fill(dense)
            ordered.copy_(dense)
        return self.finish(out)


def capture(t: torch.Tensor) -> tuple[Layout, torch.Tensor] | None:
    """(layout, the elements to encode as one contiguous tensor) for a saved tensor, or None
    for one whose elements overlap in memory (kept as it is). t: detached."""
    base, expand = t, None
    for d, (size, stride) in enumerate(zip(t.shape, t.stride())):
        if stride == 0 and size > 1:
            base = base.narrow(d, 0, 1)
    if base.shape != t.shape:
        expand = tuple(t.shape)
    layout = Layout(base, expand)
    if not _non_overlapping(layout.shape, layout.stride):
        return None
    source = layout.in_memory_order(base)
    if not source.is_contiguous():  # gaps between the elements: one copy
        source = source.contiguous()
    return layout, source


def memory_order(shape, stride) -> list:
    """Dimensions from the largest stride to the smallest (ties, which only size-1
    dimensions can make, in order)."""
    return sorted(range(len(shape)), key=lambda d: (-stride[d], d))


def _dense(shape, stride, order) -> bool:
    expected = 1
    for d in reversed(order):
        if shape[d] != 1 and stride[d] != expected:
            return False
        expected *= shape[d]
    return True


def _non_overlapping(shape, stride) -> bool:
    span = 0
    for size, st in sorted(((s, st) for s, st in zip(shape, stride) if s > 1),
                           key=lambda p: p[1]):
        if st <= span:
            return False
        span += st * (size - 1)
    return True
