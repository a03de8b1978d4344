"""Autograd Functions that save compressed activations for backward.

Each Function computes in forward exactly what the plain op computes (the same aten kernels in
the same order, so the same bits) and saves for backward only what backward needs, through
`store`: inputs as the policy says for the op and layer, ReLU and dropout masks at 1 bit per
element, max-pool argmax positions as one small integer per output (uint8 for windows of up to
256 elements). Backward decompresses them (`packing.load`) and calls the kernels autograd
itself calls for the plain op, on tensors restored with the strides (and the 64-byte alignment)
the originals had, so with a lossless policy the gradients are the plain op's, bit for bit.

What autograd would do is followed exactly, including the choices aten makes from layouts: the
column-major special cases of mm's backward, `linear`'s fused addmm path versus matmul plus
add, and `matmul`'s mm, fold-to-mm and broadcast-to-bmm paths (with the reductions over
broadcast dimensions autograd does). These paths are aten's as of torch 2.13; the lossless
bit-identity tests are what would flag a later torch choosing differently. Layout matters:
without it some folded products with a column-major operand differ in the last bits. Inputs
that are broadcast views (stride 0) are stored once, not once per repeat. Restoring a strided
operand (a head of a fused qkv tensor, say) briefly allocates its whole span in backward.

The functional wrappers (`linear`, `conv2d`, `relu`, `matmul`, ...) take the plain op's
arguments plus `policy` (default `Policy()`) and `layer` (a name for the policy's overrides and
the accounting). They run the plain op when nothing needs a gradient (grad mode off, or no
input requires grad) and for the few argument forms they do not cover (said in each
docstring), so they can stand in for the plain op everywhere.

Not covered: autocast (the Functions compute in the dtypes they are given) and double backward
(`once_differentiable`).
"""
from __future__ import annotations

import math
import time

import torch
import torch.nn.functional as F
from torch.autograd import Function
from torch.autograd.function import once_differentiable

from . import accounting, packing
from .policy import Policy
from .store import store, store_mask

aten = torch.ops.aten

__all__ = ["linear", "conv1d", "conv2d", "relu", "gelu", "silu", "batch_norm", "layer_norm",
           "max_pool1d", "max_pool2d", "avg_pool1d", "avg_pool2d", "dropout", "softmax",
           "matmul", "bmm"]

_DEFAULT_POLICY = None


def _policy(policy):
    global _DEFAULT_POLICY
    if policy is not None:
        return policy
    if _DEFAULT_POLICY is None:
        _DEFAULT_POLICY = Policy()
    return _DEFAULT_POLICY


def _needs_grad(*tensors) -> bool:
    """True when autograd will record the op: grad mode on and some input requires grad."""
    return torch.is_grad_enabled() and any(t is not None and t.requires_grad for t in tensors)


# --- saving inputs with their layout ------------------------------------------------------

_ALIGN = 64  # bytes; the CPU allocator's alignment


class _Layout:
    """What `_restore` needs to give a decompressed tensor back the original's strides, its
    address alignment and its broadcast (stride-0) dimensions."""

    __slots__ = ("shape", "stride", "dtype", "align", "expand")

    def __init__(self, base: torch.Tensor, expand):
        self.shape, self.stride = tuple(base.shape), tuple(base.stride())
        self.dtype, self.expand = base.dtype, expand
        self.align = base.data_ptr() % _ALIGN

    def stand_in(self) -> torch.Tensor:
        """A data-less tensor with the original's sizes and strides, for layout decisions."""
        t = torch.empty_strided(self.shape, self.stride, dtype=self.dtype, device="meta")
        return t.expand(self.expand) if self.expand is not None else t


def _input_item(t: torch.Tensor, policy, op: str, layer):
    """(Packed for `packing.save`, _Layout). Broadcast dimensions are stored once."""
    base, expand = t.detach(), None
    for d, (size, stride) in enumerate(zip(t.shape, t.stride())):
        if stride == 0 and size > 1:
            base = base.narrow(d, 0, 1)
    if base.shape != t.shape:
        expand = tuple(t.shape)
    return store(base, _policy(policy), op, layer), _Layout(base, expand)


