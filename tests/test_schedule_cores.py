"""Shared cores on CPU nodes in the simulator (`fleet.schedule.cores`), checked by hand."""

from dataclasses import replace

import pytest

from fleet.profiling.document import shared_cores
from fleet.schedule import Cluster, ModelProfile, RateTable, Scenario, create_policy, simulate
from fleet.schedule.calibration import Calibration
from fleet.schedule.cores import ASSUMED_SHARE, ASSUMED_TRAINER_OVERHEAD_S, SharedCores, assumed_costs
from fleet.schedule.costs import FREE

# n = 60, 2 trainer slots on one node. X: r(1) = 6, r(2) = 10. Y: r(1) = 30, r(2) = 48.
TINY = RateTable((ModelProfile("X", (6.0, 10.0), param_bytes=0), ModelProfile("Y", (30.0, 48.0))), 2, 60)


def on_cores(cores: SharedCores | None, decode_rate: float | None = None, epochs=(1, 1),
             preprocessors_per_node: int = 0) -> Scenario:
    return Scenario(TINY, tuple(epochs), tuple(map(float, epochs)), Cluster(2, 2), decode_rate=decode_rate,
                    cores=cores, preprocessors_per_node=preprocessors_per_node)


def spans(result) -> dict[str, float]:
    return {m.model: m.end - m.start for m in result.timeline.members}


def test_enough_cores_change_nothing():
    alone = simulate(create_policy("baseline"), on_cores(None), FREE)
    roomy = simulate(create_policy("baseline"), on_cores(SharedCores(cores=2)), FREE)
    assert spans(alone) == pytest.approx({"X": 10, "Y": 2})
    assert spans(roomy) == pytest.approx(spans(alone))


def test_two_trainers_on_one_core_share_it():
    # Each trainer alone would use its core; together they want 2 cores of 1: both at half
    # speed while both run. Y: 60 samples at 15/s = 4 s; X moved 3/s for 4 s (12 samples),
    # then alone at 6/s: 48 / 6 = 8 s more, 12 s in all.
    result = simulate(create_policy("baseline"), on_cores(SharedCores(cores=1)), FREE)
    assert spans(result) == pytest.approx({"X": 12, "Y": 4})


def test_members_running_ahead_of_their_stream_load_the_cores_at_their_own_pace():
    # Homogeneous: X and Y on one stream, 1 core. In lockstep Y waits for X: 6/6 + 6/30 = 1.2
    # cores on 1, both at 5/s, both end at 12 s. Where the queues let Y run ahead (the whole
    # run fits in the lead), each trains at its own pace: 2 cores wanted, both at half speed;
    # Y ends at 60 / 15 = 4 s (X at 12 samples), X alone at 6/s: 48 / 6 = 8 s more.
    lockstep = simulate(create_policy("homogeneous"), on_cores(SharedCores(cores=1)), FREE)
    assert spans(lockstep) == pytest.approx({"X": 12, "Y": 12})
    ahead = simulate(create_policy("homogeneous"), replace(on_cores(SharedCores(cores=1)), lead_samples=1e6), FREE)
    assert spans(ahead) == pytest.approx({"X": 12, "Y": 4})


def test_decoding_shares_the_cores_with_training():
    # Homogeneous: one stream of X and Y at X's pace, 6 samples/s. Training uses 6/6 + 6/30 =
    # 1.2 cores, decoding 6 * 0.1 = 0.6: 1.8 cores on 1.2 -> 2/3 of the pace, 4 samples/s.
    # X's epoch: 15 s. Then Y alone trains its second epoch: 30/s wants 1 core, decoding
    # 3 cores: 4 on 1.2 -> 9 samples/s, 60 / 9 s.
    cores = SharedCores(cores=1.2, decode_core_s=0.1)
    result = simulate(create_policy("homogeneous"), on_cores(cores, epochs=(1, 2)), FREE)
    assert result.makespan == pytest.approx(15 + 60 / 9)


