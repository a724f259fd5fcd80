"""`fleet data`: make, convert, partition and describe data sets.

    fleet data make synthetic --format jpeg|hdf5 --out DIR [--classes 10] [--samples 2000]
                              [--image-size 32] [--channels 3] [--seed 0] [--shards 1]
    fleet data convert --in DIR --out PATH --image-size S [--shards N] [--channels 3]
    fleet data partition --in PATH --parts N --out DIR [--seed 0] [--group-by DATASET]
    fleet data info PATH_OR_SPEC [--check]

Every writing command builds its output beside the destination and moves it into place;
an existing, non-empty destination needs ``--force``.
"""

from __future__ import annotations

import argparse
from typing import Any, Callable

from fleet.errors import UserError
from preprocess.check import CheckProgress, check_samples, judge_for
from preprocess.convert import convert_folder
from preprocess.info import describe, group_lines, open_any
from preprocess.make import make_synthetic
from preprocess.partition import partition_dataset
from preprocess.readers import class_notices

SUB_COMMANDS = ("make", "convert", "partition", "info")


def image_size(text: str) -> int | tuple[int, int]:
    """``32`` or ``32x24`` (height x width) -> 32 or (32, 24)."""
    parts = text.lower().split("x")
    try:
        values = [int(p) for p in parts]
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a size such as 32 or 32x24, got {text!r}") from None
    if len(values) not in (1, 2) or min(values) < 1:
        raise argparse.ArgumentTypeError(f"expected a size such as 32 or 32x24, got {text!r}")
    return values[0] if len(values) == 1 else (values[0], values[1])


