"""One rank of tests/test_torch_ddp.py, run as a script (not collected by pytest):

    python _ddp_worker.py RANK WORLD_SIZE STORE_PORT OUT_FILE

Trains the model under DDP (gloo, CPU) inside `compress_saved`, once per policy, then runs one
single-process reference on the full batch (rank 0: lossless, rank 1: 8bit, so the two
references run in parallel) and saves everything to OUT_FILE for the test to compare.
"""
from __future__ import annotations

import sys
from datetime import timedelta

import torch
import torch.distributed as dist
import torch.nn.functional as F
from torch import nn
from torch.nn.parallel import DistributedDataParallel as DDP

import actcodec
from actcodec.torch import Policy, compress_saved

POLICIES = ("lossless", "8bit")
BATCH = 8          # full batch; each of the 2 ranks trains on BATCH // 2 samples
STEPS = 3
LR = 0.1
TIMEOUT = timedelta(seconds=60)   # a collective waiting longer than this raises


def make_model() -> nn.Module:
    """Sizes chosen so that, per sample, every saved activation that is large enough to be
    compressed (conv1 input 3*32*32, conv1 output 8*32*32, conv2 input 8*16*16, conv2 output
    16*16*16) is a whole number of 256-element quantization groups: then dense 8-bit groups of
    a rank's half batch are exactly the groups of the full batch (NCHW: the half batch is a
    contiguous prefix/suffix of the full one). Every compressed tensor is >= 16 KiB
    (Policy.min_bytes) per rank too, and the avgpool output (4 KiB per rank, 8 KiB full) is
    below it in both runs, so the ranks and the reference compress the same set of tensors.

    Normalization: plain BatchNorm in training mode would normalize each rank's half with its
    own statistics, which are not the full batch's, so DDP and a full-batch run would compute
    different functions; SyncBatchNorm raises on CPU tensors in torch 2.13 ("expected input
    tensor to be on GPU"). So the BatchNorm here is frozen (eval mode, non-trivial running
    statistics, affine parameters still trained: the common DDP fine-tuning setup), and the
    normalization that does depend on the activations is GroupNorm, whose statistics are per
    sample and therefore identical however the batch is split. Both save their input for
    backward, so both go through the hooks."""
    torch.manual_seed(0)
    model = nn.Sequential(
        nn.Conv2d(3, 8, 3, padding=1), nn.BatchNorm2d(8), nn.ReLU(), nn.MaxPool2d(2),
        nn.Conv2d(8, 16, 3, padding=1), nn.GroupNorm(4, 16), nn.ReLU(),
        nn.AvgPool2d(4), nn.Flatten(), nn.Linear(16 * 4 * 4, 10))
    bn = model[1]
    with torch.no_grad():
        bn.running_mean.uniform_(-0.2, 0.2)
        bn.running_var.uniform_(0.5, 2.0)
        bn.weight.uniform_(0.5, 1.5)
        # The shift sets the first ReLU's density (~0.25) and so the max pool output's
        # (~0.58): far from where the codec choice flips (bitmap+8-bit vs dense 8-bit at
        # ~0.88, bitmap vs raw at ~0.97), so each rank's half and the full batch pick the same
        # codecs. With a zero shift the pool output sat at 0.87, a coin flip between the two.
        bn.bias.uniform_(-0.5, -0.2)
    model.train()
    bn.eval()
    return model


def batch() -> tuple[torch.Tensor, torch.Tensor]:
    g = torch.Generator().manual_seed(1234)
    return torch.randn(BATCH, 3, 32, 32, generator=g), torch.randint(0, 10, (BATCH,), generator=g)


def train(model: nn.Module, x: torch.Tensor, y: torch.Tensor, preset: str,
          inner: nn.Module) -> list:
    """STEPS of SGD, each forward inside compress_saved(Policy.preset(preset)) (one Policy for
    the run: it counts the steps); the loss is the mean over the samples given. `inner` is
    the model without its DDP wrapper, for layer names that are the same in both runs.
    Returns what each step compressed: {"layer/op": {codec: count}}, kept and shared counts."""
    policy = Policy.preset(preset)
    params = list(inner.parameters())
    stats = []
    for _ in range(STEPS):
        for p in params:
            p.grad = None
        ctx = compress_saved(policy, model=inner)
        with ctx:
            loss = F.cross_entropy(model(x), y)
        loss.backward()
        with torch.no_grad():  # plain SGD, as torch.optim.SGD(lr=LR) does it (whose first
            for p in params:   # use imports torch._dynamo: seconds of start-up per process)
                p.add_(p.grad, alpha=-LR)
        s = ctx.stats
        stats.append({"rows": {f"{r.layer}/{r.op}": dict(r.codecs) for r in s.rows.values()},
                      "kept": s.kept, "deduplicated": s.deduplicated})
    return stats


def state(model: nn.Module) -> dict:
    return {k: v.detach().clone() for k, v in model.state_dict().items()}


def main(rank: int, world: int, port: int, out: str) -> None:
    torch.set_num_threads(1)
    actcodec.set_num_threads(1)
    x, y = batch()
    initial = make_model()
    result = {"initial": state(initial), "params": [n for n, _ in initial.named_parameters()]}

    store = dist.TCPStore("127.0.0.1", port, world, is_master=False, timeout=TIMEOUT)
    dist.init_process_group("gloo", store=store, rank=rank, world_size=world, timeout=TIMEOUT)
    per = BATCH // world
    mine = slice(rank * per, (rank + 1) * per)
    for name in POLICIES:
        model = make_model()
        ddp = DDP(model)  # gradients are averaged over the ranks
        result[f"ddp_{name}_stats"] = train(ddp, x[mine], y[mine], name, model)
        result[f"ddp_{name}"] = state(model)
    dist.barrier()
    dist.destroy_process_group()

    # The single-process reference for one policy: no DDP, the whole batch, the same steps.
    name = POLICIES[rank % len(POLICIES)]
    model = make_model()
    result[f"single_{name}_stats"] = train(model, x, y, name, model)
    result[f"single_{name}"] = state(model)
    torch.save(result, out)


if __name__ == "__main__":
    main(int(sys.argv[1]), int(sys.argv[2]), int(sys.argv[3]), sys.argv[4])
