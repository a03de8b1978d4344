"""Real clients: models from a library nobody here wrote (transformers), built from a config
with random weights, nothing downloaded. Each builder returns (model, step inputs) where the
inputs make `model(**inputs).loss` a training loss."""
from __future__ import annotations

import torch

MODELS = ("gpt2", "resnet")


def _quiet():
    import transformers

    transformers.logging.set_verbosity_error()


def gpt2(batch: int = 4, seq: int = 256, layers: int = 6, width: int = 384, seed: int = 0):
    """A GPT-2 layout (transformers' GPT2LMHeadModel): `layers` blocks of `width`, 6 heads."""
    from transformers import GPT2Config, GPT2LMHeadModel

    _quiet()
    torch.manual_seed(seed)
    cfg = GPT2Config(n_layer=layers, n_embd=width, n_head=6, n_positions=seq, vocab_size=8192,
                     resid_pdrop=0.0, embd_pdrop=0.0, attn_pdrop=0.0)
    model = GPT2LMHeadModel(cfg)
    ids = torch.randint(0, cfg.vocab_size, (batch, seq), generator=torch.Generator().manual_seed(1))
    return model, {"input_ids": ids, "labels": ids}


def resnet(batch: int = 32, size: int = 128, seed: int = 0, channels_last: bool = False):
    """A ResNet-18 layout (transformers' ResNetForImageClassification, basic blocks)."""
    from transformers import ResNetConfig, ResNetForImageClassification

    _quiet()
    torch.manual_seed(seed)
    cfg = ResNetConfig(depths=[2, 2, 2, 2], hidden_sizes=[64, 128, 256, 512],
                       layer_type="basic", num_labels=10)
    model = ResNetForImageClassification(cfg)
    gen = torch.Generator().manual_seed(1)
    x = torch.randn(batch, 3, size, size, generator=gen)
    if channels_last:
        model = model.to(memory_format=torch.channels_last)
        x = x.contiguous(memory_format=torch.channels_last)
    return model, {"pixel_values": x, "labels": torch.randint(0, 10, (batch,), generator=gen)}


def build(name: str, **sizes):
    if name not in MODELS:
        raise SystemExit(f"unknown model {name!r}; choose from {', '.join(MODELS)}")
    return {"gpt2": gpt2, "resnet": resnet}[name](**sizes)


def enable_checkpointing(model) -> None:
    """Non-reentrant activation checkpointing, as a user would turn it on: transformers' own
    switch where the model has one, else torch.utils.checkpoint around each ResNet stage."""
    if getattr(model, "supports_gradient_checkpointing", False):
        kwargs = {"use_reentrant": False}
        if hasattr(model, "activation_checkpointing_enable"):
            model.activation_checkpointing_enable(activation_checkpointing_kwargs=kwargs)
        else:  # before transformers 5
            model.gradient_checkpointing_enable(gradient_checkpointing_kwargs=kwargs)
        return
    from torch.utils.checkpoint import checkpoint

    for stage in model.resnet.encoder.stages:
        plain = stage.forward
        stage.forward = lambda x, plain=plain: checkpoint(plain, x, use_reentrant=False)
