"""Data partitioned across nodes (model hopping, Cerebro's MOP): which GPUs see which partition.

A data set written by ``fleet data partition`` has ``p`` partitions; a job of ``N`` nodes
keeps partition ``k`` on the ``N / p`` consecutive nodes ``k * N / p ... (k + 1) * N / p - 1``
(a node group), and its samples never leave them. A model trains a *visit* (a sub-epoch: one
pass over one partition) on GPUs of that partition's nodes, then *hops*: its checkpoint goes
to the next partition's nodes through the run directory. It has trained an epoch when it has
visited every partition once.

Learning over groups on partitioned data (issue 47; ``fleet data partition --group-by``) places
each group on the parts by the constrained wrap-around: a small group lies whole on one part,
a large one is sharded over consecutive parts. A model of a group visits only its group's
parts (`Partitions.parts_of`), each visit a pass over the group's shard there
(`Partitions.visit_samples`), and has trained an epoch when it has visited each of them once;
a model of a group kept whole visits its one part every epoch.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from functools import cached_property


class PartitionError(ValueError):
    """The partitions do not fit the job (the message is one line for the user)."""


def nodes_per_partition(partitions: int, nodes: int) -> int:
    """How many nodes hold each partition.

    Raises:
        PartitionError: `nodes` is not a multiple of `partitions` (or either is below 1).
    """
    if partitions < 1 or nodes < 1:
        raise PartitionError(f"{partitions} partitions on {nodes} nodes: both must be at least 1")
    if nodes % partitions:
        fits = ", ".join(str(d) for d in range(1, nodes + 1) if nodes % d == 0)
        raise PartitionError(
            f"{partitions} partitions do not fit {nodes} nodes: each partition needs the same number of "
            f"whole nodes (partitions that fit {nodes} nodes: {fits}; make them with: "
            f"fleet data partition --parts N)"
        )
    return nodes // partitions


@dataclass(frozen=True)
class Partitions:
    """The partitions of one job and where they live.

    Attributes:
        sizes: training samples of each partition (a visit passes over them once).
        gpus_per_node: GPUs of each node.
        nodes: nodes of the job (a multiple of the partition count).
        groups: with learning over groups, each group key with its shards: ``(partition,
            training samples)`` on each part that holds some of it (consecutive parts); a
            model of a group not listed (or of no group) visits every partition.
    """

    sizes: tuple[float, ...]
    gpus_per_node: int
    nodes: int
    groups: tuple[tuple[str, tuple[tuple[int, float], ...]], ...] = ()

    def __post_init__(self) -> None:
        if not self.sizes or any(not s > 0 for s in self.sizes):
            raise PartitionError(f"every partition needs training samples, got sizes {list(self.sizes)}")
        if self.gpus_per_node < 1:
            raise PartitionError(f"gpus_per_node must be at least 1, got {self.gpus_per_node}")
        nodes_per_partition(len(self.sizes), self.nodes)
        for key, shards in self.groups:
            if not shards or any(not 0 <= k < len(self.sizes) or not n > 0 for k, n in shards):
                raise PartitionError(f"group {key!r}: shards {list(shards)} on partitions 0..{len(self.sizes) - 1} "
                                     "(each with training samples)")

    @cached_property
    def _shards(self) -> dict[str, tuple[tuple[int, float], ...]]:
        return dict(self.groups)

    def parts_of(self, group: str | None) -> tuple[int, ...]:
        """The partitions a model of `group` visits each epoch (every one for None or a group
        not listed), ascending."""
        shards = self._shards.get(group)
        return tuple(range(self.count)) if shards is None else tuple(sorted(k for k, _ in shards))

    def pass_samples(self, group: str | None, partition: int) -> float:
        """Training samples one visit of `partition` by a model of `group` passes over: the
        partition's (of no group), or the group's there."""
        shards = self._shards.get(group)
        return self.sizes[partition] if shards is None else dict(shards)[partition]

    def group_samples(self, group: str | None) -> float:
        """Training samples of `group` over all its partitions (an epoch's, of no group)."""
        shards = self._shards.get(group)
        return self.samples if shards is None else float(sum(n for _, n in shards))

    def visit_samples(self, group: str | None, partition: int) -> float:
        """Epoch-equivalent samples of one visit of `partition` by a model of `group`: the
        partition's training samples (of no group); a group's share of its epoch held there,
        times an epoch's samples (a grouped model's rates are epoch-equivalent)."""
        if group not in self._shards:
            return self.sizes[partition]
        return self.samples * self.pass_samples(group, partition) / self.group_samples(group)

    @classmethod
    def even(cls, count: int, samples: float, total_gpus: int, gpus_per_node: int) -> "Partitions":
        """`count` partitions of equal size splitting `samples` on a job of `total_gpus`."""
        return cls((samples / count,) * count, gpus_per_node, math.ceil(total_gpus / gpus_per_node))

    @property
    def count(self) -> int:
        return len(self.sizes)

    @property
    def samples(self) -> float:
        """Training samples of an epoch (every partition once)."""
        return float(sum(self.sizes))

    def share(self, partitions) -> float:
        """The fraction of an epoch's samples that `partitions` (some of them) hold."""
        return sum(self.sizes[k] for k in partitions) / self.samples

    @property
    def nodes_each(self) -> int:
        """Nodes holding one partition."""
        return self.nodes // self.count

    def of_node(self, node: int) -> int:
        """The partition node `node` holds."""
        return node // self.nodes_each

    def of_gpu(self, gpu: int) -> int:
        """The partition GPU `gpu` (a global index) can read."""
        return self.of_node(gpu // self.gpus_per_node)

    def gpus(self, partition: int, total_gpus: int) -> range:
        """The global GPU indices on `partition`'s nodes, of a job with `total_gpus`."""
        per = self.nodes_each * self.gpus_per_node
        return range(partition * per, min((partition + 1) * per, total_gpus))