def _non_overlapping(shape, stride) -> bool:
    span = 0
    for size, st in sorted(((s, st) for s, st in zip(shape, stride) if s > 1),
                           key=lambda p: p[1]):
        if st <= span:
            return False
        span += st * (size - 1)
    return True


def _restore(value: torch.Tensor, layout: _Layout) -> torch.Tensor:
    """`value` (the decompressed tensor, contiguous) laid out as the original was: the same
    strides, address alignment and broadcast dimensions, so that kernels whose path depends on
    layout take the plain op's path. Gaps between elements of a strided original (a slice of a
    wider tensor) are allocated but never read."""
    item = value.element_size()
    if value.numel() and (tuple(value.stride()) != layout.stride
                          or value.data_ptr() % _ALIGN != layout.align):
        if _non_overlapping(layout.shape, layout.stride):
            offset = layout.align // item if layout.align % item == 0 else 0
            span = 1 + sum((s - 1) * st for s, st in zip(layout.shape, layout.stride))
            storage = torch.empty(offset + span, dtype=value.dtype, device=value.device)
            out = storage.as_strided(layout.shape, layout.stride, offset)
            out.copy_(value)
            value = out
    return value.expand(layout.expand) if layout.expand is not None else value


def _save(ctx, *entries):
    """entries: (Packed, _Layout) pairs, plain tensors, or None; see `_load`."""
    items, layouts = [], []
    for e in entries:
        if isinstance(e, tuple):
            items.append(e[0])
            layouts.append(e[1])
        else:
            items.append(e)
            layouts.append(None)
    packing.save(ctx, *items)
    ctx.actcodec_layouts = layouts


def _load(ctx) -> list:
    return [v if lay is None or v is None else _restore(v, lay)
            for v, lay in zip(packing.load(ctx), ctx.actcodec_layouts)]


def _record_plain(t: torch.Tensor, codec: str, op: str, layer, original_nbytes: int, seconds):
    """A Packed holding `t` as it is (already small), recorded in the accounting under `codec`
    against the bytes autograd would have kept."""
    meta = packing.Meta("kept", codec, t.dtype, tuple(t.shape), original_nbytes=original_nbytes)
    packed = packing.Packed(meta, (t,))
    acc = accounting.current()
    if acc is not None:
        acc.add(layer, op, packed, seconds)
    return packed


# --- matrix products as aten computes them ---------------------------------------------------

def _mm_mat1_backward(grad, mat2, mat1):
    """autograd's gradient of mm's first operand; `mat1` only gives its sizes and strides."""
    size, stride = mat1.shape, mat1.stride()
    if stride[0] == 1 and stride[1] == size[0]:  # column-major: answer column-major
        return mat2.mm(grad.t()).t()
    return grad.mm(mat2.t())


def _mm_mat2_backward(grad, mat1, mat2):
    size, stride = mat2.shape, mat2.stride()
    if stride[0] == 1 and stride[1] == size[0]:
        return grad.t().mm(mat1).t()
    return mat1.t().mm(grad)


def _sum_to(t, shape):
    """at::sum_to: autograd's reduction of a gradient to a broadcast input's shape."""
    shape = tuple(shape)
    if len(shape) == 0:
        return t.sum()
    lead = t.dim() - len(shape)
    dims = list(range(lead)) + [i for i in range(lead, t.dim())
                                if shape[i - lead] == 1 and t.shape[i] != 1]
    if dims:
        t = t.sum(dims, keepdim=True)
    return t.view(shape) if lead > 0 else t


def _should_fold(a, b, a_rg, b_rg) -> bool:
    """aten's should_fold: compute a batched product with one mm on a folded operand."""
    a_larger = a.dim() >= b.dim()
    t1 = a if a_larger else b.mT
    dim_t2 = b.dim() if a_larger else a.dim()
    if not (t1.dim() >= 3 and dim_t2 <= 2):
        return False
    if b_rg if a_larger else a_rg:
        return True
    if a.dim() == 2:
        return False
    if t1.numel() == 0:
        return True
    size, stride = t1.shape, t1.stride()
    return all(stride[i] == stride[i + 1] * size[i + 1] for i in range(t1.dim() - 2))


