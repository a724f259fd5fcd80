"""How grouped learning cuts the groups' work into streams (`fleet.schedule.group_plan`), by hand."""

from dataclasses import replace

import pytest

from fleet.schedule.group_plan import (
    Narrowing,
    Unit,
    decode_per_gpu,
    fastest_count,
    group_units,
    head_start,
    held_narrowing,
    narrowed,
    rest,
    planned_end,
    rate_matched,
    scheduled,
    widened,
    width,
)
from fleet.schedule.rates import ModelProfile

# r(1..4) on one node of 4 GPUs, then a node boundary: r(5) gains little, r(6..8) by Eq. 5
SCALING = ModelProfile("a", (100.0, 190.0, 270.0, 340.0, 350.0, 360.0, 365.0, 366.0))
# a model whose rate grows less past a node's four GPUs (+40/s a GPU) than within it (+70/s)
PAST_NODE = ModelProfile("n", (100.0, 190.0, 270.0, 340.0, 380.0, 420.0, 455.0, 485.0))


def unit(name: str, seconds: float, gpus: int = 1, group: str = "g") -> Unit:
    """A one-model unit that trains `seconds` on `gpus` GPUs (rate 1 per GPU)."""
    return Unit(group, (name,), (gpus,), (seconds * gpus,), (float(gpus),))


def test_width_is_one_gpu_when_the_model_fits_and_the_fewest_that_meet_the_target_otherwise():
    assert width(SCALING, 1000.0, 10.0, 4, 64) == 1  # 10 s on one GPU
    assert width(SCALING, 1000.0, 5.3, 4, 64) == 2  # 1000 / 190 = 5.26 s
    assert width(SCALING, 1000.0, 3.0, 4, 64) == 4  # 1000 / 340 = 2.94 s
    assert width(SCALING, 1000.0, 1.0, 4, 64) == fastest_count(SCALING, 4, 64) == 8  # never: its fastest
    assert width(SCALING, 1000.0, 1.0, 4, 3) == 3  # no more GPUs than the job's


def test_widened_keeps_a_member_at_least_as_wide_as_it_was():
    assert widened(SCALING, 1, 180.0, 4, 64) == 2
    assert widened(SCALING, 3, 180.0, 4, 64) == 3
    assert widened(SCALING, 1, 10_000.0, 4, 64) == 8


def test_rate_matched_sets_share_a_stream_only_within_the_tolerance():
    # paper100's first configurations on one GPU: two densenets 3 % apart, the resnets apart
    assert rate_matched([55.1, 56.6, 42.0, 69.6], 0.05) == [[3], [1, 0], [2]]
    assert rate_matched([55.1, 56.6, 42.0, 69.6], 0.5) == [[3, 1, 0, 2]]
    units = group_units("g", ["a", "b", "c"], [1, 1, 2], [10.0, 10.0, 10.0], [50.0, 49.0, 80.0], 4.0, 0.05)
    assert [u.models for u in units] == [("c",), ("b", "a")]  # in a unit, the longest on its count first
    assert units[1].pace == 49.0 and units[1].decode_rate == pytest.approx(49.0 / 4)
    shared = group_units("g", ["a", "b", "c"], [1, 1, 2], [10.0, 10.0, 10.0], [50.0, 49.0, 80.0], 4.0, None)
    assert len(shared) == 1 and shared[0].gpus == 4 and shared[0].pace == 49.0


def test_a_unit_lasts_its_longest_member_at_the_stream_s_pace():
    u = Unit("g", ("a", "b"), (1, 2), (100.0, 300.0), (10.0, 20.0), 2.0)
    assert u.seconds == 30.0 and u.gpus == 3
    assert u.gpu_seconds == pytest.approx((1 * 100 + 2 * 300) / 10)  # each holds its GPUs until its samples are done


def test_the_rest_of_a_unit_knows_which_of_its_models_were_launched():
    u = Unit("g", ("a", "b", "c"), (2, 1, 1), (3.0, 2.0, 1.0), (1.0, 1.0, 1.0))
    left = rest(u, 1)
    assert left.models == ("b", "c") and left.counts == (1, 1) and left.started == ("a",)
    assert rest(left, 1).started == ("a", "b")


def test_decode_per_gpu_weighs_each_stream_by_the_gpu_time_it_holds():
    one = Unit("g", ("a", "b"), (1, 1), (100.0, 100.0), (10.0, 10.0), 1.0)  # 2 GPUs, 10 s, decodes 10/s
    alone = Unit("h", ("c",), (1,), (100.0,), (10.0,), 1.0)  # 1 GPU, 10 s, decodes 10/s
    assert decode_per_gpu([one]) == pytest.approx(5.0) and decode_per_gpu([alone]) == pytest.approx(10.0)
    assert decode_per_gpu([one, alone]) == pytest.approx(200 / 30)
    assert decode_per_gpu([]) == 0.0


