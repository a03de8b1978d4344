"""A training loop under Step(limit=...) in its own process, for tests/test_step_limit_holds.py:
a transformers GPT-2 (random init) fed batches of varying samples and lengths with padded
labels, AdamW through `optimizer=`. Prints one JSON line per event on stdout; the parent
samples this process's RSS from outside and compares it with the limit.

argv: room_mib (the limit is the floor after setup plus this), then the batches as
samples x tokens (e.g. 4x64 4x64 12x192 2x32). LIMIT_WORKER_VOCAB: the vocabulary (1024);
LIMIT_WORKER_MODEL=bloom, qwen3, llama_lora (LoRA adapters, peft; LIMIT_WORKER_LAYERS of
them, 4 by default), t5 (an encoder-decoder: labels a quarter of the tokens, the source
padded alone) or bert_mlm (a masked LM: labels on a seeded 15% of the tokens): that layout
instead."""
import json
import os
import sys

import torch
import transformers

import actcodec.torch as act
from actcodec import resident


def say(**kw):
    print(json.dumps(kw), flush=True)


def batch(samples, tokens, vocab, seed):
    g = torch.Generator().manual_seed(seed)
    ids = torch.randint(0, vocab, (samples, tokens), generator=g)
    lengths = torch.randint(max(1, tokens // 4), tokens + 1, (samples,), generator=g)
    lengths[0] = tokens  # the longest sets the padded length, as a collator's does
    mask = (torch.arange(tokens)[None, :] < lengths[:, None]).long()
    labels = ids.masked_fill(mask == 0, -100)
    if os.environ.get("LIMIT_WORKER_MODEL") == "t5":  # a target of its own, a quarter as long
        labels = torch.randint(0, vocab, (samples, max(1, tokens // 4)), generator=g)
    if os.environ.get("LIMIT_WORKER_MODEL") == "bert_mlm":  # the masked tokens alone
        labels = labels.masked_fill(torch.rand(samples, tokens, generator=g) >= 0.15, -100)
    return {"input_ids": ids, "attention_mask": mask, "labels": labels}


def main():
    room = int(sys.argv[1])
    shapes = [tuple(int(v) for v in s.split("x")) for s in sys.argv[2:]]
    torch.manual_seed(0)
    vocab = int(os.environ.get("LIMIT_WORKER_VOCAB", "1024"))
    if os.environ.get("LIMIT_WORKER_MODEL") == "bloom":  # ALiBi: scores over every pair kept
        cfg = transformers.BloomConfig(hidden_size=256, n_layer=4, n_head=4, vocab_size=vocab)
        model = transformers.BloomForCausalLM(cfg)
    elif os.environ.get("LIMIT_WORKER_MODEL") == "qwen3":  # grouped-query attention, RoPE
        cfg = transformers.Qwen3Config(hidden_size=256, intermediate_size=1024,
                                       num_hidden_layers=4, num_attention_heads=4,
                                       num_key_value_heads=2, head_dim=64, vocab_size=vocab,
                                       max_position_embeddings=4096)
        model = transformers.Qwen3ForCausalLM(cfg)
    elif os.environ.get("LIMIT_WORKER_MODEL") == "t5":  # relative position bias, eager
        cfg = transformers.T5Config(d_model=256, d_ff=1024, d_kv=64, num_heads=4, num_layers=4,
                                    num_decoder_layers=4, vocab_size=vocab, dropout_rate=0.0,
                                    decoder_start_token_id=0, pad_token_id=0)
        model = transformers.T5ForConditionalGeneration(cfg)
    elif os.environ.get("LIMIT_WORKER_MODEL") == "llama_lora":  # LoRA (peft) on a Llama
        import peft
        layers = int(os.environ.get("LIMIT_WORKER_LAYERS", "4"))
        cfg = transformers.LlamaConfig(hidden_size=256, intermediate_size=688,
                                       num_hidden_layers=layers, num_attention_heads=4,
                                       num_key_value_heads=4, vocab_size=vocab,
                                       max_position_embeddings=4096)
        model = peft.get_peft_model(transformers.LlamaForCausalLM(cfg), peft.LoraConfig(
            r=8, target_modules=["q_proj", "v_proj", "down_proj"], task_type="CAUSAL_LM"))
    elif os.environ.get("LIMIT_WORKER_MODEL") == "bert_mlm":  # a masked LM's head
        cfg = transformers.BertConfig(hidden_size=256, intermediate_size=1024,
                                      num_hidden_layers=4, num_attention_heads=4,
                                      vocab_size=vocab, max_position_embeddings=4096)
        model = transformers.BertForMaskedLM(cfg)
    else:
        cfg = transformers.GPT2Config(n_embd=128, n_layer=4, n_head=4, vocab_size=vocab,
                                      n_positions=2048, attn_implementation="eager")
        model = transformers.GPT2LMHeadModel(cfg)
    opt = torch.optim.AdamW([p for p in model.parameters() if p.requires_grad], lr=1e-4)
    batches = [batch(n, t, cfg.vocab_size, i) for i, (n, t) in enumerate(shapes)]
    limit = resident.live() + room * (1 << 20)
    say(event="start", limit=limit)
    step = act.Step(model, limit=limit, optimizer=opt, exact=True)
    for i, b in enumerate(batches):
        try:
            loss = step(b)
        except act.MemoryLimitError as e:
            say(event="refused", step=i, needed=e.needed, message=str(e))
            opt.zero_grad()
            continue
        opt.step()
        opt.zero_grad()
        say(event="step", step=i, shape=list(b["input_ids"].shape), loss=float(loss),
            plan=step.describe(), peak=step.stats.peak)
    say(event="done")


if __name__ == "__main__":
    main()
