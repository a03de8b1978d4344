"""bench/gpu_profile.py runs (on the CPU, at a tiny size: its device figures need a GPU): a
profile per configuration, Step's plan with it. In a process of its own: the profiler's
threads and buffers stay out of this one."""
import subprocess
import sys
from pathlib import Path

import pytest

pytest.importorskip("torch")
pytest.importorskip("transformers")

BENCH = Path(__file__).resolve().parents[1] / "bench" / "gpu_profile.py"


def test_profiles_each_configuration(tmp_path):
    out = tmp_path / "profile.txt"
    done = subprocess.run([sys.executable, str(BENCH), str(out), "--cpu", "--configs",
                           "plain,limit,8bit", "--trace", str(tmp_path)],
                          capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stderr[-2000:]
    text = out.read_text()
    assert "Traceback" not in text, text[-2000:]
    for config in ("plain", "limit", "8bit"):
        assert f"## {config}: wall" in text
        assert (tmp_path / f"trace_{config}.json.gz").stat().st_size > 0
    assert "plan: 1 micro-batch(es)" in text
