"""RateTable, Eq. 5 extrapolation, the M_t rule, and profile.json parsing."""

import json

import numpy as np
import pytest

from fleet.errors import UserError
from fleet.schedule.rates import (
    ModelProfile,
    ProfileFormatError,
    RateTable,
    extrapolate_rate,
    threshold_gpus,
    useful_width,
)
from fleet.schedule_io import epochs_from_profile, load_profile, save_profile


def test_eq5_extrapolates_beyond_measured_counts():
    # gpn = 2 -> M_b = 4; r(4) = 34, r(3) = 27; decay = 34/27 * 3/4 = 0.94444
    measured = [10, 19, 27, 34]
    assert extrapolate_rate(measured, 3, 2) == 27  # measured values are used as they are
    assert extrapolate_rate(measured, 5, 2) == pytest.approx(5 * 34 / 4 * (34 / 27 * 3 / 4))  # 40.139
    assert extrapolate_rate(measured, 6, 2) == pytest.approx(6 * 34 / 4 * (34 / 27 * 3 / 4) ** 2)  # 45.49


def test_eq5_reproduces_the_anchor_points():
    measured = [10, 19, 27, 34, 40, 45, 49, 52]
    # anchored at M_b = 2 * gpn = 8 with gpn = 4: the formula gives back r(8) and r(7)
    m_b, r_b, r_b1 = 8, 52, 49
    formula = lambda m: m * r_b / m_b * (r_b / r_b1 * (m_b - 1) / m_b) ** (m - m_b)  # noqa: E731
    assert formula(8) == pytest.approx(52) and formula(7) == pytest.approx(49)
    assert extrapolate_rate(measured, 9, 4) == pytest.approx(formula(9))


def test_eq5_falls_back_when_profile_is_short():
    assert extrapolate_rate([10, 18], 4, 4) == pytest.approx(4 * 18 / 2 * (18 / 10 * 1 / 2) ** 2)
    assert extrapolate_rate([10], 5, 4) == 10  # one point: no scaling assumed


def test_threshold_gpus_rule():
    # M_a = ceil(176 / 21) = 9 > M_b = 8
    assert threshold_gpus([176, 50, 21], 4) == 9
    # M_a = ceil(100 / 50) = 2 < M_b = 8
    assert threshold_gpus([100, 50], 4) == 8
    # M_a = ceil(7.0) = 7 exactly, M_b = 2
    assert threshold_gpus([70, 10], 1) == 7


def _profile(**extra):
    return {
        "schema": 1,
        "gpus_per_node": 4,
        "samples_per_epoch": 1000,
        "hardware": {"gpu": "P100"},  # unknown extras must be tolerated
        "models": [
            {"id": "a", "rates": {"1": 100, "2": 190}, "epochs": 10, "param_bytes": 4000, "batch": 64},
            {"id": "b", "rates": {"2": 95, "1": 50}},
        ],
        **extra,
    }


def test_round_trip_keeps_extra_fields(tmp_path):
    table = RateTable.from_dict(_profile())
    assert table.ids == ("a", "b")
    assert table.profile("b").rates == (50.0, 95.0)
    assert table.profile("a").epochs == 10 and table.profile("b").epochs is None
    assert table.matrix(3)[0, 2] == pytest.approx(extrapolate_rate([100, 190], 3, 4))
    path = tmp_path / "profile.json"
    save_profile(table, path)
    again = json.loads(path.read_text())
    assert again["hardware"] == {"gpu": "P100"} and again["models"][0]["batch"] == 64
    assert load_profile(path) == table


@pytest.mark.parametrize(
    "mutate, field",
    [
        (lambda d: d.pop("gpus_per_node"), "gpus_per_node"),
        (lambda d: d.update(samples_per_epoch=-3), "samples_per_epoch"),
        (lambda d: d.update(models=[]), "models"),
        (lambda d: d["models"][1].pop("id"), "models[1].id"),
        (lambda d: d["models"][0]["rates"].update({"3": "fast"}), "models[0].rates.3"),
        (lambda d: d["models"][0]["rates"].update({"x": 5}), "models[0].rates.x"),
        (lambda d: d["models"][0]["rates"].update({"4": 5}), "models[0].rates"),
        (lambda d: d["models"][0].update(epochs=0), "models[0].epochs"),
        (lambda d: d["models"][0].update(param_bytes=1.5), "models[0].param_bytes"),
        (lambda d: d.update(schema=2), "schema"),
        (lambda d: d["models"][1].update(id="a"), "models"),
    ],
)
def test_malformed_profile_names_the_field(mutate, field):
    data = _profile()
    mutate(data)
    with pytest.raises(ProfileFormatError) as info:
        RateTable.from_dict(data)
    assert info.value.field == field


def test_load_profile_errors_name_the_file(tmp_path):
    with pytest.raises(UserError, match="nope.json: no such file"):
        load_profile(tmp_path / "nope.json")
    bad = tmp_path / "bad.json"
    bad.write_text("{not json")
    with pytest.raises(UserError, match="bad.json: invalid JSON"):
        load_profile(bad)
    bad.write_text(json.dumps({**_profile(), "gpus_per_node": "four"}))
    with pytest.raises(UserError, match=r"bad.json: gpus_per_node: expected a positive integer"):
        load_profile(bad)


def test_epochs_from_profile_says_where_they_came_from():
    table = RateTable.from_dict(_profile())
    with pytest.raises(UserError, match=r"models\[1\].epochs: missing"):
        epochs_from_profile(table, None)
    assert epochs_from_profile(table, 30) == ((10.0, 30.0), "profile + max-epochs")
    full = table.with_epochs([5, 6])
    assert epochs_from_profile(full, None) == ((5.0, 6.0), "profile")


def test_model_profile_rate_uses_gpus_per_node():
    p = ModelProfile("x", (10.0, 19.0, 27.0, 34.0))
    assert p.rate(5, 2) == pytest.approx(extrapolate_rate(p.rates, 5, 2))


@pytest.mark.parametrize("measured, gpn", [
    ([10, 19, 27, 34], 2),  # decay 0.944: Eq. 5 peaks near m = 17
    ([100, 198, 294, 388], 2),  # near-linear: it peaks near m = 97
    ([10, 21, 33, 46], 2),  # super-linear: it never stops rising
    ([50], 4),  # one count: r(1) everywhere
    ([10, 19, 27, 34, 40, 45, 49, 52, 54, 55], 4),  # more measured than M_b
])
def test_useful_matrix_leaves_out_only_counts_slower_than_a_smaller_one(measured, gpn):
    table = RateTable((ModelProfile("a", tuple(measured)), ModelProfile("b", (20.0, 30.0))), gpn, 1000)
    full = table.matrix(400)
    useful = table.useful_matrix(400)
    assert np.array_equal(useful, full[:, : useful.shape[1]])  # the same floats
    best = np.maximum.accumulate(full, axis=1)
    assert (full[:, useful.shape[1]:] <= best[:, useful.shape[1] - 1 : -1]).all()
    assert useful.shape[1] < 400 if np.isfinite(useful_width(measured, gpn)) else useful.shape[1] == 400
