"""Markdown and PNG for the codec report (bench_report.Report). The markdown quotes ratios
measured in one interleaved run; absolute milliseconds sit in the last column only."""
from __future__ import annotations

import os

from .bench_report import ALTERNATIVES, CODECS, Report

TITLES = {
    "raw": "raw (stored as is)",
    "bitmap": "bitmap (lossless, ReLU-sparse)",
    "quant": "quant (k-bit, group 256, nearest; dense N(0,1) input)",
    "bitmap_quant": "bitmap_quant (bitmap + k-bit nonzero values, group 256)",
    "auto": "auto (the smallest encoding `bits` allows)",
}
_SHORT = {"float32": "f32", "float16": "f16"}


def speedup(s) -> str:
    """Another's time over ours as words: 3.0 -> '3.0x faster', 0.5 -> '2.0x slower'."""
    if s is None:
        return "-"
    v = s if s >= 1 else 1 / s
    num = f"{v:.2f}" if v < 2 else f"{v:.1f}"
    return f"{num}x {'faster' if s >= 1 else 'slower'}"


def _codec_table(rows) -> list[str]:
    params = list(dict.fromkeys(k for r in rows for k in r.params))
    alt_cols = []  # (label, op) with at least one value
    for label in dict.fromkeys(a for r in rows for a in r.alts):
        for op in ("encode", "decode"):
            if any(r.alts.get(label, {}).get(op) is not None for r in rows):
                alt_cols.append((label, op))
    notes = list(dict.fromkeys(k for r in rows for k in r.notes))
    head = (["dtype", "memory", *params, "size ratio", "encode / copy", "decode / copy"]
            + [f"{op} vs {label}" for label, op in alt_cols] + notes
            + ["ms: copy, enc, dec"])
    lines = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    for r in rows:
        cells = ([r.dtype, r.memory] + [r.params.get(p, "-") for p in params]
                 + [f"{r.ratio:.2f}x", f"{r.vs_copy['encode']:.2f}", f"{r.vs_copy['decode']:.2f}"]
                 + [speedup(r.alts.get(label, {}).get(op)) for label, op in alt_cols]
                 + [r.notes.get(n, "-") for n in notes]
                 + [f"{r.ms['copy']:.1f}, {r.ms['encode']:.1f}, {r.ms['decode']:.1f}"])
        lines.append("| " + " | ".join(cells) + " |")
    return lines


def _reduce_table(rows) -> list[str]:
    lines = ["| dtype | strategy | time / copy | vs torch.aminmax | vs numpy min+max | "
             "ms: copy, ours, torch, numpy |", "|---|---|---|---|---|---|"]
    for r in rows:
        torch_ms = f"{r['torch_ms']:.1f}" if r["torch_ms"] is not None else "-"
        lines.append(
            f"| {r['dtype']} | {r['strategy']} | {r['ms'] / r['copy_ms']:.2f} | "
            f"{speedup(r['vs_torch'])} | {speedup(r['vs_numpy'])} | {r['copy_ms']:.1f}, "
            f"{r['ms']:.1f}, {torch_ms}, {r['numpy_ms']:.1f} |")
    return lines


def markdown(rep: Report, command: str = "python -m actcodec bench") -> str:
    m = rep.machine
    v = m["versions"]
    load = lambda t: "/".join(f"{x:.2f}" for x in t) if t else "?"  # noqa: E731
    out = [
        "# actcodec codec report",
        "",
        f"`{command}`: {rep.mib} MiB per array ({', '.join(rep.dtypes)}), {rep.rounds} "
        f"interleaved round{'s' * (rep.rounds != 1)} per row, memory regimes "
        f"{', '.join(rep.regimes)}; {m['date']}, "
        f"{rep.seconds:.0f} s in all.",
        "",
        f"Machine: {m['cpu']}, {m['cores']} logical cores, {m['system']}; actcodec "
        f"{m['path']} path, {m['threads']} threads (OpenMP {'on' if m['openmp'] else 'off'}), "
        f"{'bit-trick' if m['bittrick_default'] else 'cast'} conversion by default; torch and "
        f"Numba on the same {m['threads']} threads. Load average (1/5/15 min) "
        f"{load(m['load'])} at the start, {load(rep.load_end)} at the end.",
        "",
        "Versions: " + ", ".join(f"{k} {val}" for k, val in v.items()) + ".",
        "",
        "How to read: each row is one run of `time_interleaved`: every candidate of the row (our "
        "encode and decode, a threaded copy of the same array, the alternatives) once per "
        "round in a fresh random order, on the same input; medians. `X / copy` is our time "
        "over the copy's (lower is better, 1.00 is as fast as copying the array); "
        "`vs Y` is Y's time over ours, in words. \"fresh\": every output gets newly mapped "
        "pages, so first-touch page faults are part of every call, the copy's included; "
        "\"reused\": the allocator hands freed memory back (a training loop's steady state). "
        "Size ratio: original bytes / payload bytes. Milliseconds (last column) are for "
        "orientation only; quote the ratios. Floors, timed in the same rounds: `read` is one "
        "threaded pass that only reads the input (the C core's min/max), the least an encoder "
        "that looks at every element can take; `fill` a threaded memset of a new output of the "
        "decoded size, allocated as our decode's is and, into new pages, written as our "
        "decoders write (each 2 MiB huge page faulted at its end first), the least a decoder "
        "can spend on writing it. `fill / copy` is therefore the lowest `decode / copy` any "
        "decoder could show in that row; in the fresh regime it is mostly the kernel's page "
        "faults.",
    ]
    for codec in CODECS:
        rows = [r for r in rep.rows if r.codec == codec]
        if not rows:
            continue
        out += ["", f"## {TITLES[codec]}", "", *_codec_table(rows)]
        labels = list(dict.fromkeys(a for r in rows for a in r.alts))
        if labels:
            out.append("")
            out += [f"- vs {label}: {ALTERNATIVES[(codec, label)]}" for label in labels]
        if codec == "quant":
            out.append("- trick / cast: whole-codec time with DAF's bit-trick conversion over "
                       "plain casts (both bit-identical).")
            out.append("- torch eager / read: eager torch's encode time over the read pass "
                       "(below), so the largest speedup over eager torch that any encoder "
                       "reading every element could show in that row.")
            if "torchao pack" not in labels:
                out.append(f"- torchao: {v['torchao']}.")
            if "bitsandbytes" not in labels:
                out.append(f"- bitsandbytes: {v['bitsandbytes']}.")
    out += ["", "## min/max reduction (actcodec.reduce, Numba; and the C core's pass)", ""]
    if isinstance(rep.reduce, str):
        out.append(rep.reduce)
    else:
        out += [("Input: dense N(0,1) arrays; `time / copy` as above; `vs Y`: Y's time over "
                 "ours. numpy's float16 min/max is scalar code."), "", *_reduce_table(rep.reduce)]
    return "\n".join(out) + "\n"


