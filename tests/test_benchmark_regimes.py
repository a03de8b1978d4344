"""The benchmarks' memory regimes and yardsticks (actcodec.benchmark): the report times every
'fresh' row before the first 'reused' one and its copies fault there; a 'fresh' run after a
'reused' one says it is not fresh; the copy, fill and read yardsticks do what they say."""
import ctypes.util
import shutil
import subprocess
import sys
import sysconfig
import textwrap
from pathlib import Path

import numpy as np
import pytest

from actcodec import _ext, benchmark

glibc_linux = pytest.mark.skipif(
    not sys.platform.startswith("linux") or not ctypes.util.find_library("c")
    or not hasattr(ctypes.CDLL(ctypes.util.find_library("c")), "mallopt"),
    reason="the regimes steer glibc's malloc")


def _run(code: str) -> str:
    """Runs code in a fresh interpreter (a heap no other test has touched); its stdout."""
    out = subprocess.run([sys.executable, "-c", textwrap.dedent(code)], capture_output=True,
                         text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    return out.stdout


@glibc_linux
def test_report_times_every_fresh_row_first_and_its_copies_fault():
    """Three cases in both regimes: had a reused row run before the second case's fresh row,
    that row's copies would reuse the heap it left (0 faults)."""
    out = _run("""
        from actcodec import bench_report
        timed = []
        rows = bench_report.codec_rows(mib=40, rounds=1, codecs=("bitmap",),
                                       dtypes=("float32",),
                                       progress=lambda row, s: timed.append(row.memory))
        print(*timed)
        print(*(r.memory for r in rows))
        print(*(r.notes["copy faults"] for r in rows))
    """)
    timed, listed, faults = (line.split() for line in out.splitlines())
    assert timed == ["fresh"] * 3 + ["reused"] * 3
    assert listed == ["fresh", "reused"] * 3
    fresh, reused = [int(f) for f in faults[0::2]], [int(f) for f in faults[1::2]]
    assert all(f >= 20 for f in fresh) and all(f <= 2 for f in reused), faults


@glibc_linux
def test_fresh_after_reused_warns():
    out = _run("""
        import warnings
        from actcodec import benchmark
        with benchmark.memory_regime("reused"):
            pass
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            with benchmark.memory_regime("fresh"):
                pass
        print(len(caught), caught[0].category.__name__ if caught else "")
    """)
    assert out.split() == ["1", "RuntimeWarning"]


@pytest.mark.parametrize("shape", [(0,), (1,), (3, 4097), (1 << 20,)])
@pytest.mark.parametrize("dtype", [np.float16, np.float32, np.float64])
def test_threaded_copy_is_a_copy(shape, dtype):
    x = np.random.default_rng(0).standard_normal(shape).astype(dtype)
    y = benchmark.threaded_copy(x)
    assert y.shape == x.shape and y.dtype == x.dtype and y.tobytes() == x.tobytes()
    assert not np.shares_memory(x, y) and y.flags.c_contiguous and y.flags.writeable
    if x.size:  # at the source's offset within a page, where glibc's memcpy is fastest
        assert (y.ctypes.data - x.ctypes.data) % 4096 == 0


@pytest.mark.parametrize("nbytes", [0, 1, 4097, (3 << 20) + 1])
def test_threaded_fill_writes_every_byte(nbytes):
    out = benchmark.threaded_fill(nbytes)
    assert out.dtype == np.uint8 and out.size == nbytes and not out.any()
    buf = np.full(nbytes, 7, np.uint8)
    _ext.parallel_fill(buf, 255)
    assert (buf == 255).all()


@pytest.mark.parametrize("byte", [-1, 256])
def test_parallel_fill_rejects_values_outside_a_byte(byte):
    with pytest.raises(ValueError, match="0..255"):
        _ext.parallel_fill(np.zeros(8, np.uint8), byte)


@pytest.mark.parametrize("dtype", ["float32", "float16", "float64"])
def test_read_input_reads_the_whole_array(dtype):
    """The read pass is the C core's min/max: it sees the last element too."""
    x = np.zeros(100_003, dtype)
    x[-1] = 3
    lo, hi = benchmark.read_input(x)()[:2]
    assert (lo, hi) == (0.0, 3.0)


def _table_rows(stdout: str) -> dict:
    """A printed markdown table: first cell -> the line split on ' | '."""
    return {line.split(" | ")[0].strip("| "): line.split(" | ")
            for line in stdout.splitlines() if line.startswith("| ") and "---" not in line}


@glibc_linux
def test_fresh_split_script_reports_every_call_and_the_copy_faults():
    """bench/fresh_split.py, run as a user would, in a clean process: one row per call, and
    the copy's 34 MiB output is newly mapped (it faults), which is what the script is about."""
    script = str(Path(__file__).resolve().parents[1] / "bench" / "fresh_split.py")
    out = subprocess.run([sys.executable, script, "--mib", "34", "--rounds", "2"],
                         capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    rows = _table_rows(out.stdout)
    for call in ("copy", "fill (memset)", "bitmap decode, 50% zeros", "bitmap encode, 50% zeros",
                 "quant decode, 2-bit", "quant encode, 2-bit"):
        assert call in rows, out.stdout
    assert rows["copy"][2] == "1.00"
    assert int(rows["copy"][3]) > 0, out.stdout


def test_first_touch_program_builds_from_the_c_core_alone_and_checks_its_bytes(tmp_path):
    """bench/first_touch.c, built as its header says (the C core and no Python) and run small:
    a row per way of writing, the copy as the unit, and its copies and decode verified."""
    cc = shutil.which((sysconfig.get_config_var("CC") or "cc").split()[0]) or shutil.which("cc")
    if cc is None:
        pytest.skip("no C compiler (actcodec installed from a wheel): nothing to build with")
    root = Path(__file__).resolve().parents[1]
    exe = tmp_path / "first_touch"
    sources = sorted(str(p) for p in (root / "csrc").glob("*.c"))
    build = [cc, "-O2", "-std=c11", "-fopenmp", f"-I{root / 'csrc'}", *sources,
             str(root / "bench" / "first_touch.c"), "-o", str(exe), "-lm"]
    if subprocess.run(build, capture_output=True).returncode != 0:  # no OpenMP: serial
        build.remove("-fopenmp")
        res = subprocess.run(build, capture_output=True, text=True)
        assert res.returncode == 0, res.stderr
    out = subprocess.run([str(exe), "8", "2"], capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    rows = _table_rows(out.stdout)
    assert len(rows) == 10, out.stdout  # the header and nine ways of writing
    assert rows["ac_parallel_copy (the copy yardstick)"][2].strip(" |") == "1.00"
    assert all(float(r[1]) > 0 for name, r in rows.items() if name != "write"), out.stdout
