"""A model's repeated blocks, found from its module tree, and their recomputation: a block a
plan names runs as a non-reentrant checkpoint (as `torch.utils.checkpoint(...,
use_reentrant=False)` would run it), so it holds only its inputs for backward and runs its
forward again there.

The blocks are the instances of the module class that covers the most parameters with at
least two instances, none inside another, among classes that have submodules of their own
and are called (a ModuleList or ModuleDict never is: a hook on one never runs); more
instances break a tie (a transformer's layers, a ResNet's residual blocks). Where the
model's layer lists give more blocks holding at least half those parameters, they are
those instead: the children of its ModuleLists and Sequentials that repeat a class within
one of them and have submodules of their own, the outermost (an encoder's layers and a
decoder's, of two classes, rather than the two stacks that hold them; parameters shared
with a module outside, a tied embedding, are counted for neither). Which
blocks recompute, and what a block reports while it runs, is per context (`running`), so a
model used outside a step, or in another thread, runs as it is.

Recomputation is put on the blocks as removable module hooks (`attach`), not by replacing
their `forward`: a forward pre-hook opens the checkpoint's region and a forward hook closes
it (torch.distributed's composable checkpoint does the same). The hooks hold the block's
index and their `Attachment`, no module: a copy of the model (deepcopy, pickle,
torch.save) carries them inert (a copied Attachment has no user), computes with its own
weights, and loses them when a Step attaches to it. `Attachment.release` removes them.
"""
from __future__ import annotations

import collections
import contextlib
import contextvars
import functools
import time

import torch
from torch.utils.checkpoint import _checkpoint_without_reentrant_generator

from ..save.top_hooks import top_pack

_PLAN: contextvars.ContextVar = contextvars.ContextVar("actcodec_recompute", default=None)


# Containers a model never calls (no forward of their own): never a block.
NOT_CALLED = (torch.nn.ModuleList, torch.nn.ModuleDict)


def find(model: torch.nn.Module) -> list:
    """The model's repeated blocks, in the order they are registered (possibly none)."""
    listed, by_class = _listed(model), _by_class(model)
    finer = len(listed) > len(by_class) and \
        2 * _parameters(model, listed) >= _parameters(model, by_class)
    return listed if finer else by_class


def _outermost(model: torch.nn.Module, candidates: list) -> list:
    """The candidates not inside another, in the model's registration order."""
    ids = {id(m) for m in candidates}
    inside = {id(m) for c in candidates for m in c.modules() if m is not c}
    return [m for m in model.modules() if id(m) in ids and id(m) not in inside]


def _listed(model: torch.nn.Module) -> list:
    """The children of the model's ModuleLists and Sequentials that repeat a class within
    their list and have submodules of their own, the outermost."""
    found = []
    for container in model.modules():
        if not isinstance(container, (torch.nn.ModuleList, torch.nn.Sequential)):
            continue
        children = [c for c in container.children() if not isinstance(c, NOT_CALLED)
                    and any(True for _ in c.children())]
        counts = collections.Counter(type(c) for c in children)
        found += [c for c in children if counts[type(c)] >= 2 and c is not model]
    return _outermost(model, found)


def _by_class(model: torch.nn.Module) -> list:
    """The instances of the called class with submodules that covers the most parameters with
    at least two instances, none inside another; more instances break a tie."""
    by_class: dict = {}
    for module in model.modules():
        if module is not model and not isinstance(module, NOT_CALLED) and \
                any(True for _ in module.children()):
            by_class.setdefault(type(module), []).append(module)
    best, best_key = [], (0, 0)
    for instances in by_class.values():
        inside = {id(m) for i in instances for m in i.modules() if m is not i}
        if len(instances) < 2 or any(id(i) in inside for i in instances):
            continue
        key = (sum(p.numel() for i in instances for p in i.parameters()), len(instances))
        if key > best_key:
            best, best_key = instances, key
    return best


def _parameters(model: torch.nn.Module, modules: list) -> int:
    """Elements of the distinct parameters the modules hold that no module outside them
    does: an embedding shared with the model's own (T5's and BART's stacks each hold the
    one `shared` table) weighs for neither side."""
    inside = {id(m) for c in modules for m in c.modules()}
    outside = {id(p) for m in model.modules() if id(m) not in inside
               for p in m.parameters(recurse=False)}
    seen = {id(p): p.numel() for m in modules for p in m.parameters() if id(p) not in outside}
    return sum(seen.values())


