"""Position-wise sub-modules of repeated blocks run in chunks of the sequence (the technique of
the Mini-Sequence Transformer): an MLP's wide intermediates exist for one chunk at a time, in
forward and in backward, and it keeps only its input for backward. Exact up to float
summation order (its weights' gradients add up over the chunks), for any chunk count.

Which sub-modules: the direct children of each repeated block (blocks.find) that hold two or
more weight matrices (2-D parameters: an MLP's projections) and that the block calls with
one tensor of shape (batch, sequence, features) and nothing else (attention, called with
masks and positions, never is). Before a child first runs in chunks it is checked on the
first tokens of its input: its output on each half must equal the halves of its output on
the whole (within float tolerance), or it is never chunked (a causal mixing layer, dropout
in training). The check, once per child and per Attachment, runs without gradients and
leaves the random generators as it found them.

How: a forward pre-hook hands the child an empty sequence (so its own forward computes
nothing) and keeps its input; the forward hook then returns the concatenation of the child's
`forward` on each chunk, each under a non-reentrant checkpoint (only the chunk's input is
kept; backward recomputes the chunk's intermediates, one chunk at a time). Like the blocks'
recomputation (blocks.py) these are removable hooks holding an index and their Attachment,
inert in copies of the model; what runs is per context: `blocks.Running.chunks` (1: whole).
In a block recomputed in backward the chunks apply again (blocks._Outside carries them).
"""
from __future__ import annotations

import time

import torch
from torch.utils.checkpoint import checkpoint

from . import blocks as blocks_mod

TOLERANCE = 1e-4  # relative: the halves' outputs against the whole's


def find(blocks: list) -> list:
    """(block index, child) of every position-wise candidate, in block order."""
    out = []
    for index, block in enumerate(blocks):
        for child in block.children():
            if sum(1 for p in child.parameters() if p.dim() == 2) >= 2:
                out.append((index, child))
    return out


# The check runs on the first sample's first tokens only: its tensors stay small. Run on the
# whole input inside a step, its wide intermediates entered the lifetimes the activation
# store plans the next step's layout from, and that step's layout then left holes (a
# Falcon's step after the check peaked 180 MiB above the next ones).
CHECK_TOKENS = 8


def position_wise(module: torch.nn.Module, x: torch.Tensor) -> bool:
    """Whether `module` computes each position of `x` (batch, sequence, features) on its
    own: its output on the two halves of the sequence equals its output on the whole (of
    the first sample's first CHECK_TOKENS tokens: any mixing across the halves shows)."""
    if x.shape[1] < 2:
        return False
    x = x[:1, :CHECK_TOKENS]
    # run inside a step: the check draws no random numbers of the step's (a dropout's)
    with torch.no_grad(), torch.random.fork_rng(devices=[x.device] if x.is_cuda else []):
        whole = module.forward(x)
        if not isinstance(whole, torch.Tensor) or whole.shape[:2] != x.shape[:2]:
            return False
        half = x.shape[1] // 2
        try:
            parts = torch.cat([_forward(module, x[:, :half]), _forward(module, x[:, half:])],
                              dim=1)
        except (RuntimeError, ValueError, TypeError):  # a part it cannot take: not chunked
            return False
        if parts.shape != whole.shape:
            return False
        scale = float(whole.abs().max()) if whole.numel() else 0.0
        return bool(torch.allclose(parts, whole, rtol=TOLERANCE,
                                   atol=TOLERANCE * max(scale, 1e-30)))


def _forward(module: torch.nn.Module, piece: torch.Tensor) -> torch.Tensor:
    """The child's forward on a piece of the sequence, made contiguous first: a slice along
    the sequence of a batch of several samples is not, and layers that flatten their input
    with `view` (GPT-2's Conv1D) refuse it. Inside the chunk's checkpoint, the copy is
    recomputed in backward, never kept."""
    return module.forward(piece.contiguous())


class Attachment(blocks_mod.Attachment):
    """The hooks on one model's position-wise children (as blocks.Attachment: users, the
    last release removes them, a copy is unused), and what each child's check found
    (`checked`: index -> bool)."""

    def __init__(self):
        super().__init__()
        self.checked: dict = {}

    def __reduce__(self):
        return (Attachment, ())


