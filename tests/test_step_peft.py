"""Step on PEFT models (LoRA adapters on a transformers causal LM), as people fine-tune on small
machines: the wrapper's loss is its base model's (labels shifted by one, so micro-batches are
weighted by the targets after the shift), its forward runs without a cache (a block recomputed
in backward would append its keys a second time), and the head and loss run in chunks of
tokens through the base model's head."""
import copy

import pytest
import torch
import torch.nn.functional as F

peft = pytest.importorskip("peft")
tf = pytest.importorskip("transformers")

import _padded  # noqa: E402
import actcodec.torch as act  # noqa: E402
from actcodec.torch.limit import loss_weights, wrapped  # noqa: E402

VOCAB = 512


def lora_llama(seed=0, target_modules=("q_proj", "v_proj", "down_proj")):
    torch.manual_seed(seed)
    base = tf.LlamaForCausalLM(tf.LlamaConfig(
        hidden_size=64, intermediate_size=128, num_hidden_layers=3, num_attention_heads=4,
        num_key_value_heads=2, vocab_size=VOCAB, max_position_embeddings=256))
    model = peft.get_peft_model(base, peft.LoraConfig(
        r=4, lora_alpha=8, target_modules=list(target_modules), lora_dropout=0.0,
        task_type="CAUSAL_LM"))
    with torch.no_grad():  # B starts at zero: give every adapter a gradient path
        for name, p in model.named_parameters():
            if "lora_B" in name:
                p.normal_(0, 0.05)
    return model


def padded():
    """Right-padded rows: the first has two targets after the shift, where counting its
    labels unshifted gives three."""
    return _padded.padded(VOCAB)


def stepped_and_plain(model, plan):
    """(Step's loss, plain's loss, Step's gradients, plain's) on padded(), from one model."""
    reference = copy.deepcopy(model)
    batch = padded()
    expected = reference(**batch).loss
    expected.backward()
    with act.Step(model, plan=plan) as step:
        loss = step(batch)
    return loss, expected, trained(model), trained(reference)


def trained(model):
    return {n: p.grad.clone() for n, p in model.named_parameters() if p.grad is not None}


def cosine(a, b):
    return float(F.cosine_similarity(a.flatten().double(), b.flatten().double(), dim=0))


def test_a_lora_model_is_its_base_models_causal_lm():
    model = lora_llama()
    assert wrapped.inner(model) is model.get_base_model()
    assert loss_weights.shifts_labels(model)
    batch = padded()
    assert loss_weights.per_sample_targets(model, batch, 4).tolist() == [2, 39, 16, 39]


@pytest.mark.parametrize("plan", [
    act.Plan(micro_batches=2), act.Plan(micro_batches=4, recompute=(0, 1, 2)),
    act.Plan(recompute=(0, 1, 2)),
], ids=["2 micro-batches", "4 micro-batches, recompute", "recompute"])
def test_a_lora_step_gives_plain_trainings_loss_and_gradients(plan):
    """Micro-batches weighted by the shifted targets (unshifted, the row of two targets would
    count three: the loss moved by 1.4e-5 of itself here), and blocks recomputed under an attention mask
    (with the cache on, the recomputed attention saw twice the keys: a shape error)."""
    loss, expected, got, want = stepped_and_plain(lora_llama(), plan)
    assert loss.item() == pytest.approx(expected.item(), rel=1e-6)
    assert got.keys() == want.keys() and all("lora_" in name for name in got)
    for name in want:
        if plan.micro_batches == 1:
            assert torch.equal(got[name], want[name]), name  # the same ops in the same order
        assert cosine(got[name], want[name]) >= 0.99999, name


def test_a_lora_step_runs_without_a_cache():
    model = lora_llama()
    seen = []
    attention = model.get_base_model().model.layers[0].self_attn
    handle = attention.register_forward_pre_hook(
        lambda module, args, kwargs: seen.append(kwargs.get("past_key_values",
                                                            kwargs.get("cache"))),
        with_kwargs=True)
    with act.Step(model, plan=act.Plan(recompute=(0,))) as step:
        step(padded())
    handle.remove()
    assert len(seen) == 2 and all(cache is None for cache in seen)  # forward, recomputation


