"""Real clients for the lab: the transformers models of `python -m actcodec memory` (built from
a config, random weights, nothing downloaded), at the sizes the step benchmark times. Each
builder returns (model, loss_fn) with loss_fn(model) a training loss."""
from __future__ import annotations

from actcodec.apps.zoo import enable_checkpointing, gpt2, resnet  # noqa: F401

MODELS = ("gpt2", "resnet", "narrow_resnet", "vit", "bert", "mobilenet_v2", "convnext",
          "levit", "llama")
SIZES = {"gpt2": {"batch": 4, "seq": 256}, "resnet": {"batch": 32, "size": 128},
         "narrow_resnet": {"batch": 8, "size": 64},
         "vit": {"batch": 16, "size": 64}, "bert": {"batch": 8, "seq": 128},
         "mobilenet_v2": {"batch": 8, "size": 96}, "convnext": {"batch": 8, "size": 64},
         "levit": {"batch": 8, "size": 64}, "llama": {"batch": 4, "seq": 256}}


def narrow_resnet(batch: int, size: int):
    """transformers' ResNetForImageClassification from a config, basic blocks of widths 32 to
    256 (a stem of 32): the layout issue 26 found the 8-bit promise failing on."""
    import torch
    import transformers as tf

    tf.logging.set_verbosity_error()
    torch.manual_seed(0)
    model = tf.ResNetForImageClassification(tf.ResNetConfig(
        embedding_size=32, depths=[2, 2, 2, 2], hidden_sizes=[32, 64, 128, 256],
        layer_type="basic", num_labels=10))
    gen = torch.Generator().manual_seed(1)
    x = torch.randn(batch, 3, size, size, generator=gen)
    y = torch.randint(0, 10, (batch,), generator=gen)
    return model, lambda m: m(pixel_values=x, labels=y).loss


def vit(batch: int, size: int):
    """transformers' ViTForImageClassification from a config: 4 layers of 192, patches of 8."""
    import torch
    import transformers as tf

    tf.logging.set_verbosity_error()
    torch.manual_seed(0)
    model = tf.ViTForImageClassification(tf.ViTConfig(
        image_size=size, patch_size=8, hidden_size=192, num_hidden_layers=4,
        num_attention_heads=3, intermediate_size=768, num_labels=10, hidden_dropout_prob=0.0,
        attention_probs_dropout_prob=0.0))
    gen = torch.Generator().manual_seed(1)
    x, y = torch.randn(batch, 3, size, size, generator=gen), torch.randint(0, 10, (batch,))
    return model, lambda m: m(pixel_values=x, labels=y).loss


def bert(batch: int, seq: int):
    """transformers' BertForMaskedLM from a config: 4 layers of 256, every token a label."""
    import torch
    import transformers as tf

    tf.logging.set_verbosity_error()
    torch.manual_seed(0)
    model = tf.BertForMaskedLM(tf.BertConfig(
        vocab_size=8192, hidden_size=256, num_hidden_layers=4, num_attention_heads=4,
        intermediate_size=1024, max_position_embeddings=seq, hidden_dropout_prob=0.0,
        attention_probs_dropout_prob=0.0))
    ids = torch.randint(0, 8192, (batch, seq), generator=torch.Generator().manual_seed(1))
    return model, lambda m: m(input_ids=ids, labels=ids).loss


def _images(model, batch: int, size: int, labels: int = 10):
    import torch

    gen = torch.Generator().manual_seed(1)
    x = torch.randn(batch, 3, size, size, generator=gen)
    y = torch.randint(0, labels, (batch,), generator=gen)
    return model, lambda m: m(pixel_values=x, labels=y).loss


def mobilenet_v2(batch: int, size: int):
    """transformers' MobileNetV2ForImageClassification from a config, width 0.5: ReLU6 (a
    clamp: backward compares its input with 0 and 6), depthwise convolutions, no dropout."""
    import torch
    import transformers as tf

    tf.logging.set_verbosity_error()
    torch.manual_seed(0)
    return _images(tf.MobileNetV2ForImageClassification(tf.MobileNetV2Config(
        image_size=size, depth_multiplier=0.5, num_labels=10, classifier_dropout_prob=0.0)),
        batch, size)