_COLORS = {"copy": "#7f7f7f", "numpy": "#1f77b4", "torch": "#ff7f0e",
           "torch eager": "#ff7f0e", "bitsandbytes": "#2ca02c", "torchao pack": "#d62728",
           "numpy + torch eager": "#9467bd", "direct call": "#8c564b",
           "torch.aminmax": "#ff7f0e", "numpy min+max": "#1f77b4"}


def _bars(ax, labels, series, title):
    """Grouped bars: series is {comparator: [speedup or None per label]}, log scale."""
    import numpy as np
    from matplotlib.ticker import FuncFormatter

    names = [n for n, vals in series.items() if any(v is not None for v in vals)]
    width = 0.8 / max(len(names), 1)
    xs = np.arange(len(labels))
    for i, name in enumerate(names):
        vals = [np.nan if v is None else v for v in series[name]]
        ax.bar(xs + (i - (len(names) - 1) / 2) * width, vals, width, label=f"vs {name}",
               color=_COLORS.get(name))
    ax.axhline(1.0, color="black", linewidth=0.8)
    ax.set_yscale("log")
    ratio = FuncFormatter(lambda v, _: f"{v:g}x")
    ax.yaxis.set_major_formatter(ratio)
    ax.yaxis.set_minor_formatter(FuncFormatter(lambda v, _: f"{v:g}x" if f"{v:.0e}"[0] in "25"
                                               else ""))
    ax.set_xticks(xs)
    ax.set_xticklabels(labels, rotation=60, ha="right", fontsize=7)
    ax.set_title(title, fontsize=10)
    ax.set_ylabel("speedup (their time / ours)", fontsize=8)
    ax.legend(fontsize=7, loc="upper left")
    ax.grid(axis="y", which="both", alpha=0.3)


def png(rep: Report, path: str) -> str | None:
    """A bar chart per codec and direction of the speedups against the copy and every
    alternative (> 1: ours is faster). Returns None, or why there is no PNG."""
    try:
        from matplotlib.figure import Figure
    except ImportError:
        return "matplotlib is not installed (pip install matplotlib): no PNG written"
    panels = []
    for codec in CODECS:
        rows = [r for r in rep.rows if r.codec == codec]
        if not rows:
            continue
        labels = [" ".join([_SHORT.get(r.dtype, r.dtype), r.memory,
                            *(v if k == "zeros" or v == "lossless" else f"k={v}"
                              for k, v in r.params.items())])
                  for r in rows]
        alts = list(dict.fromkeys(a for r in rows for a in r.alts))
        for op in ("encode", "decode"):
            series = {"copy": [1 / r.vs_copy[op] for r in rows]}
            series.update({a: [r.alts.get(a, {}).get(op) for r in rows] for a in alts})
            panels.append((labels, series, f"{codec}: {op}"))
    if not isinstance(rep.reduce, str):
        rr = rep.reduce
        panels.append(([f"{_SHORT.get(r['dtype'], r['dtype'])} {r['strategy']}" for r in rr],
                       {"copy": [r["vs_copy"] for r in rr],
                        "torch.aminmax": [r["vs_torch"] for r in rr],
                        "numpy min+max": [r["vs_numpy"] for r in rr]}, "min/max reduction"))
    nrows = (len(panels) + 1) // 2
    fig = Figure(figsize=(16, 4.2 * nrows + 0.6), layout="constrained")
    axes = fig.subplots(nrows, 2, squeeze=False).ravel()
    for ax, (labels, series, title) in zip(axes, panels):
        _bars(ax, labels, series, title)
    for ax in axes[len(panels):]:
        ax.set_visible(False)
    m = rep.machine
    fig.suptitle(f"actcodec vs a threaded copy and alternatives: {rep.mib} MiB arrays, "
                 f"{m['threads']} threads, {m['path']}, {m['cpu']} ({m['date']}); "
                 f"> 1 = ours faster", fontsize=11)
    fig.savefig(path, dpi=110)
    return None


def write(rep: Report, out_dir: str, command: str = "python -m actcodec bench") -> dict:
    """bench.md and bench.png in out_dir (created). Returns {"md": path, "png": path or None,
    "png_note": why not}."""
    os.makedirs(out_dir, exist_ok=True)
    md_path = os.path.join(out_dir, "bench.md")
    with open(md_path, "w") as f:
        f.write(markdown(rep, command))
    png_path = os.path.join(out_dir, "bench.png")
    note = png(rep, png_path)
    return {"md": md_path, "png": None if note else png_path, "png_note": note}
