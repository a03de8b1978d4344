"""One step of Step under a limit against plain training, both in bfloat16 autocast: either
inside a torch.autocast context, or with each model's forward wrapped in it (as accelerate's
mixed precision, the Trainer's bf16=True, wraps it)."""
import contextlib
import warnings

import torch
import torch.nn.functional as F

import actcodec.torch as act


def assert_chunked_like_autocast(want, model, batch, wrapped: bool) -> None:
    """Step(model, limit="free") on `batch` gives plain `want`'s gradient (cosine 0.999: the
    chunked loss sums in another order, in bfloat16), without a RuntimeWarning (the chunked
    loss covers it, rather than falling back to the model's own)."""
    if wrapped:
        for m in (want, model):
            m.forward = torch.autocast("cpu", dtype=torch.bfloat16)(m.forward)
    around = contextlib.nullcontext() if wrapped else torch.autocast("cpu", dtype=torch.bfloat16)
    with around:
        want(**batch).loss.backward()
        with act.Step(model, limit="free") as step, warnings.catch_warnings():
            warnings.simplefilter("error", RuntimeWarning)
            step(batch)
    grads = [torch.cat([p.grad.flatten() for p in m.parameters() if p.grad is not None])
             for m in (model, want)]
    assert F.cosine_similarity(*grads, dim=0) >= 0.999
