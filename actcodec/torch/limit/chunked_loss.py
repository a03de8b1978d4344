"""A language model's output projection and cross-entropy over chunks of tokens, exactly: the
full logits (tokens x vocabulary) never exist.

    loss = act.chunked_cross_entropy(hidden, lm_head.weight, labels, shift=True)
    loss.backward()        # hidden, lm_head.weight get the gradients of the unchunked loss

Forward takes the tokens that have a target, a chunk at a time: the chunk's logits (hidden @
weight.T + bias, scaled and soft-capped where asked), their log-softmax in float32, the
chunk's loss and, in the same pass, the gradient of the loss with respect to the chunk's
logits (softmax minus one-hot, over the divisor), turned at once into the chunk's rows of the
hidden states' gradient and its share of the weight's and bias's gradient; then the next
chunk overwrites the chunk's logits. Backward only scales those gradients by the loss's
incoming gradient and hands them over. (The technique of Liger Kernel's fused linear
cross-entropy, written in plain torch. Apple's Cut Cross-Entropy instead keeps only the
log-sum-exp and recomputes the logits in backward: no stored gradients, one more pass of the
projection.)

Memory: two chunk x vocab float32 buffers, reused by every chunk (three with a soft cap),
plus the gradients the forward keeps for backward: the hidden states' (tokens x hidden, their
dtype) and the weight's (vocab x hidden, the weight's dtype: the size its .grad has anyway;
backward hands this very tensor over, so autograd puts it in .grad without a copy), each only
where it is needed (a frozen weight gets none; under no_grad there is none). The weight's and
bias's gradients add up over the chunks in float32: for a bfloat16 or float16 weight, forward
holds a float32 sum (twice the weight's size) and casts it to the weight's dtype at its end;
added up in bfloat16, each chunk would round the sum once more and the error would grow with
the chunk count. These gradients are kept on the Function, not saved through autograd's saved
tensors: saved-tensor hooks (compress_saved) never see them, because a lossily stored
gradient would make the loss inexact. So backward runs once per forward: a second backward
through the same graph (retain_graph=True) raises.

The result equals `F.cross_entropy(hidden @ weight.T + bias, labels)` (with the logits in
float32, as transformers' losses take them), loss and gradients, up to float summation
order. Tokens without a target (ignore_index) cost nothing: no logits are computed for them
and their rows of the gradient are zero. With no target at all, the mean is NaN (0/0) and the
gradients are zero, as torch's; with num_items_in_batch it is 0.
"""
from __future__ import annotations

import contextlib

from collections.abc import Mapping
import dataclasses
import math
import numbers
import sys

import torch
import torch.nn.functional as F
from torch.autograd.function import once_differentiable

from . import vision_grid, wrapped

IGNORE_INDEX = -100  # the label transformers' losses and torch's cross entropy skip
# The default chunk: this many bytes of float32 logits (512 tokens at a 32k vocabulary). Each
# chunk streams the weight twice and adds into its whole gradient once, so fewer, larger chunks
# are faster: on 2 CPU cores at 2k tokens, 32k vocabulary, hidden 1024, chunks of 512 tokens
# took 0.93-0.99x the unchunked loss's time, 256 0.98-1.01x, 128 1.10-1.13x, at 300, 226 and
# 191 MiB above the floor against its 792 (docs/CHUNKED_LOSS.md).
CHUNK_LOGITS_BYTES = 64 << 20


