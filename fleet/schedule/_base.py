"""The planner (policy) protocol: events in, decisions out, over frozen views.

A *policy* decides which models train where and when. It is driven by a *driver*: the
discrete-event simulator (:mod:`fleet.schedule.simulator`) or the real MPI runtime's
coordinator on rank 0. Both drivers speak this protocol and nothing else.

Vocabulary
    *stream*: one decoded data stream shared by a set of models (its *members*); it moves
    at the pace of its slowest member, ``min_i r_i(m_i)``. *member*: a model in a stream with
    its list of global GPU indices (GPU ``g`` is on node ``g // gpus_per_node``). *round*:
    a maximal stretch of time during which at least one model holds GPUs; rounds are
    numbered from 0, and a new one starts when a policy launches on a drained cluster (for
    example after ``end_round``).

Calls (the driver owns the loop; the policy only answers)
    1. ``policy.start(view)`` once, with every GPU free and every model ``PENDING`` -- or,
       in a run resumed from checkpoints, ``PAUSED`` with its ``epochs_done`` (a model that
       converged before the resume is not in the view at all).
    2. ``policy.on_event(event, view)`` for each :data:`Event`, one at a time, in time
       order. ``view`` is the state *after* the event took effect (a converged model's
       GPUs are already free, a checkpointed model is already ``PAUSED``).
    Each call returns a :class:`Decision`, applied by the driver at once, before the next
    event. Simultaneous events are delivered one by one in a deterministic order.

Model states (:class:`ModelState`)
    ``PENDING --launch--> RUNNING --converge--> CONVERGED``;
    ``RUNNING --checkpoint/end_round--> CHECKPOINTING --done--> PAUSED --launch--> RUNNING``.
    A ``RUNNING`` model holds its GPUs from the launch on, including the time it spends
    restoring a checkpoint and waiting for its stream to start.

Early stopping across models (`fleet.schedule.early_stop`, the driver's)
    At a rung the driver may stop a model: it leaves its GPUs at the epoch it reported and
    :class:`ModelConverged` follows with ``stopped`` set (``CONVERGED``: done for good). With
    synchronous halving it may hold it instead: ``RUNNING --rung--> CHECKPOINTING --done-->
    HELD``; a ``HELD`` model holds no GPU and may not be launched until the rung fills, when
    it is promoted (``HELD --> PAUSED``, :class:`ModelPromoted`) or stopped (``HELD -->
    CONVERGED``, :class:`ModelConverged` with ``stopped`` and no GPUs). A model's
    ``next_stop`` says at which epochs its training may be cut next.

What a decision may contain (the driver rejects anything else with :class:`PolicyError`)
    * ``launch``: new streams, or members that *join* a running stream (``StreamPlan.join``
      = that stream's id; they consume it from its current position on). Only ``PENDING``
      or ``PAUSED`` models; only GPUs that are free in ``view``; each GPU at most once;
      each member at least one GPU. A *bundle* (``Member.models``, `fleet.schedule.bundling`)
      is one member whose models all hold its GPUs: they are free again when its last model
      leaves them (``ModelConverged.gpus`` and ``CheckpointCompleted.gpus`` name only GPUs
      that came free).
    * ``checkpoint``: ids of ``RUNNING`` models to checkpoint and take off their GPUs (the
      GPUs are freed when their :class:`CheckpointCompleted` arrives). A model whose last
      epoch ends at that very instant converges instead, and :class:`ModelConverged` follows.
    * ``end_round``: checkpoint every running model; the round ends when the last
      checkpoint completes. It cannot be combined with ``launch`` or ``checkpoint``.
    * nothing (:data:`NO_DECISION`).
    When no model is running or checkpointing and some are not converged, the policy must
    launch something, or the driver stops with :class:`PolicyError` ("stalled"). A model
    waiting to run is ``PENDING`` or ``PAUSED``; a policy must run both kinds (a ``PAUSED``
    model it did not checkpoint itself comes from a resumed run).

Partitioned data (model hopping; `fleet.schedule.partitions`)
    With ``view.partitions`` set, partition ``k`` lives on its own nodes' GPUs
    (``partitions.of_gpu``). A stream trains its members for one *visit* each: one pass over
    the partition its GPUs are on, all of them on that partition, each a model that has not
    visited it in its current epoch (``ModelView.visited``). At the visit's end the model
    *hops*: it leaves its GPUs through a checkpoint the driver takes by itself
    (:class:`CheckpointCompleted` follows; :class:`EpochCompleted` first, with the model
    already ``CHECKPOINTING``, when the visit was its epoch's last; :class:`ModelConverged`
    instead when the stop rule ends it there). Visits are not preempted: a decision may not
    ``checkpoint``, ``end_round`` or ``join``. Only a policy with ``hops = True`` plans them
    (or, on data partitioned by its groups, one with ``visits_groups = True``: a model of a
    group visits its group's partitions only, ``ClusterView.to_visit``);
    only the checkpoint signal cuts a visit short, and the visit is then trained again from
    its start (the model goes back to the checkpoint of its last hop).

What a policy may know
    The view holds the profiled :class:`~fleet.schedule.rates.RateTable` and, per model, an
    *estimate* of its epochs to converge (``epochs_estimate``: the profile's ``epochs`` or
    the spec's ``max_epochs``). It never sees the true epochs: it learns about convergence
    only through :class:`ModelConverged`. Events carry measured rates, which a policy may
    use to refine its rate table.

Ownership, threads, determinism
    The view and events are frozen snapshots owned by the driver; a policy must not keep
    references that it expects to change. A policy owns its private state (round counter,
    random generator seeded at construction) and is used from one thread. It does no I/O,
    reads no clock and talks to no process: the same events give the same decisions.
"""

