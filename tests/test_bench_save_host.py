"""bench/save_host.py, the host's work per save on a GPU measured on the CPU: its saves do take
the device path (the deferred quant pass), the stand-ins launch no kernel, and the patches
are gone after it."""
import importlib.util
from pathlib import Path

import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("transformers")
pytest.importorskip("triton")

BENCH = Path(__file__).resolve().parents[1] / "bench" / "save_host.py"


def test_saves_take_the_device_path_and_the_patches_go():
    from actcodec.torch.codecs import fused
    from actcodec.torch.codecs import packed as packing
    before = (fused.applies, fused._launch, packing._host_path, packing._decode_into)
    spec = importlib.util.spec_from_file_location("bench_save_host", BENCH)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    launched = []
    real = module.stand_in_launch
    module.stand_in_launch = lambda kernel, *a, **k: (launched.append(kernel),
                                                      real(kernel, *a, **k))
    r = module.measure(layers=1, steps=1)
    assert r["saves"] >= 8 and r["calls"] > 0  # a GPT-2 block's activations, deferred
    assert launched  # every launch was a stand-in's
    assert (fused.applies, fused._launch, packing._host_path, packing._decode_into) == before
