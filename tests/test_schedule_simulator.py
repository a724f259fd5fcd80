"""The simulator (the driver loop) with hand-checkable runs, fake policies and invariants."""

from dataclasses import replace

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from fleet.schedule import (
    END_ROUND,
    NO_DECISION,
    POLICIES,
    Cluster,
    Decision,
    Member,
    ModelConverged,
    ModelProfile,
    ModelState,
    Overheads,
    Policy,
    PolicyError,
    RateTable,
    Scenario,
    StreamPlan,
    create_policy,
    lower_bounds,
    noisy_scenario,
    paper100,
    simulate,
)
from fleet.prediction import _scenario, lead_samples
from fleet.schedule.calibration import Calibration
from fleet.schedule.costs import FREE
from fleet.schedule.ledger import Ledger
from fleet.schedule.simulator import Outcome
from fleet.spec import parse_spec

# n = 60, M = 2. X: r(1) = 6, r(2) = 10. Y: r(1) = 30, r(2) = 48.
TINY = RateTable((ModelProfile("X", (6.0, 10.0), param_bytes=0), ModelProfile("Y", (30.0, 48.0))), 2, 60)


def scenario(epochs, gpus=2, rates=TINY):
    return Scenario(rates, tuple(epochs), tuple(float(e) for e in epochs), Cluster(gpus, rates.gpus_per_node))


def test_baseline_by_hand():
    # both models start at 0 on their own GPU and stream: X ends at 60/6 = 10, Y at 60/30 = 2
    result = simulate(create_policy("baseline"), scenario([1, 1]), FREE)
    assert result.makespan == pytest.approx(10)
    assert result.samples_decoded == pytest.approx(120)
    assert sorted(result.idle_per_gpu) == pytest.approx([0, 8])
    assert result.gpu_time.idle == pytest.approx(8) and result.gpu_time.pacing == pytest.approx(0)


def test_shared_stream_moves_at_the_slowest_member_by_hand():
    # Homogeneous: X (E=1) and Y (E=2) share one stream. Pace min(6, 30) = 6 until X ends
    # at 60/6 = 10 s (Y has 60 samples then); then Y alone at 30: 60 more samples in 2 s.
    result = simulate(create_policy("homogeneous"), scenario([1, 2]), FREE)
    assert result.makespan == pytest.approx(12)
    assert result.samples_decoded == pytest.approx(120)  # each sample decoded once for both
    assert result.rounds == 1 and len(result.timeline.streams) == 1
    # Y trained 10 s at pace 6 instead of its own 30: 10 * (1 - 6/30) = 8 GPU-s of pacing
    assert result.gpu_time.pacing == pytest.approx(8)


@pytest.mark.parametrize("lead, makespan, y_end, pacing", [
    # Y runs ahead of X by up to 20 samples: 24/s more than X until 0.83 s (Y 25, X 5), then
    # at X's 6/s; its first epoch ends at pos 40 (6.67 s); X ends at 10 s (Y at 80), Y alone
    # at 30/s: 40 more samples, 1.33 s
    (20.0, 10 + 40 / 30, 10 + 40 / 30, (10 - 20 / 24) * (1 - 6 / 30)),
    # the whole run fits in the lead: each member at its own rate, Y done at 120 / 30 = 4 s
    (1000.0, 10.0, 4.0, 0.0),
])
def test_a_member_runs_ahead_of_its_stream_by_the_lead_the_queues_allow_by_hand(lead, makespan, y_end, pacing):
    result = simulate(create_policy("homogeneous"), replace(scenario([1, 2]), lead_samples=lead), FREE)
    assert result.makespan == pytest.approx(makespan)
    ends = {m.model: m.end for m in result.timeline.members}
    assert ends == pytest.approx({"X": 10.0, "Y": y_end})
    assert result.samples_decoded == pytest.approx(120)  # still decoded once for both
    assert result.gpu_time.pacing == pytest.approx(pacing)


class AloneOnPreprocessors(Policy):
    """Each model alone on a GPU, like Baseline, but decoded by the run's preprocessors."""

    name = "alone"

    def start(self, view):
        pending = [m.id for m in view.models if m.state is ModelState.PENDING]
        return Decision.launching(StreamPlan((Member(m, (g,)),)) for m, g in zip(pending, view.free_gpus))

    def on_event(self, event, view):
        return NO_DECISION


