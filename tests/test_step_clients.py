"""Step on models as users bring them, beyond the ones the planner was tuned on: transformers
models with their own gradient checkpointing on, a model that checkpoints its own layers,
torch.compile'd models, GPT-2's Conv1D layers at batches of several samples, and a loss_fn of
the user's on padded labels. Each against plain PyTorch on the same batch."""
import copy
import warnings

import numpy

import pytest
import torch
import torch.nn.functional as F
from torch.utils.checkpoint import checkpoint

tf = pytest.importorskip("transformers")

import _padded  # noqa: E402
import actcodec.torch as act  # noqa: E402
from actcodec.torch.limit import micro_batches  # noqa: E402

VOCAB = 512
EVERY = act.Plan(recompute=(0, 1, 2))
CHUNKED = act.Plan(recompute=(0, 1, 2), chunks=2)


def llama(seed=0):
    torch.manual_seed(seed)
    return tf.LlamaForCausalLM(tf.LlamaConfig(
        hidden_size=64, intermediate_size=128, num_hidden_layers=3, num_attention_heads=4,
        num_key_value_heads=2, vocab_size=VOCAB, max_position_embeddings=256))


def gpt2(seed=0):
    torch.manual_seed(seed)
    return tf.GPT2LMHeadModel(tf.GPT2Config(
        n_layer=3, n_embd=64, n_head=4, vocab_size=VOCAB, n_positions=256, resid_pdrop=0.0,
        embd_pdrop=0.0, attn_pdrop=0.0))


def padded():
    return _padded.padded(VOCAB)


def trained(model):
    return {n: p.grad.clone() for n, p in model.named_parameters() if p.grad is not None}


def assert_plain(model, reference, batch, plan, loss_fn=None, exact=False, given=None):
    """Step's loss and gradients under `plan` against one plain forward and backward (Step
    given `model`, or `given`, a wrapper of it)."""
    expected = reference(**batch).loss if loss_fn is None else loss_fn(reference, batch)
    expected = expected[0] if isinstance(expected, tuple) else expected
    expected.backward()
    with act.Step(model if given is None else given, plan=plan, **({} if loss_fn is None else {"loss_fn": loss_fn})) \
            as step:
        loss = step(batch)
    assert loss.item() == pytest.approx(expected.item(), rel=1e-6)
    got, want = trained(model), trained(reference)
    assert got.keys() == want.keys()
    for name in want:
        if exact:
            assert torch.equal(got[name], want[name]), name
        if torch.equal(got[name], want[name]):
            continue  # (zeros too: a CLS embedding a vision-language model drops)
        cosine = F.cosine_similarity(got[name].flatten().double(),
                                     want[name].flatten().double(), dim=0)
        assert cosine >= 0.99999, name


@pytest.mark.parametrize("plan", [EVERY, CHUNKED], ids=["recompute", "recompute, chunks"])
@pytest.mark.parametrize("make", [llama, gpt2], ids=["llama", "gpt2"])
def test_a_model_with_its_own_gradient_checkpointing(make, plan):
    """transformers' gradient checkpointing recomputes each layer in backward outside any
    step's context: a position-wise child run in chunks in forward and whole there saved
    another count of tensors (torch's CheckpointError in backward). Such a layer is left to
    the model: not checkpointed a second time, its children never chunked."""
    model = make()
    (getattr(model, "activation_checkpointing_enable", None) or
     model.gradient_checkpointing_enable)()  # (its name before transformers 5.x)
    model.train()
    assert_plain(model, copy.deepcopy(model), padded(), plan, exact=True)