def _matmul_plan(a, b, a_rg, b_rg):
    """The path aten's matmul takes for `a @ b` (both at least 2-D), given whether each
    operand requires grad (some choices depend on it)."""
    if a.dim() == 2 and b.dim() == 2:
        return ("mm",)
    if a.dim() == 3 and b.dim() == 3 and a.shape[0] != b.shape[0]:
        if a.shape[0] == 1 and a_rg:
            return ("squeeze_a", _matmul_plan(a.squeeze(0), b, a_rg, b_rg))
        if b.shape[0] == 1 and b_rg:
            return ("squeeze_b", _matmul_plan(a, b.squeeze(0), a_rg, b_rg))
    if _should_fold(a, b, a_rg, b_rg):
        return ("fold", b.dim() > a.dim())
    return ("bmm",)


def _fold_operands(a, b, transpose):
    t1 = b.mT if transpose else a
    t2 = a.t() if transpose else b
    folded = math.prod(t1.shape[:-1])
    return t1, t2, t1.reshape(folded, t1.shape[-1])


def _bmm_shapes(a, b):
    batch = tuple(torch.broadcast_shapes(a.shape[:-2], b.shape[:-2]))
    n, m, p = a.shape[-2], a.shape[-1], b.shape[-1]
    return batch, math.prod(batch), n, m, p


def _matmul_forward(a, b, plan):
    kind = plan[0]
    if kind == "mm":
        return a.mm(b)
    if kind == "squeeze_a":
        return _matmul_forward(a.squeeze(0), b, plan[1])
    if kind == "squeeze_b":
        return _matmul_forward(a, b.squeeze(0), plan[1])
    if kind == "fold":
        t1, t2, t1f = _fold_operands(a, b, plan[1])
        out = aten._unsafe_view(t1f.mm(t2), t1.shape[:-1] + (t2.shape[1],))
        return out.mT.contiguous() if plan[1] else out
    batch, nb, n, m, p = _bmm_shapes(a, b)
    a3 = a.expand(batch + (n, m)).reshape(nb, n, m)
    b3 = b.expand(batch + (m, p)).reshape(nb, m, p)
    return aten._unsafe_view(a3.bmm(b3), batch + (n, p))


def _matmul_backward(g, a, b, plan, need_a, need_b):
    """Gradients of `a @ b` as autograd computes them through matmul's decomposition. `a` is
    only read when need_b, `b` only when need_a; otherwise a data-less stand-in will do."""
    kind = plan[0]
    if kind == "mm":
        return (_mm_mat1_backward(g, b, a) if need_a else None,
                _mm_mat2_backward(g, a, b) if need_b else None)
    if kind == "squeeze_a":
        ga, gb = _matmul_backward(g, a.squeeze(0), b, plan[1], need_a, need_b)
        return (ga.unsqueeze(0) if ga is not None else None), gb
    if kind == "squeeze_b":
        ga, gb = _matmul_backward(g, a, b.squeeze(0), plan[1], need_a, need_b)
        return ga, (gb.unsqueeze(0) if gb is not None else None)
    if kind == "fold":
        transpose = plan[1]
        t1, t2, t1f = _fold_operands(a, b, transpose)
        g2 = (g.mT if transpose else g).reshape(t1f.shape[0], t2.shape[1])
        need_t1, need_t2 = (need_b, need_a) if transpose else (need_a, need_b)
        g1 = _mm_mat1_backward(g2, t2, t1f).reshape(t1.shape) if need_t1 else None
        g2_ = _mm_mat2_backward(g2, t1f, t2) if need_t2 else None
        if transpose:
            return (g2_.t() if g2_ is not None else None), (g1.mT if g1 is not None else None)
        return g1, g2_
    batch, nb, n, m, p = _bmm_shapes(a, b)
    a_exp, b_exp = a.expand(batch + (n, m)), b.expand(batch + (m, p))
    g3 = g.reshape(nb, n, p)
    ga = gb = None
    if need_a:
        b3 = b_exp.reshape(nb, m, p)
        ga = _sum_to(g3.bmm(b3.transpose(1, 2)).reshape(a_exp.shape), a.shape)
    if need_b:
        a3 = a_exp.reshape(nb, n, m)
        gb = _sum_to(a3.transpose(1, 2).bmm(g3).reshape(b_exp.shape), b.shape)
    return ga, gb


