"""Learning over groups: a spec's configurations expanded over the groups of its data.

`fleet.spec` sits below `preprocess` and cannot read the data, so a spec with
``data.group_by`` parses into its configurations (models without a group), and `load_run_spec`,
the loader every command that plans, profiles, runs, reports or resumes goes through, reads
the group keys and expands each configuration over the groups: model
``<configuration id>-<id_part(key)>`` trains and validates on that group's samples only
(`ModelSpec.group` holds the raw key). A resolved spec (a run directory's ``spec.yaml``)
already names each model's group and is not expanded again. An adaptive search's entry becomes
one study per group (``<study>-<id_part(key)>``, its budget each): a group's configurations
learn from each other only, as its early stopping compares them with each other only.
"""

from __future__ import annotations

import os
import re
import zlib
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass

import numpy as np

from fleet.errors import UserError
from fleet.spec import DataSpec, ModelSpec, Spec, SpecError, load_spec
from fleet.spec.sections import GroupBy
from fleet.spec.search import MAX_MODELS, model_seed
from preprocess.groups import group_sizes, id_part
from preprocess.readers import open_reader, partition_manifest
from preprocess.split import split_three, train_count

Say = Callable[[str], None]


@dataclass(frozen=True)
class Expansion:
    """A spec expanded over its groups, and the groups it skipped (too small), largest first."""

    spec: Spec
    skipped: tuple[tuple[str, int], ...] = ()

    def skipped_line(self) -> str | None:
        """The one console line naming the skipped groups, or None where none was."""
        if not self.skipped:
            return None
        shown = ", ".join(f"{key} ({size})" for key, size in self.skipped[:20])
        more = f" and {len(self.skipped) - 20} more" if len(self.skipped) > 20 else ""
        limit = self.spec.data.min_group_samples
        return (f"skipped {len(self.skipped)} group(s) under data.min_group_samples ({limit} samples): "
                f"{shown}{more}")


def sample_groups(reader, data: DataSpec) -> np.ndarray:
    """Every sample's group key (a text array in sample order) as `data.group_by` says.

    Raises:
        UserError: the data set has no such group keys.
    """
    if data.group_by == "directory":
        keys = reader.group_keys(None)
    else:
        keys = reader.group_keys(data.group_by.dataset, required=True)  # type: ignore[union-attr]
    return np.asarray(keys, dtype=str)


def read_group_sizes(data: DataSpec, seed: int) -> list[tuple[str, int]]:
    """Each group key of the data set with its sample count, largest first (of data partitioned
    by its groups, from the partition manifest: nothing is read)."""
    if data.partitioned:
        samples = grouped_manifest(data).group_samples()
        return sorted(((key, sum(on.values())) for key, on in samples.items()), key=lambda item: (-item[1], item[0]))
    with open_reader(data, seed=seed) as reader:
        return group_sizes(sample_groups(reader, data).tolist())


def grouped_manifest(data: DataSpec):
    """The partition manifest of `data` (partitioned, with `group_by`), which must have been
    partitioned by the same dataset of group keys.

    Raises:
        UserError: it was partitioned without groups, or by other group keys.
    """
    manifest = partition_manifest(data)
    name = data.group_by.dataset if isinstance(data.group_by, GroupBy) else None
    if manifest.group_by != name:
        how = f"by the group keys {manifest.group_by!r}" if manifest.group_by else "without its groups"
        raise UserError(f"{data.path} was partitioned {how}; partition it with: fleet data partition --group-by "
                        f"{name}")
    return manifest


def group_shard_samples(data: DataSpec) -> dict[str, dict[int, int]]:
    """Each group key's training samples on each part that holds some of it (partitioned
    data): what one visit of that part by a model of the group passes over, the same count
    as the part's own split of the group (`split_members`; partitioned data has no test
    split), read from the parts' labels and group keys."""
    shards: dict[str, dict[int, int]] = {}
    for part in range(grouped_manifest(data).count):
        with open_reader(data, partition=part) as reader:
            labels, members = reader.labels, group_members(sample_groups(reader, data))
        for key, own in members.items():
            shards.setdefault(key, {})[part] = train_count(np.bincount(labels[own]), data.val_fraction)
    return shards


