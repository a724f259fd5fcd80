"""An adaptive search's asked model, planned at its own architecture's rates (issue 48).

A placeholder is planned at the rates of the space's middle values; when it is asked, its rates
become those times its FLOPs per sample over the asked model's (`RunSearch.launching`), and the
driver takes them (`Driver.rates_estimated`): the books, fleet-adaptive's own rate curves and the
adapter's measurements (the asked model leaves the placeholders it was measured with) all move.
"""

from types import SimpleNamespace

import pytest

from fleet.inspect import describe_model
from fleet.runtime.control.search import RunSearch
from fleet.schedule import Decision, Member, ModelState, Overheads, Policy, RateTable, StreamPlan, create_policy
from fleet.schedule.adapting import Adapter, RateTuner
from fleet.schedule.driver import Driver
from fleet.schedule.ledger import Ledger
from fleet.schedule.rates import reestimated
from fleet.schedule.refine import RateRefiner
from fleet.spec import parse_spec

from test_schedule_adapting import RecordingNotes
from test_schedule_driver import ReplayWorld
from test_search_study import spec_of


def placeholders(count: int = 4) -> RateTable:
    """`count` placeholders of one search, measured as the first (as estimated or profiled), 100
    samples/s on one GPU and 180 on two; then a model of its own."""
    models = [{"id": f"s-{k:03d}", "rates": {"1": 100.0, "2": 180.0}, **({"timed_as": "s-000"} if k else {})}
              for k in range(count)]
    return RateTable.from_dict({"gpus_per_node": 2, "samples_per_epoch": 1000,
                                "models": [*models, {"id": "ref", "rates": {"1": 50.0, "2": 90.0}}]})


def test_an_asked_model_is_planned_at_its_factor_and_leaves_its_placeholders_timing():
    table = reestimated(placeholders(), {"s-000": 0.25})
    assert table.profile("s-000").rates == (25.0, 45.0)
    assert [table.profile(m).rates for m in ("s-001", "ref")] == [(100.0, 180.0), (50.0, 90.0)]
    # s-000 stood for the others: s-001 does now, and s-000 is measured on its own
    assert [table.profile(f"s-{k:03d}").extra.get("timed_as") for k in range(4)] == [None, None, "s-001", "s-001"]
    later = reestimated(table, {"s-002": 2.0})
    assert [later.profile(f"s-{k:03d}").extra.get("timed_as") for k in range(4)] == [None, None, None, "s-001"]
    assert later.profile("s-001") is table.profile("s-001")  # untouched profiles are kept as they are
    with pytest.raises(ValueError, match="s-001: a rate factor must be finite and > 0"):
        reestimated(table, {"s-001": float("nan")})


def test_what_was_measured_for_the_placeholders_stays_with_them():
    refiner = RateRefiner(placeholders())
    refiner.observe("s-002", 1, 80.0)  # measured under s-000, for the group
    refiner.part(["s-000"])
    refiner.observe("s-000", 1, 10.0)  # the asked model's own measure, shared with nobody
    proposal = refiner.propose(reestimated(placeholders(), {"s-000": 0.25}))
    assert [proposal.rate(f"s-{k:03d}", 1) for k in range(4)] == [10.0, 80.0, 80.0, 80.0]


class LaunchesAll(Policy):
    """Launches every pending model on one GPU each, in the view's order, whenever GPUs are free."""

    name = "launches-all"

    def start(self, view):
        return self.on_event(None, view)

    def on_event(self, event, view):
        pending = [m.id for m in view.models if m.state is ModelState.PENDING][:len(view.free_gpus)]
        return Decision.launching([StreamPlan((Member(m, (g,)),)) for m, g in zip(pending, view.free_gpus)])


def test_the_driver_plans_an_asked_model_at_its_new_rates_and_measures_it_alone():
    rates = placeholders()
    ledger = Ledger(rates, (3,) * 5, total_gpus=2, gpus_per_node=2)
    policy = create_policy("fleet-g")
    tuner = RateTuner(ledger, policy, lambda: create_policy("fleet-g"), Overheads, RecordingNotes())
    driver = Driver(LaunchesAll(), ledger, ReplayWorld(), Adapter(tuner))
    driver.start()
    driver.rates_estimated({"s-000": 0.5})
    assert driver.view().rates.rate("s-000", 1) == 50.0 and driver.view().rates.rate("s-001", 1) == 100.0
    assert [s.pace for s in driver.view().streams] == [50.0, 100.0]  # its stream's pace too
    driver.rate_measured("s-000", 30.0)  # the asked model's own measure moves no placeholder
    proposal = tuner.refiner.propose(ledger.rates)
    assert proposal.rate("s-000", 1) == 30.0 and proposal.rate("s-002", 1) == 100.0


def test_fleet_adaptive_replans_with_an_asked_models_rates():
    ledger = Ledger(placeholders(), (3,) * 5, total_gpus=2, gpus_per_node=2)
    policy = create_policy("fleet-adaptive")
    driver = Driver(policy, ledger, ReplayWorld())
    driver.start()
    running = ledger.ids_in(ModelState.RUNNING)
    asked = next(m for m in running if m.startswith("s-"))
    assert policy.plan.rate(driver.view(), asked, 1) == pytest.approx(100.0)
    driver.rates_estimated({asked: 0.25})
    driver.converged(next(m for m in running if m != asked), 3, 100.0)  # the next event: the policy reads the new table
    assert policy.plan.rate(driver.view(), asked, 1) == pytest.approx(25.0)
    others = [m for m in ("s-001", "s-002", "s-003") if m != asked]
    assert all(policy.plan.rate(driver.view(), m, 1) == pytest.approx(100.0) for m in others)


def mlp_flops(hidden: list[int]) -> int:
    spec = parse_spec({"name": "f", "data": {"source": "digits"},
                       "models": [{"family": "mlp", "params": {"hidden": hidden}}]}, check_paths=False)
    return describe_model(spec, 0, (1, 8, 8), 10).stats.flops_per_sample


class Quiet:
    def write(self, *args, **kwargs):
        self.last = kwargs

    def left(self, model, text):
        self.said = text


def test_an_ask_returns_the_placeholders_flops_over_the_asked_models(tmp_path):
    spec = spec_of(tmp_path, budget=3)
    ctx = SimpleNamespace(run_dir=tmp_path, spec=spec, device="cpu", input_shape=(1, 8, 8), num_classes=10)
    log, console = Quiet(), Quiet()
    search = RunSearch(ctx, {}, log, console)
    factors = search.launching(["s-000", "s-001"])
    for model in ("s-000", "s-001"):
        hidden = ctx.spec.model(model).params["hidden"]
        assert factors[model] == pytest.approx(mlp_flops([64]) / mlp_flops(hidden))  # [64]: the middle choice
    assert log.last["rate_factor"] == factors["s-001"] and "the placeholder's rate" in console.said
    assert search.launching(["s-000"]) == {}  # asked before: nothing new
    emulated = RunSearch(SimpleNamespace(**(vars(ctx) | {"device": "emulated"})), {}, log, console)
    assert emulated.launching(["s-002"]) == {}  # the emulated device's rates are each model's own