def _operand(value, layout):
    return value if value is not None else layout.stand_in()


# --- linear --------------------------------------------------------------------------------

class LinearFunction(Function):
    """F.linear; saves the input (op "linear") when the weight needs a gradient and the
    weight itself (a parameter, no copy) when the input needs one."""

    @staticmethod
    def forward(ctx, x, weight, bias, policy, layer):
        need_x, need_w, _ = ctx.needs_input_grad[:3]
        # aten's linear: addmm on the flattened input when there is a bias and the input is 2-D
        # or contiguous; otherwise matmul(x, weight.t()) and an in-place add of the bias.
        ctx.fused = bias is not None and (x.dim() == 2 or x.is_contiguous())
        if ctx.fused:
            out = F.linear(x, weight, bias)
        else:
            ctx.plan = _matmul_plan(x, weight.t(), x.requires_grad, weight.requires_grad)
            out = _matmul_forward(x, weight.t(), ctx.plan)
            if bias is not None:
                out.add_(bias)
        ctx.bias_shape = None if bias is None else tuple(bias.shape)
        ctx.x_layout = _Layout(x, None)
        ctx.w_layout = _Layout(weight, None)
        _save(ctx, _input_item(x, policy, "linear", layer) if need_w else None,
              weight if need_x else None)
        return out

    @staticmethod
    @once_differentiable
    def backward(ctx, g):
        need_x, need_w, need_b = ctx.needs_input_grad[:3]
        x, w = _load(ctx)
        x, w = _operand(x, ctx.x_layout), _operand(w, ctx.w_layout)
        gx = gw = gb = None
        if ctx.fused:
            flat = x.dim() != 2
            x2 = x.reshape(-1, x.shape[-1]) if flat else x
            g2 = g.reshape(-1, g.shape[-1]) if flat else g
            if need_x:
                gx = _mm_mat1_backward(g2, w.t(), x2)
                gx = gx.reshape(x.shape) if flat else gx
            if need_w:
                gw = _mm_mat2_backward(g2, x2, w.t()).t()
            if need_b:
                gb = _sum_to(g2, ctx.bias_shape)
        else:
            if need_x or need_w:
                gx, gwt = _matmul_backward(g, x, w.t(), ctx.plan, need_x, need_w)
                gw = gwt.t() if gwt is not None else None
            if need_b:
                gb = _sum_to(g, ctx.bias_shape)
        return gx, gw, gb, None, None


def linear(x, weight, bias=None, policy=None, layer=None):
    """F.linear saving a compressed input. 0-d/1-d inputs outside the fused path run the
    plain op."""
    if not _needs_grad(x, weight, bias) or x.dim() == 0 or (
            x.dim() == 1 and not (bias is not None and x.is_contiguous())):
        return F.linear(x, weight, bias)
    return LinearFunction.apply(x, weight, bias, policy, layer)


# --- convolution ---------------------------------------------------------------------------

class ConvFunction(Function):
    """aten.convolution (not transposed); backward through aten.convolution_backward, the
    kernel autograd calls. Saves the input (op "conv") when the weight needs a gradient."""

    @staticmethod
    def forward(ctx, x, weight, bias, stride, padding, dilation, groups, policy, layer):
        nd = weight.dim() - 2
        conv = F.conv1d if nd == 1 else F.conv2d
        out = conv(x, weight, bias, stride, padding, dilation, groups)
        ctx.params = (stride, padding, dilation, groups, nd)
        ctx.bias_shape = None if bias is None else list(bias.shape)
        ctx.x_layout = _Layout(x, None)
        need_w = ctx.needs_input_grad[1]
        _save(ctx, _input_item(x, policy, "conv", layer) if need_w else None, weight)
        return out

    @staticmethod
    @once_differentiable
    def backward(ctx, g):
        need_x, need_w, need_b = ctx.needs_input_grad[:3]
        x, w = _load(ctx)
        if x is None:  # only the input's gradient is wanted: its values are never read
            lay = ctx.x_layout
            x = torch.empty_strided(lay.shape, lay.stride, dtype=lay.dtype, device=w.device)
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
    def forward(ctx, x, inplace, layer):
        if inplace:
            ctx.mark_dirty(x)
            out = x.relu_()
        else:
            out = torch.relu(x)
        # threshold_backward passes the gradient where NOT (out <= 0): NaN outputs pass it too
        _save(ctx, store_mask(out.le(0).logical_not_(), "relu", layer))
        return out

    @staticmethod
    @once_differentiable
    def backward(ctx, g):
        (mask,) = packing.load(ctx)
        return torch.where(mask, g, 0), None, None


