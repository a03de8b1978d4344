"""transformers' encoder-decoder language models' loss from `labels` (T5, BART and their kin)
with the head and loss in chunks of tokens (actcodec.torch.limit.chunked_loss):
`seq2seq_lm_loss(model, batch)` gives the loss `model(**batch).loss` gives, and the same
gradients up to float summation order, without the labels x vocabulary logits.

How: these models take no `logits_to_keep`, so their forward runs to its head and is stopped
there (a pre-hook on the output embeddings keeps their input and ends the forward before any
logits are made): the decoder's output as the head reads it (T5's `scale_decoder_outputs`
applied), under the autocast the forward entered, if any (accelerate's mixed precision wraps
the forward in it), with dropout drawing what the model's own forward draws. The head is the
output embeddings (a Linear layer) plus BART's `final_logits_bias`. The loss: the
cross-entropy of the labels, unshifted, ignore index -100, the mean over the targets.

What it covers is checked, not assumed: the model is a transformers PreTrainedModel (or a
PEFT model of adapters in its layers, LoRA and such, around one) whose config says
`is_encoder_decoder`, with an encoder, a decoder and Linear output embeddings,
and a batch of input_ids, attention_mask, labels, decoder_input_ids and
decoder_attention_mask only (and use_cache). At each call (or once, by the caller: `check`)
the path above runs on a short prefix of the batch (its first row's first tokens) beside the
model's own forward, without gradients and from the same random state: logits and loss must
agree, or ValueError says what differs (a model that does something else around its head is
refused, not silently mis-scaled).
"""
from __future__ import annotations

from collections.abc import Mapping
import contextlib

import torch

from . import wrapped
from .chunked_loss import (IGNORE_INDEX, autocast_as, check_agrees, check_labelled,
                           chunked_cross_entropy, head_input, output_embeddings,
                           transformers_model)

KEYS = {"input_ids", "attention_mask", "labels", "decoder_input_ids", "decoder_attention_mask",
        "use_cache"}  # use_cache: this path keeps no cache, whatever it says
PREFIX_TOKENS = 8  # the prefix each call checks the path on: source and labels


def seq2seq_lm_loss(model, batch: Mapping, chunk_tokens: int | None = None,
                    checked: bool = False) -> torch.Tensor:
    """`model(**batch).loss` of a transformers encoder-decoder LM (`*ForConditionalGeneration`
    of T5's and BART's kinds), with the output projection and cross-entropy run
    `chunk_tokens` targets at a time (see chunked_cross_entropy), the path checked on the
    batch's prefix first (`check`) unless `checked` (the caller did, once: the prefix's
    forward calls the model's blocks, which a profile's hooks would count). Returns the loss,
    a 0-dim float32 tensor (float64 for a float64 model)."""
    check_labelled(batch, "seq2seq_lm_loss")
    if not checked:
        check(model, batch)
    return _loss(model, batch, chunk_tokens)


def covers(model) -> bool:
    """Whether seq2seq_lm_loss covers this model (its class and head; `check` checks the
    path on a batch)."""
    with contextlib.suppress(ValueError):
        return _check_covered(model) is not None
    return False


head = output_embeddings  # the output embeddings the loss runs in chunks


def _hidden(model, batch: Mapping) -> tuple:
    """The decoder's last hidden states as the head reads them (T5's scale applied), the
    model's forward stopped at its head, and the dtype autocast computed in there."""
    return head_input(model, {**batch, "use_cache": False}, head(model), "seq2seq_lm_loss")


def _bias(model):
    """The head's bias: its own, plus BART's final_logits_bias (a buffer of (1, vocab))."""
    bias = head(model).bias
    final = getattr(wrapped.adapted(model), "final_logits_bias", None)
    if isinstance(final, torch.Tensor):
        final = final.reshape(-1)
        bias = final if bias is None else bias + final
    return bias


def _loss(model, batch: Mapping, chunk_tokens) -> torch.Tensor:
    hidden, amp = _hidden(model, batch)
    with autocast_as(hidden.device.type, amp):
        return chunked_cross_entropy(hidden, head(model).weight,
                                     batch["labels"].to(hidden.device), bias=_bias(model),
                                     chunk_tokens=chunk_tokens, ignore_index=IGNORE_INDEX)


def _check_covered(model):
    """wrapped.adapted(model), once its class and head are checked."""
    name = type(model).__name__
    model = transformers_model(model, "seq2seq_lm_loss")
    if not getattr(model.config, "is_encoder_decoder", False):
        raise ValueError(f"seq2seq_lm_loss: {name} is not an encoder-decoder; not covered")
    if not isinstance(model.get_output_embeddings(), torch.nn.Linear):
        raise ValueError(f"seq2seq_lm_loss: {name}'s output embeddings are not a "
                         f"torch.nn.Linear; not covered")
    return model


def check(model, batch: Mapping) -> None:
    """ValueError unless this path covers the model and the batch: its class and head
    (covers), the batch's keys, and its logits and loss on the batch's first row's first
    PREFIX_TOKENS source tokens and labels equal to the model's own (no gradients; each from
    the same random state, which is then as it was: dropout draws alike, and none of the
    step's are taken)."""
    _check_covered(model)
    others = set(batch) - KEYS
    if others:
        raise ValueError(f"seq2seq_lm_loss: the batch has {sorted(others)}, which this path "
                         f"does not pass on; not covered (use model(**batch).loss)")
    cut = {}
    for key, value in batch.items():
        if isinstance(value, torch.Tensor) and value.dim() == 2:
            value = value[:1, :PREFIX_TOKENS]
        cut[key] = value
    cut["labels"] = cut["labels"].clamp(min=0)  # targets all ignored: both losses NaN
    for key in ("attention_mask", "decoder_attention_mask"):
        if isinstance(cut.get(key), torch.Tensor):
            cut[key] = torch.ones_like(cut[key])
    device = cut["labels"].device
    devices = [device] if device.type == "cuda" else []
    with torch.no_grad():
        with torch.random.fork_rng(devices=devices):
            out = model(**{**cut, "use_cache": False})
        with torch.random.fork_rng(devices=devices):
            hidden, amp = _hidden(model, cut)
        with autocast_as(hidden.device.type, amp):
            weight, bias = head(model).weight, _bias(model)
            ours = torch.nn.functional.linear(hidden, weight, bias)
            loss = chunked_cross_entropy(hidden, weight, cut["labels"], bias=bias)
            check_agrees("seq2seq_lm_loss", model, out, ours, loss,
                         "its output embeddings applied to their input (with "
                         "final_logits_bias as it has it)")
