"""The benchmark report: every table of docs/RESULTS.md, measured in this process (and the
memory runs in fresh processes of their own), then written there. The README quotes short
versions of these tables.

    python bench/report.py                   # everything, about 15 minutes on 2 cores
    python bench/report.py --sections step kernels --rounds 7
    python bench/report.py --quick --out /tmp/RESULTS.md   # a small smoke run

Sections: step (a training step of real models, bench/step.py), kernels (the codecs beside
their floors and alternatives, bench/codec_speed.py), reduce (the Numba min/max reductions,
bench/reduce_report.py)."""
from __future__ import annotations

import argparse
import datetime
import os
import sys
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))
import harness  # noqa: E402

SECTIONS = ("step", "kernels", "reduce")


def _step(args) -> str:
    import step

    sizes = {"gpt2": {"batch": 1, "seq": 64}, "resnet": {"batch": 4, "size": 32}} \
        if args.quick else {}
    parts = []
    for model in step.clients.MODELS:
        times = step.run(model, args.step_configs.split(","), args.rounds, sizes.get(model, {}))
        parts.append(step.table(model, times))
    return ("A training step (forward and backward) of transformers models built from a "
            "config, random weights: " + step.DESCRIPTION + ". Medians of interleaved rounds; "
            "`/ fp32` divides medians, `per-round` is the median of each round's ratio to that "
            "round's fp32 step.\n\n" + "\n\n".join(parts))


def _kernels(args) -> str:
    import codec_speed as kernels

    rows = kernels.rows(1 if args.quick else args.mib, args.rounds, args.threads,
                        progress=lambda s: print(s, file=sys.stderr, flush=True))
    notes = "\n".join(f"- vs {k}: {v}" for k, v in kernels.ALTERNATIVES.items())
    return (f"{1 if args.quick else args.mib} MiB of float32 per row, {args.threads} threads, "
            "memory reused (encodes write into memory mapped once, as the store gives a "
            "training step; decode writes into a caller's `out=`); "
            "medians of interleaved rounds. `read`: one threaded pass that only reads the "
            "input (torch.aminmax of its bytes as int32); `floor`: that read of the input "
            "beside a copy of as many bytes as the encoding holds, the least data an encoder "
            "moves; `copy`: torch's threaded copy of the array into memory in use. `vs X`: X's "
            "time / ours (> 1: we are faster).\n\n" + kernels.markdown(rows) + "\n\n" + notes)


def _reduce(args) -> str:
    import reduce_report

    rows = reduce_report.rows(1 if args.quick else args.mib, args.rounds, args.threads)
    return (f"min/max of {1 if args.quick else args.mib} MiB float32, {args.threads} threads; "
            "throughput ratios (> 1: faster).\n\n" + reduce_report.markdown(rows))


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--sections", nargs="+", default=list(SECTIONS), choices=SECTIONS)
    p.add_argument("--rounds", type=int, default=9)
    p.add_argument("--mib", type=int, default=64, help="kernel and reduce array size")
    p.add_argument("--threads", type=int, default=2)
    p.add_argument("--step-configs", default="fp32,lossless,8bit,2bit,budget/8,checkpoint")
    p.add_argument("--quick", action="store_true", help="tiny sizes: checks the report runs")
    p.add_argument("--out", default=str(HERE.parent / "docs" / "RESULTS.md"))
    args = p.parse_args(argv)
    if args.quick:
        args.rounds = min(args.rounds, 2)
    import torch

    torch.set_num_threads(args.threads)
    t0 = time.perf_counter()
    m = harness.machine(args.threads)
    titles = {"step": "A training step", "kernels": "The codec kernels",
              "reduce": "Min/max reductions (Numba)"}
    body = []
    for name in args.sections:
        print(f"== {name}", file=sys.stderr, flush=True)
        text = {"step": _step, "kernels": _kernels, "reduce": _reduce}[name](args)
        body.append(f"## {titles[name]}\n\n{text}\n")
        print(text, flush=True)
    versions = ", ".join(f"{k} {v}" for k, v in m["versions"].items())
    load = "" if m["load"] is None else f", load average {m['load'][0]:.2f} at the start"
    command = " ".join(["python bench/report.py", *(argv if argv is not None else sys.argv[1:])])
    head = (f"# Results\n\nWritten by `{command}` on {datetime.date.today().isoformat()} in "
            f"{time.perf_counter() - t0:.0f} s: "
            f"{m['cpu']}, {m['cores']} cores, {m['system']}, SIMD path {m['path']}{load}; "
            f"{versions}. The machine is shared and noisy: read the ratios, which were "
            "measured side by side, not the milliseconds.\n")
    Path(args.out).parent.mkdir(parents=True, exist_ok=True)
    Path(args.out).write_text(head + "\n" + "\n".join(body))
    print(f"wrote {args.out}", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
