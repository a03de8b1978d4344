"""A batch's shape as the memory limit counts it: samples, and elements per sample (what
grows with a sequence's length or an image's size). Two batches of the same samples but
longer sequences are different batches to the cost model (actcodec.torch.limit.limit_plan.
scaled); a peak measured for one shape is never trusted for a larger one."""
from __future__ import annotations

import torch


def units_per_sample(batch, size: int) -> float:
    """Elements per sample over the batch's tensors that have the batch dimension (token ids,
    masks and labels of a padded text batch all grow with its length; an image batch's with
    its pixels). 1.0 where no tensor has it."""
    if isinstance(batch, torch.Tensor):
        tensors = [batch]
    elif isinstance(batch, dict):
        tensors = list(batch.values())
    elif isinstance(batch, (tuple, list)):
        tensors = list(batch)
    else:
        return 1.0
    total = sum(t.numel() for t in tensors
                if isinstance(t, torch.Tensor) and t.dim() >= 1 and t.shape[0] == size)
    return max(1.0, total / size) if size > 0 else 1.0
