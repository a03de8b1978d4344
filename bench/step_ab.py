"""One training step of a transformers GPT-2 (built from a config, random init) under a preset,
timed in this process: the median of 6 steps after 2 warm-up steps, in milliseconds. For
comparing two checkouts (before and after a change), run it from each in alternating fresh
processes, with the checkout's package first on the path:

    for r in 1 2 3 4; do for tree in ../before .; do
        PYTHONPATH=$tree python bench/step_ab.py 8bit; done; done

    python bench/step_ab.py PRESET   # fp32, lossless, 8bit, 4bit, 2bit, auto"""
from __future__ import annotations

import statistics
import sys
import time

import torch

import actcodec
import actcodec.torch as act


def main(argv=None) -> int:
    preset = (argv if argv is not None else sys.argv[1:] or ["8bit"])[0]
    from transformers import GPT2Config, GPT2LMHeadModel

    torch.set_num_threads(2)
    torch.manual_seed(0)
    cfg = GPT2Config(n_layer=4, n_embd=256, n_head=4, vocab_size=2048, n_positions=512,
                     resid_pdrop=0.0, embd_pdrop=0.0, attn_pdrop=0.0)
    model = GPT2LMHeadModel(cfg)
    ids = torch.randint(0, cfg.vocab_size, (8, 256))
    ctx = None if preset == "fp32" else act.compress_saved(act.Policy.preset(preset),
                                                           model=model)
    times = []
    for i in range(8):
        t0 = time.perf_counter()
        if ctx is None:
            loss = model(input_ids=ids, labels=ids).loss
        else:
            with ctx:
                loss = model(input_ids=ids, labels=ids).loss
        loss.backward()
        model.zero_grad(set_to_none=True)
        if i >= 2:
            times.append(time.perf_counter() - t0)
    print(f"{preset} {statistics.median(times) * 1e3:.1f} ms  ({actcodec.__file__})")
    return 0


if __name__ == "__main__":
    sys.exit(main())
