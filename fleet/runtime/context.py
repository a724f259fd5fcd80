"""What every rank of a run shares: the spec, its communicators, its place, the data facts."""

from __future__ import annotations

from dataclasses import dataclass, field
from functools import cached_property
from typing import Any

import numpy as np

from fleet.inspect import input_shape, num_classes
from fleet.spec import Spec
from preprocess.partition import job_partitions
from preprocess.readers import open_reader
from preprocess.split import split_indices
from preprocess.transforms import Pipeline


@dataclass
class RunContext:
    """Built once per rank at start-up and passed to every role (no globals).

    Communicators, each a Dup of the world so that threads and purposes never share one:
    `ctrl` (commands and reports), `data_parent` (stream communicators are created from it),
    `group_parent` (trainer groups are created from it).
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
    rates: Any = None  # RateTable, needed by the emulated device
    pool: Any = None  # this node's shared-memory chunk pool (fleet.runtime.data.shm.ChunkPool), if any
    extras: dict = field(default_factory=dict)

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
    def split(self) -> tuple[np.ndarray, np.ndarray]:
        """(train, validation) indices of this rank's data (its node's partition: its own split)."""
        return self.split_of(self.reader)

    def split_of(self, reader) -> tuple[np.ndarray, np.ndarray]:
        return split_indices(reader.labels, self.spec.data.val_fraction, self.spec.seed)

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

    def _decoded_validation(self, reader) -> tuple[np.ndarray, np.ndarray]:
        val_idx = np.sort(self.split_of(reader)[1])
        raw = reader.read(val_idx)
        x = self.pipeline(raw, np.random.default_rng(self.spec.seed), train=False)
        self.extras["val_decoded"] = self.extras.get("val_decoded", 0) + len(val_idx)
        return x, raw.labels
