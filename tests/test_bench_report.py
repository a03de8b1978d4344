"""The codec report (`python -m actcodec bench`): its whole code path on a 1 MiB array, one
round, one thread, checking the markdown's tables row by row and the PNG. The numbers of such
a run mean nothing; only the report's shape is checked."""
import importlib.util
import re
import sys

import pytest

import actcodec
from actcodec import bench_render, bench_report
from actcodec.__main__ import main


def _tables(md: str) -> dict:
    """Section title (first word after '## ') -> (header cells, list of row cell lists)."""
    out = {}
    for section in md.split("\n## ")[1:]:
        lines = [ln for ln in section.splitlines() if ln.startswith("|")]
        cells = [[c.strip() for c in ln.strip("|").split("|")] for ln in lines]
        out[section.split()[0]] = (cells[0], cells[2:]) if cells else ([], [])
    return out


def _col(table, name):
    head, rows = table
    i = head.index(name)
    return [r[i] for r in rows]


@pytest.fixture
def restore_threads():
    old = actcodec.get_num_threads()
    yield
    actcodec.set_num_threads(old)


def test_bench_command_writes_every_row(tmp_path, monkeypatch, capsys, restore_threads):
    monkeypatch.setenv("ACTCODEC_CACHE_DIR", "off")  # the reduce profile: memory only
    out = tmp_path / "report"
    assert main(["bench", "--mib", "1", "--rounds", "1", "--threads", "1",
                 "--regimes", "reused", "--out", str(out)]) == 0
    md = (out / "bench.md").read_text()
    printed = capsys.readouterr()
    assert md in printed.out  # the same markdown on stdout
    assert "--mib 1 --rounds 1 --threads 1 --regimes reused" in md
    tables = _tables(md)
    dtypes = ["float32", "float16"]

    raw = tables["raw"]
    assert _col(raw, "dtype") == dtypes and set(_col(raw, "memory")) == {"reused"}
    assert _col(tables["bitmap"], "zeros") == ["10%", "50%", "90%"] * 2
    assert _col(tables["quant"], "k") == ["1", "2", "4", "8"] * 2
    assert _col(tables["quant"], "dtype") == ["float32"] * 4 + ["float16"] * 4
    assert _col(tables["bitmap_quant"], "k") == ["2", "4", "8"] * 2
    assert _col(tables["bitmap_quant"], "zeros") == ["50%"] * 6
    assert _col(tables["auto"], "chose") == ["raw", "bitmap", "bitmap_quant", "quant"] * 2
    assert _col(tables["auto"], "bits") == ["lossless", "lossless", "4", "4"] * 2
    for name in ("raw", "bitmap", "quant", "bitmap_quant", "auto"):
        for col in ("encode / copy", "decode / copy"):
            assert all(float(v) > 0 for v in _col(tables[name], col)), (name, col)
        assert all(re.fullmatch(r"[\d.]+x", v) for v in _col(tables[name], "size ratio"))
    assert all(re.fullmatch(r"[\d.]+x (faster|slower)", v)
               for v in _col(tables["bitmap"], "encode vs numpy"))

    quant_head = tables["quant"][0]
    if importlib.util.find_spec("torch") is not None:
        assert "encode vs torch eager" in quant_head
        assert "decode vs numpy + torch eager" in tables["bitmap_quant"][0]
        assert "encode vs torch" in tables["raw"][0]
        if bench_report.load_env().torchao.ok:
            ta = _col(tables["quant"], "encode vs torchao pack")
            assert [v != "-" for v in ta] == [True, True, True, False] * 2  # k=8: no packing
        else:
            assert "encode vs torchao pack" not in quant_head
            assert "- torchao: " in md
    if bench_report.load_env().bnb is not None:
        bnb = _col(tables["quant"], "decode vs bitsandbytes")
        assert [v != "-" for v in bnb] == [False, False, False, True] * 2  # 8-bit only

    red = tables["min/max"]
    if importlib.util.find_spec("numba") is not None:
        assert _col(red, "dtype") == ["float32"] * 5 + ["float16"] * 5
        assert [s.split()[0] for s in _col(red, "strategy")] == ["auto", "tree", "atomic",
                                                                 "hybrid", "C"] * 2
    png = out / "bench.png"
    if importlib.util.find_spec("matplotlib") is not None:
        assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
        assert "bench.png" in printed.err
    else:
        assert not png.exists() and "matplotlib is not installed" in printed.err


def test_without_matplotlib_or_torchao(tmp_path, monkeypatch):
    """Missing optional packages: the markdown says so and no PNG is written."""
    monkeypatch.setitem(sys.modules, "matplotlib.figure", None)  # import fails
    monkeypatch.setitem(sys.modules, "torchao", None)            # find_spec: not installed
    rep = bench_report.run(mib=1, rounds=1, codecs=("quant",), dtypes=("float32",),
                           regimes=("reused",))
    paths = bench_render.write(rep, str(tmp_path))
    assert paths["png"] is None and "matplotlib is not installed" in paths["png_note"]
    assert not (tmp_path / "bench.png").exists()
    md = (tmp_path / "bench.md").read_text()
    if importlib.util.find_spec("torch") is not None:
        assert "- torchao: not installed." in md
    assert "torchao not" in md and "## min/max" in md and "not run (not asked for)" in md


@pytest.mark.parametrize("value, text", [(3.04, "3.0x faster"), (1.0, "1.00x faster"),
                                         (0.5, "2.0x slower"), (0.8, "1.25x slower"),
                                         (None, "-")])
def test_speedup_words(value, text):
    assert bench_render.speedup(value) == text
