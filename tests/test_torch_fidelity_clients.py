"""The default preset's per-parameter promise on a model nobody here tuned for: a transformers
ResNet built from a config (random init, nothing downloaded). Every parameter's gradient keeps
a cosine of at least .996 to the exact one under the default 8-bit policy.

The cause this guards: ReLU's backward reads which of its outputs are positive, and dense
8-bit quantization rounds a small positive next to a zero in its group to zero, flipping the
mask (before the fix: worst parameter 0.9899, the stem batch norm's bias)."""
import statistics

import pytest

torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")

import actcodec.torch as act  # noqa: E402


def resnet(depths, seed):
    torch.manual_seed(seed)
    cfg = transformers.ResNetConfig(embedding_size=32, hidden_sizes=[32, 64, 128, 256],
                                    depths=depths, layer_type="basic", num_labels=10)
    model = transformers.ResNetForImageClassification(cfg).train()
    return model, torch.randn(8, 3, 64, 64), torch.randint(0, 10, (8,))


def grads(model, x, y, ctx=None):
    model.zero_grad()
    if ctx is None:
        loss = model(pixel_values=x, labels=y).loss
    else:
        with ctx:
            loss = model(pixel_values=x, labels=y).loss
    loss.backward()
    return {n: p.grad.double().clone() for n, p in model.named_parameters()}


def cosine(a, b) -> float:
    return float(a.flatten() @ b.flatten() / (a.norm() * b.norm()))


@pytest.mark.parametrize("depths,seed", [([1, 1, 1, 1], 0), ([2, 2, 2, 2], 1)])
def test_every_parameter_keeps_its_gradient_under_the_default_preset(depths, seed):
    model, x, y = resnet(depths, seed)
    exact = grads(model, x, y)
    ctx = act.compress_saved(model=model)
    got = grads(model, x, y, ctx)
    worst = min((cosine(exact[n], got[n]), n) for n in exact if exact[n].abs().max() > 0)
    assert worst[0] >= 0.996, worst
    assert ctx.stats.ratio > 3.5


def test_relu_outputs_keep_their_sign_under_lossy_settings():
    """A ReLU output with few zeros, which dense quantization would have stored smaller, is
    stored sparse: decoded, exactly the same elements are positive."""
    torch.manual_seed(0)
    x = torch.randn(64, 4096).abs_().add_(1e-3)
    x[:, ::97] = -1.0  # about 1% zeros after the ReLU, next to small positives
    x[:, 1::97] = 1e-6
    ctx = act.compress_saved(act.Policy(bits=8, min_bytes=0), store=None, allocator=False)
    leaf = x.clone().requires_grad_()
    with ctx:
        out = torch.relu(leaf * 1.0)
    codecs = {op: r.codecs for (_, op), r in ctx.stats.rows.items()}
    assert codecs.get("relu") == {"bitmap_quant": 1}, codecs
    out.sum().backward()
    assert torch.equal(leaf.grad, (x > 0).float())  # the mask came back exact


def test_mobilenet_v2_keeps_the_8bit_promise():
    """ReLU6 (hardtanh(0, 6)): its backward compares its input with 0 and 6, and dense 8-bit
    saves flipped that mask (whole cosine 0.95); stored as the comparison (save/boundary.py)."""
    torch.manual_seed(0)
    cfg = transformers.MobileNetV2Config(image_size=96, num_labels=10, depth_multiplier=0.35,
                                         classifier_dropout_prob=0.0)
    model = transformers.MobileNetV2ForImageClassification(cfg).train()
    x, y = torch.randn(4, 3, 96, 96), torch.randint(0, 10, (4,))
    exact = grads(model, x, y)
    ctx = act.compress_saved(model=model)
    got = grads(model, x, y, ctx)
    whole = cosine(torch.cat([v.flatten() for v in exact.values()]),
                   torch.cat([v.flatten() for v in got.values()]))
    # A batch norm's bias before another batch norm (the bottlenecks without a residual) has
    # a gradient of zero by construction; what it shows is rounding, 1e-7 of the others.
    median = statistics.median(float(v.norm()) for v in exact.values())
    worst = min((cosine(exact[n], got[n]), n) for n in exact
                if float(exact[n].norm()) > 1e-4 * median)
    assert whole >= 0.9999 and worst[0] >= 0.999, (whole, worst)
    assert ctx.stats.ratio > 5
