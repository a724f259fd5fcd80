"""Planning at supercomputer scale: thousands of models on thousands of GPUs.

No recursion proportional to the number of models may sit in a planner: Python's stack holds
about a thousand frames, and a job of 1,500 models planned with fleet-adaptive died of a
recursive placement search.
"""

import numpy as np
import pytest

from fleet.schedule import POLICIES, ModelState, create_policy, scale
from fleet.schedule.driver import Driver
from fleet.schedule.ledger import Ledger
from fleet.schedule.partitions import Partitions
from fleet.schedule.planners._adaptive_plan import ModelPlan


class LaunchesOnly:
    """A world that records what the driver launches and nothing else."""

    def __init__(self):
        self.members = []

    def now(self) -> float:
        return 0.0

    def round_ending(self, index: int) -> None:
        pass

    def checkpoint(self, model: str) -> None:
        pass

    def launch(self, launches, new_round: bool, planning_s: float) -> None:
        self.members += [m for launch in launches for m in launch.members]


MODELS = GPUS = 10_000


@pytest.fixture(scope="module")
def workload():
    return scale(seed=0, models=MODELS, gpus_per_node=8)


@pytest.mark.parametrize("policy", sorted(POLICIES))
def test_the_first_plan_of_10000_models_on_10000_gpus(policy, workload):
    """Every policy plans this size (the hoppers on two partitions): Python's stack holds a
    thousand frames, so no recursion proportional to the models can hide here."""
    hops = create_policy(policy).hops
    n = workload.rates.samples_per_epoch
    partitions = Partitions((n * 0.4, n * 0.6), 8, GPUS // 8) if hops else None
    ledger = Ledger(workload.rates, workload.scenario(GPUS).epochs_estimate, GPUS, 8, partitions=partitions)
    world = LaunchesOnly()
    Driver(create_policy(policy, seed=0), ledger, world).start()
    gpus = [g for m in world.members for g in m.gpus]
    assert world.members and len(gpus) == len(set(gpus)) and set(gpus) <= set(range(GPUS))
    assert all(ledger.model(m.model).state is ModelState.RUNNING for m in world.members)


def test_fleet_adaptive_plans_rates_past_the_counts_it_keeps():
    """Its plan keeps rates only up to the last count some model gains from; a count past it
    (a leftover GPU handed to a member) is rated from the profile all the same."""
    workload = scale(seed=0, models=50)
    view = Ledger(workload.rates, workload.scenario(400).epochs_estimate, 400, 4).view(0.0)
    plan = ModelPlan(1.7, 0.5)
    plan.plan(view)
    kept = plan.rates.shape[1]
    assert kept < 400
    model = workload.rates.ids[3]
    counts = np.array([[1, kept, kept + 1, 399]])
    assert plan.rates_at(view, [model], counts).tolist() == [[workload.rates.rate(model, c) for c in counts[0]]]
