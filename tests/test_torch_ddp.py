"""compress_saved under DistributedDataParallel: gloo, 2 CPU processes, 3 SGD steps of a small
CNN (conv, frozen BatchNorm, ReLU, max pool, conv, GroupNorm, ReLU, avg pool, linear; why
not a training-mode BatchNorm: see make_model in _ddp_worker.py), each rank on its half of the
batch inside compress_saved, with Policy.preset("lossless") and Policy.preset("8bit"). The
ranks must end bit-identical, and match a single-process run on the whole batch with the same
steps and policy (its loss the mean over the full batch, so its gradient is DDP's average).

The ranks run tests/_ddp_worker.py as subprocesses: nothing of this module is pickled or
re-imported in them, so it works however pytest imports it, and a hard timeout kills them.
"""
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest

torch = pytest.importorskip("torch")  # the torch extra; CI installs it
dist = pytest.importorskip("torch.distributed")
if not (dist.is_available() and dist.is_gloo_available()):
    pytest.skip("torch.distributed with gloo is not available", allow_module_level=True)

WORKER = Path(__file__).with_name("_ddp_worker.py")
WORLD = 2
HARD_TIMEOUT = 120  # seconds for the whole launch (normally ~10 s); a hung rank fails the test

# Lossless: each rank's saved tensors come back bit for bit, so the only differences from the
# single-process run are float32 summation order: a rank sums a gradient over its 4 samples and
# DDP adds the two halves, where the single run sums all 8 at once (with other blocking in the
# conv/linear kernels too); the later steps then start from parameters a few ulps apart. With
# unit roundoff u = 6e-8 and up to n = 8 * 32 * 32 = 8192 terms per gradient element (conv1's
# weight), that is ~sqrt(n) * u = 5e-6 of the update for random-signed rounding errors (n * u =
# 5e-4 the worst case, never reached). Measured here: <= 1.5e-6 (max abs error over max abs
# update, per parameter tensor). 1e-4 leaves a 70x margin and is still 100x below what 8-bit
# quantization does to the same run (~1.5e-2): a lossy step, or one rank's large saved tensors
# off by 1% (measured 1.7e-2), fails it.
LOSSLESS_TOL = 1e-4

# 8-bit: the two runs carry quantization error of their own, and not the same error. Every
# dense 8-bit tensor groups identically (make_model sizes each sample to whole 256-element
# groups, so a rank's half is a run of the full batch's groups), but the ReLU and max-pool
# outputs are stored as bitmap + 8-bit nonzeros, grouped by 256 *nonzeros*, and a rank's
# nonzero count is no multiple of 256: rank 1's groups are shifted against the full batch's
# and get other minima and scales. So the runs differ by quantization noise, per saved element
# at most one step (range/255) of its group. Measured as ||theta_ddp - theta_single|| over
# ||theta_single - theta_0|| per parameter tensor (L2 relative to the 3-step update): 0.012
# between the DDP and single runs, 0.017 between 8-bit and lossless. 0.05 allows ~4x that.
# What it catches, measured by breaking rank 1 only: saved tensors read back as zeros (1.3) or
# from the wrong sample (0.87), stored at 2 bits (0.30) or 4 bits (0.084) instead of 8, or
# 10% off (0.12). A 1% error of the saved tensors (0.009) hides in the 8-bit noise; the
# lossless check is the one that sees that.
QUANT_TOL = 0.05


def launch(tmp_path, worker=None):
    """Run the ranks; return their results. The rendezvous store lives here, on a port the OS
    picked (bind to port 0) that stays bound for the whole run: parallel runs can't collide,
    and there is no window between finding a free port and binding it."""
    store = dist.TCPStore("127.0.0.1", 0, None, is_master=True, wait_for_workers=False)
    env = dict(os.environ, OMP_NUM_THREADS="1", MKL_NUM_THREADS="1")
    if sys.platform.startswith("linux"):
        env.setdefault("GLOO_SOCKET_IFNAME", "lo")  # loopback only
    outs = [tmp_path / f"rank{r}.pt" for r in range(WORLD)]
    logs = [tmp_path / f"rank{r}.log" for r in range(WORLD)]
    procs = []
    try:
        for r in range(WORLD):
            with open(logs[r], "w") as log:  # files, not pipes: a chatty rank can't block
                procs.append(subprocess.Popen(
                    [sys.executable, str(worker or WORKER), str(r), str(WORLD), str(store.port),
                     str(outs[r])], env=env, stdout=log, stderr=subprocess.STDOUT))
        deadline = time.monotonic() + HARD_TIMEOUT  # one deadline for all ranks
        for p in procs:
            try:
                p.wait(timeout=max(0.0, deadline - time.monotonic()))
            except subprocess.TimeoutExpired:
                break
    finally:
        hung = [r for r, p in enumerate(procs) if p.poll() is None]
        for r in hung:
            procs[r].kill()
            procs[r].wait()
        del store
    assert not hung, f"ranks {hung} still running after {HARD_TIMEOUT} s, killed:\n" + read(logs)
    codes = [p.returncode for p in procs]
    assert codes == [0] * WORLD, f"exit codes of the ranks: {codes}\n" + read(logs)
    return [torch.load(o, weights_only=True) for o in outs]


