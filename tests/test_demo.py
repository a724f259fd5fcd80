"""The README's demo: the quickstart ensemble trains for real and beats chance."""

import json

import pytest
import yaml

from conftest import REPO, run_fleet
from fleet.profiling.contention import MIN_LOAD
from fleet.schedule.calibration import ASSUMED_TAIL_PER_MODEL_S, ASSUMED_TAIL_S
from headless import open_page

CLASSES = 10


@pytest.fixture(scope="module")
def small_quickstart(tmp_path_factory):
    """examples/quickstart.yaml on a smaller copy of its data set, for two epochs."""
    root = tmp_path_factory.mktemp("demo")
    made = run_fleet(
        "data", "make", "synthetic", "--format", "jpeg", "--out", str(root / "data"), "--classes", str(CLASSES),
        "--samples", "1000", "--image-size", "20", "--seed", "0", "--quiet",
    )
    assert made.returncode == 0, made.stderr
    spec = yaml.safe_load((REPO / "examples" / "quickstart.yaml").read_text())
    spec["data"]["path"] = str(root / "data")
    spec["train"]["max_epochs"] = 2
    path = root / "quickstart.yaml"
    path.write_text(yaml.safe_dump(spec))
    return path, root / "run"


@pytest.mark.slow
def test_quickstart_ensemble_beats_chance(small_quickstart):
    spec_path, run_dir = small_quickstart
    result = run_fleet("run", str(spec_path), "--run-dir", str(run_dir), "--quiet", timeout=900)
    assert result.returncode == 0, result.stderr
    results = json.loads((run_dir / "results.json").read_text())
    models = results["models"]
    families = {m["family"] for m in models}
    assert len(models) >= 6 and len(families) >= 5
    chance = 1 / CLASSES
    for model in models:
        assert model["epochs"] == 2
        assert model["best_val_accuracy"] > 1.5 * chance, model
    assert sum(m["best_val_accuracy"] for m in models) / len(models) > 3 * chance
    board = (run_dir / "leaderboard.csv").read_text().splitlines()
    assert board[0].startswith("rank,id,family") and len(board) == len(models) + 1
    assert (run_dir / "spec.yaml").exists() and (run_dir / "events.jsonl").exists()
    assert "starting 4 ranks" in result.stdout  # fleet run started mpiexec itself
    top = result.stdout[result.stdout.index("fleet: the best 5 of"):].splitlines()
    assert top[1].split()[:2] == ["rank", "model"] and top[3].split()[1] == board[1].split(",")[1]  # the winner
    assert json.loads((run_dir / "plan.json").read_text())["rounds"]
    # not profiled (too dear beside 2 epochs): a few steps timed per family, and the models of the
    # fewest and the most parameter bytes on groups of 2 and 3 trainers too
    steps = json.loads((run_dir / "steps.json").read_text())
    assert len(steps["group_steps"]) == 2 and all(set(s) == {"1", "2", "3"} for s in steps["group_steps"].values())
    # where its 3 trainers oversubscribe the cores, one model was timed beside the others and alone
    hardware = steps["hardware"]
    load = 3 * min(hardware["threads_per_trainer"], hardware["cores_per_node"]) / hardware["cores_per_node"]
    assert ("contention" in hardware) == (load >= MIN_LOAD), hardware
    if load >= MIN_LOAD:
        probe = hardware["contention"]
        assert probe["load"] == pytest.approx(load, abs=1e-3) and len(probe["beside_rates"]) == 3
        assert probe["alone_rate"] > 0 and 0 <= probe["slope"] <= 2
    # no earlier job measured what lies outside its makespan: the wall time is predicted from its
    # launch and start-up (the timed steps in it), known before the first step, and an assumed tail
    prediction, overhead = results["prediction"], results["overhead_s"]
    tail = ASSUMED_TAIL_S + ASSUMED_TAIL_PER_MODEL_S * len(models)
    assert prediction["wall_s"] == pytest.approx(overhead["launch"] + overhead["startup"] + prediction["makespan_s"]
                                                 + tail, abs=0.01)
    assert prediction["measured_wall_s"] > results["makespan_s"] + overhead["startup"]
    # learning rates of one cnn share a decoded stream (the flotilla the demo shows): all three, or
    # two where FLEET-G matches the third (its epochs' ends in its rate) with a faster model on fewer slots
    log = [json.loads(line) for line in (run_dir / "events.jsonl").read_text().splitlines()]
    sweep = {m["id"] for m in models if m["family"] == "cnn" and m["id"] >= "cnn-002"}
    assert len(sweep) == 3 and max(len(sweep & set(e["members"])) for e in log if e["event"] == "stream_start") >= 2
    # the report, written at the end, opens in a browser with the leaderboard, curves and the real Gantt
    assert f"fleet: report: {run_dir / 'report.html'}" in result.stdout
    page = open_page(run_dir / "report.html")
    assert page.errors == [] and len(page.rows) == len(models) and page.rows[0][1] == board[1].split(",")[1]
    drawn = {image["file"] for image in page.images if image["ok"]}
    assert {"report/curves.png", "report/gantt.png", "report/planned-gantt.png"} <= drawn


def test_local_mode_trains_one_model_after_another(tmp_path):
    spec = {"name": "local", "seed": 0, "data": {"source": "digits"},
            "models": [{"family": "mlp", "name": "a"}, {"family": "mlp", "name": "b", "params": {"hidden": [16]}}],
            "train": {"max_epochs": 1, "optimizer": "adam", "lr": 0.01}}
    path = tmp_path / "s.yaml"
    path.write_text(yaml.safe_dump(spec))
    result = run_fleet("run", str(path), "--local", "--run-dir", str(tmp_path / "run"), "--quiet")
    assert result.returncode == 0, result.stderr
    models = json.loads((tmp_path / "run" / "results.json").read_text())["models"]
    assert [m["id"] for m in models] == ["a", "b"] and all(m["best_val_accuracy"] > 0.5 for m in models)


@pytest.mark.slow
def test_the_run_leaves_tensorboard_scalars_that_tensorboard_reads(small_quickstart):
    """Every model's epochs in RUN_DIR/tensorboard/<model>, read by tensorboard's own reader."""
    accumulator = pytest.importorskip("tensorboard.backend.event_processing.event_accumulator")
    spec_path, run_dir = small_quickstart
    if not (run_dir / "results.json").exists():
        assert run_fleet("run", str(spec_path), "--run-dir", str(run_dir), "--quiet", timeout=600).returncode == 0
    models = json.loads((run_dir / "results.json").read_text())["models"]
    assert sorted(p.name for p in (run_dir / "tensorboard").iterdir()) == sorted(m["id"] for m in models)
    for model in models:
        board = accumulator.EventAccumulator(str(run_dir / "tensorboard" / model["id"]))
        board.Reload()
        assert set(board.Tags()["scalars"]) == {"loss/train", "loss/val", "accuracy/val", "lr", "samples_per_s"}
        accuracy = board.Scalars("accuracy/val")
        assert [s.step for s in accuracy] == [h["epoch"] for h in model["history"]]
        assert [round(s.value, 5) for s in accuracy] == [round(h["val_accuracy"], 5) for h in model["history"]]
