"""The budget's planner alone: numbers in, a choice per site out (no torch involved)."""
import itertools

import pytest
from hypothesis import given, settings, strategies as st

pytest.importorskip("torch")  # the planner lives in actcodec.torch, though it uses none of it
from actcodec.torch.budget import planner  # noqa: E402


@st.composite
def sites(draw, max_sites=3):
    out = {}
    for i in range(draw(st.integers(1, max_sites))):
        n = draw(st.integers(64, 4096))
        fine = draw(st.floats(1e-6, 10.0))
        gain = draw(st.floats(0.0, 100.0))
        out[i] = planner.Site(n=n, nnz=draw(st.integers(0, n)), esize=draw(st.sampled_from([2, 4])),
                              noise1={64: fine, 256: fine * draw(st.floats(1.0, 8.0))},
                              min_bits=draw(st.sampled_from([2, 4])), gain=gain,
                              peak=gain * draw(st.floats(0.0, 1.0)))
    return out


def span(sites, fraction):
    """(fewest bytes, most bytes, a budget `fraction` of the way between) of these sites."""
    floor = sum(s.nbytes(s.ladder()[0]) for s in sites.values())
    top = sum(s.nbytes(s.ladder()[-1]) for s in sites.values())
    return floor, top, int(floor + fraction * (top - floor))


def cost(sites, plan):
    return sum(sites[k].nbytes(c) for k, c in plan.items())


def error(sites, plan):
    return sum(sites[k].error(c) for k, c in plan.items())


def worst(sites, plan):
    return max(sites[k].worst(c) for k, c in plan.items())


def combos(sites, budget):
    keys = list(sites)
    for combo in itertools.product(*(sites[k].ladder() for k in keys)):
        plan = dict(zip(keys, combo))
        if cost(sites, plan) <= budget:
            yield plan


@settings(max_examples=200, deadline=None)
@given(sites(), st.floats(0.0, 1.5))
def test_the_plan_fits_holds_the_worst_lowest_and_then_the_sum_near_the_best(sites, fraction):
    floor, top, budget = span(sites, fraction)
    plan = planner.plan(sites, budget)
    # up the ladders, or uniform bits where those beat that by the plan's own estimate
    assert all(plan[k] in sites[k].ladder() for k in sites) or \
        plan in (planner.uniform(sites, c) for c in planner.CHOICES)
    assert cost(sites, plan) <= max(budget, floor)
    fitting = list(combos(sites, budget))
    if not fitting:
        return
    # First the worst one parameter gets: the lowest any choice within the budget gives.
    assert worst(sites, plan) <= min(worst(sites, p) for p in fitting) * (1 + 1e-9) + 1e-300
    if budget >= top:
        assert error(sites, plan) == 0
    # Then greedy by error removed per byte up convex ladders, from those floors: no worse
    # than the best plan above them with the largest single step less to spend.
    level = worst(sites, plan)
    steps = [s.nbytes(b) - s.nbytes(a) for s in sites.values()
             for a, b in zip(s.ladder(), s.ladder()[1:])]
    above = [p for p in combos(sites, budget - max(steps, default=0))
             if worst(sites, p) <= level * (1 + 1e-9) + 1e-300]
    if above:
        assert error(sites, plan) <= min(error(sites, p) for p in above) + 1e-12


def test_a_ladder_is_convex_and_respects_min_bits():
    site = planner.Site(n=4096, nnz=4096, esize=4, noise1={64: 1.0, 256: 2.0}, min_bits=4)
    ladder = site.ladder()
    assert all(c is None or c[0] >= 4 for c in ladder) and ladder[-1] is None
    points = [(site.nbytes(c), site.error(c)) for c in ladder]
    assert [b for b, _ in points] == sorted(b for b, _ in points)
    ratios = [(e0 - e1) / (b1 - b0) for (b0, e0), (b1, e1) in zip(points, points[1:])]
    assert ratios == sorted(ratios, reverse=True)


def test_a_site_stored_with_a_named_codec_is_sized_by_it():
    """A ReLU output's lossy choices are stored as bitmap_quant even where dense quant would
    be smaller: the plan counts those bytes."""
    dense = planner.Site(n=4096, nnz=4090, esize=4, noise1={64: 1.0, 256: 2.0})
    relu = planner.Site(n=4096, nnz=4090, esize=4, noise1={64: 1.0, 256: 2.0},
                        codec="bitmap_quant")
    assert relu.nbytes((8, 256)) == dense.nbytes((8, 256)) + 4096 // 8 - 6 * 1
    assert relu.nbytes(None) == dense.nbytes(None)  # lossless: the smallest, as before


def test_the_margin_is_left_only_for_payloads_whose_size_follows_the_data():
    dense = planner.Site(n=3000, nnz=3000, esize=4, noise1={64: 1.0, 256: 2.0})
    sparse = planner.Site(n=1000, nnz=400, esize=4, noise1={64: 1.0, 256: 2.0})
    relu = planner.Site(n=1000, nnz=1000, esize=4, noise1={64: 1.0, 256: 2.0},
                        codec="bitmap_quant")
    assert planner.data_dependent_share({0: dense}) == 0
    assert planner.data_dependent_share({0: dense, 1: sparse}) == 0.25
    assert planner.data_dependent_share({0: dense, 1: sparse, 2: relu}) == 0.4
    assert planner.data_dependent_share({}) == 1.0


def test_a_plan_its_own_estimate_says_is_beaten_gives_way():
    s = {0: planner.Site(n=4096, nnz=4096, esize=4, noise1={64: 1.0, 256: 2.0}, gain=1.0),
         1: planner.Site(n=4096, nnz=4096, esize=4, noise1={64: 1.0, 256: 2.0}, gain=1.0)}
    lopsided = {0: (2, 64), 1: (8, 256)}  # one save at 2 bits, the other at 8
    even = planner.uniform(s, (4, 64))
    assert even == {0: (4, 64), 1: (4, 64)}
    assert planner.nbytes(s, even) <= planner.nbytes(s, lopsided)
    assert planner.least_error(s, [lopsided, even]) == even  # better worst and total
    assert planner.least_error(s, [even, lopsided]) == even  # the first stays unless beaten
    # no site may go below its floor, and a group size whose noise is unknown gives no plan
    s[1].min_bits = 8
    assert planner.uniform(s, (2, 64)) == {0: (2, 64), 1: (8, 64)}
    assert planner.uniform({0: planner.Site(n=64, nnz=64, esize=4, noise1={64: 1.0})},
                           (4, 256)) is None


@settings(max_examples=200, deadline=None)
@given(sites(), st.floats(0.0, 1.5))
def test_no_uniform_plan_that_fits_beats_the_plan(sites, fraction):
    budget = span(sites, fraction)[2]
    plan = planner.plan(sites, budget)
    got = planner.estimate(sites, plan)
    for c in planner.CHOICES:
        u = planner.uniform(sites, c)
        if u is not None and planner.nbytes(sites, u) <= budget:
            e = planner.estimate(sites, u)
            assert not (e[0] <= got[0] and e[1] <= got[1] and e != got), (c, e, got)
