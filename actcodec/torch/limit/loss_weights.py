"""Each micro-batch's share of the batch's loss, so that micro-batches add up to the gradient
of one full-batch forward.

The default loss of a dict batch, `model(**b).loss`, is a mean over the targets the loss
counts, not over samples. transformers' losses (and torch's cross entropy) skip labels of
-100, which is how every Hugging Face collator pads them (a segmentation model's skip its
config's ignore index, 255); a causal LM's loss
(transformers.loss.loss_utils.ForCausalLMLoss) first shifts them by one (the target of
position t is labels[t + 1]), so a row's first label is never a target. A micro-batch's share
is its count of targets over the batch's. With `num_items_in_batch` in the batch (as
transformers' Trainer passes it) and a loss that divides by it (divides_by_items), each
micro-batch's loss is already its sum over the whole batch's count, and the micro-batches
simply add up; a loss that ignores it (BERT's, T5's: a mean of their own) is weighed by its
targets as without it."""
from __future__ import annotations

import ast
import inspect
import sys
import textwrap
from collections.abc import Mapping

import torch

from . import wrapped

IGNORE_INDEX = -100  # the label transformers' losses and torch's cross entropy skip


def shares(batch, size: int, ranges: list, default_loss: bool, counted=None,
           model=None) -> list:
    """Each (start, stop) range's share of the batch's loss (the shares add up to 1, or
    are all 1 where each micro-batch's loss is already normalized over the whole batch).

    The default loss of a dict batch: by `num_items_in_batch` (all 1) where `model`'s loss
    divides by it (divides_by_items), or by the targets of its `labels` (`counted`:
    start_counting's, all 0 where the batch has no target: its loss is NaN, as one
    forward's; given with the count, start_counting found the loss does not divide by it);
    a CTC model's (ctc_reduction): all 1 for a sum, by sample count for a mean; anything else
    (a loss_fn's mean, or labels not per sample): by sample count."""
    if default_loss and isinstance(batch, Mapping):
        if ctc_reduction(model) == "sum" or (
                batch.get("num_items_in_batch") is not None and counted is None and
                divides_by_items(model, batch)):
            return [1.0] * len(ranges)
        if counted is not None:
            per_sample = counted.read()
            counts = [sum(per_sample[start:stop]) for start, stop in ranges]
            total = sum(counts)
            return [c / total if total else 0.0 for c in counts]
    return [(stop - start) / size for start, stop in ranges]


def uneven(counted, size: int, ranges: list) -> bool:
    """Whether weighing `ranges` by their samples gives them other shares than their
    targets (`counted`: start_counting's) would: labels padded with -100 unevenly across the
    micro-batches (False where the targets are not known)."""
    if counted is None:
        return False
    per_sample = counted.read()
    total = sum(per_sample)
    return total > 0 and any(
        abs(sum(per_sample[start:stop]) / total - (stop - start) / size) > 1e-6
        for start, stop in ranges)


def start_counting(model, batch, size: int, wanted: bool = True):
    """The targets of each sample (per_sample_targets) on their way to the host, for shares
    and uneven: started before the step is planned, so that on a device the count is queued
    behind the work already there and read once the plan is made, rather than waited for at
    once; None where they are not known, not `wanted`, or the micro-batches' losses are
    normalized over the whole batch already (`num_items_in_batch`, divides_by_items)."""
    if not wanted or not isinstance(batch, Mapping) or ctc_reduction(model) is not None or (
            batch.get("num_items_in_batch") is not None and divides_by_items(model, batch)):
        return None
    per_sample = per_sample_targets(model, batch, size)
    return None if per_sample is None else OnTheWay(per_sample)


class OnTheWay:
    """A small tensor on its way to the host: on a GPU copied into pinned memory behind the
    work queued before it, with an event after the copy; `read()` waits for that event only
    (a CPU tensor is read as it is)."""

    def __init__(self, t: torch.Tensor):
        if t.device.type == "cuda":
            self.host = torch.empty(t.shape, dtype=t.dtype, pin_memory=True)
            self.host.copy_(t, non_blocking=True)
            self.event = torch.cuda.Event()
            self.event.record(torch.cuda.current_stream(t.device))
        else:
            self.host, self.event = t, None

    def read(self) -> list:
        if self.event is not None:
            self.event.synchronize()
        return self.host.tolist()


