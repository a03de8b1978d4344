"""The limit's profile (actcodec.torch.step_profile.measure) from synthetic probes: what it
makes of the probes' peaks, whatever room the limit leaves for them."""
import pytest

torch = pytest.importorskip("torch")

from actcodec.torch.limit import step_profile  # noqa: E402

MiB = 1 << 20
FIXED, PER_SAMPLE, SAVED, EXTRA = 40 * MiB, 10 * MiB, 6 * MiB, 3 * MiB


def fake_probe(sizes):
    """A probe whose peak is FIXED + PER_SAMPLE a sample, saving SAVED a sample."""
    def probe(run_loss, params, samples, recompute=(), storage=None, fresh=False, meter=None,
              peak_only=False, moments=False, length=None):
        sizes.append(samples)
        out = step_profile.Probe(samples, recompute)
        out.peak = FIXED + PER_SAMPLE * samples
        if storage is not None:  # the budget: half the saves held, and its own EXTRA a sample
            out.peak += (EXTRA - SAVED / 2) * samples
        out.saved = {None: SAVED * samples}
        out.seconds = 0.01 * samples
        return out
    return probe


@pytest.mark.parametrize("room", [None, 1e12, FIXED + PER_SAMPLE * 12])
def test_a_tight_room_probes_smaller_sizes_and_finds_the_same_profile(monkeypatch, room):
    """With batch norm (k = an eighth of the batch, at least 2) two probe sizes are needed to
    tell the fixed part from what grows; where 2k samples would not fit, k/2 and k."""
    sizes = []
    monkeypatch.setattr(step_profile, "probe", fake_probe(sizes))
    model = torch.nn.Sequential(torch.nn.Linear(4, 4), torch.nn.BatchNorm1d(4))
    profile = step_profile.measure(lambda n: None, model, [], 64, ("plain",), split=False,
                                   spill_dir=None, room=room)
    assert max(sizes) * PER_SAMPLE + FIXED <= (room or float("inf"))
    assert len(set(sizes)) == 2
    grads = sum(p.numel() * p.element_size() for p in model.parameters())
    assert profile.fixed == pytest.approx(FIXED)
    assert profile.grads == grads  # held through micro-batches after the first only
    assert profile.rest == pytest.approx(SAVED)
    assert profile.work == pytest.approx(PER_SAMPLE - SAVED)


class Budgeted:
    budget = None

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        return False


def test_the_budget_probe_measures_the_budgets_own_work(monkeypatch):
    monkeypatch.setattr(step_profile, "probe", fake_probe([]))
    model = torch.nn.Linear(4, 4)
    profile = step_profile.measure(lambda n: None, model, [], 16, ("plain", "budget"),
                                   split=True, spill_dir=None, budgeted=Budgeted())
    budget = next(s for s in profile.storages if s.name == "budget")
    assert budget.extra == pytest.approx(EXTRA)


