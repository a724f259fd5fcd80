"""`fleet data partition`: split an HDF5 data set into N per-node partitions (model hopping).

Writes ``DIR/part-000.h5 ... DIR/part-(N-1).h5`` and ``DIR/partitions.json`` (see `layout.py`).
Every sample lands in exactly one part; each class is dealt evenly across the parts (counts
differ by at most one), so parts hold the same class mix and sizes within one sample.

With ``--group-by NAME`` (learning over groups, issue 47) the parts follow the groups of the
dataset NAME instead: the constrained wrap-around (Kingpin; `fleet.schedule.grouping.place_groups`)
puts each group whose samples fit one part's share (all samples over the parts) whole on the
least filled part, and splits a larger group over consecutive parts, each shard holding the
group's classes in proportion. Each part keeps its samples' group keys (dataset NAME), and the
manifest says where each group lives (`PartitionManifest.groups`).
"""

from __future__ import annotations

import os
from pathlib import Path

import numpy as np

from fleet.errors import UserError
from fleet.schedule.partitions import PartitionError, Partitions
from fleet.spec.sections import DataSpec
from fleet.schedule.grouping import shard_counts
from preprocess.grouped import group_members, group_shard_samples
from preprocess.groups import GROUPS_DATASET
from preprocess.h5write import ShardWriter
from preprocess.layout import MANIFEST_NAME, PartitionManifest, part_name
from preprocess.output import progress_bar, staged_output
from preprocess.readers import partition_manifest
from preprocess.readers.hdf5 import HDF5Reader, shard_files
from preprocess.seeding import rng_for
from preprocess.split import train_count

_PARTITION_TAG = 0x9A27
BATCH = 1024


def assign_parts(labels: np.ndarray, parts: int, seed: int) -> list[np.ndarray]:
    """Deal sample indices to `parts` parts, stratified by label and shuffled by `seed`.

    Returns:
        One sorted int64 index array per part; together they cover every index once.
    """
    labels = np.asarray(labels, dtype=np.int64)
    rng = rng_for(seed, _PARTITION_TAG)
    dealt = np.concatenate([rng.permutation(np.flatnonzero(labels == c)) for c in np.unique(labels)])
    owner = np.empty(len(labels), dtype=np.int64)
    owner[dealt] = np.arange(len(dealt)) % parts
    return [np.flatnonzero(owner == k) for k in range(parts)]


def stratified_order(labels: np.ndarray, rng: np.random.Generator) -> np.ndarray:
    """Positions of `labels` in an order that spreads each class evenly along it (shuffled
    within each class), so that any run of it holds the classes in proportion."""
    labels = np.asarray(labels, dtype=np.int64)
    place = np.empty(len(labels))
    for c in np.unique(labels):
        members = rng.permutation(np.flatnonzero(labels == c))
        place[members] = (np.arange(len(members)) + rng.random()) / len(members)
    return np.argsort(place, kind="stable")


def assign_group_parts(labels: np.ndarray, keys: np.ndarray, parts: int,
                       seed: int) -> tuple[list[np.ndarray], dict[str, list[list[int]]]]:
    """Deal sample indices to `parts` parts by their group keys (`keys`: one per sample),
    groups kept whole where they fit a part's share and sharded over consecutive parts where
    not (`shard_counts`, groups in sorted key order), each shard stratified by label.

    Returns:
        One sorted int64 index array per part (together every index once), and each group key's
        ``[part, samples]`` shards (`PartitionManifest.groups`).
    """
    members = group_members(keys)
    ordered = sorted(members)
    rng = rng_for(seed, _PARTITION_TAG)
    owner = np.empty(len(keys), dtype=np.int64)
    groups = {}
    for key, shards in zip(ordered, shard_counts([len(members[key]) for key in ordered], parts)):
        own = members[key][stratified_order(np.asarray(labels)[members[key]], rng)]
        bounds = np.cumsum([count for _, count in shards])[:-1]
        for (part, _), piece in zip(shards, np.split(own, bounds)):
            owner[piece] = part
        groups[key] = [[part, count] for part, count in shards]
    return [np.flatnonzero(owner == k) for k in range(parts)], groups