def count_targets(model, batch) -> int:
    """How many targets `model`'s own loss of the dict `batch` averages over: its labels not
    -100 (a transformers causal LM's after their shift by one; `shift_labels` as given),
    every element of float labels. The weight a loss_fn returns with a mean over targets,
    `(loss, count_targets(model, micro_batch))`, so that Step's micro-batches add up to the
    whole batch's gradient. ValueError where the batch has no labels with a row per sample."""
    n = targets(model, batch)
    if n is None:
        raise ValueError("count_targets needs a dict batch with a `labels` (or `shift_labels`) "
                         "tensor of one row per sample")
    return n


def targets(model, batch, size: int | None = None, start: int = 0, stop: int | None = None):
    """How many targets the default loss of `batch[start:stop]` averages over, or None where
    that is not known (see per_sample_targets)."""
    per_sample = per_sample_targets(model, batch, size)
    return None if per_sample is None else int(per_sample[start:stop].sum())


def per_sample_targets(model, batch, size: int | None = None) -> torch.Tensor | None:
    """Per sample (a tensor on the labels' device, nothing read), how many targets the
    default loss of `batch` averages over, or None where that is not known (no `labels`
    tensor with one row per sample, `size` rows where given). Integer labels: those not -100
    (ignore_index: a segmentation model's own; a causal LM's after its shift, or
    `shift_labels` where the batch gives them; of the tokens the attention mask keeps, where
    the model's loss takes only those: _loss_on_attended); float
    labels (regression, multi-label): every element. A masked image model without labels
    (SimMIM's, whose loss is a mean over the masked patches): its `bool_masked_pos`. Question
    answering (`start_positions`, `end_positions`): 1 for a sample whose positions are within
    its input, 0 for one whose loss ignores them (_answers_kept)."""
    if not isinstance(batch, Mapping):
        return None
    shifted = batch.get("shift_labels")
    given = isinstance(shifted, torch.Tensor)  # shifted already: counted as they are
    labels = shifted if given else batch.get("labels")
    if labels is None:
        kept = _answers_kept(batch)
        if kept is not None:  # a question answering loss: two means over the kept samples
            starts, ends = kept
            if size is not None and starts.shape[0] != size:
                return None
            return starts.to(torch.int64)
    if labels is None and _masked_image_modeling(model):
        labels = batch.get("bool_masked_pos")  # SimMIM's loss: a mean over masked patches
        if isinstance(labels, torch.Tensor) and labels.dim() >= 2 and \
                (size is None or labels.shape[0] == size):
            return labels.flatten(1).sum(1, dtype=torch.int64)
        return None
    if not isinstance(labels, torch.Tensor) or labels.dim() == 0:
        return None
    if size is not None and labels.shape[0] != size:
        return None  # not one row per sample: how a micro-batch's part counts is unknown
    rows = labels.shape[0]
    if labels.is_floating_point():
        return torch.full((rows,), labels[0].numel() if rows else 0, dtype=torch.int64,
                          device=labels.device)
    if not given and labels.dim() >= 2 and shifts_labels(model, own=True):
        labels = labels[..., 1:]
    counted = labels != ignore_index(model)
    mask = batch.get("attention_mask")
    if isinstance(mask, torch.Tensor) and mask.shape == counted.shape and \
            _loss_on_attended(model):
        counted = counted & (mask == 1)
    return counted.flatten(1).sum(1) if counted.dim() >= 2 else counted.to(torch.int64)


def _answers_kept(batch):
    """Per sample, whether a question answering loss keeps its start and its end position
    (transformers' ForQuestionAnsweringLoss clamps them to [0, length] and ignores those at
    the length: beyond the input), as two bool tensors; None where the batch has no
    `start_positions` and `end_positions` or its input's length is not known."""
    starts, ends = batch.get("start_positions"), batch.get("end_positions")
    inputs = batch.get("input_ids")
    inputs = inputs if isinstance(inputs, torch.Tensor) else batch.get("inputs_embeds")
    if not all(isinstance(t, torch.Tensor) and t.dim() >= 1 for t in (starts, ends, inputs)) \
            or inputs.dim() < 2:
        return None
    length = inputs.shape[1]
    return starts.flatten(1).amax(1) < length if starts.dim() > 1 else starts < length, \
        ends.flatten(1).amax(1) < length if ends.dim() > 1 else ends < length


def _masked_image_modeling(model) -> bool:
    """Whether `model` is a transformers masked image model (ViT's, Swin's, DeiT's SimMIM
    heads: *ForMaskedImageModeling), whose loss without labels averages the reconstruction
    over the patches its `bool_masked_pos` masks."""
    return model is not None and \
        type(wrapped.inner(model)).__name__.endswith("ForMaskedImageModeling")