from __future__ import annotations

import abc
import enum
from collections.abc import Iterable
from dataclasses import dataclass
from typing import ClassVar, Union

from fleet.schedule.options import NoOptions, PolicyOptions
from fleet.schedule.partitions import Partitions
from fleet.schedule.rates import RateTable


class PolicyError(RuntimeError):
    """A policy broke the protocol (a programming error, not bad user input)."""


class ModelState(enum.Enum):
    """Where a model is in its life; see the module docstring for the transitions."""

    PENDING = "pending"
    RUNNING = "running"
    CHECKPOINTING = "checkpointing"
    PAUSED = "paused"
    HELD = "held"  # at a rung, checkpointed, until promoted or stopped (early stopping)
    CONVERGED = "converged"


WAITING = (ModelState.PENDING, ModelState.PAUSED)
"""The states a model may be launched from: never started, or checkpointed (paused)."""


# --------------------------------------------------------------------------- views


@dataclass(frozen=True)
class ModelView:
    """One model as the driver sees it now.

    Attributes:
        id: model id (as in the rate table).
        state: its :class:`ModelState`.
        epochs_done: completed epochs (a partial epoch is kept across checkpoints).
        epochs_estimate: the estimate of epochs to converge the policy may plan with.
        gpus: GPUs it holds (``RUNNING`` or ``CHECKPOINTING``), else ``()``.
        stream: id of its stream while ``RUNNING``, else ``None``.
        visited: with partitioned data, the partitions visited in its current epoch (sorted).
        next_stop: with early stopping, the epochs at which its training may be cut next (its
            next rung); None: only its own stop rule ends it.
    """

    id: str
    state: ModelState
    epochs_done: int
    epochs_estimate: float
    gpus: tuple[int, ...] = ()
    stream: int | None = None
    visited: tuple[int, ...] = ()
    next_stop: int | None = None


@dataclass(frozen=True)
class StreamView:
    """A running stream.

    Attributes:
        id: stream id, unique over the whole run.
        members: ids of its running members.
        pace: samples per second it currently moves at (0 before it starts).
    """

    id: int
    members: tuple[str, ...]
    pace: float


