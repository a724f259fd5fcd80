"""Model hopping over partitioned data under a real mpiexec: 2 virtual nodes, 2 partitions.

A synthetic HDF5 data set is partitioned with `fleet data partition`; each node keeps one
partition. The tests read what the run left: the visit log (every model visits every partition
exactly once an epoch), the event log (which files each preprocessor read: only its node's
partition), results.json (the epochs trained), and, after a kill or the checkpoint signal, that
the resumed job continues where the checkpoints stood, visiting nothing twice.
"""

import json
import os
import signal
import subprocess
import time
from collections import defaultdict
from pathlib import Path

import pytest
import yaml

from conftest import run_fleet
from test_runtime_mpi import events, job_log, kill_job, rank_pids, results, start_train, train

pytestmark = [pytest.mark.mpi, pytest.mark.slow]


@pytest.fixture(scope="module")
def parts(tmp_path_factory) -> Path:
    root = tmp_path_factory.mktemp("hopdata")
    made = run_fleet("data", "make", "synthetic", "--format", "hdf5", "--out", str(root / "all.h5"), "--samples",
                     "1200", "--image-size", "8", "--classes", "4", "--quiet")
    assert made.returncode == 0, made.stderr
    split = run_fleet("data", "partition", "--in", str(root / "all.h5"), "--parts", "2", "--out", str(root / "parts"),
                      "--quiet")
    assert split.returncode == 0, split.stderr
    return root / "parts"


def write_spec(path: Path, parts: Path, policy: str, models: list, gpus_per_node: int, max_epochs: int = 3,
               validation: str = "all") -> Path:
    doc = {
        "name": "hop", "seed": 1,
        "data": {"source": "hdf5", "path": str(parts), "partitioned": True, "image_size": 8, "validation": validation},
        "models": models,
        "train": {"batch_size": 32, "max_epochs": max_epochs},
        "scheduler": {"policy": policy, "profile": False},
        "cluster": {"nodes": 2, "gpus_per_node": gpus_per_node, "preprocessors_per_node": 1, "virtual_nodes": True,
                    "device": "cpu"},
        "runtime": {"timeout_s": 90, "chunk_samples": 64, "qp_samples": 512, "qt_samples": 512},
    }
    path.write_text(yaml.safe_dump(doc))
    return path


def visits(run_dir: Path) -> list[dict]:
    return [json.loads(line) for line in (run_dir / "visits.jsonl").read_text().splitlines()]


def check_visits_complete(run_dir: Path, parts_of=lambda model: [0, 1]) -> dict[str, dict[int, list[int]]]:
    """Every model visited each partition exactly once in each epoch it trained (each of its
    own, `parts_of(model)`, where models visit some only: learning over groups)."""
    by_model: dict[str, dict[int, list[int]]] = defaultdict(lambda: defaultdict(list))
    for line in visits(run_dir):
        by_model[line["model"]][line["epoch"]].append(line["partition"])
    trained = {m["id"]: m["epochs"] for m in results(run_dir)["models"]}
    assert set(by_model) == set(trained)
    for model, epochs in by_model.items():
        assert sorted(epochs) == list(range(1, trained[model] + 1)), (model, dict(epochs))
        for epoch, partitions in epochs.items():
            assert sorted(partitions) == parts_of(model), f"{model} epoch {epoch} visited {partitions}"
    return by_model


def check_preprocessors_read_their_own_partition(run_dir: Path, parts: Path) -> None:
    """Each stream's preprocessors read only the part file of their node's partition, every sample
    of its training split once per visit."""
    node_of = {r["rank"]: r["node"] for r in json.loads((run_dir / "ranks.json").read_text())["ranks"]}
    ends = [e for e in events(run_dir) if e["event"] == "stream_end"]
    assert ends
    for end in ends:
        for rank, files in end["read_from"].items():
            own = str(parts / f"part-{node_of[int(rank)]:03d}.h5")
            assert set(files) == {own}, (end["stream"], rank, files)
            assert node_of[int(rank)] == end["partition"]
        assert end["decoded"] == 540  # 600 samples a partition, 10% held out for validation


