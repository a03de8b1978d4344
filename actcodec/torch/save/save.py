"""The save path: one `SaveSession` per step does policy -> budget -> pack -> account for
every save, whether it comes from the saved-tensor hooks (compress_saved), from an autograd
Function (actcodec.torch.functions) or from the budget's keeper.

A session is found through a context variable, so threads and nested contexts stay apart:
`compress_saved` and `record` make one at each entry (each entry is a step) and make it
current in that context; Functions outside both use a bare session of their own (no
statistics, no budget). A session's module stack is its own: the module hooks of a context
push only the modules that run in the thread that entered it, so two threads training two
models in their own contexts each see their own modules.
"""
from __future__ import annotations

import contextvars
import functools
import itertools
import threading
import time
import weakref

import torch

from ... import _options
from ... import store as stores
from ..budget import sensitivity
from . import boundary, recompute
from .accounting import Row
from ..codecs.fused import Rows
from ..codecs.packed import Packed, keep, pack, store_alloc
from .policy import Policy, Setting
from .top_hooks import top_pack
from .unsettled import Window

DEFAULT_STORE = "default"  # the process's store (actcodec.store.default())
DEFAULT_POLICY = Policy()  # immutable: stochastic draws are numbered by the session
# Sessions' stochastic-rounding streams, numbered in the order sessions first need one: an id
# source, not state any result depends on beyond being distinct per step.
_STREAMS = itertools.count()
_CURRENT: contextvars.ContextVar = contextvars.ContextVar("actcodec_save_session",
                                                          default=None)


def current() -> "SaveSession | None":
    """The save session of the running context, if any."""
    return _CURRENT.get()


def store_of(store):
    """The Store a `store=` argument names: the default one, a given one, or None (heap)."""
    return stores.default() if store == DEFAULT_STORE else store


class Held:
    """Bytes one saved tensor holds for backward, as counted (see `hold`)."""

    __slots__ = ("nbytes",)

    def __init__(self):
        self.nbytes = 0


def hold(stats, owner, nbytes: int) -> Held:
    """Count nbytes in `stats` as held for backward until `owner` is garbage."""
    held = Held()
    resize(stats, held, nbytes)
    weakref.finalize(owner, resize, stats, held, 0)
    return held


def resize(stats, held: Held, nbytes: int) -> None:
    """What `held` counts is now nbytes (a payload re-encoded, paged out, or freed)."""
    with stats.lock:
        stats.stored_bytes += max(nbytes, 0) - held.nbytes
        held.nbytes = max(nbytes, 0)
        stats.peak_stored_bytes = max(stats.peak_stored_bytes, stats.stored_bytes)