def _loss_on_attended(model) -> bool:
    """Whether the model's forward takes its loss over the tokens its attention mask keeps
    only (transformers' `active_loss = attention_mask... == 1`: ELECTRA's and Funnel's
    discriminators, whose labels are never -100, and a few token classifiers)."""
    if model is None:
        return False
    forward = inspect.unwrap(type(wrapped.inner(model)).forward)
    return "active_loss" in getattr(getattr(forward, "__code__", None), "co_varnames", ())


def ctc_reduction(model) -> str | None:
    """The reduction of a transformers CTC model's loss (its config's ctc_loss_reduction:
    "sum" over samples, or "mean": each sample's loss over its target length, then the
    mean over samples), None for any other model. Its labels are targets padded with -100,
    but its loss is no mean over them: micro-batches' sums add up, and means weigh by their
    samples."""
    config = _config(model)
    if config is None or not type(wrapped.inner(model)).__name__.endswith("ForCTC"):
        return None
    return getattr(config, "ctc_loss_reduction", None)


def _config(model):
    """The transformers config of `model` (a wrapper's: its model's), or None."""
    return None if model is None else getattr(wrapped.inner(model), "config", None)


def ignore_index(model) -> int:
    """The label the model's own loss skips: -100 (transformers' and torch's), or a
    segmentation model's `semantic_loss_ignore_index` (255 by default: SegFormer, BEiT, DPT,
    UperNet...)."""
    index = getattr(_config(model), "semantic_loss_ignore_index", None)
    return index if isinstance(index, int) else IGNORE_INDEX


# Labels of one per sample that a transformers pretraining or double head's loss takes beside
# its token `labels` (BERT's and Megatron-BERT's next sentence, ALBERT's sentence order,
# GPT-2's and GPT's multiple choice)
SAMPLE_LABELS = ("next_sentence_label", "sentence_order_label", "mc_labels")


def mixed_means(model, batch) -> str | None:
    """Why micro-batches of this batch cannot add up to its loss, or None: a loss that adds
    a mean over the targets of `labels` to a mean over the samples of another label
    (SAMPLE_LABELS), where the samples hold different numbers of targets, or a question
    answering loss whose samples keep their start position and not their end or the other
    way round (_answers_kept): no one share of each micro-batch weighs both."""
    if not isinstance(batch, Mapping):
        return None
    kept = _answers_kept(batch)
    if kept is not None and kept[0].shape == kept[1].shape and \
            not bool((kept[0] == kept[1]).all()):
        return ("the model's loss averages start positions and end positions over the samples "
                "that keep each (those beyond the input are ignored), and some samples keep "
                "one and not the other: no share of each micro-batch weighs both")
    other = next((key for key in SAMPLE_LABELS if batch.get(key) is not None), None)
    if other is None:
        return None
    per_sample = per_sample_targets(model, batch)
    if per_sample is None or per_sample.numel() < 2 or \
            bool((per_sample == per_sample[0]).all()):
        return None
    return (f"the model's loss adds a mean over the targets of `labels` to one over the "
            f"samples of `{other}`, and its samples hold different numbers of targets: no "
            f"share of each micro-batch weighs both")


# The keys under which transformers' detection and universal segmentation models take their
# targets as a list of one dict or tensor per sample (DETR's and YOLOS' `labels`,
# MaskFormer's `mask_labels` and `class_labels`)
OBJECT_TARGETS = ("labels", "mask_labels", "class_labels")


def whole_batch_targets(batch, size: int) -> str | None:
    """Why the targets of this dict batch cannot be shared among micro-batches, or None:
    targets as a list per sample (OBJECT_TARGETS: such a loss matches each sample's objects,
    then divides by the objects of the whole batch, DETR's num_boxes, and weighs its
    no-object class against them); `labels` that are not one row per sample, or those of a
    masked image model (BEiT's: of the masked patches alone, in one row for the batch);
    indices into the whole batch's frames (wav2vec 2.0 pretraining's
    `sampled_negative_indices`, whose loss also takes the codevectors' perplexity over the
    batch)."""
    if not isinstance(batch, Mapping) or size < 2:
        return None
    for key in OBJECT_TARGETS:
        if isinstance(batch.get(key), (list, tuple)):
            return (f"the batch's `{key}` is a list of targets per sample, and the model's loss "
                    f"matches objects and divides by those of the whole batch (DETR's "
                    f"num_boxes): micro-batches would weigh them by samples")
    uncut = uncut_labels(batch, size)
    if uncut is not None:
        return uncut
    if isinstance(batch.get("sampled_negative_indices"), torch.Tensor):
        return ("the batch's sampled_negative_indices index the frames of the whole batch, "
                "and the model's loss takes its codevectors' perplexity over the batch")
    return None