@dataclass(frozen=True)
class ClusterView:
    """Frozen snapshot of the run handed to every policy call.

    Attributes:
        time: seconds since the start of the run.
        total_gpus: ``M``.
        gpus_per_node: ``gpn``.
        round: index of the current round.
        rates: the profiled rate table.
        models: one view per model, in rate-table order.
        streams: the running streams.
        free_gpus: GPUs no model holds, ascending.
        decode_rate: samples/s the run's preprocessors decode together, where the profile
            measured it; None: decoding is taken to keep up (the paper's assumption).
        partitions: where the partitions of partitioned data live; None: every GPU reads
            the whole data set.
    """

    time: float
    total_gpus: int
    gpus_per_node: int
    round: int
    rates: RateTable
    models: tuple[ModelView, ...]
    streams: tuple[StreamView, ...]
    free_gpus: tuple[int, ...]
    decode_rate: float | None = None
    partitions: Partitions | None = None

    def ids_in(self, *states: ModelState) -> list[str]:
        """Ids of the models in any of ``states``, in rate-table order."""
        return [m.id for m in self.models if m.state in states]

    def waiting(self) -> list[str]:
        """Ids of the models waiting to run (``PENDING`` or ``PAUSED``), in rate-table order."""
        return self.ids_in(*WAITING)

    def model(self, model_id: str) -> ModelView:
        """The view of one model."""
        return self.models[self.rates.index(model_id)]

    def to_visit(self, model_id: str) -> tuple[int, ...]:
        """The partitions a model has left to visit in its current epoch (() without partitions)."""
        if self.partitions is None:
            return ()
        visited = self.model(model_id).visited
        group = self.rates.profile(model_id).extra.get("group")  # `grouping.GROUP_KEY` (grouping imports this module)
        return tuple(k for k in self.partitions.parts_of(group) if k not in visited)

    @property
    def busy_gpus(self) -> int:
        """GPUs held by running or checkpointing models."""
        return self.total_gpus - len(self.free_gpus)

    @property
    def drained(self) -> bool:
        """True when no model holds GPUs."""
        return len(self.free_gpus) == self.total_gpus


# -------------------------------------------------------------------------- events


@dataclass(frozen=True)
class EpochCompleted:
    """A running model finished an epoch (not its last one).

    Attributes:
        model: model id.
        epoch: epochs completed so far.
        time: when, in seconds since the start.
        samples_per_s: the model's own measured training rate on its GPUs (compute only,
            not slowed by waiting for a slower stream member).
        metric: the validation metric the stop rule watches after this epoch, lower is
            better (a loss; an accuracy negated); None where the driver does not report it.
    """

    model: str
    epoch: int
    time: float
    samples_per_s: float
    metric: float | None = None


@dataclass(frozen=True)
class ModelConverged:
    """A model finished its last epoch; its GPUs are free in the accompanying view.

    Attributes:
        model: model id.
        epochs: epochs it trained in all.
        time: when.
        gpus: the GPUs it released.
        samples_per_s: its measured rate during the last epoch.
        stopped: early stopping ended it at a rung (not its own stop rule): its epochs say
            nothing of how many it would have needed.
    """

    model: str
    epochs: int
    time: float
    gpus: tuple[int, ...]
    samples_per_s: float
    stopped: bool = False


@dataclass(frozen=True)
class CheckpointCompleted:
    """A checkpoint finished; the model is ``PAUSED`` and its GPUs are free.

    Attributes:
        model: model id.
        time: when.
        gpus: the GPUs it released.
    """

    model: str
    time: float
    gpus: tuple[int, ...]


@dataclass(frozen=True)
class ModelPromoted:
    """A model held at a rung (early stopping) is promoted: it is ``PAUSED`` and may be
    launched again, from its checkpoint.

    Attributes:
        model: model id.
        time: when.
    """

    model: str
    time: float


Event = Union[EpochCompleted, ModelConverged, CheckpointCompleted, ModelPromoted]


# ----------------------------------------------------------------------- decisions


@dataclass(frozen=True)
class Member:
    """A model and the global GPU indices it trains on; or a *bundle*: several models of one
    architecture trained as one fused model on the same GPUs (`models`, `model` its first).

    Attributes:
        model: the model's id (a bundle's first member).
        gpus: the GPUs it trains on.
        models: a bundle's members, in order; ``()`` for a member of one model.
    """

    model: str
    gpus: tuple[int, ...]
    models: tuple[str, ...] = ()

    @property
    def ids(self) -> tuple[str, ...]:
        """The models this member trains: a bundle's, or its one model."""
        return self.models or (self.model,)


@dataclass(frozen=True)
class StreamPlan:
    """Models to start on one shared stream.

    Attributes:
        members: the models and their GPUs.
        join: ``None`` for a new stream; the id of a running stream to add the members to.
        own_decoding: the stream's one member decodes its data in its own trainer process,
            between its steps, as a per-model training script does, instead of the run's
            preprocessors (a new stream of one member only).
    """

    members: tuple[Member, ...]
    join: int | None = None
    own_decoding: bool = False


