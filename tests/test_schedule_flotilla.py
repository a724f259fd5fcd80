"""FLEET Alg. 2 (greedy flotilla creation): a worked example and properties."""

import numpy as np
from hypothesis import given, settings
from hypothesis import strategies as st

from fleet.schedule.flotilla import create_flotilla
from fleet.schedule.rates import ModelProfile, RateTable


def table(rates: dict[str, list[float]], gpn: int = 2) -> RateTable:
    return RateTable(tuple(ModelProfile(k, tuple(v)) for k, v in rates.items()), gpn, 1000)


WORKED = table(
    {
        "A": [100, 180, 250, 310, 360, 400],
        "B": [52, 98, 140, 178, 210, 238],
        "C": [30, 57, 81, 103, 122, 139],
        "D": [91, 170, 240, 300, 350, 390],
    }
)


def test_worked_example():
    # 6 free GPUs, delta = 10 samples/s.
    # 1. fastest on one GPU: A (r_fast = 100) -> A:1, 5 GPUs free.
    # 2. gaps |r(m) - 100| with m <= 5: B(2) = 2 is the smallest -> B:2, 3 free.
    #    then with m <= 3: C gaps 70, 43, 19 (> 10); D(1) = 9 -> D:1, 2 free.
    #    then with m <= 2: C gaps 70, 43 > 10 -> stop.
    # 3. leftovers: slowest of A=100, B=98, D=91 is D -> D:2 (170);
    #    slowest of A=100, B=98, D=170 is B -> B:3 (140). No GPU left.
    flotilla = create_flotilla(WORKED, ["A", "B", "C", "D"], 6, delta=10)
    got = {m.model: (m.matched_gpus, m.gpus, m.rate) for m in flotilla.members}
    assert got == {"A": (1, 1, 100.0), "B": (2, 3, 140.0), "D": (1, 2, 170.0)}
    assert flotilla.reference_rate == 100 and flotilla.pace == 100 and flotilla.gpus == 6


def test_default_delta_is_ten_percent_of_r_fast():
    flotilla = create_flotilla(WORKED, ["A", "B", "C", "D"], 6)
    assert flotilla.delta == 10.0


def test_counts_on_the_falling_side_of_a_curve_are_not_matched():
    # X reaches 100 on 3 GPUs and again on 5 (falling): only m = 3 may be matched.
    t = table({"F": [100, 150], "X": [40, 70, 100, 120, 100]})
    flotilla = create_flotilla(t, ["F", "X"], 8, delta=1)
    assert {m.model: m.matched_gpus for m in flotilla.members} == {"F": 1, "X": 3}


def test_nothing_to_do():
    assert create_flotilla(WORKED, [], 4).members == ()
    assert create_flotilla(WORKED, ["A"], 0).members == ()


@st.composite
def rate_tables(draw):
    models = draw(st.integers(1, 8))
    gpn = draw(st.integers(1, 4))
    rates = {}
    for k in range(models):
        r1 = draw(st.floats(1, 200))
        eff = draw(st.floats(0.5, 1.0))
        depth = draw(st.integers(1, 6))
        rates[f"m{k}"] = [r1 * m * eff ** (m - 1) for m in range(1, depth + 1)]
    return table(rates, gpn)


@settings(max_examples=80, deadline=None)
@given(rate_tables(), st.integers(1, 24), st.one_of(st.none(), st.floats(0.5, 80)))
def test_flotilla_properties(rates, free, delta):
    flotilla = create_flotilla(rates, list(rates.ids), free, delta)
    members = flotilla.members
    assert members, "a flotilla always holds at least the fastest model"
    assert len({m.model for m in members}) == len(members)
    assert all(m.gpus >= m.matched_gpus >= 1 for m in members)
    assert sum(m.gpus for m in members) <= free
    fastest = max(rates.ids, key=lambda i: rates.rate(i, 1))
    assert rates.rate(members[0].model, 1) == rates.rate(fastest, 1)
    # delta is respected by every matched count
    for m in members[1:]:
        assert abs(rates.rate(m.model, m.matched_gpus) - flotilla.reference_rate) <= flotilla.delta + 1e-9
    # leftovers only ever raise a member's rate
    for m in members:
        assert m.rate >= rates.rate(m.model, m.matched_gpus) - 1e-9
    assert np.isclose(flotilla.pace, min(m.rate for m in members))


def test_leftovers_step_over_a_dip_in_a_measured_curve():
    # Measured on shared cores, Y's rate dips at 2 GPUs and passes r(1) at 3: the 3 leftover
    # GPUs take Y to 3 (2 at once), then the last one to 4. Without a free GPU for the jump they stay free.
    t = table({"Y": [2533, 2327, 3492, 4411]})
    assert [(m.gpus, m.rate) for m in create_flotilla(t, ["Y"], 4).members] == [(4, 4411.0)]
    assert [(m.gpus, m.rate) for m in create_flotilla(t, ["Y"], 3).members] == [(3, 3492.0)]
    assert [(m.gpus, m.rate) for m in create_flotilla(t, ["Y"], 2).members] == [(1, 2533.0)]
    falling = table({"Z": [100, 150, 120, 110]})  # past the peak: the last two GPUs stay free
    assert [m.gpus for m in create_flotilla(falling, ["Z"], 4).members] == [2]


def test_copies_tied_at_the_slowest_rate_take_leftovers_together_or_not_at_all():
    # Three copies of one architecture (a sweep's learning rates) tie at 95 samples/s. One
    # more GPU for one copy leaves the stream's pace at 95 and lets that copy run ahead and
    # converge first: with 2 leftovers for 3 copies the GPUs stay free; with 3 each copy takes one.
    t = table({"A": [100, 180], "C1": [95, 180], "C2": [95, 180], "C3": [95, 180]}, gpn=4)
    short = create_flotilla(t, ["A", "C1", "C2", "C3"], 6, delta=10)
    assert {m.model: m.gpus for m in short.members} == {"A": 1, "C1": 1, "C2": 1, "C3": 1}
    assert short.pace == 95 and short.gpus == 4
    enough = create_flotilla(t, ["A", "C1", "C2", "C3"], 7, delta=10)
    assert {m.model: m.gpus for m in enough.members} == {"A": 1, "C1": 2, "C2": 2, "C3": 2}
    assert enough.pace == 100
