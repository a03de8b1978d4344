"""The speed knobs (actcodec.set_tuning): defaults, validation, and that no output byte
depends on them; bench/tuning_pairs.py runs."""
import importlib.util
from pathlib import Path

import numpy as np
import pytest

import actcodec
from actcodec.benchmark import relu_like


@pytest.fixture
def restore_tuning():
    saved = actcodec.get_tuning()
    yield
    actcodec.set_tuning(**saved)


def test_defaults():
    assert actcodec.get_tuning() == {"quant_short_tiles_from": 16 << 20,
                                     "bitmap_block_max": 2 << 20,
                                     "bitmap_stream_from": 8 << 20}


def test_set_and_get(restore_tuning):
    actcodec.set_tuning(quant_short_tiles_from=None, bitmap_block_max=128 << 10,
                        bitmap_stream_from=None)
    assert actcodec.get_tuning() == {"quant_short_tiles_from": None,
                                     "bitmap_block_max": 128 << 10,
                                     "bitmap_stream_from": None}
    actcodec.set_tuning(quant_short_tiles_from=0)  # the other knobs keep their values
    assert actcodec.get_tuning() == {"quant_short_tiles_from": 0, "bitmap_block_max": 128 << 10,
                                     "bitmap_stream_from": None}
    actcodec.set_tuning(bitmap_stream_from=4096)
    assert actcodec.get_tuning()["bitmap_stream_from"] == 4096


@pytest.mark.parametrize("kwargs", [
    {"quant_short_tiles_from": -1}, {"quant_short_tiles_from": 1.5},
    {"quant_short_tiles_from": True}, {"quant_short_tiles_from": 2**64},
    {"bitmap_block_max": True}, {"bitmap_block_max": 2**64},
    {"bitmap_block_max": 3 << 20}, {"bitmap_block_max": 64 << 10}, {"bitmap_block_max": -4},
    {"bitmap_block_max": 2 << 30},
    {"bitmap_stream_from": -1}, {"bitmap_stream_from": True}, {"bitmap_stream_from": 2**64},
    {"bitmap_stream_from": "8M"},
])
def test_bad_values(restore_tuning, kwargs):
    before = actcodec.get_tuning()
    with pytest.raises(ValueError):
        actcodec.set_tuning(**kwargs)
    assert actcodec.get_tuning() == before


@pytest.mark.parametrize("kwargs", [
    {"bitmap_stream_from": 0, "bitmap_block_max": 3},
    {"quant_short_tiles_from": 0, "bitmap_stream_from": -1},
    {"bitmap_block_max": 256 << 10, "quant_short_tiles_from": 1.5},
])
def test_one_bad_value_changes_no_knob(restore_tuning, kwargs):
    before = actcodec.get_tuning()
    with pytest.raises(ValueError):
        actcodec.set_tuning(**kwargs)
    assert actcodec.get_tuning() == before


@pytest.mark.parametrize("bits", [1, 2, 4, 8])
@pytest.mark.parametrize("rounding", ["nearest", "stochastic"])
def test_quant_bytes_do_not_depend_on_tiles(restore_tuning, bits, rounding):
    x = np.random.default_rng(bits).standard_normal(300_001).astype(np.float32)
    got = []
    for threshold in (0, None):
        actcodec.set_tuning(quant_short_tiles_from=threshold)
        got.append(actcodec.quant.encode(x, bits, group_size=128, rounding=rounding,
                                         seed=5).to_bytes())
    assert got[0] == got[1]


@pytest.mark.parametrize("zeros", [0.1, 0.5, 0.99])
def test_bitmap_bytes_do_not_depend_on_blocks(restore_tuning, zeros):
    x = relu_like(33 << 20, zeros, seed=3)  # threaded: blocks grow to 1 MiB by default
    threads = actcodec.get_num_threads()
    actcodec.set_num_threads(2)
    try:
        got = []
        for block in (1 << 20, 128 << 10):
            actcodec.set_tuning(bitmap_block_max=block)
            got.append(actcodec.bitmap.encode(x).to_bytes())
    finally:
        actcodec.set_num_threads(threads)
    assert got[0] == got[1]


@pytest.mark.parametrize("dtype", [np.float16, np.float32, np.float64])
@pytest.mark.parametrize("zeros", [0.0, 0.5, 0.97])
def test_bitmap_bytes_do_not_depend_on_streaming(restore_tuning, dtype, zeros):
    """Values copied out of scratch with non-temporal stores against
    ordinary stores: the same encoding, decoding to the same bits."""
    x = relu_like(3 << 20, zeros, seed=4, dtype=dtype)
    threads = actcodec.get_num_threads()
    actcodec.set_num_threads(2)
    try:
        got = []
        for threshold in (0, None):
            actcodec.set_tuning(bitmap_stream_from=threshold)
            got.append(actcodec.bitmap.encode(x))
    finally:
        actcodec.set_num_threads(threads)
    assert got[0].to_bytes() == got[1].to_bytes()
    assert got[0].decode().tobytes() == x.tobytes()


def test_tuning_pairs_script_runs(restore_tuning):
    path = Path(__file__).resolve().parents[1] / "bench" / "tuning_pairs.py"
    spec = importlib.util.spec_from_file_location("tuning_pairs", path)
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    out = mod.main(["--rounds", "3", "--mib", "1"])
    assert "| quant 2-bit encode, 1 MiB, cold | short / long |" in out
    assert "| bitmap encode, 1 MiB, 50% zeros, cold |" in out
    assert "| bitmap encode, 8 MiB, 50% zeros, hot | streamed / ordinary |" in out
    assert actcodec.get_tuning()["quant_short_tiles_from"] == 16 << 20