def uncut_labels(batch, size: int) -> str | None:
    """Why the `labels` tensor of this dict batch cannot be cut into the labels of its samples,
    or None: not one row per sample, or a masked image model's (beside `bool_masked_pos`: of
    the masked patches alone, BEiT's, in one row for the batch)."""
    labels = batch.get("labels") if isinstance(batch, Mapping) and size > 1 else None
    if isinstance(labels, torch.Tensor) and (
            labels.dim() == 0 or labels.shape[0] != size or
            isinstance(batch.get("bool_masked_pos"), torch.Tensor)):
        return (f"the batch's labels (shape {tuple(labels.shape)}) are not one row per sample "
                f"of the {size}: they cannot be cut with its samples")
    return None


def batch_level_term(model, batch=None) -> str | None:
    """What in the model's own loss is a statistic over the whole batch, which micro-batches
    would each take over their part (so that they no longer add up to the batch's gradient),
    or None: a transformers mixture of experts whose loss adds the router's load-balancing
    loss (`output_router_logits` in the batch, else in its config, and a nonzero
    `router_aux_loss_coef`): the share of the batch's tokens each expert gets times its
    mean routing probability; a contrastive loss over the batch's pairs (_contrastive)."""
    config = _config(model)
    routed = getattr(config, "output_router_logits", False)
    if isinstance(batch, Mapping) and batch.get("output_router_logits") is not None:
        routed = bool(batch["output_router_logits"])
    if routed and getattr(config, "router_aux_loss_coef", 0):
        return ("the model's loss adds its router's load-balancing loss, a statistic over the "
                "whole batch (output_router_logits): it would be per micro-batch")
    if _contrastive(wrapped.inner(model)):
        return ("the model's loss is contrastive (return_loss): each sample's negatives are "
                "the batch's other samples, which a micro-batch would not see")
    return None


def _contrastive(model) -> bool:
    """Whether `model` is a transformers dual encoder whose loss contrasts every pair in the
    batch (CLIP, SigLIP, ALIGN, BLIP, CLAP...): its forward takes `return_loss` and the model
    holds the contrastive loss's scale (a `logit_scale...` or `temperature` parameter of its
    own; a time-series model's return_loss, a per-sample loss, has none)."""
    try:
        takes = "return_loss" in inspect.signature(type(model).forward).parameters
    except (TypeError, ValueError):
        return False
    return takes and any(name.startswith("logit_scale") or name == "temperature"
                         for name, _ in model.named_parameters(recurse=False))


def divides_by_items(model, batch=None) -> bool:
    """Whether the model's own loss divides by a batch's `num_items_in_batch` (a sum over
    the targets of every micro-batch and accumulated batch: then the micro-batches' losses
    add). A transformers model's does where its forward calls `self.loss_function` passing
    its keyword arguments on (the count among them) and that is one of transformers' losses
    that take the count (causal and masked LM, token classification, question answering,
    sequence classification of one integer label per sample: the batch's labels say which
    where the config does not yet); one whose forward computes a loss of its own (BERT's
    masked LM, T5, BART) or calls the loss without them (the classification heads Llama,
    Qwen2 and Mistral share) ignores it: a mean. A prompt-learning PEFT model's is its base
    model's (wrapped.receiver). Another library's model (or None: not known) is taken to,
    as the batch hands it the count."""
    model = wrapped.receiver(model) if model is not None else None
    transformers = sys.modules.get("transformers")
    if model is None or transformers is None or \
            not isinstance(model, transformers.PreTrainedModel):
        return True
    if not _passes_kwargs_to_loss(inspect.unwrap(type(model).forward)):
        return False
    from transformers.loss import loss_utils
    loss = getattr(model, "loss_function", None)
    if loss is loss_utils.ForSequenceClassificationLoss:  # regression, multi-label: a mean
        labels = batch.get("labels") if isinstance(batch, Mapping) else None
        problem = getattr(model.config, "problem_type", None)
        if problem is None:  # transformers sets it at the first forward, from the labels
            problem = "multi_label_classification" if isinstance(labels, torch.Tensor) and \
                labels.is_floating_point() else "single_label_classification"
        return getattr(model.config, "num_labels", 0) > 1 and \
            problem == "single_label_classification"
    return loss in (loss_utils.ForCausalLMLoss, loss_utils.ForMaskedLMLoss,
                    loss_utils.ForTokenClassification, loss_utils.ForQuestionAnsweringLoss)


