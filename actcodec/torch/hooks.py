"""A context that compresses every activation autograd saves, for any model, through the
public `torch.autograd.graph.saved_tensors_hooks`.

Kept as they are: parameters (leaf tensors that require grad) and tensors smaller than the
policy's `min_bytes`. Integer tensors (max-pool indices) are stored exactly in the smallest
integer type that holds their values. bool tensors and float tensors whose nonzero elements
all have one value (CPU dropout's scaled masks, 0/1 masks) are stored at 1 bit per element plus
that value, exactly. A tensor saved by several ops (same storage, offset, shape, strides and
version) is encoded once, with the setting of the first op that saved it; the encoding is
freed when the last op that saved it is done.

Which op saved a tensor is inferred from the innermost nn module running at that moment
(LayerNorm, BatchNorm, Linear, ...), from the autograd node that produced it (a softmax output
is "softmax") and from whether it has a producer at all (the model's input is "input"); the
policy uses it for its sensitive-op rule and its overrides. Layer names come from
`model.named_modules()` when `model` is given, else from the module's class.

Non-reentrant `torch.utils.checkpoint` installs hooks of its own inside its region, so tensors
saved there are recomputed rather than compressed; the checkpoint's own inputs, saved outside,
are compressed.
"""
from __future__ import annotations

import time
import weakref

import torch

from .. import store as stores
from . import accounting, packing
from . import budget as budgets
from .policy import Policy

