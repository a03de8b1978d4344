"""Swap a model's standard layers for ones that save compressed activations for backward.

    model = actcodec.torch.convert(model, Policy.preset("4bit"))
    with actcodec.torch.record() as acc:
        loss = model(x).sum()
    loss.backward()
    print(acc.table())

`convert` changes, in place, the class of every nn.Linear, Conv1d, Conv2d, ReLU, GELU, SiLU,
BatchNorm1d, BatchNorm2d, LayerNorm, MaxPool1d, MaxPool2d, AvgPool1d, AvgPool2d, Dropout and
Softmax to a subclass whose forward calls the matching Function of `functions`, and attaches the
policy and the module's qualified name (the layer name the policy's overrides and the accounting
see). Parameters, buffers, state_dict, hooks and isinstance checks stay as they were: a
converted nn.MaxPool2d is still an nn.MaxPool2d. Only modules of exactly these classes are
converted, not subclasses, whose forward may differ.

A converted module computes the same output bits as the plain one and, with a lossless policy,
the same gradient bits. In evaluation mode, or when nothing needs a gradient, it runs the plain
forward. A few argument forms also run the plain forward: Softmax(dim=None), MaxPool with
return_indices=True, Dropout with p=0 or p=1, Conv with an odd "same" padding.

What a converter cannot reach: operations a model's forward calls as functions (torch.matmul,
torch.softmax, F.gelu, x @ y, ...) are not modules, so they stay plain and autograd saves their
inputs uncompressed. Call the functional wrappers of `actcodec.torch.functions` there
(`functions.matmul(q, k.mT, policy, "attn")`, `functions.softmax(...)`), or wrap the step in
the saved-tensor hooks (`compress_saved`), which compress whatever autograd saves.

`unconvert` restores the plain classes.
"""
from __future__ import annotations

import fnmatch

import torch
from torch import nn
from torch.nn import functional as F

from . import functions as fn
from .policy import Policy

__all__ = ["convert", "unconvert", "COMPRESSED"]


def _active(module, *tensors) -> bool:
    """Compress only what autograd will save: training mode, grad mode on, and the input or a
    parameter of the module requiring grad."""
    if not (module.training and torch.is_grad_enabled()):
        return False
    return (any(t.requires_grad for t in tensors)
            or any(p.requires_grad for p in module.parameters(recurse=False)))


class _Converted:
    """Mixin: the policy and the qualified name `convert` attached."""

    actcodec_policy: Policy
    actcodec_name: str | None

    def _actcodec(self):
        return self.actcodec_policy, self.actcodec_name


class CompressedLinear(nn.Linear, _Converted):
    def forward(self, input):
        if not _active(self, input):
            return super().forward(input)
        return fn.linear(input, self.weight, self.bias, *self._actcodec())


class _ConvMixin(_Converted):
    _nd = 2

    def forward(self, input):
        if not _active(self, input):
            return super().forward(input)
        padding = self.padding
        if self.padding_mode != "zeros":
            input = F.pad(input, self._reversed_padding_repeated_twice, mode=self.padding_mode)
            padding = 0
        conv = fn.conv2d if self._nd == 2 else fn.conv1d
        return conv(input, self.weight, self.bias, self.stride, padding, self.dilation,
                    self.groups, *self._actcodec())


class CompressedConv1d(_ConvMixin, nn.Conv1d):
    _nd = 1


class CompressedConv2d(_ConvMixin, nn.Conv2d):
    _nd = 2


class CompressedReLU(nn.ReLU, _Converted):
    def forward(self, input):
        if not _active(self, input):
            return super().forward(input)
        return fn.relu(input, self.inplace, *self._actcodec())


class CompressedGELU(nn.GELU, _Converted):
    def forward(self, input):
        if not _active(self, input):
            return super().forward(input)
        return fn.gelu(input, self.approximate, *self._actcodec())


class CompressedSiLU(nn.SiLU, _Converted):
    def forward(self, input):
        if not _active(self, input):
            return super().forward(input)
        return fn.silu(input, self.inplace, *self._actcodec())


class _BatchNormMixin(_Converted):
    def forward(self, input):
        if not _active(self, input) or not self.training:
            return super().forward(input)
        self._check_input_dim(input)
        # nn.BatchNorm's own bookkeeping, step for step
        factor = 0.0 if self.momentum is None else self.momentum
        if self.track_running_stats and self.num_batches_tracked is not None:
            self.num_batches_tracked.add_(1)
            if self.momentum is None:  # cumulative moving average
                factor = 1.0 / float(self.num_batches_tracked)
            else:
                factor = self.momentum
        track = self.track_running_stats
        return fn.batch_norm(input, self.running_mean if track else None,
                             self.running_var if track else None, self.weight, self.bias,
                             True, factor, self.eps, *self._actcodec())


class CompressedBatchNorm1d(_BatchNormMixin, nn.BatchNorm1d):
    pass


class CompressedBatchNorm2d(_BatchNormMixin, nn.BatchNorm2d):
    pass


