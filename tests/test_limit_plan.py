"""The memory limit's solver against brute force on small cases, and its preferences."""
import dataclasses
import itertools
import math

import pytest
from hypothesis import given, settings, strategies as st

from actcodec.torch.limit import limit_plan as lp

STORAGES = (lp.PLAIN, lp.Storage("lossless", 0.8, 2e-10, True),
            lp.Storage("paged", 0.0, 2e-9, True), lp.Storage("8bit", 0.28, 1e-9, False, extra=2e5),
            lp.Storage("4bit", 0.16, 1e-9, False))


def _counts(profile, measured, recompute, storage, chunks=1):
    """Micro-batch counts a plan may take: those giving distinct micro-batch sizes (a count
    between two of them splits into micro-batches no smaller than the lower one's, and costs
    more), and counts already measured with this storage (and these blocks recomputed)."""
    if not profile.split:
        return [1]
    return sorted(set(lp._counts(profile.batch))
                  | {k[0] for k in measured.peaks
                     if k == lp.memory_key(profile, k[0], recompute, storage.name, chunks)}
                  | {m for m, name in measured.worst if name == storage.name})


def brute_force(profile, available, exact, measured=lp.NOTHING):
    plans = {True: [], False: []}
    n = len(profile.blocks)
    for k in range(n + 1):
        for r in itertools.combinations(range(n), k):
            for s in profile.storages:
                if exact and not s.exact:
                    continue
                for c in lp.chunk_counts(profile):
                    for m in _counts(profile, measured, r, s, c):
                        p = lp.predict(profile, m, r, s, measured, c)
                        if p.peak <= available:
                            plans[s.exact].append(p)
    e = min(plans[True], key=lambda p: p.seconds, default=None)
    lossy = min(plans[False], key=lambda p: p.seconds, default=None)
    if lossy is None:
        return e
    if e is None or lossy.seconds * lp.LOSSY_GAIN < e.seconds:
        return lossy
    return e


blocks = st.lists(st.builds(lp.Block, st.sampled_from([1e5, 3e5, 8e5]),
                            st.sampled_from([1e4, 5e4]), st.floats(1e-4, 1e-2),
                            st.sampled_from([0.0, 5e4]), st.just(1e4), st.floats(0, 1e-3)),
                  max_size=5)
profiles = st.builds(
    lp.Profile, batch=st.integers(1, 12), fixed=st.floats(0, 1e7), work=st.floats(0, 1e6),
    rest=st.floats(0, 1e6), blocks=blocks.map(tuple), seconds=st.floats(1e-3, 1e-1),
    per_micro_batch=st.floats(0, 1e-2),
    storages=st.lists(st.sampled_from(STORAGES[1:]), unique=True).map(
        lambda s: (lp.PLAIN, *s)),
    split=st.booleans(), effect=st.floats(0.1, 1.0), least=st.floats(0, 2e6),
    grads=st.floats(0, 1e7), flat=st.one_of(st.none(), st.floats(0, 1e7)),
    unit=st.sampled_from(["sample", "token"]))
# one long sample along its tokens: never split, position-wise chunks on offer
sequences = st.builds(
    lp.Profile, batch=st.sampled_from([100, 256, 1024]), fixed=st.floats(0, 1e7),
    work=st.floats(0, 10.0), rest=st.floats(0, 1e3),
    blocks=st.lists(st.builds(lp.Block, st.sampled_from([1e4, 3e4]), st.sampled_from([1e3]),
                              st.floats(1e-6, 1e-5), st.sampled_from([0.0, 8e3]),
                              st.sampled_from([5e2, 1e3]), st.floats(0, 5e-6)),
                    max_size=4).map(tuple),
    seconds=st.floats(1e-5, 1e-4), storages=st.just((lp.PLAIN, STORAGES[2])),
    split=st.just(False), least=st.floats(0, 1e4), flat=st.one_of(st.none(),
                                                                  st.floats(0, 1e7)),
    unit=st.just("token"))