class _SelfCheckpointed(torch.nn.Module):
    """Blocks whose MLP the model checkpoints itself, around the call (non-reentrant)."""

    class Block(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.norm = torch.nn.LayerNorm(32)
            self.mlp = torch.nn.Sequential(torch.nn.Linear(32, 96), torch.nn.GELU(),
                                           torch.nn.Linear(96, 32))

        def forward(self, x):
            return x + checkpoint(self.mlp, self.norm(x), use_reentrant=False)

    def __init__(self):
        super().__init__()
        self.blocks = torch.nn.ModuleList(self.Block() for _ in range(3))
        self.head = torch.nn.Linear(32, 8)

    def forward(self, x):
        for block in self.blocks:
            x = block(x)
        return self.head(x)


def test_a_model_that_checkpoints_its_own_layers():
    torch.manual_seed(0)
    model = _SelfCheckpointed()
    x, y = torch.randn(1, 256, 32), torch.randint(0, 8, (1, 256))

    def loss_fn(m, b):
        return F.cross_entropy(m(b[0]).flatten(0, 1), b[1].flatten())

    reference = copy.deepcopy(model)
    expected = loss_fn(reference, (x, y))
    expected.backward()
    with act.Step(model, plan=act.Plan(chunks=4), loss_fn=loss_fn) as step:
        loss = step((x, y))
    assert loss.item() == expected.item()
    for name, grad in trained(reference).items():
        assert torch.equal(dict(model.named_parameters())[name].grad, grad), name


@pytest.mark.parametrize("plan", [CHUNKED, act.Plan(micro_batches=2, chunks=2)],
                         ids=["recompute, chunks", "micro-batches, chunks"])
def test_gpt2s_mlp_in_chunks_at_a_batch_of_several_samples(plan):
    """A slice along the sequence of several samples is not contiguous, and GPT-2's Conv1D
    flattens its input with `view`: the check and the chunks failed with a RuntimeError."""
    model = gpt2()
    assert_plain(model, copy.deepcopy(model), padded(), plan)


def test_a_compiled_model_runs_as_its_eager_module():
    """torch.compile's module hid the model: no use_cache=False for it (a block recomputed
    under an attention mask saw its keys twice: a shape error in backward)."""
    model = llama()
    reference = copy.deepcopy(model)
    compiled = torch.compile(model)
    with pytest.warns(RuntimeWarning, match="eager module"):
        step = act.Step(compiled, plan=EVERY)
    assert step.model is model
    step.close()
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", RuntimeWarning)
        assert_plain(model, reference, padded(), EVERY, exact=True, given=compiled)


def test_a_loss_fn_on_padded_labels_is_warned_and_weighted_by_its_targets():
    """A loss_fn's plain loss is weighted by samples; on labels padded unevenly that is not
    the whole batch's gradient for a mean over targets: a warning says so, once, and
    (loss, act.count_targets(...)) gives the whole batch's gradient."""
    batch = padded()

    def plain(m, b):
        return m(**b).loss

    model = llama()
    with act.Step(model, plan=act.Plan(micro_batches=2), loss_fn=plain) as step:
        with pytest.warns(RuntimeWarning, match="count_targets"):
            step(batch)
        with warnings.catch_warnings():
            warnings.simplefilter("error")
            step(batch)  # once per Step
    assert act.count_targets(model, batch) == 2 + 39 + 16 + 39

    def weighted(m, b):
        return m(**b).loss, act.count_targets(m, b)

    model = llama()
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        assert_plain(model, copy.deepcopy(model), batch, act.Plan(micro_batches=2),
                     loss_fn=weighted)
    with pytest.raises(ValueError, match="labels"):
        act.count_targets(model, {"input_ids": batch["input_ids"]})


def mixtral(router_loss):
    torch.manual_seed(0)
    return tf.MixtralForCausalLM(tf.MixtralConfig(
        hidden_size=64, intermediate_size=128, num_hidden_layers=3, num_attention_heads=4,
        num_key_value_heads=2, vocab_size=VOCAB, max_position_embeddings=256,
        num_local_experts=4, num_experts_per_tok=2, output_router_logits=router_loss,
        router_aux_loss_coef=0.5))


def assert_never_split(model, batch, why):
    """A pinned plan of micro-batches is refused, naming `why`, before .grad is touched; a
    planned step keeps the batch whole."""
    with pytest.raises(ValueError, match=why):
        act.Step(model, plan=act.Plan(micro_batches=2))(batch)
    assert all(p.grad is None for p in model.parameters())
    with act.Step(model, limit="free") as step:
        step(batch)
        assert not step.profile.split and step.plan.micro_batches == 1


def clip(seed=0):
    torch.manual_seed(seed)
    return tf.CLIPModel(tf.CLIPConfig(
        text_config=dict(vocab_size=100, hidden_size=32, intermediate_size=64,
                         num_hidden_layers=1, num_attention_heads=2, max_position_embeddings=16),
        vision_config=dict(hidden_size=32, intermediate_size=64, num_hidden_layers=1,
                           num_attention_heads=2, image_size=32, patch_size=8),
        projection_dim=16))


def test_a_contrastive_loss_is_never_split_into_micro_batches():
    """CLIP's loss contrasts every text with every image of the batch: two micro-batches
    each saw half the negatives (cosine 0.974 to the batch's gradient, silently). Such a
    model gets no micro-batches; recomputing its blocks stays exact."""
    g = torch.Generator().manual_seed(1)
    batch = {"input_ids": torch.randint(0, 100, (4, 8), generator=g),
             "pixel_values": torch.randn(4, 3, 32, 32, generator=g), "return_loss": True}
    assert_never_split(clip(), batch, "contrastive")
    model = clip()
    assert_plain(model, copy.deepcopy(model), batch, act.Plan(recompute=(0,)))


def assert_whole_batch(make, batch, plan):
    """Step's loss and gradient under `plan` against one plain forward and backward of
    `make()`'s model: the loss, the whole gradient's direction and size, and each
    parameter's gradient that is not numerically zero (attention's key biases, a random
    init's unused norms: a gradient of zero, rounding left)."""
    reference = make()
    expected = reference(**batch).loss
    expected.backward()
    model = make()
    with act.Step(model, plan=plan) as step:
        assert step(batch).item() == pytest.approx(expected.item(), rel=1e-6)
    got, want = trained(model), trained(reference)
    whole = [torch.cat([g[n].flatten() for n in want]).double() for g in (got, want)]
    assert F.cosine_similarity(*whole, dim=0) >= 0.99999
    assert whole[0].norm() / whole[1].norm() == pytest.approx(1.0, rel=1e-4)
    for name in want:
        if want[name].norm() > 1e-5 * whole[1].norm():
            assert F.cosine_similarity(got[name].flatten().double(),
                                       want[name].flatten().double(), dim=0) >= 0.99999, name


@pytest.mark.parametrize("reduction", ["sum", "mean"])
def test_a_ctc_models_loss_adds_up_over_micro_batches(reduction):
    """A CTC model's labels are targets padded with -100, but its loss is a sum over samples
    (or a mean of each sample's loss over its target length): weighed by their targets as a
    mean over them, four micro-batches gave a quarter of the gradient (sum) or cosine 0.95
    (mean). Its sums add; its means weigh by samples."""
    def wav2vec2():
        torch.manual_seed(0)
        return tf.Wav2Vec2ForCTC(tf.Wav2Vec2Config(
            vocab_size=32, hidden_size=32, num_hidden_layers=2, num_attention_heads=2,
            intermediate_size=64, conv_dim=(16, 16), conv_stride=(5, 2), conv_kernel=(10, 3),
            num_conv_pos_embeddings=16, num_conv_pos_embedding_groups=2,
            ctc_loss_reduction=reduction, hidden_dropout=0.0, attention_dropout=0.0,
            activation_dropout=0.0, feat_proj_dropout=0.0, final_dropout=0.0, layerdrop=0.0,
            mask_time_prob=0.0,
            pad_token_id=0))

    g = torch.Generator().manual_seed(1)
    labels = torch.randint(1, 32, (4, 20), generator=g)
    labels[1, 12:] = -100
    labels[3, 5:] = -100
    batch = {"input_values": torch.randn(4, 4000, generator=g), "labels": labels}
    assert_whole_batch(wav2vec2, batch, act.Plan(micro_batches=4))


def test_a_segmentation_models_ignored_pixels_weigh_nothing():
    """SegFormer's loss skips pixels labelled 255 (its config's semantic_loss_ignore_index),
    not -100: counted as targets, samples with unlabelled regions weighed as much as fully
    labelled ones (four micro-batches: cosine 0.82 to the batch's gradient)."""
    def segformer():
        torch.manual_seed(0)
        return tf.SegformerForSemanticSegmentation(tf.SegformerConfig(
            num_encoder_blocks=2, depths=[1, 1], sr_ratios=[2, 1], hidden_sizes=[16, 32],
            patch_sizes=[7, 3], strides=[4, 2], num_attention_heads=[1, 2], mlp_ratios=[2, 2],
            decoder_hidden_size=32, num_labels=5, hidden_dropout_prob=0.0,
            attention_probs_dropout_prob=0.0, classifier_dropout_prob=0.0,
            drop_path_rate=0.0)).eval()  # (batch norm: micro-batches in eval mode only)

    g = torch.Generator().manual_seed(1)
    labels = torch.randint(0, 5, (4, 64, 64), generator=g)
    labels[1, :48] = 255
    labels[3, :, :16] = 255
    batch = {"pixel_values": torch.randn(4, 3, 64, 64, generator=g), "labels": labels}
    assert_whole_batch(segformer, batch, act.Plan(micro_batches=4))


def test_a_loss_of_two_means_over_other_counts_is_not_split():
    """BERT's pretraining loss adds the masked LM's mean over its labelled tokens to the next
    sentence's mean over samples: with samples of different numbers of labelled tokens, no
    share of each micro-batch gives both (four micro-batches: cosine 0.998, the loss 4e-4
    off, silently). Such a batch gets no micro-batches; with as many targets in every
    sample, both means weigh alike and micro-batches add up."""
    def bert():
        torch.manual_seed(0)
        return tf.BertForPreTraining(tf.BertConfig(
            vocab_size=100, hidden_size=32, num_hidden_layers=2, num_attention_heads=2,
            intermediate_size=64, hidden_dropout_prob=0.0, attention_probs_dropout_prob=0.0))

    g = torch.Generator().manual_seed(1)
    ids = torch.randint(5, 100, (4, 32), generator=g)
    labels = torch.full_like(ids, -100)
    for row, labelled in enumerate([2, 10, 4, 12]):
        labels[row, :labelled] = ids[row, :labelled]
    batch = {"input_ids": ids, "labels": labels, "next_sentence_label": torch.tensor([0, 1, 1, 0])}
    assert_never_split(bert(), batch, "next_sentence_label")
    batch["labels"] = torch.where(torch.arange(32) < 6, ids, -100)  # six in every sample
    assert_whole_batch(bert, batch, act.Plan(micro_batches=4))


def test_a_loss_over_the_attended_tokens_weighs_them():
    """ELECTRA's discriminator takes its loss over the tokens its attention mask keeps; its
    labels (replaced or not) are never -100: counted as targets, padded samples weighed as
    much as full ones (four micro-batches: cosine 0.964 to the batch's gradient)."""
    def electra():
        torch.manual_seed(0)
        return tf.ElectraForPreTraining(tf.ElectraConfig(
            vocab_size=100, embedding_size=16, hidden_size=32, num_hidden_layers=2,
            num_attention_heads=2, intermediate_size=64, hidden_dropout_prob=0.0,
            attention_probs_dropout_prob=0.0))

    g = torch.Generator().manual_seed(1)
    ids = torch.randint(5, 100, (4, 32), generator=g)
    mask = torch.ones_like(ids)
    mask[1, 8:] = 0
    mask[3, 20:] = 0
    batch = {"input_ids": ids, "attention_mask": mask,
             "labels": torch.randint(0, 2, (4, 32), generator=g)}
    assert_whole_batch(electra, batch, act.Plan(micro_batches=4))


def test_a_masked_image_models_loss_weighs_micro_batches_by_their_masked_patches():
    """SimMIM's loss (ViT's masked image modeling head, no labels) averages the
    reconstruction over the patches `bool_masked_pos` masks: weighed by samples, two
    micro-batches of unevenly masked images gave cosine 0.992 to the batch's gradient."""
    def simmim():
        torch.manual_seed(0)
        return tf.ViTForMaskedImageModeling(tf.ViTConfig(
            hidden_size=32, num_hidden_layers=2, num_attention_heads=2, intermediate_size=64,
            image_size=32, patch_size=8, encoder_stride=8, hidden_dropout_prob=0.0,
            attention_probs_dropout_prob=0.0))

    masked = torch.zeros(4, 16, dtype=torch.bool)
    for row, patches in enumerate([2, 10, 4, 12]):
        masked[row, :patches] = True
    batch = {"pixel_values": torch.randn(4, 3, 32, 32, generator=torch.Generator().manual_seed(1)),
             "bool_masked_pos": masked}
    assert_whole_batch(simmim, batch, act.Plan(micro_batches=2))


def assert_bit_identical(make, batch):
    """Step without a limit gives one plain forward and backward's loss and gradients, bit
    for bit."""
    model, reference = make(), make()
    expected = reference(**batch).loss
    expected.backward()
    with act.Step(model) as step:
        assert torch.equal(step(batch), expected.detach())
    for p, q in zip(model.parameters(), reference.parameters()):
        assert (p.grad is None) == (q.grad is None)
        assert p.grad is None or torch.equal(p.grad, q.grad)


def test_a_question_answering_loss_weighs_the_samples_whose_answer_it_keeps():
    """transformers' question answering loss ignores start and end positions beyond the
    input (a span cut off by truncation): each a mean over the samples that keep theirs.
    Weighed by samples, two micro-batches gave cosine 0.93 to the batch's gradient. Samples
    that keep their start and not their end mix two counts: such a batch is never split."""
    def bert():
        torch.manual_seed(0)
        return tf.BertForQuestionAnswering(tf.BertConfig(
            vocab_size=100, hidden_size=32, num_hidden_layers=1, num_attention_heads=2,
            intermediate_size=64, hidden_dropout_prob=0.0, attention_probs_dropout_prob=0.0))

    ids = torch.randint(5, 100, (4, 16), generator=torch.Generator().manual_seed(1))
    batch = {"input_ids": ids, "start_positions": torch.tensor([1, 40, 3, 4]),
             "end_positions": torch.tensor([2, 40, 5, 6])}
    assert_whole_batch(bert, batch, act.Plan(micro_batches=2))
    batch["end_positions"] = torch.tensor([2, 7, 5, 16])  # the last keeps its start only
    assert_never_split(bert(), batch, "start positions and end positions")


def imagegpt():
    torch.manual_seed(0)
    return tf.ImageGPTForCausalImageModeling(tf.ImageGPTConfig(
        vocab_size=101, n_positions=16, n_embd=32, n_layer=1, n_head=2, resid_pdrop=0.0,
        embd_pdrop=0.0, attn_pdrop=0.0))


def blip():
    torch.manual_seed(0)
    return tf.BlipForConditionalGeneration(tf.BlipConfig(
        text_config=dict(vocab_size=101, hidden_size=32, num_hidden_layers=1,
                         num_attention_heads=2, intermediate_size=64, hidden_dropout_prob=0.0,
                         attention_probs_dropout_prob=0.0),
        vision_config=dict(hidden_size=32, num_hidden_layers=1, num_attention_heads=2,
                           intermediate_size=64, image_size=32, patch_size=8),
        projection_dim=32))


@pytest.mark.parametrize("make", [imagegpt, blip], ids=["imagegpt", "blip"])
def test_a_causal_loss_a_model_shifts_itself_weighs_the_shifted_labels(make):
    """ImageGPT computes its own causal loss (`labels[..., 1:]`, not transformers'
    loss_function), BLIP's captioning hands its labels to a text decoder that does: their
    labels were counted unshifted, one target too many per sample, and two micro-batches of
    unevenly padded rows gave cosine 0.9996 (ImageGPT) and a gradient 4e-4 too long (BLIP)."""
    g = torch.Generator().manual_seed(1)
    ids = torch.randint(5, 100, (4, 16), generator=g)
    labels = ids.masked_fill(torch.arange(16) >= torch.tensor([[3], [16], [5], [8]]), -100)
    batch = {"input_ids": ids, "labels": labels}
    if make is blip:
        batch["pixel_values"] = torch.randn(4, 3, 32, 32, generator=g)
    assert_whole_batch(make, batch, act.Plan(micro_batches=2))


def yolos():
    torch.manual_seed(0)
    return tf.YolosForObjectDetection(tf.YolosConfig(
        hidden_size=32, num_hidden_layers=2, num_attention_heads=2, intermediate_size=64,
        image_size=[32, 32], patch_size=8, num_detection_tokens=5, num_labels=3,
        hidden_dropout_prob=0.0, attention_probs_dropout_prob=0.0))


def test_a_detection_models_targets_per_sample_are_cut_with_its_samples_and_never_split():
    """A DETR-style model (YOLOS here) takes `labels` as a list of one dict of boxes per
    image, matches each image's queries to them, then divides by the boxes of the whole
    batch: the list was passed whole to micro-batches and probes of fewer images (an
    IndexError in the matcher), and micro-batches weighed by images would not add up. The
    list is cut with the samples (the probes'), and the batch is never split."""
    g = torch.Generator().manual_seed(1)
    labels = [{"class_labels": torch.randint(0, 3, (boxes,), generator=g),
               "boxes": torch.rand(boxes, 4, generator=g) * 0.5 + 0.25} for boxes in [1, 3, 1, 2]]
    batch = {"pixel_values": torch.randn(4, 3, 32, 32, generator=g), "labels": labels}
    assert_never_split(yolos(), batch, "list of targets per sample")
    assert_bit_identical(yolos, batch)
    assert micro_batches.take(batch, 4, 1, 3)["labels"] == labels[1:3]


def test_labels_that_are_not_one_row_per_sample_are_refused_under_a_limit():
    """BEiT's masked image modeling takes the labels of the masked patches alone, one row for
    the whole batch: no micro-batch and no probe of fewer samples can cut them (the probes
    failed deep in the loss). Under a limit that is a ValueError naming them, before .grad
    is touched; one micro-batch without a limit runs."""
    def beit():
        torch.manual_seed(0)
        return tf.BeitForMaskedImageModeling(tf.BeitConfig(
            vocab_size=50, hidden_size=32, num_hidden_layers=2, num_attention_heads=2,
            intermediate_size=64, image_size=32, patch_size=8, use_mask_token=True,
            drop_path_rate=0.0, hidden_dropout_prob=0.0, attention_probs_dropout_prob=0.0))

    g = torch.Generator().manual_seed(1)
    masked = torch.zeros(4, 16, dtype=torch.bool)
    for row, patches in enumerate([2, 10, 4, 12]):
        masked[row, :patches] = True
    batch = {"pixel_values": torch.randn(4, 3, 32, 32, generator=g), "bool_masked_pos": masked,
             "labels": torch.randint(0, 50, (int(masked.sum()),), generator=g)}
    model = beit()
    with pytest.raises(ValueError, match=r"labels \(shape \(28,\)\) are not one row per sample"):
        act.Step(model, limit="free")(batch)
    with pytest.raises(ValueError, match="not one row per sample"):
        act.Step(model, plan=act.Plan(micro_batches=2))(batch)
    assert all(p.grad is None for p in model.parameters())
    assert_bit_identical(beit, batch)


def test_wav2vec2_pretraining_is_never_split():
    """wav2vec 2.0's pretraining batch holds `sampled_negative_indices` into the frames of
    the whole batch (the second of two micro-batches indexed past its own: an IndexError),
    and its loss takes the codevectors' perplexity over the batch."""
    from transformers.models.wav2vec2.modeling_wav2vec2 import (
        _compute_mask_indices, _sample_negative_indices)

    def wav2vec2():
        torch.manual_seed(0)
        return tf.Wav2Vec2ForPreTraining(tf.Wav2Vec2Config(
            hidden_size=32, num_hidden_layers=2, num_attention_heads=2, intermediate_size=64,
            conv_dim=(16, 16), conv_stride=(5, 4), conv_kernel=(10, 8),
            num_conv_pos_embeddings=16, num_conv_pos_embedding_groups=2,
            codevector_dim=16, proj_codevector_dim=16, num_codevectors_per_group=8,
            num_codevector_groups=2, num_negatives=4, mask_time_prob=0.05, hidden_dropout=0.0,
            attention_dropout=0.0, activation_dropout=0.0, feat_proj_dropout=0.0,
            layerdrop=0.0))

    model = wav2vec2()
    frames = int(model._get_feat_extract_output_lengths(4000))
    numpy.random.seed(0)  # transformers' mask and negatives sampling draws from NumPy's
    masked = _compute_mask_indices((4, frames), mask_prob=0.3, mask_length=2)
    negatives = _sample_negative_indices((4, frames), 4, mask_time_indices=masked)
    batch = {"input_values": torch.randn(4, 4000, generator=torch.Generator().manual_seed(1)),
             "mask_time_indices": torch.tensor(masked),
             "sampled_negative_indices": torch.tensor(negatives)}
    assert_never_split(model, batch, "sampled_negative_indices")


def test_a_router_load_balancing_loss_is_never_split_into_micro_batches():
    """A mixture of experts' load-balancing loss is a statistic over the whole batch: taken
    per micro-batch, two micro-batches moved the loss by 1.3e-4 of itself and the router's
    gradients to cosine 0.57. Such a model gets no micro-batches (a pinned plan of several
    is a ValueError, as with batch norm); without the router loss they add up."""
    assert_never_split(mixtral(router_loss=True), padded(), "load-balancing")
    # asked for by the batch rather than the config
    assert_never_split(mixtral(router_loss=False), {**padded(), "output_router_logits": True},
                       "load-balancing")
    model = mixtral(router_loss=True)
    assert_plain(model, copy.deepcopy(model), padded(), EVERY, exact=True)
    # under a limit, with the chunked loss, the router's loss is there too
    model, plain = mixtral(router_loss=True), mixtral(router_loss=True)
    plain(**padded()).loss.backward()
    with warnings.catch_warnings():
        warnings.simplefilter("error", RuntimeWarning)  # the chunked loss, not the model's
        with act.Step(model, limit="free") as step:
            step(padded())
    for (name, p), q in zip(model.named_parameters(), plain.parameters()):
        assert F.cosine_similarity(p.grad.flatten().double(), q.grad.flatten().double(),
                                   dim=0) >= 0.99999, name
    model = mixtral(router_loss=False)
    assert_plain(model, copy.deepcopy(model), padded(), act.Plan(micro_batches=2))


def assert_same_gradients(model, plain):
    """The same parameters got gradients, each equal or at cosine >= 0.99999."""
    got, want = trained(model), trained(plain)
    assert got.keys() == want.keys()
    for name, g in got.items():
        assert torch.equal(g, want[name]) or F.cosine_similarity(
            g.flatten().double(), want[name].flatten().double(), dim=0) >= 0.99999, name


def llava(seed=0):
    torch.manual_seed(seed)
    return tf.LlavaForConditionalGeneration(tf.LlavaConfig(
        vision_config=tf.CLIPVisionConfig(hidden_size=32, intermediate_size=64,
                                          num_hidden_layers=1, num_attention_heads=2,
                                          image_size=32, patch_size=8),
        text_config=tf.LlamaConfig(hidden_size=64, intermediate_size=128, num_hidden_layers=2,
                                   num_attention_heads=4, num_key_value_heads=2,
                                   vocab_size=VOCAB, max_position_embeddings=256),
        image_token_index=VOCAB - 1))


def image_batch(samples=4, tokens=40):
    """Each row: a token, the image's 16 patch tokens, text; every other row padded."""
    g = torch.Generator().manual_seed(1)
    ids = torch.randint(1, VOCAB - 1, (samples, tokens), generator=g)
    ids[:, 1:17] = VOCAB - 1
    mask = torch.ones(samples, tokens, dtype=torch.long)
    mask[1::2, tokens - 8:] = 0
    labels = ids.masked_fill(mask == 0, -100).masked_fill(ids == VOCAB - 1, -100)
    return {"input_ids": ids, "attention_mask": mask, "labels": labels,
            "pixel_values": torch.randn(samples, 3, 32, 32, generator=g)}


@pytest.mark.parametrize("plan", [act.Plan(recompute=(0, 1)), act.Plan(micro_batches=2)],
                         ids=["recompute", "micro-batches"])
def test_a_vision_language_model_gives_plain_gradients(plan):
    """LLaVA's forward passes use_cache on in its keywords: Step did not turn the cache off,
    and a recomputed language-model layer appended its keys to it a second time (a
    RuntimeError in backward)."""
    model = llava()
    assert_plain(model, copy.deepcopy(model), image_batch(), plan)


def test_a_vision_language_models_loss_runs_in_chunks_under_a_limit():
    """The chunked loss's check cut the tokens of the first row short of its image (the model
    refused the prefix): every vision-language model fell back to its own loss, the logits of
    every token at once; the check's prefix now goes past the image."""
    model, plain = llava(), llava()
    plain(**image_batch()).loss.backward()
    with warnings.catch_warnings():
        warnings.simplefilter("error", RuntimeWarning)
        with act.Step(model, limit="free") as step:
            step(image_batch())
    assert_same_gradients(model, plain)


def qwen2_vl(seed=0):
    torch.manual_seed(seed)
    return tf.Qwen2VLForConditionalGeneration(tf.Qwen2VLConfig(
        vision_config=dict(depth=1, embed_dim=32, hidden_size=64, num_heads=2, patch_size=4,
                           spatial_merge_size=2, temporal_patch_size=2, in_chans=3),
        text_config=dict(hidden_size=64, intermediate_size=128, num_hidden_layers=2,
                         num_attention_heads=4, num_key_value_heads=2, vocab_size=VOCAB,
                         rope_scaling={"type": "mrope", "mrope_section": [2, 3, 3]}),
        image_token_id=VOCAB - 1, vision_start_token_id=VOCAB - 3,
        vision_end_token_id=VOCAB - 2))


def patches_batch():
    """Four samples of 1, 2, 0 and 1 images of three sizes, as Qwen2-VL's processor gives
    them: every image's patches in one tensor, a grid row per image, each image a run of
    image tokens (its patches over 4, merged 2 x 2) between its start and end tokens."""
    g = torch.Generator().manual_seed(1)
    grids = [[(1, 4, 4)], [(1, 4, 4), (1, 4, 8)], [], [(1, 8, 4)]]
    ids = torch.randint(1, VOCAB - 3, (4, 40), generator=g)
    for row, images in enumerate(grids):
        at = 2
        for t, h, w in images:
            n = t * h * w // 4
            ids[row, at], ids[row, at + 1:at + 1 + n], ids[row, at + 1 + n] = \
                VOCAB - 3, VOCAB - 1, VOCAB - 2
            at += n + 3
    mask = torch.ones_like(ids)
    mask[2, 30:] = 0
    thw = torch.tensor([grid for images in grids for grid in images])
    return {"input_ids": ids, "attention_mask": mask, "mm_token_type_ids": (ids == VOCAB - 1).long(),
            "labels": ids.masked_fill(mask == 0, -100).masked_fill(ids >= VOCAB - 3, -100),
            "image_grid_thw": thw,
            "pixel_values": torch.randn(int(thw.prod(-1).sum()), 3 * 2 * 4 * 4, generator=g)}


def test_images_as_rows_of_patches_are_cut_with_their_samples():
    batch = patches_batch()
    rows = batch["image_grid_thw"].prod(-1).tolist()  # 16, 16, 32, 32 patches
    second = micro_batches.take(batch, 4, 1, 3)  # samples 1 and 2: images 1 and 2
    assert torch.equal(second["image_grid_thw"], batch["image_grid_thw"][1:3])
    assert torch.equal(second["pixel_values"],
                       batch["pixel_values"][rows[0]:rows[0] + rows[1] + rows[2]])
    assert torch.equal(second["input_ids"], batch["input_ids"][1:3])
    empty = micro_batches.take(batch, 4, 2, 3)  # no image: none, as for text alone
    assert empty["image_grid_thw"] is None and empty["pixel_values"] is None
    batch["image_grid_thw"] = batch["image_grid_thw"][:3]
    with pytest.raises(ValueError, match="not one row per image"):
        micro_batches.take(batch, 4, 0, 2)


@pytest.mark.parametrize("plan", [act.Plan(micro_batches=2), act.Plan(micro_batches=4)],
                         ids=["2", "4"])
def test_a_model_of_images_as_rows_of_patches_gives_plain_gradients(plan):
    """Qwen2-VL's pixel_values are rows of patches of every image, not a row per sample: each
    micro-batch and probe got them all (a RuntimeError deep in the model, under any limit);
    now each sample's images go with it."""
    model = qwen2_vl()
    assert_plain(model, copy.deepcopy(model), patches_batch(), plan)


def test_a_model_of_images_as_rows_of_patches_steps_under_a_limit_with_its_loss_in_chunks():
    model, plain = qwen2_vl(), qwen2_vl()
    plain(**patches_batch()).loss.backward()
    with warnings.catch_warnings():
        warnings.simplefilter("error", RuntimeWarning)  # the chunked loss, not the model's
        with act.Step(model, limit="free") as step:
            step(patches_batch())
    assert_same_gradients(model, plain)


def test_one_sample_with_its_images_as_rows_of_patches_steps_under_a_limit():
    """One sample is planned along its tokens where it is a sequence: the image's grid, a 2-D
    integer tensor of one row, read as a sequence of 3 tokens, was cut with them in the probes
    (a ValueError deep in the model). Such a batch is planned by samples."""
    batch = patches_batch()
    one = {k: v[:1] for k, v in batch.items()}
    one["pixel_values"] = batch["pixel_values"][:16]  # the first sample's one image
    ids = torch.randint(1, VOCAB - 3, (1, 200), generator=torch.Generator().manual_seed(2))
    ids[0, :40] = batch["input_ids"][0]
    one.update(input_ids=ids, attention_mask=torch.ones_like(ids),
               mm_token_type_ids=(ids == VOCAB - 1).long(),
               labels=ids.masked_fill(ids >= VOCAB - 3, -100))
    model, plain = qwen2_vl(), qwen2_vl()
    plain(**one).loss.backward()
    with act.Step(model, limit="free") as step:
        step(one)
    assert_same_gradients(model, plain)