def read(logs):
    return "\n".join(f"--- {log.name}\n{log.read_text()}" for log in logs)


@pytest.fixture(scope="module")
def runs(tmp_path_factory):
    r0, r1 = launch(tmp_path_factory.mktemp("ddp"))
    return {"ranks": (r0, r1), "initial": r0["initial"], "params": r0["params"],
            "single": {"lossless": r0["single_lossless"], "8bit": r1["single_8bit"]},
            "single_stats": {"lossless": r0["single_lossless_stats"],
                             "8bit": r1["single_8bit_stats"]}}


def errors(a, b, initial, names):
    """Per parameter tensor: (max |a - b| / max |update|, ||a - b|| / ||update||), where the
    update is b's 3 steps, b - initial."""
    out = {}
    for k in names:
        update = b[k] - initial[k]
        assert update.abs().max() > 0, f"{k} was not trained"
        diff = a[k] - b[k]
        out[k] = ((diff.abs().max() / update.abs().max()).item(),
                  (diff.norm() / update.norm()).item())
    return out


@pytest.mark.parametrize("policy", ["lossless", "8bit"])
def test_ranks_end_bit_identical(runs, policy):
    """DDP all-reduces the gradients, so both ranks apply the same update: every parameter
    and buffer equal to the bit."""
    r0, r1 = runs["ranks"]
    a, b = r0[f"ddp_{policy}"], r1[f"ddp_{policy}"]
    assert a.keys() == b.keys()
    differ = [k for k in a if not torch.equal(a[k], b[k])]
    assert not differ, f"ranks differ in {differ}"
    assert not torch.equal(a[runs["params"][0]], runs["initial"][runs["params"][0]])


@pytest.mark.parametrize("policy", ["lossless", "8bit"])
def test_each_rank_compresses_what_the_single_run_does(runs, policy):
    """The same layers' saves are compressed, with the same codecs, in every step, on each
    rank's half batch as on the full batch; and the 8-bit policy really quantizes."""
    single = runs["single_stats"][policy]
    for r, rank in enumerate(runs["ranks"]):
        assert rank[f"ddp_{policy}_stats"] == single, f"rank {r}"
    codecs = {c for step in single for row in step["rows"].values() for c in row}
    ops = {key.split("/")[1] for key in single[0]["rows"]}
    if policy == "8bit":
        assert {"quant", "bitmap_quant"} <= codecs, codecs
        assert {"conv", "batch_norm", "relu", "group_norm"} <= ops
    else:
        # Lossless keeps dense saves (norm inputs) as they are: raw would hold the same bytes.
        assert not codecs & {"quant", "bitmap_quant"}, codecs
        assert {"conv", "relu"} <= ops and single[0]["kept"] > 0


def test_lossless_matches_single_process(runs):
    err = errors(runs["ranks"][0]["ddp_lossless"], runs["single"]["lossless"], runs["initial"],
                 runs["params"])
    bad = {k: e for k, e in err.items() if e[0] > LOSSLESS_TOL}
    assert not bad, f"beyond {LOSSLESS_TOL} of the update: {bad}"


def test_8bit_matches_single_process(runs):
    err = errors(runs["ranks"][0]["ddp_8bit"], runs["single"]["8bit"], runs["initial"],
                 runs["params"])
    bad = {k: e for k, e in err.items() if e[1] > QUANT_TOL}
    assert not bad, f"beyond {QUANT_TOL} of the update: {bad}"


def test_8bit_is_lossy_but_close_to_lossless(runs):
    """The 8-bit comparison above means something only if 8 bits did change the run (by far
    more than the lossless tolerance), and by no more than its quantization noise."""
    err = errors(runs["single"]["8bit"], runs["single"]["lossless"], runs["initial"],
                 runs["params"])
    assert max(e[0] for e in err.values()) > 10 * LOSSLESS_TOL, err
    bad = {k: e for k, e in err.items() if e[1] > QUANT_TOL}
    assert not bad, f"8-bit moved the update beyond {QUANT_TOL}: {bad}"


def test_step_micro_batches_all_reduce_once_per_step(tmp_path):
    """act.Step under DDP: the micro-batches accumulate without communicating (no_sync) until
    the last, so a step pays the plain step's all-reduces, and the gradients are the plain
    step's."""
    ranks = launch(tmp_path, Path(__file__).with_name("_ddp_step_worker.py"))
    for r in ranks:
        assert r["step_calls"] == r["plain_calls"] >= 1
        for a, b in zip(r["step"], r["plain"]):
            assert torch.allclose(a, b, rtol=1e-5, atol=1e-6)
