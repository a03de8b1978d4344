"""The committed fixtures freeze format version 1: today's decoder must read them and today's
encoder must write the same bytes."""
import glob
import os
import sys

import numpy as np
import pytest

import actcodec

HERE = os.path.join(os.path.dirname(os.path.abspath(__file__)), "fixtures")
sys.path.insert(0, HERE)
import make_fixtures  # noqa: E402

FILES = sorted(glob.glob(os.path.join(HERE, "*.actc")))


def test_fixtures_exist():
    assert len(FILES) == len(list(make_fixtures.cases()))


@pytest.mark.parametrize("path", FILES, ids=[os.path.basename(p) for p in FILES])
def test_fixture_decodes_to_expected(path):
    with open(path, "rb") as f:
        enc = actcodec.from_bytes(f.read())
    expected = np.load(path[:-5] + ".npy")
    got = enc.decode()
    assert got.shape == expected.shape
    assert got.tobytes() == expected.tobytes()


@pytest.mark.parametrize("name,enc,expected", list(make_fixtures.cases()),
                         ids=[c[0] for c in make_fixtures.cases()])
def test_encoder_still_writes_fixture_bytes(name, enc, expected):
    with open(os.path.join(HERE, name + ".actc"), "rb") as f:
        assert enc.to_bytes() == f.read()
