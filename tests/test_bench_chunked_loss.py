"""bench/chunked_loss.py, the chunked loss's benchmark: every configuration computes the same
loss and gradients, each runs in a fresh process with a kernel-measured peak, and a
configuration that cannot run (Cut Cross-Entropy not installed) gets a row saying why."""
import importlib.util
from pathlib import Path

import pytest

torch = pytest.importorskip("torch")

BENCH = Path(__file__).resolve().parents[1] / "bench" / "chunked_loss.py"
TINY = dict(tokens=48, vocab=300, hidden_size=16, steps=2)


@pytest.fixture(scope="module")
def bench():
    spec = importlib.util.spec_from_file_location("bench_chunked_loss", BENCH)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_the_configurations_compute_the_same_loss(bench):
    plain = bench.worker("unchunked", cce_path=None, **TINY)
    chunked = bench.worker("chunked:5", cce_path=None, **TINY)
    assert chunked["loss"] == pytest.approx(plain["loss"], rel=1e-6)
    assert chunked["grad_norms"] == pytest.approx(plain["grad_norms"], rel=1e-5)
    assert len(chunked["times"]) == len(chunked["peaks"]) == 2
    assert min(chunked["peaks"]) >= chunked["floor"] > 0


def test_a_fresh_process_per_configuration_and_a_row_for_each(bench):
    class Args:
        tokens, vocab, hidden, steps, rounds, cce_path = 48, 300, 16, 2, 1, "/nonexistent"

    results = {c: [bench.run(c, Args)] for c in ("unchunked", "chunked:7")}
    results["cce"] = [{"config": "cce", "error": "import cut_cross_entropy: ModuleNotFoundError"}]
    text = bench.table(results, Args)
    rows = [line for line in text.splitlines() if line.startswith("| ")]
    assert [r.split(" | ")[0] for r in rows[1:]] == ["| unchunked", "| chunked:7", "| cce"]
    assert "1.00" in rows[1] and "ModuleNotFoundError" in rows[3]
