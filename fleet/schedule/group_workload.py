"""Simulated learning over groups (issue 47): a workload's models as configurations, trained
on each of G groups of Zipf-skewed sizes.

`grouped_scenario` makes the simulator's run of C configurations (the first C models of a
built-in workload) over G groups: model ``<config>-g<k>`` trains configuration ``c`` on group
``k``, its rates epoch-equivalent (times N / n_k, `fleet.schedule.grouping.with_groups`), its
epochs the configuration's. Decoding is priced as a grouped run pays it: each node's
preprocessors decode `decode_per_node` samples/s (a stream shares them with the others), and
a model that decodes its own data (`model-task`) does so at `own_decode` samples/s between its
steps. `grouped_bound` is the run's lower bound (`group_bound`). `on_parts` puts a grouped
scenario on data partitioned by its groups (small groups whole on one part, large ones sharded).
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass, replace

from fleet.schedule.grouping import epoch_scale_of, group_bound, group_of, shard_counts, with_groups, zipf_sizes
from fleet.schedule.partitions import nodes_per_partition
from fleet.schedule.rates import ModelProfile, RateTable
from fleet.schedule.scenario import Cluster, Scenario
from fleet.schedule.workloads import Workload


@dataclass(frozen=True)
class GroupedRun:
    """What a grouped scenario is made of.

    Attributes:
        groups: the groups' sample counts, largest first.
        configurations: the configurations' ids (the workload's first models).
        decode_per_node: samples/s one node's preprocessors decode (None: free).
        own_decode: samples/s a trainer decodes its own data (None: free).
    """

    groups: tuple[int, ...]
    configurations: tuple[str, ...]
    decode_per_node: float | None = None
    own_decode: float | None = None


def group_table(workload: Workload, sizes: Sequence[int], configurations: int) -> tuple[RateTable, tuple[int, ...]]:
    """The rate table of `configurations` x groups of `sizes` (epoch-equivalent, each model
    told its group), and each model's true epochs."""
    table, total = workload.rates, sum(sizes)
    if not 1 <= configurations <= len(table.models):
        raise ValueError(f"configurations must be 1..{len(table.models)}")
    width = max(3, len(str(len(sizes) - 1)))
    profiles, epochs, scales, groups = [], [], {}, {}
    for k, size in enumerate(sizes):
        for c in range(configurations):
            base = table.models[c]
            model_id = f"{base.id}-g{k:0{width}d}"
            profiles.append(ModelProfile(model_id, base.rates, base.epochs, base.param_bytes))
            epochs.append(workload.true_epochs[c])
            scales[model_id], groups[model_id] = total / size, f"g{k:0{width}d}"
    grouped = with_groups(RateTable(tuple(profiles), table.gpus_per_node, total), scales, groups)
    return grouped, tuple(epochs)


def grouped_scenario(workload: Workload, groups: int, skew: float, gpus: int, configurations: int = 4,
                     decode_per_node: float | None = None, own_decode: float | None = None) -> Scenario:
    """The simulator's run of `configurations` x `groups` groups (Zipf `skew`) of the
    workload's epoch on `gpus` GPUs (see the module)."""
    sizes = zipf_sizes(workload.rates.samples_per_epoch, groups, skew)
    table, epochs = group_table(workload, sizes, configurations)
    cluster = Cluster(gpus, table.gpus_per_node)
    decode = None if decode_per_node is None else decode_per_node * cluster.nodes
    return Scenario(table, epochs, tuple(float(e) for e in epochs), cluster, decode_rate=decode,
                    own_decode_rate=own_decode)


def on_parts(scenario: Scenario, parts: int) -> Scenario:
    """`scenario` (a grouped one: each model's group in its rates' ``extra``) on data
    partitioned by its groups onto `parts` parts, as ``fleet data partition --group-by`` places
    them (`shard_counts` of the groups' samples, N / epoch scale each): each group's models
    visit its group's parts.

    Raises:
        PartitionError: the cluster's nodes are not a multiple of `parts`.
    """
    nodes_per_partition(parts, scenario.cluster.nodes)
    sizes: dict[str, int] = {}
    for profile in scenario.rates.models:
        sizes[group_of(scenario.rates, profile.id)] = round(scenario.rates.samples_per_epoch / epoch_scale_of(profile))
    keys = sorted(sizes)
    shards = shard_counts([sizes[key] for key in keys], parts)
    held = [0.0] * parts
    for group in shards:
        for part, samples in group:
            held[part] += samples
    scale = scenario.rates.samples_per_epoch / sum(held)
    groups = tuple((key, tuple((part, float(n)) for part, n in group)) for key, group in zip(keys, shards))
    return replace(scenario, partition_sizes=tuple(h * scale for h in held), partition_groups=groups)


def grouped_bound(scenario: Scenario) -> float:
    """`group_bound` of a grouped scenario: its total one-GPU work over its GPUs, or its longest
    model at its fastest GPU count (up to the job's GPUs)."""
    rates, gpus = scenario.rates, scenario.cluster.total_gpus
    n, gpn = rates.samples_per_epoch, rates.gpus_per_node
    works = [e * n / p.rate(1, gpn) for p, e in zip(rates.models, scenario.true_epochs)]
    longest = max(e * n / max(p.rate(m, gpn) for m in range(1, gpus + 1))
                  for p, e in zip(rates.models, scenario.true_epochs))
    return group_bound(works, gpus, longest) if works else 0.0


def node_count(gpus: int, gpus_per_node: int) -> int:
    """Nodes of `gpus` GPUs."""
    return math.ceil(gpus / gpus_per_node)
