"""The memory command's models, each a function returning ``(model, loss_fn)`` with
``loss_fn(model)`` a training loss on fixed random data: ``cnn`` (a ResNet-style CNN defined
here), ``gpt2`` and ``resnet`` (transformers models built from a config, random weights,
nothing downloaded; need transformers), or a ``package.module:function`` of your own; and
activation checkpointing turned on as a user would. The built-in loss functions also carry
their data as a batch for `actcodec.torch.Step`: ``loss_fn.batch``, and
``loss_fn.batch_loss(model, batch)`` where the batch is not a dict with labels."""
from __future__ import annotations

import importlib

BUILTIN = ("cnn", "gpt2", "resnet")


def cnn(batch: int = 32, size: int = 64, width: int = 64):
    """A ResNet-style CNN (stem, four stages of two residual blocks) on random images."""
    import torch
    from torch import nn
    import torch.nn.functional as F

    def block(cin, cout, stride):
        body = nn.Sequential(nn.Conv2d(cin, cout, 3, stride, 1, bias=False), nn.BatchNorm2d(cout),
                             nn.ReLU(), nn.Conv2d(cout, cout, 3, 1, 1, bias=False),
                             nn.BatchNorm2d(cout))
        skip = nn.Sequential() if stride == 1 and cin == cout else nn.Sequential(
            nn.Conv2d(cin, cout, 1, stride, bias=False), nn.BatchNorm2d(cout))
        return body, skip

    class Net(nn.Module):
        def __init__(self):
            super().__init__()
            self.stem = nn.Sequential(nn.Conv2d(3, width, 3, 1, 1, bias=False),
                                      nn.BatchNorm2d(width), nn.ReLU())
            self.bodies, self.skips, cin = nn.ModuleList(), nn.ModuleList(), width
            for i, cout in enumerate([width, 2 * width, 4 * width, 8 * width]):
                for j in range(2):
                    body, skip = block(cin, cout, 2 if i and not j else 1)
                    self.bodies.append(body)
                    self.skips.append(skip)
                    cin = cout
            self.head = nn.Linear(cin, 10)

        def forward(self, x):
            x = self.stem(x)
            for body, skip in zip(self.bodies, self.skips):
                x = F.relu(body(x) + skip(x))
            return self.head(x.mean((2, 3)))

    torch.manual_seed(0)
    model = Net()
    gen = torch.Generator().manual_seed(1)
    x = torch.randn(batch, 3, size, size, generator=gen)
    y = torch.randint(0, 10, (batch,), generator=gen)
    return model, _with_batch(lambda m: F.cross_entropy(m(x), y), (x, y),
                              lambda m, b: F.cross_entropy(m(b[0]), b[1]))


def _with_batch(loss_fn, batch, batch_loss=None):
    loss_fn.batch, loss_fn.batch_loss = batch, batch_loss
    return loss_fn


def _transformers():
    import transformers

    transformers.logging.set_verbosity_error()
    return transformers


def gpt2(batch: int = 8, seq: int = 512, layers: int = 6, width: int = 384):
    """transformers' GPT2LMHeadModel from a config: `layers` blocks of `width`, 6 heads."""
    import torch

    tf = _transformers()
    torch.manual_seed(0)
    cfg = tf.GPT2Config(n_layer=layers, n_embd=width, n_head=6, n_positions=seq,
                        vocab_size=8192, resid_pdrop=0.0, embd_pdrop=0.0, attn_pdrop=0.0)
    model = tf.GPT2LMHeadModel(cfg)
    ids = torch.randint(0, cfg.vocab_size, (batch, seq), generator=torch.Generator().manual_seed(1))
    return model, _with_batch(lambda m: m(input_ids=ids, labels=ids).loss,
                              {"input_ids": ids, "labels": ids})


def resnet(batch: int = 64, size: int = 128, channels_last: bool = False):
    """transformers' ResNetForImageClassification from a config: a ResNet-18 layout."""
    import torch

    tf = _transformers()
    torch.manual_seed(0)
    cfg = tf.ResNetConfig(depths=[2, 2, 2, 2], hidden_sizes=[64, 128, 256, 512],
                          layer_type="basic", num_labels=10)
    model = tf.ResNetForImageClassification(cfg)
    gen = torch.Generator().manual_seed(1)
    x = torch.randn(batch, 3, size, size, generator=gen)
    y = torch.randint(0, 10, (batch,), generator=gen)
    if channels_last:
        model = model.to(memory_format=torch.channels_last)
        x = x.contiguous(memory_format=torch.channels_last)
    return model, _with_batch(lambda m: m(pixel_values=x, labels=y).loss,
                              {"pixel_values": x, "labels": y})


def build(spec: str, sizes: dict | None = None):
    """(model, loss_fn) for a built-in name or a 'module:function' factory."""
    sizes = sizes or {}
    if spec in BUILTIN:
        return {"cnn": cnn, "gpt2": gpt2, "resnet": resnet}[spec](**sizes)
    module, _, name = spec.partition(":")
    if not name:
        raise SystemExit(f"--model: {spec!r} is neither {', '.join(BUILTIN)} nor module:function")
    return getattr(importlib.import_module(module), name)(**sizes)


def enable_checkpointing(model) -> None:
    """Non-reentrant activation checkpointing as a user would turn it on: transformers' switch
    where the model has one, else torch's composable checkpoint on each repeated block (its
    hooks, not a replaced forward)."""
    if getattr(model, "supports_gradient_checkpointing", False):
        kwargs = {"use_reentrant": False}
        if hasattr(model, "activation_checkpointing_enable"):
            model.activation_checkpointing_enable(activation_checkpointing_kwargs=kwargs)
        else:  # before transformers 5
            model.gradient_checkpointing_enable(gradient_checkpointing_kwargs=kwargs)
        return
    from torch.distributed._composable import checkpoint  # non-reentrant, as module hooks

    blocks = getattr(getattr(getattr(model, "resnet", None), "encoder", None), "stages", None)
    if blocks is None:
        blocks = getattr(model, "bodies", None)
    if blocks is None:
        raise SystemExit("checkpoint: this model has no blocks this command knows to wrap")
    for block in blocks:
        checkpoint(block)