def test_a_trainers_overhead_slows_it_alone_and_loads_the_node():
    # 1/6 s per sample of X's steps plus 1/12 core-second outside them: X alone at 4/s (15 s);
    # Y at 1 / (1/30 + 1/12) = 60/7/s (7 s). Two cores: no sharing.
    cores = SharedCores(cores=2, trainer_overhead_s=1 / 12)
    assert spans(simulate(create_policy("baseline"), on_cores(cores), FREE)) == pytest.approx({"X": 15, "Y": 7})


def test_the_coordinator_keeps_cores_of_the_first_node_busy():
    # Two trainers on one node of 1.5 cores, the coordinator keeping 0.5 busy: 2.5 cores on
    # 1.5 while both train (3/5 of the pace). Y: 60 at 18/s = 10/3 s, X then 12 samples in;
    # alone, 1.5 cores on 1.5: full speed, 48 / 6 = 8 s more.
    cores = SharedCores(cores=1.5, coordinator_cores=0.5)
    assert spans(simulate(create_policy("baseline"), on_cores(cores), FREE)) == pytest.approx({"X": 10 / 3 + 8,
                                                                                              "Y": 10 / 3})
    with pytest.raises(ValueError, match="coordinator_cores"):
        SharedCores(cores=1, coordinator_cores=-0.1)


def test_steps_that_use_no_core_leave_the_cores_to_decoding():
    # emulated: decoding costs 0.1 core-s per sample and each trainer 0.5 outside its steps,
    # on 1 core; the steps themselves sleep.
    cores = SharedCores(cores=1, trainer_cores=0, decode_core_s=0.1, trainer_overhead_s=0.5)
    assert cores.member_rate(6.0, 1) == 6.0  # a sleeping step overlaps the trainer's own work
    result = simulate(create_policy("homogeneous"), on_cores(cores), FREE)
    # homogeneous: one stream of X and Y at X's 6/s wants 0.6 core of decoding and 2 x 6 x 0.5
    # of the trainers' work: 6.6 cores on 1, so 6/6.6 samples/s for the epoch of 60
    assert result.makespan == pytest.approx(60 / (6 / 6.6))


def test_a_node_whose_work_gets_part_of_its_cores_moves_slower_only_when_oversubscribed():
    # 2 trainers on 1 core as above, but the work gets 0.8 of it while both want it: both at
    # 0.4 of their pace (Y: 60 at 12/s = 5 s; X 12 samples in, then alone wanting 1 core of
    # 0.8 usable: 48 at 4.8/s).
    cores = SharedCores(cores=1, share=0.8)
    assert spans(simulate(create_policy("baseline"), on_cores(cores), FREE)) == pytest.approx({"X": 5 + 48 / 4.8,
                                                                                              "Y": 5})
    # two cores for two trainers: 2 x 0.8 = 1.6 usable, so each runs at 0.8 of its pace
    assert SharedCores(cores=2, share=0.8).slowdown(2.0) == pytest.approx(0.8)
    assert SharedCores(cores=2, share=0.8).slowdown(1.6) == 1.0
    assert SharedCores(cores=2).oversubscribed(trainers=2, preprocessors=1)
    assert not SharedCores(cores=4).oversubscribed(trainers=2, preprocessors=1)
    for bad in (0.0, 1.5):
        with pytest.raises(ValueError, match="share"):
            SharedCores(cores=1, share=bad)


def test_virtual_nodes_on_one_machine_are_slowed_by_its_load_together():
    one_machine = SharedCores(cores=2, nodes_per_host=2)
    # node 0 wants 3 cores, node 1 wants 1: the machine's 2 cores carry 4, both nodes at half pace
    assert one_machine.node_slowdowns({0: 3.0, 1: 1.0}) == {0: 0.5, 1: 0.5}
    # as real nodes each with 2 cores, only the first is slowed
    assert SharedCores(cores=2).node_slowdowns({0: 3.0, 1: 1.0}) == {0: pytest.approx(2 / 3), 1: 1.0}
    # 4 nodes on 2 machines of 2 nodes each
    assert SharedCores(cores=2, nodes_per_host=2).node_slowdowns({0: 2.0, 1: 2.0, 2: 1.0, 3: 0.5}) == {
        0: 0.5, 1: 0.5, 2: 1.0, 3: 1.0}
    # a node of 2 trainers and a preprocessor fits 4 cores, two such virtual nodes do not
    assert not SharedCores(cores=4).oversubscribed(trainers=2, preprocessors=1)
    assert SharedCores(cores=4, nodes_per_host=2).oversubscribed(trainers=2, preprocessors=1)
    with pytest.raises(ValueError, match="nodes_per_host"):
        SharedCores(cores=2, nodes_per_host=0)