def test_causal_lm_loss_of_a_lora_model_equals_its_loss():
    model = lora_llama()
    reference = copy.deepcopy(model)
    batch = padded()
    expected = reference(**batch).loss
    expected.backward()
    loss = act.causal_lm_loss(model, batch, chunk_tokens=7)
    loss.backward()
    assert loss.item() == pytest.approx(expected.item(), rel=1e-6)
    got, want = trained(model), trained(reference)
    assert got.keys() == want.keys()
    for name in want:
        assert cosine(got[name], want[name]) >= 0.99999, name


def test_causal_lm_loss_refuses_an_adapter_on_the_head_and_prompt_learning():
    with pytest.raises(ValueError, match="adapter on the head"):
        act.causal_lm_loss(lora_llama(target_modules=("q_proj", "lm_head")), padded())
    torch.manual_seed(0)
    prompted = peft.get_peft_model(
        tf.LlamaForCausalLM(tf.LlamaConfig(hidden_size=64, intermediate_size=128,
                                           num_hidden_layers=1, num_attention_heads=4,
                                           vocab_size=VOCAB)),
        peft.PromptTuningConfig(num_virtual_tokens=4, task_type="CAUSAL_LM"))
    assert wrapped.inner(prompted) is prompted  # virtual tokens: not the batch as given
    with pytest.raises(ValueError, match="prompt learning"):
        act.causal_lm_loss(prompted, padded())


def test_a_lora_step_under_a_limit_runs_the_chunked_loss():
    """Under a limit the default loss of a LoRA causal LM is the chunked one (before, a PEFT
    model was not covered: the full logits, and a batch-1 sample refused at limits its
    chunked plan meets)."""
    model = lora_llama()
    step = act.Step(model, limit="free")
    calls = []
    original = act.causal_lm_loss

    def counting(*args, **kwargs):
        calls.append(1)
        return original(*args, **kwargs)

    from actcodec.torch.limit import causal_lm
    causal_lm.causal_lm_loss, saved = counting, causal_lm.causal_lm_loss
    try:
        step(padded())
    finally:
        causal_lm.causal_lm_loss = saved
        step.close()
    assert calls


def prompt_learning(config):
    torch.manual_seed(0)
    base = tf.LlamaForCausalLM(tf.LlamaConfig(
        hidden_size=64, intermediate_size=128, num_hidden_layers=3, num_attention_heads=4,
        num_key_value_heads=2, vocab_size=VOCAB, max_position_embeddings=256))
    return peft.get_peft_model(base, config)


PROMPT_LEARNING = {
    "prefix tuning": lambda: peft.PrefixTuningConfig(num_virtual_tokens=4,
                                                     task_type="CAUSAL_LM"),
    "prompt tuning": lambda: peft.PromptTuningConfig(num_virtual_tokens=4,
                                                     task_type="CAUSAL_LM"),
    "p-tuning": lambda: peft.PromptEncoderConfig(num_virtual_tokens=4, encoder_hidden_size=32,
                                                 task_type="CAUSAL_LM"),
}


@pytest.mark.parametrize("kind", PROMPT_LEARNING)
def test_prompt_learning_gives_plain_trainings_loss_and_gradients(kind):
    """Prefix tuning hands the base model the labels as given: counted unshifted, a row of 2
    targets counted 3 (the loss of 2 micro-batches moved by 1.2e-6 of itself). Prompt and
    p-tuning prepend -100 labels, so their given labels all count; their forward took
    `use_cache` on to the base model, but Step did not pass it (a block recomputed under an
    attention mask met twice the keys: a shape error)."""
    plans = [act.Plan(micro_batches=2)] + ([] if kind == "prefix tuning" else
                                           [act.Plan(micro_batches=2, recompute=(0, 1, 2))])
    for plan in plans:
        loss, expected, got, want = stepped_and_plain(
            prompt_learning(PROMPT_LEARNING[kind]()), plan)
        assert loss.item() == pytest.approx(expected.item(), rel=1e-7, abs=0)
        assert got.keys() == want.keys()
        for name in want:
            assert cosine(got[name], want[name]) >= 0.99999, name


def test_prefix_tuning_is_never_recomputed():
    """Its prefix is a cache each attention call extends: a layer recomputed in backward would
    extend it a second time (a shape error). Step finds no block to recompute."""
    model = prompt_learning(PROMPT_LEARNING["prefix tuning"]())
    assert loss_weights.per_sample_targets(model, padded(), 4).tolist() == [2, 39, 16, 39]
    with pytest.raises(ValueError, match="prefix tuning"):
        act.Step(model, plan=act.Plan(recompute=(0,)))
    with act.Step(model, limit="free") as step:
        assert step.blocks == []
        step(padded())
