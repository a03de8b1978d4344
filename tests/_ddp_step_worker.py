"""One rank of tests/test_torch_ddp.py's Step test, run as a script (not collected):

    python _ddp_step_worker.py RANK WORLD_SIZE STORE_PORT OUT_FILE

Each rank trains its half of a batch under DDP (gloo, CPU) through act.Step in 3
micro-batches, and plainly; a comm hook counts the all-reduces of each. Saved: the counts and
the gradients of both."""
from __future__ import annotations

import sys
from datetime import timedelta

import torch
import torch.distributed as dist
import torch.nn.functional as F
from torch import nn
from torch.nn.parallel import DistributedDataParallel as DDP

import actcodec.torch as act

TIMEOUT = timedelta(seconds=60)


def main(rank: int, world: int, port: int, out: str) -> None:
    store = dist.TCPStore("127.0.0.1", port, world, is_master=False, timeout=TIMEOUT)
    dist.init_process_group("gloo", store=store, rank=rank, world_size=world, timeout=TIMEOUT)
    torch.manual_seed(0)
    model = DDP(nn.Sequential(nn.Linear(8, 32), nn.GELU(), nn.Linear(32, 1)))
    calls = []

    def counting(state, bucket):
        calls.append(1)
        fut = dist.all_reduce(bucket.buffer().div_(world), async_op=True).get_future()
        return fut.then(lambda f: f.value()[0])

    model.register_comm_hook(None, counting)
    g = torch.Generator().manual_seed(1)
    x, y = torch.randn(12 * world, 8, generator=g), torch.randn(12 * world, generator=g)
    x, y = x[rank * 12:(rank + 1) * 12], y[rank * 12:(rank + 1) * 12]

    def mse(m, b):
        return F.mse_loss(m(b[0]).squeeze(-1), b[1])

    act.Step(model, loss_fn=mse, plan={"micro_batches": 3})((x, y))
    step_calls = len(calls)
    step_grads = [p.grad.clone() for p in model.parameters()]
    model.zero_grad(set_to_none=True)
    calls.clear()
    mse(model, (x, y)).backward()
    torch.save({"step_calls": step_calls, "plain_calls": len(calls), "step": step_grads,
                "plain": [p.grad.clone() for p in model.parameters()]}, out)
    dist.barrier()  # no rank tears the group down while another still talks through it
    del model
    dist.destroy_process_group()


if __name__ == "__main__":
    main(int(sys.argv[1]), int(sys.argv[2]), int(sys.argv[3]), sys.argv[4])
