"""The synthetic classes are learnable: a linear model on pipeline output beats chance by far."""

import numpy as np
from sklearn.linear_model import LogisticRegression

from fleet.spec.sections import DataSpec, DecodeOp, FlipOp, NormalizeOp, RandomCropOp, ResizeOp
from preprocess.make import make_synthetic
from preprocess.readers import open_reader
from preprocess.split import split_indices
from preprocess.transforms import Pipeline

CLASSES = 10


def features(reader, pipeline, indices, train):
    raw = reader.read(indices)
    return pipeline(raw, np.random.default_rng(0), train).reshape(len(indices), -1), raw.labels


def test_logistic_regression_on_augmented_jpegs_beats_chance(tmp_path):
    root = make_synthetic(tmp_path / "set", "jpeg", classes=CLASSES, samples=1200, image_size=20, progress=False)
    data = DataSpec(source="imagefolder", path=str(root), image_size=16, val_fraction=0.25)
    ops = [DecodeOp(), ResizeOp(size=18), RandomCropOp(size=16), FlipOp(), NormalizeOp(mean=(0.5,), std=(0.25,))]
    reader, pipeline = open_reader(data), Pipeline(ops, data)
    train_idx, val_idx = split_indices(reader.labels, data.val_fraction, seed=0)
    x_train, y_train = features(reader, pipeline, train_idx, train=True)
    x_val, y_val = features(reader, pipeline, val_idx, train=False)
    model = LogisticRegression(C=0.05, max_iter=300).fit(x_train, y_train)
    accuracy = model.score(x_val, y_val)
    assert accuracy > 0.4, accuracy  # chance is 0.1


def test_synthetic_source_is_learnable_in_grey():
    data = DataSpec(source="synthetic", samples=1000, image_size=16, channels=1)
    reader, pipeline = open_reader(data, seed=5), Pipeline([], data)
    train_idx, val_idx = split_indices(reader.labels, 0.25, seed=0)
    x_train, y_train = features(reader, pipeline, train_idx, train=True)
    x_val, y_val = features(reader, pipeline, val_idx, train=False)
    accuracy = LogisticRegression(C=0.05, max_iter=300).fit(x_train, y_train).score(x_val, y_val)
    assert accuracy > 0.25, accuracy
