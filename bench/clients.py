"""Real clients for the lab: the transformers models of `python -m actcodec memory` (built from
a config, random weights, nothing downloaded), at the sizes the step benchmark times. Each
builder returns (model, loss_fn) with loss_fn(model) a training loss."""
from __future__ import annotations

from actcodec.apps.zoo import enable_checkpointing, gpt2, resnet  # noqa: F401

MODELS = ("gpt2", "resnet")
SIZES = {"gpt2": {"batch": 4, "seq": 256}, "resnet": {"batch": 32, "size": 128}}


def build(name: str, **sizes):
    if name not in MODELS:
        raise SystemExit(f"unknown model {name!r}; choose from {', '.join(MODELS)}")
    return {"gpt2": gpt2, "resnet": resnet}[name](**{**SIZES[name], **sizes})