class SaveSession:
    """One step's saves: the policy, the budget (a budget.Budget or None), where payloads go
    and the statistics (an Accounting or None), plus what the step needs of its own: the
    saves already made (a tensor several ops save is encoded once), the module stack, and the
    numbering of stochastic draws."""

    def __init__(self, policy: Policy | None = None, stats=None, budget=None,
                 store=DEFAULT_STORE, names: dict | None = None, guard=None):
        self.policy = policy if policy is not None else DEFAULT_POLICY
        self.stats, self.budget, self.guard = stats, budget, guard
        self.store = store_of(store)
        self.alloc = store_alloc(self.store)
        self.names = names or {}
        self.stream, self.draws = None, 0  # this step's stochastic-rounding stream, once drawn
        self.modules: list = []
        self._opts: dict = {}
        # (storage, offset, shape, strides, version, device) -> (tensor ref, packed ref)
        self._seen: dict = {}
        self._kept: dict = {}  # same key -> packed ref
        self._token, self._thread = None, None
        self.unsettled = Window()  # device saves whose statistics are on the way
        self.rows = Rows()  # where their statistics go
        self._recomputing: dict = {}  # id(activation module) -> its inputs (save.recompute)

    # ---- entering and leaving ----

    def __enter__(self) -> "SaveSession":
        self._token = _CURRENT.set(self)
        self._thread = threading.get_ident()
        self.options(max(1, torch.get_num_threads()))  # resolved once, before any save
        return self

    def __exit__(self, *exc) -> None:
        try:
            if not (exc and exc[0] is not None):
                self.unsettled.settle_all()  # a NaN/inf in a save raises as the forward ends
        finally:
            self.unsettled.drop()  # what a failed step left unsettled is its garbage
            _CURRENT.reset(self._token)
            self._token = None
            self._seen.clear()
            self._kept.clear()
            self._recomputing.clear()
            self.modules = []

    def enter_module(self, module, args):
        if threading.get_ident() != self._thread:  # the module hooks are process-wide
            return None
        self.modules.append(module)
        if recompute.eligible(module, args) and self._hooks_are_ours():
            self._recomputing.setdefault(id(module), []).append(args[0])
            return (args[0].detach(),)  # its forward saves nothing (actcodec.torch.save.recompute)
        return None

    def leave_module(self, module, args, output):
        if threading.get_ident() != self._thread:
            return None
        replaced = None
        try:
            inputs = self._recomputing.get(id(module))
            if inputs:  # (the layer is still this module's while its input is saved)
                x = inputs.pop()
                if not inputs:
                    del self._recomputing[id(module)]
                if isinstance(output, torch.Tensor) and not output.requires_grad and \
                        output._base is None:
                    replaced = recompute.attach(x, output, module)
                elif output is not None:  # not a tensor of its own: again, with grad
                    replaced = module.forward(x)
        finally:
            if self.modules and self.modules[-1] is module:
                self.modules.pop()
        return replaced

    def _hooks_are_ours(self) -> bool:
        """Whether a save now would come to this session's pack_hook (not to a checkpoint's
        region, a profile's, or hooks torch cannot name)."""
        return top_pack() == self.pack_hook

    # ---- the one save path ----

    def active_budget(self):
        """The budget saves go through now, or None (none given, or set to None since)."""
        return active(self.budget)

    def options(self, threads: int) -> dict:
        """The codec options for a thread count (checked once per session and count)."""
        opts = self._opts.get(threads)
        if opts is None:
            opts = self._opts[threads] = _options.resolve(threads)
        return opts

    def setting(self, policy: Policy, op: str, layer, nbytes: int) -> Setting:
        """The policy's setting for this save. Stochastic rounding gets a stream per step
        (per session: `_STREAMS` numbers them, mixed with torch's initial seed, so a run
        repeats under torch.manual_seed and torch's generator is never consumed) and a seed
        per save within it."""
        if policy.rounding == "stochastic" or policy.overrides:
            if self.stream is None:
                self.stream = torch.initial_seed() * 2**20 + next(_STREAMS)
            self.draws += 1
            return policy.setting(op, layer, nbytes, (self.stream, self.draws))
        return policy.setting(op, layer, nbytes)

    def save(self, t: torch.Tensor, op: str, layer=None, policy: Policy | None = None,
             setting: Setting | None = None, held: bool = True,
             defer: bool = False) -> Packed:
        """t stored as the policy says for this op and layer (or as the budget plans it),
        recorded, and held: counted until it is garbage (held=False: the caller holds it,
        as `save_for_backward` does for what autograd keeps; under a budget it is held
        through the budget either way). defer: in an entered session with no budget and no
        guard measuring, a device save need not wait for its statistics (`unsettled`)."""
        nbytes = t.numel() * t.element_size()
        if setting is None:
            setting = self.setting(policy if policy is not None else self.policy, op, layer,
                                   nbytes)
        budget = self.active_budget()
        site = None
        pol = policy if policy is not None else self.policy
        exact = setting.bits is None and op in getattr(pol, "exact", ())
        fixed = setting.codec in ("keep", "mask")  # nothing a plan or the guard would change
        if budget is not None and not fixed and not exact:
            setting, site = budget.setting_for(op, layer, t, setting)  # (exact: never lossy)
        elif budget is None and self.guard is not None and setting.bits is not None and \
                not fixed:
            setting, site = self.guard.setting_for(op, layer, t, setting)
        defer = defer and budget is None and self._token is not None and \
            (self.guard is None or self.guard.probe is None)
        t0 = time.perf_counter()
        packed = pack(t, setting, self.store, keep_dense=budget is None,
                      opts=self.options(setting.thread_count()), alloc=self.alloc,
                      defer=defer, rows=self.rows)
        packed = self.adopt(packed, op, layer, time.perf_counter() - t0, t, setting, site,
                            held)
        if packed.unsettled is not None:
            self.unsettled.add(packed)
        return packed

    def adopt(self, packed: Packed, op: str, layer, seconds: float, t=None, setting=None,
              site=None, held: bool = False) -> Packed:
        """Record a save packed for this session and admit it to the budget (held: count it
        as held until it is garbage): what `save` made, or what a Function packed itself.
        Kept tensors are held where they are kept (`save_for_backward`, `_keep`)."""
        if packed.is_kept:
            if self.stats is not None:
                self.stats.kept += 1
            return packed
        row = self._record(packed, op, layer, seconds)
        budget = self.active_budget()
        if budget is not None:
            if packed.enc is None or site is None:
                budget.admit_fixed(packed)
            else:
                budget.admit(t, packed, setting, op, site, self.store)
            return packed
        if site is not None and self.guard is not None:
            self.guard.admit(t, packed, op, site)
        if held and self.stats is not None:
            counted = hold(self.stats, packed, packed.nbytes)
            if packed.unsettled is not None:
                packed.unsettled.on_settled = functools.partial(self._settled, row, counted)
        return packed

    def _settled(self, row: Row, counted: Held, packed: Packed, before: tuple) -> None:
        """An unsettled save settled; where it was encoded again, its row and count follow."""
        codec, nbytes = before
        if (packed.codec, packed.nbytes) == before:
            return
        row.compressed_bytes += packed.nbytes - nbytes
        row.codecs[codec] -= 1
        if not row.codecs[codec]:
            del row.codecs[codec]
        row.codecs[packed.codec] = row.codecs.get(packed.codec, 0) + 1
        resize(self.stats, counted, packed.nbytes)

    def save_mask(self, mask: torch.Tensor, op: str, layer=None,
                  policy: Policy | None = None) -> Packed:
        """A bool mask at 1 bit per element, whatever the policy."""
        threads = (policy if policy is not None else self.policy).threads
        return self.save(mask, op, layer, setting=Setting(codec="mask", bits=None,
                                                          threads=threads), held=False)

    def _record(self, packed: Packed, op: str, layer, seconds: float):
        """One unique compressed tensor in the statistics (its Row, or None without them);
        its decodes are timed there too."""
        if self.stats is None:
            return None
        key = (layer or "-", op)
        row = self.stats.rows.get(key)
        if row is None:
            row = self.stats.rows[key] = Row(*key)
        row.tensors += 1
        row.original_bytes += packed.original_nbytes
        row.compressed_bytes += packed.nbytes
        row.encode_seconds += seconds
        row.codecs[packed.codec] = row.codecs.get(packed.codec, 0) + 1

        def on_decode(dt, row=row):
            row.decode_seconds += dt
        packed.on_decode = on_decode
        return row

    def hold_as_is(self, owner, nbytes: int) -> None:
        """nbytes about to be held as they are until `owner` is garbage: within the budget
        (room is made for them) and counted."""
        budget = self.active_budget()
        if budget is not None:
            budget.reserve(nbytes)
        if self.stats is not None:
            hold(self.stats, owner, nbytes)

    # ---- the saved-tensor hooks ----

    def pack_hook(self, t: torch.Tensor):
        packed = self._pack(t)
        probe = self.probe()
        if probe is not None and packed.probe is None:
            probe.seen(packed)  # whichever save backward unpacks first starts it
        return packed

    def probe(self):
        """This step's sensitivity.Probe, if it profiles: the budget's, else the guard's."""
        budget = self.active_budget()
        owner = budget if budget is not None else self.guard
        return owner.probe if owner is not None else None

    def _pack(self, t: torch.Tensor):
        if _is_parameter(t) or (t._base is not None and _is_parameter(t._base)):
            # a parameter, or a view of one (linear's transposed weight): held by the model,
            # not for backward
            if self.stats is not None:
                self.stats.kept += 1
            return keep(t if t.is_leaf else t.detach())
        nbytes = t.numel() * t.element_size()
        if nbytes < self.policy.min_bytes:  # what policy.setting would say, without lookups
            return self._keep(t)
        edges = boundary.bounds(self.modules[-1]) if self.modules else None
        if edges is not None:  # never shared: another op saving t reads its values
            packed = self._save_comparison(t, edges)
            if packed is not None:
                return packed
        key = (t.untyped_storage().data_ptr(), t.storage_offset(), tuple(t.shape),
               tuple(t.stride()), t._version, t.device)
        hit = self._seen.get(key)
        if hit is not None:
            tensor_ref, packed_ref = hit
            packed = packed_ref()
            if tensor_ref() is not None and packed is not None:  # the same live tensor
                self.stats.deduplicated += 1
                packed.uses += 1
                return packed
        op, layer = self._where(t, clamp=edges is not None)
        packed = self.save(t, op, layer, defer=True)
        if packed.is_kept:  # counted as kept by save; held here
            return self._keep(t, packed, counted=True)
        self._seen[key] = (weakref.ref(t), weakref.ref(packed))
        return packed

    def _save_comparison(self, t: torch.Tensor, edges) -> Packed | None:
        """A save read only as lo < t < hi, stored as that comparison (actcodec.torch.save.
        boundary), or None where the policy keeps it as it is or the dtype cannot."""
        module = self.modules[-1]
        layer = self.names.get(id(module), type(module).__name__)
        setting = self.setting(self.policy, "clamp", layer, t.numel() * t.element_size())
        if setting.codec == "keep":
            return None
        compared = boundary.as_comparison(t.detach(), *edges)
        if compared is None:
            return None
        packed = self.save(compared, "clamp", layer,
                           setting=Setting(codec="mask", bits=None, threads=setting.threads))
        return self._keep(compared, packed, counted=True) if packed.is_kept else packed

    @staticmethod
    def unpack_hook(packed):
        if not isinstance(packed, Packed):
            return packed
        again = sensitivity.AGAIN.get()
        if again is not None:  # a node called again to measure a save's gain
            return again[0].value(packed)
        out = packed.unpack()
        if packed.probe is not None:
            packed.probe.unpacked(packed)
        return out

    def _where(self, t: torch.Tensor, clamp: bool = False) -> tuple[str, str | None]:
        """(op kind, layer name) of the save happening now (`clamp`: inside a module whose
        op compares the save with two constants, actcodec.torch.save.boundary)."""
        module = self.modules[-1] if self.modules else None
        layer = None
        if module is not None:
            layer = self.names.get(id(module), type(module).__name__)
        producer = type(t.grad_fn).__name__ if t.grad_fn is not None else ""
        if "Softmax" in producer:
            return "softmax", layer
        if clamp:
            return "clamp", layer
        if module is not None and type(module).__name__ in MODULE_OPS:
            return MODULE_OPS[type(module).__name__], layer
        if producer.startswith("Relu"):  # a functional relu's output
            return "relu", layer
        if t.grad_fn is None:
            return "input", layer
        if module is not None and type(module).__name__.endswith("Attention"):
            # inside an attention module, outside its projections (modules of their own):
            # the queries, keys, values and output attention's backward reads
            return "attention", layer
        return "other", layer

    def _keep(self, t: torch.Tensor, packed: Packed | None = None,
              counted: bool = False) -> Packed:
        """The tensor as it is, with its version at save time: autograd checks the versions
        of what it saves itself, not of what a pack hook returns; without this, an in-place
        change between forward and backward that plain PyTorch refuses would give wrong
        gradients silently. Its bytes count as held: the stretch of its storage it reaches (a
        view of a larger storage, such as a batch sliced from a dataset, holds no more)."""
        if not counted:
            self.stats.kept += 1
        key = (t.untyped_storage().data_ptr(), t.storage_offset(), tuple(t.shape),
               tuple(t.stride()), t._version, t.device)
        hit = self._kept.get(key)
        if hit is not None and hit() is not None:
            return hit()  # the same storage kept already (by save or here): held once
        # Detached: an op's output kept by its own node would otherwise form a reference cycle
        # through autograd's C++ objects, and a graph that never runs backward would leak.
        packed = packed if packed is not None else keep(t.detach())
        self._kept[key] = weakref.ref(packed)
        self.hold_as_is(packed, min(t.untyped_storage().nbytes(), _span(t) * t.element_size()))
        return packed

    # ---- autograd Functions' ctx ----

    def save_for_backward(self, ctx, *items) -> None:
        """`ctx.save_for_backward` for a mix of Packed, tensors and None: payload tensors go
        to autograd (which frees them with the graph, and lets saved-tensor hooks and
        checkpointing see them); the rest of each Packed rides on ctx. Under a budget a
        Packed rides on ctx whole, so the keeper can re-encode or page it out later."""
        saved, slots = [], []
        for item in items:
            if isinstance(item, Packed):
                item.settle()  # its buffers are final before autograd holds them
            if isinstance(item, Packed) and item.lock is not None:
                slots.append((item, 0))  # held through the budget
            elif isinstance(item, Packed):
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
        if held:  # until autograd releases the saves (after backward)
            self.hold_as_is(held[0], sum(t.numel() * t.element_size() for t in held))


