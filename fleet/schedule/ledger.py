"""The driver's books: model states, GPU ownership, streams and rounds, and the views.

The driver of the policy protocol (`fleet.schedule.driver`) keeps one `Ledger`, whoever runs
it (the simulator, the MPI coordinator). It checks every decision against the protocol
(`check_launch`), records launches, state changes and releases, counts rounds (a launch on a
drained cluster starts the next one), and builds the frozen `ClusterView` each policy call
receives. A stream's pace in the view is its planned pace (`Ledger.pace`) from its launch on,
in every driver.
"""

from __future__ import annotations

import bisect
from collections import Counter
from collections.abc import Callable, Container, Iterable, Mapping
from dataclasses import replace

from fleet.schedule._base import ClusterView, ModelState, ModelView, PolicyError, StreamPlan, StreamView, WAITING
from fleet.schedule.grouping import group_of
from fleet.schedule.partitions import Partitions
from fleet.schedule.rates import RateTable


def check_launch(
    plans: Iterable[StreamPlan],
    policy: str,
    state_of: Callable[[str], ModelState],
    gpu_is_free: Callable[[int], bool],
    running_streams: Container[int],
) -> None:
    """The protocol's rules for `Decision.launch` (shared by every driver).

    Raises:
        PolicyError: joining a stream that is not running, own decoding for a join or for
            several members, a model launched twice or not
            PENDING/PAUSED, a member without GPUs, a GPU that is not free or used twice.
    """
    seen: set[int] = set()
    launched: set[str] = set()
    for plan in plans:
        if plan.join is not None and plan.join not in running_streams:
            raise PolicyError(f"{policy}: stream {plan.join} is not running")
        if plan.own_decoding and (plan.join is not None or len(plan.members) != 1):
            raise PolicyError(f"{policy}: only a new stream of one member decodes its own data")
        for member in plan.members:
            for model in member.ids:  # a bundle's models share its GPUs
                state = state_of(model)
                if model in launched:
                    raise PolicyError(f"{policy}: {model} launched twice")
                launched.add(model)
                if state not in WAITING:
                    raise PolicyError(f"{policy}: cannot launch {model}, it is {state.value}")
            if not member.gpus:
                raise PolicyError(f"{policy}: {member.model} launched on no GPU")
            for g in member.gpus:
                if not gpu_is_free(g) or g in seen:
                    raise PolicyError(f"{policy}: GPU {g} for {member.model} is not free")
                seen.add(g)


def check_visits(plans: Iterable[StreamPlan], policy: str, partitions: Partitions,
                 visited: Callable[[str], tuple[int, ...]], parts_of: Callable[[str], tuple[int, ...]]) -> None:
    """The protocol's rules for launches on partitioned data: each stream on one partition's
    GPUs, no joins, each member a model that has not visited that partition in its epoch and
    visits it at all (`parts_of`: the partitions each model visits: its group's, or every one).

    Raises:
        PolicyError: a plan breaks one of them.
    """
    for plan in plans:
        if plan.join is not None:
            raise PolicyError(f"{policy}: no joins with partitioned data (a visit starts at its partition's start)")
        where = {partitions.of_gpu(g) for member in plan.members for g in member.gpus}
        if len(where) != 1:
            raise PolicyError(f"{policy}: a stream spans partitions {sorted(where)}; it must stay on one")
        (partition,) = where
        for member in plan.members:
            if partition in visited(member.model):
                raise PolicyError(f"{policy}: {member.model} already visited partition {partition} this epoch")
            if partition not in parts_of(member.model):
                raise PolicyError(f"{policy}: {member.model} does not visit partition {partition} (its group's data "
                                  f"lies on partition(s) {', '.join(map(str, parts_of(member.model)))})")


def visit_parts(partitions: Partitions, rates: RateTable, model_id: str) -> tuple[int, ...]:
    """The partitions `model_id` visits each epoch: its group's (`Partitions.parts_of`)."""
    return partitions.parts_of(group_of(rates, model_id))


