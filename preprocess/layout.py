"""The on-disk layout of a partitioned data set, as `fleet data partition` writes it.

``DIR/part-000.h5 ... DIR/part-(N-1).h5`` (each an HDF5 shard, see `readers/hdf5.py`) plus
``DIR/partitions.json``: ``{"count", "sizes", "class_counts", "classes", "seed", "image_shape",
"source"}``, and for a data set partitioned by its groups (``--group-by NAME``) ``"group_by"``
(the dataset of group keys each part keeps) and ``"groups"``: each group key's parts with its
samples on each, ``{"g000": [[0, 812], [1, 188]], "g001": [[1, 240]], ...}`` (a group kept
whole has one part; a sharded one, consecutive parts), so that a spec and a planner know
where each group lives without reading the data.
"""

from __future__ import annotations

import json
from dataclasses import asdict, dataclass
from pathlib import Path

from fleet.errors import UserError

MANIFEST_NAME = "partitions.json"


def part_name(k: int) -> str:
    """The file name of partition `k`."""
    return f"part-{k:03d}.h5"


@dataclass(frozen=True)
class PartitionManifest:
    """What `partitions.json` records about the parts of one data set."""

    count: int
    sizes: list[int]
    class_counts: list[list[int]]
    classes: int
    seed: int
    image_shape: list[int]
    source: str
    group_by: str | None = None
    groups: dict[str, list[list[int]]] | None = None

    def group_parts(self) -> dict[str, tuple[int, ...]]:
        """Each group key's parts, in order ({} for data not partitioned by its groups)."""
        return {key: tuple(part for part, _ in shards) for key, shards in (self.groups or {}).items()}

    def group_samples(self) -> dict[str, dict[int, int]]:
        """Each group key's samples on each of its parts ({} for data not partitioned by its groups)."""
        return {key: {part: count for part, count in shards} for key, shards in (self.groups or {}).items()}

    def to_json(self) -> str:
        """One key a line, lists kept on their line."""
        fields = [f"  {json.dumps(key)}: {json.dumps(value)}" for key, value in asdict(self).items()
                  if value is not None or key not in ("group_by", "groups")]
        return "{\n" + ",\n".join(fields) + "\n}"


def is_partitioned(path: str | Path) -> bool:
    """True when `path` is a directory holding a partition manifest."""
    return (Path(path) / MANIFEST_NAME).is_file()


def read_manifest(directory: str | Path) -> PartitionManifest:
    """Load and check ``directory/partitions.json``.

    Raises:
        UserError: the directory or manifest is missing or malformed, or a part file is missing.
    """
    path = Path(directory) / MANIFEST_NAME
    if not Path(directory).is_dir():
        raise UserError(f"{directory}: no such directory (a partitioned data set is a directory)")
    try:
        manifest = PartitionManifest(**json.loads(path.read_text()))
    except FileNotFoundError:
        raise UserError(f"{path}: no such file (make one with: fleet data partition)") from None
    except (ValueError, TypeError) as exc:
        raise UserError(f"{path}: malformed partition manifest ({exc.__class__.__name__})") from None
    if manifest.count < 1 or len(manifest.sizes) != manifest.count:
        raise UserError(f"{path}: malformed partition manifest (count {manifest.count}, {len(manifest.sizes)} sizes)")
    _check_groups(manifest, path)
    for k in range(manifest.count):
        if not (Path(directory) / part_name(k)).is_file():
            raise UserError(f"{Path(directory) / part_name(k)}: partition file is missing")
    return manifest


def _check_groups(manifest: PartitionManifest, path: Path) -> None:
    """Group shards on parts that exist, with samples, and a dataset naming the keys.

    Raises:
        UserError: the manifest's groups are malformed.
    """
    if manifest.groups is None:
        return
    try:
        shards = [(int(part), int(count)) for entries in manifest.groups.values() for part, count in entries]
    except (AttributeError, TypeError, ValueError):
        raise UserError(f"{path}: malformed partition manifest (groups: expected [[part, samples], ...] per "
                        "group)") from None
    if not manifest.group_by or any(not 0 <= part < manifest.count or count < 1 for part, count in shards):
        raise UserError(f"{path}: malformed partition manifest (groups: a part out of 0..{manifest.count - 1}, "
                        "an empty shard or no group_by)")