def relu(x, inplace=False, policy=None, layer=None):
    """F.relu saving a 1-bit mask (exact whatever the policy)."""
    if not _needs_grad(x):
        return F.relu(x, inplace=inplace)
    return ReLUFunction.apply(x, inplace, layer)


def _unalias(packed):
    """A kept payload that aliases a tensor about to be overwritten in place: copy it."""
    if packed.meta.kind == "kept":
        return packing.Packed(packed.meta, (packed.payload[0].clone(),), packed.on_decode)
    return packed


class GELUFunction(Function):
    """gelu (approximate "none" or "tanh"); saves the input (op "gelu")."""

    @staticmethod
    def forward(ctx, x, approximate, policy, layer):
        ctx.approximate = approximate
        _save(ctx, _input_item(x, policy, "gelu", layer))
        return F.gelu(x, approximate=approximate)

    @staticmethod
    @once_differentiable
    def backward(ctx, g):
        (x,) = _load(ctx)
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
        packed, lay = _input_item(x, policy, "silu", layer)
        if inplace:
            packed = _unalias(packed)
            ctx.mark_dirty(x)
        _save(ctx, (packed, lay))
        return F.silu(x, inplace=inplace)

    @staticmethod
    @once_differentiable
    def backward(ctx, g):
        (x,) = _load(ctx)
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
        ctx.x_layout = _Layout(x, None)
        need_x, need_w, _ = ctx.needs_input_grad[:3]
        _save(ctx, _input_item(x, policy, "batch_norm", layer) if need_x or need_w else None,
              weight, mean, invstd)
        return out

    @staticmethod
    @once_differentiable
    def backward(ctx, g):
        need_x, need_w, need_b = ctx.needs_input_grad[:3]
        x, w, mean, invstd = _load(ctx)
        if x is None:  # only the bias's gradient: the input's values are never read
            lay = ctx.x_layout
            x = torch.empty_strided(lay.shape, lay.stride, dtype=lay.dtype, device=g.device)
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
        ctx.x_layout = _Layout(x, None)
        need_x, need_w, _ = ctx.needs_input_grad[0], ctx.needs_input_grad[2], None
        _save(ctx, _input_item(x, policy, "layer_norm", layer) if need_x or need_w else None,
              weight, bias, mean, rstd)
        return out

    @staticmethod
    @once_differentiable
    def backward(ctx, g):
        need_x, _, need_w, need_b = ctx.needs_input_grad[:4]
        x, w, b, mean, rstd = _load(ctx)
        if x is None:
            lay = ctx.x_layout
            x = torch.empty_strided(lay.shape, lay.stride, dtype=lay.dtype, device=g.device)
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
        local = local.to(dtype)
        name = {torch.uint8: "window_u8", torch.int16: "window_i16"}.get(dtype, "window_i32")
        packed = _record_plain(local, name, "max_pool", layer, 8 * local.numel(),
                               time.perf_counter() - t0)
        ctx.params = (kernel, stride, padding, dilation, ceil_mode)
        ctx.x_layout = _Layout(x, None)
        _save(ctx, packed)
        return out

    @staticmethod
    @once_differentiable
    def backward(ctx, g):
        kernel, stride, padding, dilation, ceil_mode = ctx.params
        (local,) = packing.load(ctx)
        local = local.long()
        oh, ow = _window_offsets(local.shape[-2:], kernel, stride, padding, local.device)
        kh = local.div(kernel[1], rounding_mode="floor")
        kw = local.sub_(kh * kernel[1])
        width = ctx.x_layout.shape[-1]
        idx = kh.mul_(dilation[0]).add_(oh).mul_(width).add_(kw.mul_(dilation[1]).add_(ow))
        lay = ctx.x_layout
        shape_only = torch.empty_strided(lay.shape, lay.stride, dtype=g.dtype, device=g.device)
        gx = aten.max_pool2d_with_indices_backward(g, shape_only, kernel, stride, padding,
                                                   dilation, ceil_mode, idx)
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
        ctx.x_layout = _Layout(x, None)
        return aten.avg_pool2d(x, kernel, stride, padding, ceil_mode, count_include_pad,
                               divisor_override)

    @staticmethod
    @once_differentiable
    def backward(ctx, g):
        lay = ctx.x_layout
        shape_only = torch.empty_strided(lay.shape, lay.stride, dtype=g.dtype, device=g.device)
        gx = aten.avg_pool2d_backward(g, shape_only, *ctx.params)
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
    def forward(ctx, x, p, inplace, layer):
        native_out, mask = aten.native_dropout(x, p, True)
        scale = _dropout_scale(p, x.dtype)
        opmath = torch.float64 if x.dtype == torch.float64 else torch.float32
        same = x.device.type != "cpu" or (
            torch.tensor(1.0 / (1.0 - p), dtype=torch.float64).to(opmath).item()
            == scale.to(opmath).item())
        ctx.scale = scale.item() if x.device.type == "cpu" else 1.0 / (1.0 - p)
        _save(ctx, store_mask(mask, "dropout", layer))
        if inplace:
            ctx.mark_dirty(x)
            return x.mul_(mask).mul_(scale.to(x.device))
        return native_out if same else x.mul(mask).mul_(scale.to(x.device))

    @staticmethod
    @once_differentiable
    def backward(ctx, g):
        (mask,) = packing.load(ctx)
        return aten.native_dropout_backward(g, mask.to(g.device), ctx.scale), None, None, None