@st.composite
def measurements(draw, profile):
    peaks = {}
    for _ in range(draw(st.integers(0, 4))):
        m = draw(st.integers(1, profile.batch if profile.split else 1))
        r = tuple(sorted(draw(st.sets(st.integers(0, max(len(profile.blocks) - 1, 0)),
                                      max_size=len(profile.blocks)))))
        s = draw(st.sampled_from(profile.storages)).name
        c = draw(st.sampled_from(lp.chunk_counts(profile)))
        peaks[lp.memory_key(profile, m, r, s, c)] = draw(st.floats(0, 4e7))
    counts = range(1, (profile.batch if profile.split else 1) + 1)
    worst = {(m, s.name): draw(st.floats(0, 2)) for s in profile.storages
             for m in counts[:3] if draw(st.booleans())}
    return lp.Measured(peaks, draw(st.floats(0, 1)), worst)


@settings(max_examples=300, deadline=None)
@given(st.data(), st.one_of(profiles, sequences), st.floats(0, 4e7), st.booleans())
def test_the_solver_finds_what_brute_force_finds(data, profile, available, exact):
    measured = data.draw(measurements(profile))
    got = lp.solve(profile, available, exact, measured)
    want = brute_force(profile, available, exact, measured)
    assert (got is None) == (want is None)
    if got is not None:
        assert got.peak <= available
        assert got.seconds == pytest.approx(want.seconds, rel=1e-9, abs=1e-15)
        assert lp.Storage and (not exact or got.storage in
                               {s.name for s in profile.storages if s.exact})


@settings(max_examples=200, deadline=None)
@given(st.data(), st.one_of(profiles, sequences), st.booleans())
def test_smallest_is_the_least_any_plan_fits_in(data, profile, exact):
    measured = data.draw(measurements(profile))
    least = lp.smallest(profile, exact, measured)
    assert lp.solve(profile, least * (1 + 1e-9) + 1e-6, exact, measured) is not None
    assert lp.solve(profile, least * (1 - 1e-6) - 1, exact, measured) is None


def test_plenty_of_room_is_plain_training():
    p = lp.Profile(batch=8, fixed=1e6, work=1e6, rest=1e6,
                   blocks=(lp.Block(4e6, 1e5, 1e-3),) * 4, seconds=1e-2,
                   per_micro_batch=1e-3, storages=STORAGES)
    plan = lp.solve(p, 1e12)
    assert (plan.micro_batches, plan.recompute, plan.storage) == (1, (), "plain")


def test_exact_plans_win_unless_lossy_is_much_faster():
    blocks = (lp.Block(4e6, 1e5, 1e-4),) * 4
    base = dict(batch=8, fixed=0, work=1e5, rest=0, blocks=blocks, seconds=1e-2,
                per_micro_batch=1e-3)
    # a tight limit: exact needs micro-batches or recomputation, both cheap here
    tight = lp.predict(lp.Profile(**base), 8, range(4), lp.PLAIN).peak * 2
    plan = lp.solve(lp.Profile(**base, storages=STORAGES), tight)
    assert plan.storage in ("plain", "lossless", "paged")
    # recomputation and micro-batches made costly: lossy saves are then worth it
    slow = dict(base, blocks=(lp.Block(4e6, 1e5, 1.0),) * 4, per_micro_batch=1.0)
    no_disk = tuple(s for s in STORAGES if s.name != "paged")
    plan = lp.solve(lp.Profile(**slow, storages=no_disk), tight)
    assert plan.storage in ("8bit", "4bit")
    assert lp.solve(lp.Profile(**slow, storages=no_disk), tight, exact=True).storage in (
        "plain", "lossless")


def test_batch_norm_forbids_micro_batches():
    p = lp.Profile(batch=8, fixed=0, work=1e6, rest=0, split=False)
    assert lp.solve(p, 7e6) is None
    assert lp.smallest(p) == pytest.approx(8e6)
    assert lp.solve(lp.Profile(batch=8, fixed=0, work=1e6, rest=0), 2e6).micro_batches == 4


def test_a_plan_round_trips_through_a_dict():
    plan = lp.Plan(4, (0, 2), "8bit", 1e6, 0.5)
    assert lp.Plan.from_dict(plan.to_dict()) == plan
    assert math.isclose(lp.Plan.from_dict(plan.to_dict()).peak, 1e6)


def test_many_kinds_of_blocks_fall_back_to_an_order():
    blocks = tuple(lp.Block(1e5 * (i + 1), 1e3, 1e-3) for i in range(16))
    sets = lp.recompute_sets(blocks)
    assert len(sets) == 17 and sets[0] == () and len(sets[-1]) == 16