def check_parts(parts: int, samples: int) -> None:
    """Between 1 and `samples` parts, else a `UserError` about ``--parts``."""
    if parts < 1 or parts > samples:
        raise UserError(f"--parts: {parts} parts for {samples} samples (expected 1..{samples})")


def _write_part(reader: HDF5Reader, indices: np.ndarray, path: Path, attrs: dict, bar,
                keys: tuple[str, np.ndarray] | None = None) -> None:
    """Write the samples `indices` of `reader` to part file `path` (with `keys`, the dataset
    name and every sample's group key (UTF-8 bytes), its samples' keys too)."""
    names, width = reader.class_names, None
    if keys is not None:
        width = max(1, max((len(key) for key in keys[1][indices]), default=1))
    with ShardWriter([path], [len(indices)], reader.image_shape, reader.num_classes, names, attrs,
                     group_width=width, group_name=keys[0] if keys is not None else GROUPS_DATASET) as writer:
        for start in range(0, len(indices), BATCH):
            at = indices[start : start + BATCH]
            raw = reader.read(at)
            writer.append(raw.items, raw.labels, None if keys is None else keys[1][at])
            bar.update(len(raw))


def partition_dataset(
    src: str | os.PathLike,
    parts: int,
    out: str | os.PathLike,
    seed: int = 0,
    progress: bool = True,
    force: bool = False,
    group_by: str | None = None,
) -> PartitionManifest:
    """Split the HDF5 data set `src` (a file or a directory of shards) into `parts` parts.

    Args:
        src: the data set to split.
        parts: number of partitions (1..number of samples).
        out: the directory to write.
        seed: the seed of the stratified assignment.
        progress: show a progress bar on stderr (on a terminal).
        force: replace an existing, non-empty `out`.
        group_by: the dataset of group keys to partition by (see the module), or None.

    Returns:
        The manifest written to ``out/partitions.json``.

    Raises:
        UserError: a missing or malformed `src`, a bad `parts`, an existing `out`.
    """
    reader = HDF5Reader(shard_files(src), where=str(src))
    check_parts(parts, len(reader))
    keys = None
    if group_by is None:
        assigned, groups = assign_parts(reader.labels, parts, seed), None
    else:
        text = np.asarray(reader.group_keys(group_by, required=True), dtype=str)
        assigned, groups = assign_group_parts(reader.labels, text, parts, seed)
        keys = (group_by, np.array([key.encode() for key in text.tolist()], dtype=object))
    manifest = PartitionManifest(
        count=parts,
        sizes=[len(a) for a in assigned],
        class_counts=[np.bincount(reader.labels[a], minlength=reader.num_classes).tolist() for a in assigned],
        classes=reader.num_classes,
        seed=seed,
        image_shape=list(reader.image_shape),
        source=str(Path(src).resolve()),
        group_by=group_by,
        groups=groups,
    )
    with reader, staged_output(out, force, inputs=[Path(src)]) as staging:
        with progress_bar(len(reader), "partition", progress) as bar:
            for k, indices in enumerate(assigned):
                attrs = {"partition": k, "partitions": parts, "seed": seed}
                _write_part(reader, indices, staging / part_name(k), attrs, bar, keys)
        (staging / MANIFEST_NAME).write_text(manifest.to_json() + "\n")
    return manifest


def job_partitions(data: DataSpec, nodes: int, gpus_per_node: int) -> Partitions | None:
    """Where the partitions of `data` live on a job of `nodes` nodes, with each partition's
    training samples (from its manifest's class counts and `data.val_fraction`) and, with
    `data.group_by`, each group's on each of its parts (`group_shard_samples`); None for whole
    data.

    Raises:
        UserError: the manifest is missing or malformed, or its partitions do not fit the nodes.
    """
    if not data.partitioned:
        return None
    manifest = partition_manifest(data)
    sizes = tuple(float(train_count(counts, data.val_fraction)) for counts in manifest.class_counts)
    shards = group_shard_samples(data) if data.group_by is not None else {}
    groups = tuple((key, tuple((part, float(n)) for part, n in sorted(on.items()))) for key, on in sorted(shards.items()))
    try:
        return Partitions(sizes, gpus_per_node, nodes, groups)
    except PartitionError as exc:
        raise UserError(f"data.path: {data.path} holds {manifest.count} partitions for a job of {nodes} nodes: "
                        f"{exc}") from None
