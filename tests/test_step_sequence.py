"""One long sample per step: act.Step plans it along its tokens (probes on its first quarter
and half, no micro-batches), runs a transformers causal LM's head and loss in chunks under a
limit, and gives plain PyTorch's gradients. Tiny transformers models built from configs
(random init, nothing downloaded)."""
import pytest
import torch
import torch.nn.functional as F

import actcodec.torch as act
from actcodec.torch.limit import causal_lm, shape, step_profile

tf = pytest.importorskip("transformers")

VOCAB, TOKENS = 512, 256
GENEROUS = "64GiB"  # a limit that plans, whatever the machine


def gpt2(seed=0):  # tied embeddings
    torch.manual_seed(seed)
    return tf.GPT2LMHeadModel(tf.GPT2Config(
        n_layer=2, n_embd=32, n_head=2, n_positions=TOKENS, vocab_size=VOCAB, resid_pdrop=0.0,
        embd_pdrop=0.0, attn_pdrop=0.0, bos_token_id=0, eos_token_id=0))


def llama(seed=0):  # untied head
    torch.manual_seed(seed)
    return tf.LlamaForCausalLM(tf.LlamaConfig(
        num_hidden_layers=2, hidden_size=32, intermediate_size=64, num_attention_heads=2,
        num_key_value_heads=2, vocab_size=VOCAB, max_position_embeddings=TOKENS,
        bos_token_id=0, eos_token_id=0))


MODELS = {"gpt2": gpt2, "llama": llama}


