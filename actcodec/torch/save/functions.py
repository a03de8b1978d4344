"""Autograd Functions that save compressed activations for backward.

Each Function computes in forward exactly what the plain op computes (the same aten kernels, so
the same bits) and saves for backward only what backward needs: inputs as the policy says for
the op and layer, ReLU and dropout masks at 1 bit per element, max-pool argmax positions as one
small integer per output (uint8 for windows of up to 256 elements). Saved tensors come back
with the layout they were saved with (actcodec.torch.packed.Layout).

Backward calls aten's public backward ops: convolution_backward, native_batch_norm_backward,
native_layer_norm_backward, _softmax_backward_data, gelu_backward, silu_backward,
max_pool2d_with_indices_backward, avg_pool2d_backward, native_dropout_backward. With a lossless
policy those gradients are aten's own, bit for bit. linear and matmul have no such op: their
backward is the plain products (g @ W, g^T @ x, and the bias's sum; g @ b^T and a^T @ g), which
are the products autograd computes for row-major operands, so the bits agree there. For a
column-major operand (a transposed 2-D input, say) aten's backward chooses the transposed
product, and the last bits of a gradient may differ; `compress_saved`, whose backward is aten's
own, is bit-identical in every case.

The functional wrappers (`linear`, `conv2d`, `relu`, `matmul`, ...) take the plain op's
arguments plus `policy` (default `Policy()`) and `layer` (a name for the policy's overrides and
the accounting). They run the plain op when nothing needs a gradient (grad mode off, or no input
requires grad) and for the few argument forms they do not cover (said in each docstring), so
they can stand in for the plain op everywhere.

Not covered: autocast (the Functions compute in the dtypes they are given) and double backward
(`once_differentiable`).
"""
from __future__ import annotations

import time

import torch
import torch.nn.functional as F
from torch.autograd import Function
from torch.autograd.function import once_differentiable

from ..codecs import packed as packed_
from . import save
from ..codecs.packed import Layout
from .policy import Policy

aten = torch.ops.aten

__all__ = ["linear", "conv1d", "conv2d", "relu", "gelu", "silu", "batch_norm", "layer_norm",
           "max_pool1d", "max_pool2d", "avg_pool1d", "avg_pool2d", "dropout", "softmax",
           "matmul", "bmm"]

def _needs_grad(*tensors) -> bool:
    """True when autograd will record the op: grad mode on and some input requires grad."""
    return torch.is_grad_enabled() and any(t is not None and t.requires_grad for t in tensors)


def _store(t: torch.Tensor, policy, op: str, layer) -> packed_.Packed:
    """t compressed as the policy says for this op and layer (or as the recording's budget
    plans it), held and recorded by the running context's save session."""
    return save.session().save(t, op, layer, policy, held=False)  # held by _save


def _store_mask(mask: torch.Tensor, policy, op: str, layer) -> packed_.Packed:
    """A bool mask at 1 bit per element, whatever the policy."""
    return save.session().save_mask(mask, op, layer, policy)


def _save(ctx, *items) -> None:
    save.session().save_for_backward(ctx, *items)


def _shape_only(lay: Layout) -> torch.Tensor:
    """A tensor with a saved one's layout whose values are never read."""
    return lay.empty()


def _sum_to(t, shape):
    """A gradient summed over the dimensions an operand of `shape` was broadcast along."""
    shape = tuple(shape)
    lead = t.dim() - len(shape)
    dims = list(range(lead)) + [i for i in range(lead, t.dim())
                                if shape[i - lead] == 1 and t.shape[i] != 1]
    if dims:
        t = t.sum(dims, keepdim=True)
    return t.view(shape) if lead > 0 else t


# --- linear and matmul ---------------------------------------------------------------------

class LinearFunction(Function):
    """F.linear; saves the input (op "linear") when the weight needs a gradient and the weight
    itself (a parameter, no copy) when the input needs one."""

    @staticmethod
    def forward(ctx, x, weight, bias, policy, layer):
        need_x, need_w, _ = ctx.needs_input_grad[:3]
        _save(ctx, _store(x, policy, "linear", layer) if need_w else None,
                     weight if need_x else None)
        return F.linear(x, weight, bias)

    @staticmethod
    @once_differentiable
    def backward(ctx, g):
        need_x, need_w, need_b = ctx.needs_input_grad[:3]
        x, w = save.load(ctx)
        g2 = g.reshape(-1, g.shape[-1])
        gx = g.matmul(w) if need_x else None
        gw = g2.t().mm(x.reshape(-1, x.shape[-1])) if need_w else None
        gb = g2.sum(0) if need_b else None
        return gx, gw, gb, None, None


