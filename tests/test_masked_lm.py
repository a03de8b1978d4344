"""masked_lm_loss: a masked LM's loss with the head's projection and loss on its labelled
tokens, in chunks: the loss and gradients of `model(**batch).loss` (dropout on: the same
random draws), the logits it never makes, what it refuses, and Step running it under a
limit. Tiny transformers models built from configs (random init, nothing downloaded)."""
import pytest
import torch
import torch.nn.functional as F

import _autocast
import actcodec.torch as act
from actcodec.torch.limit import loss_weights, masked_lm

tf = pytest.importorskip("transformers")
tf.logging.set_verbosity_error()

VOCAB = 500
COMMON = dict(vocab_size=VOCAB, hidden_size=32, num_hidden_layers=2, num_attention_heads=2,
              intermediate_size=64, max_position_embeddings=512)
MODELS = {  # each family's own head: a transform, then the output embeddings (tied or not)
    "bert": lambda: tf.BertForMaskedLM(tf.BertConfig(**COMMON)),
    "roberta": lambda: tf.RobertaForMaskedLM(tf.RobertaConfig(**COMMON, pad_token_id=1)),
    "albert": lambda: tf.AlbertForMaskedLM(tf.AlbertConfig(**COMMON, embedding_size=16)),
    "distilbert": lambda: tf.DistilBertForMaskedLM(tf.DistilBertConfig(
        vocab_size=VOCAB, dim=32, n_layers=2, n_heads=2, hidden_dim=64)),
    "modernbert": lambda: tf.ModernBertForMaskedLM(tf.ModernBertConfig(
        **COMMON, pad_token_id=0, bos_token_id=1, eos_token_id=2, cls_token_id=1,
        sep_token_id=2)),
    "deberta_v2": lambda: tf.DebertaV2ForMaskedLM(tf.DebertaV2Config(**COMMON)),
}


def build(name):
    torch.manual_seed(0)
    return MODELS[name]().train()  # dropout on


