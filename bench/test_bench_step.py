"""pytest-benchmark suite for one training step (forward and backward) of the real clients in
bench/clients.py (transformers models from a config), plain and under actcodec's presets. Run:
    pytest bench/test_bench_step.py --benchmark-group-by=param:model
The report's ratios come from `python bench/report.py --sections step` (interleaved rounds)."""
import copy

import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("transformers")

import clients  # noqa: E402
import step  # noqa: E402


@pytest.fixture(scope="module", params=clients.MODELS)
def model(request):
    base, loss_fn = clients.build(request.param)
    return request.param, base, loss_fn


@pytest.mark.parametrize("config", ["fp32", "8bit", "2bit", "budget/8"])
def test_step(benchmark, model, config):
    _, base, loss_fn = model
    m = copy.deepcopy(base).train()
    ctx = step._context(config, m, loss_fn)
    benchmark.pedantic(step.step, args=(m, loss_fn, config, ctx), rounds=3, warmup_rounds=1)
