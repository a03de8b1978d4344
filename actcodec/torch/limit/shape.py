"""A batch's shape as the memory limit counts it: samples, and elements per sample (what
grows with a sequence's length or an image's size). Two batches of the same samples but
longer sequences are different batches to the cost model (actcodec.torch.limit.limit_plan.
scaled); a peak measured for one shape is never trusted for a larger one. A batch of one
long sample is planned along its tokens instead (`sequence_length`): its probes run on the
sample's first tokens."""
from __future__ import annotations

import torch

from . import micro_batches, vision_grid
from .micro_batches import each_value


def units_per_sample(batch, size: int) -> float:
    """Elements per sample over the batch's tensors that have the batch dimension (token ids,
    masks and labels of a padded text batch all grow with its length; an image batch's with
    its pixels). 1.0 where no tensor has it."""
    total = sum(t.numel() for t in _tensors(batch) if t.dim() >= 1 and t.shape[0] == size)
    return max(1.0, total / size) if size > 0 else 1.0


# A single sample shorter than this is planned as a sample, not along its tokens.
MIN_TOKENS = 64


def token_lengths(batch, size: int) -> tuple | None:
    """The second dimension of every tensor of shape (size, T, ...) in the batch, in its
    order, where each length is a sequence's: a 2-D integer tensor of it is there (token ids
    or labels, not an image's rows). An encoder-decoder's batch has two (its source and its
    labels); a decoder's one. None for a batch without such tensors, or with a tensor of a
    length no sequence has (then nothing can be cut along a sequence safely), or with images
    as rows of patches (vision_grid: their tokens cut short would not match their patches,
    and their grid is no sequence)."""
    if vision_grid.applies(batch):
        return None
    shaped = [t for t in _tensors(batch) if t.dim() >= 2 and t.shape[0] == size]
    tokens = {t.shape[1] for t in shaped if t.dim() == 2 and not t.is_floating_point()
              and not t.is_complex() and t.dtype != torch.bool}
    lengths = tuple(int(t.shape[1]) for t in shaped)
    if not tokens or any(n not in tokens for n in lengths):
        return None
    return lengths


def token_length(batch, size: int) -> int | None:
    """The longest sequence length of a batch of token sequences (token_lengths): the scale
    first_tokens cuts it by; None for a batch that is not one."""
    lengths = token_lengths(batch, size)
    return None if lengths is None else max(lengths)


def sequence_length(batch, size: int) -> int | None:
    """The longest sequence length of a batch of one sample of tokens (token_length) where
    it is at least MIN_TOKENS; None for a larger batch, or one that is not such a sequence."""
    length = token_length(batch, size) if size == 1 else None
    return length if length is not None and length >= MIN_TOKENS else None


def sequence_unit(batch, size: int) -> str:
    """What a profile along this batch's sequence is per: "token" where its sequences are of
    one length; else "token" and each sequence's share of the longest (an encoder-decoder's
    source and labels), so that a profile serves only batches of the same proportions (one
    measured for short labels under-measures long ones)."""
    lengths = token_lengths(batch, size) or ()
    if len(set(lengths)) <= 1:
        return "token"
    return "token " + ":".join(f"{n / max(lengths):.6g}" for n in lengths)


def first_tokens(batch, length: int, n: int, size: int = 1):
    """The batch with every (size, T, ...) tensor cut to its first n * T / `length` positions,
    rounded up (shorter samples of the same text: what a probe along the sequence, or of a
    length not reached yet, runs); `length`: the batch's token_length, so its longest
    sequences are cut to `n` and the others in proportion."""
    def cut(v):
        if isinstance(v, torch.Tensor) and v.dim() >= 2 and v.shape[0] == size and \
                v.shape[1] <= length:
            return v[:, :cut_length(v.shape[1], length, n)]
        return v

    return each_value(batch, cut)


def cut_length(tokens: int, length: int, n: int) -> int:
    """A sequence of `tokens` cut in the proportion n / length (rounded up, at least one)."""
    return max(1, -(-tokens * n // length))


def _tensors(batch) -> list:
    try:
        return micro_batches._tensors(batch)
    except TypeError:  # not a batch micro-batches can cut: nothing to measure in it
        return []