def test_a_node_switching_between_fewer_threads_than_its_rates_were_measured_at_moves_faster():
    # Rates measured at 2 trainers per core, where a sample cost 1 + 0.2 x (2 - 1) = 1.2 times
    # its CPU time on a core of its own. Together X and Y want 2 cores of 1 (as measured): Y's 60
    # samples at 15/s take 4 s, X moves 12. Then X alone wants 1 core: its 48 samples at
    # 6 x 1.2 = 7.2/s take 6.67 s more.
    measured_at_two = SharedCores(cores=1, contention=0.2, rates_load=2.0)
    result = simulate(create_policy("baseline"), on_cores(measured_at_two), FREE)
    assert spans(result) == pytest.approx({"X": 4 + 48 / 7.2, "Y": 4})
    # measured at 1.5 per core: nothing known above it (sharing slows it there); alone 1.1 x
    measured_lower = replace(measured_at_two, rates_load=1.5)
    assert spans(simulate(create_policy("baseline"), on_cores(measured_lower), FREE)) == pytest.approx(
        {"X": 4 + 48 / 6.6, "Y": 4})
    cores = SharedCores(cores=4, contention=0.5, rates_load=2.0)
    assert [cores.uncontended(load) for load in (10.0, 8.0, 6.0, 4.0, 1.0)] == pytest.approx([1, 1, 1.2, 1.5, 1.5])
    assert SharedCores(cores=4).uncontended(1.0) == 1.0  # no contention measured: nothing changes
    with pytest.raises(ValueError):
        SharedCores(cores=4, contention=-0.1)


def test_shared_cores_need_positive_cores():
    with pytest.raises(ValueError, match="cores"):
        SharedCores(cores=0)
    with pytest.raises(ValueError, match="decode_core_s"):
        SharedCores(cores=1, decode_core_s=-1)


def test_a_cpu_profile_gives_the_cores_its_node_had():
    extra = {"hardware": {"device": "cpu", "cores_per_node": 2, "threads_per_trainer": 4},
             "preprocessing": {"samples_per_s": {"1": 500.0, "2": 900.0}}}
    # what only a run measures (the cores' share, a trainer's work outside its steps) assumed
    assert shared_cores(extra) == assumed_costs(SharedCores(cores=2.0, trainer_cores=2.0, decode_core_s=1 / 500))
    # a running job's node wins over the profile's; without either there is nothing to share
    assert shared_cores(extra, cores=64).cores == 64.0
    # virtual nodes on one machine share its cores
    assert shared_cores(extra, cores=64, nodes_per_host=4) == assumed_costs(
        SharedCores(cores=64.0, trainer_cores=4.0, decode_core_s=1 / 500, nodes_per_host=4))
    assert shared_cores({"hardware": {"device": "cpu"}}) is None
    # an older profile (wall-clock rates, measured beside each other) is taken as it is
    assert shared_cores({"hardware": {"device": "cpu", "threads_per_trainer": 1}}, cores=8) is None
    assert shared_cores({}, device="cpu", threads=1, cores=8) == assumed_costs(SharedCores(cores=8.0))
    # decoding priced by the CPU time the profile measured, where it did
    timed = {**extra, "preprocessing": {**extra["preprocessing"], "core_s": 0.0015}}
    assert shared_cores(timed).decode_core_s == 0.0015
    assert shared_cores({**extra, "preprocessing": {**extra["preprocessing"], "core_s": "x"}}).decode_core_s == 1 / 500
    # the profile's contention probe: how much faster its cores work switching between fewer threads
    probed = {**extra, "hardware": {**extra["hardware"], "contention": {"slope": 0.13, "load": 2.0}}}
    assert (shared_cores(probed).contention, shared_cores(probed).rates_load) == (0.13, 2.0)
    assert shared_cores(probed, device="emulated", cores=0.5).contention == 0.0  # its steps sleep
    # GPUs and the emulated device: the steps use no core of the node
    assert shared_cores({**extra, "hardware": {**extra["hardware"], "device": "cuda"}}) is None
    # the emulated device's steps sleep: only the decoding uses the cores
    assert shared_cores(extra, device="emulated", cores=0.5) == SharedCores(cores=0.5, trainer_cores=0.0,
                                                                           decode_core_s=1 / 500)


