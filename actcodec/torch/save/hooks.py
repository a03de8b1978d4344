"""The contexts a training step runs in: `compress_saved` compresses every activation autograd
saves, for any model, through the public `torch.autograd.graph.saved_tensors_hooks`;
`record` collects what converted modules and Functions save (and keeps it within a budget).

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
are compressed. transformers' activations written as several ops (GPT-2's GELU saves four
tensors) save their input alone and run again in backward (actcodec.torch.save.recompute).
"""
from __future__ import annotations

import torch

from . import allocator as allocators
from ..budget import budget as budgets
from ..budget import guard as guards
from ..budget import spill as spills
from . import save
from .accounting import Accounting
from .policy import Policy


class compress_saved:
    """Context manager: `with compress_saved(Policy.preset("4bit")): loss = model(x)`.

    Each entry is a step: a new save session (actcodec.torch.save) with fresh
    stochastic-rounding draws. `.stats` is the context's `Accounting`: per-layer rows,
    totals and a printable `table()`. Payloads live in `store` (actcodec.store; the process's
    activation store by default, None for numpy's heap).

    budget (bytes, or a string such as "256MiB"): what the step holds for backward never
    exceeds it (nor does a save go below `min_bits`); the bits of each save are planned
    from the steps before (enter the same context every step), and what does not fit is
    re-encoded at fewer bits or paged out to a temporary file in `spill_dir`
    (actcodec.torch.budget); 0 pages every save out. Without a policy, 8 bits in groups
    of 64. spill_dir is checked here (it exists, is a directory, a file can be created
    there: FileNotFoundError, NotADirectoryError or PermissionError naming it); a write
    there that fails raises an OSError with its errno and the directory, from the save.

    guard: without a budget, a save whose error at the policy's setting would move one
    parameter's gradient by more than the guard allows, as measured in backward on the second
    step a context is entered for and every few hundred after (actcodec.torch.guard), is
    stored lossless from then on: enter one context every step for it.
    None (the default): on for policies of 8 bits or more, such as the default one, whose
    promise is gradients close to the exact ones; off for fewer bits, which trade that for
    bytes (a budget is what balances the two). True or False: on or off whatever the bits.

    allocator: on first use, install actcodec's torch allocator (actcodec.torch.allocator) for
    the process, so that the activations a step frees leave no holes in the heap and the
    process's peak falls with what is saved; False keeps torch's allocator. With `store=None`
    (payloads from numpy's heap), or a `model` with no parameter in host memory (its
    activations live on its device), nothing is installed."""

    def __init__(self, policy: Policy | None = None, *, model: torch.nn.Module | None = None,
                 store=save.DEFAULT_STORE, budget=None, spill_dir: str | None = None,
                 allocator: bool = True, min_bits: int = 0, guard: bool | None = None,
                 **policy_kwargs):
        if policy is not None and policy_kwargs:
            raise TypeError("pass a Policy or policy keywords, not both")
        if policy is None and budget is not None:
            policy_kwargs = {**budgets.POLICY, **policy_kwargs}
        self.policy = policy if policy is not None else Policy(**policy_kwargs)
        self.store = save.store_of(store)
        self.allocator = bool(allocator) and self.store is not None
        self.stats = Accounting(self.store)
        self.spill_dir, self.min_bits = spills.check_dir(spill_dir), min_bits
        self.limit = None  # the budget.Budget saves go through, once a budget is set
        if guard is None:
            guard = self.policy.bits is not None and self.policy.bits >= guards.GUARDED_BITS
        self.guard = guards.Guard() if guard else None
        if budget is not None:
            self.limit = budgets.Budget(self.stats, budget, self.spill_dir, min_bits)
        self._names = ({id(m): n or type(m).__name__ for n, m in model.named_modules()}
                       if model is not None else {})
        self._model = model
        self.session: save.SaveSession | None = None  # the step's, while inside
        self._handles: list = []
        self._hooks = None

    @property
    def budget(self) -> int | None:
        """Bytes the step may hold for backward (None: no budget). Settable between steps and
        from another thread during one: what is held is made to fit at once."""
        return None if self.limit is None else self.limit.nbytes

    @budget.setter
    def budget(self, value) -> None:
        if self.limit is None:
            self.limit = budgets.Budget(self.stats, value, self.spill_dir, self.min_bits)
        else:
            self.limit.set(value)

    def request_budget(self, value) -> None:
        """Sets the budget without making room in this thread: the thread that saves fits
        what is held within it at its next save, and any error paging out (a full spill_dir)
        is raised there, in the step, not here. For a budget lowered from another thread
        while a step runs (Step's limit setter)."""
        if self.limit is None:
            self.limit = budgets.Budget(self.stats, value, self.spill_dir, self.min_bits)
        else:
            self.limit.request(value)

    def close(self) -> None:
        """Closes the file a budget pages saves out to (between steps: entered again, the
        context opens a new one when it next pages out)."""
        if self.limit is not None:
            self.limit.keeper.close()

    def __enter__(self):
        if self.allocator and _in_host_memory(self._model):
            allocators.ensure()
        limit = save.begin_step(self.stats, self.limit)
        if limit is None and self.guard is not None:
            self.guard.new_step()
        save.stores.new_step(self.store)  # what the steps before no longer need goes back
        session = save.SaveSession(self.policy, self.stats, limit, self.store, self._names,
                                   self.guard)
        self.session = session.__enter__()
        reg = torch.nn.modules.module
        self._handles = [
            reg.register_module_forward_pre_hook(session.enter_module),
            reg.register_module_forward_hook(session.leave_module, always_call=True)]
        self._hooks = torch.autograd.graph.saved_tensors_hooks(session.pack_hook,
                                                                session.unpack_hook)
        self._hooks.__enter__()
        return self

    def __exit__(self, *exc):
        for h in self._handles:
            h.remove()
        self._handles = []
        try:
            hooks, self._hooks = self._hooks, None
            return hooks.__exit__(*exc)
        finally:
            session, self.session = self.session, None
            session.__exit__(*exc)  # may raise: a NaN/inf its unsettled saves show


def _in_host_memory(model) -> bool:
    """Whether a step of `model` makes host allocations worth the allocator: no model given,
    or one with a parameter (or no parameter at all) on the CPU."""
    if model is None:
        return True
    devices = {p.device.type for p in model.parameters()}
    return not devices or "cpu" in devices


class record:
    """`with record() as acc:` collects what converted modules and Functions save in the
    block into an `Accounting` (`accounting`, or a new one). Reuse one `record(budget=...)`
    object, entering it every step, to keep what they hold within a budget (each entry is a
    step: see actcodec.torch.budget)."""

    def __init__(self, accounting: Accounting | None = None, *, budget=None,
                 spill_dir: str | None = None, store=save.DEFAULT_STORE):
        self.stats = accounting if accounting is not None else Accounting()
        self.store = store
        spill_dir = spills.check_dir(spill_dir)
        self.limit = budgets.Budget(self.stats, budget, spill_dir) if budget is not None \
            else None
        self._session = None

    def __enter__(self) -> Accounting:
        limit = save.begin_step(self.stats, self.limit)
        self._session = save.SaveSession(None, self.stats, limit, self.store).__enter__()
        return self.stats

    def __exit__(self, *exc):
        self._session.__exit__(*exc)
        self._session = None
