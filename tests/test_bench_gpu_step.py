"""bench/gpu_step.py's arithmetic, without a GPU: the least time offloading takes on the link
between pinned host memory and the device, and where its table says it."""
import importlib.util
from pathlib import Path

import pytest

pytest.importorskip("torch")

spec = importlib.util.spec_from_file_location(
    "bench_gpu_step", Path(__file__).resolve().parents[1] / "bench" / "gpu_step.py")
gpu_step = importlib.util.module_from_spec(spec)
spec.loader.exec_module(gpu_step)


def test_the_offload_floor_is_its_bytes_over_the_link_each_way():
    link = {"to_host": 50.0, "to_device": 25.0}  # GB/s
    mib = 1000
    want = 1e3 * mib * 2**20 * (1 / 50e9 + 1 / 25e9)
    assert gpu_step.offload_floor_ms(mib, link) == pytest.approx(want, abs=0.05)


def test_the_table_names_the_link_and_the_offload_floor():
    row = {"limit_MiB": None, "peaks_MiB": [900], "step_ms": 300.0, "config": "offload"}
    res = {"gpu": "a GPU", "torch": "x", "shapes": {"gpt2": "16x1024"},
           "link": {"to_host": 50.0, "to_device": 50.0},
           "layouts": {"gpt2": [{**row, "config": "fp32", "step_ms": 100.0},
                                {**row, "offloaded_MiB": 4768}]}}
    text = gpu_step.markdown(res)
    assert "50.0 GB/s to the host, 50.0 GB/s back" in text
    floor = gpu_step.offload_floor_ms(4768, res["link"])
    assert f"4768 MiB each way a step: at least {floor} ms on the link" in text
    assert floor == pytest.approx(200.0, abs=0.1)