def batch(rows=2, tokens=96, share=0.15):
    """Token ids with `share` of them labelled (-100 elsewhere), the second row padded."""
    g = torch.Generator().manual_seed(1)
    ids = torch.randint(5, VOCAB, (rows, tokens), generator=g)
    labels = torch.full_like(ids, -100)
    picked = torch.rand(rows, tokens, generator=g) < share
    labels[picked] = ids[picked]
    mask = torch.ones_like(ids)
    if rows > 1:
        mask[1, tokens * 3 // 4:] = 0
        labels[1, tokens * 3 // 4:] = -100
    return {"input_ids": ids, "attention_mask": mask, "labels": labels}


def grads(model):
    return torch.cat([p.grad.flatten() for p in model.parameters() if p.grad is not None])


def model_and_ours(name, b, **kwargs):
    want = build(name)
    torch.manual_seed(5)
    loss = want(**b).loss
    loss.backward()
    model = build(name)
    torch.manual_seed(5)
    ours = masked_lm.masked_lm_loss(model, b, **kwargs)
    ours.backward()
    return loss, ours, grads(want), grads(model)


@pytest.mark.parametrize("name", MODELS)
def test_the_models_loss_and_gradients_on_the_labelled_tokens_in_chunks(name):
    b = batch()
    loss, ours, w, g = model_and_ours(name, b, chunk_tokens=5)
    assert torch.allclose(ours, loss, rtol=1e-5, atol=1e-6)
    assert g.shape == w.shape
    assert F.cosine_similarity(g.double(), w.double(), dim=0) >= 0.99999
    assert (g - w).norm() / w.norm() < 1e-5


@pytest.mark.parametrize("name", ["bert", "modernbert"])
def test_num_items_in_batch_divides_where_the_models_own_loss_does(name):
    """ModernBERT's loss (transformers' ForMaskedLMLoss) divides by it; BERT's, a mean of
    its own, does not."""
    b = {**batch(), "num_items_in_batch": 40}
    loss, ours, w, g = model_and_ours(name, b)
    assert torch.allclose(ours, loss, rtol=1e-5, atol=1e-6)
    assert (g - w).norm() / w.norm() < 1e-5
    labelled = int((b["labels"] != -100).sum())
    assert loss_weights.divides_by_items(build(name)) == (name == "modernbert")
    mean = model_and_ours(name, batch())[0]
    assert torch.allclose(loss * (40 / labelled if name == "modernbert" else 1), mean,
                          rtol=1e-5)


def test_the_logits_are_never_made():
    """The output embeddings never run: their input is taken and the forward stops there."""
    model = build("bert")
    runs = []
    model.get_output_embeddings().register_forward_hook(lambda m, a, out: runs.append(out))
    loss = masked_lm.masked_lm_loss(model, batch(), checked=True)
    loss.backward()
    assert runs == [] and torch.isfinite(loss)


def test_what_is_not_covered_is_said():
    causal = tf.GPT2LMHeadModel(tf.GPT2Config(n_embd=32, n_layer=1, n_head=2, vocab_size=VOCAB))
    classifier = tf.BertForSequenceClassification(tf.BertConfig(**COMMON))
    for model in (causal, classifier, torch.nn.Linear(4, 4)):
        assert not masked_lm.covers(model)
        with pytest.raises(ValueError, match="masked_lm_loss: .* not"):
            masked_lm.masked_lm_loss(model, batch(), checked=True)
    doubled = build("bert")  # a head that does more after the output embeddings
    doubled.get_output_embeddings().register_forward_hook(lambda m, a, out: 2 * out)
    assert masked_lm.covers(doubled)
    with pytest.raises(ValueError, match="logits are not its output embeddings"):
        masked_lm.check(doubled, batch())
    with pytest.raises(ValueError, match="no 'labels'"):
        masked_lm.masked_lm_loss(build("bert"), {"input_ids": batch()["input_ids"]})
    # DeBERTa-v2's head without legacy projects on the input embeddings; its
    # get_output_embeddings() is the head's 32-wide transform: named as such, not as labels
    # outside a vocabulary of 32
    unlegacy = tf.DebertaV2ForMaskedLM(tf.DebertaV2Config(**COMMON, legacy=False))
    with pytest.raises(ValueError, match=r"logits have shape \(1, \d+, 500\), not \(1, \d+, 32\)"):
        masked_lm.check(unlegacy, batch())


def test_a_head_that_adds_a_parameter_after_its_output_embeddings_is_refused():
    """ESM's head adds a bias of its own after its output embeddings: zero as initialised,
    so logits and loss agree, but this path would never give it a gradient."""
    torch.manual_seed(0)
    esm = tf.EsmForMaskedLM(tf.EsmConfig(vocab_size=33, hidden_size=32, num_hidden_layers=1,
                                         num_attention_heads=2, intermediate_size=64,
                                         pad_token_id=1, mask_token_id=32,
                                         position_embedding_type="absolute",
                                         max_position_embeddings=128))
    g = torch.Generator().manual_seed(1)
    ids = torch.randint(4, 30, (1, 16), generator=g)
    with pytest.raises(ValueError, match=r"reaches \['bias'\] of its head"):
        masked_lm.check(esm, {"input_ids": ids, "labels": ids})


def test_a_batch_of_inputs_embeds_is_checked_on_its_prefix_too():
    model = build("bert").eval()
    b = batch()
    embeds = model.get_input_embeddings()(b["input_ids"]).detach()
    b = {"inputs_embeds": embeds, "attention_mask": b["attention_mask"], "labels": b["labels"]}
    masked_lm.check(model, b)
    loss = model(**b).loss
    assert torch.allclose(masked_lm.masked_lm_loss(model, b, checked=True), loss, rtol=1e-5)


def test_step_runs_it_under_a_limit_for_one_long_sample(monkeypatch):
    """At batch 1 (512 tokens) under a limit, Step's probes and step run the masked LM's
    loss, and the gradient is plain training's; without a limit, or with chunk_loss off, the
    model's own loss."""
    calls, real = [], masked_lm.masked_lm_loss

    def counting(model, b, **kwargs):
        calls.append(b["labels"].shape[1])
        return real(model, b, **kwargs)

    monkeypatch.setattr(masked_lm, "masked_lm_loss", counting)
    b = batch(rows=1, tokens=512)
    want = build("bert").eval()
    want(**b).loss.backward()
    model = build("bert").eval()
    with act.Step(model, limit="64GiB", exact=True) as step:
        step(b)
        assert step.profile.unit == "token"
    assert calls and calls[-1] == 512 and min(calls) < 512, calls
    g, w = grads(model), grads(want)
    assert F.cosine_similarity(g.double(), w.double(), dim=0) >= 0.99999
    calls.clear()
    for kwargs in ({"limit": None}, {"limit": "64GiB", "chunk_loss": False}):
        with act.Step(build("bert").eval(), exact=True, **kwargs) as step:
            step(b)
    assert not calls


def test_step_runs_the_models_own_loss_where_the_path_differs():
    def doubled():
        model = build("bert").eval()
        model.get_output_embeddings().register_forward_hook(lambda m, a, out: 2 * out)
        return model

    b = batch(rows=1, tokens=128)
    want = doubled()
    want(**b).loss.backward()
    model = doubled()
    with act.Step(model, limit="64GiB", exact=True) as step:
        with pytest.warns(RuntimeWarning, match="does not cover BertForMaskedLM"):
            step(b)
    assert torch.equal(grads(model), grads(want))


def test_a_later_batch_with_a_key_the_models_loss_reads_is_checked_again():
    """The path is checked once per set of batch keys: a key the model's own loss reads,
    absent from the first batch, makes the two differ (here a weight on the loss); that
    batch runs the model's loss, with a warning, and its gradient is plain training's."""

    class WeightedBertForMaskedLM(tf.BertForMaskedLM):
        def forward(self, weight=None, **kwargs):
            out = super().forward(**kwargs)
            if weight is not None:
                out.loss = out.loss * weight
            return out

    def make():
        torch.manual_seed(0)
        return WeightedBertForMaskedLM(tf.BertConfig(**COMMON)).eval()

    first, second = batch(rows=1, tokens=128), {**batch(rows=1, tokens=128), "weight": 3.0}
    want = make()
    want(**first).loss.backward()
    want(**second).loss.backward()
    model = make()
    with act.Step(model, limit="64GiB", exact=True) as step:
        step(first)
        with pytest.warns(RuntimeWarning, match="does not cover WeightedBertForMaskedLM"):
            step(second)
    g, w = grads(model), grads(want)
    assert F.cosine_similarity(g.double(), w.double(), dim=0) >= 0.99999
    assert torch.allclose(g.norm(), w.norm(), rtol=1e-4)


@pytest.mark.parametrize("wrapped", [False, True], ids=["autocast", "forward-in-autocast"])
@pytest.mark.parametrize("name", ["bert", "roberta"])
def test_under_autocast_the_chunked_loss_covers_it_and_gives_autocasts_gradient(name, wrapped):
    """Under torch.autocast a masked LM's head transform gives bfloat16 hidden states to
    float32 output embeddings: the chunked loss refused the mixed dtypes and Step fell back
    to the model's own loss (with a warning). It takes the head's product in autocast's
    dtype, as the model's Linear does, also where the forward enters autocast itself
    (accelerate's mixed precision, the Trainer's bf16=True, wraps it so)."""
    _autocast.assert_chunked_like_autocast(build(name).eval(), build(name).eval(), batch(),
                                           wrapped)