def linear(x, weight, bias=None, policy=None, layer=None):
    """F.linear saving a compressed input. A 1-D input runs the plain op."""
    if not _needs_grad(x, weight, bias) or x.dim() < 2:
        return F.linear(x, weight, bias)
    return LinearFunction.apply(x, weight, bias, policy, layer)


class MatmulFunction(Function):
    """torch.matmul / torch.bmm for operands of at least 2 dimensions. Saves each operand
    (op "matmul") only when the other one needs a gradient."""

    @staticmethod
    def forward(ctx, a, b, policy, layer):
        need_a, need_b = ctx.needs_input_grad[:2]
        ctx.shapes = (a.shape, b.shape)
        _save(ctx, _store(a, policy, "matmul", layer) if need_b else None,
                     _store(b, policy, "matmul", layer) if need_a else None)
        return torch.matmul(a, b)

    @staticmethod
    @once_differentiable
    def backward(ctx, g):
        need_a, need_b = ctx.needs_input_grad[:2]
        a, b = save.load(ctx)
        a_shape, b_shape = ctx.shapes
        ga = _sum_to(g.matmul(b.mT), a_shape) if need_a else None
        gb = None
        if need_b and len(b_shape) == 2:  # one product over every row, as for linear's weight
            gb = a.reshape(-1, a.shape[-1]).t().mm(g.reshape(-1, g.shape[-1]))
        elif need_b:
            gb = _sum_to(a.mT.matmul(g), b_shape)
        return ga, gb, None, None


def matmul(a, b, policy=None, layer=None):
    """torch.matmul saving compressed operands. A 1-D operand runs the plain op."""
    if not _needs_grad(a, b) or a.dim() < 2 or b.dim() < 2:
        return torch.matmul(a, b)
    return MatmulFunction.apply(a, b, policy, layer)


def bmm(a, b, policy=None, layer=None):
    """torch.bmm saving compressed operands."""
    if (not _needs_grad(a, b) or a.dim() != 3 or b.dim() != 3 or a.shape[0] != b.shape[0]
            or a.shape[2] != b.shape[1]):
        return torch.bmm(a, b)  # also torch's own errors
    return MatmulFunction.apply(a, b, policy, layer)


# --- convolution ---------------------------------------------------------------------------

class ConvFunction(Function):
    """aten.convolution (not transposed); backward through aten.convolution_backward. Saves
    the input (op "conv") when the weight needs a gradient."""

    @staticmethod
    def forward(ctx, x, weight, bias, stride, padding, dilation, groups, policy, layer):
        nd = weight.dim() - 2
        conv = F.conv1d if nd == 1 else F.conv2d
        out = conv(x, weight, bias, stride, padding, dilation, groups)
        ctx.params = (stride, padding, dilation, groups, nd)
        ctx.bias_shape = None if bias is None else list(bias.shape)
        ctx.x_layout = Layout(x.detach(), None)
        need_w = ctx.needs_input_grad[1]
        _save(ctx, _store(x, policy, "conv", layer) if need_w else None, weight)
        return out

    @staticmethod
    @once_differentiable
    def backward(ctx, g):
        need_x, need_w, need_b = ctx.needs_input_grad[:3]
        x, w = save.load(ctx)
        if x is None:  # only the input's gradient is wanted: its values are never read
            x = _shape_only(ctx.x_layout)
        stride, padding, dilation, groups, nd = ctx.params
        mask = [need_x, need_w, need_b and ctx.bias_shape is not None]
        gx, gw, gb = aten.convolution_backward(g, x, w, ctx.bias_shape, stride, padding,
                                               dilation, False, [0] * nd, groups, mask)
        return gx, gw, gb, None, None, None, None, None, None


def _tuple(v, n):
    return tuple(v) if isinstance(v, (tuple, list)) else (v,) * n


