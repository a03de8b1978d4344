"""transformers' causal language models' loss from `labels` with the head and loss in chunks of
tokens (actcodec.torch.limit.chunked_loss): `causal_lm_loss(model, batch)` gives the loss
`model(**batch).loss` gives, and the same gradients, without the full logits.

How: the model's own forward runs on the batch without its labels and with
`logits_to_keep=1`, so the model computes the logits of one position per row only; a forward
hook on its decoder (`model.get_decoder()`, else `model.base_model`) keeps the last hidden
states. The loss is then `chunked_cross_entropy` of those hidden states under the output
embeddings (`model.get_output_embeddings()`: tied or not, with its bias if it has one), the
labels shifted by one as transformers' ForCausalLMLoss shifts them (or `shift_labels` where
the batch gives them), ignore index -100 (or the batch's `ignore_index`), and
`num_items_in_batch` where the batch gives it. The head's transform comes from the config:
`logit_scale` multiplies the logits (Cohere), `logits_scaling` divides them (Granite; it
multiplies them in HyperCLOVAX), `final_logit_softcapping` caps them (Gemma 2 and 3;
`logits_soft_cap` in RecurrentGemma). A mixture of experts' router loss (`aux_loss`, with
output_router_logits) is added as its forward gives it, times `router_aux_loss_coef`.

What it covers is checked, not assumed: the model is a transformers PreTrainedModel (or a PEFT
model of adapters on one, LoRA and the like: its forward runs, on the base model's decoder and
head; wrapped.py) whose
forward takes `logits_to_keep` and computes its loss with transformers' ForCausalLMLoss, its
output embeddings are a Linear layer, its decoder runs once, and the logits the model
computed for the kept position equal the head above applied to the kept hidden states (so a
head the config does not describe, such as a multiplier under another name, is refused, not
silently mis-scaled). Anything else raises ValueError saying what is not covered. `check`
runs the path against the model's own loss on a batch's prefix: Step runs it once per set of
keys and, where it fails, the model's own loss runs whole, with a warning.
"""
from __future__ import annotations

from collections.abc import Mapping
import inspect

import torch

from .chunked_loss import (IGNORE_INDEX, autocast_as, autocast_in, check_labelled,
                           chunked_cross_entropy, labelled_prefix, output_embeddings,
                           transformers_model)
from .loss_weights import shifts_labels

LOSS_KEYS = ("labels", "shift_labels", "num_items_in_batch", "ignore_index")  # not the model's
PREFIX_TOKENS = 8  # the prefix `check` runs the path on
LOGITS_SCALING_MULTIPLIES = {"hyperclovax"}  # logits * logits_scaling, not Granite's division


def causal_lm_loss(model, batch: Mapping, chunk_tokens: int | None = None, *,
                   check_head: bool = True) -> torch.Tensor:
    """`model(**batch).loss` of a transformers `*ForCausalLM` model, with the output projection
    and cross-entropy run `chunk_tokens` targets at a time (see chunked_cross_entropy): the
    same loss and gradients, up to float summation order, with no tokens x vocab tensor.
    Returns the loss, a 0-dim float32 tensor (float64 for a float64 model).
    check_head=False skips comparing the model's last logits with the head this path applies
    (a read from the device: a caller running micro-batches of one step checks the first)."""
    name = type(model).__name__
    check_labelled(batch, "causal_lm_loss")
    base = _check_covered(model)
    head = base.get_output_embeddings()
    decoder = _decoder(base)
    scale, softcap = _head_transform(base.config)

    inputs = {k: v for k, v in batch.items() if k not in LOSS_KEYS}
    captured = []
    device_type = head.weight.device.type
    # the autocast the decoder ran under: a forward may enter it itself (accelerate's
    # mixed precision wraps the model's forward, as the Trainer's bf16=True does), and the
    # head's product is then taken there too
    handle = decoder.register_forward_hook(lambda module, args, output: captured.append(
        (output, autocast_in(device_type))))
    try:
        out = model(**inputs, logits_to_keep=1)
    finally:
        handle.remove()
    if len(captured) != 1:
        raise ValueError(f"causal_lm_loss: {name}'s decoder ({type(decoder).__name__}) ran "
                         f"{len(captured)} times in one forward; not covered (use "
                         f"model(**batch).loss)")
    hidden, amp = _last_hidden_state(captured[0][0], decoder), captured[0][1]
    logits = out["logits"] if isinstance(out, Mapping) else out[0]
    router = _router_term(base, out)
    del out, captured
    with autocast_as(device_type, amp):
        if check_head:
            _check_head(name, logits, hidden, head, scale, softcap)
        del logits
        shift_labels = batch.get("shift_labels")
        labels = batch["labels"] if shift_labels is None else shift_labels
        loss = chunked_cross_entropy(
            hidden, head.weight, labels.to(hidden.device), bias=head.bias,
            chunk_tokens=chunk_tokens, ignore_index=batch.get("ignore_index", IGNORE_INDEX),
            num_items_in_batch=batch.get("num_items_in_batch"), shift=shift_labels is None,
            logit_scale=scale, softcap=softcap)
    return loss if router is None else loss + router.to(loss.device)


