"""`fleet report RUN_DIR`: the run read back from its events log (stints, jobs, GPU use,
standings), and the page itself, written for real runs (interrupted, running, finished) and
opened in a real headless browser."""

from __future__ import annotations

import json
import subprocess
import sys
import time

import pytest

from conftest import REPO, mpi_env
from fleet.report import html_page
from fleet.report.gpu_use import CATEGORIES, gpu_seconds, gpu_use_over_time, stint_pieces
from fleet.report.results import ModelResult
from fleet.report.run_story import epoch_records, tell_story
from fleet.report.standings import standings
from fleet.spec import parse_spec
from headless import open_page, require_browser
from test_runtime_mpi import kill_job, signal_job, start_train, three_cnns_on_two_slots, write_spec


def event(kind: str, at: float, **fields) -> dict:
    return {"event": kind, "time": 1000.0 + at, **fields}


def epoch(at: float, model: str, number: int, wall: float, compute: float, consumed: float, **extra) -> dict:
    return event("epoch", at, model=model, epoch=number, epoch_s=wall, samples_per_s=compute,
                 stream_samples_per_s=consumed, train_loss=2.0 / number, val_accuracy=0.2 * number,
                 val_loss=1.0 / number, samples=100, checkpoint_s=extra.pop("checkpoint_s", 0.0), **extra)


# A killed job (a trains on GPUs 0-1, b converges on GPU 2), then its resume (a again on GPU 0).
KILLED_AND_RESUMED = [
    event("run_start", 0.0),
    event("round_start", 0.0, index=0),
    event("member_start", 0.0, model="a", gpus=[0, 1], stream=0),
    event("member_start", 0.0, model="b", gpus=[2], stream=0),
    epoch(4.0, "a", 1, wall=4.0, compute=100.0, consumed=50.0, checkpoint_s=1.0),
    epoch(5.0, "b", 1, wall=5.0, compute=100.0, consumed=100.0),
    event("converged", 5.0, model="b", reason="max_epochs"),
    event("member_left", 6.0, model="b", converged=True, parameters=77, checkpoint_s=1.0),
    event("stream_end", 6.5, stream=0, decoded=300),
    epoch(8.0, "a", 2, wall=3.0, compute=100.0, consumed=100.0),
    # killed at 8.0: no run_end
    event("run_start", 100.0),
    event("round_start", 100.0, index=0),
    event("member_start", 100.0, model="a", gpus=[0], stream=1),
    epoch(104.0, "a", 2, wall=4.0, compute=100.0, consumed=100.0),  # epoch 2 again, from its checkpoint
    event("checkpoint", 105.0, model="a"),
    event("member_left", 105.0, model="a", converged=False, parameters=55),
    event("run_end", 105.0, interrupted=True),
]


def test_the_story_of_a_killed_job_and_its_interrupted_resume():
    story = tell_story(KILLED_AND_RESUMED, gpus=3)
    # on the jobs' clock: the resume starts where the killed job's last record was
    assert [(j.start, j.end, j.state) for j in story.jobs] == [(0.0, 8.0, "killed"), (8.0, 13.0, "interrupted")]
    assert [(s.model, s.gpus, s.start, s.end, s.outcome) for s in story.stints] == [
        ("a", (0, 1), 0.0, 8.0, "killed"), ("b", (2,), 0.0, 6.0, "converged"), ("a", (0,), 8.0, 13.0, "checkpointed")]
    assert story.rounds == (0.0, 8.0) and story.checkpoints == ((13.0, "a"),)
    assert story.training_s == 13.0 and story.state == "interrupted" and story.decoded == 300
    assert [e["epoch"] for e in epoch_records(KILLED_AND_RESUMED)["a"]] == [1, 2]  # the repeated epoch once
    assert epoch_records(KILLED_AND_RESUMED)["a"][1]["time"] == 1104.0  # its last record


def test_a_running_job_holds_its_open_stints_until_now():
    running = tell_story(KILLED_AND_RESUMED[:-3], gpus=3, now=1110.0, running=True)
    assert running.jobs[-1].state == "running" and running.jobs[-1].end == 18.0
    assert running.stints[-1].model == "a" and (running.stints[-1].end, running.stints[-1].outcome) == (18.0, "running")


def test_every_gpu_second_of_the_jobs_is_counted_once():
    story = tell_story(KILLED_AND_RESUMED, gpus=3)
    totals = gpu_seconds(story)
    assert sum(totals.values()) == pytest.approx(3 * story.training_s)
    # a's first epoch: 4 s on 2 GPUs, computing half of it (consumed 50/s of 100/s)
    first = [p for p in stint_pieces(story.stints[0]) if p.end <= 4.0]
    assert sum((p.end - p.start) * p.share for p in first if p.category == "training") == pytest.approx(2.0)
    assert sum((p.end - p.start) * p.share for p in first if p.category == "waiting for data") == pytest.approx(2.0)
    assert totals["checkpointing"] == pytest.approx(2 * 1.0 + 1 * 1.0)  # a's save on 2 GPUs, b's last save
    centres, series = gpu_use_over_time(story, bins=26)
    for k in range(len(centres)):
        assert sum(series[c][k] for c in CATEGORIES) == pytest.approx(3.0), centres[k]  # held or idle, all 3


SPEC = {
    "name": "t", "data": {"source": "digits"},
    "models": [{"family": "mlp", "name": "a"},
               {"family": "mlp", "name": "b", "train": {"stop": {"metric": "val_loss"}}},
               {"family": "mlp", "name": "never"}],
    "cluster": {"nodes": 1, "gpus_per_node": 3},
}


