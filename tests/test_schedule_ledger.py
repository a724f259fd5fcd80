"""The driver's books (`fleet.schedule.ledger.Ledger`): streams, GPU owners, rounds, moves."""

import pytest

from fleet.schedule import POLICIES, Member, ModelState, PolicyError, RateTable, StreamPlan, create_policy
from fleet.schedule.ledger import Ledger, describe_books
from fleet.schedule.planners import HOPPING_POLICIES


def rates3() -> RateTable:
    return RateTable.from_dict({"schema": 1, "gpus_per_node": 2, "samples_per_epoch": 100, "models": [
        {"id": m, "rates": {"1": r, "2": 1.8 * r}} for m, r in (("a", 100), ("b", 90), ("c", 50))]})


def test_ledger_tracks_streams_gpus_and_rounds():
    ledger = Ledger(rates3(), [3, 3, 3], total_gpus=4, gpus_per_node=2, epochs_done={"c": 1}, paused=["c"])
    assert ledger.model("c").state is ModelState.PAUSED and ledger.model("c").epochs_done == 1
    plan = StreamPlan((Member("a", (0,)), Member("c", (1, 2))))
    ledger.check_launch([plan], "p")
    assert ledger.begin_launch()
    stream = ledger.open_stream()
    for member in plan.members:
        ledger.reserve(member.model, member.gpus, stream)
    view = ledger.view(1.0)
    assert view.free_gpus == (3,) and view.streams[0].members == ("a", "c") and view.round == 0
    rates = rates3()
    assert view.streams[0].pace == min(rates.rate("a", 1), rates.rate("c", 2)) > 0  # planned from the profile
    with pytest.raises(PolicyError, match="GPU 2 for b is not free"):
        ledger.check_launch([StreamPlan((Member("b", (2,)),))], "p")
    with pytest.raises(PolicyError, match="cannot launch a"):
        ledger.check_launch([StreamPlan((Member("a", (3,)),))], "p")
    assert ledger.release("a", ModelState.CONVERGED) == (0,)
    ledger.start_checkpoint("c")
    assert ledger.release("c", ModelState.PAUSED) == (1, 2) and ledger.drained and not ledger.streams
    assert ledger.begin_launch() and ledger.round == 1  # a launch on a drained cluster starts a round
    assert ledger.unfinished == 2


def test_ledger_moves_a_reserved_model_to_another_stream_and_frees_its_gpus_when_it_ends():
    """The runtime moves a join that cannot happen to a stream of its own (a restream); the
    model's GPUs come free when it ends: a move once counted them held a second time, and a
    job of `policy: auto` hung after it handed over to fleet-g, which waits for a drained cluster."""
    ledger = Ledger(rates3(), [3, 3, 3], total_gpus=4, gpus_per_node=2)
    old = ledger.open_stream()
    ledger.reserve("a", (0, 1), old)
    new = ledger.open_stream()
    ledger.move("a", new)
    assert ledger.model("a").stream == new and ledger.model("a").gpus == (0, 1)
    assert old not in ledger.streams and ledger.streams[new] == ["a"]
    assert ledger.active == 1 and ledger.free_gpus == (2, 3)
    assert ledger.release("a", ModelState.CONVERGED) == (0, 1)
    assert ledger.drained and not ledger.streams and ledger.active == 0
    with pytest.raises(PolicyError, match="cannot move a to stream 2, it is converged"):
        ledger.move("a", ledger.open_stream())


def test_ledger_counts_the_models_with_a_report_to_make_and_describes_its_books():
    ledger = Ledger(rates3(), [3, 3, 3], total_gpus=4, gpus_per_node=2, paused=["c"])
    ledger.reserve("a", (0,), ledger.open_stream())
    ledger.reserve("b", (1, 2), ledger.open_stream())
    ledger.start_checkpoint("b")
    assert ledger.active == 2
    assert describe_books(ledger) == ("1 waiting, 0 held at a rung, 1 running, 1 checkpointing, 0 converged; "
                                 "3 of 4 GPUs in use")
    ledger.release("b", ModelState.PAUSED)
    ledger.release("a", ModelState.CONVERGED)
    assert ledger.active == 0 and describe_books(ledger).startswith("2 waiting, 0 held at a rung, 0 running")


@pytest.mark.parametrize("name", sorted(set(POLICIES) - set(HOPPING_POLICIES)))  # those need partitions
def test_every_policy_starts_a_job_with_no_model_left(name):
    # a job requeued after its last model ended (its checkpoint signal came late): the policy's
    # first plan sees no model and launches nothing, fleet-adaptive's bounds included
    ledger = Ledger(RateTable((), 2, 100), [], total_gpus=4, gpus_per_node=2)
    decision = create_policy(name).start(ledger.view(0.0))
    assert not getattr(decision, "streams", ())
