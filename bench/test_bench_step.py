"""pytest-benchmark suite for one training step of the ResNet-18-style CNN (batch 64,
3x64x64, 2 threads): fp32, actcodec's 8-bit and 2-bit policies through the hooks, the naive
eager-torch quantizer through the same hooks, and torch.utils.checkpoint. Run:
    pytest bench/test_bench_step.py
The README's step table comes from `python -m actcodec.torch.stepbench` (interleaved rounds,
saved bytes counted exactly)."""
import pytest

torch = pytest.importorskip("torch")

from actcodec.torch import stepbench  # noqa: E402
from actcodec.torch.models import ResNet18  # noqa: E402


@pytest.fixture(scope="module")
def setup():
    torch.set_num_threads(2)
    torch.manual_seed(0)
    model = ResNet18()
    x, y = torch.randn(64, 3, 64, 64), torch.randint(0, 10, (64,))
    opt = torch.optim.SGD(model.parameters(), lr=0.0)
    return model, x, y, opt, stepbench.configs(model)


@pytest.mark.parametrize("config", ["fp32", "actcodec 8bit", "actcodec 2bit", "convert 8bit",
                                    "convert 2bit",
                                    "naive torch 8-bit", "naive torch 2-bit", "checkpoint"])
def test_step(benchmark, setup, config):
    model, x, y, opt, configs = setup
    module, ctx, _ = configs[config]
    benchmark.pedantic(stepbench.step, args=(module, ctx, x, y, opt), rounds=3,
                       warmup_rounds=1)