def unique_parts(keys: Sequence[str]) -> dict[str, str]:
    """Each key's id part (`id_part`), made unique in sorted key order: a part already taken
    gets ``-2``, ``-3``, ... (``"A b"`` and ``"a-b"`` become ``a-b`` and ``a-b-2``)."""
    taken: set[str] = set()
    out = {}
    for key in sorted(keys):
        base = part = id_part(key)
        n = 1
        while part in taken:
            n += 1
            part = f"{base}-{n}"
        taken.add(part)
        out[key] = part
    return out


def configuration_ids(groups: Mapping[str, str]) -> dict[str, str]:
    """Each grouped model's configuration id, from each model's id and group key (`groups`:
    id -> key, as results.json's ``groups`` holds them): the id less the ``-<group part>`` that
    `expand_over_groups` appended (and the ``-N`` that made it unique, if any)."""
    parts = unique_parts(sorted(set(groups.values())))
    out = {}
    for model_id, key in groups.items():
        match = re.fullmatch(rf"(.+)-{re.escape(parts[key])}(?:-\d+)?", model_id)
        out[model_id] = match.group(1) if match else model_id
    return out


def _grouped_models(spec: Spec, keys: Sequence[str]) -> tuple[list[ModelSpec], list[int]]:
    """Every configuration of `spec` on every group of `keys` (configuration-major, keys
    sorted), with unique ids, and each model's entry in the written spec."""
    parts = unique_parts(keys)
    models: list[ModelSpec] = []
    entries: list[int] = []
    seen: set[str] = set()
    for index, config in enumerate(spec.models):
        for key in sorted(keys):
            base = model_id = f"{config.id}-{parts[key]}"
            n = 1
            while model_id in seen:  # a configuration id that ends like another's group part
                n += 1
                model_id = f"{base}-{n}"
            seen.add(model_id)
            update = {"id": model_id, "group": key, "seed": model_seed(spec.seed, model_id)}
            if config.search is not None:  # one study per group: its configurations learn from each other only
                update["search"] = config.search.model_copy(update={"study": f"{config.search.study}-{parts[key]}"})
            models.append(config.model_copy(update=update))
            entries.append(spec.entries[index] if index < len(spec.entries) else index)
    return models, entries


def expand_over_groups(spec: Spec, sizes: Sequence[tuple[str, int]]) -> Expansion:
    """`spec`'s configurations over the groups of `sizes` (key, samples) that hold at least
    `data.min_group_samples`.

    Raises:
        SpecError: no group is large enough, or groups x configurations exceed `MAX_MODELS`.
    """
    limit = spec.data.min_group_samples
    kept = [key for key, size in sizes if size >= limit]
    skipped = tuple((key, size) for key, size in sizes if size < limit)
    if not kept:
        largest = max((size for _, size in sizes), default=0)
        raise SpecError(f"data.min_group_samples: every group has fewer than {limit} samples (the largest "
                        f"{largest}, of {len(sizes)} group(s)); lower it or group the data otherwise")
    count = len(kept) * len(spec.models)
    if count > MAX_MODELS:
        raise SpecError(f"data.group_by: {len(spec.models)} configuration(s) x {len(kept):,} group(s) = {count:,} "
                        f"models (at most {MAX_MODELS:,})")
    models, entries = _grouped_models(spec, kept)
    _check_group_studies(models, entries)
    return Expansion(spec.model_copy(update={"models": tuple(models), "entries": tuple(entries)}), skipped)


def _check_group_studies(models: Sequence[ModelSpec], entries: Sequence[int]) -> None:
    """Two searches' studies of a group must not take one name (entry ``s`` over group ``x``
    and an entry named ``s-x``, over any group of the same part)."""
    owners: dict[str, int] = {}
    for model, entry in zip(models, entries):
        if model.search is None:
            continue
        study = model.search.study
        if owners.setdefault(study, entry) != entry:
            raise SpecError(f"models[{entry}].name: its study of a group and one of models[{owners[study]}] would "
                            f"both be {study!r}; rename one entry")


