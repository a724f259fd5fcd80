"""Results per group (issue 47), without MPI: each group's models ranked among themselves, its
best configuration, its size and whether it is done (`fleet.report.group_results`); results.json's
``group_results``, leaderboard.csv's group columns, the console's lines per group and the
report page's groups section (`fleet.report`)."""

import csv
import io
import json

from fleet.report import html_page
from fleet.report.group_results import group_table
from fleet.report.results import ModelResult, RunResult, group_results, leaderboard_csv, read_results, write_results
from fleet.runtime.finish import print_leaderboard_top
from preprocess.grouped import configuration_ids


def model(model_id: str, best: float | None, samples: int | None = None, converged: bool = True,
          metric: str = "val_accuracy") -> ModelResult:
    history = [] if samples is None else [{"epoch": 1, "samples": samples, "val_samples": samples // 4,
                                           metric: best}]
    return ModelResult(model_id, "mlp", 10, len(history), converged, "max_epochs" if converged else None, metric,
                       best, 1 if best is not None else 0, best, 0.5, 1.0, history)


# two configurations (a, b) on three groups; "São Paulo" is the largest, "Rome" has no epoch yet
MODELS = [model("a-berlin", 0.60, 200), model("b-berlin", 0.70, 200, converged=False),
          model("a-s-o-paulo", 0.90, 400), model("b-s-o-paulo", 0.80, 400),
          model("a-rome", None, converged=False), model("b-rome", None, converged=False)]
GROUPS = {"a-berlin": "Berlin", "b-berlin": "Berlin", "a-s-o-paulo": "São Paulo", "b-s-o-paulo": "São Paulo",
          "a-rome": "Rome", "b-rome": "Rome"}


def test_each_group_ranks_its_own_models_and_names_its_best_configuration():
    groups = group_results(MODELS, GROUPS)
    assert [g.key for g in groups] == ["São Paulo", "Berlin", "Rome"]  # largest first, no size last
    paulo, berlin, rome = groups
    assert [m.id for m in berlin.ranked] == ["b-berlin", "a-berlin"]  # within the group, never across
    assert (berlin.best.id, berlin.best_configuration, berlin.samples, berlin.val_samples) == ("b-berlin", "b", 200, 50)
    assert (paulo.best_configuration, paulo.ended, paulo.done) == ("a", 2, True)
    assert (berlin.ended, berlin.done) == (1, False)
    assert (rome.best, rome.best_configuration, rome.samples) == (None, None, None)
    assert group_results(MODELS, {}) == []


def test_the_configuration_is_the_id_less_its_group_part_made_unique():
    # "A b" and "a-b" share a part: the second in sorted order gets -2; an id made unique by -2 too
    groups = {"cnn-a-b": "A b", "cnn-a-b-2": "a-b", "x-1-a-b": "A b", "x-1-a-b-2-2": "a-b"}
    assert configuration_ids(groups) == {"cnn-a-b": "cnn", "cnn-a-b-2": "cnn", "x-1-a-b": "x-1", "x-1-a-b-2-2": "x-1"}


def test_results_json_holds_each_groups_result_and_reads_back(tmp_path):
    run = RunResult("t", "grouped", 2, 1.0, 1, 100, {}, MODELS, groups=GROUPS)
    write_results(tmp_path, run)
    doc = json.loads((tmp_path / "results.json").read_text())
    assert doc["groups"] == GROUPS  # the map from ids to raw keys stays
    first = doc["group_results"][0]
    assert first == {"key": "São Paulo", "samples": 400, "val_samples": 100, "models": ["a-s-o-paulo", "b-s-o-paulo"],
                     "configurations": ["a", "b"], "ended": 2, "done": True,
                     "best": {"model": "a-s-o-paulo", "configuration": "a", "metric": "val_accuracy", "value": 0.9,
                              "epoch": 1}}
    assert [g["key"] for g in doc["group_results"]] == ["São Paulo", "Berlin", "Rome"]
    assert doc["group_results"][2]["best"] is None and read_results(tmp_path).groups == GROUPS
    write_results(tmp_path, RunResult("t", "fleet-g", 2, 1.0, 1, 100, {}, MODELS[:2]))
    assert json.loads((tmp_path / "results.json").read_text())["group_results"] == []


def test_the_leaderboard_ranks_within_each_group_largest_group_first():
    rows = list(csv.DictReader(io.StringIO(leaderboard_csv(MODELS, GROUPS))))
    assert [(r["id"], r["group"], r["group_rank"], r["rank"]) for r in rows] == [
        ("a-s-o-paulo", "São Paulo", "1", "1"), ("b-s-o-paulo", "São Paulo", "2", "2"),
        ("b-berlin", "Berlin", "1", "3"), ("a-berlin", "Berlin", "2", "4"),
        ("a-rome", "Rome", "1", "5"), ("b-rome", "Rome", "2", "6")]
    plain = list(csv.DictReader(io.StringIO(leaderboard_csv(MODELS[:2]))))
    assert [(r["id"], r["group"], r["group_rank"]) for r in plain] == [("b-berlin", "", ""), ("a-berlin", "", "")]


def test_the_console_shows_one_line_per_group_and_stays_short_for_many_groups(tmp_path, capsys):
    lines = group_table(group_results(MODELS, GROUPS))
    assert lines[0].split() == ["group", "samples", "best", "model", "configuration", "best", "at", "epoch", "ended"]
    assert lines[2].split() == ["São", "Paulo", "400", "a-s-o-paulo", "a", "val_accuracy", "0.9000", "1", "2/2"]
    assert lines[4].split() == ["Rome", "-", "-", "-", "-", "-", "0/2"]
    many = [model(f"a-g{k:03d}", 0.5, 1000 - k) for k in range(500)]
    table = group_table(group_results(many, {m.id: f"g{k:03d}" for k, m in enumerate(many)}))
    assert len(table) == 2 + 20 + 1 and table[-1] == "... and 480 smaller group(s)"
    assert table[2].startswith("g000") and table[-2].startswith("g019")
    write_results(tmp_path, RunResult("t", "grouped", 2, 1.0, 1, 100, {}, MODELS, groups=GROUPS))
    print_leaderboard_top(tmp_path)
    out = capsys.readouterr().out
    assert "the best configuration of each group, the largest first (1/3 groups done" in out and "a-s-o-paulo" in out


def test_the_page_ranks_within_groups_and_lists_each_group():
    groups = group_results(MODELS, GROUPS)
    board = html_page.leaderboard_table(MODELS, groups)
    assert board.index("a-s-o-paulo") < board.index("b-berlin") < board.index("a-rome")
    assert "<th>group</th><th>rank in group</th>" in board and 'class="sortable"' in board
    table = html_page.groups_table(groups)
    assert table.count("<tr>") == 4 and "São Paulo" in table and table.index("São Paulo") < table.index("Berlin")
    assert "<th>group</th>" not in html_page.leaderboard_table(MODELS)  # without groups, as it was
