"""A model's repeated blocks, found from its module tree, and their recomputation: a block a
plan names runs under non-reentrant `torch.utils.checkpoint`, so it holds only its inputs for
backward and runs its forward again there.

The blocks are the instances of the module class that covers the most parameters with at
least two instances, none inside another, among classes that have submodules of their own
(a transformer's layers, a ResNet's residual blocks); more instances break a tie. Which
blocks recompute, and what a block reports while it runs, is per context (`running`), so a
model used outside a step, or in another thread, runs as it is.
"""
from __future__ import annotations

import contextlib
import contextvars
import time

import torch
from torch.utils.checkpoint import checkpoint

_PLAN: contextvars.ContextVar = contextvars.ContextVar("actcodec_recompute", default=None)


def find(model: torch.nn.Module) -> list:
    """The model's repeated blocks, in the order they are registered (possibly none)."""
    by_class: dict = {}
    for module in model.modules():
        if module is not model and any(True for _ in module.children()):
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


class Running:
    """What blocks do in one context: `recompute`, the indices of blocks to checkpoint; and,
    for a profile, per block the seconds its forwards took and the bytes of its inputs, and
    `current`, the block running now (None outside all)."""

    def __init__(self, recompute=(), profile: bool = False):
        self.recompute = frozenset(recompute)
        self.profile = profile
        self.current = None
        self.seconds: dict = {}
        self.inputs: dict = {}


@contextlib.contextmanager
def running(state: Running):
    token = _PLAN.set(state)
    try:
        yield state
    finally:
        _PLAN.reset(token)


def _tensor_bytes(values) -> int:
    seen, total = set(), 0
    for v in values:
        if isinstance(v, torch.Tensor) and v.untyped_storage().data_ptr() not in seen:
            seen.add(v.untyped_storage().data_ptr())
            total += v.untyped_storage().nbytes()
    return total


def wrap(blocks: list) -> None:
    """Make each block follow the running context's plan (once per block; a block wrapped
    already keeps its wrapper)."""
    for index, block in enumerate(blocks):
        if getattr(block, "_actcodec_block", None) is not None:
            continue
        plain = block.forward

        def forward(*args, _plain=plain, _index=index, **kwargs):
            state = _PLAN.get()
            if state is None:
                return _plain(*args, **kwargs)
            outer, state.current = state.current, _index
            t0 = time.perf_counter()
            try:
                if _index in state.recompute and torch.is_grad_enabled():
                    return checkpoint(_plain, *args, use_reentrant=False, **kwargs)
                return _plain(*args, **kwargs)
            finally:
                state.current = outer
                if state.profile:
                    state.seconds[_index] = state.seconds.get(_index, 0.0) + (
                        time.perf_counter() - t0)
                    state.inputs[_index] = state.inputs.get(_index, 0) + _tensor_bytes(
                        (*args, *kwargs.values()))

        block.forward = forward
        block._actcodec_block = index