def check(model, batch: Mapping) -> None:
    """ValueError unless this path gives the model's loss on the batch: what covers() checks,
    and the model's own loss and this path's (with its head check) on the batch's first row's
    first PREFIX_TOKENS tokens, every one a target, a few roundings apart (no gradients; each
    from the same random state, which is then as it was)."""
    check_labelled(batch, "causal_lm_loss")
    name = type(model).__name__
    cut = labelled_prefix(batch, PREFIX_TOKENS, _check_covered(model).config)
    device = cut["labels"].device
    devices = [device] if device.type == "cuda" else []
    with torch.no_grad():
        with torch.random.fork_rng(devices=devices):
            out = model(**cut)
        theirs = out["loss"] if isinstance(out, Mapping) else out[0]
        del out
        with torch.random.fork_rng(devices=devices):
            ours = causal_lm_loss(model, cut)
        if not isinstance(theirs, torch.Tensor):
            raise ValueError(f"causal_lm_loss: {name} computed no loss from its labels; not "
                             f"covered (use model(**batch).loss)")
        difference, size = torch.stack([(ours.double() - theirs.double()).abs(),
                                        theirs.double().abs()]).tolist()
    tolerance = max(1e-4, 4 * torch.finfo(theirs.dtype).eps) * max(1.0, size)
    if not difference <= tolerance:
        raise ValueError(f"causal_lm_loss: {name}'s loss is not the mean cross-entropy of its "
                         f"shifted labels under its head (they differ by {difference:.3g}); "
                         f"not covered (use model(**batch).loss)")


def covers(model) -> bool:
    """Whether causal_lm_loss covers this model (its class, forward and head; the head's
    transform is checked again at each call)."""
    try:
        _check_covered(model)
    except ValueError:
        return False
    return True


head = output_embeddings  # the output embeddings the loss runs in chunks


def _check_covered(model):
    """wrapped.adapted(model), once what the loss covers is checked."""
    name = type(model).__name__
    model = transformers_model(model, "causal_lm_loss")
    if "logits_to_keep" not in inspect.signature(type(model).forward).parameters:
        raise ValueError(f"causal_lm_loss: {name}.forward takes no logits_to_keep, so it would "
                         f"compute the full logits; not covered")
    if not shifts_labels(model):
        raise ValueError(f"causal_lm_loss: {name}'s loss is not transformers' causal-LM loss "
                         f"(ForCausalLMLoss, called as self.loss_function by a decoder-only "
                         f"model); not covered")
    head = model.get_output_embeddings()
    if not isinstance(head, torch.nn.Linear):
        raise ValueError(f"causal_lm_loss: {name}'s output embeddings are "
                         f"{type(head).__name__}, not a torch.nn.Linear (an adapter on the "
                         f"head is not covered); not covered")
    return model


def _decoder(model):
    """The module whose output is the hidden states the head reads."""
    decoder = model.get_decoder() if hasattr(model, "get_decoder") else None
    if decoder is None or decoder is model:
        decoder = model.base_model
    if decoder is None or decoder is model:
        raise ValueError(f"causal_lm_loss: {type(model).__name__} has no decoder apart from "
                         f"itself (get_decoder(), base_model); not covered")
    return decoder


