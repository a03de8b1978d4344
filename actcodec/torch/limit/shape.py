"""A batch's shape as the memory limit counts it: samples, and elements per sample (what
grows with a sequence's length or an image's size). Two batches of the same samples but
longer sequences are different batches to the cost model (actcodec.torch.limit.limit_plan.
scaled); a peak measured for one shape is never trusted for a larger one. A batch of one
long sample is planned along its tokens instead (`sequence_length`): its probes run on the
sample's first tokens."""
from __future__ import annotations

from collections.abc import Mapping

import torch

from . import micro_batches
from .micro_batches import each_value


def units_per_sample(batch, size: int) -> float:
    """Elements per sample over the batch's tensors that have the batch dimension (token ids,
    masks and labels of a padded text batch all grow with its length; an image batch's with
    its pixels). 1.0 where no tensor has it."""
    total = sum(t.numel() for t in _tensors(batch) if t.dim() >= 1 and t.shape[0] == size)
    return max(1.0, total / size) if size > 0 else 1.0


# A single sample shorter than this is planned as a sample, not along its tokens.
MIN_TOKENS = 64


def token_length(batch, size: int) -> int | None:
    """The sequence length of a batch of token sequences: the second dimension shared by
    every tensor of shape (size, T, ...) in it (token ids, masks, labels), where one of them
    holds integers (token ids or labels: a sequence, not an image's rows); None for a batch
    without such tensors, or tensors that disagree (then no tensor can be cut along the
    sequence safely)."""
    shaped = [t for t in _tensors(batch) if t.dim() >= 2 and t.shape[0] == size]
    lengths = {t.shape[1] for t in shaped}
    if len(lengths) != 1 or not any(not t.is_floating_point() and not t.is_complex() and
                                    t.dtype != torch.bool and t.dim() == 2 for t in shaped):
        return None
    (length,) = lengths
    return length


def sequence_length(batch, size: int) -> int | None:
    """The sequence length of a batch of one sample of tokens (token_length) where it is at
    least MIN_TOKENS; None for a larger batch, or one that is not such a sequence."""
    length = token_length(batch, size) if size == 1 else None
    return length if length is not None and length >= MIN_TOKENS else None


def first_tokens(batch, length: int, n: int, size: int = 1):
    """The batch with every (size, length, ...) tensor cut to its first `n` positions (shorter
    samples of the same text: what a probe along the sequence, or of a length not reached
    yet, runs)."""
    def cut(v):
        if isinstance(v, torch.Tensor) and v.dim() >= 2 and v.shape[0] == size and \
                v.shape[1] == length:
            return v[:, :n]
        return v

    return each_value(batch, cut)


def _tensors(batch) -> list:
    try:
        return micro_batches._tensors(batch)
    except TypeError:  # not a batch micro-batches can cut: nothing to measure in it
        return []
