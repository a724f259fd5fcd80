"""`fleet data partition`: split an HDF5 data set into N per-node partitions (model hopping).

Writes ``DIR/part-000.h5 ... DIR/part-(N-1).h5`` and ``DIR/partitions.json`` (see `layout.py`).
Every sample lands in exactly one part; each class is dealt evenly across the parts (counts
differ by at most one), so parts hold the same class mix and sizes within one sample.
"""

from __future__ import annotations

import os
from pathlib import Path

import numpy as np

from fleet.errors import UserError
from fleet.schedule.partitions import PartitionError, Partitions
from fleet.spec.sections import DataSpec
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


def check_parts(parts: int, samples: int) -> None:
    """Between 1 and `samples` parts, else a `UserError` about ``--parts``."""
    if parts < 1 or parts > samples:
        raise UserError(f"--parts: {parts} parts for {samples} samples (expected 1..{samples})")


def _write_part(reader: HDF5Reader, indices: np.ndarray, path: Path, attrs: dict, bar) -> None:
    names = reader.class_names
    with ShardWriter([path], [len(indices)], reader.image_shape, reader.num_classes, names, attrs) as writer:
        for start in range(0, len(indices), BATCH):
            raw = reader.read(indices[start : start + BATCH])
            writer.append(raw.items, raw.labels)
            bar.update(len(raw))


def partition_dataset(
    src: str | os.PathLike,
    parts: int,
    out: str | os.PathLike,
    seed: int = 0,
    progress: bool = True,
    force: bool = False,
) -> PartitionManifest:
    """Split the HDF5 data set `src` (a file or a directory of shards) into `parts` parts.

    Args:
        src: the data set to split.
        parts: number of partitions (1..number of samples).
        out: the directory to write.
        seed: the seed of the stratified assignment.
        progress: show a progress bar on stderr (on a terminal).
        force: replace an existing, non-empty `out`.

    Returns:
        The manifest written to ``out/partitions.json``.

    Raises:
        UserError: a missing or malformed `src`, a bad `parts`, an existing `out`.
    """
    reader = HDF5Reader(shard_files(src), where=str(src))
    check_parts(parts, len(reader))
    assigned = assign_parts(reader.labels, parts, seed)
    manifest = PartitionManifest(
        count=parts,
        sizes=[len(a) for a in assigned],
        class_counts=[np.bincount(reader.labels[a], minlength=reader.num_classes).tolist() for a in assigned],
        classes=reader.num_classes,
        seed=seed,
        image_shape=list(reader.image_shape),
        source=str(Path(src).resolve()),
    )
    with reader, staged_output(out, force, inputs=[Path(src)]) as staging:
        with progress_bar(len(reader), "partition", progress) as bar:
            for k, indices in enumerate(assigned):
                attrs = {"partition": k, "partitions": parts, "seed": seed}
                _write_part(reader, indices, staging / part_name(k), attrs, bar)
        (staging / MANIFEST_NAME).write_text(manifest.to_json() + "\n")
    return manifest


def job_partitions(data: DataSpec, nodes: int, gpus_per_node: int) -> Partitions | None:
    """Where the partitions of `data` live on a job of `nodes` nodes, with each partition's
    training samples (from its manifest's class counts and `data.val_fraction`); None for
    whole data.

    Raises:
        UserError: the manifest is missing or malformed, or its partitions do not fit the nodes.
    """
    if not data.partitioned:
        return None
    manifest = partition_manifest(data)
    sizes = tuple(float(train_count(counts, data.val_fraction)) for counts in manifest.class_counts)
    try:
        return Partitions(sizes, gpus_per_node, nodes)
    except PartitionError as exc:
        raise UserError(f"data.path: {data.path} holds {manifest.count} partitions for a job of {nodes} nodes: "
                        f"{exc}") from None
