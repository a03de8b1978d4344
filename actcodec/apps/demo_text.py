"""The demo's text task (``python -m actcodec demo --task text``): a small byte-level language
model, trained to predict the next byte of real English text that ships with Python itself,
the standard library's ``pydoc_data`` topics (the help() pages on the language: about 465 KB).
Whole topics are held out for the test set, so the test measures text the model never saw."""
from __future__ import annotations

import math

HELD_OUT_EVERY = 8  # every 8th topic (by name) is test text


def split(path: str, context: int) -> None:
    """Train and test windows of `context` bytes (inputs, and the same shifted by one as
    targets), saved for the workers."""
    import numpy as np
    from pydoc_data.topics import topics

    names = sorted(topics)
    train = [topics[n] for i, n in enumerate(names) if i % HELD_OUT_EVERY]
    test = [topics[n] for i, n in enumerate(names) if i % HELD_OUT_EVERY == 0]

    def windows(texts):
        data = np.frombuffer("\n\n".join(texts).encode("utf-8"), dtype=np.uint8)
        n = (data.size - 1) // context
        x = data[:n * context].reshape(n, context).astype(np.int64)
        y = data[1:n * context + 1].reshape(n, context).astype(np.int64)
        return x, y

    x_train, y_train = windows(train)
    x_test, y_test = windows(test)
    np.savez(path, x_train=x_train, y_train=y_train, x_test=x_test, y_test=y_test)


def data(path: str):
    import numpy as np
    import torch

    with np.load(path) as d:
        return tuple(torch.from_numpy(d[k]) for k in ("x_train", "y_train", "x_test", "y_test"))


def model(width: int, context: int, use_checkpoint: bool, seed: int = 0, layers: int = 2,
          heads: int = 4):
    """A GPT-style decoder: byte and position embeddings, `layers` pre-norm blocks (causal
    attention from matmul and softmax, a GELU MLP), a final LayerNorm and a byte head."""
    import torch
    from torch import nn
    from torch.utils.checkpoint import checkpoint

    class Block(nn.Module):
        def __init__(self):
            super().__init__()
            self.ln1, self.ln2 = nn.LayerNorm(width), nn.LayerNorm(width)
            self.qkv, self.proj = nn.Linear(width, 3 * width), nn.Linear(width, width)
            self.mlp = nn.Sequential(nn.Linear(width, 4 * width), nn.GELU(),
                                     nn.Linear(4 * width, width))
            self.register_buffer("mask", torch.full((context, context), float("-inf")).triu(1),
                                 persistent=False)

        def forward(self, x):
            b, t, d = x.shape
            q, k, v = self.qkv(self.ln1(x)).view(b, t, 3, heads, d // heads).unbind(2)
            q, k, v = (z.transpose(1, 2) for z in (q, k, v))
            att = (q @ k.transpose(-2, -1)) / math.sqrt(d // heads) + self.mask[:t, :t]
            y = (att.softmax(-1) @ v).transpose(1, 2).reshape(b, t, d)
            x = x + self.proj(y)
            return x + self.mlp(self.ln2(x))

    class ByteLM(nn.Module):
        def __init__(self):
            super().__init__()
            self.embed, self.pos = nn.Embedding(256, width), nn.Embedding(context, width)
            self.blocks = nn.ModuleList([Block() for _ in range(layers)])
            self.ln, self.head = nn.LayerNorm(width), nn.Linear(width, 256)

        def forward(self, ids):
            x = self.embed(ids) + self.pos(torch.arange(ids.shape[1]))
            for block in self.blocks:
                if use_checkpoint and torch.is_grad_enabled():
                    x = checkpoint(block, x, use_reentrant=False)
                else:
                    x = block(x)
            return self.head(self.ln(x))

    torch.manual_seed(seed)
    return ByteLM()