def never_wider(u: Unit, pace: float) -> Unit:
    return u


def twice_as_wide(u: Unit, pace: float) -> Unit:
    """Every member on twice its GPUs at twice its rate (perfect scaling)."""
    return replace(u, counts=tuple(2 * c for c in u.counts), rates=tuple(2 * r for r in u.rates))


def test_the_list_schedule_starts_units_in_order_on_the_gpus_that_come_free_first():
    units = [unit("a", 10.0), unit("b", 6.0), unit("c", 4.0), unit("d", 3.0)]
    order, end = scheduled(units, 2, 0.0, never_wider)
    assert order == units and end == pytest.approx(13.0)  # a 0-10, b 0-6, c 6-10, d 10-13


def test_a_unit_s_later_members_start_as_their_gpus_come_free():
    first = unit("a", 10.0)
    pair = Unit("g", ("b", "c"), (1, 1), (20.0, 5.0), (1.0, 1.0))  # b 20 s, c 5 s at the pace of 1
    assert scheduled([first, pair], 2, 0.0, never_wider)[1] == pytest.approx(20.0)  # b 0-20, c 10-15


def test_a_small_group_s_members_start_at_once_where_the_wait_for_their_gpus_is_short():
    pair = Unit("g", ("b", "c"), (1, 1), (20.0, 5.0), (1.0, 1.0), together=True)  # b 20 s, c 5 s
    # a ends at 1: the pair waits 1 s (5 % of its 20 s) and starts whole, b 1-21, c 1-6; a
    # member joining its stream later would have the group decoded again
    assert scheduled([unit("a", 1.0), pair], 2, 0.0, never_wider)[1] == pytest.approx(21.0)
    assert scheduled([unit("a", 1.0), replace(pair, together=False)], 2, 0.0, never_wider)[1] == pytest.approx(20.0)
    # a ends at 10: waiting half its run is too long (`JOIN_WAIT`), b 0-20 and c 10-15 join
    assert scheduled([unit("a", 10.0), pair], 2, 0.0, never_wider)[1] == pytest.approx(20.0)
    # a unit wider than the job, or one some of whose members started, joins member by member
    assert scheduled([unit("a", 1.0), pair], 1, 0.0, never_wider)[1] == pytest.approx(26.0)  # a, b 1-21, c 21-26


def test_head_start_is_when_enough_gpus_come_free():
    assert head_start(0.0, 1, [5.0, 2.0, 8.0], 3) == 5.0  # two more needed: at 2 and 5
    assert head_start(4.0, 2, [1.0], 2) == 4.0  # fits now
    assert head_start(4.0, 0, [1.0, 6.0], 2) == 6.0  # an overdue GPU counts as free now
    assert head_start(0.0, 0, [1.0], 2) == float("inf")  # never


def test_the_list_schedule_widens_a_unit_that_would_end_late():
    units = [unit("a", 10.0), unit("b", 10.0), unit("c", 10.0)]
    order, end = scheduled(units, 2, 15.0, twice_as_wide)
    assert [u.counts for u in order] == [(1,), (1,), (2,)] and end == pytest.approx(15.0)  # c on both, 10-15
    assert scheduled(units, 2, 15.0, never_wider)[1] == pytest.approx(20.0)


def test_the_list_schedule_does_not_widen_units_that_end_before_the_last_end_so_far():
    def all_but_a(u: Unit, pace: float) -> Unit:
        return u if u.models == ("a",) else twice_as_wide(u, pace)

    units = [unit("a", 30.0), unit("b", 10.0), unit("c", 10.0)]
    order, end = scheduled(units, 2, 15.0, all_but_a)  # c ends at 20, after 15 but before a's 30
    assert [u.counts for u in order] == [(1,), (1,), (1,)] and end == pytest.approx(30.0)


def test_planned_end_is_the_bound_when_no_model_must_widen():
    work = [(ModelProfile("x", (10.0,)), 100.0)] * 4  # 10 s each on one GPU, 4 GPUs
    assert planned_end(work, 4, 4, 10.0) == pytest.approx(10.0)


