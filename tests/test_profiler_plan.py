"""The profiler's pure parts: M_t, packing measurements into waves, profile.json, preprocessors."""

import json

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from fleet.spec import parse_spec
from fleet.profiling.document import build_document, fingerprint, model_rates, reuse_verdict, stream_demand
from fleet.profiling.plan import (DECODE_SECONDS, JOB_OVERHEAD_S, PROFILE_SHARE, decode_capacity, needed_preprocessors,
                                  predicted_profiling_s, preprocessor_counts, profiling_verdict, threshold_gpus, timed_as,
                                  waves)


def test_threshold_is_the_rate_spread_or_two_nodes_capped_by_the_gpus():
    assert threshold_gpus({"a": 21.0, "b": 176.0}, 4, 160) == 9  # ceil(176 / 21)
    assert threshold_gpus({"a": 100.0, "b": 150.0}, 4, 160) == 8  # 2 x gpus_per_node
    assert threshold_gpus({"a": 21.0, "b": 176.0}, 4, 6) == 6


def test_waves_worked_example():
    """2 nodes x 2 GPUs; jobs a@1 b@1 c@1 a@2 b@2 a@3: the 3-GPU group spans both nodes first."""
    jobs = [("a", 1), ("b", 1), ("c", 1), ("a", 2), ("b", 2), ("a", 3)]
    got = [[(m.model, m.gpus) for m in wave] for wave in waves(jobs, 2, 4)]
    assert got == [
        [("a", (0, 1, 2)), ("a", (3,))],  # a@3 takes both nodes' first 3 GPUs; a@1 fits on GPU 3
        [("a", (0, 1)), ("b", (2, 3))],  # the 2-GPU groups, one per node
        [("b", (0,)), ("c", (1,))],
    ]


