"""Activations written as several torch ops, saved once: their input, with the activation run
again in backward.

transformers' GPT-2 GELU (`NewGELUActivation`, 0.5 x (1 + tanh(...)) in Python) saves four
tensors of its input's size for backward, FastGELU seven, QuickGELU three: under
compress_saved each one more encode and decode, and more bytes held than the input alone.
For the parameter-free activations of `transformers.activations` that are several ops, the
saved-tensor hooks' session (actcodec.torch.save) instead runs the module on its input
detached (nothing saved), saves the input once (compressed as any save), and in backward
runs the module's forward again on the restored input to take its gradient. Elementwise
and without randomness, the forward run again computes what the first did, op for op (in
the autocast state it ran in): with a lossless policy every gradient is plain PyTorch's,
bit for bit.

Left as they are: modules with hooks of their own (their pre-hooks change the input the
forward sees; backward hooks, theirs or every module's, would see no input gradient),
parameters or buffers, more than one input, or an input that needs no gradient; and any
call not made under the session's own hooks (a checkpoint's region, a profile's), whose
saves are someone else's to keep. A backward that builds a graph (create_graph) runs the
activation again on the saved input itself: second derivatives follow it where the input
was kept as it is (a decoded input, like every decoded save, has no history).
"""
from __future__ import annotations

import inspect

import torch

# Several ops each (one op, such as F.gelu, saves its input alone already).
SEVERAL_OPS = frozenset({"NewGELUActivation", "FastGELUActivation", "AccurateGELUActivation",
                         "QuickGELUActivation", "ClippedGELUActivation",
                         "ReLUSquaredActivation", "SqrtSoftplusActivation"})
# Several ops where their `act` is their own Python method (else one F.gelu).
PYTHON_VARIANT = frozenset({"GELUActivation", "GELUTanh"})


def eligible(module: torch.nn.Module, args: tuple) -> bool:
    """Whether a call of `module` on `args` runs as described in the module docstring."""
    cls = type(module)
    if cls.__module__ != "transformers.activations":
        return False
    name = cls.__name__
    if name in PYTHON_VARIANT:
        if not inspect.ismethod(getattr(module, "act", None)):
            return False
    elif name not in SEVERAL_OPS:
        return False
    if len(args) != 1 or not isinstance(args[0], torch.Tensor) or \
            not args[0].requires_grad or not torch.is_grad_enabled() or \
            args[0].device.type not in ("cpu", "cuda"):
        return False
    if module._forward_pre_hooks or module._forward_hooks or module._backward_hooks or \
            module._backward_pre_hooks or _global_backward_hooks() or \
            next(module.parameters(recurse=False), None) is not None or \
            next(module.buffers(recurse=False), None) is not None:
        return False
    return True


def _global_backward_hooks() -> bool:
    """Whether module backward hooks are registered for every module (they would see the
    detached input's gradient: none)."""
    registry = torch.nn.modules.module
    return bool(getattr(registry, "_global_backward_hooks", None) or
                getattr(registry, "_global_backward_pre_hooks", None))


def attach(x: torch.Tensor, y: torch.Tensor, module: torch.nn.Module) -> torch.Tensor:
    """y, computed by `module` from x detached, as the output of a node that saves x and
    takes the gradient through `module` run again. y is a tensor of the module's own
    (nothing else holds it), so it becomes the node's output itself."""
    return _Recomputed.apply(x, [y], module)


class _Recomputed(torch.autograd.Function):

    @staticmethod
    def forward(ctx, x, box, module):
        ctx.module = module
        dev = x.device.type
        ctx.autocast = (dev, torch.is_autocast_enabled(dev), torch.get_autocast_dtype(dev),
                        torch.is_autocast_cache_enabled())
        ctx.save_for_backward(x)  # through the saved-tensor hooks: compressed
        return box[0]

    @staticmethod
    def backward(ctx, grad):
        x, = ctx.saved_tensors
        dev, enabled, dtype, cache = ctx.autocast
        # Its own saves are used at once: no hooks of an enclosing context keep them.
        graph = torch.is_grad_enabled()  # create_graph: a graph through this backward
        with torch.enable_grad(), torch.autograd.graph.saved_tensors_hooks(_same, _same), \
                torch.autocast(dev, dtype=dtype, enabled=enabled, cache_enabled=cache):
            again = x if graph and x.requires_grad else x.detach().requires_grad_()
            y = ctx.module.forward(again)
        grad_x, = torch.autograd.grad(y, again, grad, create_graph=graph)
        return grad_x, None, None


def _same(t):
    return t