def test_planned_end_leaves_time_for_the_gpu_time_widening_costs():
    # one model of 20 s on one GPU and three of 2 s, on 4 GPUs: the bound is its fastest time
    # (2000 / 366 = 5.5 s), but no 4 GPUs give it that; on all 4 (5.9 s) it holds 23.5
    # GPU-seconds, with the others' 6: 29.5, which 4 GPUs hold in 7.38 s (before 7.41 s, when 3
    # GPUs would do). A planned end is where the GPU-time fits, not yet a packing of it.
    work = [(SCALING, 2000.0)] + [(ModelProfile(f"s{i}", (100.0,)), 200.0) for i in range(3)]
    end = planned_end(work, 4, 4, 2000 / 366.0)
    assert width(SCALING, 2000.0, end, 4, 4) == 4
    assert end == pytest.approx((4 * 2000 / 340.0 + 6.0) / 4, rel=1e-3)


def whole_thousands(samples: float) -> float:
    """Epochs of 1,000 samples: the samples up to the first boundary at or after `samples`."""
    return -(-samples // 1000) * 1000


def test_a_model_past_a_node_narrows_to_the_node_after_its_first_epochs():
    # 40,000 samples within 110 s: one node (340/s) takes 117.6 s, 5 GPUs (380/s) 105.3 s on
    # 526 GPU-seconds; 5 GPUs for 28 epochs of 1,000, a pause of 1 s, 4 for the rest: 110 s on 515
    count, narrowing = narrowed(PAST_NODE, 40_000.0, 110.0, 4, 64, 1.0, whole_thousands)
    assert width(PAST_NODE, 40_000.0, 110.0, 4, 64) == 5
    assert (count, narrowing.count, narrowing.first) == (5, 4, 28_000.0)
    assert 28_000 / 380 + 1.0 + 12_000 / 340 <= 110.0 < 27_000 / 380 + 1.0 + 13_000 / 340  # the first to end by then
    held = held_narrowing(40_000.0, 5, 380.0, narrowing)
    assert held == pytest.approx(5 * (28_000 / 380 + 1.0) + 4 * 12_000 / 340)
    assert held + 2 * 5 * 1.0 < 5 * 40_000 / 380  # it saves more than twice what its pause holds


def test_a_model_keeps_its_width_where_narrowing_saves_too_little_for_its_pause():
    assert narrowed(PAST_NODE, 1000.0, 10.0, 4, 64, 1.0, whole_thousands) == (1, None)  # fits one GPU
    # the model past a node with a pause of 3 s: 5 GPUs up to 35 epochs (534 GPU-seconds) would not save
    assert narrowed(PAST_NODE, 40_000.0, 110.0, 4, 64, 3.0, whole_thousands) == (5, None)


def test_a_narrowing_model_is_a_unit_of_its_own_and_ends_after_its_pause():
    narrowing = Narrowing(10.0, 1, 1.0, 2.0)
    units = group_units("g", ["a", "b"], [2, 1], [30.0, 30.0], [2.0, 1.96], 4.0, 0.05, [narrowing, None])
    assert [(u.models, u.narrowing) for u in units] == [(("a",), narrowing), (("b",), None)]
    assert [u.models for u in group_units("g", ["a", "b"], [2, 1], [30.0, 30.0], [2.0, 1.96], 4.0, 0.05)] == [
        ("b", "a")]  # rate-matched: one stream
    a = units[0]
    assert a.wide_seconds == 5.0 and a.seconds == 5.0 + 2.0 + 20.0
    assert a.gpu_seconds == pytest.approx(2 * (5.0 + 2.0) + 1 * 20.0)


def test_the_list_schedule_gives_the_gpus_a_model_narrows_off_to_the_next_units():
    # a: 2 GPUs for 5 s, then (after a pause of 2 s) 1 GPU for 20 s; b: 20 s on one GPU
    a = Unit("g", ("a",), (2,), (30.0,), (2.0,), narrowing=Narrowing(10.0, 1, 1.0, 2.0))
    b = unit("b", 20.0, group="h")
    assert scheduled([a, b], 2, 0.0, never_wider)[1] == pytest.approx(27.0)  # b 7-27, a 0-27
    assert scheduled([replace(a, narrowing=None), b], 2, 0.0, never_wider)[1] == pytest.approx(35.0)  # a 0-15


def test_planned_end_is_earlier_where_models_may_narrow():
    # four models past a node on 18 GPUs: on widths of 5 they fit the GPUs by 117 s; narrowing
    # to 4 GPUs after their first epochs, by 111 s
    work = [(PAST_NODE, 40_000.0)] * 4

    def held(profile, samples, end, gpus_per_node, limit):
        count, narrowing = narrowed(profile, samples, end, gpus_per_node, limit, 0.0, lambda s: s)
        return held_narrowing(samples, count, profile.rate(count, gpus_per_node), narrowing)

    bound = 40_000 / 485.0
    assert planned_end(work, 18, 4, bound) == pytest.approx(116.96, abs=0.01)
    assert planned_end(work, 18, 4, bound, held) == pytest.approx(111.11, abs=0.01)