class _Enter:
    """Forward pre-hook of child `index` (of block `block`)."""

    def __init__(self, attachment: Attachment, index: int, block: int):
        self.attachment, self.index, self.block = attachment, index, block

    def __call__(self, module, args, kwargs):
        state = blocks_mod._PLAN.get()
        if state is None or self.attachment.users == 0:
            return None
        x = args[0] if len(args) == 1 and not kwargs else None
        chunks = 0 if not isinstance(x, torch.Tensor) or x.dim() != 3 else \
            min(state.chunks, x.shape[1])
        if chunks == 0 or not (state.profile or chunks > 1) or self._in_foreign(state) or \
                not self._checked(module, x):
            state.local_open.append(None)
            return None
        if state.profile and state.sync is not None:
            state.sync()
        entry = [None, time.perf_counter(), state.local]
        if state.profile:  # what it saves, its inputs and seconds: what chunks would change
            b = self.block
            state.local_inputs[b] = state.local_inputs.get(b, 0) + \
                x.untyped_storage().nbytes()
            state.local = b
        if chunks > 1 and torch.is_grad_enabled():
            entry[0] = (x, chunks)
        state.local_open.append(entry)
        if entry[0] is not None:
            return (x[:, :0],), {}  # the whole runs in the forward hook, in chunks
        return None

    def _in_foreign(self, state) -> bool:
        """Whether this call runs in a checkpoint the model opened itself (never chunked:
        its recomputation runs it whole), not in its block's region of the plan."""
        opened = state.open.get(self.block)
        return blocks_mod.in_foreign_checkpoint(opened[-1][3] if opened else None)

    def _checked(self, module, x) -> bool:
        if self.index not in self.attachment.checked:
            self.attachment.checked[self.index] = position_wise(module, x)
        return self.attachment.checked[self.index]


class _Leave:
    """Forward hook of child `index` (always called): the chunks' output, where its pre-hook
    kept the input."""

    def __init__(self, attachment: Attachment, index: int, block: int):
        self.attachment, self.index, self.block = attachment, index, block

    def __call__(self, module, args, output):
        state = blocks_mod._PLAN.get()
        if state is None or not state.local_open:
            return None
        entry = state.local_open.pop()
        if entry is None:
            return None
        kept, t0, state.local = entry
        out = None
        if kept is not None and isinstance(output, torch.Tensor):  # (not after an exception)
            x, chunks = kept
            out = torch.cat([checkpoint(_forward, module, piece, use_reentrant=False)
                             for piece in x.tensor_split(chunks, dim=1)], dim=1)
        if state.profile:
            if state.sync is not None:
                state.sync()
            b = self.block
            state.local_seconds[b] = state.local_seconds.get(b, 0.0) + \
                (time.perf_counter() - t0)
        return out


def attach(blocks: list) -> Attachment:
    """Hooks on the position-wise children of `blocks` (none where there are none), with one
    user more: those another Step put there, shared, or new ones. Inert hooks a copied model
    brought are removed first. (blocks.attach has refused a Step on another set of blocks.)"""
    children = find(blocks)
    live = None
    for _, child in children:
        for key, hook in list(child._forward_pre_hooks.items()):
            if isinstance(hook, _Enter) and hook.attachment.users == 0:
                blocks_mod._drop(child, key)
            elif isinstance(hook, _Enter):
                live = hook.attachment
        for key, hook in list(child._forward_hooks.items()):
            if isinstance(hook, _Leave) and hook.attachment.users == 0:
                blocks_mod._drop(child, key)
    if live is not None:
        live.users += 1
        return live
    attachment = Attachment()
    for index, (block, child) in enumerate(children):
        attachment._handles.append(child.register_forward_pre_hook(
            _Enter(attachment, index, block), with_kwargs=True))
        attachment._handles.append(child.register_forward_hook(
            _Leave(attachment, index, block), prepend=True, always_call=True))
    attachment.users = 1
    return attachment