def _writer_flags(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--force", action="store_true", help="replace an existing, non-empty --out")
    parser.add_argument("--quiet", action="store_true", help="no progress bar")


def _add_make(sub: Any) -> None:
    p = sub.add_parser("make", help="write a synthetic data set (JPEG folder or HDF5 shards)")
    p.add_argument("kind", choices=["synthetic"], help="what to make")
    p.add_argument("--format", required=True, choices=["jpeg", "hdf5"], dest="fmt")
    p.add_argument("--out", required=True, help="directory to write (hdf5: or a single .h5 file)")
    p.add_argument("--classes", type=int, default=10, help="number of classes (default 10)")
    p.add_argument("--samples", type=int, default=2000, help="number of images (default 2000)")
    p.add_argument("--image-size", type=image_size, default=32, help="side, or HxW (default 32)")
    p.add_argument("--channels", type=int, choices=[1, 3], default=3, help="3 RGB or 1 grey (default 3)")
    p.add_argument("--seed", type=int, default=0, help="generator seed (default 0)")
    p.add_argument("--shards", type=int, default=1, help="HDF5 shards, hdf5 only (default 1)")
    p.add_argument("--groups", type=int, help="hdf5 only: this many groups, each sample's key in dataset 'groups'")
    p.add_argument("--group-skew", type=float, default=1.0,
                   help="Zipf exponent of the group sizes (default 1.0; 0: equal groups)")
    _writer_flags(p)
    p.set_defaults(data_func=_make)


def _add_convert(sub: Any) -> None:
    p = sub.add_parser("convert", help="image folder -> HDF5 shards of fixed-size images")
    p.add_argument("--in", required=True, dest="src", help="image folder: one folder per class")
    p.add_argument("--out", required=True, help="a .h5 file, or a directory for shard-XXX.h5 files")
    p.add_argument("--image-size", required=True, type=image_size, help="side, or HxW")
    p.add_argument("--shards", type=int, default=1, help="number of shards (default 1)")
    p.add_argument("--channels", type=int, choices=[1, 3], default=3, help="3 RGB or 1 grey (default 3)")
    _writer_flags(p)
    p.set_defaults(data_func=_convert)


def _add_partition(sub: Any) -> None:
    p = sub.add_parser("partition", help="split an HDF5 data set into per-node partitions")
    p.add_argument("--in", required=True, dest="src", help="an HDF5 file or a directory of shards")
    p.add_argument("--parts", required=True, type=int, help="number of partitions")
    p.add_argument("--out", required=True, help="directory for part-XXX.h5 and partitions.json")
    p.add_argument("--seed", type=int, default=0, help="seed of the stratified assignment (default 0)")
    p.add_argument("--group-by", metavar="DATASET",
                   help="partition by the groups of this HDF5 dataset of group keys (learning over groups): "
                        "small groups whole on one part, a group larger than a part's share split over "
                        "consecutive parts")
    _writer_flags(p)
    p.set_defaults(data_func=_partition)


def _add_info(sub: Any) -> None:
    p = sub.add_parser("info", help="samples per class, image shape and source type of a data set")
    p.add_argument("path_or_spec", metavar="PATH_OR_SPEC", help="a data set path, or a spec .yaml")
    p.add_argument("--check", action="store_true",
                   help="read and decode every sample (a spec: through its preprocess ops) and name the bad "
                        "ones; exit 2 if there are any")
    p.add_argument("--group-by", metavar="DATASET",
                   help="list the groups of this HDF5 dataset of group keys and their sizes (default: the "
                        "dataset 'groups', where there is one)")
    p.set_defaults(data_func=_info)


def add_parser(subparsers: Any) -> argparse.ArgumentParser:
    """Register ``fleet data`` and its sub-commands."""
    parser = subparsers.add_parser("data", help="make, convert, partition and describe data sets")
    sub = parser.add_subparsers(dest="data_command", metavar="SUBCOMMAND")
    for add in (_add_make, _add_convert, _add_partition, _add_info):
        add(sub)
    parser.set_defaults(func=run, data_func=None)
    return parser


def _make(args: argparse.Namespace) -> int:
    out = make_synthetic(
        args.out, args.fmt, classes=args.classes, samples=args.samples, image_size=args.image_size,
        channels=args.channels, seed=args.seed, shards=args.shards, progress=not args.quiet, force=args.force,
        groups=args.groups, group_skew=args.group_skew,
    )
    grouped = f", {args.groups} groups (skew {args.group_skew:g})" if args.groups else ""
    print(f"wrote {args.samples} synthetic images ({args.classes} classes{grouped}, {args.fmt}) to {out}")
    return 0


def _convert(args: argparse.Namespace) -> int:
    out = convert_folder(
        args.src, args.out, args.image_size, shards=args.shards, channels=args.channels,
        progress=not args.quiet, force=args.force,
    )
    print(f"converted {args.src} to {out}")
    return 0


def _partition(args: argparse.Namespace) -> int:
    manifest = partition_dataset(
        args.src, args.parts, args.out, seed=args.seed, progress=not args.quiet, force=args.force,
        group_by=args.group_by,
    )
    sizes = ", ".join(str(s) for s in manifest.sizes)
    print(f"wrote {manifest.count} partitions to {args.out} (samples per part: {sizes})")
    sharded = {key: parts for key, parts in manifest.group_parts().items() if len(parts) > 1}
    if manifest.groups is not None:
        split = "; ".join(f"{key} over parts {', '.join(map(str, parts))}" for key, parts in sorted(sharded.items()))
        print(f"{len(manifest.groups)} groups, {len(sharded)} split over several parts{': ' + split if split else ''}")
    return 0


def _info(args: argparse.Namespace) -> int:
    reader, manifest = open_any(args.path_or_spec)
    with reader:
        groups = group_lines(reader, args.group_by, manifest)  # a missing dataset: the one-line error before anything
        print("\n".join([describe(reader, args.path_or_spec, manifest, lenient=args.check), *groups]), flush=True)
        for notice in class_notices(reader):
            print(f"fleet: {notice}", flush=True)
        return _check(reader, args.path_or_spec) if args.check else 0


def _check(reader: Any, path_or_spec: str) -> int:
    """`fleet data info --check`: every bad sample on a line of its own, then a summary; 2 if any."""
    progress = CheckProgress(len(reader))
    try:
        result = check_samples(reader, judge_for(path_or_spec), progress)
    finally:
        progress.close()
    for line in result.bad:
        print(line)
    print(f"fleet: {result.summary()}")
    return UserError.exit_code if result.bad else 0


def run(args: argparse.Namespace) -> int:
    """Run the chosen ``fleet data`` sub-command."""
    handler: Callable[[argparse.Namespace], int] | None = args.data_func
    if handler is None:
        raise UserError(f"choose a sub-command: {', '.join(SUB_COMMANDS)} (see fleet data --help)")
    return handler(args)
