"""Keras models (``framework: tensorflow``) in the real MPI runtime: `fleet run` under mpiexec.

A torch and Keras ensemble under FLEET-G (MPI collective) and fleet-adaptive (the collective
`auto` picks) trains every model, and a stream whose members use both frameworks, one of them
a Keras group of two trainers, decodes its samples once for all of them; that group's Keras
model follows one engine stepping on the group's union batches (the run replayed in this
process, as tests/test_training_replay_mpi.py does for torch); a Keras job killed mid-run
resumes with no epoch lost and the losses of its uninterrupted training (replayed alike); a
user's Keras builder that returns no keras.Model ends `fleet run` with exit code 2 and one
line naming it.

Sized for a 2-core machine: 8x8 synthetic images, 2-4 epochs, 2-4 ranks. Plans come from a
profile.json the test writes (`profile: false`), as in tests/test_runtime_mpi.py.
"""

from __future__ import annotations

import importlib.util
import json
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pytest
import yaml

from conftest import REPO, mpi_env, run_fleet
from fleet.spec import load_spec
from preprocess.readers import open_reader
from preprocess.split import split_indices
from test_runtime_mpi import epochs_by_model, events, job_log, kill_job, results, wait_for_epochs
from test_training_replay_mpi import BATCH, CHUNK, Stream, replay

pytestmark = [
    pytest.mark.mpi,
    pytest.mark.slow,
    # found, not imported: the replays import it through fleet (which quiets its start-up first)
    pytest.mark.skipif(importlib.util.find_spec("tensorflow") is None, reason="TensorFlow is not installed"),
]

DATA = {"source": "synthetic", "samples": 600, "image_size": 8, "channels": 1, "val_fraction": 0.2}
KERAS = {"framework": "tensorflow"}

# tcnn on one trainer (1000 samples/s) and kmlp on two (560 * 2**0.85 = 1009) match: FLEET-G
# puts them on one stream (as a and c of test_runtime_mpi's first test); tmlp and kcnn follow.
MIXED = [
    {"family": "cnn", "name": "tcnn", "params": {"channels": [4], "hidden": 0}},
    {"family": "mlp", "name": "kmlp", "params": {"hidden": [16]}, "train": {"optimizer": "adam", "lr": 0.005}, **KERAS},
    {"family": "mlp", "name": "tmlp", "params": {"hidden": [16]}},
    {"family": "cnn", "name": "kcnn", "params": {"channels": [4], "hidden": 8, "dropout": 0.2}, **KERAS},
]
MIXED_RATES = {"tcnn": 1000.0, "kmlp": 560.0, "tmlp": 950.0, "kcnn": 940.0}


def write_run(tmp_path: Path, name: str, models: list, policy: str, rates: dict[str, float], trainers: int,
              max_epochs: int, samples: int = 600, runtime: dict | None = None, **scheduler) -> tuple[Path, Path]:
    """A spec beside a run directory whose profile.json gives the plan `rates` (on one trainer;
    k trainers: r * k**0.85)."""
    doc = {
        "name": name, "seed": 3,
        "data": {**DATA, "samples": samples},
        "preprocess": [{"random_crop": {"size": 8, "padding": 1}}, {"normalize": {"mean": [0.5], "std": [0.25]}}],
        "models": models,
        "train": {"batch_size": BATCH, "max_epochs": max_epochs, "optimizer": "sgd", "lr": 0.05,
                  "stop": {"patience": 100}},
        "scheduler": {"policy": policy, "profile": False, **scheduler},
        "cluster": {"nodes": 1, "gpus_per_node": trainers, "preprocessors_per_node": 1, "device": "cpu"},
        "runtime": {"timeout_s": 120, "chunk_samples": CHUNK, "qp_samples": 512, "qt_samples": 512,
                    **(runtime or {})},
    }
    spec = tmp_path / f"{name}.yaml"
    spec.write_text(yaml.safe_dump(doc))
    run_dir = tmp_path / name
    run_dir.mkdir()
    profile = {"schema": 1, "gpus_per_node": trainers, "samples_per_epoch": train_size(spec), "models": [
        {"id": m, "rates": {str(k): r * k**0.85 for k in range(1, trainers + 1)}, "epochs": max_epochs}
        for m, r in rates.items()]}
    (run_dir / "profile.json").write_text(json.dumps(profile))
    return spec, run_dir