def test_a_decode_limit_is_shared_by_the_running_streams_by_hand():
    # Two streams, decoding at 20 samples/s in all. Max-min fair: X needs 6 < 10, so Y gets
    # 20 - 6 = 14 (not its 30): Y's 60 samples take 60/14 s, X's 10 s; X is unaffected.
    limited = Scenario(TINY, (1, 1), (1.0, 1.0), Cluster(2, 2), decode_rate=20.0)
    result = simulate(AloneOnPreprocessors(), limited, FREE)
    assert result.makespan == pytest.approx(10)
    y = next(m for m in result.timeline.members if m.model == "Y")
    assert y.end - y.start == pytest.approx(60 / 14)
    # at 8 samples/s: 4 each while both run (Y needs 60/4 = 15 s, X 10 s would need 6):
    # X at 4 for 15 s = 60 samples -> X ends at 15 too, both at 4 samples/s
    slow = Scenario(TINY, (1, 1), (1.0, 1.0), Cluster(2, 2), decode_rate=8.0)
    assert simulate(AloneOnPreprocessors(), slow, FREE).makespan == pytest.approx(15)


def test_baseline_decodes_between_its_steps_by_hand():
    # Baseline's models decode their own data at 12 samples/s each, between their steps: X
    # moves at 1 / (1/6 + 1/12) = 4 (60 samples: 15 s), Y at 1 / (1/30 + 1/12) = 60/7 (7 s).
    # The preprocessors' limit (1 sample/s) is not theirs.
    own = Scenario(TINY, (1, 1), (1.0, 1.0), Cluster(2, 2), decode_rate=1.0, own_decode_rate=12.0)
    result = simulate(create_policy("baseline"), own, FREE)
    spans = {m.model: m.end - m.start for m in result.timeline.members}
    assert spans == pytest.approx({"X": 15, "Y": 7})
    assert result.makespan == pytest.approx(15) and result.samples_decoded == pytest.approx(120)
    # without a measured decoding rate its decoding is free, as before
    assert simulate(create_policy("baseline"), scenario([1, 1]), FREE).makespan == pytest.approx(10)
    # the policies that share preprocessors are held to their limit instead
    assert simulate(AloneOnPreprocessors(), own, FREE).makespan == pytest.approx(120)


def test_a_shared_stream_under_a_decode_limit_decodes_once_at_the_limit():
    # Homogeneous, one stream of X (6) and Y (30), decoding at 3: the stream moves at 3,
    # X's one epoch takes 20 s, then Y's second epoch 60/3 = 20 s more.
    limited = Scenario(TINY, (1, 2), (1.0, 2.0), Cluster(2, 2), decode_rate=3.0)
    result = simulate(create_policy("homogeneous"), limited, FREE)
    assert result.makespan == pytest.approx(40)
    assert result.samples_decoded == pytest.approx(120)


# one GPU each (a second adds nothing), rates too far apart to share a stream
SPREAD = RateTable(tuple(ModelProfile(f"m{r}", (float(r), float(r))) for r in (10, 15, 100)), 3, 200)


def streams_at_start(result):
    return {m.stream for m in result.timeline.members if m.start == 0}


def test_fleet_adaptive_opens_no_stream_past_the_decoding_there_is():
    # Rates 10, 15, 100 on one GPU each: without a decoding limit, one stream each. Decoding
    # at 22: m100 is planned at 22; streams of pace 10 and 15 take 25 > 22 already, so m100
    # joins the closer one (15) instead of opening a third.
    free = Scenario(SPREAD, (2,) * 3, (2.0,) * 3, Cluster(3, 3))
    limited = Scenario(SPREAD, (2,) * 3, (2.0,) * 3, Cluster(3, 3), decode_rate=22.0)
    assert len(streams_at_start(simulate(create_policy("fleet-adaptive"), free, FREE))) == 3
    result = simulate(create_policy("fleet-adaptive"), limited, FREE)
    assert len(streams_at_start(result)) == 2
    stream_of = {m.model: m.stream for m in result.timeline.members}
    assert stream_of["m100"] == stream_of["m15"]
    alone = simulate(AloneOnPreprocessors(), limited, FREE)  # a stream each, on the same preprocessors
    assert result.makespan < alone.makespan and result.samples_decoded < alone.samples_decoded


def close_rates(each: int) -> Scenario:
    """``each`` models of rate 100 and ``each`` of 104 (ln ratio 0.039) on one GPU apiece."""
    rates = RateTable(tuple(ModelProfile(f"m{r}-{i}", (float(r), float(r) * 1.5)) for r in (100, 104)
                            for i in range(each)), 2 * each, 1000)
    return Scenario(rates, (2,) * 2 * each, (2.0,) * 2 * each, Cluster(2 * each, 2 * each))


