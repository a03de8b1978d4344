"""A repeated block measured alone at a long sample's whole length (limit/block_alone.py):
eager attention's scores over every pair of positions grow as the square of the length,
which the probes' lines through a quarter and a half of the sequence under-measure."""
import pytest

torch = pytest.importorskip("torch")

from actcodec.torch.limit import block_alone, blocks, limit_plan, step_profile  # noqa: E402
from actcodec.torch.limit import meter as meters  # noqa: E402

MiB = 1 << 20


class EagerAttention(torch.nn.Module):
    """Scores over every pair of positions, masked and soft-maxed as tensors of their own
    (what transformers' eager attention does), then an MLP."""

    def __init__(self, width: int = 32, heads: int = 4):
        super().__init__()
        self.heads = heads
        self.qkv = torch.nn.Linear(width, 3 * width)
        self.out = torch.nn.Linear(width, width)
        self.mlp = torch.nn.Sequential(torch.nn.Linear(width, 4 * width), torch.nn.GELU(),
                                       torch.nn.Linear(4 * width, width))

    def forward(self, x, mask=None):
        b, t, w = x.shape
        q, k, v = self.qkv(x).view(b, t, 3, self.heads, w // self.heads).permute(
            2, 0, 3, 1, 4)
        scores = q @ k.transpose(-1, -2) / (w // self.heads) ** 0.5
        scores = scores.masked_fill(mask, float("-inf"))
        attended = (scores.softmax(-1) @ v).transpose(1, 2).reshape(b, t, w)
        x = x + self.out(attended)
        return x + self.mlp(x)


class TinyLM(torch.nn.Module):
    def __init__(self, layers: int = 3, width: int = 32, vocab: int = 64):
        super().__init__()
        self.embed = torch.nn.Embedding(vocab, width)
        self.blocks = torch.nn.ModuleList(EagerAttention(width) for _ in range(layers))
        self.head = torch.nn.Linear(width, vocab)

    def forward(self, ids):
        t = ids.shape[1]
        mask = torch.ones(t, t, dtype=torch.bool).triu(1)
        x = self.embed(ids)
        for block in self.blocks:
            x = block(x, mask=mask)
        return self.head(x)


def loss_of(model, ids):
    def run_loss(n):
        logits = model(ids[:, :n])
        return torch.nn.functional.cross_entropy(logits.flatten(0, 1), ids[0, :n])
    return run_loss


def test_a_block_alone_gets_the_models_own_inputs_and_saves_its_scores():
    torch.manual_seed(0)
    model = TinyLM()
    ids = torch.randint(0, 64, (1, 512))
    call = block_alone.inputs_at(loss_of(model, ids), model.blocks[1], 384)
    assert call is not None
    args, kwargs = call
    assert args[0].shape == (1, 384, 32) and not args[0].requires_grad
    assert kwargs["mask"].shape == (384, 384)
    # the capture ran the model only up to the block: nothing of it is left with gradients
    assert all(p.grad is None for p in model.parameters())
    found = block_alone.run_alone(model.blocks[1], call, meters.ProcessMeter(), 384)
    scores = 4 * 384 * 384 * 4  # heads x T x T float32
    # it saves its scores' softmax at least, and its backward holds more than that
    assert found.saves >= scores and found.peak > found.saves and found.reach > 0
    assert all(p.grad is None for p in model.parameters())  # its parameters' are not taken


def test_lengths_run_double_up_to_the_whole_only_where_the_square_fits(monkeypatch):
    torch.manual_seed(0)
    model = TinyLM()
    ids = torch.randint(0, 64, (1, 1024))
    runs = []
    run_alone = block_alone.run_alone
    monkeypatch.setattr(block_alone, "run_alone",
                        lambda *args: runs.append(run_alone(*args)) or runs[-1])
    meter = meters.ProcessMeter()
    whole = block_alone.measure(loss_of(model, ids), model.blocks[0], 256, 1024, meter,
                                lambda nbytes: True)
    assert [r.tokens for r in runs] == [256, 512, 1024] and whole is runs[-1]
    assert not whole.bound
    runs.clear()
    asked = []

    def fits(nbytes):  # the whole length's square does not fit: the half is the last run
        asked.append(nbytes)
        return len(asked) < 2

    bound = block_alone.measure(loss_of(model, ids), model.blocks[0], 256, 1024, meter, fits)
    assert [r.tokens for r in runs] == [256, 512] and len(asked) == 2
    half = runs[-1]
    # the half's bytes scaled as the square stand for the whole
    assert bound.bound and bound.tokens == 1024
    assert (bound.saves, bound.peak, bound.reach) == pytest.approx(
        (4 * half.saves, 4 * half.peak, 4 * half.reach))
    assert asked[1] >= 4 * half.reach  # and what was asked held that at least


def test_what_a_block_measured_alone_adds_goes_to_the_blocks_that_save_squares():
    block = limit_plan.Block(saved=100.0, inputs=10.0, forward=1e-6, moment=5e3,
                             moment_least=20.0)
    found = [block, block, block]
    alone = block_alone.Alone(tokens=1000, saves=150.0 * 1000, peak=400.0 * 1000,
                              reach=450.0 * 1000)
    fixed = block_alone.corrected(found, {0: 7, 1: 5}, 0, alone)
    # saves 50 a token short, and the moment's own part (saves + working) 400 - 170 = 230
    assert fixed[0].saved == fixed[1].saved == 150.0
    assert fixed[0].moment_least == fixed[1].moment_least == pytest.approx(250.0)
    assert fixed[2] == block  # no square saves: its line stands
    assert block_alone.working(fixed, 0, alone) == pytest.approx(250.0)
    # where the probes' lines already say as much, nothing changes
    assert block_alone.corrected(found, {0: 7}, 0, block_alone.Alone(1000, 5e4, 1e5, 1e5)) \
        == found


def test_the_profile_of_a_long_sample_holds_what_its_blocks_measure_alone():
    """Along a sequence, a profile from probes of a quarter and a half of 2048 tokens: every
    plan's peak at the whole length is at least one block's own forward and backward there
    (the lines through the probes said about half of that for the scores)."""
    torch.manual_seed(0)
    model = TinyLM(layers=2, width=16)
    ids = torch.randint(0, 64, (1, 2048))
    meter = meters.ProcessMeter()
    blocks.attach(list(model.blocks))  # as a Step does: the probes tell the blocks apart
    profile = step_profile.measure(loss_of(model, ids), model, list(model.blocks), 2048,
                                   ("plain",), split=False, spill_dir=None, first=512,
                                   meter=meter)
    whole = block_alone.run_alone(model.blocks[1], block_alone.inputs_at(
        loss_of(model, ids), model.blocks[1], 2048), meter, 2048)
    for recompute in [(), (0,), (0, 1)]:
        peak = limit_plan.phases(profile, recompute, limit_plan.PLAIN, 2048)
        assert peak >= 0.95 * whole.peak, (recompute, peak / MiB, whole.peak / MiB)
    # and the turn holds every block's saves at the whole length, squares included
    assert limit_plan.held_bytes(profile, ()) * 2048 >= 0.95 * 2 * whole.saves


def test_a_block_that_runs_only_inside_its_model_is_left_to_the_lines_with_a_warning():
    class Inside(EagerAttention):
        def forward(self, x, mask=None, *, parent=None):
            if parent is None or not parent.running:
                raise RuntimeError("called outside its model")
            return super().forward(x, mask)

    class Parent(TinyLM):
        running = False

        def forward(self, ids):
            t = ids.shape[1]
            mask = torch.ones(t, t, dtype=torch.bool).triu(1)
            self.running = True
            try:
                x = self.embed(ids)
                for block in self.blocks:
                    x = block(x, mask=mask, parent=self)
                return self.head(x)
            finally:
                self.running = False

    torch.manual_seed(0)
    model = Parent()
    model.blocks = torch.nn.ModuleList(Inside() for _ in range(2))
    ids = torch.randint(0, 64, (1, 256))
    with pytest.warns(RuntimeWarning, match="Inside could not be run alone"):
        assert block_alone.measure(loss_of(model, ids), model.blocks[0], 128, 256,
                                   meters.ProcessMeter(), lambda nbytes: True) is None