class Running:
    """What blocks do in one context: `recompute`, the indices of blocks to checkpoint;
    `chunks`, how many chunks of the sequence their position-wise children run in
    (mini_sequence.py; 1: whole); and, for a profile, per block the seconds its forwards took
    and the bytes of its inputs, and of its position-wise children, and `current`, the block
    running now (None outside all), `local`, the block whose position-wise child runs now."""

    def __init__(self, recompute=(), profile: bool = False, chunks: int = 1):
        self.recompute = frozenset(recompute)
        self.profile = profile
        self.chunks = chunks
        self.current = None
        self.local = None
        self.seconds: dict = {}
        # a profile on a device that runs asynchronously (CUDA): waits for its queued work
        # before each clock reading, so that seconds are the work's, not its launches'
        self.sync = None
        # a step on such a device: marks each block's forward on the device's own clock
        # (begin(i), end(i); meter.DeviceClock), read once the device has run them
        self.clock = None
        self.inputs: dict = {}
        self.local_inputs: dict = {}
        self.local_seconds: dict = {}
        self.local_open: list = []
        # a profile's marks of backward's moments (step_profile.Moments): begin(i) where a
        # recomputed block's forward runs again, end(i) where the gradient of its input is
        # made (its backward done)
        self.moments = None
        # per block index, the calls open now (a block called again inside its own
        # forward nests): (its checkpoint's generator or None, the block around it, start)
        self.open: dict = {}


@contextlib.contextmanager
def running(state: Running):
    token = _PLAN.set(state)
    try:
        yield state
    finally:
        _PLAN.reset(token)


def in_foreign_checkpoint(ours=None) -> bool:
    """Whether what runs now runs in the forward of a non-reentrant checkpoint the model
    opened itself (transformers' gradient checkpointing, torch.utils.checkpoint in its own
    code), not the region `ours` (the pack function a Step's region pushed). Its
    recomputation in backward runs outside any step's context, with no plan: what runs in
    it must run as it is (a position-wise child in chunks in forward and whole in the
    recomputation saves another count of tensors, which torch refuses). A reentrant
    checkpoint runs its forward without gradients, where no plan acts anyway."""
    pack = top_pack()
    return pack is not None and pack is not ours and \
        getattr(pack, "__qualname__", "").startswith("_checkpoint_hook.")


class _Outside:
    """A context in which no plan is running: a recomputation in backward runs its block's
    forward as it is (no second checkpoint, nothing counted twice), its position-wise
    children in the plan's `chunks` still; a profile's `moments` hear that block `index`'s
    moment in backward begins. Reusable, as backward may recompute a region more than once
    (retain_graph)."""

    def __init__(self, chunks: int = 1, moments=None, index: int | None = None):
        self.chunks = chunks
        self.moments, self.index = moments, index
        self._tokens: list = []

    def __enter__(self):
        if self.moments is not None:
            self.moments.begin(self.index)
        self._tokens.append(_PLAN.set(Running(chunks=self.chunks) if self.chunks > 1
                                      else None))

    def __exit__(self, *exc):
        _PLAN.reset(self._tokens.pop())


def _contexts(chunks: int = 1, moments=None, index: int | None = None):
    return contextlib.nullcontext(), _Outside(chunks, moments, index)


def _mark_end(moments, index: int, values) -> None:
    """moments.end(index) once the gradient of the block's first input that takes one is
    made (none: the moment ends where the next begins)."""
    for v in values:
        if isinstance(v, torch.Tensor) and v.requires_grad:
            v.register_hook(lambda grad: moments.end(index))
            return


def _tensor_bytes(values) -> int:
    seen, total = set(), 0
    for v in values:
        if isinstance(v, torch.Tensor) and v.untyped_storage().data_ptr() not in seen:
            seen.add(v.untyped_storage().data_ptr())
            total += v.untyped_storage().nbytes()
    return total


class Attachment:
    """The hooks put on one model's blocks, and how many Steps use them (`users`). The hooks
    act only while some Step uses them; the last `release` removes them. A copy (deepcopy,
    pickle) is a new, unused Attachment: the copied hooks never act."""

    def __init__(self):
        self.users = 0
        self.count = 0  # blocks hooked
        self._handles: list = []

    def __reduce__(self):
        return (Attachment, ())

    def release(self) -> None:
        """One user fewer; the last takes the hooks off the blocks."""
        if self.users <= 0:
            return
        self.users -= 1
        if self.users == 0:
            for handle in self._handles:
                handle.remove()
            self._handles = []


