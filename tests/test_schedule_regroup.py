"""fleet-adaptive's regrouping (planners/_regroup.py) by hand, and in a simulated run."""

from fleet.schedule import Overheads, create_policy, paper100, simulate
from fleet.schedule.planners._regroup import Costs, Group, Seat, regroup
from fleet.schedule.simulator import Outcome


REMAINING = {"fast": 36_000.0}  # samples left; 36,000 unless set here


def seat(model, rate, remaining=36_000.0, gpus=1):
    REMAINING[model] = remaining
    return Seat(model, gpus, rate)


def regroup_(groups, margin, gain):
    return regroup(groups, Costs(REMAINING.__getitem__, lambda model: 10.0), margin, gain)  # 10 s a move


def group(stream, *seats):
    return Group(stream, min(s.rate for s in seats), seats)


def test_a_paced_member_moves_to_the_fastest_stream_it_does_not_slow():
    slow = group(1, seat("a", 20.0), seat("fast", 40.0))
    near = group(2, seat("b", 36.0), seat("c", 37.0))
    too_fast = group(3, seat("d", 60.0), seat("e", 61.0))
    assert regroup_([slow, near, too_fast], margin=2.0, gain=0.05) == {"fast": 2}


def test_no_move_unless_it_saves_more_than_margin_times_its_cost():
    slow = group(1, seat("a", 20.0), seat("fast", 40.0, remaining=800.0))  # saves ~18 s, costs 10 s
    near = group(2, seat("b", 36.0), seat("c", 37.0))
    assert regroup_([slow, near], margin=2.0, gain=0.05) == {}
    assert regroup_([slow, near], margin=1.0, gain=0.05) == {"fast": 2}


def test_no_move_for_a_pace_gain_below_the_threshold():
    held = group(1, seat("a", 36.0), seat("fast", 40.0))
    near = group(2, seat("b", 37.0), seat("c", 38.0))  # 37 vs 36: under 5 % faster
    assert regroup_([held, near], margin=0.0, gain=0.05) == {}


def test_a_lone_slow_member_leaves_the_stream_it_holds_back():
    held = group(1, seat("slow", 20.0), seat("x", 30.0), seat("y", 31.0), seat("z", 32.0))
    slower = group(2, seat("b", 19.0), seat("c", 19.5))  # it joins here, barely paced
    assert regroup_([held, slower], margin=2.0, gain=0.05) == {"slow": 2}


def test_a_pacer_stays_when_the_only_stream_it_could_join_is_far_slower():
    held = group(1, seat("slow", 20.0), seat("x", 21.5))
    crawl = group(2, seat("b", 10.0), seat("c", 10.5))  # its own loss outweighs the stream's gain
    assert regroup_([held, crawl], margin=2.0, gain=0.05) == {}


def test_nothing_to_regroup_with_one_stream():
    assert regroup_([group(1, seat("a", 20.0), seat("b", 40.0))], margin=0.0, gain=0.0) == {}


def test_regrouped_members_rejoin_a_running_stream_on_as_many_gpus():
    """On a paper100 run, some members are moved: each is checkpointed, relaunched on the same
    GPU count into a stream already running, and every model still converges once."""
    workload = paper100(seed=1, models=60)
    result = simulate(create_policy("fleet-adaptive", seed=1), workload.scenario(12), Overheads())
    stream_start = {s.id: s.start for s in result.timeline.streams}
    stays = sorted(result.timeline.members, key=lambda m: (m.model, m.start))
    moved = [(a, b) for a, b in zip(stays, stays[1:])
             if a.model == b.model and a.outcome is Outcome.CHECKPOINTED and len(a.gpus) == len(b.gpus)]
    assert moved
    assert all(stream_start[b.stream] < b.launched and b.stream != a.stream for a, b in moved)
    converged = sorted(m.model for m in result.timeline.members if m.outcome is Outcome.CONVERGED)
    assert converged == sorted(workload.rates.ids)
