"""`fleet predict RUN_DIR --data PATH [--out FILE] [--model ID | --group KEY]`: a run's ensemble
(or one of its models; with groups, one group's ensemble) applied to new data; each sample's
class probabilities and uncertainty to a file."""

from __future__ import annotations

import argparse
from pathlib import Path

import numpy as np

from fleet.commands._run_dir import run_spec
from fleet.report.greedy_ensemble import accuracy, mixture, uncertainty
from fleet.report.prediction_file import check_output, write_prediction_file
from fleet.runtime.train.inference import chosen_models, data_of, load_members, predicted_blocks


def add_parser(subparsers) -> argparse.ArgumentParser:
    parser = subparsers.add_parser(
        "predict",
        help="apply a run's ensemble (or one model) to new data: class probabilities and uncertainty",
        description="Apply the ensemble `fleet ensemble` chose (RUN_DIR/ensemble.json), or one model with --model, "
        "to the data set at PATH (an image folder, or an HDF5 file or folder of shards, read as the run's spec "
        "reads its data and preprocessed as its validation set is: no augmentation). Each model is loaded from its "
        "best epoch's checkpoint (predictions/<model>/), checksummed and never unpickled. Writes each sample's "
        "class probabilities (the members' weighted mean), its predictive entropy, mutual information and the "
        "members' disagreement to FILE: .npz (plain arrays) or .csv.",
    )
    parser.add_argument("run_dir", help="the run directory (runs/NAME)")
    parser.add_argument("--data", required=True, metavar="PATH", help="the data set to predict")
    parser.add_argument("--source", choices=("imagefolder", "hdf5"),
                        help="how to read PATH (default: a file or a folder of .h5 files is hdf5, a folder imagefolder)")
    parser.add_argument("--out", metavar="FILE", help="where to write them: .npz or .csv (default RUN_DIR/predict.npz)")
    parser.add_argument("--model", metavar="ID", help="apply this model alone instead of the ensemble")
    parser.add_argument("--group", metavar="KEY", help="with data.group_by: apply this group's ensemble (its raw key; "
                        "ensemble.json holds one per group)")
    parser.add_argument("--device", default="cpu", help="where the models run: cpu (default), cuda or cuda:<i>")
    parser.set_defaults(func=run)
    return parser


def run(args: argparse.Namespace) -> int:
    run_dir = Path(args.run_dir)
    spec = run_spec(run_dir)
    out = check_output(args.out or run_dir / "predict.npz")
    weights = chosen_models(run_dir, args.model, args.group)
    data = data_of(spec, args.data, args.source)
    members = load_members(spec, run_dir, weights, args.device)
    blocks = list(predicted_blocks(spec, data, members))
    stack = np.concatenate([b[0] for b in blocks], axis=1)
    labels = np.concatenate([b[1] for b in blocks])
    names = [name for b in blocks for name in b[2]]
    w = np.array([m.weight for m in members])
    probabilities, spread = mixture(stack, w), uncertainty(stack, w)
    write_prediction_file(out, probabilities, spread, labels, names, weights)
    which = ", ".join(f"{m.model} {m.weight:.2f}" for m in members)
    print(f"fleet: predict: {len(labels)} samples of {args.data} by {len(members)} model(s) ({which}): accuracy "
          f"{accuracy(probabilities, labels):.4f} against its labels, mean entropy {spread.entropy.mean():.4f}, "
          f"mean disagreement {spread.disagreement.mean():.4f}; written to {out}")
    return 0
