"""Predicting with what an earlier run measured (`fleet.schedule.calibration`), and what a run
measures for it (`fleet.runtime.control.measured_costs`)."""

import json
import subprocess
import sys

import pytest
import yaml

from fleet.errors import UserError
from fleet.prediction import costs_of, dry_run
from fleet.runtime.control.coordinator import planned_rate
from fleet.runtime.control.measured_costs import MeasuredCosts
from fleet.profiling.document import JOIN_CHUNKS
from fleet.runtime.protocol import INBOX_DEPTH, EpochReport, MemberLeft, StreamDone
from fleet.schedule import Cluster, ModelProfile, Overheads, RateTable, Scenario
from fleet.schedule.calibration import (ASSUMED_TAIL_PER_MODEL_S, ASSUMED_TAIL_S, Calibration, CalibrationError,
                                       predicted_wall_s)
from fleet.schedule.choice import PREDICTION_COSTS
from fleet.schedule.cores import SharedCores
from fleet.schedule_io import load_calibration, pilot_calibration
from fleet.spec import load_spec

TABLE = RateTable((ModelProfile("a", (100.0, 180.0, 250.0)), ModelProfile("b", (50.0, 90.0, 120.0)),
                   ModelProfile("c", (10.0, 18.0, 24.0))), 4, 1000)
RECORD = {"rates": {"a": {"1": {"compute_rate": 40.0, "cpu_rate": 80.0}, "2": {"compute_rate": 60.0, "cpu_rate": 90.0}},
                    "b": {"1": {"compute_rate": 10.0, "cpu_rate": 25.0}}},
          "trainer_overhead_s": 2e-4, "decode_core_s": 5e-3, "start_s": 0.5, "checkpoint_s": 0.25}


def test_measured_rates_replace_the_tables_and_correct_the_rest():
    rates = Calibration.from_record(RECORD, "cpu", "earlier").rates_for(TABLE)
    # a: measured on 1 and 2 (CPU rates on a CPU node); on 3 the table's times the geometric
    # mean of 80/100 and 90/180
    factor_a = (0.8 * 0.5) ** 0.5
    assert rates.models[0].rates == pytest.approx((80.0, 90.0, 250.0 * factor_a))
    assert rates.models[1].rates == pytest.approx((25.0, 90.0 * 0.5, 120.0 * 0.5))
    # c was not measured: the median correction of those that were
    median = (factor_a + 0.5) / 2
    assert rates.models[2].rates == pytest.approx(tuple(r * median for r in (10.0, 18.0, 24.0)))
    # on GPUs the wall-clock rate is the one
    on_gpu = Calibration.from_record(RECORD, "cuda", "earlier").rates_for(TABLE)
    assert on_gpu.models[0].rates[:2] == pytest.approx((40.0, 60.0))


def test_models_timed_as_one_take_the_geometric_mean_of_their_measured_rates():
    # a2 and a3 have a's steps (the profile timed them as a): what a run measured of them
    # differs only by noise, so all three take one rate, and a3, not measured, the same
    twins = RateTable((ModelProfile("a", (100.0, 180.0)), ModelProfile("a2", (100.0, 180.0), extra={"timed_as": "a"}),
                       ModelProfile("a3", (100.0, 180.0), extra={"timed_as": "a"}), ModelProfile("c", (10.0, 18.0))),
                      4, 1000)
    record = {"rates": {"a": {"1": {"cpu_rate": 80.0}}, "a2": {"1": {"cpu_rate": 125.0}},
                        "c": {"1": {"cpu_rate": 5.0}}}}
    rates = Calibration.from_record(record, "cpu", "earlier").rates_for(twins)
    assert [m.rates[0] for m in rates.models] == pytest.approx([100.0, 100.0, 100.0, 5.0])
    assert [m.rates[1] for m in rates.models] == pytest.approx([180.0, 180.0, 180.0, 9.0])