# innermost module class -> op kind (the op that is saving)
_MODULE_OPS = {
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


class compress_saved:
    """Context manager: `with compress_saved(Policy.preset("4bit")): loss = model(x)`.

    Each entry starts a new step of the policy (fresh stochastic-rounding draws). `.stats` is
    the step's `Accounting`: per-layer rows, totals and a printable `table()`. Payloads live
    in `store` (actcodec.store; the process's activation store by default, None for numpy's
    heap).

    budget (bytes, or a string such as "256MiB"): what the step holds for backward never
    exceeds it; the bits of each save are planned from the steps before (enter the same
    context every step), and what does not fit is re-encoded at fewer bits or paged out to a
    temporary file in `spill_dir` (actcodec.torch.budget); 0 pages every save out. Without a
    policy, 8 bits in groups of 64."""

    def __init__(self, policy: Policy | None = None, *, model: torch.nn.Module | None = None,
                 store=packing.DEFAULT_STORE, budget=None, spill_dir: str | None = None,
                 **policy_kwargs):
        if policy is not None and policy_kwargs:
            raise TypeError("pass a Policy or policy keywords, not both")
        if policy is None and budget is not None:
            policy_kwargs = {**budgets.POLICY, **policy_kwargs}
        self.policy = policy if policy is not None else Policy(**policy_kwargs)
        self.store = packing.store_of(store)
        self.stats = accounting.Accounting(self.store, budget, spill_dir)
        self._names = ({id(m): n or type(m).__name__ for n, m in model.named_modules()}
                       if model is not None else {})
        self._stack: list = []
        # (storage, offset, shape, stride, version, device) -> (tensor ref, packed ref)
        self._seen: dict = {}
        self._kept: dict = {}  # (storage, offset, shape, strides, version, device) -> packed ref
        self._handles: list = []
        self._hooks = torch.autograd.graph.saved_tensors_hooks(self._pack, self._unpack)
        self._record = None  # accounting.record(self.stats), while inside

    @property
    def budget(self) -> int | None:
        """Bytes the step may hold for backward (None: no budget). Settable between steps and
        from another thread during one: what is held is made to fit at once."""
        return None if self.stats.limit is None else self.stats.limit.nbytes

    @budget.setter
    def budget(self, value) -> None:
        if self.stats.limit is None:
            self.stats.limit = budgets.Budget(self.stats, value)
        else:
            self.stats.limit.set(value)

    def __enter__(self):
        if self.stats.budgeted() is not None:
            self.stats.budgeted().new_step()
        self.policy.next_step()
        stores.new_step(self.store)  # what the steps before no longer need goes back
        reg = torch.nn.modules.module
        self._handles = [reg.register_module_forward_pre_hook(self._enter_module),
                         reg.register_module_forward_hook(self._leave_module, always_call=True)]
        self._record = accounting.record(self.stats)
        self._record.__enter__()
        self._hooks.__enter__()
        return self

    def __exit__(self, *exc):
        for h in self._handles:
            h.remove()
        self._handles, self._stack = [], []
        self._seen.clear()
        self._kept.clear()
        self._record.__exit__(*exc)
        return self._hooks.__exit__(*exc)

    def _enter_module(self, module, args):
        self._stack.append(module)

    def _leave_module(self, module, args, output):
        if self._stack and self._stack[-1] is module:
            self._stack.pop()

    def _where(self, t: torch.Tensor) -> tuple[str, str | None]:
        """(op kind, layer name) of the save happening now."""
        module = self._stack[-1] if self._stack else None
        layer = None
        if module is not None:
            layer = self._names.get(id(module), type(module).__name__)
        producer = type(t.grad_fn).__name__ if t.grad_fn is not None else ""
        if "Softmax" in producer:
            return "softmax", layer
        if module is not None and type(module).__name__ in _MODULE_OPS:
            return _MODULE_OPS[type(module).__name__], layer
        if t.grad_fn is None:
            return "input", layer
        return "other", layer

    def _pack(self, t: torch.Tensor):
        if _is_parameter(t) or (t._base is not None and _is_parameter(t._base)):
            # a parameter, or a view of one (linear's transposed weight): held by the model,
            # not for backward
            self.stats.kept += 1
            return packing.keep(t if t.is_leaf else t.detach())
        nbytes = t.numel() * t.element_size()
        if nbytes < self.policy.min_bytes:  # what policy.setting would say, without the lookups
            return self._keep(t)
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
        op, layer = self._where(t)
        setting = self.policy.setting(op, layer, nbytes)
        budget = self.stats.budgeted()
        if budget is not None and setting.codec != "keep":
            setting, site = budget.setting_for(op, layer, t, setting)
        t0 = time.perf_counter()
        packed = packing.pack(t, setting, self.store, keep_dense=budget is None)
        if packed.is_kept:
            return self._keep(t, packed)
        self.stats.add(layer, op, packed, time.perf_counter() - t0)
        if budget is None:
            self.stats.hold(packed, packed.nbytes)
        else:
            budget.admit(t, packed, setting, op, site, self.store)
        self._seen[key] = (weakref.ref(t), weakref.ref(packed))
        return packed

    def _keep(self, t: torch.Tensor, packed: packing.Packed | None = None) -> packing.Packed:
        """The tensor as it is, with its version at save time: autograd checks the versions
        of what it saves itself, not of what a pack hook returns; without this, an in-place
        change between forward and backward that plain PyTorch refuses would give wrong
        gradients silently. Its bytes count as held: the stretch of its storage it reaches (a
        view of a larger storage, such as a batch sliced from a dataset, holds no more)."""
        self.stats.kept += 1
        key = (t.untyped_storage().data_ptr(), t.storage_offset(), tuple(t.shape),
               tuple(t.stride()), t._version, t.device)
        hit = self._kept.get(key)
        if hit is not None and hit() is not None and packed is None:
            return hit()  # the same storage kept already: held once
        # Detached: an op's output kept by its own node would otherwise form a reference cycle
        # through autograd's C++ objects, and a graph that never runs backward would leak.
        packed = packed if packed is not None else packing.keep(t.detach())
        self._kept[key] = weakref.ref(packed)
        nbytes = min(t.untyped_storage().nbytes(), _span(t) * t.element_size())
        if self.stats.budgeted() is not None:
            self.stats.budgeted().reserve(nbytes)
        self.stats.hold(packed, nbytes)
        return packed

    @staticmethod
    def _unpack(packed):
        if not isinstance(packed, packing.Packed):
            return packed
        return packed.unpack()


def _is_parameter(t: torch.Tensor) -> bool:
    return (t.is_leaf and t.requires_grad) or isinstance(t, torch.nn.Parameter)


def _span(t: torch.Tensor) -> int:
    """Elements of its storage that t reaches, from its first to its last."""
    if t.numel() == 0:
        return 0
    return 1 + sum((n - 1) * abs(s) for n, s in zip(t.shape, t.stride()))