def dropout(x, p=0.5, training=True, inplace=False, policy=None, layer=None):
    """F.dropout keeping a 1-bit mask. p=0, p=1 and evaluation mode run the plain op."""
    if not training or p <= 0 or p >= 1 or not _needs_grad(x) or x.numel() == 0:
        return F.dropout(x, p, training, inplace)
    return DropoutFunction.apply(x, p, inplace, layer)


# --- softmax -------------------------------------------------------------------------------

class SoftmaxFunction(Function):
    """aten._softmax; saves the output (op "softmax"), backward
    aten._softmax_backward_data."""

    @staticmethod
    def forward(ctx, x, dim, policy, layer):
        out = torch._softmax(x, dim, False)
        ctx.dim, ctx.dtype = dim, x.dtype
        _save(ctx, _input_item(out, policy, "softmax", layer))
        return out

    @staticmethod
    @once_differentiable
    def backward(ctx, g):
        (out,) = _load(ctx)
        return aten._softmax_backward_data(g, out, ctx.dim, ctx.dtype), None, None, None


def softmax(x, dim, dtype=None, policy=None, layer=None):
    """F.softmax saving a compressed output (`dtype` converts the input first, as torch
    does)."""
    if dtype is not None:
        x = x.to(dtype)
    if not _needs_grad(x) or x.dim() == 0:
        return F.softmax(x, dim)
    return SoftmaxFunction.apply(x, dim, policy, layer)


# --- matmul --------------------------------------------------------------------------------

class MatmulFunction(Function):
    """torch.matmul / torch.bmm for operands of at least 2 dimensions, computed along aten's
    own path (mm, fold to mm, or broadcast to bmm). Saves each operand (op "matmul") only when
    the other one needs a gradient."""

    @staticmethod
    def forward(ctx, a, b, policy, layer):
        need_a, need_b = ctx.needs_input_grad[:2]
        ctx.plan = _matmul_plan(a, b, a.requires_grad, b.requires_grad)
        ctx.a_layout, ctx.b_layout = _Layout(a, None), _Layout(b, None)
        _save(ctx, _input_item(a, policy, "matmul", layer) if need_b else None,
              _input_item(b, policy, "matmul", layer) if need_a else None)
        return _matmul_forward(a, b, ctx.plan)

    @staticmethod
    @once_differentiable
    def backward(ctx, g):
        need_a, need_b = ctx.needs_input_grad[:2]
        a, b = _load(ctx)
        a, b = _operand(a, ctx.a_layout), _operand(b, ctx.b_layout)
        ga, gb = _matmul_backward(g, a, b, ctx.plan, need_a, need_b)
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
