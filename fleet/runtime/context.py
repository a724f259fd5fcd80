"""What every rank of a run shares: the spec, its communicators, its place, the data facts."""

from __future__ import annotations

import threading
import time
from dataclasses import dataclass, field
from functools import cached_property
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

import numpy as np

from fleet.inspect import input_shape, num_classes
from fleet.spec import Spec
from preprocess.grouped import group_members, sample_groups, split_members
from preprocess.partition import job_partitions
from preprocess.readers import open_reader
from preprocess.split import split_three
from preprocess.transforms import Pipeline

if TYPE_CHECKING:
    from fleet.runlock import RunLock
    from fleet.runtime.control.setup import RunPlan
    from fleet.runtime.data.layouts import RegroupBox
    from fleet.runtime.data.stream import StreamThread


class GroupSplits:
    """Grouped data (`data.group_by`) on one rank: each group's own split, made once, and its
    validation and test sets, decoded once where first needed (a master keeps the sets of the
    groups its models trained on).

    Args:
        spec: the run's spec (its data section and seed).
        reader: the rank's data set.
        decode: indices -> (samples through the eval transforms, labels).
        count_validation: told how many validation samples each decoding decoded.
    """

    def __init__(self, spec: Spec, reader, decode: Callable[[np.ndarray], tuple[np.ndarray, np.ndarray]],
                 count_validation: Callable[[int], None]):
        self.spec, self.reader, self.decode, self.count_validation = spec, reader, decode, count_validation
        self._splits: dict[str, tuple[np.ndarray, np.ndarray, np.ndarray]] = {}
        self._sets: dict[tuple[str, int], tuple[np.ndarray, np.ndarray]] = {}

    @cached_property
    def members(self) -> dict[str, np.ndarray]:
        """Each group's sample indices, from every sample's key."""
        return group_members(sample_groups(self.reader, self.spec.data))

    def split(self, group: str) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """(train, validation, test) indices of `group`'s samples."""
        if group not in self._splits:
            data = self.spec.data
            members = self.members.get(group, np.empty(0, np.int64))
            self._splits[group] = split_members(self.reader.labels, members, group, data.val_fraction,
                                                data.test_fraction, self.spec.seed)
        return self._splits[group]

    def decoded(self, group: str, part: int) -> tuple[np.ndarray, np.ndarray]:
        """Part `part` (1: validation, 2: test) of `group`'s split, decoded once."""
        if (group, part) not in self._sets:
            indices = self.split(group)[part]
            if part == 1:
                self.count_validation(len(indices))
            self._sets[group, part] = self.decode(indices)
        return self._sets[group, part]