@pytest.mark.parametrize("factor, probed, contention", [
    (0.8, 0.1, (1.1 / 0.8 - 1) / 1.0),  # measured slower than the table at the probe's load: the run's
    (1.25, 0.1, 0.1),  # measured faster: never below the probe's
])
def test_measured_rates_below_the_profiles_tell_the_contention_in_a_run(factor, probed, contention):
    table = RateTable((ModelProfile("a", (100.0,)), ModelProfile("b", (50.0,))), 4, 1000)
    record = {"rates": {"a": {"1": {"cpu_rate": 100.0 * factor}}, "b": {"1": {"cpu_rate": 50.0 * factor}}}}
    calibration = Calibration.from_record(record, "cpu", "earlier")
    probe = SharedCores(cores=2, contention=probed, rates_load=2.0)
    assert calibration.cores(probe, table).contention == pytest.approx(contention)
    assert calibration.cores(probe).contention == probed  # without the table it corrects: the probe's
    # where the profile measured on cores it did not oversubscribe, nothing to scale from
    assert calibration.cores(SharedCores(cores=2), table).contention == 0.0
    if factor < 1:  # alone on the cores (a load per core of one or less): as fast as the probe's alone
        assert 100.0 * factor * calibration.cores(probe, table).uncontended(1.0) == pytest.approx(100.0 * (1 + probed))


def test_measured_costs_enter_the_cores_the_decoding_and_the_overheads():
    calibration = Calibration.from_record(RECORD, "cpu", "earlier")
    cores = calibration.cores(SharedCores(cores=8, decode_core_s=1e-3))
    assert cores == SharedCores(cores=8, trainer_cores=1.0, decode_core_s=5e-3, trainer_overhead_s=2e-4)
    assert calibration.cores(None) is None  # no sharing off CPU nodes
    assert calibration.decode_rate(2, 9999.0) == pytest.approx(400.0)  # 2 cores / 5 ms
    costs = calibration.overheads(Overheads(latency_s=0.5))
    assert costs.checkpoint_s(10**9) == 0.25 and costs.start_s == 0.5
    bare = Calibration("x")
    assert bare.decode_rate(2, 123.0) == 123.0 and bare.overheads(Overheads()) == Overheads()
    # a run that told its fresh starts from its joins: the fresh ones, and a join waits for its stream
    told = Calibration.from_record({**RECORD, "fresh_start_s": 0.125}, "cpu", "earlier")
    joins = told.overheads(Overheads(join_samples=300.0))
    assert (joins.start_s, joins.join_samples) == (0.125, 300.0)
    assert calibration.overheads(Overheads(join_samples=300.0)).join_samples == 0.0  # in start_s: joins' waits


def test_an_earlier_runs_rates_under_no_trainers_are_passed_over():
    record = {"rates": {"a": {"0": {"cpu_rate": 70.0}, "1": {"cpu_rate": 80.0}}}}  # what runs wrote before the fix
    assert Calibration.from_record(record, "cpu", "earlier").rates == {"a": {1: 80.0}}


@pytest.mark.parametrize("record, field", [
    ([], "prediction.measured: not an object"),
    ({"decode_core_s": -1}, "decode_core_s"),
    ({"start_s": "soon"}, "start_s"),
    ({"trainer_overhead_s": float("nan")}, "trainer_overhead_s"),
    ({"rates": []}, "prediction.measured.rates"),
    ({"rates": {"a": {"one": {"cpu_rate": 1.0}}}}, "prediction.measured.rates.a"),
    ({"rates": {"a": {"1": {"cpu_rate": 0}}}}, "rates.a.1.cpu_rate"),
    ({"rates": {"a": {"1": {"cpu_rate": True}}}}, "rates.a.1.cpu_rate"),
    ({"core_share": 1.5}, "core_share"),
    ({"core_share": 0}, "core_share"),
    ({"epoch_end_share": 1.0}, "epoch_end_share"),
    ({"epoch_end_share": -0.1}, "epoch_end_share"),
])
def test_a_malformed_record_names_its_field(record, field):
    with pytest.raises(CalibrationError, match=field.replace(".", r"\.")):
        Calibration.from_record(record, "cpu", "earlier")