def test_measurements_calibrate_the_caution_per_micro_batches_and_storage():
    """Before a micro-batch count and storage have run, the caller's caution; after, the
    worst measured/model ratio with them less one, plus the margin; a plan run is judged by
    its own largest peak."""
    m = lp.Measured(caution=0.25)
    assert m.peak((1, (), "plain"), 100.0) == pytest.approx(125.0)
    m = m.learn((1, (), "plain"), 110.0, 100.0)
    assert m.peak((1, (), "plain"), 100.0) == 110.0
    calibrated = 100 * (1.10 + lp.CALIBRATED_MARGIN)
    assert m.peak((1, ((5, 1),), "plain"), 100.0) == pytest.approx(calibrated)
    assert m.peak((1, (), "lossless"), 100.0) == pytest.approx(125.0)  # not run yet
    assert m.peak((2, (), "plain"), 100.0) == pytest.approx(125.0)  # nor 2 micro-batches
    m = m.learn((1, ((5, 1),), "plain"), 80.0, 100.0).learn((1, (), "plain"), 90.0, 100.0)
    assert m.peak((1, ((7, 1),), "plain"), 100.0) == pytest.approx(calibrated)  # the worst
    assert m.peaks == {(1, (), "plain"): 110.0, (1, ((5, 1),), "plain"): 80.0}
    m = lp.Measured(caution=0.25).learn((2, (), "paged"), 50.0, 100.0)
    assert m.peak((2, ((5, 1),), "paged"), 100.0) == pytest.approx(100 * (1 + lp.CALIBRATED_MARGIN))


def test_a_storages_own_work_adds_to_each_sample():
    """`extra` (measured by the budget probe) raises the peak by that much per sample of a
    micro-batch, and can make a storage the model would pick lose to another."""
    block = lp.Block(saved=4e5, inputs=1e4, forward=1e-3)
    base = lp.Storage("8bit", 0.25, 1e-10, False)
    profile = lp.Profile(batch=8, fixed=1e6, work=1e5, rest=1e5, blocks=(block,) * 3,
                         seconds=1e-2, per_micro_batch=0.0, storages=(lp.PLAIN, base),
                         split=False, effect=1.0, least=0.0)
    heavy = lp.Storage("8bit", 0.25, 1e-10, False, extra=5e5)
    a, b = (lp.predict(profile, 1, (), s).peak for s in (base, heavy))
    assert b - a == pytest.approx(8 * 5e5)
    assert lp.solve(profile, a, exact=False).storage == "8bit"
    assert lp.solve(dataclasses.replace(profile, storages=(lp.PLAIN, heavy)), a) is None or \
        lp.solve(dataclasses.replace(profile, storages=(lp.PLAIN, heavy)), a).storage != "8bit"


@settings(max_examples=200, deadline=None)
# bytes and seconds: never subnormal (where scaling one rounds it, no bound is kept)
@given(c=st.floats(0, 1e8, allow_subnormal=False), a=st.floats(0, 1e6, allow_subnormal=False),
       b=st.floats(0, 1e4, allow_subnormal=False),
       units=st.floats(1, 4096), other=st.floats(1, 4096))
def test_a_profile_scaled_to_another_shape_bounds_what_it_costs_there(c, a, b, units, other):
    """Per sample, a cost c + a*u + b*u**2 (a part that does not grow, linear parts,
    attention's quadratic scores) measured at `units` elements per sample: the profile
    scaled to `other` never predicts less than the cost there, whether it grew or shrank."""
    cost = lambda u: c + a * u + b * u * u
    profile = lp.Profile(batch=4, fixed=1e6, work=cost(units), rest=cost(units),
                         blocks=(lp.Block(cost(units), cost(units) / 8, 1e-3),), units=units,
                         least=cost(units))
    there = lp.scaled(profile, other)
    for got in (there.work, there.rest, there.blocks[0].saved, there.least):
        assert got >= cost(other) * (1 - 1e-9)
    # and a kind of plan not yet run is trusted no more than the worst any kind has shown
    measured = lp.Measured(caution=0.25, worst={(2, "plain"): 1.7})
    assert measured.peak((3, (), "plain", 1, 1.0), 100.0) >= 170.0
    assert there.fixed == profile.fixed and there.units == other


