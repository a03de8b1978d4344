"""seq2seq_lm_loss: an encoder-decoder LM's loss with the head and loss in chunks, the loss and
gradients of `model(**batch).loss` (dropout on: the same random draws), what it refuses, and
Step running it under a limit. Tiny transformers models built from configs (random init,
nothing downloaded)."""
import pytest
import torch
import torch.nn.functional as F

import _autocast
import actcodec.torch as act
from actcodec.torch.limit import seq2seq_lm

tf = pytest.importorskip("transformers")
tf.logging.set_verbosity_error()

VOCAB = 512
SMALL = dict(encoder_layers=2, decoder_layers=2, encoder_attention_heads=2,
             decoder_attention_heads=2, d_model=32, encoder_ffn_dim=64, decoder_ffn_dim=64,
             vocab_size=VOCAB, max_position_embeddings=256, pad_token_id=0,
             decoder_start_token_id=0)


def t5(dropout=0.1):  # tied head: the decoder's output scaled by d_model ** -0.5
    torch.manual_seed(0)
    return tf.T5ForConditionalGeneration(tf.T5Config(
        d_model=32, d_ff=64, d_kv=16, num_heads=2, num_layers=2, num_decoder_layers=2,
        vocab_size=VOCAB, dropout_rate=dropout, decoder_start_token_id=0, pad_token_id=0))


def bart(dropout=0.1):  # final_logits_bias beside the head
    torch.manual_seed(0)
    model = tf.BartForConditionalGeneration(tf.BartConfig(dropout=dropout, **SMALL))
    with torch.no_grad():
        model.final_logits_bias.normal_()  # zeros at init: make it count
    return model


def marian():
    torch.manual_seed(0)
    return tf.MarianMTModel(tf.MarianConfig(**SMALL))


def m2m100():  # NLLB's kind: no prepare_decoder_input_ids_from_labels (refused before)
    torch.manual_seed(0)
    return tf.M2M100ForConditionalGeneration(tf.M2M100Config(
        encoder_layerdrop=0.0, decoder_layerdrop=0.0, **SMALL))


MODELS = {"t5": t5, "bart": bart, "marian": marian, "m2m100": m2m100}