def _conv(x, weight, bias, stride, padding, dilation, groups, policy, layer, nd):
    conv = F.conv1d if nd == 1 else F.conv2d
    if not _needs_grad(x, weight, bias):
        return conv(x, weight, bias, stride, padding, dilation, groups)
    stride, dilation = _tuple(stride, nd), _tuple(dilation, nd)
    if isinstance(padding, str):
        if padding == "valid":
            padding = (0,) * nd
        elif padding == "same":
            total = [d * (k - 1) for d, k in zip(dilation, weight.shape[2:])]
            if any(t % 2 for t in total) or any(s != 1 for s in stride):
                # asymmetric "same" pads the input separately; leave that to the plain op
                return conv(x, weight, bias, stride, padding, dilation, groups)
            padding = tuple(t // 2 for t in total)
        else:
            return conv(x, weight, bias, stride, padding, dilation, groups)  # its own error
    padding = _tuple(padding, nd)
    if x.dim() == nd + 1:  # unbatched, as aten's conv does it
        return ConvFunction.apply(x.unsqueeze(0), weight, bias, stride, padding, dilation,
                                  groups, policy, layer).squeeze(0)
    return ConvFunction.apply(x, weight, bias, stride, padding, dilation, groups, policy, layer)


def conv1d(x, weight, bias=None, stride=1, padding=0, dilation=1, groups=1, policy=None,
           layer=None):
    """F.conv1d saving a compressed input. padding="same" with an odd total padding runs the
    plain op."""
    return _conv(x, weight, bias, stride, padding, dilation, groups, policy, layer, 1)


def conv2d(x, weight, bias=None, stride=1, padding=0, dilation=1, groups=1, policy=None,
           layer=None):
    """F.conv2d saving a compressed input. padding="same" with an odd total padding runs the
    plain op."""
    return _conv(x, weight, bias, stride, padding, dilation, groups, policy, layer, 2)


# --- activations ---------------------------------------------------------------------------

class ReLUFunction(Function):
    """relu; saves a 1-bit mask of where the gradient passes."""

    @staticmethod
    def forward(ctx, x, inplace, policy, layer):
        if inplace:
            ctx.mark_dirty(x)
            out = x.relu_()
        else:
            out = torch.relu(x)
        # threshold_backward passes the gradient where NOT (out <= 0): NaN outputs pass it too
        _save(ctx, _store_mask(out.le(0).logical_not_(), policy, "relu", layer))
        return out

    @staticmethod
    @once_differentiable
    def backward(ctx, g):
        (mask,) = save.load(ctx)
        return torch.where(mask, g, 0), None, None, None


def relu(x, inplace=False, policy=None, layer=None):
    """F.relu saving a 1-bit mask (exact whatever the policy)."""
    if not _needs_grad(x):
        return F.relu(x, inplace=inplace)
    return ReLUFunction.apply(x, inplace, policy, layer)


class GELUFunction(Function):
    """gelu (approximate "none" or "tanh"); saves the input (op "gelu")."""

    @staticmethod
    def forward(ctx, x, approximate, policy, layer):
        ctx.approximate = approximate
        _save(ctx, _store(x, policy, "gelu", layer))
        return F.gelu(x, approximate=approximate)

    @staticmethod
    @once_differentiable
    def backward(ctx, g):
        (x,) = save.load(ctx)
        return aten.gelu_backward(g, x, approximate=ctx.approximate), None, None, None


def gelu(x, approximate="none", policy=None, layer=None):
    """F.gelu saving a compressed input."""
    if not _needs_grad(x):
        return F.gelu(x, approximate=approximate)
    return GELUFunction.apply(x, approximate, policy, layer)


class SiLUFunction(Function):
    """silu; saves the input (op "silu")."""

    @staticmethod
    def forward(ctx, x, inplace, policy, layer):
        packed = _store(x, policy, "silu", layer)
        if inplace:
            if packed.enc is None:  # kept as it is: it must not see the in-place result
                packed = packed_.keep(x.detach().clone())
            ctx.mark_dirty(x)
        _save(ctx, packed)
        return F.silu(x, inplace=inplace)

    @staticmethod
    @once_differentiable
    def backward(ctx, g):
        (x,) = save.load(ctx)
        return aten.silu_backward(g, x), None, None, None


def silu(x, inplace=False, policy=None, layer=None):
    """F.silu saving a compressed input."""
    if not _needs_grad(x):
        return F.silu(x, inplace=inplace)
    return SiLUFunction.apply(x, inplace, policy, layer)


# --- normalization -------------------------------------------------------------------------

class BatchNormFunction(Function):
    """Training-mode batch norm through aten.native_batch_norm (running statistics updated in
    place exactly as the plain op does); saves the input (op "batch_norm") and the batch's
    small mean and inverse std as they are."""

    @staticmethod
    def forward(ctx, x, weight, bias, running_mean, running_var, momentum, eps, policy, layer):
        out, mean, invstd = aten.native_batch_norm(x, weight, bias, running_mean, running_var,
                                                   True, momentum, eps)
        ctx.eps = eps
        ctx.x_layout = Layout(x.detach(), None)
        need_x, need_w, _ = ctx.needs_input_grad[:3]
        _save(ctx, _store(x, policy, "batch_norm", layer) if need_x or need_w else None,
                     weight, mean, invstd)
        return out

    @staticmethod
    @once_differentiable
    def backward(ctx, g):
        need_x, need_w, need_b = ctx.needs_input_grad[:3]
        x, w, mean, invstd = save.load(ctx)
        if x is None:  # only the bias's gradient: the input's values are never read
            x = _shape_only(ctx.x_layout)
        mask = [need_x, need_w and w is not None, need_b]
        gx, gw, gb = aten.native_batch_norm_backward(g, x, w, None, None, mean, invstd, True,
                                                     ctx.eps, mask)
        return gx, gw, gb, None, None, None, None, None, None


def batch_norm(x, running_mean, running_var, weight=None, bias=None, training=False,
               momentum=0.1, eps=1e-5, policy=None, layer=None):
    """F.batch_norm saving a compressed input; evaluation mode (training=False) runs the
    plain op. `momentum` is the factor itself; nn.BatchNorm's momentum=None (a cumulative
    average) is the module's business (the converted module passes 1/num_batches_tracked)."""
    if not training or not _needs_grad(x, weight, bias):
        return F.batch_norm(x, running_mean, running_var, weight, bias, training, momentum, eps)
    if x.dim() < 2:
        raise ValueError(f"expected 2-D or higher input (got {x.dim()}-D input)")
    F._verify_batch_size(x.size())
    return BatchNormFunction.apply(x, weight, bias, running_mean, running_var, momentum, eps,
                                   policy, layer)


class LayerNormFunction(Function):
    """aten.native_layer_norm; saves the input (op "layer_norm") and the small per-row mean
    and rstd as they are."""

    @staticmethod
    def forward(ctx, x, normalized_shape, weight, bias, eps, policy, layer):
        out, mean, rstd = aten.native_layer_norm(x, normalized_shape, weight, bias, eps)
        ctx.normalized_shape = normalized_shape
        ctx.x_layout = Layout(x.detach(), None)
        need_x, need_w = ctx.needs_input_grad[0], ctx.needs_input_grad[2]
        _save(ctx, _store(x, policy, "layer_norm", layer) if need_x or need_w else None,
                     weight, bias, mean, rstd)
        return out

    @staticmethod
    @once_differentiable
    def backward(ctx, g):
        need_x, _, need_w, need_b = ctx.needs_input_grad[:4]
        x, w, b, mean, rstd = save.load(ctx)
        if x is None:
            x = _shape_only(ctx.x_layout)
        mask = [need_x, need_w and w is not None, need_b and b is not None]
        gx, gw, gb = aten.native_layer_norm_backward(g, x, ctx.normalized_shape, mean, rstd, w,
                                                     b, mask)
        return gx, None, gw, gb, None, None, None


def layer_norm(x, normalized_shape, weight=None, bias=None, eps=1e-5, policy=None, layer=None):
    """F.layer_norm saving a compressed input."""
    if not _needs_grad(x, weight, bias):
        return F.layer_norm(x, normalized_shape, weight, bias, eps)
    shape = (normalized_shape,) if isinstance(normalized_shape, int) else tuple(normalized_shape)
    return LayerNormFunction.apply(x, list(shape), weight, bias, eps, policy, layer)


# --- pooling -------------------------------------------------------------------------------

def _window_offsets(out_hw, kernel, stride, padding, device):
    """Row and column of each output window's first element, as int64 (OH, 1) and (OW,)."""
    oh = torch.arange(out_hw[0], device=device).mul_(stride[0]).sub_(padding[0])
    ow = torch.arange(out_hw[1], device=device).mul_(stride[1]).sub_(padding[1])
    return oh.view(-1, 1), ow


class MaxPool2dFunction(Function):
    """aten.max_pool2d_with_indices. Keeps, instead of int64 flat indices, each output's
    argmax position within its kernel window (uint8 for windows of up to 256 elements, else
    int16 or int32); backward rebuilds the indices for aten's max_pool2d_with_indices_backward,
    which reads the input only for its shape."""

    @staticmethod
    def forward(ctx, x, kernel, stride, padding, dilation, ceil_mode, layer):
        out, idx = aten.max_pool2d_with_indices(x, kernel, stride, padding, dilation, ceil_mode)
        t0 = time.perf_counter()
        width = x.shape[-1]
        oh, ow = _window_offsets(out.shape[-2:], kernel, stride, padding, x.device)
        row = idx.div(width, rounding_mode="floor")
        col = idx.sub_(row * width)                          # idx is ours: reuse it
        local = row.sub_(oh).div_(dilation[0], rounding_mode="floor").mul_(kernel[1])
        local.add_(col.sub_(ow).div_(dilation[1], rounding_mode="floor"))
        area = kernel[0] * kernel[1]
        dtype = torch.uint8 if area <= 256 else torch.int16 if area <= 2**15 else torch.int32
        packed = packed_.Packed(kept=local.to(dtype), layout=Layout(local, None),
                                original_nbytes=8 * local.numel())
        packed.version = None  # ours alone: nothing else can change it
        save.session().adopt(packed, "max_pool", layer, time.perf_counter() - t0)
        ctx.params = (kernel, stride, padding, dilation, ceil_mode)
        ctx.x_layout = Layout(x.detach(), None)
        _save(ctx, packed)
        return out

    @staticmethod
    @once_differentiable
    def backward(ctx, g):
        kernel, stride, padding, dilation, ceil_mode = ctx.params
        (local,) = save.load(ctx)
        oh, ow = _window_offsets(local.shape[-2:], kernel, stride, padding, local.device)
        kh = local.div(kernel[1], rounding_mode="floor")
        kw = local.sub_(kh * kernel[1])
        width = ctx.x_layout.shape[-1]
        idx = kh.mul_(dilation[0]).add_(oh).mul_(width).add_(kw.mul_(dilation[1]).add_(ow))
        gx = aten.max_pool2d_with_indices_backward(g, _shape_only(ctx.x_layout), kernel, stride,
                                                   padding, dilation, ceil_mode, idx)
        return gx, None, None, None, None, None, None


def _pool_args(kernel_size, stride, padding, dilation, n):
    kernel = _tuple(kernel_size, n)
    stride = kernel if stride is None or (isinstance(stride, (tuple, list)) and not stride) \
        else _tuple(stride, n)
    return list(kernel), list(stride), list(_tuple(padding, n)), list(_tuple(dilation, n))


def max_pool2d(x, kernel_size, stride=None, padding=0, dilation=1, ceil_mode=False,
               return_indices=False, policy=None, layer=None):
    """F.max_pool2d keeping small argmax positions. return_indices=True runs the plain op (the
    caller wants int64 indices anyway)."""
    if return_indices or not _needs_grad(x):
        return F.max_pool2d(x, kernel_size, stride, padding, dilation, ceil_mode=ceil_mode,
                            return_indices=return_indices)
    k, s, p, d = _pool_args(kernel_size, stride, padding, dilation, 2)
    return MaxPool2dFunction.apply(x, k, s, p, d, ceil_mode, layer)


def max_pool1d(x, kernel_size, stride=None, padding=0, dilation=1, ceil_mode=False,
               return_indices=False, policy=None, layer=None):
    """F.max_pool1d keeping small argmax positions; like aten, a 2-D pool of height 1."""
    if return_indices or not _needs_grad(x):
        return F.max_pool1d(x, kernel_size, stride, padding, dilation, ceil_mode=ceil_mode,
                            return_indices=return_indices)
    k, s, p, d = _pool_args(kernel_size, stride, padding, dilation, 1)
    out = MaxPool2dFunction.apply(x.unsqueeze(-2), [1] + k, [1] + s, [0] + p, [1] + d,
                                  ceil_mode, layer)
    return out.squeeze(-2)


class AvgPool2dFunction(Function):
    """aten.avg_pool2d; saves nothing but the input's shape."""

    @staticmethod
    def forward(ctx, x, kernel, stride, padding, ceil_mode, count_include_pad, divisor_override):
        ctx.params = (kernel, stride, padding, ceil_mode, count_include_pad, divisor_override)
        ctx.x_layout = Layout(x.detach(), None)
        return aten.avg_pool2d(x, kernel, stride, padding, ceil_mode, count_include_pad,
                               divisor_override)

    @staticmethod
    @once_differentiable
    def backward(ctx, g):
        gx = aten.avg_pool2d_backward(g, _shape_only(ctx.x_layout), *ctx.params)
        return gx, None, None, None, None, None, None


def avg_pool2d(x, kernel_size, stride=None, padding=0, ceil_mode=False, count_include_pad=True,
               divisor_override=None, policy=None, layer=None):
    """F.avg_pool2d saving nothing but shapes."""
    if not _needs_grad(x):
        return F.avg_pool2d(x, kernel_size, stride, padding, ceil_mode, count_include_pad,
                            divisor_override)
    k, s, p, _ = _pool_args(kernel_size, stride, padding, 1, 2)
    return AvgPool2dFunction.apply(x, k, s, p, ceil_mode, count_include_pad, divisor_override)


def avg_pool1d(x, kernel_size, stride=None, padding=0, ceil_mode=False, count_include_pad=True,
               policy=None, layer=None):
    """F.avg_pool1d saving nothing but shapes; like aten, a 2-D pool of height 1."""
    if not _needs_grad(x):
        return F.avg_pool1d(x, kernel_size, stride, padding, ceil_mode, count_include_pad)
    k, s, p, _ = _pool_args(kernel_size, stride, padding, 1, 1)
    out = AvgPool2dFunction.apply(x.unsqueeze(-2), [1] + k, [1] + s, [0] + p, ceil_mode,
                                  count_include_pad, None)
    return out.squeeze(-2)


# --- dropout -------------------------------------------------------------------------------

def _dropout_scale(p: float, dtype) -> torch.Tensor:
    """1/(1-p) as the plain CPU dropout computes it: a 1 in `dtype` divided by (1-p)."""
    return torch.ones((), dtype=dtype).div_(1 - p)


class DropoutFunction(Function):
    """Dropout with the mask drawn by aten.native_dropout (the same draws from the generator
    as nn.Dropout's, so the same mask for the same seed); saves the mask at 1 bit.

    The output is x * mask * s with s = 1/(1-p) computed in the input's dtype, which is what
    nn.Dropout computes on the CPU (x * (bernoulli / (1-p))). native_dropout itself scales by
    1/(1-p) rounded from double, which differs in the last bit for some p (p=0.15 in float32)
    and for most p in half precision; its output is used only when the two scales agree."""

    @staticmethod
    def forward(ctx, x, p, inplace, policy, layer):
        native_out, mask = aten.native_dropout(x, p, True)
        scale = _dropout_scale(p, x.dtype)
        opmath = torch.float64 if x.dtype == torch.float64 else torch.float32
        same = x.device.type != "cpu" or (
            torch.tensor(1.0 / (1.0 - p), dtype=torch.float64).to(opmath).item()
            == scale.to(opmath).item())
        ctx.scale = scale.item() if x.device.type == "cpu" else 1.0 / (1.0 - p)
        _save(ctx, _store_mask(mask, policy, "dropout", layer))
        # scale stays a 0-dim CPU tensor: a device op reads it as a scalar of x's dtype,
        # with no copy to the device
        if inplace:
            ctx.mark_dirty(x)
            return x.mul_(mask).mul_(scale)
        return native_out if same else x.mul(mask).mul_(scale)

    @staticmethod
    @once_differentiable
    def backward(ctx, g):
        (mask,) = save.load(ctx)
        return aten.native_dropout_backward(g, mask.to(g.device), ctx.scale), None, None, None, \
            None


def dropout(x, p=0.5, training=True, inplace=False, policy=None, layer=None):
    """F.dropout keeping a 1-bit mask. p=0, p=1 and evaluation mode run the plain op."""
    if not training or p <= 0 or p >= 1 or not _needs_grad(x) or x.numel() == 0:
        return F.dropout(x, p, training, inplace)
    return DropoutFunction.apply(x, p, inplace, policy, layer)


# --- softmax -------------------------------------------------------------------------------

class SoftmaxFunction(Function):
    """aten._softmax; saves the output (op "softmax"), backward
    aten._softmax_backward_data."""

    @staticmethod
    def forward(ctx, x, dim, policy, layer):
        out = torch._softmax(x, dim, False)
        ctx.dim, ctx.dtype = dim, x.dtype
        _save(ctx, _store(out, policy, "softmax", layer))
        return out

    @staticmethod
    @once_differentiable
    def backward(ctx, g):
        (out,) = save.load(ctx)
        return aten._softmax_backward_data(g, out, ctx.dim, ctx.dtype), None, None, None


def softmax(x, dim, dtype=None, policy=None, layer=None):
    """F.softmax saving a compressed output (`dtype` converts the input first, as torch
    does)."""
    if dtype is not None:
        x = x.to(dtype)
    if not _needs_grad(x) or x.dim() == 0:
        return F.softmax(x, dim)
    return SoftmaxFunction.apply(x, dim, policy, layer)