def test_fleet_adaptive_matches_closer_where_the_decoding_budget_has_room():
    # 12 + 12 models: one stream of 24 would decode 1/24 of what it trains, far under the
    # budget of 1/5.5, so the 104s open their own stream rather than be paced at 100.
    roomy = close_rates(12)
    result = simulate(create_policy("fleet-adaptive"), roomy, FREE)
    assert len(streams_at_start(result)) == 2 and result.gpu_time.pacing == pytest.approx(0, abs=1e-6)
    loose = simulate(create_policy("fleet-adaptive", tight_tolerance=0.10), roomy, FREE)
    assert len(streams_at_start(loose)) == 1 and loose.gpu_time.pacing > 0
    assert result.samples_decoded == pytest.approx(2 * loose.samples_decoded, rel=0.05)
    # 2 + 2 models: a second stream would decode 1/2 of what they train, past the budget
    crowded = simulate(create_policy("fleet-adaptive"), close_rates(2), FREE)
    assert len(streams_at_start(crowded)) == 1


def test_decode_rate_must_be_positive():
    with pytest.raises(ValueError, match="decode_rate"):
        Scenario(TINY, (1, 1), (1.0, 1.0), Cluster(2, 2), decode_rate=0.0)


class CheckpointOnce(Policy):
    """Fake policy: run X, end the round after its first epoch, run it again."""

    name = "fake"

    def start(self, view):
        return Decision.launching([StreamPlan((Member("X", (0,)),))])

    def on_epoch(self, event, view):
        return END_ROUND if event.epoch == 1 and view.round == 0 else NO_DECISION

    def on_checkpointed(self, event, view):
        assert view.drained and view.model("X").epochs_done == 1
        return Decision.launching([StreamPlan((Member("X", (0, 1)),))])


def test_round_end_costs_checkpoint_and_restore_by_hand():
    # X alone, E = 2, n = 60: epoch 1 at 10 s on one GPU; checkpoint 5 s -> 15 s;
    # relaunch on 2 GPUs with restore 5 s -> trains from 20 s at 10 samples/s: 6 s -> 26 s.
    rates = RateTable((ModelProfile("X", (6.0, 10.0), param_bytes=0),), 2, 60)
    costs = Overheads(latency_s=5.0, bandwidth=1e9, planning_s=0.0)
    result = simulate(CheckpointOnce(), scenario([2], rates=rates), costs)
    assert result.makespan == pytest.approx(26)
    assert result.rounds == 2 and result.checkpoints == 1
    first, second = result.timeline.members
    assert first.outcome is Outcome.CHECKPOINTED and (first.end, first.released) == pytest.approx((10, 15))
    assert second.outcome is Outcome.CONVERGED and (second.launched, second.start) == pytest.approx((15, 20))
    # overhead: 5 s on GPU 0 (checkpoint) + 5 s on 2 GPUs (restore) = 15 GPU-s
    assert result.gpu_time.overhead == pytest.approx(15)
    assert result.samples_decoded == pytest.approx(120)


def test_every_start_costs_the_start_time_by_hand():
    # as above, and each of the two launches (a new model, then a restored one) takes 1 s more
    # before its first step: 1 + 10 = 11, checkpoint -> 16, restore and start 6 -> 22 + 6 = 28.
    rates = RateTable((ModelProfile("X", (6.0, 10.0), param_bytes=0),), 2, 60)
    costs = Overheads(latency_s=5.0, bandwidth=1e9, planning_s=0.0, start_s=1.0)
    result = simulate(CheckpointOnce(), scenario([2], rates=rates), costs)
    assert result.makespan == pytest.approx(28)
    first, second = result.timeline.members
    assert (first.launched, first.start) == pytest.approx((0, 1)) and (second.launched, second.start) == pytest.approx((16, 22))



