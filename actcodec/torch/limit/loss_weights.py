"""Each micro-batch's share of the batch's loss, so that micro-batches add up to the gradient
of one full-batch forward.

The default loss of a dict batch, `model(**b).loss`, is a mean over the targets the loss
counts, not over samples. transformers' losses (and torch's cross entropy) skip labels of
-100, which is how every Hugging Face collator pads them; a causal LM's loss
(transformers.loss.loss_utils.ForCausalLMLoss) first shifts them by one (the target of
position t is labels[t + 1]), so a row's first label is never a target. A micro-batch's share
is its count of targets over the batch's. With `num_items_in_batch` in the batch (as
transformers' Trainer passes it), each micro-batch's loss is already its sum over the whole
batch's count, and the micro-batches simply add up."""
from __future__ import annotations

import inspect
import sys
from collections.abc import Mapping

import torch

IGNORE_INDEX = -100  # the label transformers' losses and torch's cross entropy skip


def shares(model, batch, size: int, ranges: list, default_loss: bool) -> list:
    """Each (start, stop) range's share of the batch's loss (the shares add up to 1, or
    are all 1 where each micro-batch's loss is already normalized over the whole batch).

    The default loss of a dict batch: by `num_items_in_batch` (all 1) or by the targets of
    its `labels` (all 0 where the batch has no target: its loss is NaN, as one forward's);
    anything else (a loss_fn's mean, or labels not per sample): by sample count."""
    if default_loss and isinstance(batch, Mapping):
        if batch.get("num_items_in_batch") is not None:
            return [1.0] * len(ranges)
        counts = [targets(model, batch, size, start, stop) for start, stop in ranges]
        if all(c is not None for c in counts):
            total = sum(counts)
            return [c / total if total else 0.0 for c in counts]
    return [(stop - start) / size for start, stop in ranges]


def targets(model, batch, size: int | None = None, start: int = 0, stop: int | None = None):
    """How many targets the default loss of `batch[start:stop]` averages over, or None where
    that is not known (no `labels` tensor with one row per sample). Integer labels: those
    not -100 (a causal LM's after its shift, or `shift_labels` where the batch gives them);
    float labels (regression, multi-label): every element."""
    if not isinstance(batch, Mapping):
        return None
    shifted = batch.get("shift_labels")
    given = isinstance(shifted, torch.Tensor)  # shifted already: counted as they are
    labels = shifted if given else batch.get("labels")
    if not isinstance(labels, torch.Tensor) or labels.dim() == 0:
        return None
    if size is not None and labels.shape[0] != size:
        return None  # not one row per sample: how a micro-batch's part counts is unknown
    labels = labels[start:stop]
    if labels.is_floating_point():
        return labels.numel()
    if not given and labels.dim() >= 2 and shifts_labels(model):
        labels = labels[..., 1:]
    return int((labels != IGNORE_INDEX).sum())


def shifts_labels(model) -> bool:
    """Whether the model's loss is transformers' causal-LM loss, which shifts the labels by
    one: the function its forward calls as `self.loss_function` (chosen by the class's
    `loss_type`; a model without one, such as GPT2LMHeadModel, gets the causal-LM loss), on a
    model that is not an encoder-decoder (those give the decoder its labels unshifted)."""
    model = getattr(model, "module", model)  # DistributedDataParallel, DataParallel
    transformers = sys.modules.get("transformers")
    if transformers is None or not isinstance(model, transformers.PreTrainedModel):
        return False
    if getattr(model.config, "is_encoder_decoder", False):
        return False
    forward = inspect.unwrap(type(model).forward)
    if "loss_function" not in getattr(getattr(forward, "__code__", None), "co_names", ()):
        return False  # its forward computes its own loss (XLNet's: labels as given)
    from transformers.loss.loss_utils import ForCausalLMLoss
    return model.loss_function is ForCausalLMLoss