def sample(tokens=TOKENS, seed=1):
    ids = torch.randint(0, VOCAB, (1, tokens), generator=torch.Generator().manual_seed(seed))
    labels = ids.clone()
    labels[0, :tokens // 8] = -100  # a prompt that is not trained on
    return {"input_ids": ids, "attention_mask": torch.ones_like(ids), "labels": labels}


def flat_grad(m):
    return torch.cat([p.grad.flatten() for p in m.parameters() if p.grad is not None])


@pytest.mark.parametrize("name", MODELS)
def test_one_long_sample_is_planned_along_its_tokens_and_gives_the_plain_gradient(
        name, monkeypatch):
    batch = sample()
    want = MODELS[name]()
    want(**batch).loss.backward()

    sizes, real = [], step_profile.probe

    def recording(run_loss, params, samples, *args, **kwargs):
        sizes.append(samples)
        return real(run_loss, params, samples, *args, **kwargs)

    monkeypatch.setattr(step_profile, "probe", recording)
    chunked, real_loss = [], causal_lm.causal_lm_loss

    def counting(model, b, chunk_tokens=None, **kwargs):
        chunked.append(b["input_ids"].shape[1])
        return real_loss(model, b, chunk_tokens=chunk_tokens, **kwargs)

    monkeypatch.setattr(causal_lm, "causal_lm_loss", counting)
    model = MODELS[name]()
    with act.Step(model, limit=GENEROUS, exact=True) as step:
        step(batch)
        assert step.profile.unit == "token" and step.profile.batch == TOKENS
        assert step.plan.micro_batches == 1
    # probes on the sample's first tokens: a short warm-up, a quarter, a half
    assert max(sizes) == TOKENS // 2 and TOKENS // 4 in sizes, sizes
    assert chunked[-1] == TOKENS and set(chunked) >= {TOKENS // 4, TOKENS // 2}
    got, ref = flat_grad(model), flat_grad(want)
    assert F.cosine_similarity(got, ref, dim=0) >= 0.99999
    assert (got - ref).norm() / ref.norm() < 1e-5


def test_without_a_limit_or_with_chunk_loss_off_the_models_own_loss_runs(monkeypatch):
    calls = []
    monkeypatch.setattr(causal_lm, "causal_lm_loss",
                        lambda *a, **k: calls.append(1) or pytest.fail("chunked loss ran"))
    batch = sample()
    for kwargs in ({"limit": None}, {"limit": GENEROUS, "chunk_loss": False}):
        with act.Step(llama(), exact=True, **kwargs) as step:
            assert torch.isfinite(step(batch))
    assert not calls


def test_a_loss_fn_or_a_model_not_covered_keeps_its_own_loss(monkeypatch):
    monkeypatch.setattr(causal_lm, "causal_lm_loss",
                        lambda *a, **k: pytest.fail("chunked loss ran"))
    model = llama()
    with act.Step(model, limit=GENEROUS, loss_fn=lambda m, b: m(**b).loss) as step:
        step(sample())
    # a model whose head is not a Linear layer is not covered
    assert not causal_lm.covers(torch.nn.Linear(4, 4))


def test_what_counts_as_one_long_sample():
    ids = torch.zeros(1, 100, dtype=torch.long)
    assert shape.sequence_length({"input_ids": ids, "labels": ids}, 1) == 100
    assert shape.sequence_length({"input_ids": ids[:, :10]}, 1) is None  # short: a sample
    assert shape.sequence_length({"input_ids": torch.zeros(2, 100, dtype=torch.long)},
                                 2) is None  # more than one sample
    image = torch.zeros(1, 3, 224, 224)
    assert shape.sequence_length(image, 1) is None  # no token ids: not a sequence
    assert shape.sequence_length((torch.zeros(1, 224, 224),), 1) is None
    # tensors that disagree on the length: nothing can be cut safely
    assert shape.sequence_length({"input_ids": ids, "x": torch.zeros(1, 7, 4)}, 1) is None
    cut = shape.first_tokens({"input_ids": ids, "labels": ids, "n": torch.tensor(3)}, 100, 25)
    assert cut["input_ids"].shape == (1, 25) and cut["labels"].shape == (1, 25)
    assert cut["n"].shape == ()


def test_an_encoder_decoders_sequences_are_cut_in_proportion():
    """A sample of two sequences (an encoder-decoder's source and labels) is one long
    sample too: its longest length is the scale, each sequence cut in proportion (rounded
    up), and its unit names the shares, so that a profile serves only batches of the same
    proportions; a tensor of a length no token sequence has (an image's rows, a
    spectrogram's bins) still makes it no sequence."""
    ids, labels = torch.zeros(1, 100, dtype=torch.long), torch.zeros(1, 30, dtype=torch.long)
    batch = {"input_ids": ids, "attention_mask": torch.ones(1, 100), "labels": labels}
    assert shape.token_lengths(batch, 1) == (100, 100, 30)
    assert shape.sequence_length(batch, 1) == 100
    assert shape.sequence_unit(batch, 1) == "token 1:1:0.3"
    assert shape.sequence_unit({"input_ids": ids, "labels": ids}, 1) == "token"
    cut = shape.first_tokens(batch, 100, 25)
    assert [cut[k].shape[1] for k in ("input_ids", "attention_mask", "labels")] == [25, 25, 8]
    speech = {"input_features": torch.zeros(1, 80, 3000), "labels": labels}
    assert shape.sequence_length(speech, 1) is None


def test_an_encoder_decoder_sample_is_planned_along_its_sequences_and_gives_the_plain_gradient(
        monkeypatch):
    """T5 with 256 source tokens and 64 labels: probed on both sequences' first tokens in
    proportion, planned along them, and the gradient plain PyTorch's bit for bit (its own
    loss, chunk_loss=False: test_seq2seq_lm runs the chunked one)."""
    def t5():
        torch.manual_seed(0)
        return tf.T5ForConditionalGeneration(tf.T5Config(
            d_model=32, d_ff=64, d_kv=16, num_heads=2, num_layers=2, num_decoder_layers=2,
            vocab_size=VOCAB, dropout_rate=0.0, decoder_start_token_id=0, pad_token_id=0))

    g = torch.Generator().manual_seed(1)
    batch = {"input_ids": torch.randint(1, VOCAB, (1, TOKENS), generator=g),
             "labels": torch.randint(1, VOCAB, (1, TOKENS // 4), generator=g)}
    want = t5()
    want(**batch).loss.backward()
    seen = []
    model = t5()
    model.register_forward_pre_hook(
        lambda m, args, kwargs: seen.append((kwargs["input_ids"].shape[1],
                                             kwargs["labels"].shape[1])), with_kwargs=True)
    with act.Step(model, limit=GENEROUS, exact=True, chunk_loss=False) as step:
        step(batch)
        assert step.profile.unit == "token 1:0.25" and step.profile.batch == TOKENS
    assert (TOKENS // 4, TOKENS // 16) in seen and (TOKENS // 2, TOKENS // 8) in seen, seen
    assert all(labels == -(-source // 4) for source, labels in seen), seen
    assert torch.equal(flat_grad(model), flat_grad(want))


def test_encoder_decoder_samples_of_shorter_labels_are_not_probed_again(monkeypatch):
    """A dataset's samples differ in their proportion of labels to source: one probed at a
    quarter plans those of fewer labels (and a shorter source) without probing again; one
    of more labels is probed on its own. Each step's gradient is plain PyTorch's."""
    def t5():
        torch.manual_seed(0)
        return tf.T5ForConditionalGeneration(tf.T5Config(
            d_model=32, d_ff=64, d_kv=16, num_heads=2, num_layers=2, num_decoder_layers=2,
            vocab_size=VOCAB, dropout_rate=0.0, decoder_start_token_id=0, pad_token_id=0))

    probed, real = [], step_profile.measure
    monkeypatch.setattr(step_profile, "measure",
                        lambda *a, **k: probed.append(a[3]) or real(*a, **k))
    g = torch.Generator().manual_seed(1)
    model, want = t5(), t5()
    with act.Step(model, limit=GENEROUS, exact=True, chunk_loss=False) as step:
        for source, labels in [(TOKENS, TOKENS // 4), (TOKENS, TOKENS // 5),
                               (TOKENS - 16, TOKENS // 4 - 8), (TOKENS, TOKENS // 2)]:
            batch = {"input_ids": torch.randint(1, VOCAB, (1, source), generator=g),
                     "labels": torch.randint(1, VOCAB, (1, labels), generator=g)}
            step(batch)
            assert step.profile.unit == shape.sequence_unit(batch, 1)
            want.zero_grad()
            want(**batch).loss.backward()
            assert torch.equal(flat_grad(model), flat_grad(want))
            model.zero_grad()
    assert len(probed) == 2, probed  # the first, and the one of half as many labels


def test_a_batch_of_sequences_is_cut_along_its_tokens():
    """token_length: the length of any batch of token sequences (what a new longest batch's
    shorter probes cut, Step._probe_shorter); first_tokens with `size` cuts every (size, T)
    tensor, nothing else."""
    ids = torch.zeros(4, 100, dtype=torch.long)
    batch = {"input_ids": ids, "attention_mask": torch.ones(4, 100), "labels": ids,
             "scale": torch.ones(3, 100)}
    assert shape.token_length(batch, 4) == 100
    assert shape.token_length({"input_ids": ids, "x": torch.zeros(4, 7, 2)}, 4) is None
    assert shape.token_length(torch.zeros(4, 3, 32, 32), 4) is None  # an image batch
    cut = shape.first_tokens(batch, 100, 30, size=4)
    assert [tuple(cut[k].shape) for k in ("input_ids", "attention_mask", "labels")] == \
        [(4, 30)] * 3
    assert cut["scale"].shape == (3, 100)  # not of the batch: as it was
    assert shape.units_per_sample(cut, 4) == 90