def active(budget):
    """`budget` where it holds a number of bytes, else None."""
    return budget if budget is not None and budget.nbytes is not None else None


def begin_step(stats, budget):
    """A step of a context begins: its statistics start afresh and its budget plans; the
    budget saves go through this step (or None)."""
    budget = active(budget)
    stats.new_step(None if budget is None else budget.nbytes)
    if budget is not None:
        budget.new_step()
    return budget


def load(ctx) -> list:
    """The items `save_for_backward` stored, restored, in order (a second backward too)."""
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


def session() -> SaveSession:
    """The running context's session, or a bare one (no statistics, no budget)."""
    s = _CURRENT.get()
    return s if s is not None else SaveSession(store=DEFAULT_STORE)


MODULE_OPS = {
    nn_cls: op for op, classes in {
        "linear": ("Linear", "Bilinear"),
        "conv": ("Conv1d", "Conv2d", "Conv3d", "ConvTranspose1d", "ConvTranspose2d"),
        "batch_norm": ("BatchNorm1d", "BatchNorm2d", "BatchNorm3d", "SyncBatchNorm"),
        "layer_norm": ("LayerNorm", "RMSNorm"),
        "group_norm": ("GroupNorm", "InstanceNorm1d", "InstanceNorm2d"),
        "relu": ("ReLU",), "gelu": ("GELU",), "silu": ("SiLU",),
        "max_pool": ("MaxPool1d", "MaxPool2d"), "avg_pool": ("AvgPool1d", "AvgPool2d"),
        "dropout": ("Dropout", "Dropout1d", "Dropout2d"), "softmax": ("Softmax",),
    }.items() for nn_cls in classes
}


def _is_parameter(t: torch.Tensor) -> bool:
    return (t.is_leaf and t.requires_grad) or isinstance(t, torch.nn.Parameter)


def _span(t: torch.Tensor) -> int:
    """Elements of its storage that t reaches, from its first to its last."""
    if t.numel() == 0:
        return 0
    return 1 + sum((n - 1) * abs(s) for n, s in zip(t.shape, t.stride()))
