"""One training step of a transformers GPT-2 (built from a config, random init) under a preset
or a budget, timed in this process: the median of 30 steps after 5, in CPU milliseconds of
this process (time.process_time, one torch thread: on a shared machine far steadier than wall
time, and what the Python of the save path costs shows in it). For comparing two checkouts
(before and after a change), run it from each in alternating fresh processes, with the
checkout's package first on the path, and compare round by round:

    for r in 1 2 3 4 5 6; do for tree in ../before .; do
        PYTHONPATH=$tree python bench/step_ab.py 8bit budget:12; done; done

    python bench/step_ab.py CONFIG [CONFIG ...]   # fp32, lossless, 8bit, 4bit, 2bit, auto,
                                                  # budget:MIB (compress_saved(budget=MIB MiB))

The model is the text benchmark's (bench/text_convergence.py): a byte-level GPT-2 of 4 layers
x 128, batch 16 x 128 tokens."""
from __future__ import annotations

import statistics
import sys
import time

import torch

import actcodec
import actcodec.torch as act


def context(config: str, model):
    if config == "fp32":
        return None
    if config.startswith("budget:"):
        return act.compress_saved(model=model, budget=f"{config.split(':', 1)[1]}MiB")
    return act.compress_saved(act.Policy.preset(config), model=model)


def step_ms(config: str) -> float:
    from transformers import GPT2Config, GPT2LMHeadModel

    torch.manual_seed(0)
    cfg = GPT2Config(n_layer=4, n_embd=128, n_head=4, vocab_size=256, n_positions=128,
                     resid_pdrop=0.0, embd_pdrop=0.0, attn_pdrop=0.0)
    model = GPT2LMHeadModel(cfg).train()
    ids = torch.randint(0, cfg.vocab_size, (16, 128))
    ctx = context(config, model)
    times = []
    for i in range(35):
        t0 = time.process_time()
        if ctx is None:
            loss = model(input_ids=ids, labels=ids).loss
        else:
            with ctx:
                loss = model(input_ids=ids, labels=ids).loss
        loss.backward()
        model.zero_grad(set_to_none=True)
        if i >= 5:
            times.append(time.process_time() - t0)
    return statistics.median(times) * 1e3


def main(argv=None) -> int:
    configs = (argv if argv is not None else sys.argv[1:]) or ["8bit"]
    torch.set_num_threads(1)
    import transformers
    transformers.logging.set_verbosity_error()
    print("  ".join(f"{c} {step_ms(c):.1f} ms" for c in configs) + f"  ({actcodec.__file__})")
    return 0


if __name__ == "__main__":
    sys.exit(main())