def test_fleet_g_ends_a_round_at_alpha_of_the_gpus_its_flotilla_took():
    # Three copies of one architecture, each at its best on 2 of the 8 GPUs: the flotilla takes
    # 6 (the 2 left over cannot move all three copies up). A late report of a model of the
    # round before (A) leaves 6 busy, not fewer than 0.8 x 6: the round goes on (with
    # alpha x M = 6.4 it ended at once). One copy converging leaves 4 < 4.8: it ends.
    copies = [ModelProfile(f"C{k}", (100.0, 190.0, 180.0)) for k in (1, 2, 3)]
    rates = RateTable((ModelProfile("A", (500.0,)), *copies), 8, 1000)
    ledger = Ledger(rates, [2, 2, 2, 2], total_gpus=8, gpus_per_node=8)
    ledger.release("A", ModelState.CONVERGED)
    policy = create_policy("fleet-g", alpha=0.8)
    decision = policy.start(ledger.view(0.0))
    (plan,) = decision.launch
    assert sorted(len(m.gpus) for m in plan.members) == [2, 2, 2]
    stream = ledger.open_stream()
    for member in plan.members:
        ledger.reserve(member.model, member.gpus, stream)
    assert policy.on_event(ModelConverged("A", 2, 0.0, (), 500.0), ledger.view(0.0)) == NO_DECISION
    released = ledger.release("C1", ModelState.CONVERGED)
    assert policy.on_event(ModelConverged("C1", 2, 1.0, released, 190.0), ledger.view(1.0)) == END_ROUND

class Bad(Policy):
    name = "bad"

    def __init__(self, decision):
        self.decision = decision

    def start(self, view):
        return self.decision


@pytest.mark.parametrize(
    "decision, message",
    [
        (Decision(launch=(StreamPlan((Member("X", (0,)), Member("Y", (0,)))),)), "GPU 0"),
        (Decision(launch=(StreamPlan((Member("X", ()),)),)), "no GPU"),
        (Decision(launch=(StreamPlan((Member("Z", (0,)),)),)), "unknown model"),
        (Decision(launch=(StreamPlan((Member("X", (0,)),), join=7),)), "stream 7"),
        (Decision(launch=(StreamPlan((Member("X", (0,)), Member("Y", (1,))), own_decoding=True),)), "one member"),
        (Decision(checkpoint=("X",)), "cannot checkpoint"),
        (NO_DECISION, "stalled"),
    ],
)
def test_protocol_violations_raise(decision, message):
    with pytest.raises(PolicyError, match=message):
        simulate(Bad(decision), scenario([1, 1]), FREE)


class JoinLater(Policy):
    """Fake policy: Y joins X's running stream when X finishes its first epoch."""

    name = "join"

    def start(self, view):
        return Decision.launching([StreamPlan((Member("X", (0,)),))])

    def on_epoch(self, event, view):
        if event.model == "X" and event.epoch == 1:
            return Decision.launching([StreamPlan((Member("Y", (1,)),), join=view.model("X").stream)])
        return NO_DECISION


def test_join_reads_the_stream_from_its_current_position():
    # X alone until 10 s (60 samples); Y joins, pace stays 6: Y needs 60 samples -> 20 s,
    # X needs 60 more -> 20 s. The stream decoded 120 samples for 180 trained.
    result = simulate(JoinLater(), scenario([2, 1]), FREE)
    assert result.makespan == pytest.approx(20)
    assert result.samples_decoded == pytest.approx(120)
    assert len(result.timeline.streams) == 1


def test_a_joining_member_waits_for_its_stream_to_pass_the_chunks_ahead_of_its_switch():
    # as above, but a join waits for 12 samples of the stream (2 s at its pace of 6): Y starts
    # at 12 s and has 48 samples when X ends at 20 s; alone at 30, its last 12 take 0.4 s
    result = simulate(JoinLater(), scenario([2, 1]), replace(FREE, join_samples=12))
    assert result.makespan == pytest.approx(20.4)
    assert result.samples_decoded == pytest.approx(132)
    # where its start is measured (its joins in it), no wait is added
    assert Calibration("a run", start_s=0.0).overheads(replace(FREE, join_samples=12)).join_samples == 0.0


@pytest.mark.parametrize("decode_rate, y_end, decoded", [
    # everything X reads (120 samples) was made by the join at 10 s: Y reads past it, at its own
    # 30/s (60 samples ahead of X, under the lead), ends at 12 s; nothing is decoded for both
    (None, 12.0, 180.0),
    # at 8 samples/s the preprocessors had made 80 by then: Y reads from there, shared with X,
    # at most at the stream's decoding (8/s): 60 samples in 7.5 s; the stream decodes 140
    (8.0, 17.5, 140.0),
])
def test_a_late_joiner_reads_past_what_the_preprocessors_made_by_hand(decode_rate, y_end, decoded):
    ahead = replace(scenario([2, 1]), lead_samples=1000.0, decode_rate=decode_rate)
    result = simulate(JoinLater(), ahead, FREE)
    ends = {m.model: m.end for m in result.timeline.members}
    assert ends == pytest.approx({"X": 20.0, "Y": y_end})
    assert result.samples_decoded == pytest.approx(decoded)