def _head_transform(config):
    """(logit_scale, softcap) of the head, from the config fields transformers' models use."""
    scale = 1.0
    if hasattr(config, "get_text_config"):  # a vision-language model's: its language model's
        config = config.get_text_config()
    if getattr(config, "logit_scale", None) is not None:
        scale *= float(config.logit_scale)            # Cohere: logits * logit_scale
    if getattr(config, "logits_scaling", None) is not None:
        if getattr(config, "model_type", None) in LOGITS_SCALING_MULTIPLIES:
            scale *= float(config.logits_scaling)
        else:
            scale /= float(config.logits_scaling)     # Granite: logits / logits_scaling
    softcap = getattr(config, "final_logit_softcapping", None)  # Gemma 2, 3: c * tanh(x / c)
    if softcap is None:
        softcap = getattr(config, "logits_soft_cap", None)  # RecurrentGemma: the same
    return (None if scale == 1.0 else scale), (None if softcap is None else float(softcap))


def _router_term(model, out):
    """What a mixture of experts' loss adds to the cross-entropy: its router's load-balancing
    loss, which the forward gives as `aux_loss` (with output_router_logits, from the config
    or the batch), times the model's `router_aux_loss_coef` (JetMoe's `aux_loss_coef`); None
    where it gives none."""
    name = type(model).__name__
    aux = out.get("aux_loss") if isinstance(out, Mapping) else None
    if aux is None:
        if not isinstance(out, Mapping) and getattr(model.config, "output_router_logits", False):
            raise ValueError(f"causal_lm_loss: {name} returned a tuple, in which its router's "
                             f"load-balancing loss cannot be told apart; not covered (use "
                             f"model(**batch).loss)")
        return None
    coefficient = getattr(model, "router_aux_loss_coef", getattr(model, "aux_loss_coef", None))
    if not isinstance(coefficient, (int, float)):
        raise ValueError(f"causal_lm_loss: {name}'s loss adds its router's load-balancing loss "
                         f"with no router_aux_loss_coef this path knows; not covered (use "
                         f"model(**batch).loss)")
    return coefficient * torch.as_tensor(aux)


def _last_hidden_state(output, decoder):
    hidden = getattr(output, "last_hidden_state", None)
    if hidden is None and isinstance(output, (tuple, list)) and output:
        hidden = output[0]
    if not isinstance(hidden, torch.Tensor) or hidden.dim() != 3:
        raise ValueError(f"causal_lm_loss: the decoder ({type(decoder).__name__}) returned no "
                         f"(batch, sequence, hidden) last hidden state; not covered")
    return hidden


def _check_head(name, logits, hidden, head, scale, softcap):
    """The logits the model computed for the last position equal the head this loss applies
    to the last hidden states (a few roundings of the model's dtype apart)."""
    expected_shape = (hidden.shape[0], 1, head.out_features)
    if not isinstance(logits, torch.Tensor) or tuple(logits.shape) != expected_shape:
        raise ValueError(f"causal_lm_loss: {name} with logits_to_keep=1 returned logits of "
                         f"shape {tuple(getattr(logits, 'shape', ()))}, not {expected_shape}; "
                         f"not covered")
    with torch.no_grad():
        last = hidden[:, -1, :]
        ours = (last @ head.weight.t() if head.bias is None
                else torch.addmm(head.bias, last, head.weight.t())).double()
        if scale is not None:
            ours = ours * scale
        if softcap is not None:
            ours = softcap * torch.tanh(ours / softcap)
        theirs = logits[:, -1, :].double()
        # one read from the device for both numbers (each read waits for the device)
        difference, size = torch.stack([(ours - theirs).abs().max(), ours.abs().max()]).tolist()
        size = max(1.0, size)
    # the coarsest dtype the logits passed through (under torch.autocast bfloat16 or float16
    # from float32 hidden states, scaled or capped in that dtype)
    eps = max(torch.finfo(t).eps for t in (
        hidden.dtype, logits.dtype, autocast_in(hidden.device.type)) if t is not None)
    tolerance = max(1e-4, 4 * eps) * size
    if not difference <= tolerance:
        raise ValueError(f"causal_lm_loss: {name}'s logits are not its output embeddings "
                         f"applied to its decoder's last hidden states with logit_scale="
                         f"{scale}, softcap={softcap} (from its config): they differ by "
                         f"{difference:.3g} (tolerance {tolerance:.3g}); its head does "
                         f"something else, not covered (use model(**batch).loss)")