@dataclass
class RunContext:
    """Built once per rank at start-up and passed to every role (no globals).

    Communicators, each a Dup of the world so that threads and purposes never share one:
    `ctrl` (commands and reports), `data_parent` (stream communicators are created from it),
    `group_parent` (trainer groups are created from it).

    The fields after `pool` are set as the job goes, each by the one part named below; a rank
    that never sets one reads its default.

    Attributes:
        rates: the run's rate table (`RateTable`), which the emulated device's steps follow.
        pool: this node's shared-memory chunk pool (`fleet.runtime.data.shm.ChunkPool`), if any.
        process_start: `time.monotonic()` when this process started, before MPI's start-up
            (`train_entry`); rank 0's `run_start` event counts the job's start-up from it.
        checkpoint_signal: set when a checkpoint signal reaches this process
            (`install_checkpoint_signals`, from `train_entry`); the coordinator polls it.
        profile_only: `fleet profile`: measure the rates, train nothing (`_start`).
        processes: ``"host pid"`` of every rank, in rank order (`_start`); rank 0 writes
            them to ranks.json.
        run_lock: rank 0: the run directory's lock, held for the whole job and released
            at its end (`_lock_run_dir`); None on every other rank.
        plan: rank 0: the run's plan (`fleet.runtime.control.setup.RunPlan`), which the
            coordinator runs (`_rank0_setup`); None on every other rank.
        collective: the gradient collective the groups build (`runtime.collective` resolved:
            ``"mpi"``, ``"torch"``, ``"horovod"``), found by a trainer at warm-up and sent to
            rank 0; None where no rank has resolved it.
        epoch_limits: the emulated device's epochs to convergence by model id, from rank 0's
            set-up (empty on a real device: every model runs to its stop rule).
        own_decoding: the run's policy has each member decode its own stream (Baseline):
            every trainer then runs an `OwnDecoder` (from rank 0's set-up).
        exit_code: this rank's exit code: `EXIT_CHECKPOINTED` once the coordinator's
            `Shutdown` says the run stopped on the checkpoint signal (the trainer and
            preprocessor loops set it), else 0.
        val_decoded: validation samples this rank decoded that no `MemberLeft` counted yet
            (`validation` adds them, a group's leave takes them: `take_val_decoded`).
        pending: a trainer's commands from the coordinator that its group's training thread
            took while polling for a `CheckpointModel` (the next `StartMember`, a `Shutdown`),
            for the trainer loop to run in order.
        draining: a trainer's stream threads of groups that left and still drain their
            stream (they take chunks until the regroup that removes them); the trainer loop
            reaps them.
        regroups: the `Regroup` commands that reached this rank, shared by all of its stream
            threads (`fleet.runtime.data.layouts.RegroupBox`); made by the first master stream
            thread (`regroup_box`).
        profile_batches: the profiler's decoded training batch of each batch size, decoded
            once per process (`profiler.measure.profile_batch`).
        across_parts: on data partitioned by its groups, the validation set of each sharded
            group a master validated, decoded once per process (`validation_of`).
    """

    spec: Spec
    world: Any
    ctrl: Any
    data_parent: Any
    group_parent: Any
    topology: Any
    who: Any  # fleet.runtime.waiting.RankIdentity
    device: str
    run_dir: str
    rates: Any = None
    pool: Any = None
    process_start: float = field(default_factory=time.monotonic)
    checkpoint_signal: threading.Event | None = None
    profile_only: bool = False
    calibrate_from: str | None = None  # a run directory whose measured costs the predictions take
    processes: list[str] = field(default_factory=list)
    run_lock: RunLock | None = None
    plan: RunPlan | None = None
    collective: str | None = None
    epoch_limits: dict[str, int] = field(default_factory=dict)
    own_decoding: bool = False
    exit_code: int = 0
    val_decoded: int = 0
    pending: list[Any] = field(default_factory=list)
    draining: list[StreamThread] = field(default_factory=list)
    regroups: RegroupBox | None = None
    profile_batches: dict[int, tuple[np.ndarray, np.ndarray]] = field(default_factory=dict)
    across_parts: dict[str, tuple[np.ndarray, np.ndarray]] = field(default_factory=dict)

    @cached_property
    def rank(self) -> int:
        return self.world.rank

    @property
    def timeout_s(self) -> float:
        return self.spec.runtime.timeout_s

    @cached_property
    def partitions(self):
        """Where the partitions of partitioned data live (a `Partitions`), else None."""
        return job_partitions(self.spec.data, self.spec.cluster.nodes, self.spec.cluster.gpus_per_node)

    @cached_property
    def partition(self) -> int | None:
        """The partition this rank's node holds (partitioned data), else None."""
        return None if self.partitions is None else self.partitions.of_node(self.topology.node_of(self.rank))

    @cached_property
    def reader(self):
        """The data this rank reads: its node's partition, or the whole data set."""
        return self.open_part(self.partition)

    def open_part(self, partition: int | None):
        return open_reader(self.spec.data, seed=self.spec.seed, partition=partition)

    @cached_property
    def split(self) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """(train, validation, test) indices of this rank's data (its node's partition: its own
        split; the test set is empty unless `data.test_fraction` asks for one)."""
        return self.split_of(self.reader)

    def split_of(self, reader) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        data = self.spec.data
        return split_three(reader.labels, data.val_fraction, data.test_fraction, self.spec.seed)

    @cached_property
    def groups(self) -> GroupSplits:
        """Grouped data's splits and sets on this rank (`data.group_by`)."""
        return GroupSplits(self.spec, self.reader, lambda indices: self._decoded(self.reader, indices),
                           self._count_val_decoded)

    def split_for(self, group: str | None) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """(train, validation, test) indices of group `group` (None: of the whole data, `split`)."""
        return self.split if group is None else self.groups.split(group)

    def train_idx_of(self, group: str | None) -> np.ndarray:
        """The training samples of `group` (None: of the whole data): one epoch of its models."""
        return self.split_for(group)[0]

    def epoch_scale(self, model_id: str) -> float:
        """The whole data's epoch over `model_id`'s own (N / n_g): a rate in its samples/s times
        this is the rate in the planners' epoch-equivalent samples/s (1 without groups)."""
        group = self.spec.model(model_id).group
        if group is None:
            return 1.0
        if self.partitions is not None and self.partitions.groups:  # of every part holding the group
            return self.epoch_samples / self.partitions.group_samples(group)
        return self.epoch_samples / len(self.train_idx_of(group))

    @property
    def train_idx(self) -> np.ndarray:
        return self.split[0]

    @property
    def epoch_samples(self) -> int:
        """Training samples of an epoch: of every partition of partitioned data."""
        return len(self.train_idx) if self.partitions is None else int(self.partitions.samples)

    @property
    def part_samples(self) -> int:
        """Training samples of this rank's data: one pass (a visit of its node's partition)."""
        return len(self.train_idx)

    @cached_property
    def num_classes(self) -> int:
        return num_classes(self.spec)

    @cached_property
    def input_shape(self) -> tuple[int, int, int]:
        return input_shape(self.spec)

    @cached_property
    def chunk_samples(self) -> int:
        """Samples per chunk of this run's streams (see `RuntimeSpec.chunk_size`)."""
        c, h, w = self.input_shape
        return self.spec.runtime.chunk_size(4 * c * h * w)

    @cached_property
    def qp_chunks(self) -> int:
        """`runtime.qp_samples` in chunks (at least one): a preprocessor's window of chunks in flight."""
        return max(1, self.spec.runtime.qp_samples // self.chunk_samples)

    @cached_property
    def pipeline(self):
        return Pipeline(self.spec.preprocess, self.spec.data)

    @cached_property
    def validation(self) -> tuple[np.ndarray, np.ndarray]:
        """The validation set, decoded once per process (eval transforms: no augmentation); of
        partitioned data, the validation samples of every partition (read by trainers only),
        or with `data.validation: local` those of this rank's node's partition only."""
        if self.partitions is None or self.spec.data.validation == "local":
            return self._decoded_validation(self.reader)
        parts = []
        for k in range(self.partitions.count):
            with self.open_part(k) as reader:
                parts.append(self._decoded_validation(reader))
        return np.concatenate([x for x, _ in parts]), np.concatenate([y for _, y in parts])

    @cached_property
    def test(self) -> tuple[np.ndarray, np.ndarray] | None:
        """The test set (`data.test_fraction`), decoded once per process with the eval
        transforms, where a master first needs it; None without one. Nothing trains, stops or
        is selected on it (data with a test set is never partitioned)."""
        test_idx = self.split[2]
        if not len(test_idx):
            return None
        return self._decoded(self.reader, test_idx)

    def validation_of(self, group: str | None) -> tuple[np.ndarray, np.ndarray]:
        """The validation set of `group`'s models (`validation` for None), decoded once per
        process where first needed; on data partitioned by its groups, the held-out shares of
        the group on each of its parts (`data.validation: local`: on this rank's part only)."""
        if group is None:
            return self.validation
        parts = () if self.partitions is None or self.spec.data.validation == "local" else \
            self.partitions.parts_of(group)
        if not parts or parts == (self.partition,):
            return self.groups.decoded(group, 1)
        if group not in self.across_parts:
            self.across_parts[group] = validation_over_parts(self, group, parts)
        return self.across_parts[group]

    def test_of(self, group: str | None) -> tuple[np.ndarray, np.ndarray] | None:
        """The test set of `group`'s models (`test` for None); None without one."""
        if group is None:
            return self.test
        return self.groups.decoded(group, 2) if len(self.split_for(group)[2]) else None

    def epoch_scales(self) -> dict[str, float]:
        """Every model's `epoch_scale` with grouped data ({} without)."""
        if self.spec.data.group_by is None:
            return {}
        return {model.id: self.epoch_scale(model.id) for model in self.spec.models}

    def _count_val_decoded(self, count: int) -> None:
        self.val_decoded += count

    def _decoded_validation(self, reader) -> tuple[np.ndarray, np.ndarray]:
        val_idx = self.split_of(reader)[1]
        self.val_decoded += len(val_idx)
        return self._decoded(reader, val_idx)

    def _decoded(self, reader, indices: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """Samples `indices` of `reader` in sorted order, through the eval transforms."""
        raw = reader.read(np.sort(indices))
        return self.pipeline(raw, np.random.default_rng(self.spec.seed), train=False), raw.labels

    def take_val_decoded(self) -> int:
        """The validation samples decoded since the last call (a group's leave reports them)."""
        decoded, self.val_decoded = self.val_decoded, 0
        return decoded


def validation_over_parts(ctx: RunContext, group: str, parts: tuple[int, ...]) -> tuple[np.ndarray, np.ndarray]:
    """The validation set of `group` on data partitioned by its groups: each of its `parts`'
    own held-out share of it (as each part's split makes it), decoded and put together."""
    sets = []
    for k in parts:
        with ctx.open_part(k) as reader:
            own = GroupSplits(ctx.spec, reader, lambda indices: ctx._decoded(reader, indices), ctx._count_val_decoded)
            sets.append(own.decoded(group, 1))
    return np.concatenate([x for x, _ in sets]), np.concatenate([y for _, y in sets])