def test_standings_rank_by_each_models_own_metric():
    spec = parse_spec(SPEC, check_paths=False)
    story = tell_story(KILLED_AND_RESUMED, gpus=3)
    rows = {m.id: m for m in standings(KILLED_AND_RESUMED, spec.models, story)}
    assert (rows["a"].best_metric, rows["a"].best_epoch, rows["a"].epochs) == (0.4, 2, 2)
    assert (rows["b"].metric, rows["b"].best_metric, rows["b"].converged, rows["b"].stop_reason) == (
        "val_loss", 1.0, True, "max_epochs")
    assert rows["a"].gpu_seconds == pytest.approx(8.0 * 2 + 5.0) and rows["b"].parameters == 77
    assert (rows["never"].epochs, rows["never"].best_metric, rows["never"].history) == (0, None, [])


def test_the_page_escapes_what_the_run_wrote():
    hostile = ModelResult("<script>alert(1)</script>", "mlp", 1, 1, False, None, "val_accuracy", 0.5, 1, 0.5, 1.0, 1.0)
    text = html_page.page("t & <b>", [("board", html_page.leaderboard_table([hostile]))])
    assert "<script>alert" not in text and "&lt;script&gt;alert(1)&lt;/script&gt;" in text
    assert "<title>t &amp; &lt;b&gt;</title>" in text


# -- real runs, the page in a real browser -----------------------------------------------------

SORT_BY_BEST = ("document.querySelectorAll('#leaderboard th')[4].click(); "
                "Array.from(document.querySelectorAll('#leaderboard tbody tr')).map(r => r.cells[4].textContent)")


def report(run_dir) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "fleet", "report", str(run_dir)], capture_output=True, text=True,
                          cwd=REPO, env=mpi_env(), timeout=120)


def check_page(run_dir, models: int, state: str) -> None:
    """The page names the state, every image in it is drawn and is a file of report/, every
    file of report/ is shown, the leaderboard has a row per model and sorts, no console error."""
    done = report(run_dir)
    assert done.returncode == 0, done.stderr
    assert f"({state}, {models} models" in done.stdout, done.stdout
    page = open_page(run_dir / "report.html", (SORT_BY_BEST,))
    assert page.errors == []
    assert page.headings[:2] == ["summary", "leaderboard (click a column to sort)"]
    shown = [image["file"] for image in page.images]
    assert all(image["ok"] and image["width"] > 100 for image in page.images), page.images
    assert sorted(shown) == sorted(f"report/{p.name}" for p in (run_dir / "report").glob("*.png"))
    assert {"report/curves.png", "report/gantt.png", "report/gpu-use.png"} <= set(shown)
    assert len(page.rows) == models and [row[0] for row in page.rows] == [str(k) for k in range(1, models + 1)]
    best = [float(v) if v != "-" else float("inf") for v in page.values[0]]
    assert best == sorted(best)  # the click sorted the column (ascending, those without one last)


@pytest.mark.mpi
@pytest.mark.slow
def wait_for_resumed_epoch(job: subprocess.Popen, run_dir) -> None:
    """Wait until the resumed job (the second `run_start` in the log) has logged an epoch of its
    own: the first job's epochs alone may already count as many as a wait for epochs asks."""
    deadline = time.monotonic() + 300
    while time.monotonic() < deadline and job.poll() is None:
        kinds = [json.loads(line)["event"] for line in (run_dir / "events.jsonl").read_text().splitlines()]
        starts = [i for i, kind in enumerate(kinds) if kind == "run_start"]
        if len(starts) == 2 and "epoch" in kinds[starts[1]:]:
            return
        time.sleep(0.05)
    assert job.poll() is None, f"the resumed job ended ({job.returncode}) before its report was read"


def test_report_of_an_interrupted_a_running_and_a_finished_job(tmp_path):
    require_browser()
    models, data, cluster = three_cnns_on_two_slots()
    # epochs enough that the resumed job still trains while `fleet report` starts and reads it
    train_cfg = {"batch_size": 32, "max_epochs": 24, "optimizer": "sgd", "lr": 0.05, "stop": {"patience": 100}}
    spec = write_spec(tmp_path / "s.yaml", models, cluster, "fleet-g", data=data, train=train_cfg)
    run_dir = tmp_path / "run"
    signal_job(start_train(3, spec, run_dir), run_dir, 2)
    check_page(run_dir, 3, "interrupted")
    job = start_train(3, spec, run_dir)
    try:
        wait_for_resumed_epoch(job, run_dir)
        check_page(run_dir, 3, "running")
        job.wait(timeout=300)
    finally:
        if job.poll() is None:
            kill_job(job)
    assert job.returncode == 0
    check_page(run_dir, 3, "finished")
    events = [json.loads(line) for line in (run_dir / "events.jsonl").read_text().splitlines()]
    assert sum(e["event"] == "run_start" for e in events) == 2
    summary = open_page(run_dir / "report.html", ("document.querySelector('table.summary').textContent",)).values[0]
    assert "jobs2 (the first and each resume)" in summary and "72 epochs trained" in summary


def test_report_of_a_directory_that_is_no_run_is_one_line(tmp_path):
    done = report(tmp_path)
    assert done.returncode == 2 and done.stderr.count("\n") == 1 and "no spec.yaml" in done.stderr
