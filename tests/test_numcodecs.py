"""The numpy codecs as numcodecs codecs: found through the entry-point group without an
import of actcodec, round-tripped, and used by zarr (format 2 arrays) in a fresh process."""
import subprocess
import sys

import numpy as np
import pytest

numcodecs = pytest.importorskip("numcodecs")  # the test extra installs it

import actcodec  # noqa: E402

CONFIGS = [
    ({"id": "actcodec.raw"}, actcodec.Raw),
    ({"id": "actcodec.bitmap", "prune": 0.0}, actcodec.Bitmap),
    ({"id": "actcodec.mask"}, actcodec.Mask),
    ({"id": "actcodec.quant", "bits": 4, "group_size": 64}, actcodec.Quant),
    ({"id": "actcodec.bitmap_quant", "bits": 2}, actcodec.BitmapQuant),
    ({"id": "actcodec.auto", "bits": 8}, actcodec.Auto),
]


def test_entry_points_register_every_codec_in_a_fresh_process():
    """A process that never imports actcodec gets the codecs from numcodecs' registry."""
    code = ("import numcodecs, sys\n"
            "for cid in sys.argv[1:]:\n"
            "    c = numcodecs.get_codec({'id': cid})\n"
            "    print(cid, type(c).__module__, type(c).__name__)\n")
    ids = [cfg["id"] for cfg, _ in CONFIGS]
    r = subprocess.run([sys.executable, "-c", code, *ids], capture_output=True, text=True)
    assert r.returncode == 0, r.stderr
    assert [line.split()[1] for line in r.stdout.splitlines()] == ["actcodec.numcodecs"] * len(ids)


@pytest.mark.parametrize("config,cls", CONFIGS, ids=[c["id"] for c, _ in CONFIGS])
def test_get_codec_round_trips(config, cls):
    codec = numcodecs.get_codec(dict(config))
    assert type(codec) is cls and isinstance(codec, numcodecs.abc.Codec)
    assert numcodecs.get_codec(codec.get_config()) == codec
    rng = np.random.default_rng(0)
    x = np.maximum(rng.standard_normal((40, 33)), 0).astype(np.float32)
    if cls is actcodec.Mask:
        x = (x > 0).astype(np.float32) * 1.5
    back = codec.decode(codec.encode(x))
    lossless = cls in (actcodec.Raw, actcodec.Bitmap, actcodec.Mask)
    if lossless:
        assert back.tobytes() == x.tobytes()
    else:  # within half a quantization step of the whole range
        step = (x.max() - x.min()) / (2 ** config["bits"] - 1)
        assert np.abs(back.reshape(x.shape) - x).max() <= step / 2 + 1e-6
    out = bytearray(x.nbytes)  # numcodecs hands decode a buffer of the right size
    codec.decode(codec.encode(x), out=out)
    assert bytes(out) == back.tobytes()
    with pytest.raises(ValueError, match="bytes"):
        codec.decode(codec.encode(x), out=bytearray(x.nbytes - 4))


def test_zarr_array_with_actcodec_codecs(tmp_path):
    zarr = pytest.importorskip("zarr")
    x = np.maximum(np.random.default_rng(1).standard_normal((64, 256)), 0).astype(np.float32)
    path = str(tmp_path / "acts.zarr")
    a = zarr.create_array(store=path, shape=x.shape, chunks=(16, 256), dtype="float32",
                          zarr_format=2, compressors=[actcodec.Bitmap()])
    a[:] = x
    q = zarr.create_array(store=str(tmp_path / "q.zarr"), shape=x.shape, chunks=(16, 256),
                          dtype="float32", zarr_format=2, filters=[actcodec.Quant(bits=8)],
                          compressors=None)
    q[:] = x
    # a fresh process opens them through the registry alone
    code = ("import sys, zarr, numpy as np\n"
            "a = zarr.open_array(sys.argv[1], mode='r')\n"
            "q = zarr.open_array(sys.argv[2], mode='r')\n"
            "np.save(sys.argv[3], a[:]); np.save(sys.argv[4], q[:])\n")
    out_a, out_q = str(tmp_path / "a.npy"), str(tmp_path / "q.npy")
    r = subprocess.run([sys.executable, "-c", code, path, str(tmp_path / "q.zarr"), out_a,
                        out_q], capture_output=True, text=True)
    assert r.returncode == 0, r.stderr
    assert np.load(out_a).tobytes() == x.tobytes()
    assert np.abs(np.load(out_q) - x).max() <= x.max() / 255
