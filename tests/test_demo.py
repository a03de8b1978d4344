"""`python -m actcodec demo` end to end on a tiny run: one fresh worker process per configuration,
the table, demo.md, demo.png and demo.json, and numbers that make sense."""
import builtins
import json

import pytest

pytest.importorskip("torch")  # the torch extra; CI installs it (and the demo's packages)

from actcodec.apps import demo, demo_table  # noqa: E402
from actcodec.__main__ import main  # noqa: E402

CONFIGS = ["fp32", "8bit", "checkpoint", "budget/8-halved"]


@pytest.fixture(scope="module")
def run(tmp_path_factory):
    out = tmp_path_factory.mktemp("demo")
    rc = main(["demo", "--task", "digits", "--quick", "--configs", ",".join(CONFIGS),
               "--out", str(out),
               "--threads", "1"])
    assert rc == 0
    with open(out / "demo.json") as f:
        return out, json.load(f)


def test_writes_table_markdown_plot(run):
    out, data = run
    md = (out / "demo.md").read_text()
    for name in CONFIGS:
        assert f"| {name} |" in md
    assert "| config | test acc |" in md and "Total run time" in md
    assert (out / "demo.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    assert [r["config"] for r in data["results"]] == CONFIGS
    assert data["total_seconds"] > 0


def test_numbers_are_sane(run):
    _, data = run
    r = {x["config"]: x for x in data["results"]}
    for x in r.values():
        assert 0.0 <= x["test_accuracy"] <= 1.0
        assert x["steps"] > 0 and x["step_ms"] > 0
        assert x["saved_bytes"] > 0 and x["peak_above_floor"] >= 0
        assert x["peak_rss"] >= x["floor_rss"] > 0
        assert x["saved_bytes_min"] <= x["saved_bytes"] <= x["saved_bytes_max"]
    # even the quick run learns: chance is 10%
    assert r["fp32"]["test_accuracy"] > 0.5 and r["8bit"]["test_accuracy"] > 0.5
    # the counting pass and the compressed context see the same tensors
    assert r["8bit"]["counted_bytes"] == r["fp32"]["counted_bytes"]
    assert r["8bit"]["original_bytes"] <= r["fp32"]["counted_bytes"]
    # 8-bit codes (or smaller) for every compressed tensor: at most about a quarter plus headers
    assert r["8bit"]["saved_bytes"] < 0.5 * r["fp32"]["saved_bytes"]
    assert r["8bit"]["codecs"]
    # checkpoint keeps only the blocks' inputs and what runs outside the blocks
    assert r["checkpoint"]["saved_bytes"] < r["fp32"]["saved_bytes"]
    # same seeds and batches; checkpoint recomputes exactly (BatchNorm statistics restored)
    assert r["checkpoint"]["weights_sha256"] == r["fp32"]["weights_sha256"]
    assert r["checkpoint"]["test_accuracy"] == r["fp32"]["test_accuracy"]


def test_a_budget_halved_while_training_runs(run):
    _, data = run
    r = {x["config"]: x for x in data["results"]}["budget/8-halved"]
    budgets, held = r["budget_bytes"], r["held_bytes"]
    assert len(budgets) == len(held) == r["steps"]
    assert max(budgets) == r["counted_bytes"] // 8 and min(budgets) == max(budgets) // 2
    assert budgets.index(min(budgets)) == r["steps"] // 2  # half-way through
    assert r["within_budget"] and all(h <= b for h, b in zip(held, budgets))
    assert r["test_accuracy"] > 0.5  # and it still learns
    assert "budget/8-halved:" in (run[0] / "demo.md").read_text()


def test_table_ratio_column():
    base = {"config": "fp32", "test_accuracy": 0.9, "saved_bytes": 100 * demo.MiB,
            "peak_rss": 500 * demo.MiB, "peak_above_floor": 120 * demo.MiB, "step_ms": 10.0}
    half = dict(base, config="8bit", saved_bytes=50 * demo.MiB, peak_above_floor=95 * demo.MiB)
    same = dict(base, config="lossless", saved_bytes=100 * demo.MiB + 1000)
    table = demo_table.format_table([base, half, same])
    rows = {line.split(" | ")[0].strip("| "): line for line in table.splitlines()[2:]}
    assert rows["fp32"].endswith("| n/a |")
    assert rows["8bit"].endswith("| 0.50 |")        # 25 MiB of 50 MiB computed showed up
    assert rows["lossless"].endswith("| n/a |")     # no computed savings: undefined


def test_unknown_config_is_a_clear_error():
    with pytest.raises(SystemExit, match="unknown policy preset '3bit'"):
        main(["demo", "--task", "digits", "--configs", "fp32,3bit"])


def test_a_budget_at_a_presets_bytes_is_a_configuration():
    from actcodec.apps import configs

    assert configs.budget_preset("budget/2bit") == "2bit"
    assert configs.budget_preset("budget/4") is None and configs.budget_fraction("budget/4") == 4
    assert demo._configs("fp32,budget/2bit,budget/8") == ["fp32", "budget/2bit", "budget/8"]
    with pytest.raises(SystemExit, match="budget/PRESET"):
        demo._configs("fp32,budget/3bit")


def test_missing_packages_name_the_extra(monkeypatch):
    real_import = builtins.__import__

    def no_sklearn(name, *args, **kwargs):
        if name == "sklearn":
            raise ImportError("No module named 'sklearn'")
        return real_import(name, *args, **kwargs)

    monkeypatch.setattr(builtins, "__import__", no_sklearn)
    with pytest.raises(SystemExit, match=r"scikit-learn.*pip install \"actcodec\[demo\]\""):
        demo.main(_args())


def _args():
    import argparse

    p = argparse.ArgumentParser()
    demo.add_arguments(p)
    return p.parse_args(["--quick"])


def test_the_limits_demo_trains_within_each_limit_it_accepts(tmp_path):
    """The default demo on a tiny model: plain, checkpointing, Step at the plain peak, 1/2,
    1/3 and the smallest limit it accepts, a limit too small refused; table, plot, JSON."""
    rc = main(["demo", "--quick", "--width", "32", "--size", "64", "--batch-size", "4",
               "--layers", "2", "--steps", "2", "--threads", "1", "--out", str(tmp_path)])
    assert rc == 0
    data = json.loads((tmp_path / "demo.json").read_text())
    runs = data["results"]
    assert [r["config"] for r in runs[:2]] == ["fp32", "checkpoint"]
    refused = runs[-1]
    assert refused["config"] == "limit=1MiB" and "leaves no room" in refused["error"]
    limited = [r for r in runs[2:-1] if "error" not in r]
    assert limited, runs
    for r in limited:
        assert r["within"] and len(r["step_peaks"]) == 2 and r["plan"]
        assert r["test_loss"] > 0
    assert (tmp_path / "demo.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    assert "| limit " in (tmp_path / "demo.md").read_text()
    # the second case: one long sample per step (a transformers Llama layout at batch 1)
    long_runs = data["long"]
    if long_runs:
        assert [r["config"] for r in long_runs[:2]] == ["fp32", "checkpoint"]
        assert long_runs[2]["config"].startswith("limit=")
        for r in long_runs[2:]:  # planned along the sequence: run within it, or refused
            assert r.get("within") or r.get("needed"), r
        assert "## One long sample per step" in (tmp_path / "demo.md").read_text()


def test_a_refused_try_at_the_named_smallest_shows_in_the_row_that_ran(monkeypatch, tmp_path):
    """The long case's search: the 1/2 run names a limit, a fresh first step refuses it and
    names more, the next try runs. The table has a row per limit that ran (the refused try
    in its plan column); a try refused with nothing after it stays a row of its own."""
    from actcodec.apps import demo_long

    MiB = 1 << 20

    def ran(config, limit=None, smallest=None):
        return {"config": config, "limit": limit, "step_peaks": [1], "peak": 1, "step_s": 1.0,
                "plan": "p" if limit else None, "within": True if limit else None,
                "smallest": smallest, "floor": 100 * MiB}

    answers = {"fp32": ran("fp32"), "checkpoint": ran("checkpoint")}
    answers["fp32"]["peak"] = 1000 * MiB
    answers["limit=550MiB"] = ran("limit=550MiB", 550 * MiB, smallest=300 * MiB)
    answers["limit=322MiB"] = {"config": "limit=322MiB", "limit": 322 * MiB,
                               "error": "no plan fits", "needed": 330 * MiB}
    answers["limit=352MiB"] = ran("limit=352MiB", 352 * MiB)
    monkeypatch.setattr(demo_long, "available", lambda: True)
    monkeypatch.setattr(demo_long, "_worker", lambda config, s, tmp: answers[config])
    rows = demo_long.parent({"layers": 1, "width": 8, "vocab": 16, "tokens": 8}, str(tmp_path))
    assert [r["config"] for r in rows] == ["fp32", "checkpoint", "limit=550MiB", "limit=352MiB"]
    assert "first tried at 322 MiB" in rows[-1]["searched"]
    assert "| refused:" not in demo_long.format_table(rows)
    del answers["limit=352MiB"]
    answers["limit=352MiB"] = {"config": "limit=352MiB", "limit": 352 * MiB,
                               "error": "no plan fits", "needed": 400 * MiB}
    rows = demo_long.parent({"layers": 1, "width": 8, "vocab": 16, "tokens": 8}, str(tmp_path))
    assert [r["config"] for r in rows][2:] == ["limit=550MiB", "limit=322MiB", "limit=352MiB"]