def test_what_only_a_run_measures_is_assumed_until_measured():
    assumed = assumed_costs(SharedCores(cores=2.0, decode_core_s=0.001))
    assert (assumed.share, assumed.trainer_overhead_s) == (ASSUMED_SHARE, ASSUMED_TRAINER_OVERHEAD_S)
    assert 0 < ASSUMED_SHARE < 1 and ASSUMED_TRAINER_OVERHEAD_S > 0
    assert assumed.decode_core_s == 0.001  # what the profile measured stays
    # an oversubscribed node moves slower than it would with every core, a member slower than its steps
    assert assumed.slowdown(4.0) < SharedCores(cores=2.0).slowdown(4.0)
    assert assumed.member_rate(1000.0, 1) < 1000.0
    # a measurement replaces the assumption
    measured = Calibration("a run", trainer_overhead_s=3e-5, core_share=0.8).cores(assumed)
    assert (measured.share, measured.trainer_overhead_s) == (0.8, 3e-5)


def test_members_of_several_trainers_pay_their_own_work_outside_the_steps():
    cores = SharedCores(cores=4, trainer_overhead_s=1e-4, group_overhead_s=1e-3)
    assert cores.member_core_s(1000.0, 1) == pytest.approx(1 / 1000 + 1e-4)
    # every trainer of a group pays its own (its share, the allreduce's CPU in it)
    assert cores.member_core_s(1800.0, 2) == pytest.approx(2 / 1800 + 2e-3)
    assert cores.member_rate(1800.0, 2) == pytest.approx(1 / (1 / 1800 + 1e-3))
    assert cores.member_core_s(3000.0, 4) == pytest.approx(4 / 3000 + 4e-3)
    assert SharedCores(cores=4, trainer_overhead_s=1e-4).overhead_s(3) == pytest.approx(3e-4)  # none measured
    with pytest.raises(ValueError, match="group_overhead_s"):
        SharedCores(cores=4, group_overhead_s=-1.0)


def test_members_stream_threads_and_idle_preprocessors_poll_on_the_cores():
    # homogeneous on 1 core, emulated (steps sleep), decoding 0.2 core-s per sample: the stream
    # of X and Y moves at X's 6/s alone, 1.2 cores of decoding. Each member's trainer polls for
    # data all its stay: 2 x 0.05 more, 1.3 cores on 1.
    cores = SharedCores(cores=1, trainer_cores=0, decode_core_s=0.2, trainer_wait_cores=0.05)
    assert simulate(create_policy("homogeneous"), on_cores(cores), FREE).makespan == pytest.approx(60 / (6 / 1.3))
    assert simulate(create_policy("homogeneous"), on_cores(replace(cores, trainer_wait_cores=0.0)),
                    FREE).makespan == pytest.approx(12.0)
    # two preprocessors on the node, decoding 1.2 of their 2 cores: 0.8 of them poll for room
    both = replace(cores, trainer_wait_cores=0.0, preprocessor_wait_cores=0.1)
    assert simulate(create_policy("homogeneous"), on_cores(both, preprocessors_per_node=2),
                    FREE).makespan == pytest.approx(60 / (6 / 1.28))
