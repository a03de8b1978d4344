"""bench/save_host.py, the host's work per save on a GPU measured on the CPU: its saves do take
the device path (the deferred quant pass), the stand-ins launch no kernel, and the patches
are gone after it. In a process of its own: its steps, profiler and patches leave nothing in
this one (the heap's history is what test_resident.py reads)."""
import json
import subprocess
import sys
from pathlib import Path

import pytest

pytest.importorskip("torch")
pytest.importorskip("transformers")
pytest.importorskip("triton")

BENCH = Path(__file__).resolve().parents[1] / "bench" / "save_host.py"
CHECK = """
import importlib.util, json, sys
from actcodec.torch.codecs import fused
from actcodec.torch.codecs import packed as packing
before = (fused.applies, fused._launch, packing._host_path, packing._decode_into)
spec = importlib.util.spec_from_file_location("bench_save_host", sys.argv[1])
module = importlib.util.module_from_spec(spec)
spec.loader.exec_module(module)
launched = []
real = module.stand_in_launch
module.stand_in_launch = lambda kernel, *a, **k: (launched.append(kernel), real(kernel, *a, **k))
r = module.measure(layers=1, steps=1)
after = (fused.applies, fused._launch, packing._host_path, packing._decode_into)
print(json.dumps({"saves": r["saves"], "calls": r["calls"], "launched": len(launched),
                  "restored": after == before}))
"""


def test_saves_take_the_device_path_and_the_patches_go():
    done = subprocess.run([sys.executable, "-c", CHECK, str(BENCH)], capture_output=True,
                          text=True, timeout=600)
    assert done.returncode == 0, done.stderr[-2000:]
    r = json.loads(done.stdout.strip().splitlines()[-1])
    assert r["saves"] >= 8 and r["calls"] > 0  # a GPT-2 block's activations, deferred
    assert r["launched"] > 0  # every launch was a stand-in's
    assert r["restored"]