def _passes_kwargs_to_loss(forward) -> bool:
    """Whether `forward` calls `self.loss_function(..., **kwargs)`: its source parsed (where
    it cannot be read, whether it names loss_function at all). Read only for a batch that
    gives num_items_in_batch, once a step (about 3 ms)."""
    tree = _source_tree(forward)
    if tree is None:
        return "loss_function" in getattr(getattr(forward, "__code__", None), "co_names", ())
    return any(isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute) and
               node.func.attr == "loss_function" and
               any(keyword.arg is None for keyword in node.keywords)
               for node in ast.walk(tree))


def shifts_labels(model, own: bool = False) -> bool:
    """Whether the model's loss is transformers' causal-LM loss, which shifts the labels by
    one: the function its forward calls as `self.loss_function` (chosen by the class's
    `loss_type`; a model without one, such as GPT2LMHeadModel, gets the causal-LM loss), on a
    model that is not an encoder-decoder (those give the decoder its labels unshifted). A
    wrapper's (DistributedDataParallel, a PEFT adapter: wrapped.inner) is its model's. PEFT's
    prefix tuning hands its base model the labels as given (the prefix is keys and values),
    so the base model's shift counts; prompt and p-tuning prepend a -100 label per virtual
    token, after which the shift drops one of those: every given label counts, unshifted.
    `own`: a loss of the forward's own that drops each row's first label counts too."""
    model = wrapped.inner(model)
    if wrapped.prompt_learning(model) == "PREFIX_TUNING":
        model = model.get_base_model()
    transformers = sys.modules.get("transformers")
    if transformers is None or not isinstance(model, transformers.PreTrainedModel):
        return False
    if getattr(model.config, "is_encoder_decoder", False):
        return False
    forward = inspect.unwrap(type(model).forward)
    if "loss_function" not in getattr(getattr(forward, "__code__", None), "co_names", ()):
        # its forward computes its own loss: with `own`, shifted where it takes
        # `labels[..., 1:]` (ImageGPT's, GPT-2's double heads') or hands its labels to a
        # submodule whose loss does (BLIP's captioning, to its text decoder), else as given
        # (XLNet's)
        if not own:
            return False
        tree = _source_tree(forward)
        return tree is not None and (_slices_off_first_label(tree) or any(
            shifts_labels(sub, own=True) for sub in _labels_handed_to(model, tree)))
    from transformers.loss.loss_utils import ForCausalLMLoss
    return model.loss_function is ForCausalLMLoss


def _source_tree(function):
    """The parsed source of `function`, or None where it cannot be read."""
    try:
        return ast.parse(textwrap.dedent(inspect.getsource(function)))
    except (OSError, TypeError, SyntaxError):
        return None


def _labels_handed_to(model, tree) -> list:
    """The submodules a forward (its parsed source) calls as `self.<name>(..., labels=labels)`."""
    subs = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute) and \
                isinstance(node.func.value, ast.Name) and node.func.value.id == "self" and \
                any(k.arg == "labels" and isinstance(k.value, ast.Name) and
                    k.value.id == "labels" for k in node.keywords):
            sub = getattr(model, node.func.attr, None)
            if isinstance(sub, torch.nn.Module) and sub is not model:
                subs.append(sub)
    return subs


def _slices_off_first_label(tree) -> bool:
    """Whether a forward (its parsed source) takes `labels[..., 1:]` or `labels[:, 1:]` (a
    causal loss of its own, shifted)."""

    def from_one(index) -> bool:  # [..., 1:] or [:, 1:]: every row without its first
        if not isinstance(index, ast.Tuple) or len(index.elts) != 2:
            return False
        rows, last = index.elts
        whole = (isinstance(rows, ast.Constant) and rows.value is Ellipsis) or (
            isinstance(rows, ast.Slice) and rows.lower is rows.upper is rows.step is None)
        return whole and isinstance(last, ast.Slice) and last.upper is None and \
            last.step is None and isinstance(last.lower, ast.Constant) and last.lower.value == 1

    return any(isinstance(node, ast.Subscript) and isinstance(node.value, ast.Name) and
               node.value.id == "labels" and from_one(node.slice)
               for node in ast.walk(tree))
