"""The demo's output: one configuration's runs over its seeds put together, the table (printed
and demo.md), the notes under it and the plot (demo.png)."""
from __future__ import annotations

import statistics

from . import demo_digits, demo_text

MiB = 2**20


def aggregate(runs: list[dict]) -> dict:
    """One configuration over its seeds: means of accuracy, bytes and memory, the median of
    the step times, the accuracy range, and every run as it was."""
    out = dict(runs[0])
    for key in ("test_accuracy", "test_loss", "saved_bytes", "peak_rss", "peak_above_floor",
                "floor_rss"):
        out[key] = statistics.mean(r[key] for r in runs)
    out["step_ms"] = statistics.median(r["step_ms"] for r in runs)
    out["saved_bytes_min"] = min(r["saved_bytes_min"] for r in runs)
    out["saved_bytes_max"] = max(r["saved_bytes_max"] for r in runs)
    out["accuracies"] = [r["test_accuracy"] for r in runs]
    out["weights_sha256"] = [r["weights_sha256"] for r in runs]
    out["peak_reset"] = all(r["peak_reset"] for r in runs)
    out["runs"] = runs
    return out


def _ratio(r: dict, base: dict | None) -> float | None:
    if base is None or r is base:
        return None
    computed = base["saved_bytes"] - r["saved_bytes"]
    if abs(computed) < MiB:
        return None
    return (base["peak_above_floor"] - r["peak_above_floor"]) / computed


def format_table(results: list[dict]) -> str:
    base = next((r for r in results if r["config"] == "fp32"), None)
    seeds = max(len(r.get("accuracies", [0])) for r in results)
    head = ["config", "test acc" if seeds == 1 else f"test acc (mean of {seeds})", "vs fp32",
            "test loss", "saved MiB/step", "saved vs fp32", "peak RSS MiB",
            "peak above floor MiB", "step ms", "measured/computed"]
    if seeds > 1:
        head.insert(2, "acc min-max")
    lines = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    for r in results:
        ratio = _ratio(r, base)
        gap = "-" if base is None or r is base else \
            f"{(r['test_accuracy'] - base['test_accuracy']) * 100:+.2f} pts"
        rel = "-" if base is None or r is base else f"{r['saved_bytes'] / base['saved_bytes']:.2f}x"
        loss = f"{r['test_loss']:.4f}" if "test_loss" in r else "-"
        cells = [r["config"], f"{r['test_accuracy'] * 100:.2f}%", gap, loss,
                 f"{r['saved_bytes'] / MiB:.1f}", rel, f"{r['peak_rss'] / MiB:.0f}",
                 f"{r['peak_above_floor'] / MiB:.0f}", f"{r['step_ms']:.0f}",
                 "n/a" if ratio is None else f"{ratio:.2f}"]
        if seeds > 1:
            accs = r.get("accuracies", [r["test_accuracy"]])
            cells.insert(2, f"{min(accs) * 100:.2f}-{max(accs) * 100:.2f}%")
        lines.append("| " + " | ".join(cells) + " |")
    return "\n".join(lines)