def default_chunk_tokens(vocab_size: int, logits_bytes: int = CHUNK_LOGITS_BYTES) -> int:
    """The default chunk: as many tokens as make `logits_bytes` of float32 logits (512
    tokens at a 32k vocabulary by default), at least one."""
    return max(1, logits_bytes // (4 * vocab_size))


def transformers_model(model, caller: str):
    """The transformers model a chunked language-model loss runs (wrapped.adapted: a PEFT
    model of layer adapters unwrapped); ValueError, naming `caller`, where it is not one."""
    from . import wrapped

    name = type(model).__name__
    model = wrapped.adapted(model)
    transformers = sys.modules.get("transformers")  # not imported: not one of its models
    if transformers is None or not isinstance(model, transformers.PreTrainedModel):
        raise ValueError(f"{caller}: {name} is not a transformers PreTrainedModel (a wrapped "
                         f"one, DistributedDataParallel or a PEFT model of prompt learning, "
                         f"is not covered either); for a head of your own, use "
                         f"chunked_cross_entropy(hidden, weight, labels, ...)")
    return model


def check_labelled(batch, caller: str) -> None:
    """A language model's loss from a batch: TypeError unless it is a dict (the model's inputs
    and its labels), ValueError where it has no labels (model(**batch).loss would be None)."""
    if not isinstance(batch, Mapping):
        raise TypeError(f"{caller}: batch must be a dict of the model's inputs and its "
                        f"labels, got {type(batch).__name__}")
    if batch.get("labels") is None:
        raise ValueError(f"{caller}: the batch has no 'labels' (model(**batch).loss "
                         f"would be None)")


def labelled_prefix(batch: Mapping, tokens: int, config=None) -> dict:
    """A language model's batch cut to its first row's first `tokens` tokens (every tensor of
    the labels' length: ids, masks, labels, embeddings; other tensors of a row per sample, a
    vision-language model's images, to their first row), each one a target (a prefix whose
    targets are all ignored gives both losses NaN), attended to in full, without
    num_items_in_batch (a count of the whole batch's): what a check of a chunked path
    against the model's own loss runs on. Where the model's `config` names an image token,
    the prefix goes `tokens` past the first row's last one (a model refuses an image cut
    short)."""
    labels = batch["labels"]
    length = labels.shape[-1] if labels.dim() else 0
    samples = labels.shape[0] if labels.dim() >= 2 else None
    keep = min(length, tokens + _past_image_tokens(batch, config))
    cut = {}
    for key, value in batch.items():
        if key == "num_items_in_batch":
            continue
        if isinstance(value, torch.Tensor) and value.dim() >= 2 and value.shape[1] == length:
            value = value[:1, :keep]
        elif isinstance(value, torch.Tensor) and value.dim() >= 1 and samples is not None \
                and value.shape[0] == samples:
            value = value[:1]
        cut[key] = value
    if vision_grid.applies(batch):  # images as rows of patches: the first row's
        cut.update(vision_grid.take(batch, 0, 1))
    for key in ("labels", "shift_labels"):
        if isinstance(cut.get(key), torch.Tensor):
            cut[key] = cut[key].clamp(min=0)
    if isinstance(cut.get("attention_mask"), torch.Tensor):
        cut["attention_mask"] = torch.ones_like(cut["attention_mask"])
    return cut


def _past_image_tokens(batch: Mapping, config) -> int:
    """The position after the first row's last image or video token (0 where it has none,
    or the config names none)."""
    ids = batch.get("input_ids")
    tokens = [t for t in (getattr(config, key, None) for key in (
        "image_token_id", "image_token_index", "video_token_id")) if isinstance(t, int)]
    if not tokens or not isinstance(ids, torch.Tensor) or ids.dim() != 2:
        return 0
    at = torch.isin(ids[0], torch.tensor(tokens, device=ids.device)).nonzero()
    return int(at[-1]) + 1 if len(at) else 0


def output_embeddings(model) -> torch.nn.Module:
    """The output embeddings a model's chunked loss runs (wrapped.adapted: a PEFT model's
    base holds them)."""
    return wrapped.adapted(model).get_output_embeddings()


def check_agrees(caller: str, model, out, ours: torch.Tensor, loss, path: str) -> None:
    """ValueError, naming `caller`, unless the model's own output on a prefix (`out`: its
    logits and loss) agrees with a chunked path's logits `ours` and `loss` on it, a few
    roundings of their dtype apart (`path`: how the path makes its logits, for the message).
    `loss` may be a function giving it, called once the logits' shapes agree (a layer that
    is not the model's head may not take its labels). Run under no_grad."""
    name = type(model).__name__
    theirs = out["logits"] if isinstance(out, Mapping) else out[1]
    their_loss = out["loss"] if isinstance(out, Mapping) else out[0]
    if not isinstance(theirs, torch.Tensor) or theirs.shape != ours.shape:
        raise ValueError(f"{caller}: {name}'s logits have shape "
                         f"{tuple(getattr(theirs, 'shape', ()))}, not {tuple(ours.shape)} as "
                         f"{path}; not covered")
    if not isinstance(their_loss, torch.Tensor):
        raise ValueError(f"{caller}: {name} computed no loss from its labels; not covered "
                         f"(use model(**batch).loss)")
    if callable(loss):
        loss = loss()
    difference, size, loss_difference = torch.stack([
        (ours.double() - theirs.double()).abs().max(), theirs.double().abs().max(),
        (loss.double() - their_loss.double()).abs()]).tolist()
    tolerance = max(1e-4, 4 * torch.finfo(ours.dtype).eps) * max(1.0, size)
    if not difference <= tolerance:
        raise ValueError(f"{caller}: {name}'s logits are not {path}: they differ by "
                         f"{difference:.3g} (tolerance {tolerance:.3g}); not covered (use "
                         f"model(**batch).loss)")
    if not loss_difference <= tolerance:
        raise ValueError(f"{caller}: {name}'s loss is not the mean cross-entropy of its "
                         f"labels (they differ by {loss_difference:.3g}); not covered (use "
                         f"model(**batch).loss)")


def chunked_cross_entropy(hidden: torch.Tensor, weight: torch.Tensor, labels: torch.Tensor, *,
                          bias: torch.Tensor | None = None, chunk_tokens: int | None = None,
                          ignore_index: int = IGNORE_INDEX, reduction: str = "mean",
                          num_items_in_batch=None, shift: bool = False,
                          logit_scale: float | None = None,
                          softcap: float | None = None) -> torch.Tensor:
    """The cross-entropy of `labels` under the logits `hidden @ weight.T + bias`, computed
    `chunk_tokens` targets at a time (default: default_chunk_tokens(vocab)).

    hidden: (..., hidden_size), floating; weight: (vocab, hidden_size), and bias (vocab,),
    of hidden's dtype and device. labels: integers of shape hidden.shape[:-1], each in
    [0, vocab) or `ignore_index`. shift=True: the target of position t is labels[..., t + 1]
    (a causal language model's labels, as transformers shifts them; the last position of a
    row has none). The logits: `logit_scale * (hidden @ weight.T + bias)`, then, with
    `softcap`, `softcap * tanh(logits / softcap)`; the log-softmax is taken in float32 (in
    float64 for float64 inputs). Under torch.autocast, float32 hidden, weight and bias are
    taken in its dtype, as a Linear there takes them.

    reduction="mean": the sum of the targets' losses over their count, or over
    `num_items_in_batch` where given (transformers' gradient-accumulation normalization: then
    0, not NaN, when there is no target); "sum": their sum. Returns a 0-dim float32 tensor
    (float64 for float64 inputs)."""
    device_type = hidden.device.type if isinstance(hidden, torch.Tensor) else "cpu"
    autocast = torch.is_autocast_enabled(device_type)
    if autocast:
        # the head's product in autocast's dtype, as the model's Linear takes it under
        # torch.autocast from float32 hidden states, weight and bias (the casts' backward
        # brings their gradients back to float32); inside, every dtype is the one given
        low = torch.get_autocast_dtype(device_type)
        hidden, weight, bias = (
            t.to(low) if isinstance(t, torch.Tensor) and t.dtype == torch.float32 else t
            for t in (hidden, weight, bias))
    _check(hidden, weight, bias, labels, chunk_tokens, reduction, num_items_in_batch, shift,
           logit_scale, softcap)
    vocab = weight.shape[0]
    targets = labels
    if shift:
        targets = F.pad(labels, (0, 1), value=ignore_index)[..., 1:]
    targets = targets.reshape(-1).to(hidden.device)
    rows, low, high = _targets(targets, ignore_index)
    if rows.numel() and (low < 0 or high >= vocab):
        bad = low if low < 0 else high
        raise ValueError(f"chunked_cross_entropy: label {bad} is outside the vocabulary "
                         f"[0, {vocab}) and is not ignore_index ({ignore_index})")
    if reduction == "sum":
        divisor = 1.0
    elif num_items_in_batch is not None:
        divisor = float(num_items_in_batch)
    else:
        divisor = float(rows.numel())  # 0 with no target: the loss is 0/0, NaN, as torch's
    grad_on = torch.is_grad_enabled()
    options = _Options(
        chunk_tokens=chunk_tokens or default_chunk_tokens(vocab), divisor=divisor,
        logit_scale=None if logit_scale is None else float(logit_scale),
        softcap=None if softcap is None else float(softcap),
        grad_hidden=grad_on and hidden.requires_grad,
        grad_weight=grad_on and weight.requires_grad,
        grad_bias=grad_on and bias is not None and bias.requires_grad)
    with torch.autocast(device_type, enabled=False) if autocast else contextlib.nullcontext():
        return _ChunkedCrossEntropy.apply(hidden, weight, bias, targets, rows, options)


def autocast_in(device_type: str):
    """The dtype torch.autocast computes in on `device_type` now, None where it is off."""
    return torch.get_autocast_dtype(device_type) if torch.is_autocast_enabled(device_type) \
        else None


def autocast_as(device_type: str, dtype):
    """A context in which autocast on `device_type` computes in `dtype` (None: off), as a
    model's forward ran (a forward may enter autocast itself, or leave it)."""
    if autocast_in(device_type) == dtype:
        return contextlib.nullcontext()
    return torch.autocast(device_type, dtype=dtype) if dtype is not None else \
        torch.autocast(device_type, enabled=False)


class _Reached(Exception):
    """Raised by head_input's hook: the forward stops where the head would run."""


def head_input(model, inputs: Mapping, head: torch.nn.Module, caller: str) -> tuple:
    """What `model(**inputs)` hands its head (the output embeddings), the forward stopped
    there (no logits made), and the dtype autocast computed in there (None: off; a forward
    may enter autocast itself, as accelerate's mixed precision makes it, and the head's
    product is then taken there too)."""
    captured = []

    def stop(module, args):
        captured.append((args[0], autocast_in(head.weight.device.type)))
        raise _Reached

    handle = head.register_forward_pre_hook(stop)
    try:
        model(**inputs)
    except _Reached:
        pass
    finally:
        handle.remove()
    if len(captured) != 1 or not isinstance(captured[0][0], torch.Tensor):
        raise ValueError(f"{caller}: {type(model).__name__}'s forward did not call its output "
                         f"embeddings on one tensor; not covered (use model(**batch).loss)")
    return captured[0]


def _targets(targets: torch.Tensor, ignore_index: int):
    """(rows, least, greatest): the flat positions that have a target, and the least and
    greatest of their labels (0, 0 with none), with one read from the device: the count
    that sizes `rows` and the bounds that check the labels travel together (read apart, each
    would be a wait for the device)."""
    counted = targets != ignore_index
    if not targets.numel():
        return counted.nonzero().squeeze(1), 0, 0
    labels = targets.to(torch.int64)
    top, bottom = torch.iinfo(torch.int64).max, torch.iinfo(torch.int64).min
    count, low, high = torch.stack([counted.sum(), torch.where(counted, labels, top).min(),
                                    torch.where(counted, labels, bottom).max()]).tolist()
    rows = torch.nonzero_static(counted, size=count).squeeze(1)
    return (rows, low, high) if count else (rows, 0, 0)


@dataclasses.dataclass(frozen=True)
class _Options:
    chunk_tokens: int
    divisor: float          # the loss is the targets' summed loss over this
    logit_scale: float | None
    softcap: float | None
    grad_hidden: bool       # which gradients forward computes (only those backward can use)
    grad_weight: bool
    grad_bias: bool


class _ChunkedCrossEntropy(torch.autograd.Function):
    """Forward computes the loss and the gradients it will need; backward scales them."""

    @staticmethod
    def forward(ctx, hidden, weight, bias, targets, rows, options: _Options):
        loss, grads = chunked_loss_and_grads(hidden, weight, bias, targets, rows, options)
        ctx.grads = grads  # not save_for_backward: see the module's docstring
        return loss

    @staticmethod
    @once_differentiable
    def backward(ctx, grad_loss):
        grads, ctx.grads = ctx.grads, None  # handed over: autograd may take them as .grad
        if grads is None:
            raise RuntimeError("chunked_cross_entropy: backward ran a second time through the "
                               "same forward; its gradients are computed in forward and handed "
                               "over once (retain_graph=True is not supported): run the "
                               "forward again")
        # On a device the product is taken whatever the incoming gradient (a product with 1.0
        # is exact): reading it to skip the product would wait for the device.
        if grad_loss.device.type != "cpu" or float(grad_loss) != 1.0:
            for grad in grads:
                if grad is not None:
                    grad.mul_(grad_loss.to(grad.dtype))  # ours alone: in place, no copy
        grad_hidden, grad_weight, grad_bias = grads
        return grad_hidden, grad_weight, grad_bias, None, None, None


def chunked_loss_and_grads(hidden, weight, bias, targets, rows, options: _Options):
    """The loss and (grad_hidden, grad_weight, grad_bias) of the loss (None where not asked
    for), one chunk of `rows` (the flat positions that have a target) at a time."""
    size, vocab = hidden.shape[-1], weight.shape[0]
    flat = hidden.reshape(-1, size)
    compute = torch.promote_types(hidden.dtype, torch.float32)
    grad_hidden = torch.zeros_like(flat) if options.grad_hidden else None
    # The weight's and bias's gradients add up over chunks in float32 (at least): added up in
    # bfloat16, each chunk would round the sum again, the error growing with the chunk count.
    grad_weight = (torch.zeros(weight.shape, dtype=compute, device=weight.device)
                   if options.grad_weight else None)
    grad_bias = (torch.zeros(bias.shape, dtype=compute, device=bias.device)
                 if options.grad_bias else None)
    any_grad = options.grad_hidden or options.grad_weight or options.grad_bias
    total = torch.zeros((), dtype=compute, device=hidden.device)
    # Two chunk x vocab buffers serve every chunk: the logits, and their log-softmax, which
    # becomes the chunk's gradient in place. (Fresh ones per chunk would each be mapped and
    # faulted in anew: glibc maps every allocation above 32 MiB afresh.)
    width = min(options.chunk_tokens, rows.numel())
    logits_buffer = torch.empty(width, vocab, dtype=compute, device=hidden.device)
    logp_buffer = torch.empty(width, vocab, dtype=compute, device=hidden.device)
    for start in range(0, rows.numel(), options.chunk_tokens):
        chunk = rows[start:start + options.chunk_tokens]
        n = len(chunk)
        h = flat.index_select(0, chunk)
        t = targets.index_select(0, chunk)[:, None]
        logits, logp = logits_buffer[:n], logp_buffer[:n]  # the first n rows: contiguous
        if hidden.dtype == compute:
            if bias is None:
                torch.mm(h, weight.t(), out=logits)
            else:
                torch.addmm(bias, h, weight.t(), out=logits)
        else:  # the logits in hidden's dtype, as the model computes them, then upcast
            logits.copy_(h @ weight.t() if bias is None else torch.addmm(bias, h, weight.t()))
        if options.logit_scale is not None:
            logits.mul_(options.logit_scale)
        tanh = None
        if options.softcap is not None:  # tanh kept in the logits' buffer for backward's sake
            tanh = logits.div_(options.softcap).tanh_()
            logits = tanh * options.softcap
        torch.log_softmax(logits, dim=1, out=logp)
        del logits
        total -= logp.gather(1, t).sum()
        if not any_grad:
            continue
        # d loss / d logits = (softmax - onehot(target)) / divisor, then back through the cap
        # (d/dx c*tanh(x/c) = 1 - tanh^2) and the scale: the log-softmax becomes the gradient.
        grad = logp.exp_()
        grad.scatter_add_(1, t, torch.full_like(t, -1.0, dtype=compute))
        if tanh is not None:
            grad.mul_(tanh.mul_(tanh).neg_().add_(1.0))
            del tanh
        factor = (options.logit_scale or 1.0) / options.divisor
        if hidden.dtype != compute:  # scaled before it is rounded to hidden's dtype, as in
            grad.mul_(factor)        # autograd; in float32 the scale goes on the products
            factor = 1.0
        if grad_hidden is not None:  # in hidden's dtype, as autograd's matmul would
            grad_hidden.index_copy_(0, chunk, (grad.to(hidden.dtype) @ weight).mul_(factor))
        if grad_weight is not None:
            grad_weight.addmm_(grad.t(), h.to(compute), alpha=factor)
        if grad_bias is not None:
            grad_bias.add_(grad.sum(0), alpha=factor)
    loss = total / options.divisor
    if grad_hidden is not None:
        grad_hidden = grad_hidden.view(hidden.shape)
    if grad_weight is not None:
        grad_weight = grad_weight.to(weight.dtype)  # the same tensor where that is float32
    if grad_bias is not None:
        grad_bias = grad_bias.to(bias.dtype)
    return loss, (grad_hidden, grad_weight, grad_bias)


def _check(hidden, weight, bias, labels, chunk_tokens, reduction, num_items_in_batch, shift,
           logit_scale, softcap):
    name = "chunked_cross_entropy"
    for label, t in (("hidden", hidden), ("weight", weight), ("labels", labels)):
        if not isinstance(t, torch.Tensor):
            raise TypeError(f"{name}: {label} must be a tensor, got {type(t).__name__}")
    if not hidden.is_floating_point() or hidden.dim() < 1:
        raise ValueError(f"{name}: hidden must be a floating tensor (..., hidden_size), got "
                         f"{hidden.dtype} of shape {tuple(hidden.shape)}")
    if weight.dim() != 2 or weight.shape[1] != hidden.shape[-1]:
        raise ValueError(f"{name}: weight must be (vocab, hidden_size={hidden.shape[-1]}), got "
                         f"shape {tuple(weight.shape)}")
    if weight.dtype != hidden.dtype or weight.device != hidden.device:
        raise ValueError(f"{name}: weight ({weight.dtype}, {weight.device}) must have hidden's "
                         f"dtype and device ({hidden.dtype}, {hidden.device})")
    if bias is not None:
        if not isinstance(bias, torch.Tensor) or tuple(bias.shape) != (weight.shape[0],):
            raise ValueError(f"{name}: bias must be a tensor of shape ({weight.shape[0]},), got "
                             f"{getattr(bias, 'shape', type(bias).__name__)}")
        if bias.dtype != hidden.dtype or bias.device != hidden.device:
            raise ValueError(f"{name}: bias ({bias.dtype}, {bias.device}) must have hidden's "
                             f"dtype and device ({hidden.dtype}, {hidden.device})")
    if labels.is_floating_point() or labels.is_complex() or labels.dtype == torch.bool:
        raise ValueError(f"{name}: labels must be integer class indices, got {labels.dtype}")
    if tuple(labels.shape) != tuple(hidden.shape[:-1]):
        raise ValueError(f"{name}: labels' shape {tuple(labels.shape)} must be hidden's without "
                         f"its last dimension, {tuple(hidden.shape[:-1])}")
    if shift and labels.dim() < 1:
        raise ValueError(f"{name}: shift=True needs labels with a sequence dimension, got a "
                         f"0-dim tensor")
    if chunk_tokens is not None and (isinstance(chunk_tokens, bool)
                                     or not isinstance(chunk_tokens, numbers.Integral)
                                     or chunk_tokens < 1):
        raise ValueError(f"{name}: chunk_tokens must be a positive int or None, got "
                         f"{chunk_tokens!r}")
    if reduction not in ("mean", "sum"):
        raise ValueError(f"{name}: reduction must be 'mean' or 'sum', got {reduction!r}")
    if num_items_in_batch is not None:
        if reduction != "mean":
            raise ValueError(f"{name}: num_items_in_batch divides the summed loss in place of "
                             f"the count of targets; it goes with reduction='mean', not "
                             f"{reduction!r}")
        items = num_items_in_batch
        if isinstance(items, torch.Tensor) and items.numel() == 1:
            items = items.item()
        if isinstance(items, bool) or not isinstance(items, numbers.Real) or not items > 0:
            raise ValueError(f"{name}: num_items_in_batch must be a positive number (or a "
                             f"one-element tensor), got {num_items_in_batch!r}")
    for label, value in (("logit_scale", logit_scale), ("softcap", softcap)):
        if value is None:
            continue
        if (isinstance(value, bool) or not isinstance(value, numbers.Real)
                or not math.isfinite(value) or (label == "softcap" and value <= 0)):
            bound = " above 0" if label == "softcap" else ""
            raise ValueError(f"{name}: {label} must be a finite number{bound} or None, got "
                             f"{value!r}")