def test_a_peak_measured_on_a_small_batch_is_not_trusted_for_a_larger_one():
    """A peak measured at batch 4 says nothing of batch 48 on the same plan (issue: a
    batch-48 step planned by a batch-4 measurement went 30% over the limit)."""
    small = lp.Profile(batch=4, fixed=1e6, work=1e6, rest=2e6)
    key = lp.memory_key(small, 1, (), "plain")
    measured = lp.Measured({key: 5e6}, caution=0.25, worst={(1, "plain"): 1.0})
    assert lp.predict(small, 1, (), lp.PLAIN, measured).peak == 5e6
    large = dataclasses.replace(small, batch=48)
    assert lp.predict(large, 1, (), lp.PLAIN, measured).peak > 1e6 + 48 * 3e6
    longer = lp.scaled(small, 3.0)  # the same batch, three times the tokens per sample
    assert lp.predict(longer, 1, (), lp.PLAIN, measured).peak > 1e6 + 4 * 3e6 * 3


def test_gradients_held_through_micro_batches_count_from_the_second():
    profile = lp.Profile(batch=4, fixed=1e6, work=0.0, rest=1e6, grads=5e6)
    one = lp.predict(profile, 1, (), lp.PLAIN)
    two = lp.predict(profile, 2, (), lp.PLAIN)
    assert one.peak == pytest.approx(1e6 + 4e6)
    assert two.peak == pytest.approx(1e6 + 5e6 + 2e6)


def test_two_phases_the_peak_is_the_larger_and_backward_holds_the_recomputed_block():
    """Along a sequence: at the turn every save is held over `fixed`; in backward the
    gradients (`flat`) and, per token, `least` and the saves of the block recomputed then."""
    block = lp.Block(saved=100.0, inputs=10.0, forward=1e-6)
    profile = lp.Profile(batch=1000, fixed=2e5, work=0.0, rest=20.0, blocks=(block, block),
                         flat=3e5, least=5.0, unit="token", split=False)
    plain = lp.predict(profile, 1, (), lp.PLAIN).peak
    assert plain == pytest.approx(max(2e5 + 1000 * 220, 3e5 + 1000 * 5))
    both = lp.predict(profile, 1, (0, 1), lp.PLAIN).peak
    # the turn: rest, both inputs and one block's saves; backward: least and that block's
    assert both == pytest.approx(max(2e5 + 1000 * (20 + 20 + 100), 3e5 + 1000 * (5 + 100)))
    assert lp.smallest(profile) == pytest.approx(both)
    # without `flat`, one phase, as a sample profile has: least is a floor per sample
    one = dataclasses.replace(profile, flat=None)
    assert lp.predict(one, 1, (0, 1), lp.PLAIN).peak == pytest.approx(2e5 + 1000 * 140)


def test_measured_moments_hold_each_blocks_own_bytes_in_backward():
    """Where each block's moment in backward was measured (Block.moment), the turn holds
    what the plan holds (no recomputed block's saves: they come back later), each block's
    moment holds the blocks before it, its own saves and its own constant, and the moments
    outside the blocks hold what the plan holds beyond recomputing every block."""
    block = lp.Block(saved=100.0, inputs=10.0, forward=1e-6, moment=5e4, moment_least=1.0)
    profile = lp.Profile(batch=1000, fixed=1e5, work=0.0, rest=20.0, blocks=(block, block),
                         flat=1e5, least=2.0, unit="token", split=False)
    assert lp.moments_known(profile)
    lean = lp.predict(profile, 1, (0, 1), lp.PLAIN).peak
    # the turn 1e5 + 1000 * 40; block 1's moment: rest, block 0's inputs, its own saves
    assert lean == pytest.approx(max(1e5 + 1000 * 40, 5e4 + 1000 * (1 + 20 + 10 + 100)))
    top = lp.predict(profile, 1, (1,), lp.PLAIN).peak
    # block 0 held whole: the turn 1e5 + 1000 * 130, outside 1e5 + 1000 * (2 + 90), block
    # 1's moment 5e4 + 1000 * (1 + 20 + 100 + 100)
    assert top == pytest.approx(5e4 + 1000 * 221)
    # unmeasured moments: each phase counts the recomputed block's saves
    unknown = dataclasses.replace(profile, blocks=(block, lp.Block(100.0, 10.0, 1e-6)))
    assert not lp.moments_known(unknown)
    assert lp.predict(unknown, 1, (0, 1), lp.PLAIN).peak == pytest.approx(
        max(1e5 + 1000 * (40 + 100), 1e5 + 1000 * (2 + 100)))
    # a longer sequence: the moment's constant stays, its per-token bytes grow
    longer = lp.scaled(dataclasses.replace(profile, units=1000), 2000)
    assert longer.blocks[0].moment == 5e4 and longer.blocks[0].moment_least == 2.0
    assert lp.moment_bytes(profile.blocks, 20.0, 1, (), chunks=1, ratio=0.5) == \
        pytest.approx(0.5 * (20 + 100) + 100)


