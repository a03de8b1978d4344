"""transformers' masked language models' loss from `labels` (BERT, RoBERTa, DistilBERT,
ModernBERT and their kin) with the output projection and loss in chunks of the labelled
tokens (actcodec.torch.limit.chunked_loss): `masked_lm_loss(model, batch)` gives the loss
`model(**batch).loss` gives, and the same gradients up to float summation order, without the
tokens x vocabulary logits. A masked LM labels a few of its tokens (-100 elsewhere), so most
of those logits never mattered: here none are computed for the unlabelled tokens.

How: the model's own forward runs on the batch without its labels, up to its output
embeddings (`get_output_embeddings()`, a Linear layer), whose input (the hidden states after
the head's own position-wise transform) a forward pre-hook takes before stopping the forward
there: the logits are never made. The loss is `chunked_cross_entropy` of that input under the
output embeddings' weight and bias, the labels unshifted, ignore index -100, the mean over
the labelled tokens (or over the batch's `num_items_in_batch` where the model's loss divides
by it: transformers' ForMaskedLMLoss, as ModernBERT's; BERT's kinds ignore it).

What it covers is checked, not assumed: the model is a transformers PreTrainedModel (or a PEFT
model of adapters in its layers around one) of a `*ForMaskedLM` class with Linear output
embeddings. Once per Step (`check`, or at each call) the path runs on a short prefix of the
batch beside the model's own forward, without gradients and from the same random state:
logits and loss must agree, or ValueError says what differs (a head that does more after its
output embeddings, or a loss of another kind, is refused, not silently changed).
"""
from __future__ import annotations

from collections.abc import Mapping
import contextlib

import torch

from .loss_weights import divides_by_items
from .chunked_loss import (IGNORE_INDEX, autocast_as, check_agrees, check_labelled,
                           chunked_cross_entropy, head_input, labelled_prefix,
                           output_embeddings, transformers_model)

LOSS_KEYS = ("labels", "num_items_in_batch")  # the loss's, not the model's forward's
PREFIX_TOKENS = 8  # the prefix `check` runs the path on


def masked_lm_loss(model, batch: Mapping, chunk_tokens: int | None = None,
                   checked: bool = False) -> torch.Tensor:
    """`model(**batch).loss` of a transformers `*ForMaskedLM` model, with the output
    projection and cross-entropy run on the labelled tokens only, `chunk_tokens` of them at a
    time (see chunked_cross_entropy), the path checked on the batch's prefix first (`check`)
    unless `checked` (the caller did, once). Returns the loss, a 0-dim float32 tensor
    (float64 for a float64 model)."""
    check_labelled(batch, "masked_lm_loss")
    if not checked:
        check(model, batch)
    head = _check_covered(model).get_output_embeddings()
    hidden, amp = _head_input(model, batch, head)
    labels = batch["labels"].to(hidden.device)
    _check_shape(model, hidden, labels)
    items = batch.get("num_items_in_batch")
    if items is not None and not divides_by_items(model):  # the forward read: with a count
        items = None
    with autocast_as(hidden.device.type, amp):
        return chunked_cross_entropy(hidden, head.weight, labels, bias=head.bias,
                                     chunk_tokens=chunk_tokens, ignore_index=IGNORE_INDEX,
                                     num_items_in_batch=items)


def covers(model) -> bool:
    """Whether masked_lm_loss covers this model (its class and head; `check` checks the
    path on a batch)."""
    with contextlib.suppress(ValueError):
        return _check_covered(model) is not None
    return False


head = output_embeddings  # the output embeddings the loss runs in chunks


def _check_covered(model):
    """wrapped.adapted(model), once its class and head are checked."""
    name = type(model).__name__
    inner = transformers_model(model, "masked_lm_loss")
    if not type(inner).__name__.endswith("ForMaskedLM"):
        raise ValueError(f"masked_lm_loss: {name} is not a transformers *ForMaskedLM model; "
                         f"not covered")
    if not isinstance(inner.get_output_embeddings(), torch.nn.Linear):
        raise ValueError(f"masked_lm_loss: {name}'s output embeddings are not a "
                         f"torch.nn.Linear; not covered")
    return inner