class _Enter:
    """Forward pre-hook of block `index`: under a plan that recomputes it (and with grad
    enabled), opens a non-reentrant checkpoint's region around the block's forward."""

    def __init__(self, attachment: Attachment, index: int):
        self.attachment, self.index = attachment, index

    def __call__(self, module, args, kwargs):
        state = _PLAN.get()
        if state is None or self.attachment.users == 0:
            return None
        i = self.index
        if state.profile and state.sync is not None:
            state.sync()
        t0 = time.perf_counter()
        if state.clock is not None:
            state.clock.begin(i)
        if state.profile:
            state.inputs[i] = state.inputs.get(i, 0) + _tensor_bytes((*args, *kwargs.values()))
        gen = region = None
        if i in state.recompute and torch.is_grad_enabled() and not in_foreign_checkpoint():
            # (a block the model checkpoints itself is recomputed already: not twice)
            # backward runs the forward again (not __call__: hooks stay outside the region)
            gen = _checkpoint_without_reentrant_generator(
                functools.partial(module.forward, **kwargs), True,
                functools.partial(_contexts, state.chunks, state.moments, i), "default",
                False, True, *args)
            next(gen)  # the region begins: saves are recomputed, not kept
            region = top_pack()
            if state.moments is not None:
                _mark_end(state.moments, i, (*args, *kwargs.values()))
        state.open.setdefault(i, []).append((gen, state.current, t0, region))
        state.current = i
        return None


class _Leave:
    """Forward hook of block `index` (always called, after an exception too): closes what
    its pre-hook opened."""

    def __init__(self, attachment: Attachment, index: int):
        self.attachment, self.index = attachment, index

    def __call__(self, module, args, output):
        state = _PLAN.get()
        opened = None if state is None else state.open.get(self.index)
        if not opened:  # not opened in this context (no plan, or a hook before ours failed)
            return None
        gen, state.current, t0, _ = opened.pop()
        if gen is not None:
            # the region ends (after an exception too: the saved-tensor hooks it pushed
            # must come off, as torch's composable checkpoint does)
            next(gen, None)
        if state.clock is not None:
            state.clock.end(self.index)
        if state.profile:
            if state.sync is not None:
                state.sync()
            i = self.index
            state.seconds[i] = state.seconds.get(i, 0.0) + (time.perf_counter() - t0)
        return None


def attach(blocks: list) -> Attachment:
    """The hooks that make `blocks` follow the running context's plan, with one user more:
    those another Step put on exactly these blocks, shared, or new ones. Inert hooks a copied
    model brought are removed first. Raises ValueError where some of the blocks carry another
    Step's hooks for another list of blocks."""
    live = set()
    for index, block in enumerate(blocks):
        for key, hook in list(block._forward_pre_hooks.items()):
            if isinstance(hook, _Enter) and hook.attachment.users == 0:
                _drop(block, key)  # a copy's: never acts
            elif isinstance(hook, _Enter):
                live.add((hook.attachment, hook.index == index))
        for key, hook in list(block._forward_hooks.items()):
            if isinstance(hook, _Leave) and hook.attachment.users == 0:
                _drop(block, key)
    if live:
        attachment = next(iter(live))[0]
        if live != {(attachment, True)} or attachment.count != len(blocks) or not all(
                any(isinstance(h, _Enter) and h.attachment is attachment
                    for h in b._forward_pre_hooks.values()) for b in blocks):
            raise ValueError(
                "these blocks already carry the recomputation hooks of another Step over a "
                "different set of blocks (a Step on another module of this model?); close() "
                "that Step first")
        attachment.users += 1
        return attachment
    attachment = Attachment()
    for index, block in enumerate(blocks):
        attachment._handles.append(block.register_forward_pre_hook(
            _Enter(attachment, index), with_kwargs=True))
        # first of the forward hooks, so that the region holds the forward alone
        attachment._handles.append(block.register_forward_hook(
            _Leave(attachment, index), prepend=True, always_call=True))
    attachment.count, attachment.users = len(blocks), 1
    return attachment


def _drop(block: torch.nn.Module, key) -> None:
    """Removes the hook registered under `key` (what its lost RemovableHandle would do)."""
    if key in block._forward_pre_hooks:
        del block._forward_pre_hooks[key]
        block._forward_pre_hooks_with_kwargs.pop(key, None)
    else:
        del block._forward_hooks[key]
        block._forward_hooks_with_kwargs.pop(key, None)
        block._forward_hooks_always_called.pop(key, None)