class CompressedLayerNorm(nn.LayerNorm, _Converted):
    def forward(self, input):
        if not _active(self, input):
            return super().forward(input)
        return fn.layer_norm(input, self.normalized_shape, self.weight, self.bias, self.eps,
                             *self._actcodec())


class CompressedMaxPool1d(nn.MaxPool1d, _Converted):
    def forward(self, input):
        if not _active(self, input) or self.return_indices:
            return super().forward(input)
        return fn.max_pool1d(input, self.kernel_size, self.stride, self.padding, self.dilation,
                             self.ceil_mode, False, *self._actcodec())


class CompressedMaxPool2d(nn.MaxPool2d, _Converted):
    def forward(self, input):
        if not _active(self, input) or self.return_indices:
            return super().forward(input)
        return fn.max_pool2d(input, self.kernel_size, self.stride, self.padding, self.dilation,
                             self.ceil_mode, False, *self._actcodec())


class CompressedAvgPool1d(nn.AvgPool1d, _Converted):
    def forward(self, input):
        if not _active(self, input):
            return super().forward(input)
        return fn.avg_pool1d(input, self.kernel_size, self.stride, self.padding, self.ceil_mode,
                             self.count_include_pad, *self._actcodec())


class CompressedAvgPool2d(nn.AvgPool2d, _Converted):
    def forward(self, input):
        if not _active(self, input):
            return super().forward(input)
        return fn.avg_pool2d(input, self.kernel_size, self.stride, self.padding, self.ceil_mode,
                             self.count_include_pad, self.divisor_override, *self._actcodec())


class CompressedDropout(nn.Dropout, _Converted):
    def forward(self, input):
        if not _active(self, input):
            return super().forward(input)
        return fn.dropout(input, self.p, self.training, self.inplace, *self._actcodec())


class CompressedSoftmax(nn.Softmax, _Converted):
    def forward(self, input):
        if not _active(self, input) or self.dim is None:
            return super().forward(input)
        return fn.softmax(input, self.dim, None, *self._actcodec())


COMPRESSED = {
    nn.Linear: CompressedLinear, nn.Conv1d: CompressedConv1d, nn.Conv2d: CompressedConv2d,
    nn.ReLU: CompressedReLU, nn.GELU: CompressedGELU, nn.SiLU: CompressedSiLU,
    nn.BatchNorm1d: CompressedBatchNorm1d, nn.BatchNorm2d: CompressedBatchNorm2d,
    nn.LayerNorm: CompressedLayerNorm, nn.MaxPool1d: CompressedMaxPool1d,
    nn.MaxPool2d: CompressedMaxPool2d, nn.AvgPool1d: CompressedAvgPool1d,
    nn.AvgPool2d: CompressedAvgPool2d, nn.Dropout: CompressedDropout,
    nn.Softmax: CompressedSoftmax,
}
"""Plain nn class -> its converted subclass."""

_PLAIN = {v: k for k, v in COMPRESSED.items()}


def _selectors(spec, what):
    if spec is None:
        return None
    if isinstance(spec, (str, type)):
        spec = [spec]
    out = list(spec)
    for s in out:
        if not (isinstance(s, str) or (isinstance(s, type) and issubclass(s, nn.Module))):
            raise TypeError(f"{what} takes fnmatch patterns over module names or nn.Module "
                            f"classes, got {s!r}")
    return out


def _matches(name: str, module: nn.Module, selectors) -> bool:
    return any(fnmatch.fnmatchcase(name, s) if isinstance(s, str) else isinstance(module, s)
               for s in selectors)


def convert(model: nn.Module, policy: Policy | None = None, include=None,
            exclude=None) -> nn.Module:
    """Convert `model`'s standard layers in place (see the module docstring) and return it.

    policy: how each saved activation is stored (default `Policy()`); all converted modules
    share it. include / exclude: lists of fnmatch patterns over qualified module names
    ("blocks.*.mlp.*", "fc") or of nn.Module classes (nn.Dropout); a module is converted when
    it matches some include entry (all do when include is None) and no exclude entry.
    Converting an already converted module updates its policy and name."""
    policy = Policy() if policy is None else policy
    include, exclude = _selectors(include, "include"), _selectors(exclude, "exclude")
    for name, module in model.named_modules():
        plain = _PLAIN.get(type(module), type(module))
        target = COMPRESSED.get(plain)
        if target is None:
            continue
        if include is not None and not _matches(name, module, include):
            continue
        if exclude and _matches(name, module, exclude):
            continue
        module.__class__ = target
        module.actcodec_policy = policy
        module.actcodec_name = name
    return model


def unconvert(model: nn.Module) -> nn.Module:
    """Restore the plain classes of every converted module in `model`, in place; return it."""
    for module in model.modules():
        plain = _PLAIN.get(type(module))
        if plain is None:
            continue
        module.__class__ = plain
        for attr in ("actcodec_policy", "actcodec_name"):
            module.__dict__.pop(attr, None)
    return model