def convnext(batch: int, size: int):
    """transformers' ConvNextForImageClassification from a config: depthwise 7x7, LayerNorm,
    GELU, layer scale (at 1, not its 1e-6 initialisation, which leaves the blocks' own
    gradients a millionth of the rest); widths 32 to 256."""
    import torch
    import transformers as tf

    tf.logging.set_verbosity_error()
    torch.manual_seed(0)
    return _images(tf.ConvNextForImageClassification(tf.ConvNextConfig(
        hidden_sizes=[32, 64, 128, 256], depths=[2, 2, 2, 2], num_labels=10,
        layer_scale_init_value=1.0)), batch, size)


def levit(batch: int, size: int):
    """transformers' LevitForImageClassification from a config: convolutions, attention and
    Hardswish (whose backward reads its input's position against -3 and 3), widths 64-192."""
    import torch
    import transformers as tf

    tf.logging.set_verbosity_error()
    torch.manual_seed(0)
    return _images(tf.LevitForImageClassification(tf.LevitConfig(
        image_size=size, hidden_sizes=[64, 128, 192], num_attention_heads=[2, 4, 6],
        depths=[2, 2, 2], key_dim=[16, 16, 16], num_labels=10)), batch, size)


def llama(batch: int, seq: int):
    """transformers' LlamaForCausalLM from a config: 4 layers of 256, RMSNorm, SwiGLU,
    rotary positions, an untied head over 8192 tokens."""
    import torch
    import transformers as tf

    tf.logging.set_verbosity_error()
    torch.manual_seed(0)
    model = tf.LlamaForCausalLM(tf.LlamaConfig(
        vocab_size=8192, hidden_size=256, intermediate_size=688, num_hidden_layers=4,
        num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=seq,
        tie_word_embeddings=False))
    ids = torch.randint(0, 8192, (batch, seq), generator=torch.Generator().manual_seed(1))
    return model, lambda m: m(input_ids=ids, labels=ids).loss


def build(name: str, **sizes):
    if name not in MODELS:
        raise SystemExit(f"unknown model {name!r}; choose from {', '.join(MODELS)}")
    return {"gpt2": gpt2, "resnet": resnet, "narrow_resnet": narrow_resnet, "vit": vit,
            "bert": bert, "mobilenet_v2": mobilenet_v2, "convnext": convnext,
            "levit": levit, "llama": llama}[name](
        **{**SIZES[name], **sizes})


TEXT_CONTEXT = 256  # bytes per window of the byte-level GPT-2 below


def help_text(context: int = TEXT_CONTEXT):
    """(x_train, y_train, x_test, y_test): windows of Python's help text (demo_text.py),
    held-out topics for the test set."""
    import tempfile
    from pathlib import Path

    from actcodec.apps import demo_text

    with tempfile.TemporaryDirectory() as tmp:
        demo_text.split(str(Path(tmp) / "text.npz"), context)
        return demo_text.data(str(Path(tmp) / "text.npz"))


def byte_gpt2(seed: int = 0, context: int = TEXT_CONTEXT):
    """transformers' GPT2LMHeadModel from a config over bytes, 4 layers of 256, dropout off, and
    its loss on (inputs, targets)."""
    import torch
    import transformers as tf

    tf.logging.set_verbosity_error()
    torch.manual_seed(seed)
    model = tf.GPT2LMHeadModel(tf.GPT2Config(
        n_layer=4, n_embd=256, n_head=4, n_positions=context, vocab_size=256,
        resid_pdrop=0.0, embd_pdrop=0.0, attn_pdrop=0.0))

    def loss(x, y):
        return torch.nn.functional.cross_entropy(model(input_ids=x).logits.flatten(0, 1),
                                                 y.flatten())
    return model, loss