def test_a_run_directory_is_read_for_its_measures(tmp_path):
    with pytest.raises(UserError, match="no results.json"):
        load_calibration(tmp_path, "cpu", required=True)
    assert load_calibration(tmp_path, "cpu", required=False) is None
    (tmp_path / "results.json").write_text(json.dumps({"prediction": {}}))
    with pytest.raises(UserError, match="no prediction.measured"):
        load_calibration(tmp_path, "cpu", required=True)
    assert load_calibration(tmp_path, "cpu", required=False) is None  # an older run's: nothing to learn
    (tmp_path / "results.json").write_text(json.dumps({"prediction": {"measured": {"start_s": -2}}}))
    with pytest.raises(UserError, match="results.json: prediction.measured.start_s"):
        load_calibration(tmp_path, "cpu", required=False)
    (tmp_path / "results.json").write_text("{not json")
    with pytest.raises(UserError, match="invalid JSON"):
        load_calibration(tmp_path, "cpu", required=False)
    (tmp_path / "results.json").write_text(json.dumps({"prediction": {"measured": RECORD}}))
    assert load_calibration(tmp_path, "cpu", required=True).source == f"the run in {tmp_path}"


def epoch(model: str, cpu: tuple[float, float, int], samples: int = 1000, rate: float = 500.0) -> EpochReport:
    return EpochReport(model, 0, 1, 1.0, 1.0, 0.5, rate, rate, 0.1, 2.0, 0.0, None, samples, cpu=cpu)


@pytest.mark.parametrize("group_size", [1, 2])
def test_a_cpu_run_tells_its_policies_the_rate_its_calibration_books(group_size):
    # the predictions share a CPU node's cores out themselves: what the policies and the adapter
    # hear of an epoch is its steps' CPU-time rate, as the profile and a later calibration take it
    report = epoch("a", (2.0, 3.0, 1000), rate=180.0)  # its wall-clock rate: shared cores
    costs = MeasuredCosts()
    costs.epoch(report, group_size)
    booked = costs.record(start_s=None, checkpoint_s=None)["rates"]["a"][str(group_size)]["cpu_rate"]
    assert planned_rate(report, group_size, cpu_node=True) == pytest.approx(booked) == 500.0 * group_size
    assert planned_rate(report, group_size, cpu_node=False) == 180.0  # GPUs, the emulated device: as measured
    assert planned_rate(epoch("a", (0.0, 0.0, 0), rate=180.0), group_size, cpu_node=True) == 180.0  # not timed


