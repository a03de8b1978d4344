"""A batch in micro-batches: a tensor, a tuple/list or a dict of tensors (any mapping, such as
the BatchEncoding transformers' collators return; other values pass through whole); every
tensor whose first dimension is the batch size is sliced (and each list of one item per
sample), the rest are passed as they are. And the loss a micro-batch's `loss_fn` gives, checked."""
from __future__ import annotations

from collections.abc import Mapping

import torch

from . import vision_grid


def _tensors(batch):
    if isinstance(batch, torch.Tensor):
        return [batch]
    if isinstance(batch, Mapping):
        return [v for v in batch.values() if isinstance(v, torch.Tensor)]
    if isinstance(batch, (tuple, list)):
        return [v for v in batch if isinstance(v, torch.Tensor)]
    raise TypeError(f"a batch is a tensor, a tuple or list, or a dict of tensors; got "
                    f"{type(batch).__name__}")


def batch_size(batch, given: int | None = None) -> int:
    """The batch size: `given`, else the first dimension of the batch's first tensor."""
    tensors = _tensors(batch)
    if given is not None:
        if isinstance(given, bool) or not isinstance(given, int) or given < 1:
            raise ValueError(f"batch_size must be a positive int, got {given!r}")
        if not any(t.dim() >= 1 and t.shape[0] == given for t in tensors):
            raise ValueError(f"batch_size={given}: no tensor of the batch has a first "
                             f"dimension of {given} (shapes: "
                             f"{[tuple(t.shape) for t in tensors]})")
        return given
    if not tensors:
        raise ValueError("the batch holds no tensor, so it has no batch dimension")
    first = tensors[0]
    if first.dim() == 0 or first.shape[0] == 0:
        raise ValueError(f"the batch's first tensor (shape {tuple(first.shape)}) has no batch "
                         f"dimension; pass batch_size= or put a batched tensor first")
    return first.shape[0]


def slices(size: int, count: int) -> list:
    """`count` near-equal (start, stop) ranges over `size` samples, largest first."""
    step, extra = divmod(size, count)
    out, start = [], 0
    for i in range(count):
        stop = start + step + (1 if i < extra else 0)
        out.append((start, stop))
        start = stop
    return [s for s in out if s[1] > s[0]]


def take(batch, size: int, start: int, stop: int):
    """Samples start:stop of the batch: each tensor whose first dimension is the batch size,
    and each list of one item per sample (a detection model's targets); a vision-language
    batch's images as rows of patches with the samples whose they are (vision_grid); other
    values whole."""
    def cut(v):
        if isinstance(v, torch.Tensor) and v.dim() >= 1 and v.shape[0] == size or \
                isinstance(v, list) and len(v) == size:
            return v[start:stop]
        return v

    out = each_value(batch, cut)
    if vision_grid.applies(batch):
        out.update(vision_grid.take(batch, start, stop))
    return out


def each_value(batch, fn):
    """The batch with `fn` applied to each of its values (the batch itself where it is one
    tensor), in the batch's own kind of container."""
    if isinstance(batch, torch.Tensor):
        return fn(batch)
    if isinstance(batch, Mapping):
        return {k: fn(v) for k, v in batch.items()}
    if isinstance(batch, list):
        return [fn(v) for v in batch]
    if hasattr(batch, "_fields"):  # a namedtuple
        return type(batch)(*(fn(v) for v in batch))
    return tuple(fn(v) for v in batch)


def default_loss(model, batch):
    """A dict batch's loss: `model(**batch).loss` (transformers' models given labels)."""
    if not isinstance(batch, Mapping):
        raise TypeError(f"Step needs loss_fn(model, micro_batch) for a batch that is not a "
                        f"dict (got {type(batch).__name__})")
    out = model(**batch)
    loss = getattr(out, "loss", None)
    if loss is None and isinstance(out, dict):
        loss = out.get("loss")
    if loss is None:
        raise ValueError("model(**batch) returned no .loss: give the batch labels, or pass "
                         "loss_fn(model, micro_batch)")
    return loss


def loss_and_weight(out):
    """(loss, weight) from what loss_fn returned: a scalar loss (weighed by its sample count)
    or (loss, weight)."""
    weight = None
    if isinstance(out, (tuple, list)):
        if len(out) != 2:
            raise ValueError(f"loss_fn returns a loss or (loss, weight), got {len(out)} values")
        out, weight = out
        weight = float(weight.detach()) if isinstance(weight, torch.Tensor) else float(weight)
        if not weight >= 0:
            raise ValueError(f"loss_fn's weight must be 0 or more, got {weight!r}")
    if not isinstance(out, torch.Tensor):
        raise TypeError(f"loss_fn must return a tensor loss, got {type(out).__name__}")
    if out.numel() != 1:
        raise ValueError(f"loss_fn must return a scalar loss (the micro-batch's mean), got a "
                         f"tensor of shape {tuple(out.shape)}")
    if not out.requires_grad:
        raise ValueError("loss_fn's loss does not require grad: no parameter of the model "
                         "takes part in it (or it was computed under no_grad)")
    return out.reshape(()), weight