@pytest.mark.parametrize("policy, gpus_per_node", [("mop", 1), ("fleet-hop", 2)])
def test_every_model_visits_every_partition_once_an_epoch(tmp_path, parts, policy, gpus_per_node):
    """mop on 2 nodes x 1 trainer; fleet-hop on 2 nodes x 2 trainers, where the models left after
    the first converges visit on 2 trainers of one node (a data-parallel group)."""
    models = [{"family": "mlp", "name": "a"}, {"family": "mlp", "name": "b", "params": {"hidden": [32]}},
              {"family": "mlp", "name": "c", "params": {"hidden": [16]}, "train": {"max_epochs": 2}}]
    spec = write_spec(tmp_path / "s.yaml", parts, policy, models, gpus_per_node)
    run_dir = tmp_path / "run"
    ranks = 2 * (1 + gpus_per_node)
    train(ranks, spec, run_dir, "--ranks-per-node", str(1 + gpus_per_node))
    res = results(run_dir)
    assert res["policy"] == policy
    assert {m["id"]: m["epochs"] for m in res["models"]} == {"a": 3, "b": 3, "c": 2}
    for model in res["models"]:
        assert [h["epoch"] for h in model["history"]] == list(range(1, model["epochs"] + 1))
        assert all(h["samples"] == 1080 for h in model["history"])  # an epoch: both partitions' 540
    check_visits_complete(run_dir)
    check_preprocessors_read_their_own_partition(run_dir, parts)
    lines = visits(run_dir)
    if policy == "mop":
        assert all(len(line["gpus"]) == 1 for line in lines)
    else:
        wide = [line for line in lines if len(line["gpus"]) > 1]
        assert wide, "no visit on several trainers"
        assert all(len({g // 2 for g in line["gpus"]}) == 1 for line in wide)  # node-local groups
    decoded_alone = 1080 * (3 + 3 + 2)  # each model-epoch decoded for itself
    assert res["samples_decoded"] == decoded_alone if policy == "mop" else res["samples_decoded"] <= decoded_alone


def test_fleet_hop_visits_that_start_together_share_their_partition_s_stream(tmp_path, parts):
    """4 copies of one MLP (one rate) on 2 nodes x 2 trainers: the pair on each partition
    shares its stream, and at every hop each pair waits for both GPUs of the other
    partition (a group says its visit ended before it saves: the coordinator sees the hop in
    flight) and visits it together again, so every sample is decoded once for two models."""
    models = [{"family": "mlp", "name": n} for n in "abcd"]
    spec = write_spec(tmp_path / "s.yaml", parts, "fleet-hop", models, 2, max_epochs=2)
    run_dir = tmp_path / "run"
    train(6, spec, run_dir, "--ranks-per-node", "3")
    check_visits_complete(run_dir)
    starts = [e for e in events(run_dir) if e["event"] == "stream_start"]
    assert [len(e["members"]) for e in starts] == [2] * 8, [e["members"] for e in starts]
    assert results(run_dir)["samples_decoded"] == 1080 * 4 * 2 // 2


@pytest.mark.parametrize("validation, decoded", [("all", 120), ("local", 60)])
def test_local_validation_reads_no_sample_of_another_node(tmp_path, parts, validation, decoded):
    """Each trainer validates on every partition's held-out samples (120: 10% of 2 x 600), or
    with `data.validation: local` on its own node's (60), so that no sample crosses nodes."""
    models = [{"family": "mlp", "name": n} for n in "ab"]
    spec = write_spec(tmp_path / "s.yaml", parts, "mop", models, 1, max_epochs=2, validation=validation)
    run_dir = tmp_path / "run"
    train(4, spec, run_dir, "--ranks-per-node", "2")
    check_visits_complete(run_dir)
    res = results(run_dir)
    assert res["validation_samples_decoded"] == 2 * decoded  # both trainers, once each
    assert all(0 <= h["val_accuracy"] <= 1 for m in res["models"] for h in m["history"])


def wait_for_visits(job: subprocess.Popen, run_dir: Path, count: int) -> None:
    deadline = time.monotonic() + 300
    path = run_dir / "visits.jsonl"
    while time.monotonic() < deadline and job.poll() is None:
        if path.exists() and len(path.read_text().splitlines()) >= count:
            return
        time.sleep(0.02)
    assert job.poll() is None, f"the job finished ({job.returncode}) before it was stopped:\n" + \
        job_log(run_dir).read_text()[-3000:]


def stop_after_visits(job: subprocess.Popen, run_dir: Path, count: int, how: str = "usr1") -> None:
    """Stop `job` once `count` visits are logged: SIGKILL (``kill``), or the checkpoint signal
    (``usr1``), after which it must exit 75."""
    try:
        wait_for_visits(job, run_dir, count)
        if how == "kill":
            kill_job(job)
        else:
            for pid in rank_pids(run_dir):
                os.kill(pid, signal.SIGUSR1)
            job.wait(timeout=120)
            assert job.returncode == 75, job_log(run_dir).read_text()[-3000:]
    finally:
        if job.poll() is None:
            kill_job(job)


@pytest.mark.parametrize("how", ["kill", "usr1"])
def test_a_stopped_hopping_job_resumes_where_its_visits_stood(tmp_path, parts, how):
    """SIGKILL (a batch system ends the job) or SIGUSR1 (the warning before the walltime) after
    some visits: the next start continues each model at the partition after its last hop; the
    visit log holds each partition exactly once an epoch, across both jobs."""
    models = [{"family": "mlp", "name": n, "params": {"hidden": [64, 64]}} for n in ("x", "y", "z")]
    spec = write_spec(tmp_path / "s.yaml", parts, "mop", models, 1, max_epochs=4)
    run_dir = tmp_path / "run"
    stop_after_visits(start_train(4, spec, run_dir), run_dir, 5, how)
    first = visits(run_dir)
    assert len(first) < 3 * 4 * 2
    hopped = {p.parent.name: json.loads(p.read_text()) for p in (run_dir / "checkpoints").glob("*/latest.json")}
    assert hopped and all("visited" in info for info in hopped.values())
    train(4, spec, run_dir)
    by_model = check_visits_complete(run_dir)
    assert sum(len(p) for e in by_model.values() for p in e.values()) == 3 * 4 * 2  # nothing twice
    assert {line["job"] for line in visits(run_dir)} == {0, 1}
    for model in results(run_dir)["models"]:
        assert [h["epoch"] for h in model["history"]] == [1, 2, 3, 4], model["id"]
        assert all(h["samples"] == 1080 for h in model["history"]), model["id"]
    resumed = [e for e in events(run_dir) if e["event"] == "member_start" and e["resume"]]
    assert resumed


def test_partitions_that_do_not_fit_the_nodes_stop_the_job_in_one_line(tmp_path, parts):
    spec = write_spec(tmp_path / "s.yaml", parts, "auto", [{"family": "mlp"}], 1)
    doc = yaml.safe_load(spec.read_text())
    doc["cluster"]["nodes"] = 3
    spec.write_text(yaml.safe_dump(doc))
    done = run_fleet("run", str(spec), "--run-dir", str(tmp_path / "run"))
    assert done.returncode == 2 and done.stderr.count("\n") == 1, done.stderr
    assert done.stderr.startswith(f"fleet run: error: data.path: {parts} holds 2 partitions for a job of 3 nodes: "
                                  "2 partitions do not fit 3 nodes")
    assert not (tmp_path / "run" / "ranks.json").exists()


def test_plan_predicts_the_hopping_policies_on_the_specs_partitions(tmp_path, parts):
    spec = write_spec(tmp_path / "s.yaml", parts, "auto", [{"family": "mlp", "name": n} for n in "abc"], 1)
    profile = tmp_path / "profile.json"
    profile.write_text(json.dumps({"schema": 1, "gpus_per_node": 1, "samples_per_epoch": 1080, "models": [
        {"id": n, "rates": {"1": r}, "epochs": 2} for n, r in (("a", 300.0), ("b", 200.0), ("c", 100.0))]}))
    done = run_fleet("plan", str(profile), "--gpus", "2", "--spec", str(spec), "--json")
    assert done.returncode == 0, done.stderr
    assert done.stdout.startswith("policy auto: ") and "mop" in done.stdout.splitlines()[0]
    plan = json.loads(done.stdout[done.stdout.index("{"):])
    assert plan["policy"] in ("mop", "fleet-hop")
    refused = run_fleet("plan", str(profile), "--gpus", "2", "--spec", str(spec), "--policy", "fleet-g")
    assert refused.returncode == 2 and "fleet-g cannot run on the spec's partitioned data" in refused.stderr


def test_early_stopping_takes_effect_at_the_hops(tmp_path, parts):
    """asha over partitioned data (mop, 2 nodes x 1 trainer): a model's epoch ends with the
    visit that completes it; its rung is decided then and the verdict acts at that hop's
    checkpoint (nobody waits on a visit). Stopped models end at their rung, every epoch each
    visited both partitions once, and the others train to max_epochs."""
    models = [{"family": "mlp", "name": f"m{k}", "params": {"hidden": [16 * (1 + k % 3)]}, "train": {"lr": lr}}
              for k, lr in enumerate((0.001, 0.01, 0.05, 0.1, 0.3, 0.02))]
    spec = write_spec(tmp_path / "s.yaml", parts, "mop", models, 1, max_epochs=4)
    doc = yaml.safe_load(spec.read_text())
    doc["scheduler"]["early_stop"] = {"method": "asha", "min_epochs": 1, "reduction": 2}
    spec.write_text(yaml.safe_dump(doc))
    run_dir = tmp_path / "run"
    train(4, spec, run_dir, "--ranks-per-node", "2")
    records = [json.loads(line) for line in (run_dir / "rungs.jsonl").read_text().splitlines()]
    stopped = {r["model"]: r["rung"] for r in records if r["verdict"] == "stopped"}
    assert stopped and [r["seq"] for r in records] == list(range(len(records)))
    for model in results(run_dir)["models"]:
        assert model["epochs"] == stopped.get(model["id"], 4), model["id"]
        assert [h["epoch"] for h in model["history"]] == list(range(1, model["epochs"] + 1))
    visited = check_visits_complete(run_dir)
    assert all(max(visited[m]) == e for m, e in stopped.items())  # no visit past the rung it stopped at
