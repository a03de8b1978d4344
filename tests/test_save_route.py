"""The save path's route: one saved CPU tensor, from the hook's pack to the C call and back in
backward, enters few files of actcodec and never climbs back into a file it left (except the
decode-time callback that times decodes into the statistics, by design)."""
import os
import sys

import pytest

torch = pytest.importorskip("torch")

import actcodec  # noqa: E402
import actcodec.torch as act  # noqa: E402

ROOT = os.path.dirname(actcodec.__file__)
# Called back from a lower file by design: the statistics timing a decode, and the allocator
# of worst-case scratch the save path hands the codecs (torch's, so the store can serve it).
CALLBACKS = {"on_decode", "scratch"}


def trace(fn):
    """(files entered in order of first entry, re-entries): a re-entry is a call into a file
    that is already on the stack below a frame of another file."""
    files, reentries = [], []

    def rel(code):
        f = code.co_filename
        return os.path.relpath(f, ROOT) if f.startswith(ROOT + os.sep) else None

    def prof(frame, event, arg):
        if event != "call":
            return
        here = rel(frame.f_code)
        if here is None:
            return
        if here not in files:
            files.append(here)
        below, f = [], frame.f_back
        while f is not None:
            below.append(rel(f.f_code))
            f = f.f_back
        mine = [b for b in below if b is not None]
        if mine and mine[0] != here and here in mine and frame.f_code.co_name not in CALLBACKS:
            reentries.append((here, frame.f_code.co_name, mine[0]))

    sys.setprofile(prof)
    try:
        fn()
    finally:
        sys.setprofile(None)
    return files, reentries


# A ReLU output is stored sparse (a bitmap pass, then bitmap + 8-bit values): its route also
# enters those two codecs' files.
@pytest.mark.parametrize("make,codec_files", [(lambda x: x.exp(), 0), (lambda x: x.relu(), 2)],
                         ids=["dense", "relu"])
def test_one_saved_tensor_enters_few_files_and_never_climbs_back(make, codec_files):
    x = torch.randn(64, 1024, requires_grad=True)
    ctx = act.compress_saved(act.Policy(bits=8))
    for _ in range(2):  # the second step profiles for the guard; the route is the others'
        with ctx:
            loss = make(x * 1.0).sum()
        loss.backward()
    before = ctx.stats.tensors
    y = x * 1.0
    out = {}
    with ctx:
        pack_files, pack_back = trace(lambda: out.setdefault("z", make(y)))
    loss = out["z"].sum()
    back_files, back_back = trace(loss.backward)
    assert ctx.stats.tensors == before + 1
    files = list(dict.fromkeys(pack_files + back_files))
    assert not pack_back and not back_back, (pack_back, back_back)
    # save, policy, the guard (guard, and the site numbering it shares with the budget in
    # sensitivity), packed, encoder, choice, the codec, the payload allocator
    assert len(files) <= 10 + codec_files, files
    assert not any(f.startswith(("apps", "reduce")) for f in files)
