"""The model behind the wrappers people train through, where the wrapper hands it the batch as
it is: DistributedDataParallel and DataParallel (their `.module`), and a PEFT model whose
adapters change layers only (LoRA, IA3, LoHa, ...: `get_base_model()`, the transformers model
with the adapters in its layers), and torch.compile's module (its `_orig_mod`). What the
batch's labels mean, whether the forward takes
`use_cache`, and which head computes the logits are the inner model's.

A PEFT model of prompt learning (prompt, prefix or P-tuning) is not unwrapped: it adds virtual
tokens, and labels or a cache of its own, to what reaches the inner model. peft is not
imported here: a PEFT model exists only where peft was imported already."""
from __future__ import annotations

import sys

import torch


def inner(model):
    """The innermost model that receives the batch as given (see the module doc); `model`
    itself where it wraps none."""
    while True:
        if isinstance(model, (torch.nn.parallel.DistributedDataParallel,
                              torch.nn.DataParallel)):
            model = model.module
        elif adapters_only(model):
            model = model.get_base_model()
        elif compiled(model):
            model = model._orig_mod
        else:
            return model


def adapted(model):
    """The model whose layers and head a loss of its own runs: `model`, or, for a PEFT model
    whose adapters change layers only, its base (the adapters are in the base's layers; a
    DistributedDataParallel is not unwrapped: its forward is what synchronizes)."""
    return inner(model) if adapters_only(model) else model


def compiled(model) -> bool:
    """Whether `model` is torch.compile's module around another (torch._dynamo's
    OptimizedModule; not imported here, as importing it is slow)."""
    return type(model).__name__ == "OptimizedModule" and \
        isinstance(getattr(model, "_orig_mod", None), torch.nn.Module)


def prompt_learning(model) -> str | None:
    """The prompt-learning method of a PEFT model ("PREFIX_TUNING", "PROMPT_TUNING",
    "P_TUNING", ...), None where `model` is not one."""
    if not is_peft(model) or not model.active_peft_config.is_prompt_learning:
        return None
    kind = model.active_peft_config.peft_type
    return str(getattr(kind, "value", kind))


def receiver(model):
    """The model whose forward takes the batch's keyword arguments (`use_cache`): inner(model),
    or a prompt-learning PEFT model's base model, to which its forward passes them on."""
    model = inner(model)
    return model.get_base_model() if prompt_learning(model) else model


def is_peft(model) -> bool:
    """Whether `model` is a PEFT model (peft.PeftModel or one of its task classes)."""
    peft = sys.modules.get("peft")
    return peft is not None and isinstance(model, getattr(peft, "PeftModel", ()))


def adapters_only(model) -> bool:
    """Whether `model` is a PEFT model whose active adapter changes layers only (not prompt
    learning), so that its forward passes the batch to its base model as given."""
    if not is_peft(model):
        return False
    return not model.active_peft_config.is_prompt_learning
