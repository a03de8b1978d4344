"""The step benchmark's code path on a tiny batch: every configuration runs, and the exact
saved-byte counts order as they must."""
import pytest

pytest.importorskip("torch")

from actcodec.torch import stepbench  # noqa: E402


def test_stepbench_tiny():
    rows = {r["config"]: r for r in stepbench.run(batch=2, size=32, rounds=1, threads=1)}
    assert set(rows) == {"fp32", "actcodec 8bit", "actcodec 2bit", "convert 8bit", "convert 2bit",
                         "naive torch 8-bit",
                         "naive torch 2-bit", "checkpoint"}
    saved = {k: r["saved_MiB"] for k, r in rows.items()}
    assert saved["actcodec 2bit"] < saved["actcodec 8bit"] < saved["fp32"]
    assert saved["naive torch 2-bit"] < saved["naive torch 8-bit"] < saved["fp32"]
    assert saved["checkpoint"] < saved["fp32"]
    assert saved["convert 2bit"] < saved["convert 8bit"] < saved["fp32"]
    assert rows["fp32"]["time_vs_fp32"] == 1.0 and rows["fp32"]["round_ratio"] == 1.0
    assert all(r["round_ratio_q1"] <= r["round_ratio"] <= r["round_ratio_q3"] for r in rows.values())
    assert "| actcodec 2bit |" in stepbench.markdown(list(rows.values()), 2, 32, 1)


def test_stepbench_without_fp32_still_prints():
    rows = stepbench.run(batch=2, size=32, rounds=2, threads=1, names=["actcodec 2bit"])
    assert rows[0]["time_vs_fp32"] is None and rows[0]["round_ratio"] is None
    assert "| actcodec 2bit |" in stepbench.markdown(rows, 2, 32, 1)