@settings(max_examples=60, deadline=None)
@given(
    gpn=st.integers(1, 4),
    nodes=st.integers(1, 4),
    sizes=st.lists(st.integers(1, 16), min_size=1, max_size=20),
)
def test_waves_use_disjoint_trainers_node_local_groups_and_every_job_once(gpn, nodes, sizes):
    total = gpn * nodes
    jobs = [(f"m{k}", min(m, total)) for k, m in enumerate(sizes)]
    planned = waves(jobs, gpn, total)
    seen = sorted((m.model, m.m) for wave in planned for m in wave)
    assert seen == sorted(jobs)
    for wave in planned:
        used = [g for m in wave for g in m.gpus]
        assert len(used) == len(set(used)) and all(0 <= g < total for g in used)
        for m in wave:
            if m.m <= gpn:
                assert len({g // gpn for g in m.gpus}) == 1, m
            assert list(m.gpus) == list(range(m.gpus[0], m.gpus[0] + m.m))


def test_waves_reject_a_group_larger_than_the_machine():
    with pytest.raises(ValueError, match="cannot time 5"):
        waves([("a", 5)], 2, 4)


def test_preprocessor_counts_double_up_to_what_there_is():
    assert preprocessor_counts(1) == [1]
    assert preprocessor_counts(6) == [1, 2, 4, 6]
    assert preprocessor_counts(8) == [1, 2, 4, 8]


def test_needed_preprocessors_covers_the_busiest_round_per_node():
    decode = {1: 1000.0, 2: 1900.0, 4: 3600.0}
    assert needed_preprocessors([500.0, 1800.0], decode, nodes=1) == 2
    assert needed_preprocessors([3000.0], decode, nodes=2) == 2  # 1500 per node
    assert needed_preprocessors([9000.0], decode, nodes=1) == 10  # beyond 4: 900/s per process


def test_decode_capacity_is_the_measured_count_or_its_rate_per_process_times_nodes():
    decode = {1: 1000.0, 2: 1900.0, 4: 3600.0}
    assert decode_capacity(decode, per_node=2, nodes=1) == 1900.0
    assert decode_capacity(decode, per_node=4, nodes=3) == 3 * 3600.0
    assert decode_capacity(decode, per_node=3, nodes=1) == pytest.approx(3 * 950.0)  # from 2's rate per process
    assert decode_capacity(decode, per_node=8, nodes=1) == pytest.approx(8 * 900.0)
    assert decode_capacity({2: 1900.0}, per_node=1, nodes=1) == pytest.approx(950.0)
    assert decode_capacity({}, per_node=1, nodes=1) is None


def test_rates_stop_at_the_first_failed_group_size():
    measured = {1: {"rate": 100.0}, 2: {"rate": 180.0}, 3: {"failed": "out of memory"}, 4: {"rate": 300.0}}
    assert model_rates(measured) == {"1": 100.0, "2": 180.0}
    assert model_rates({1: {"failed": "x"}}) == {}


def spec(**cluster):
    return parse_spec({
        "name": "p", "data": {"source": "digits"},
        "models": [{"family": "mlp", "name": "a"}, {"family": "mlp", "name": "b", "params": {"hidden": [16]}}],
        "cluster": {"gpus_per_node": 2, **cluster},
    })


def test_document_lists_failures_and_leaves_them_out_of_the_rates():
    s = spec()
    measured = {"a": {1: {"rate": 100.0, "step_s": 0.3, "gpus": [0], "parameters": 10},
                      2: {"rate": 150.0, "step_s": 0.4, "gpus": [0, 1]}},
                "b": {1: {"failed": "out of memory: CUDA", "gpus": [1]}}}
    doc = build_document(s, 1000, measured, {"samples_per_s": {"1": 5000.0}}, {"device": "cpu"},
                         {"seconds": 1.0, "m_t": 2})
    assert [m["id"] for m in doc["models"]] == ["a"]
    assert doc["models"][0]["rates"] == {"1": 100.0, "2": 150.0} and doc["models"][0]["param_bytes"] == 40
    assert doc["failures"] == [{"id": "b", "gpus": 1, "reason": "out of memory: CUDA"}]
    from fleet.schedule.rates import RateTable

    table = RateTable.from_dict(doc)
    assert table.ids == ("a",) and table.rate("a", 4) > 0  # Eq. 5 beyond M_t
    assert reuse_verdict(doc, s) == (True, "measured for this ensemble")
    assert reuse_verdict(doc, spec(threads_per_trainer=2))[0] is False
    assert reuse_verdict({"schema": 1, "models": []}, s)[0] is True  # written by hand: taken as given
    assert reuse_verdict(None, s) == (False, "no profile.json")


def test_a_profile_stays_valid_when_only_how_the_models_learn_changes():
    """A sweep's next try changes learning rates or epochs: `fleet train` reuses its profile.
    What a step's time depends on, or the models' ids, still asks for a new one."""
    def sweep(**train):
        return parse_spec({
            "name": "p", "data": {"source": "digits"}, "cluster": {"gpus_per_node": 2},
            "models": [{"family": "mlp", "name": "a", "train": train}, {"family": "mlp", "name": "b"}],
        })

    measured = {m: {1: {"rate": 100.0, "step_s": 0.3, "gpus": [0]}} for m in ("a", "b")}
    doc = build_document(sweep(), 1000, measured, {}, {"device": "cpu"}, {"seconds": 1.0, "m_t": 1})
    for learning in ({"lr": 0.2}, {"max_epochs": 30}, {"schedule": {"kind": "cosine"}}, {"stop": {"patience": 1}}):
        assert reuse_verdict(doc, sweep(**learning)) == (True, "measured for this ensemble"), learning
    for timing in ({"batch_size": 64}, {"optimizer": "adam"}, {"momentum": 0.0}):
        assert reuse_verdict(doc, sweep(**timing))[0] is False, timing
    renamed = parse_spec({"name": "p", "data": {"source": "digits"}, "cluster": {"gpus_per_node": 2},
                          "models": [{"family": "mlp", "name": "a2"}, {"family": "mlp", "name": "b"}]})
    assert reuse_verdict(doc, renamed)[0] is False


def test_models_that_differ_only_in_how_they_learn_are_timed_once():
    s = parse_spec({
        "name": "p", "data": {"source": "digits"}, "cluster": {"gpus_per_node": 2},
        "models": [
            {"family": "cnn", "name": "base", "params": {"channels": [8]}},
            {"family": "cnn", "name": "lr", "params": {"channels": [8]},
             "train": {"lr": 0.2, "max_epochs": 3, "schedule": {"kind": "cosine"}, "stop": {"patience": 2}}},
            {"family": "cnn", "name": "batch", "params": {"channels": [8]}, "train": {"batch_size": 64}},
            {"family": "cnn", "name": "adam", "params": {"channels": [8]}, "train": {"optimizer": "adam"}},
            {"family": "cnn", "name": "plain-sgd", "params": {"channels": [8]}, "train": {"momentum": 0.0}},
            {"family": "cnn", "name": "wider", "params": {"channels": [16]}},
            {"family": "cnn", "name": "wider-lr", "params": {"channels": [16]}, "train": {"lr": 0.01}},
            {"family": "cnn", "name": "no-decay", "params": {"channels": [8]}, "train": {"weight_decay": 0.0}},
        ],
    })
    assert timed_as(s.models) == {"base": "base", "lr": "base", "batch": "batch", "adam": "adam",
                                  "plain-sgd": "plain-sgd", "wider": "wider", "wider-lr": "wider",
                                  "no-decay": "no-decay"}
    assert set(timed_as(s.models, emulated=True).values()) == {m.id for m in s.models}  # rates by id
    measured = {m: {1: {"rate": 10.0 * i, "step_s": 0.1, "gpus": [0], "parameters": 5}} for i, m in enumerate(
        ["base", "batch", "adam", "plain-sgd", "no-decay"], start=1)}
    measured["wider"] = {1: {"failed": "out of memory", "gpus": [0]}}
    doc = build_document(s, 100, measured, {}, {}, {}, timed_as(s.models))
    entries = {m["id"]: m for m in doc["models"]}
    assert entries["lr"]["rates"] == entries["base"]["rates"] == {"1": 10.0}
    assert entries["lr"]["timed_as"] == "base" and "timed_as" not in entries["base"]
    assert [f["id"] for f in doc["failures"]] == ["wider", "wider-lr"]  # a copy shares its failure too


def test_stream_demand_counts_each_stream_once_at_its_slowest_member():
    plan = {"rounds": [{"members": [{"model": "a", "gpus": [0], "stream": 0}, {"model": "b", "gpus": [1, 2], "stream": 0},
                                    {"model": "c", "gpus": [3], "stream": 1}]}]}
    rates = {("a", 1): 100.0, ("b", 2): 90.0, ("c", 1): 50.0}
    assert stream_demand(plan, lambda model, m: rates[(model, m)]) == [140.0]


@pytest.mark.parametrize("name", ["fleet/profiling/plan.py", "fleet/profiling/document.py", "fleet/prediction.py"])
def test_planning_parts_import_neither_mpi_nor_torch(name):
    import ast
    from pathlib import Path

    path = Path(__file__).resolve().parents[1] / name
    roots = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            roots |= {a.name.split(".")[0] for a in node.names}
        elif isinstance(node, ast.ImportFrom) and node.module:
            roots.add(node.module.split(".")[0])
    assert not roots & {"mpi4py", "torch"}, roots


def test_a_model_far_too_big_is_judged_before_it_is_built():
    """Counted on the meta device: nothing is allocated, so the kernel's OOM killer never
    sees it; a small model passes."""
    from types import SimpleNamespace

    from profiler.measure import does_not_fit, parameter_bytes

    s = parse_spec({"name": "p", "data": {"source": "digits"}, "models": [
        {"family": "mlp", "name": "small", "params": {"hidden": [32]}},
        {"family": "mlp", "name": "huge", "params": {"hidden": [2**36]}}]})
    topology = SimpleNamespace(node_of=lambda rank: 0, trainer_ranks=lambda node: [0])
    ctx = SimpleNamespace(device="cpu", input_shape=(1, 8, 8), num_classes=10, rank=0, topology=topology)
    huge = s.model("huge")
    assert parameter_bytes(ctx, huge) == 4 * (64 * 2**36 + 2**36 + 10 * 2**36 + 10)
    assert does_not_fit(ctx, s.model("small")) is None
    reason = does_not_fit(ctx, huge)
    assert reason.startswith("out of memory: needs at least") and "GiB free on cpu" in reason


def test_the_framework_is_part_of_a_models_speed():
    """The same architecture in another framework times differently: it is timed on its own,
    and a profile measured with the other framework is not reused."""
    s = parse_spec({"name": "p", "data": {"source": "digits"}, "cluster": {"gpus_per_node": 2},
                    "models": [{"family": "mlp", "name": "a"}, {"family": "mlp", "name": "b"}]})
    a, b = s.models
    b_elsewhere = b.model_copy(update={"framework": "tensorflow"})  # as a second registry entry would allow
    assert timed_as([a, b]) == {"a": "a", "b": "a"}
    assert timed_as([a, b_elsewhere]) == {"a": "a", "b": "b"}
    measured = {"a": {1: {"rate": 100.0, "step_s": 0.3, "gpus": [0]}}}
    doc = build_document(s, 1000, measured, {}, {"device": "cpu"}, {"seconds": 1.0, "m_t": 1}, timed_as(s.models))
    assert reuse_verdict(doc, s) == (True, "measured for this ensemble")
    assert reuse_verdict(doc, s.model_copy(update={"models": (a, b_elsewhere)}))[0] is False


def test_the_gantt_chart_names_its_gpu_rows():
    """Every GPU by node and index while they fit (no fractional ticks), one tick per node
    (or every k-th node) beyond that; and a chart with them is written."""
    from fleet.report.gantt import MAX_TICKS, gpu_ticks

    assert gpu_ticks(4, 4) == ([0, 1, 2, 3], ["GPU 0", "GPU 1", "GPU 2", "GPU 3"])
    assert gpu_ticks(6, 3) == ([0, 1, 2, 3, 4, 5], ["n0 g0", "n0 g1", "n0 g2", "n1 g0", "n1 g1", "n1 g2"])
    positions, labels = gpu_ticks(160, 4)
    assert positions == list(range(0, 160, 4)) and labels[:2] == ["node 0", "node 1"]
    positions, labels = gpu_ticks(1000, 8)  # 125 nodes: every 3rd
    assert len(positions) <= MAX_TICKS and positions[:2] == [0, 24] and labels[1] == "node 3"


def test_predicted_profiling_time_is_its_waves_and_its_decoding():
    """Two architectures (four models: two learning rates each) on 1 node x 2 trainers, one
    preprocessor: a@1 and b@1 share a wave, then a@2 and b@2 one each (M_t = 2)."""
    doc = {"name": "p", "data": {"source": "digits"}, "train": {"batch_size": 10},
           "cluster": {"nodes": 1, "gpus_per_node": 2, "preprocessors_per_node": 1},
           "models": [{"family": "mlp", "name": "a", "params": {"hidden": [8]}},
                      {"family": "mlp", "name": "a2", "params": {"hidden": [8]}, "train": {"lr": 0.5}},
                      {"family": "mlp", "name": "b", "params": {"hidden": [64]}},
                      {"family": "mlp", "name": "b2", "params": {"hidden": [64]}, "train": {"lr": 0.5}}]}
    spec = parse_spec(doc)
    rates = {("a", 1): 100.0, ("b", 1): 50.0, ("a", 2): 200.0, ("b", 2): 50.0}
    seconds, pairs = predicted_profiling_s(spec.models, lambda model, m: rates[model, m], 10, 2, 2, 1)
    overhead = JOB_OVERHEAD_S
    waves_s = (overhead + 100 / 50) + (overhead + 200 / 200) + (overhead + 200 / 50)
    assert pairs == 4 and seconds == pytest.approx(waves_s + DECODE_SECONDS)


def test_profiling_is_worth_it_only_when_it_costs_little_beside_the_training():
    worth, why = profiling_verdict(50.0, 32, 3600.0)
    assert worth and why.startswith("profiling first: measuring 32 (model, trainer count) pair(s) would take about 50 s, 1%")
    worth, why = profiling_verdict(77.0, 32, 63.0)
    assert not worth and why.startswith("not profiling: measuring 32") and "122% of the 63 s" in why
    assert "scheduler.profile: true measures first" in why
    assert profiling_verdict(PROFILE_SHARE * 100, 1, 100.0)[0]


def test_a_run_without_profile_json_profiles_as_scheduler_profile_says(tmp_path):
    """auto (the default) weighs profiling against the training; true always profiles; false never."""
    from fleet.runtime.control.setup import rates_decision  # here: the module's other tests stay free of torch

    doc = {"name": "p", "data": {"source": "digits"}, "models": [{"family": "mlp"}], "train": {"max_epochs": 1},
           "cluster": {"nodes": 1, "gpus_per_node": 2, "preprocessors_per_node": 1, "device": "cpu"}}
    auto = rates_decision(parse_spec(doc), tmp_path, False, 1400)
    assert (auto.measure, auto.emulated_rates) == (False, None) and auto.note.startswith("not profiling: measuring 2 ")
    assert auto.time_steps == ("mlp-000",)  # a few steps of it are timed instead, to correct its estimate
    (tmp_path / "steps.json").write_text(json.dumps({  # timed already, for this ensemble: not again
        "fingerprint": fingerprint(parse_spec(doc)), "rates": {"mlp-000": 900.0}, "preprocessing": {}, "hardware": {}}))
    assert rates_decision(parse_spec(doc), tmp_path, False, 1400).time_steps == ()
    (tmp_path / "steps.json").unlink()
    doc["train"]["max_epochs"] = 50_000  # training for hours on estimated rates: profiling is a rounding error
    long = rates_decision(parse_spec(doc), tmp_path, False, 1400)
    assert long.measure and long.note.startswith("profiling first: measuring 2 ")
    doc["scheduler"] = {"profile": True}
    assert rates_decision(parse_spec(doc), tmp_path, False, 1400).note == "profiling first: no profile.json"
    doc["scheduler"] = {"profile": False}
    assert not rates_decision(parse_spec(doc), tmp_path, False, 1400).measure
    assert rates_decision(parse_spec(doc), tmp_path, False, 1400).time_steps == ()  # false: nothing timed
    for policy in ("baseline", "homogeneous"):  # their plans read no rate: hours of training or not
        doc["scheduler"] = {"policy": policy}
        named = rates_decision(parse_spec(doc), tmp_path, False, 1400)
        assert not named.measure and named.note.startswith(f"not profiling: policy {policy} never reads a rate")
        assert named.time_steps == ("mlp-000",)  # for its forecast
    doc["scheduler"] = {"policy": "fleet-g"}
    assert rates_decision(parse_spec(doc), tmp_path, False, 1400).measure