def test_a_run_books_its_steps_trainers_and_preprocessors():
    costs = MeasuredCosts()
    costs.epoch(epoch("a", (2.0, 2.5, 1000)), 1)
    costs.epoch(epoch("a", (2.0, 2.5, 1000)), 1)
    costs.epoch(epoch("b", (4.0, 5.0, 1000), rate=250.0), 2)  # two trainers: 2 s of steps each
    costs.epoch(epoch("c", (0.0, 0.0, 0), samples=0), 1)  # a resumed epoch with nothing this stint
    costs.epoch(epoch("e", (2.0, 2.5, 1000)), 0)  # arrived after its GPUs went: no group size to book it under
    left = MemberLeft("a", 0, 1, False, 2, 400, 1.0, 0.1, 10, cpu=(0.8, 1.0, 400), compute_rate=500.0)
    costs.left(left, 1)  # checkpointed mid-epoch: its part of the epoch counts
    costs.left(MemberLeft("d", 0, 1, False, 0, 0, 0.0, 0.0, 10), 1)  # left before a step: nothing to count
    costs.stream_done(StreamDone(0, rank=0, decoded=3000, cpu_s=3.0))
    costs.stream_done(StreamDone(1, rank=0, decoded=1000, cpu_s=4.5))  # the rank's CPU so far
    costs.stream_done(StreamDone(2, rank=5, decoded=2000, cpu_s=1.5))
    assert "coordinator_cores" not in costs.record(start_s=0.4, checkpoint_s=None, makespan=10.0)
    costs.coordinator_cpu_s = 2.5
    record = costs.record(start_s=0.4, checkpoint_s=None, makespan=10.0)
    assert record["coordinator_cores"] == 0.25
    assert record["rates"] == {"a": {"1": {"compute_rate": 500.0, "cpu_rate": 500.0}},
                               "b": {"2": {"compute_rate": 250.0, "cpu_rate": 500.0}}}
    # outside their steps: one-trainer members (a) apart from members of several (b: the allreduce)
    assert record["trainer_overhead_s"] == pytest.approx((0.5 + 0.5 + 0.2) / 2400)
    assert record["group_trainer_overhead_s"] == pytest.approx(1.0 / 2000)  # per trainer of the two
    assert record["decode_core_s"] == pytest.approx((4.5 + 1.5) / 6000)
    assert record["start_s"] == 0.4 and "checkpoint_s" not in record
    assert "core_share" not in record  # its ranks fitted the cores (none given)
    # and a later run takes it as it wrote it
    calibration = Calibration.from_record(json.loads(json.dumps(record)), "cpu", "x")
    assert calibration.rates == {"a": {1: 500.0}, "b": {2: 500.0}}
    assert calibration.cores(SharedCores(cores=2)).coordinator_cores == 0.25
    assert calibration.cores(SharedCores(cores=2)).share == 1.0
    shared = calibration.cores(SharedCores(cores=2))
    assert shared.overhead_s(1) == record["trainer_overhead_s"]
    assert shared.overhead_s(2) == pytest.approx(1.0 / 1000) and shared.overhead_s(4) == pytest.approx(2.0 / 1000)


def test_a_runs_waits_for_data_are_booked_apart_from_its_costs_per_sample():
    costs = MeasuredCosts()
    # 0.9 s of its 1.2 s outside the steps went to its stream thread's polling (27 s of waits
    # for data in an epoch of 30 s: it waits for the next chunk while the trainer steps)
    costs.epoch(EpochReport("a", 0, 1, 1.0, 1.0, 0.5, 500.0, 100.0, 0.1, 30.0, 0.0, None, 1000,
                            cpu=(2.0, 3.2, 1000), waits=(27.0, 0.9)), 1)
    costs.stream_done(StreamDone(0, rank=1, decoded=1000, cpu_s=3.0, idle=(20.0, 0.4)))  # 20 s with no room
    record = costs.record(start_s=None, checkpoint_s=None)
    assert record["trainer_overhead_s"] == pytest.approx(0.3 / 1000)
    assert record["trainer_wait_cores"] == pytest.approx(0.03)
    assert record["decode_core_s"] == pytest.approx(2.6 / 1000)
    assert record["preprocessor_wait_cores"] == pytest.approx(0.02)
    cores = Calibration.from_record(json.loads(json.dumps(record)), "cpu", "x").cores(SharedCores(cores=2))
    assert (cores.trainer_wait_cores, cores.preprocessor_wait_cores) == pytest.approx((0.03, 0.02))
    # under a second in the stream says nothing of what the polling costs
    short = MeasuredCosts()
    short.epoch(EpochReport("a", 0, 1, 1.0, 1.0, 0.5, 500.0, 100.0, 0.1, 0.5, 0.0, None, 1000,
                            cpu=(2.0, 3.2, 1000), waits=(0.45, 0.2)), 1)
    assert "trainer_wait_cores" not in short.record(start_s=None, checkpoint_s=None)