def train_size(spec_path: Path) -> int:
    spec = load_spec(spec_path)
    return len(split_indices(open_reader(spec.data, seed=spec.seed).labels, spec.data.val_fraction, spec.seed)[0])


def fleet_run(spec: Path, run_dir: Path, timeout: float = 300) -> subprocess.CompletedProcess:
    done = run_fleet("run", str(spec), "--run-dir", str(run_dir), "--quiet", timeout=timeout, env=mpi_env())
    assert done.returncode == 0, done.stdout[-2000:] + done.stderr[-3000:]
    return done


def keras_ids(models: list) -> set[str]:
    return {m["name"] for m in models if m.get("framework") == "tensorflow"}


def stream_members(run_dir: Path) -> dict[int, dict[str, dict]]:
    """Each stream's members (those that started on it or joined it later): their member_start."""
    out: dict[int, dict[str, dict]] = {}
    for event in events(run_dir):
        if event["event"] == "member_start":
            out.setdefault(event["stream"], {})[event["model"]] = event
    return out


def assert_mixed_streams_decode_once(run_dir: Path, keras: set[str], n: int) -> list[int]:
    """Each stream of torch and Keras members that trained whole epochs on it (started fresh,
    left converged) decoded every chunk it fed them once: chunks [0, K) in all, K the furthest
    chunk a member reached (first chunk + its epochs there x chunks per epoch), whereas a
    pipeline per member would decode each member's epochs again. Returns those streams."""
    per_epoch = -(-n // CHUNK)
    decoded = {e["stream"]: e["decoded"] for e in events(run_dir) if e["event"] == "stream_end"}
    left = {(e["stream"], e["model"]): e for e in events(run_dir) if e["event"] == "member_left"}
    history = {m["id"]: m["history"] for m in results(run_dir)["models"]}
    checked = []
    for stream, members in stream_members(run_dir).items():
        if not (set(members) & keras and set(members) - keras):
            continue
        if any(start["resume"] or not left[stream, m]["converged"] for m, start in members.items()):
            continue  # a member resumed mid-epoch or checkpointed part-way: not whole epochs here
        epochs = {m: [h for h in history[m] if h["stream"] == stream] for m in members}
        assert all(h["samples"] == n for hs in epochs.values() for h in hs), epochs
        reach = max(start["first_chunk"] + len(epochs[m]) * per_epoch for m, start in members.items())
        assert decoded[stream] == (reach // per_epoch) * n + (reach % per_epoch) * CHUNK, (stream, members, decoded)
        per_member = sum(len(hs) for hs in epochs.values()) * n
        spans = sorted((start["first_chunk"], start["first_chunk"] + len(epochs[m]) * per_epoch)
                       for m, start in members.items())
        overlapping = any(later[0] < earlier[1] for earlier, later in zip(spans, spans[1:]))
        # shared where members trained on the same chunks (one that joined at another's end, as
        # fleet-adaptive may under load, shares none), and never decoded more than per member
        assert decoded[stream] < per_member if overlapping else decoded[stream] <= per_member, (spans, decoded)
        checked.append(stream)
    return checked


# ------------------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def fleet_g_run(tmp_path_factory) -> tuple[Path, Path]:
    """The mixed ensemble under FLEET-G with the MPI collective, once for the tests that read it
    (alpha 0.1: a round lasts until every member converged, so round 0's tcnn and kmlp train
    all their epochs on one stream)."""
    spec, run_dir = write_run(tmp_path_factory.mktemp("fleet-g"), "mixed", MIXED, "fleet-g", MIXED_RATES, 3, 2,
                              runtime={"collective": "mpi"}, alpha=0.1)
    fleet_run(spec, run_dir)
    return spec, run_dir


# fleet-adaptive's launch opens a stream of torch and Keras models (planned from these rates, so
# it is mixed from the launch, whatever the run measures later: measured rates may re-plan a loaded
# machine's run, and then no stream may train whole epochs)
ADAPTIVE_RATES = {"tcnn": 1000.0, "kmlp": 700.0, "tmlp": 700.0, "kcnn": 520.0}


@pytest.mark.parametrize("policy", ["fleet-g", "fleet-adaptive"])
def test_torch_and_keras_models_train_and_a_mixed_stream_decodes_once(tmp_path, request, policy):
    """Every model trains to max_epochs, and at least one stream of torch and Keras members
    (one of them a Keras group of two trainers) decoded each of its samples once for all."""
    if policy == "fleet-g":
        spec, run_dir = request.getfixturevalue("fleet_g_run")
    else:  # with the collective `auto` picks (torch's gloo on the CPU: Keras gradients go through the host)
        spec, run_dir = write_run(tmp_path, "mixed", MIXED, policy, ADAPTIVE_RATES, 3, 2)
        fleet_run(spec, run_dir)
    n = train_size(spec)
    res = results(run_dir)
    assert {m["id"]: (m["epochs"], m["converged"]) for m in res["models"]} == dict.fromkeys(MIXED_RATES, (2, True))
    assert epochs_by_model(run_dir) == dict.fromkeys(MIXED_RATES, [1, 2])
    assert all(np.isfinite(h["train_loss"]) for m in res["models"] for h in m["history"])
    keras = keras_ids(MIXED)
    mixed = assert_mixed_streams_decode_once(run_dir, keras, n)
    members = stream_members(run_dir)
    if policy == "fleet-adaptive":
        log = events(run_dir)
        first_epoch = next(k for k, e in enumerate(log) if e["event"] == "epoch")
        launched = [set(e["members"]) for e in log[:first_epoch] if e["event"] == "stream_start"]
        assert any(m & keras and m - keras for m in launched), launched  # a mixed stream at the launch
        return  # (a Keras group of two on a mixed stream: the fleet-g run)
    assert mixed, f"no stream of torch and Keras members trained whole epochs: {members}"
    assert any(len(start["gpus"]) == 2 for s in mixed for m, start in members[s].items() if m in keras), members
    if policy == "fleet-g":
        assert next(e["collective"] for e in events(run_dir) if e["event"] == "run_start") == "mpi"
        first = json.loads((run_dir / "plan.json").read_text())["rounds"][0]["members"]
        assert {m["model"]: len(m["gpus"]) for m in first} == {"tcnn": 1, "kmlp": 2}
        assert len({m["stream"] for m in first}) == 1


def test_a_keras_model_on_two_trainers_follows_one_engine_on_the_union_batches(fleet_g_run):
    """kmlp trained data-parallel on two trainers (the MPI collective sums the Keras engines'
    flat host gradients) has, epoch by epoch, the losses and accuracies of one engine
    stepping on each union of the two trainers' batches, up to float rounding."""
    spec, run_dir = fleet_g_run
    members = json.loads((run_dir / "plan.json").read_text())["rounds"][0]["members"]
    assert {m["model"]: len(m["gpus"]) for m in members} == {"tcnn": 1, "kmlp": 2}
    history = next(m for m in results(run_dir)["models"] if m["id"] == "kmlp")["history"]
    ran = [(h["train_loss"], h["val_accuracy"]) for h in history]
    replayed = replay(Stream(load_spec(spec), ["tcnn", "kmlp"]), "kmlp", 2)
    assert [loss for loss, _ in ran] == pytest.approx([loss for loss, _ in replayed], rel=1e-5, abs=0)
    assert [acc for _, acc in ran] == pytest.approx([acc for _, acc in replayed], abs=0.005)


def wait_until_each_model_saved_an_epoch(job, run_dir: Path, models: tuple[str, ...]) -> None:
    """Wait (while the job runs) until every model has reported an epoch, so each has a
    checkpoint to resume from: on a loaded machine the faster model could end all its epochs
    while the slower one had none, and the second start would then resume nothing."""
    deadline = time.monotonic() + 300
    while time.monotonic() < deadline and job.poll() is None:
        if all(epochs_by_model(run_dir).get(m) for m in models):
            return
        time.sleep(0.02)


def test_a_killed_keras_job_resumes_with_no_epoch_lost_and_the_same_losses(tmp_path):
    """Two Keras models (one with dropout), each on a stream of its own (baseline): `fleet run`
    killed with SIGKILL mid-run, then the same command again: every epoch trained once, and
    losses and accuracies as the uninterrupted training of their streams (replayed here, as
    test_runtime_mpi's torch test compares with a whole run)."""
    models = [{"family": "cnn", "name": "x", "params": {"channels": [4, 8], "hidden": 16, "dropout": 0.3}, **KERAS},
              {"family": "mlp", "name": "y", "params": {"hidden": [32]}, **KERAS}]
    spec, run_dir = write_run(tmp_path, "killed", models, "baseline", {"x": 500.0, "y": 500.0}, 2, 4,
                              samples=1500)
    with job_log(run_dir).open("w") as log:
        job = subprocess.Popen([sys.executable, "-m", "fleet", "run", str(spec), "--run-dir", str(run_dir), "--quiet"],
                               cwd=REPO, start_new_session=True, stdout=log, stderr=subprocess.STDOUT, env=mpi_env())
    try:
        wait_for_epochs(job, run_dir, 3, "it could be killed")
        wait_until_each_model_saved_an_epoch(job, run_dir, ("x", "y"))
    finally:
        kill_job(job)
    saved = {m: json.loads(path.read_text())["epochs"] if path.exists() else 0  # 0: killed before its first save
             for m, path in ((m, run_dir / "checkpoints" / m / "latest.json") for m in ("x", "y"))}
    assert sum(saved.values()) >= 3 and min(saved.values()) < 4, saved
    done = fleet_run(spec, run_dir)
    assert "Traceback" not in done.stderr
    assert [e["model"] for e in events(run_dir) if e["event"] == "member_start" and e["resume"]], \
        "the second start did not resume from the checkpoints"
    n = train_size(spec)
    loaded = load_spec(spec)
    for model in results(run_dir)["models"]:
        history = model["history"]
        assert [h["epoch"] for h in history] == [1, 2, 3, 4], "an epoch was lost or trained twice"
        assert all(h["samples"] == n for h in history), history
        replayed = replay(Stream(loaded, [model["id"]]), model["id"], 1)
        np.testing.assert_allclose([h["train_loss"] for h in history], [loss for loss, _ in replayed], rtol=1e-6)
        np.testing.assert_allclose([h["val_accuracy"] for h in history], [acc for _, acc in replayed], rtol=1e-6)


NOT_A_MODEL = '''
import keras


def not_a_model(input_shape, num_classes, width=8):
    return [keras.layers.Dense(width), keras.layers.Dense(num_classes)]
'''


def test_a_keras_builder_that_returns_no_model_ends_fleet_run_with_one_line(tmp_path):
    """`family: kerasnets.nets:not_a_model` (a package beside the spec, run from another folder)
    with `framework: tensorflow` returns a list: `fleet run` exits 2 with one line naming the
    function."""
    package = tmp_path / "kerasnets"
    package.mkdir()
    (package / "__init__.py").write_text("")
    (package / "nets.py").write_text(NOT_A_MODEL)
    family = "kerasnets.nets:not_a_model"
    spec = tmp_path / "spec.yaml"
    spec.write_text(yaml.safe_dump({
        "name": "bad", "seed": 1, "data": DATA,
        "models": [{"family": "mlp", "params": {"hidden": [8]}},
                   {"family": family, "name": "bad", "params": {"width": 4}, **KERAS}],
        "train": {"batch_size": 32, "max_epochs": 1},
        "scheduler": {"policy": "fleet-g", "profile": False},
        "cluster": {"nodes": 1, "gpus_per_node": 1, "preprocessors_per_node": 1, "device": "cpu"},
        "runtime": {"timeout_s": 300},
    }))
    done = run_fleet("run", str(spec), "--run-dir", str(tmp_path / "run"), "--quiet", timeout=240, env=mpi_env())
    output = done.stdout + done.stderr
    problem = "not_a_model() returned a list, expected a keras.Model"
    lines = [line for line in output.splitlines() if problem in line]
    assert done.returncode == 2, output[-3000:]
    assert len(lines) == 1 and family in lines[0] and "models[1] (bad" in lines[0], output[-3000:]
    assert "Traceback" not in output