def test_a_token_profile_scales_per_token_and_never_splits():
    block = lp.Block(saved=100.0, inputs=10.0, forward=1e-6)
    profile = lp.Profile(batch=512, fixed=1e5, work=1.0, rest=20.0, blocks=(block,),
                         seconds=1e-4, units=512, unit="token", split=False)
    longer = lp.scaled(profile, 1024)
    assert longer.rest == pytest.approx(40.0) and longer.blocks[0].saved == pytest.approx(200)
    assert longer.seconds == pytest.approx(1e-4)  # per token: the same
    assert longer.fixed == profile.fixed
    shorter = lp.scaled(profile, 256)
    assert shorter.rest == profile.rest and shorter.blocks == profile.blocks
    # a token profile's key differs from a sample profile's with the same numbers
    sample = dataclasses.replace(profile, unit="sample")
    assert lp.memory_key(profile, 1, (), "plain") != lp.memory_key(sample, 1, (), "plain")


def test_planning_keeps_sequences_apart_from_samples_and_plans_them_unsplit():
    from actcodec.torch.limit import planning

    block = lp.Block(saved=1e4, inputs=1e3, forward=1e-6)
    tokens = lp.Profile(batch=1024, fixed=1e6, work=0.0, rest=2e3, blocks=(block, block),
                        flat=2e6, least=100.0, split=False)
    samples = lp.Profile(batch=8, fixed=1e6, work=1e5, rest=1e6, blocks=(), split=True)
    known = planning.Planning(exact=True)
    known.add(("token", 1024), tokens)
    known.add(("sample", 300.0), samples)
    assert not known.needs_probes(("token", 512), 1e9)  # a shorter sequence: measured
    assert known.needs_probes(("token", 2048), 1e9)  # a longer one: probed
    assert known.at(("token", 2048)).rest == pytest.approx(4e3)
    # one sample of 1024 tokens: planned along its tokens, never in micro-batches
    plan = known.plan(1, ("token", 1024), True, 50e6, None)
    assert plan is not None and plan.micro_batches == 1 and known.profile.batch == 1024
    assert known.profile.unit == "token" and not known.profile.split
    assert known.needed(0, split=True) == known.needed(0, split=False)
    # a sample shape larger than the measured is still planned from the sample profile
    assert known.at(("sample", 600.0)).unit == "sample"


def test_an_encoder_decoder_sample_of_shorter_labels_is_planned_from_a_longer_ones_profile():
    """Each proportion of source to labels has its unit ("token 1:0.25"); a profile serves a
    unit whose every share is at most its own (no more per token of the longest), so that a
    dataset's samples of varying label lengths are not probed again each; planned and kept
    as their own unit (a peak of short labels is no measure of long ones)."""
    from actcodec.torch.limit import planning

    assert planning.covers("token 1:0.25", "token 1:0.2")
    assert planning.covers("token 1:1:0.25", "token 1:1:0.25")
    assert not planning.covers("token 1:0.25", "token 1:0.3")
    assert not planning.covers("token 1:0.25", "token 0.5:1")  # the labels the longest
    assert not planning.covers("token 1:1:0.25", "token 1:0.25")  # other sequences
    assert not planning.covers("token 1:0.25", "token") and not planning.covers(
        "token", "token 1:0.25") and not planning.covers("sample", "token 1:0.25")
    block = lp.Block(saved=1e4, inputs=1e3, forward=1e-6)
    quarter = lp.Profile(batch=1024, fixed=1e6, work=0.0, rest=2e3, blocks=(block,),
                         flat=2e6, least=100.0, split=False)
    known = planning.Planning(exact=True)
    known.add(("token 1:0.25", 1024), quarter)
    known.add(("token 1:0.5", 1024), dataclasses.replace(quarter, rest=4e3))
    assert not known.needs_probes(("token 1:0.2", 1000), 1e9)
    assert known.needs_probes(("token 1:0.6", 1000), 1e9)
    assert known.needs_probes(("token 1:0.2", 2048), 1e9)  # longer: probed
    # the closest that covers: a fifth from the quarter's, a third from the half's
    fifth = known.at(("token 1:0.2", 1000))
    assert fifth.rest == 2e3 and fifth.unit == "token 1:0.2" and fifth.units == 1000
    assert known.at(("token 1:0.3", 512)).rest == 4e3
    plan = known.plan(1, ("token 1:0.2", 1000), False, 50e6, None)
    assert plan is not None and known.profile.unit == "token 1:0.2"
    assert lp.memory_key(known.profile, 1, (), "plain")[5] == "token 1:0.2"