def test_a_run_of_groups_only_prices_every_member_by_them():
    costs = MeasuredCosts()
    costs.epoch(epoch("b", (4.0, 5.0, 1000), rate=250.0), 2)
    record = costs.record(start_s=None, checkpoint_s=None)
    assert record["trainer_overhead_s"] == record["group_trainer_overhead_s"] == pytest.approx(1.0 / 2000)
    # a record of an older run (one figure per member, whatever its size) prices each trainer by
    # its one-trainer figure
    older = Calibration.from_record({"trainer_overhead_s": 2e-4, "group_overhead_s": 9e-4}, "cpu", "x")
    assert older.cores(SharedCores(cores=2)).overhead_s(1) == 2e-4
    assert older.cores(SharedCores(cores=2)).overhead_s(4) == pytest.approx(8e-4)


def test_an_emulated_runs_step_clock_does_not_replace_the_profiles_rates():
    record = {"rates": {"a": {"1": {"compute_rate": 500.0, "cpu_rate": 9e5}}}, "trainer_overhead_s": 2e-5}
    assert Calibration.from_record(record, "emulated", "x").rates == {}  # its steps sleep the profile's times
    assert Calibration.from_record(record, "gpu", "x").rates == {"a": {1: 500.0}}
    assert Calibration.from_record(record, "emulated", "x").trainer_overhead_s == 2e-5


def test_an_oversubscribed_run_keeps_the_part_of_its_cores_its_measured_work_got():
    costs = MeasuredCosts()
    costs.epoch(epoch("a", (2.0, 2.5, 1000)), 1)
    costs.epoch(epoch("b", (4.0, 5.0, 1000), rate=250.0), 2)
    costs.stream_done(StreamDone(0, rank=0, decoded=2000, cpu_s=1.5))
    costs.coordinator_cpu_s = 1.0
    # 2.5 + 5.0 + 1.5 + 1.0 = 10 core-seconds accounted for, on 2 cores for 8 s
    assert costs.accounted_core_s() == pytest.approx(10.0)
    assert costs.core_share_over(2.0, 8.0) == pytest.approx(10 / 16)
    assert costs.core_share_over(2.0, 4.0) == 1.0  # never over all of them
    record = costs.record(start_s=None, checkpoint_s=None, makespan=8.0, core_share=0.625)
    cores = Calibration.from_record(record, "cpu", "x").cores(SharedCores(cores=2))
    assert cores.share == pytest.approx(0.625)


@pytest.mark.parametrize("what, message", [("missing", "no results.json there"),
                                           ("older", "has no prediction.measured")])
def test_fleet_run_refuses_a_directory_it_cannot_learn_from_in_one_line(tmp_path, what, message):

    spec = tmp_path / "s.yaml"
    spec.write_text(yaml.safe_dump({"name": "cal", "data": {"source": "digits"}, "models": [{"family": "mlp"}],
                                    "cluster": {"nodes": 1, "gpus_per_node": 1}}))
    earlier = tmp_path / "earlier"
    earlier.mkdir()
    if what == "older":
        (earlier / "results.json").write_text(json.dumps({"makespan_s": 1.0}))
    done = subprocess.run([sys.executable, "-m", "fleet", "run", str(spec), "--run-dir", str(tmp_path / "run"),
                           "--calibrate-from", str(earlier)], capture_output=True, text=True, timeout=120)
    assert done.returncode == 2 and "Traceback" not in done.stderr, done.stderr
    lines = done.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith(f"fleet run: error: --calibrate-from {earlier}: ") and message in lines[0]