def stream_partition(plan: StreamPlan, partitions: Partitions | None) -> int | None:
    """The partition a checked stream plan visits (None without partitions)."""
    if partitions is None:
        return None
    return partitions.of_gpu(plan.members[0].gpus[0])


def describe_books(ledger: Ledger) -> str:
    """`ledger`'s books in words, for an error: the models in each state and the GPUs in use
    (naming any that no model holds)."""
    counts = Counter(v.state for v in ledger.views)
    waiting = counts[ModelState.PENDING] + counts[ModelState.PAUSED]
    in_use = ledger.total_gpus - len(ledger.free_gpus)
    text = (f"{waiting} waiting, {counts[ModelState.HELD]} held at a rung, {counts[ModelState.RUNNING]} running, "
            f"{counts[ModelState.CHECKPOINTING]} checkpointing, {counts[ModelState.CONVERGED]} converged; "
            f"{in_use} of {ledger.total_gpus} GPUs in use")
    owned = {g for v in ledger.views for g in v.gpus}
    orphans = [g for g in range(ledger.total_gpus) if ledger.holders[g] and g not in owned]
    if orphans:
        text += f" ({'GPUs' if len(orphans) > 1 else 'GPU'} {', '.join(map(str, orphans))} held by no model)"
    return text


_ACTIVE = (ModelState.RUNNING, ModelState.CHECKPOINTING)
"""The states of a model with a report still to make (its epoch's end, its checkpoint)."""


def _first_state(model: str, paused: set[str], held: set[str]) -> ModelState:
    if model in held:
        return ModelState.HELD
    return ModelState.PAUSED if model in paused else ModelState.PENDING