def notes(results: list[dict], s: dict, total: float) -> str:
    """The paragraphs under the table: the task and settings, the allocator, divergences,
    budgets, and how the numbers were measured."""
    r0 = results[0]
    base = next((r for r in results if r["config"] == "fp32"), None)
    same = [r["config"] for r in results
            if base is not None and r is not base and r["weights_sha256"] == base["weights_sha256"]]
    if s.get("task") == "text":
        task = (f"Text: the standard library's pydoc_data topics, {r0['train_images']} train / "
                f"{r0['test_images']} test windows of {s['size']} bytes (every "
                f"{demo_text.HELD_OUT_EVERY}th topic held out); byte-level language model of "
                f"width {s['width']}; test acc: next-byte accuracy, test loss: nats per byte; "
                f"batch {s['batch_size']}, ")
    else:
        task = (f"Digits (scikit-learn), {r0['train_images']} train / {r0['test_images']} test "
                f"images upsampled to {s['size']}x{s['size']}; CNN width {s['width']}, batch "
                f"{s['batch_size']}, ")
    lines = [
        task +
        f"{s['epochs']} epochs ({r0['steps']} steps), {s['threads']} threads, split seed "
        f"{demo_digits.SEED}, "
        f"training seed{'s 0-' + str(s['seeds'] - 1) if s['seeds'] > 1 else ' 0'}; "
        f"every configuration in its own fresh process. torch {r0['torch']}, actcodec "
        f"{r0['actcodec']}. Total run time {total:.0f} s.",
    ]
    if same:
        lines.append(f"Final weights bit-identical to fp32: {', '.join(same)}.")
    if s["allocator"] == "store":
        lines.append("Allocator: actcodec.torch.allocator installed in every configuration "
                     "(--allocator store): torch's large CPU tensors take pages of the store.")
    else:
        lines.append("Allocator: fp32 and checkpoint run on the process's own (glibc at its "
                     "defaults unless you preload another); the compressed configurations on "
                     "actcodec's, which compress_saved installs on first use; nothing set in "
                     "the environment.")
    diverged = [f"{r['config']} at step {r['diverged_at_step']}" for r in results
                if r.get("diverged_at_step") is not None]
    if diverged:
        lines.append("Diverged (loss or activations no longer finite; training stopped there): "
                     + ", ".join(diverged) + ".")
    budgeted = [r for r in results if r.get("budget_bytes")]
    if budgeted:
        lines.append("Budgets: " + "; ".join(
            f"{r['config']}: {max(r['budget_bytes']) / MiB:.2f} MiB"
            + (f" then {min(r['budget_bytes']) / MiB:.2f}" if r["config"].endswith("-halved")
               else "")
            + f", held at most {max(r['held_bytes']) / MiB:.2f}, "
            + ("within it at every step" if r["within_budget"] else "NOT within it")
            + f" ({r['reencoded']} re-encoded, {r['paged_out']} paged out in all)"
            for r in budgeted) + ".")
    if not all(r["peak_reset"] for r in results):
        lines.append("The kernel's peak-RSS reset (/proc/self/clear_refs) was not available: "
                     "'above floor' is the lifetime peak minus the floor.")
    lines.append(
        "saved MiB/step: unique saved non-parameter tensors per step (compressed: SavedStats' "
        "exact bytes, mean over steps, plus the tensors kept as they are; fp32 and checkpoint: "
        "a counting-only saved_tensors_hooks pass). Floor: RSS with data, model and optimizer "
        "built, before training. measured/computed = (peak above floor of fp32 - config) / "
        "(saved of fp32 - config); n/a where undefined.")
    return "\n\n".join(lines)


def plot(results: list[dict], path: str) -> None:
    """Accuracy against peak memory above the floor, and the step times, into `path`."""
    from matplotlib.figure import Figure

    fig = Figure(figsize=(11, 4.2), layout="constrained")
    ax1, ax2 = fig.subplots(1, 2)
    placed: list = []
    for r in results:
        xv, yv = r["peak_above_floor"] / MiB, r["test_accuracy"] * 100
        accs = [a * 100 for a in r.get("accuracies", [r["test_accuracy"]])]
        if len(accs) > 1:  # the seeds' range
            ax1.errorbar(xv, yv, yerr=[[yv - min(accs)], [max(accs) - yv]], fmt="none",
                         ecolor="gray", alpha=0.5, capsize=3)
        ax1.scatter(xv, yv, s=40)
        # Points that coincide (8bit and auto, say) get their labels stacked, not overprinted.
        stack = sum(1 for px, py in placed if abs(px - xv) < 3 and abs(py - yv) < 0.1)
        placed.append((xv, yv))
        ax1.annotate(r["config"], (xv, yv), textcoords="offset points",
                     xytext=(5, 4 + 11 * stack), fontsize=9)
    ax1.set_xlabel("peak RSS above the pre-training floor (MiB)")
    ax1.set_ylabel("test accuracy (%)")
    ax1.set_title("accuracy vs training memory")
    ax1.grid(alpha=0.3)
    names = [r["config"] for r in results]
    ax2.bar(names, [r["step_ms"] for r in results], color="tab:gray")
    ax2.set_ylabel("median ms per training step")
    ax2.set_title("step time")
    ax2.tick_params(axis="x", rotation=30)
    ax2.grid(axis="y", alpha=0.3)
    fig.savefig(path, dpi=110)