def test_the_earlier_jobs_time_outside_its_makespan_predicts_the_wall_time():
    overhead = {"launch": 1.0, "startup": 2.0, "first_batch": 0.5, "report": 1.5, "shutdown": 3.0, "planning": 9.0}
    earlier = Calibration.from_record(RECORD, "cpu", "x", overhead)
    assert (earlier.launch_s, earlier.tail_s) == (1.0, 3.5)  # the report is within the shutdown
    assert Calibration.from_record(RECORD, "cpu", "x", {"startup": 2.0}).tail_s is None  # not by fleet run
    # the job's own launch and start-up (a larger job's take longer), the earlier job's tail
    assert predicted_wall_s(9.0, 15.0, 20.0, 32, earlier.tail_s) == 9.0 + 15.0 + 20.0 + 3.5
    assert predicted_wall_s(9.0, 15.0, 20.0, 32) == 9.0 + 15.0 + 20.0 + ASSUMED_TAIL_S + 32 * ASSUMED_TAIL_PER_MODEL_S
    with pytest.raises(CalibrationError, match="overhead_s"):
        Calibration.from_record(RECORD, "cpu", "x", {**overhead, "launch": "slow"})


def test_a_profiles_measured_saves_price_every_checkpoint():
    saved = RateTable(tuple(ModelProfile(p.id, p.rates, extra={"checkpoint_s": s})
                            for p, s in zip(TABLE.models, (0.01, 0.03, 0.02))), 4, 1000)
    costs = costs_of(saved)
    assert costs.checkpoint_s(10**9) == costs.restore_s(None) == pytest.approx(0.02)  # the median, size in it
    assert costs_of(TABLE) == PREDICTION_COSTS  # nothing measured: the modelled costs
    # a join waits for the chunks ahead of its switch: 3 of the chunks the profile decoded
    chunked = RateTable(TABLE.models, 4, 1000, {"preprocessing": {"chunk_samples": 100}})
    assert costs_of(chunked).join_samples == 300
    assert JOIN_CHUNKS == INBOX_DEPTH + 1  # the runtime's switch: past the chunk decoded next, and its inbox


def test_a_profiles_pilot_calibrates_it_and_a_bad_pilot_names_its_field():
    pilot = {"seconds": 30, "measured": RECORD, "overhead_s": {"launch": 1.0, "shutdown": 2.0}}
    with_pilot = RateTable(TABLE.models, 4, 1000, {"pilot": pilot})
    calibration = pilot_calibration(with_pilot, "cpu")
    assert calibration.source == "the profile's pilot run (30 s)" and calibration.tail_s == 2.0
    assert calibration.rates_for(with_pilot).models[0].rates[0] == 80.0
    assert pilot_calibration(TABLE, "cpu") is None
    elsewhere = RateTable(TABLE.models, 4, 1000, {"pilot": {**pilot, "device": "cpu"}})
    assert pilot_calibration(elsewhere, "cuda") is None and pilot_calibration(elsewhere, "cpu") is not None
    # the emulated device's steps take the profile's times: a CPU pilot's costs on the host, not its rates
    emulated = pilot_calibration(elsewhere, "emulated")
    assert emulated.rates == {} and emulated.rates_for(elsewhere) == elsewhere
    assert emulated.decode_core_s == 5e-3 and emulated.start_s == 0.5
    # nor what its groups' allreduce of real gradients cost (an emulated group's is of a few stand-ins)
    grouped = {**pilot, "device": "cpu", "measured": {**RECORD, "group_trainer_overhead_s": 9e-4}}
    assert pilot_calibration(RateTable(TABLE.models, 4, 1000, {"pilot": grouped}), "cpu").group_overhead_s == 9e-4
    assert pilot_calibration(RateTable(TABLE.models, 4, 1000, {"pilot": grouped}), "emulated").group_overhead_s is None
    for bad, field in (([], "pilot: expected an object"), ({"measured": {"start_s": -1}}, "pilot.prediction.measured.start_s")):
        with pytest.raises(UserError, match=f"profile.json: {field}"):
            pilot_calibration(RateTable(TABLE.models, 4, 1000, {"pilot": bad}), "cpu")


