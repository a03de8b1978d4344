"""Settings travel per call: threads encoding at once with different thread counts and SIMD
paths get the bytes each gets alone, a default moved meanwhile changes no explicit call, and
no call (the torch adapters' included) moves a default."""
import threading

import numpy as np
import pytest

import actcodec

PATHS = actcodec.simd_info()["available"]


def _inputs():
    rng = np.random.default_rng(0)
    relu = np.maximum(rng.standard_normal(700_001), 0).astype(np.float32)
    return relu, (rng.standard_normal(600_011) * 3).astype(np.float32)


def _work(relu, dense, opts):
    """Every codec's bytes and decoded bytes under one setting."""
    out = []
    for enc in (actcodec.bitmap.encode(relu, **opts),
                actcodec.quant.encode(dense, 2, rounding="stochastic", seed=3, **opts),
                actcodec.bitmap_quant.encode(relu, 4, **opts),
                actcodec.encode(relu > 0.5, **opts)):
        out.append((enc.to_bytes(), enc.decode(**opts).tobytes()))
    return out


def test_concurrent_calls_with_different_settings_match_their_solo_runs():
    relu, dense = _inputs()
    settings = [{"threads": t, "simd": p} for p in PATHS for t in (1, 2, 3)]
    alone = [_work(relu, dense, s) for s in settings]
    assert all(a == alone[0] for a in alone)  # the bytes never depend on the setting
    before = actcodec.get_simd(), actcodec.get_num_threads()
    results, errors = {}, []
    start = threading.Barrier(len(settings) + 1)

    def run(i):
        try:
            start.wait()
            results[i] = [_work(relu, dense, settings[i]) for _ in range(3)]
        except Exception as exc:  # reported below, with the setting
            errors.append((settings[i], exc))

    threads = [threading.Thread(target=run, args=(i,)) for i in range(len(settings))]
    for t in threads:
        t.start()
    start.wait()
    for path in PATHS * 3:  # defaults moved while the explicit calls run
        actcodec.set_simd(path)
        actcodec.set_num_threads(1 + len(path) % 3)
    for t in threads:
        t.join()
    actcodec.set_simd(before[0])
    actcodec.set_num_threads(before[1])
    assert not errors, errors
    for i, runs in results.items():
        assert all(r == alone[i] for r in runs), settings[i]


def test_calls_leave_the_defaults_alone():
    relu, dense = _inputs()
    before = actcodec.get_simd(), actcodec.get_num_threads()
    for s in [{"threads": 1, "simd": PATHS[0]}, {"threads": 7, "simd": PATHS[-1]}]:
        _work(relu, dense, s)
        assert (actcodec.get_simd(), actcodec.get_num_threads()) == before


def test_defaults_apply_where_a_call_names_none(monkeypatch):
    relu, _ = _inputs()
    seen = []
    real = actcodec._ext.bitmap_encode
    monkeypatch.setattr(actcodec._ext, "bitmap_encode",
                        lambda *a, **k: seen.append((k["threads"], k["isa"])) or real(*a, **k))
    actcodec.bitmap.encode(relu)
    actcodec.bitmap.encode(relu, threads=3, simd="scalar")
    assert seen == [(0, actcodec._ext.ISA_DEFAULT), (3, 0)]  # 0 / -1: C reads the defaults


@pytest.mark.parametrize("bad,match", [({"threads": 0}, "threads"), ({"threads": 1025}, "threads"),
                                       ({"threads": 2.0}, "threads"), ({"simd": "avx9"}, "unknown"),
                                       ({"simd": 2}, "unknown")])
def test_bad_settings_are_clear_errors(bad, match):
    with pytest.raises(ValueError, match=match):
        actcodec.encode(np.ones(10, np.float32), **bad)
    with pytest.raises(ValueError, match=match):
        actcodec.encode(np.ones(10, np.float32)).decode(**bad)


def test_torch_adapters_pass_torch_threads_per_call_and_change_no_global(monkeypatch):
    torch = pytest.importorskip("torch")
    from actcodec.torch import Policy, compress_saved

    seen = []
    real = actcodec._ext.quant_encode
    monkeypatch.setattr(actcodec._ext, "quant_encode",
                        lambda *a, **k: seen.append(k["threads"]) or real(*a, **k))
    before = actcodec.get_num_threads()
    old = torch.get_num_threads()
    model = torch.nn.Sequential(torch.nn.Linear(256, 256), torch.nn.Tanh(), torch.nn.Linear(256, 4))
    x = torch.randn(512, 256)
    try:
        for n in (1, 2):
            torch.set_num_threads(n)
            with compress_saved(Policy.preset("8bit")):
                loss = model(x).sum()
            loss.backward()
            assert seen and set(seen) == {n}
            seen.clear()
        with compress_saved(Policy.preset("8bit", threads=3)):
            model(x).sum().backward()
        assert seen and set(seen) == {3}
    finally:
        torch.set_num_threads(old)
    assert actcodec.get_num_threads() == before
