"""`python -m actcodec memory`: fresh processes per configuration, exact saved bytes, and the
budget lines (a budget run against the plain floor and offload, a step holding nothing)."""
import json
import subprocess
import sys

import pytest

pytest.importorskip("torch")  # the torch extra; CI installs it

from actcodec.apps import memory  # noqa: E402

MiB = 1 << 20


def test_budget_runs_keep_their_budget_and_offload_holds_nothing(tmp_path):
    out = tmp_path / "memory.json"
    proc = subprocess.run(
        [sys.executable, "-m", "actcodec", "memory", "--model", "cnn",
         "--sizes", "batch=8,size=32,width=8", "--configs", "fp32,budget/4,offload",
         "--steps", "1", "--warm-up", "2", "--threads", "1", "--json", str(out)],
        capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr
    runs = {r["config"]: r for r in json.loads(out.read_text())["results"]}
    assert runs["fp32"]["budget"] is None and runs["fp32"]["saved_bytes"] > 0
    assert 0 < runs["budget/4"]["budget"] == runs["fp32"]["saved_bytes"] // 4
    assert runs["budget/4"]["saved_bytes"] <= runs["budget/4"]["budget"]
    # offload pages every payload out; what it still holds are tensors under the policy's
    # min_bytes, kept as they are (the classifier's small inputs)
    assert runs["offload"]["budget"] == 0
    assert runs["offload"]["saved_bytes"] < runs["fp32"]["saved_bytes"] // 20
    assert "budget/4: budget" in proc.stdout and "offload's peak above the floor" in proc.stdout


def test_budget_lines_split_the_peak_against_the_floor_and_offload():
    def run(config, peak, budget=None, floor=None):
        return {"config": config, "peak_rss": peak * MiB, "floor_live": floor and floor * MiB,
                "budget": budget and budget * MiB, "saved_bytes": (budget or 0) * MiB}
    results = [run("fp32+store", 900, floor=500), run("budget/8+store", 820, budget=50),
               run("offload+store", 810, budget=0), run("budget/8", 990, budget=50)]
    lines = memory.budget_lines(results)
    assert lines[0].startswith("budget/8+store: budget 50 MiB")
    assert "above the plain floor 320 MiB = the budget + 270" in lines[0]
    assert "working set (offload's peak above the floor) 310 MiB" in lines[0]
    assert "budget + working set 360 MiB" in lines[0]
    assert lines[1].startswith("offload+store: budget 0 MiB") and "offload's" not in lines[1]
    assert len(lines) == 2  # budget/8 under glibc has no plain run beside it


def test_configuration_suffixes_are_store_or_heap():
    from actcodec.apps import configs

    for ok in ("8bit", "8bit+heap", "fp32+store", "budget/4+heap"):
        configs.check(ok)
    with pytest.raises(SystemExit, match="suffix"):
        configs.check("8bit+stor")


def test_limit_runs_report_every_steps_peak_against_the_limit(tmp_path):
    out = tmp_path / "memory.json"
    proc = subprocess.run(
        [sys.executable, "-m", "actcodec", "memory", "--model", "cnn",
         "--sizes", "batch=8,size=16,width=8", "--configs", "limit=64GiB,limit=1MiB",
         "--steps", "1", "--threads", "1", "--json", str(out)],
        capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr
    runs = {r["config"]: r for r in json.loads(out.read_text())["results"]}
    run = runs["limit=64GiB"]
    assert run["within"] and len(run["step_peaks"]) == 2 and "micro-batch" in run["plan"]
    assert "limit=1MiB" not in runs and "no plan fits a limit of 1.0 MiB" in proc.stdout


def test_a_limit_that_is_not_a_size_is_refused_before_any_worker_runs():
    from actcodec.apps import configs

    with pytest.raises(SystemExit, match="limit=lots"):
        configs.check("limit=lots")