def test_the_scenario_a_calibration_predicts_on():
    cores = SharedCores(cores=2, decode_core_s=1e-4)
    scenario = Scenario(TABLE, (1, 1, 1), (1.0, 1.0, 1.0), Cluster(4, 4), decode_rate=9000.0, cores=cores)
    calibrated = Calibration.from_record(RECORD, "cpu", "x").scenario(scenario, preprocessors=2)
    assert calibrated.rates.models[0].rates[0] == 80.0 and calibrated.decode_rate == pytest.approx(400.0)
    assert calibrated.cores.decode_core_s == 5e-3 and calibrated.true_epochs == scenario.true_epochs


def test_the_dry_run_predicts_with_the_profiles_pilot(tmp_path):
    spec = tmp_path / "s.yaml"
    spec.write_text(yaml.safe_dump({"name": "cal", "data": {"source": "digits"}, "run_dir": str(tmp_path / "run"),
                                    "models": [{"family": "mlp", "name": n} for n in "abc"],
                                    "cluster": {"nodes": 1, "gpus_per_node": 4, "device": "cpu"},
                                    "train": {"max_epochs": 3}}))
    (tmp_path / "run").mkdir()
    profile = {**TABLE.to_dict(), "hardware": {"device": "cpu", "cores_per_node": 2, "threads_per_trainer": 1}}
    (tmp_path / "run" / "profile.json").write_text(json.dumps(profile))
    loaded = load_spec(str(spec))
    before = dry_run(loaded, tmp_path / "run")
    (tmp_path / "run" / "profile.json").write_text(json.dumps({**profile, "pilot": {"seconds": 9, "measured": RECORD}}))
    after = dry_run(loaded, tmp_path / "run")
    assert "calibrated by the profile's pilot run (9 s)" in after and "calibrated" not in before
    # 4 trainer slots on 2 cores: the part of the cores their work gets is unmeasured, and said so
    note = "want more than its 2 cores, and the part of them their work gets is not measured"
    assert note in before and note in after and "fleet profile --pilot 30" in before
    measured = {**RECORD, "core_share": 0.8}
    (tmp_path / "run" / "profile.json").write_text(json.dumps({**profile, "pilot": {"seconds": 9, "measured": measured}}))
    assert note not in dry_run(loaded, tmp_path / "run")

    def baseline_s(text: str) -> float:
        return float(next(line.split()[-4].replace(",", "") for line in text.splitlines() if line.startswith("baseline ")))
    assert baseline_s(after) > 1.5 * baseline_s(before)  # the pilot's rates are half the profile's and lower


def test_the_ends_of_epochs_a_run_measured_slow_every_rate():
    """A member takes nothing from its stream while it validates, saves and writes its best
    predictions: a run that spent a tenth of its members' time there predicts every rate 10 %
    lower, measured or corrected."""
    costs = MeasuredCosts()
    costs.epoch(EpochReport("a", 0, 1, 1.0, 1.0, 0.5, 80.0, 80.0, 0.1, 9.0, 0.0, None, 1000,
                            cpu=(12.0, 12.5, 1000), end_s=1.0, end_cpu_s=0.8), 1)
    costs.epoch(EpochReport("a", 0, 2, 1.0, 1.0, 0.5, 80.0, 80.0, 0.1, 9.0, 0.0, None, 1000,
                            cpu=(12.0, 12.5, 1000)), 1)  # not timed (a bundle's): left out
    record = costs.record(start_s=None, checkpoint_s=None)
    assert record["epoch_end_share"] == pytest.approx(0.1)
    assert costs.accounted_core_s() == pytest.approx(12.5 + 12.5 + 0.8)  # the end's CPU is the trainers' too
    rates = Calibration.from_record(json.loads(json.dumps(record)), "cuda", "x").rates_for(TABLE)
    assert rates.models[0].rates[0] == pytest.approx(80.0 * 0.9)  # measured on 1 trainer (by the wall clock)
    assert rates.models[1].rates == pytest.approx(tuple(r * 0.8 * 0.9 for r in (50.0, 90.0, 120.0)))
    assert "epoch_end_share" not in MeasuredCosts().record(start_s=None, checkpoint_s=None)
