"""One training run of a byte-level transformers GPT-2 (4 x 256, from a config, random init) on
Python's help text, for comparing trajectories: fp32, fp32 in two micro-batches (the same
gradient up to summation order), or a preset through compress_saved. Prints the held-out loss
(nats per byte over the held-out help topics) as JSON.

    python bench/text_trajectories.py CONFIG SEED [STEPS]    # CONFIG: fp32, fp32mb2, 8bit, ...
"""
from __future__ import annotations

import json
import sys
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
import clients  # noqa: E402

import actcodec.torch as act  # noqa: E402

BATCH = 16


def main() -> None:
    config, seed = sys.argv[1], int(sys.argv[2])
    steps = int(sys.argv[3]) if len(sys.argv) > 3 else 300
    torch.set_num_threads(2)
    x_train, y_train, x_test, y_test = clients.help_text()
    model, loss = clients.byte_gpt2(seed)
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
    gen = torch.Generator().manual_seed(seed + 100)
    ctx = None if config.startswith("fp32") else \
        act.compress_saved(act.Policy.preset(config), model=model)
    t0 = time.perf_counter()
    for _ in range(steps):
        i = torch.randint(0, x_train.shape[0], (BATCH,), generator=gen)
        if config == "fp32mb2":
            for half in (i[:BATCH // 2], i[BATCH // 2:]):
                (loss(x_train[half], y_train[half]) / 2).backward()
        elif ctx is None:
            loss(x_train[i], y_train[i]).backward()
        else:
            with ctx:
                value = loss(x_train[i], y_train[i])
            value.backward()
        opt.step()
        opt.zero_grad()
    with torch.no_grad():
        test = sum(float(loss(x_test[j:j + 64], y_test[j:j + 64])) * len(x_test[j:j + 64])
                   for j in range(0, len(x_test), 64)) / len(x_test)
    print(json.dumps({"config": config, "seed": seed, "steps": steps, "test_loss": test,
                      "seconds": time.perf_counter() - t0}))


if __name__ == "__main__":
    main()