def needs_expansion(spec: Spec) -> bool:
    """Whether `spec` has groups and its models do not name theirs yet (the spec checks that
    either all or none do)."""
    return spec.data.group_by is not None and all(model.group is None for model in spec.models)


def expanded(spec: Spec, say: Say | None = None) -> Spec:
    """`spec` expanded over the groups of its data (read here), or `spec` itself where it has
    no groups or is expanded already; `say` gets the line naming skipped groups."""
    if not needs_expansion(spec):
        return spec
    try:
        sizes = read_group_sizes(spec.data, spec.seed)
    except UserError as exc:
        raise UserError(f"data.group_by: {exc}") from None
    expansion = expand_over_groups(spec, sizes)
    line = expansion.skipped_line()
    if say is not None and line is not None:
        say(line)
    return expansion.spec


def load_run_spec(path: str | os.PathLike, *, run_dir: str | None = None, check_paths: bool = True,
                  say: Say | None = None) -> Spec:
    """`fleet.spec.load_spec`, with the configurations expanded over the data's groups
    (`expanded`): the spec every command that plans, profiles, runs, reports or resumes takes."""
    return expanded(load_spec(path, run_dir=run_dir, check_paths=check_paths), say)


def group_split_seed(seed: int, key: str) -> int:
    """The seed of group `key`'s split: the spec's seed and the key (not its place among the
    groups, which skipping small groups would move)."""
    return zlib.crc32(f"{seed}:{key}".encode()) & 0x7FFFFFFF


def group_members(groups: np.ndarray) -> dict[str, np.ndarray]:
    """Each group key's sample indices (sorted), from every sample's key, in one pass."""
    keys, inverse = np.unique(np.asarray(groups), return_inverse=True)
    order = np.argsort(inverse, kind="stable")
    bounds = np.cumsum(np.bincount(inverse, minlength=len(keys)))[:-1]
    return {str(key): members for key, members in zip(keys, np.split(order, bounds))}


def split_members(labels: np.ndarray, members: np.ndarray, key: str, val_fraction: float, test_fraction: float,
                  seed: int) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """(train, validation, test) data-set indices of group `key`, whose samples are `members`:
    `split_three` of the group's labels alone, stratified by label within the group."""
    if not len(members):
        raise UserError(f"data.group_by: no sample of group {key!r} (has the data set changed since the run began?)")
    train, val, test = split_three(np.asarray(labels)[members], val_fraction, test_fraction,
                                   group_split_seed(seed, key))
    return members[train], members[val], members[test]


def group_split(labels: np.ndarray, groups: np.ndarray, key: str, val_fraction: float, test_fraction: float,
                seed: int) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """`split_members` of group `key` of `groups` (every sample's key)."""
    members = np.flatnonzero(np.asarray(groups) == key)
    return split_members(labels, members, key, val_fraction, test_fraction, seed)


def epoch_scales(spec: Spec) -> dict[str, float]:
    """Each model's whole-data epoch over its group's (N / n_g, training samples), read from
    the data (partitioned: N of every part, n_g of the group's parts); {} without `data.group_by`. A planner's rates times it are epoch-equivalent."""
    if spec.data.group_by is None:
        return {}
    data = spec.data
    if data.partitioned:
        whole = sum(train_count(counts, data.val_fraction) for counts in partition_manifest(data).class_counts)
        shards = group_shard_samples(data)
        return {model.id: whole / sum(shards[model.group].values()) for model in spec.models}
    with open_reader(data, seed=spec.seed) as reader:
        labels, members = reader.labels, group_members(sample_groups(reader, data))
    whole = len(split_three(labels, data.val_fraction, data.test_fraction, spec.seed)[0])
    sizes = {}
    for key in {model.group for model in spec.models}:
        train = split_members(labels, members.get(key, np.empty(0, np.int64)), key, data.val_fraction,
                              data.test_fraction, spec.seed)[0]
        sizes[key] = len(train)
    return {model.id: whole / sizes[model.group] for model in spec.models}
