"""bench/predict.py's medians and verdicts (pure): measured / predicted per (case, policy, rate
mode) over rounds, and `policy: auto`'s pick against the policy that measured fastest."""

from __future__ import annotations

import importlib
from pathlib import Path

import pytest

BENCH = Path(__file__).resolve().parent.parent / "bench"


@pytest.fixture(scope="module")
def predict():
    """bench/predict.py, imported as a bench script is run: with bench/ first on sys.path (its
    `_harness`, `peers` and `e2e_cpu` are imported by name)."""
    with pytest.MonkeyPatch.context() as patch:
        patch.syspath_prepend(str(BENCH))
        yield importlib.import_module("predict")


def run(predict, policy: str, measured: float, predicted: float | None = 10.0, round_: int = 1,
        mode: str = "measured", case: str = "a", chosen: str | None = None, wall_s: float | None = None):
    return predict.Measured(case=case, policy=policy, mode=mode, round=round_, predicted_s=predicted,
                            range_s=() if predicted is None else (predicted, 1.2 * predicted), measured_s=measured,
                            wall_s=measured + 8.0, predicted_wall_s=wall_s, rates=mode, ran=chosen or policy,
                            chosen=chosen)


def test_rows_are_medians_over_rounds(predict):
    runs = [run(predict, "fleet-g", m, p, k) for k, (m, p) in enumerate([(14.0, 10.0), (10.0, 10.0), (12.0, 8.0)], 1)]
    (row,) = predict.summarize(runs)
    assert row.measured_s == 12.0 and row.measured_each_s == (14.0, 10.0, 12.0)
    assert row.predicted_s == 10.0 and row.range_s == (10.0, 12.0)
    assert row.ratio == pytest.approx(1.4)  # the median of 1.4, 1.0 and 1.5
    assert row.wall_s == 20.0
    assert row.predicted_wall_s is None and row.within is False


def test_a_round_without_a_prediction_leaves_the_row_without_one(predict):
    (row,) = predict.summarize([run(predict, "baseline", 10.0), run(predict, "baseline", 11.0, None, 2)])
    assert row.predicted_s is None and row.ratio is None and row.range_s == () and row.within is None
    assert predict.within_count([row]) == (0, 1)


def test_rows_keep_case_policy_and_mode_apart(predict):
    runs = [run(predict, "fleet-g", 9.0), run(predict, "fleet-g", 11.0, mode="estimated"),
            run(predict, "fleet-g", 13.0, case="b"), run(predict, "fleet-g", 9.5, round_=2)]
    rows = predict.summarize(runs)
    assert [(r.case, r.mode, r.measured_s) for r in rows] == [("a", "measured", 9.25), ("a", "estimated", 11.0),
                                                             ("b", "measured", 13.0)]


@pytest.mark.parametrize("measured, within", [(8.5, True), (11.5, True), (8.4, False), (11.6, False)])
def test_the_band_includes_its_ends(predict, measured, within):
    (row,) = predict.summarize([run(predict, "fleet-g", measured, 10.0)])
    assert row.within is within


def test_within_count_leaves_auto_out(predict):
    rows = predict.summarize([run(predict, "fleet-g", 10.0), run(predict, "baseline", 20.0),
                              run(predict, "auto", 10.0, chosen="fleet-g")])
    assert predict.within_count(rows) == (1, 2)


def auto_case(predict, baseline_s: float, picks: list[str]):
    named = [run(predict, "fleet-g", s, round_=k) for k, s in enumerate([10.0, 10.2, 9.8], 1)]
    named += [run(predict, "baseline", baseline_s, round_=k) for k in (1, 2, 3)]
    auto = [run(predict, "auto", 10.0, round_=k, chosen=pick) for k, pick in enumerate(picks, 1)]
    return predict.auto_verdicts(predict.summarize(named + auto))


def test_auto_picking_the_fastest_is_near(predict):
    (verdict,) = auto_case(predict, 20.0, ["fleet-g", "baseline", "fleet-g"])
    assert (verdict.pick, verdict.rounds_picked, verdict.rounds) == ("fleet-g", 2, 3)
    assert (verdict.fastest, verdict.fastest_s, verdict.pick_s) == ("fleet-g", 10.0, 10.0)
    assert verdict.near is True and verdict.auto_s == 10.0


@pytest.mark.parametrize("baseline_s, near", [(10.4, True), (10.6, False)])
def test_auto_picking_another_policy_is_near_within_five_percent(predict, baseline_s, near):
    (verdict,) = auto_case(predict, baseline_s, ["baseline"] * 3)
    assert verdict.fastest == "fleet-g" and verdict.pick_s == baseline_s
    assert verdict.over_fastest == pytest.approx(baseline_s / 10.0)
    assert verdict.near is near


def test_a_pick_not_run_by_name_has_no_verdict(predict):
    (verdict,) = auto_case(predict, 20.0, ["homogeneous"] * 3)
    assert verdict.pick_s is None and verdict.over_fastest is None and verdict.near is None
    assert "not run by name" in predict.verdict_line(verdict)


def test_the_table_shows_a_missing_predicted_wall_as_a_dash(predict):
    rows = predict.summarize([run(predict, "fleet-g", 10.0), run(predict, "baseline", 10.0, wall_s=17.5)])
    assert predict.row_line(rows[0]).split()[-1] == "-"
    assert predict.row_line(rows[1]).split()[-1] == "17.5"