def batch(rows=2, source=100, target=30):
    g = torch.Generator().manual_seed(1)
    ids = torch.randint(1, VOCAB, (rows, source), generator=g)
    labels = torch.randint(1, VOCAB, (rows, target), generator=g)
    mask = torch.ones_like(ids)
    if rows > 1:
        mask[1, source * 4 // 5:] = 0
        labels[1, target * 2 // 3:] = -100
    return {"input_ids": ids, "attention_mask": mask, "labels": labels}


def grads(model):
    return torch.cat([p.grad.flatten() for p in model.parameters() if p.grad is not None])


@pytest.mark.parametrize("name", MODELS)
def test_the_models_loss_and_gradients_with_the_head_in_chunks(name):
    b = batch()
    want_model, got_model = MODELS[name](), MODELS[name]()
    torch.manual_seed(5)
    want = want_model(**b).loss
    want.backward()
    torch.manual_seed(5)
    got = seq2seq_lm.seq2seq_lm_loss(got_model, b, chunk_tokens=16)
    got.backward()
    assert seq2seq_lm.covers(got_model)
    assert got.item() == pytest.approx(want.item(), rel=1e-5)
    g, w = grads(got_model), grads(want_model)
    assert F.cosine_similarity(g, w, dim=0) >= 0.99999
    assert (g - w).norm() / w.norm() < 1e-5


@pytest.mark.parametrize("name", ["t5", "bart"])
def test_a_peft_model_of_adapters_gives_its_loss_and_gradients(name):
    """LoRA (peft) on an encoder-decoder: the path runs the base model, whose layers hold the
    adapters, and gives the PEFT model's loss and the adapters' gradients; a PEFT model of
    prompt learning (virtual tokens its own forward adds) is not covered."""
    peft = pytest.importorskip("peft")

    def lora():
        model = peft.get_peft_model(MODELS[name](), peft.LoraConfig(
            r=4, target_modules=["q", "v"] if name == "t5" else ["q_proj", "v_proj"],
            lora_dropout=0.1))
        torch.manual_seed(7)
        for n, p in model.named_parameters():
            if "lora_B" in n:
                p.data.normal_()  # zeros at init: make the adapters count
        return model

    b = batch()
    want_model, got_model = lora(), lora()
    torch.manual_seed(5)
    want = want_model(**b).loss
    want.backward()
    assert seq2seq_lm.covers(got_model)
    torch.manual_seed(5)
    got = seq2seq_lm.seq2seq_lm_loss(got_model, b, chunk_tokens=16)
    got.backward()
    assert got.item() == pytest.approx(want.item(), rel=1e-5)
    g, w = grads(got_model), grads(want_model)
    assert g.numel() == w.numel() < sum(p.numel() for p in got_model.parameters())
    assert F.cosine_similarity(g, w, dim=0) >= 0.99999
    prompt = peft.get_peft_model(MODELS[name](), peft.PromptTuningConfig(
        task_type="SEQ_2_SEQ_LM", num_virtual_tokens=4))
    assert not seq2seq_lm.covers(prompt)


def test_what_is_not_covered_is_said():
    gpt2 = tf.GPT2LMHeadModel(tf.GPT2Config(n_layer=1, n_embd=16, n_head=2, vocab_size=64))
    assert not seq2seq_lm.covers(gpt2)  # a decoder only: causal_lm's
    assert not seq2seq_lm.covers(torch.nn.Linear(4, 4))
    model = t5()
    with pytest.raises(ValueError, match="no 'labels'"):
        seq2seq_lm.seq2seq_lm_loss(model, {"input_ids": batch()["input_ids"]})
    with pytest.raises(ValueError, match="decoder_inputs_embeds"):
        seq2seq_lm.seq2seq_lm_loss(model, {**batch(), "decoder_inputs_embeds": None})
    # a head the path does not describe (here a hook doubling its logits): refused
    model.get_output_embeddings().register_forward_hook(lambda module, args, out: 2 * out)
    with pytest.raises(ValueError, match="logits are not its output embeddings"):
        seq2seq_lm.seq2seq_lm_loss(model, batch())


def test_the_check_leaves_the_random_state_as_it_was():
    """The prefix check draws dropout masks from a forked random state: the training step's
    own draws are the ones model(**batch) would make."""
    model = t5()
    torch.manual_seed(3)
    seq2seq_lm.check(model, batch())
    after = torch.rand(4)
    torch.manual_seed(3)
    assert torch.equal(after, torch.rand(4))


def test_step_runs_it_under_a_limit_for_one_long_sample(monkeypatch):
    """At batch 1 (a 256-token source, 64 labels) under a limit, Step's probes and step run
    the chunked loss, and the gradient is plain training's."""
    calls, real = [], seq2seq_lm.seq2seq_lm_loss

    def counting(model, b, **kwargs):
        calls.append(b["labels"].shape[1])
        return real(model, b, **kwargs)

    monkeypatch.setattr(seq2seq_lm, "seq2seq_lm_loss", counting)
    b = batch(rows=1, source=256, target=64)
    want = t5(dropout=0.0)
    want(**b).loss.backward()
    model = t5(dropout=0.0)
    with act.Step(model, limit="64GiB", exact=True) as step:
        step(b)
        assert step.profile.unit == "token 1:1:0.25"  # ids, mask, labels
    assert calls and calls[-1] == 64 and min(calls) < 64, calls
    g, w = grads(model), grads(want)
    assert F.cosine_similarity(g, w, dim=0) >= 0.99999
    assert (g - w).norm() / w.norm() < 1e-5
    # without a limit, or with chunk_loss off, the model's own loss
    calls.clear()
    for kwargs in ({"limit": None}, {"limit": "64GiB", "chunk_loss": False}):
        with act.Step(t5(dropout=0.0), exact=True, **kwargs) as step:
            step(b)
    assert not calls


def test_step_runs_the_models_own_loss_where_the_path_differs():
    """A head the path does not describe (a hook on it): Step warns once and runs
    model(**batch).loss, giving plain training's gradient, not a mis-scaled one."""
    def hooked():
        model = t5(dropout=0.0)
        model.get_output_embeddings().register_forward_hook(lambda m, args, out: 2 * out)
        return model

    b = batch(rows=1, source=128, target=32)
    want = hooked()
    want(**b).loss.backward()
    model = hooked()
    with act.Step(model, limit="64GiB", exact=True) as step:
        with pytest.warns(RuntimeWarning, match="does not cover T5ForConditionalGeneration"):
            step(b)
    assert torch.equal(grads(model), grads(want))


@pytest.mark.parametrize("wrapped", [False, True], ids=["autocast", "forward-in-autocast"])
@pytest.mark.parametrize("name", ["t5", "bart"])
def test_under_autocast_the_chunked_loss_covers_it_and_gives_autocasts_gradient(name, wrapped):
    """Where the forward enters autocast itself (accelerate's mixed precision, the Trainer's
    bf16=True, wraps it so), this path ran the encoder and decoder outside it, in float32:
    the check found the model's bfloat16 logits 0.003-0.02 apart and Step ran the model's own
    loss, with a RuntimeWarning. It runs the forward to the head now, under its autocast."""
    want, model = (MODELS[name](dropout=0.0).eval() for _ in range(2))
    _autocast.assert_chunked_like_autocast(want, model, batch(), wrapped)