def _head_input(model, batch: Mapping, head: torch.nn.Module) -> tuple:
    """What the model's forward hands its output embeddings, and autocast's dtype there."""
    return head_input(model, {k: v for k, v in batch.items() if k not in LOSS_KEYS}, head,
                      "masked_lm_loss")


def _check_shape(model, hidden, labels) -> None:
    if tuple(hidden.shape[:-1]) != tuple(labels.shape):
        raise ValueError(f"masked_lm_loss: {type(model).__name__}'s output embeddings read "
                         f"{tuple(hidden.shape[:-1])} positions where the labels are "
                         f"{tuple(labels.shape)} (a head that selects or unpads positions); "
                         f"not covered (use model(**batch).loss)")


def check(model, batch: Mapping) -> None:
    """ValueError unless this path covers the model and the batch: its class and head
    (covers), and its logits and loss on the batch's first row's first PREFIX_TOKENS tokens
    equal to the model's own (no gradients; each from the same random state, which is then
    as it was: dropout draws alike, and none of the step's are taken)."""
    check_labelled(batch, "masked_lm_loss")
    linear = _check_covered(model).get_output_embeddings()
    cut = labelled_prefix(batch, PREFIX_TOKENS)
    device = cut["labels"].device
    devices = [device] if device.type == "cuda" else []
    with torch.no_grad():
        with torch.random.fork_rng(devices=devices):
            out = model(**cut)
        with torch.random.fork_rng(devices=devices):
            hidden, amp = _head_input(model, cut, linear)
        labels = cut["labels"].to(hidden.device)
        _check_shape(model, hidden, labels)
        with autocast_as(hidden.device.type, amp):
            ours = torch.nn.functional.linear(hidden, linear.weight, linear.bias)
            loss = lambda: chunked_cross_entropy(hidden, linear.weight, labels,
                                                 bias=linear.bias)
            check_agrees("masked_lm_loss", model, out, ours, loss,
                         "its output embeddings applied to their input (its head does more)")
    _check_head_parameters(model, cut, linear, devices)


def _check_head_parameters(model, cut: Mapping, linear, devices) -> None:
    """ValueError where a parameter of the head beside the output embeddings' own (ESM's bias
    added after them) gets a gradient from the model's loss and none from this path's, or the
    other way round: logits that agree at one value of it (zero, as initialised) say nothing
    of its gradient. Taken on the prefix `cut`, for those parameters only."""
    inner = _check_covered(model)
    head = next((child for child in inner.children()
                 if any(m is linear for m in child.modules())), linear)
    own = {id(linear.weight), id(linear.bias)}
    named = [(n, p) for n, p in [*head.named_parameters(), *inner.named_parameters(
        recurse=False)] if p.requires_grad and id(p) not in own]
    if not named:
        return
    params = [p for _, p in named]
    with torch.enable_grad():
        with torch.random.fork_rng(devices=devices):
            out = model(**cut)
        theirs = torch.autograd.grad(out["loss"] if isinstance(out, Mapping) else out[0],
                                     params, allow_unused=True)
        with torch.random.fork_rng(devices=devices):
            hidden, amp = _head_input(model, cut, linear)
        with autocast_as(hidden.device.type, amp):
            loss = chunked_cross_entropy(hidden, linear.weight,
                                         cut["labels"].to(hidden.device), bias=linear.bias)
        ours = torch.autograd.grad(loss, params, allow_unused=True)
    differ = [n for (n, _), a, b in zip(named, theirs, ours) if (a is None) != (b is None)]
    if differ:
        raise ValueError(f"masked_lm_loss: {type(model).__name__}'s loss reaches {differ} of "
                         f"its head where this path does not (or the other way round): its "
                         f"head does more than its output embeddings; not covered (use "
                         f"model(**batch).loss)")