class LeaveAndJoin(JoinLater):
    """Fake policy: after X's first epoch, checkpoints X and launches Y into X's stream in the
    same decision (the checkpoint comes first, so the stream has ended)."""

    def on_epoch(self, event, view):
        decision = super().on_epoch(event, view)
        return Decision(launch=decision.launch, checkpoint=("X",)) if decision.launch else decision


def test_joining_a_stream_the_same_decision_empties_is_a_protocol_error():
    with pytest.raises(PolicyError, match="stream 0 is not running"):
        simulate(LeaveAndJoin(), scenario([2, 1]), FREE)


def test_fleet_adaptive_never_moves_the_last_member_out_of_a_stream_it_joins():
    # paper100 seed 9 on 60 GPUs, estimates x U(0.7,1.3): a regrouping once moved a stream's
    # lone member out in the decision that launched a model into that stream
    scen = noisy_scenario(paper100(9), 60, 9, 0.3)
    _check_invariants(simulate(create_policy("fleet-adaptive", seed=9), scen), scen)


def _check_invariants(result, scen):
    bounds = lower_bounds(scen.rates, scen.true_epochs, scen.cluster.total_gpus)
    assert result.makespan >= bounds.lb2 * (1 - 1e-9) >= bounds.lb1 * (1 - 1e-9)
    by_gpu = {}
    for m in result.timeline.members:
        assert len(m.gpus) >= 1
        for g in m.gpus:
            by_gpu.setdefault(g, []).append((m.launched, m.released))
    for intervals in by_gpu.values():  # a GPU holds at most one model at a time
        intervals.sort()
        for (_, end), (start, _) in zip(intervals, intervals[1:]):
            assert start >= end - 1e-6
    converged = [m.model for m in result.timeline.members if m.outcome is Outcome.CONVERGED]
    assert sorted(converged) == sorted(scen.rates.ids)
    total = result.gpu_time
    assert total.training + total.pacing + total.overhead + total.idle == pytest.approx(
        result.makespan * scen.cluster.total_gpus, rel=1e-6
    )


@pytest.mark.parametrize("policy", sorted(POLICIES))
@pytest.mark.parametrize("gpus", [8, 24])
def test_invariants_on_a_small_paper_workload(policy, gpus):
    workload = paper100(seed=3, models=16)
    scen = workload.scenario(gpus)
    result = simulate(create_policy(policy, seed=1), scen, Overheads())
    _check_invariants(result, scen)
    if policy == "baseline":
        assert result.samples_decoded == pytest.approx(sum(scen.true_epochs) * scen.rates.samples_per_epoch)


@st.composite
def small_scenarios(draw):
    gpn = draw(st.integers(1, 4))
    models = draw(st.integers(1, 6))
    profiles = []
    for k in range(models):
        r1 = draw(st.floats(5, 100))
        eff = draw(st.floats(0.6, 1.0))
        profiles.append(ModelProfile(f"m{k}", tuple(r1 * m * eff ** (m - 1) for m in range(1, 5)), param_bytes=10**6))
    rates = RateTable(tuple(profiles), gpn, 100)
    epochs = tuple(draw(st.integers(1, 5)) for _ in range(models))
    estimates = tuple(e * draw(st.floats(0.7, 1.3)) for e in epochs)
    gpus = draw(st.integers(1, 10))
    lead = draw(st.sampled_from([0.0, 30.0, 1e6]))  # lockstep, a lead of part of an epoch, unbounded
    return Scenario(rates, epochs, estimates, Cluster(gpus, gpn), lead_samples=lead)


@settings(max_examples=50, deadline=None)
@given(small_scenarios(), st.sampled_from(sorted(POLICIES)))
def test_invariants_on_random_rate_tables(scen, policy):
    result = simulate(create_policy(policy, seed=0), scen, Overheads(latency_s=1.0))
    _check_invariants(result, scen)


def test_predictions_of_a_spec_let_members_lead_as_far_as_its_queues():
    spec = parse_spec({"name": "x", "data": {"source": "digits"}, "models": [{"family": "mlp"}],
                       "runtime": {"qp_samples": 512, "qt_samples": 256}})
    assert lead_samples(spec) == 2 * 512 + 256
    table = RateTable((ModelProfile(spec.models[0].id, (100.0,)),), 1, 60)
    assert _scenario(table, spec, 1).lead_samples == 1280
