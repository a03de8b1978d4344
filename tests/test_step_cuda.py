"""act.Step on a CUDA device (skipped without one): every step's peak reserved memory under
the limit, probes included (sampled from a thread, and as Step reads it), exact gradients;
limit="free"; a limit above the device's memory warns. The device-independent parts (the
meter's interface, the offload's bookkeeping) are tested on the CPU in test_meter.py and
test_offload.py."""
import importlib.util
from pathlib import Path

import pytest
import torch

import actcodec.torch as act

pytestmark = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
MiB = 1 << 20


def gpt2(positions: int = 1024):
    tf = pytest.importorskip("transformers")
    tf.logging.set_verbosity_error()
    torch.manual_seed(0)
    cfg = tf.GPT2Config(n_layer=4, n_embd=256, n_head=4, vocab_size=2048, resid_pdrop=0.0,
                        embd_pdrop=0.0, attn_pdrop=0.0, n_positions=positions)
    return tf.GPT2LMHeadModel(cfg).cuda().train()


def flat_grad(m):
    return torch.cat([p.grad.flatten() for p in m.parameters()])


def plain_step(m, batch):
    """(allocated bytes before, peak reserved bytes, the gradient) of a plain step."""
    torch.cuda.synchronize()
    torch.cuda.empty_cache()
    floor = torch.cuda.memory_allocated()
    torch.cuda.reset_peak_memory_stats()
    m(**batch).loss.backward()
    plain_peak = torch.cuda.max_memory_reserved()
    plain = flat_grad(m).clone()
    m.zero_grad(set_to_none=True)
    return floor, plain_peak, plain


def sampler():
    """bench/gpu_step.py's Sampler: the device's reserved bytes sampled by a thread, a reading
    Step does not make (it resets the device's own peak counter itself)."""
    spec = importlib.util.spec_from_file_location(
        "bench_gpu_step", Path(__file__).resolve().parents[1] / "bench" / "gpu_step.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module.Sampler()


def exact_to(m, plain, step) -> None:
    cos = torch.nn.functional.cosine_similarity(flat_grad(m).double(), plain.double(), dim=0)
    assert cos >= 0.99999, (float(cos), step.describe())


def steps_within(m, step, batch, limit, plain, before, device_counter) -> None:
    """Three steps (`before()` ahead of each): each one's reserved bytes sampled from outside,
    Step's own reading (its probes included) and `device_counter()` after it under the
    limit; each gradient plain's."""
    with sampler() as seen:
        for _ in range(3):
            before()
            seen.take()
            step(batch)
            peak = seen.take()
            assert peak <= limit, (peak / MiB, limit / MiB, step.describe())
            assert step.stats.peak <= limit, (step.stats, step.describe())
            assert device_counter() <= limit, step.describe()
            exact_to(m, plain, step)
            m.zero_grad(set_to_none=True)


def test_step_on_cuda_keeps_every_peak_under_the_limit_and_is_exact():
    m = gpt2()
    ids = torch.randint(0, 2048, (16, 512), device="cuda")
    batch = {"input_ids": ids, "labels": ids}
    floor, plain_peak, plain = plain_step(m, batch)
    limit = floor + plain.numel() * 4 + (plain_peak - floor) // 3
    step = act.Step(m, limit=limit, exact=True)
    steps_within(m, step, batch, limit, plain, torch.cuda.empty_cache,
                 torch.cuda.memory_reserved)
    assert step.plan.micro_batches > 1 or step.plan.recompute or step.plan.storage != "plain"


def test_limit_free_and_a_limit_above_the_device():
    m = gpt2()
    ids = torch.randint(0, 2048, (4, 128), device="cuda")
    step = act.Step(m, limit="free", exact=True)
    step({"input_ids": ids, "labels": ids})
    free, total = torch.cuda.mem_get_info()
    assert step.stats.limit <= total
    step.limit = total * 4
    with pytest.warns(RuntimeWarning, match="above what cuda"):
        step({"input_ids": ids, "labels": ids})


def test_one_long_sequence_on_cuda_is_planned_along_it_with_its_moments():
    # batch 1: probes along the sequence, each block's moment in backward from the allocated
    # bytes' own peak (meter.CudaMeter.live_peak); every step under a limit plain exceeds
    m = gpt2(positions=4096)  # GPT-2's positions end at n_positions: past them, an index error
    ids = torch.randint(0, 2048, (1, 4096), device="cuda")
    batch = {"input_ids": ids, "labels": ids}
    floor, plain_peak, plain = plain_step(m, batch)
    limit = floor + plain.numel() * 4 + (plain_peak - floor - plain.numel() * 4) // 2
    step = act.Step(m, limit=limit, exact=True)
    # the device's counter since the step's last reset of it
    steps_within(m, step, batch, limit, plain, torch.cuda.reset_peak_memory_stats,
                 torch.cuda.max_memory_reserved)
    assert step.profile.unit == "token"
    assert all(b.moment is not None for b in step.profile.blocks), step.profile