def test_a_shape_no_plan_has_run_at_keeps_the_guess_whatever_the_calibration():
    """A new longest batch lays its memory out first fit: a calibration from other shapes
    (here exact, 1.0) does not lower the caution there."""
    block = lp.Block(saved=1e6, inputs=1e5, forward=1e-3)
    profile = lp.Profile(batch=8, fixed=1e6, work=1e5, rest=1e6, blocks=(block,))
    model = lambda p, r: lp.predict(p, 2, r, lp.PLAIN).peak
    ran = lp.memory_key(profile, 2, (), "plain")
    measured = lp.Measured(caution=0.25).learn(ran, model(profile, ()), model(profile, ()))
    # the same shape, another plan of the calibrated kind: the calibration and its margin
    assert lp.predict(profile, 2, (0,), lp.PLAIN, measured).peak == pytest.approx(
        model(profile, (0,)) * 1.10)
    # a longer sample: no plan has run at that shape, the guess holds
    longer = dataclasses.replace(profile, units=2.0)
    assert lp.predict(longer, 2, (0,), lp.PLAIN, measured).peak == pytest.approx(
        model(longer, (0,)) * 1.25)


def test_a_steps_own_clock_sets_the_times_it_ran_at():
    block = lp.Block(saved=100.0, inputs=1.0, forward=1.0, local=50.0, local_forward=0.4)
    profile = lp.Profile(batch=16, fixed=0.0, work=0.0, rest=0.0, blocks=(block, block),
                         seconds=1.0, per_micro_batch=5.0)
    plan = lp.Plan(2, (1,))
    got = lp.timed(profile, plan, {0: 0.8, 1: 1.6}, 30.0)
    assert [b.forward for b in got.blocks] == pytest.approx([0.05, 0.1])
    assert [b.local_forward for b in got.blocks] == pytest.approx([0.02, 0.04])
    # 30 s less two micro-batches' overhead, per sample, less block 1's recomputation
    assert got.seconds == pytest.approx((30.0 - 10.0) / 16 - 0.1)
    assert lp.predict(got, 2, (1,), lp.PLAIN).seconds == pytest.approx(30.0)
    # what the step does not tell apart: a block without a time, a storage's own work
    assert lp.timed(profile, plan, {0: 0.8}, 30.0) is None
    assert lp.timed(profile, lp.Plan(2, (1,), "lossless"), {0: 0.8, 1: 1.6}, 30.0) is None


def test_a_plan_the_probes_misjudged_gives_way_once_a_step_has_timed_it():
    """Probes of one or two samples on a GPU read a block's forward at several times what it
    costs in a step: recomputation looks dearer than micro-batches. Once a step has run on
    the device's clock, the plan follows what it measured."""
    from actcodec.torch.limit import planning

    block = lp.Block(saved=100.0, inputs=1.0, forward=1.0)
    profile = lp.Profile(batch=16, fixed=0.0, work=0.0, rest=0.0, blocks=(block, block),
                         seconds=1.0, per_micro_batch=5.0)
    known = planning.Planning(exact=True)
    known.add(("sample", 1.0), profile)
    room = 2100 / (1 - planning.SAFETY) + planning.SAFETY_BYTES / (1 - planning.SAFETY) + 1
    first = known.plan(16, ("sample", 1.0), True, room, None)
    assert (first.micro_batches, first.recompute) == (2, ())
    # the step took 26 s on the device's clock, each block's forwards 0.8 s of it
    known.learn_times(first, {0: 0.8, 1: 0.8, "step": 26.0})
    assert known.profiles["sample", 1.0].blocks[0].forward == pytest.approx(0.05)
    then = known.plan(16, ("sample", 1.0), True, room, first)
    assert (then.micro_batches, then.recompute) == (1, (0, 1))
