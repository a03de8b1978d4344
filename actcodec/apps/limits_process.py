"""What the limits demo's two cases share: a configuration run in a fresh process of
`python -m actcodec demo --task limits --worker ...`, and the summary of its steps."""
from __future__ import annotations

import json
import os
import statistics
import subprocess
import sys


def run(worker: str, s: dict, tmp: str, data: str | None = None) -> dict:
    """The worker's JSON result; SystemExit naming the command where it failed."""
    path = os.path.join(tmp, "result.json")
    cmd = [sys.executable, "-m", "actcodec", "demo", "--task", "limits", "--worker", worker,
           "--result", path, "--settings", json.dumps(s)]
    if data is not None:
        cmd += ["--data", data]
    if subprocess.run(cmd).returncode != 0:
        raise SystemExit(f"the {worker} worker failed: {' '.join(cmd)}")
    with open(path) as f:
        return json.load(f)


def summary(config: str, step, peaks: list, times: list, losses: list) -> dict:
    """A run's steps: their peaks and losses, the median step after the first, and for a
    Step its limit, plan, smallest limit and whether every peak stayed within the limit."""
    return {"config": config, "limit": None if step is None else step.limit,
            "step_peaks": peaks, "peak": max(peaks), "losses": losses,
            "step_s": statistics.median(times[1:] or times),
            "plan": None if step is None else step.describe(),
            "smallest": None if step is None else step.smallest_limit(),
            "within": None if step is None else all(p <= step.limit for p in peaks)}


def searched(refused: dict) -> str:
    """What a refused try at a smaller limit said, for the row of the limit that ran after it."""
    mib = 1 << 20
    return (f"first tried at {refused['limit'] / mib:.0f} MiB: a fresh first step refused it, "
            f"naming {-(-refused['needed'] // mib)} MiB")