@dataclass(frozen=True)
class Decision:
    """What a policy wants done now; see the module docstring for what is allowed.

    Attributes:
        launch: streams to start or join.
        checkpoint: running models to checkpoint and take off their GPUs.
        end_round: checkpoint every running model and end the round.
    """

    launch: tuple[StreamPlan, ...] = ()
    checkpoint: tuple[str, ...] = ()
    end_round: bool = False

    @property
    def is_empty(self) -> bool:
        """True for "do nothing"."""
        return not (self.launch or self.checkpoint or self.end_round)

    @staticmethod
    def launching(streams: Iterable[StreamPlan]) -> Decision:
        """A decision that only launches ``streams`` (empty plans are dropped)."""
        return Decision(launch=tuple(s for s in streams if s.members))


NO_DECISION = Decision()
END_ROUND = Decision(end_round=True)


# -------------------------------------------------------------------------- policy


class Policy(abc.ABC):
    """A planner: answers :meth:`start` and :meth:`on_event` with :class:`Decision`.

    Subclasses set :attr:`name` (the registry key) and implement the two calls. Policies
    that only care about some events may override :meth:`on_epoch`, :meth:`on_converged`
    and :meth:`on_checkpointed` instead of :meth:`on_event`. A policy with options declares
    them as :attr:`Options` (see :mod:`fleet.schedule.options`) and takes an instance as its
    constructor's first argument, with ``seed=`` beside it.
    """

    name: ClassVar[str] = ""
    #: The policy's options: a frozen dataclass whose fields are checked where they are declared.
    Options: ClassVar[type[PolicyOptions]] = NoOptions
    #: False where the runtime's weighing of measured rates (`fleet.schedule.refine`) cannot
    #: change this policy's plans: it never reads the rate values (only the model ids), or it
    #: folds every epoch's measured rate into rates of its own. The runtime then skips it.
    uses_refined_rates: ClassVar[bool] = True
    #: True where the policy launches only onto a drained cluster (no model running or
    #: checkpointing), as FLEET-G's rounds do, and plans there what `start` would plan for the
    #: same view. The runtime then weighs measured rates only at those moments, and only when
    #: they change the plan about to be made.
    plans_only_when_drained: ClassVar[bool] = False
    #: True where the policy plans visits of partitioned data (model hopping); only such a
    #: policy runs on partitioned data, and it also runs on whole data (one partition).
    hops: ClassVar[bool] = False
    #: True where a policy over groups plans visits of data partitioned by its groups (each
    #: model visiting its group's partitions, `Partitions.parts_of`); on whole data it plans
    #: as without partitions (it is no hopping policy there).
    visits_groups: ClassVar[bool] = False
    #: False where the policy's plans never read a rate (only the model ids): profiling
    #: cannot change them, so `scheduler.profile: auto` does not profile for it.
    reads_rates: ClassVar[bool] = True
    #: True where the policy launches streams its member decodes itself
    #: (`StreamPlan.own_decoding`): the runtime's trainers then get ready to decode.
    own_decoding: ClassVar[bool] = False

    @abc.abstractmethod
    def start(self, view: ClusterView) -> Decision:
        """First call of a run: every GPU is free; models are ``PENDING``, or ``PAUSED`` when
        the run resumes from checkpoints."""

    def on_event(self, event: Event, view: ClusterView) -> Decision:
        """Dispatch ``event`` to the matching ``on_*`` hook."""
        if isinstance(event, EpochCompleted):
            return self.on_epoch(event, view)
        if isinstance(event, ModelConverged):
            return self.on_converged(event, view)
        if isinstance(event, CheckpointCompleted):
            return self.on_checkpointed(event, view)
        if isinstance(event, ModelPromoted):
            return self.on_promoted(event, view)
        raise PolicyError(f"unknown event {event!r}")

    def on_epoch(self, event: EpochCompleted, view: ClusterView) -> Decision:
        """A model finished an epoch; default: nothing."""
        return NO_DECISION

    def on_converged(self, event: ModelConverged, view: ClusterView) -> Decision:
        """A model converged; default: nothing."""
        return NO_DECISION

    def on_checkpointed(self, event: CheckpointCompleted, view: ClusterView) -> Decision:
        """A checkpoint completed; default: nothing."""
        return NO_DECISION

    def on_promoted(self, event: ModelPromoted, view: ClusterView) -> Decision:
        """A held model may be launched again; default: as a checkpoint that freed no GPU."""
        return self.on_checkpointed(CheckpointCompleted(event.model, event.time, ()), view)