def test_the_lossless_probe_measures_the_codecs_own_work(monkeypatch):
    """Saves half zeros: the lossless storage holds about half of them; its probe peaks
    EXTRA a sample above what that cut predicts (decoding beside the gradients)."""
    def probe(run_loss, params, samples, recompute=(), storage=None, fresh=False, meter=None,
              peak_only=False, moments=False, length=None):
        out = step_profile.Probe(samples, recompute)
        out.saved = {None: SAVED * samples}
        out.surveys = [(SAVED * samples // 4, SAVED * samples // 8, 4)]  # half nonzero
        ratio = step_profile.storage_ratio(out, None, None)
        out.peak = FIXED + PER_SAMPLE * samples
        if storage is not None:
            out.peak -= (1 - ratio) * SAVED * samples - EXTRA * samples
        out.seconds = 0.01 * samples
        return out

    monkeypatch.setattr(step_profile, "probe", probe)
    profile = step_profile.measure(lambda n: None, torch.nn.Linear(4, 4), [], 16,
                                   ("plain", "lossless"), split=True, spill_dir=None,
                                   lossless=Budgeted())
    lossless = next(s for s in profile.storages if s.name == "lossless")
    assert 0.4 < lossless.ratio < 0.6
    assert lossless.extra == pytest.approx(EXTRA)


def test_no_probe_follows_one_that_went_past_the_room(monkeypatch):
    """One sample's probe already beyond the room: no larger probe, no recomputation or
    storage probe runs, and no plan is trusted below what it peaked at."""
    from actcodec.torch.limit import limit_plan

    sizes = []
    monkeypatch.setattr(step_profile, "probe", fake_probe(sizes))
    room = FIXED + PER_SAMPLE // 2
    profile = step_profile.measure(lambda n: None, torch.nn.Linear(4, 4), [], 16,
                                   ("plain", "paged"), split=True, spill_dir=None, room=room,
                                   paged=Budgeted(), budgeted=Budgeted(), lossless=Budgeted())
    assert sizes == [1, 1]
    assert limit_plan.smallest(profile) >= FIXED + PER_SAMPLE - 1


def test_what_the_probes_before_left_live_counts_against_the_room(monkeypatch):
    """Each probe's peak is measured above what is live as it starts, which the probes before
    it raise (lazy state, pages kept): the room is above what was live before the first, so
    no probe is run whose peak, from there, would go past it."""
    from actcodec.torch.limit import meter as meters

    DRIFT = 30 * MiB  # what each probe leaves live

    class Drifting(meters.ProcessMeter):
        level = 0

        def live(self):
            return self.level

    meter = Drifting()
    tops = []
    fake = fake_probe([])

    def probe(*args, **kwargs):
        out = fake(*args, **kwargs)
        tops.append(meter.level + out.peak)  # where it peaked, above the first's start
        meter.level += DRIFT
        return out

    monkeypatch.setattr(step_profile, "probe", probe)
    room = 105 * MiB  # two samples (60 MiB) fit from the start, not after two probes
    step_profile.measure(lambda n: None, torch.nn.Linear(4, 4), [], 16, ("plain",),
                         split=True, spill_dir=None, room=room, meter=meter)
    assert len(tops) >= 2 and max(tops) <= room


def test_two_samples_are_predicted_from_the_first_run_of_one(monkeypatch):
    """A probe run twice peaks higher on its first run (its layout first fit): the first
    run of two samples is predicted from one sample's first run, not its second, and is not
    run where that would go past the room."""
    peaks = []

    def probe(run_loss, params, samples, recompute=(), storage=None, fresh=False, meter=None,
              peak_only=False, moments=False, length=None):
        out = step_profile.Probe(samples, recompute)
        first = peak_only and not recompute and storage is None  # the warm-up run
        out.peak = (60 if first else 40) * MiB * samples
        out.saved = {None: 10 * MiB * samples}
        out.seconds = 0.01 * samples
        if not recompute and storage is None:
            peaks.append((samples, out.peak))
        return out

    monkeypatch.setattr(step_profile, "probe", probe)
    room = 100 * MiB  # two samples at the second run's 40 MiB each fit; at the first's 60 not
    step_profile.measure(lambda n: None, torch.nn.Linear(4, 4), [], 16, ("plain",),
                         split=True, spill_dir=None, room=room)
    assert all(samples == 1 for samples, _ in peaks), peaks


def fake_block_probe(calls, grads):
    """Two blocks saving BLOCK a sample each; a plain probe peaks FIXED + (2 BLOCK + 2 MiB) a
    sample, one that recomputes both `grads` + (BLOCK + 2 MiB) a sample: a fixed part of its
    own (the gradients built up in backward), and the whole cut in what is held seen."""
    def probe(run_loss, params, samples, recompute=(), storage=None, fresh=False, meter=None,
              peak_only=False, moments=False, length=None):
        calls.append((samples, tuple(recompute)))
        out = step_profile.Probe(samples, recompute)
        if recompute:
            out.peak = grads + (BLOCK + 2 * MiB) * samples
        else:
            out.peak = FIXED + (2 * BLOCK + 2 * MiB) * samples
        out.saved = {0: BLOCK * samples, 1: BLOCK * samples}
        out.seconds = 0.01 * samples
        return out
    return probe


BLOCK = 8 * MiB


@pytest.mark.parametrize("cold", [False, True])
def test_recomputations_effect_comes_from_two_sizes_where_probes_start_from_nothing(
        monkeypatch, cold):
    """One size counts the lean probe's own fixed part (60 MiB of gradients against the plain
    probe's 40) as a cut that is not there. Where each probe starts from nothing kept (a CUDA
    cache emptied per probe) a second lean probe gives the slope, and the effect is whole; on
    the CPU, where a probe's second run reuses its first's pages, no such probe runs."""
    from actcodec.torch.limit import meter as meters

    class Cold(meters.ProcessMeter):
        cold_probes = True

    calls = []
    monkeypatch.setattr(step_profile, "probe", fake_block_probe(calls, 60 * MiB))
    model = torch.nn.Sequential(torch.nn.Linear(4, 4), torch.nn.Linear(4, 4))
    profile = step_profile.measure(lambda n: None, model, list(model), 16, ("plain",),
                                   split=True, spill_dir=None,
                                   meter=Cold() if cold else meters.ProcessMeter())
    lean_sizes = {samples for samples, recompute in calls if recompute}
    if cold:
        assert lean_sizes == {1, 2}
        assert profile.effect == pytest.approx(1.0)
    else:
        assert lean_sizes == {1}
        assert profile.effect == pytest.approx(0.1)  # the one-size reading, at its floor


def lean_probe(samples, blocks, outside, peak):
    out = step_profile.Probe(samples, (0, 1))
    out.peak = peak
    out.moments = step_profile.Moments(None, 0)
    out.moments.blocks, out.moments.outside = dict(enumerate(blocks)), outside
    return out


def test_backwards_moments_are_lines_through_the_two_lean_probes():
    """Each block's moment: a line through its two lean probes' live peaks, per token beyond
    the bytes it holds there (where it grows by less, by those, through the larger probe);
    outside the blocks the same; what each probe's RSS peak held beyond its largest moment
    added to all (the larger of the two)."""
    from actcodec.torch.limit import limit_plan as lp

    block = lp.Block(saved=100.0, inputs=10.0, forward=1e-6)
    low = lean_probe(100, (3e4, 3e4), 5e4, 8e4)  # 3e4 resident beyond its largest moment
    high = lean_probe(200, (5e4, 3.5e4), 4.8e4, 7.9e4)
    found, (flat, least) = step_profile._moment_lines([block, block], 20.0, low, high)
    # block 0 holds rest and its saves (120 a token) and grows by 200: 80 beyond
    assert found[0].moment_least == pytest.approx(80) and \
        found[0].moment == pytest.approx(5e4 - 200 * 200 + 3e4)
    # block 1 holds 130 a token and grows by 50: taken as 130, through the larger probe
    assert found[1].moment_least == 0 and found[1].moment == pytest.approx(3.5e4 - 200 * 130
                                                                           + 3e4)
    assert least == 0 and flat == pytest.approx(4.8e4 + 3e4)
    assert step_profile._moment_lines([block, block], 20.0, low, None) is None
    low.moments.blocks.pop(1)  # a block whose moment was not told apart
    assert step_profile._moment_lines([block, block], 20.0, low, high) is None


def test_a_peak_growing_as_the_square_of_the_length_is_extrapolated_as_one():
    """Along a sequence, three lean probes tell a square's growth from a line's: _curve adds
    at the whole length exactly what the square grows beyond the line through the two
    larger probes, and nothing where the peaks lie on a line (or bend below one)."""
    def probe(tokens, peak):
        p = step_profile.Probe(tokens)
        p.peak = peak
        return p

    def square(x):
        return 100.0 + 3.0 * x + 0.5 * x * x

    low, mid, high = (probe(t, square(t)) for t in (256, 512, 1024))
    line_at = high.peak + (2048 - 1024) * (high.peak - mid.peak) / (1024 - 512)
    assert line_at + step_profile._curve(low, mid, high, 2048) == pytest.approx(square(2048))
    flat = [probe(t, 100.0 + 3.0 * t) for t in (256, 512, 1024)]
    assert step_profile._curve(*flat, 2048) == 0.0
    bent = [probe(t, 100.0 + 30.0 * t ** 0.5) for t in (256, 512, 1024)]
    assert step_profile._curve(*bent, 2048) == 0.0
    assert step_profile._curve(low, mid, high, 1024) == 0.0  # nothing beyond the probes
    # a shorter probe above a longer one: peaks within their noise, no square read from them
    # (BART at 1 x 2048 tokens: lean probes of 64, 128 and 256 tokens at these MiB)
    noisy = [probe(t, m * MiB) for t, m in ((64, 119.8), (128, 113.4), (256, 133.6))]
    assert step_profile._curve(*noisy, 2048) == 0.0