class Ledger:
    """Mutable books of one run; see the module docstring."""

    def __init__(
        self,
        rates: RateTable,
        epochs_estimate: Iterable[float],
        total_gpus: int,
        gpus_per_node: int,
        epochs_done: Mapping[str, int] | None = None,
        paused: Iterable[str] = (),
        decode_rate: float | None = None,
        partitions: Partitions | None = None,
        visited: Mapping[str, Iterable[int]] | None = None,
        held: Iterable[str] = (),
    ):
        self._rates, self.total_gpus, self.gpus_per_node = rates, total_gpus, gpus_per_node
        self.decode_rate, self.partitions = decode_rate, partitions
        done, seen = epochs_done or {}, visited or {}
        paused, held = set(paused), set(held)
        self.views = [
            ModelView(p.id, _first_state(p.id, paused, held), done.get(p.id, 0), float(e),
                      visited=tuple(sorted(set(seen.get(p.id, ())))))
            for p, e in zip(rates.models, epochs_estimate)
        ]
        self._unfinished = sum(v.state is not ModelState.CONVERGED for v in self.views)
        self._active = 0  # models running or checkpointing: each has a report to make
        self.holders = [0] * total_gpus  # models holding each GPU (a bundle's models share theirs)
        self._free = list(range(total_gpus))  # the GPUs no model holds, ascending (kept as they change)
        self.streams: dict[int, list[str]] = {}
        self.next_stream = 0
        self.round = 0
        self.launches = 0
        self._cached: tuple[tuple[StreamView, ...], tuple[int, ...]] | None = None  # (streams, free GPUs)
        self._stream_views: dict[int, StreamView] = {}  # of the streams unchanged since their view was built
        self._member_rates: dict[str, float] = {}  # running model -> its profiled rate on its GPUs

    @property
    def rates(self) -> RateTable:
        """The rate table policies plan with (the runtime may adopt refined rates)."""
        return self._rates

    @rates.setter
    def rates(self, table: RateTable) -> None:
        self._rates, self._cached = table, None
        self._stream_views.clear()
        self._member_rates.clear()

    # -- queries ----------------------------------------------------------------------------

    def model(self, model_id: str) -> ModelView:
        try:
            return self.views[self.rates.index(model_id)]
        except KeyError:
            raise PolicyError(f"unknown model {model_id!r}") from None

    def ids_in(self, *states: ModelState) -> list[str]:
        return [v.id for v in self.views if v.state in states]

    @property
    def drained(self) -> bool:
        return len(self._free) == self.total_gpus

    @property
    def free_gpus(self) -> tuple[int, ...]:
        return tuple(self._free)

    @property
    def unfinished(self) -> int:
        """Models not converged (kept as states change: both worlds ask after every event)."""
        return self._unfinished

    @property
    def active(self) -> int:
        """Models running or checkpointing, each with a report still to make (kept as states change)."""
        return self._active

    def pace(self, stream: int) -> float:
        """The pace a stream is planned to move at: its slowest member's profiled rate, no
        faster than decoding (the coordinator launches a stream at once, so it has one from
        its launch; 0 for a stream with no members)."""
        members = self.streams.get(stream, [])
        if not members:
            return 0.0
        pace = min(self._member_rate(m) for m in members)
        return pace if self.decode_rate is None else min(pace, self.decode_rate)

    def _member_rate(self, model_id: str) -> float:
        """A running model's profiled rate on its GPUs, kept while it runs there (a stream's pace
        is asked again whenever a member leaves: thousands of members, thousands of times)."""
        rate = self._member_rates.get(model_id)
        if rate is None:
            rate = self._member_rates[model_id] = self.rates.rate(model_id, len(self.model(model_id).gpus))
        return rate

    def view(self, now: float) -> ClusterView:
        if self._cached is None:
            for s, members in self.streams.items():
                if s not in self._stream_views:
                    self._stream_views[s] = StreamView(s, tuple(members), self.pace(s))
            streams = tuple(self._stream_views[s] for s in self.streams)
            self._cached = (streams, self.free_gpus)
        streams, free = self._cached
        return ClusterView(
            now, self.total_gpus, self.gpus_per_node, self.round, self.rates, tuple(self.views), streams, free,
            self.decode_rate, self.partitions,
        )

    # -- decisions --------------------------------------------------------------------------

    def check_launch(self, plans: Iterable[StreamPlan], policy: str, leaving: Iterable[str] = ()) -> None:
        """Raise `PolicyError` unless every plan follows the protocol (see `_base.py`);
        ``leaving``: the models the same decision checkpoints first (a stream they all leave
        has ended before the launch)."""
        leaving = set(leaving)
        running = {s for s, members in self.streams.items() if not leaving.issuperset(members) or not members}
        check_launch(
            plans, policy, lambda model_id: self.model(model_id).state,
            lambda g: 0 <= g < self.total_gpus and not self.holders[g], running,
        )
        if self.partitions is not None:
            check_visits(plans, policy, self.partitions, lambda model_id: self.model(model_id).visited,
                         lambda model_id: visit_parts(self.partitions, self._rates, model_id))

    def begin_launch(self) -> bool:
        """Count the launch; True when it starts a new round (a launch on a drained cluster)."""
        new_round = self.drained
        if new_round and self.launches > 0:
            self.round += 1
        self.launches += 1
        return new_round

    def open_stream(self) -> int:
        stream = self.next_stream
        self.next_stream += 1
        self.streams[stream] = []
        self._cached = None
        return stream

    def reserve(self, model_id: str, gpus: tuple[int, ...], stream: int) -> None:
        """The model runs on `gpus` in `stream` from now on (beside the other models of its
        bundle, reserved on the same GPUs)."""
        self._member_rates.pop(model_id, None)
        for g in gpus:
            if not self.holders[g]:
                del self._free[bisect.bisect_left(self._free, g)]
            self.holders[g] += 1
        self._enter_stream(model_id, stream)
        self._set(model_id, state=ModelState.RUNNING, gpus=tuple(gpus), stream=stream)

    def move(self, model_id: str, stream: int) -> None:
        """A running model (reserved to join a stream) runs in `stream` instead, on the GPUs it
        holds already (they are not reserved again: each would stay held after it left them)."""
        view = self.model(model_id)
        if view.state is not ModelState.RUNNING:
            raise PolicyError(f"cannot move {model_id} to stream {stream}, it is {view.state.value}")
        self._leave_stream(model_id)
        self._enter_stream(model_id, stream)
        self._set(model_id, stream=stream)

    # -- state changes ----------------------------------------------------------------------

    def epoch_done(self, model_id: str, epochs: int) -> None:
        self._set(model_id, epochs_done=epochs)

    def set_next_stop(self, model_id: str, epochs: int | None) -> None:
        """The epochs at which the model's training may be cut next (early stopping's next rung)."""
        if self.model(model_id).next_stop != epochs:
            self._set(model_id, next_stop=epochs)

    def promote(self, model_id: str) -> None:
        """A model held at a rung may be launched again (``HELD`` -> ``PAUSED``)."""
        if self.model(model_id).state is not ModelState.HELD:
            raise PolicyError(f"cannot promote {model_id}, it is {self.model(model_id).state.value}")
        self._set(model_id, state=ModelState.PAUSED)

    def visit_done(self, model_id: str, partition: int) -> bool:
        """A running model finished its visit of `partition` and starts its hop (it is
        CHECKPOINTING from now on). Returns True when the visit ended its epoch (every
        partition visited; the visits start again)."""
        if self.partitions is None or partition not in visit_parts(self.partitions, self._rates, model_id):
            raise PolicyError(f"{model_id}: a visit of partition {partition}, which this run does not have for it")
        ended = self.visit_ends_epoch(model_id, partition)
        if self.model(model_id).state is not ModelState.CHECKPOINTING:  # (the checkpoint signal came first)
            self.start_checkpoint(model_id)
        visited = self.model(model_id).visited
        self._set(model_id, visited=() if ended else tuple(sorted((*visited, partition))))
        return ended

    def visit_ends_epoch(self, model_id: str, partition: int) -> bool:
        """Whether a visit of `partition` now would end the model's epoch (it is the last
        partition it has not visited in this epoch).

        Raises:
            PolicyError: it visited `partition` in this epoch already.
        """
        visited = self.model(model_id).visited
        if partition in visited:
            raise PolicyError(f"{model_id}: visited partition {partition} twice in one epoch")
        return len(visited) + 1 == len(visit_parts(self.partitions, self._rates, model_id))

    def start_checkpoint(self, model_id: str) -> None:
        view = self.model(model_id)
        if view.state is not ModelState.RUNNING:
            raise PolicyError(f"cannot checkpoint {model_id}, it is {view.state.value}")
        self._leave_stream(model_id)
        self._set(model_id, state=ModelState.CHECKPOINTING, stream=None)

    def release(self, model_id: str, state: ModelState) -> tuple[int, ...]:
        """The model leaves its GPUs; it is now `state` (CONVERGED, PAUSED or HELD). Returns the
        GPUs that came free: all of them, but none while other models of its bundle hold them."""
        view = self.model(model_id)
        if view.state is ModelState.RUNNING:
            self._leave_stream(model_id)
        self._member_rates.pop(model_id, None)
        freed = []
        for g in view.gpus:
            if self.holders[g]:
                self.holders[g] -= 1
                if not self.holders[g]:
                    bisect.insort(self._free, g)
                    freed.append(g)
        self._set(model_id, state=state, gpus=(), stream=None)
        return tuple(freed)

    def _enter_stream(self, model_id: str, stream: int) -> None:
        self.streams[stream].append(model_id)
        self._stream_views.pop(stream, None)

    def _leave_stream(self, model_id: str) -> None:
        stream = self.model(model_id).stream
        if stream is None:
            return
        members = self.streams[stream]
        members.remove(model_id)
        self._stream_views.pop(stream, None)
        self._cached = None
        if not members:
            del self.streams[stream]

    def _set(self, model_id: str, **fields) -> None:
        index = self.rates.index(model_id)
        before = self.views[index]
        self.views[index] = replace(before, **fields)
        if "state" in fields:
            self._unfinished += (before.state is ModelState.CONVERGED) - (fields["state"] is ModelState.CONVERGED)
            self._active += (fields["state"] in _ACTIVE) - (before.state in _ACTIVE)
        if not fields.keys() <= {"epochs_done", "next_stop"}:
            self._cached = None  # GPUs, streams or paces changed
