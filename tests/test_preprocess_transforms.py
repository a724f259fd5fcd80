"""The pipeline: shapes, dtypes, value ranges, augmentation only in training, determinism, errors."""

import io

import numpy as np
import pytest
from PIL import Image

from fleet.errors import UserError
from fleet.spec import parse_spec
from fleet.spec.sections import (
    CenterCropOp,
    DataSpec,
    DecodeOp,
    FlipOp,
    NormalizeOp,
    RandomCropOp,
    ResizeOp,
)
from preprocess.readers import RawBatch
from preprocess.transforms import Pipeline, resample_matrix, resize_batch
from preprocess.transforms import decode_image

RGB32 = DataSpec(source="synthetic", image_size=32, channels=3)


def encode(image: np.ndarray, fmt: str = "JPEG") -> bytes:
    buffer = io.BytesIO()
    Image.fromarray(image[..., 0] if image.shape[2] == 1 else image).save(buffer, fmt)
    return buffer.getvalue()


def random_images(n, h, w, c=3, seed=0):
    return np.random.default_rng(seed).integers(0, 256, (n, h, w, c), dtype=np.uint8)


def array_batch(images):
    return RawBatch(items=images, labels=np.zeros(len(images), np.int64), names=[f"a[{i}]" for i in range(len(images))])


def file_batch(blobs):
    names = [f"/d/c/{i}.jpg" for i in range(len(blobs))]
    return RawBatch(items=blobs, labels=np.zeros(len(blobs), np.int64), names=names)


def rng(seed=0):
    return np.random.default_rng(seed)


AUGMENT = [ResizeOp(size=36), RandomCropOp(size=32, padding=2), FlipOp(p=0.5), NormalizeOp(mean=(0.5,), std=(0.25,))]


def test_output_is_float32_nchw_contiguous_and_scaled():
    images = random_images(5, 32, 32)
    out = Pipeline([], RGB32)(array_batch(images), rng(), train=True)
    assert out.dtype == np.float32 and out.shape == (5, 3, 32, 32) and out.flags.c_contiguous
    np.testing.assert_allclose(out, images.transpose(0, 3, 1, 2) / 255.0, atol=1e-6)
    assert Pipeline([], RGB32).output_shape == (3, 32, 32)


def test_normalize_per_channel():
    images = np.full((2, 4, 4, 3), 255, np.uint8)
    images[..., 1] = 0
    ops = [NormalizeOp(mean=(0.5, 0.5, 0.0), std=(0.5, 0.25, 2.0))]
    out = Pipeline(ops, DataSpec(source="synthetic", image_size=4))(array_batch(images), rng(), train=False)
    np.testing.assert_allclose(out[:, 0], 1.0)
    np.testing.assert_allclose(out[:, 1], -2.0)
    np.testing.assert_allclose(out[:, 2], 0.5)


def test_augmentation_only_in_training_and_deterministic():
    images = random_images(16, 32, 32)
    pipeline = Pipeline(AUGMENT, RGB32)
    eval_a = pipeline(array_batch(images), rng(1), train=False)
    eval_b = pipeline(array_batch(images), rng(2), train=False)
    np.testing.assert_array_equal(eval_a, eval_b)  # no randomness in evaluation
    train_a = pipeline(array_batch(images), rng(1), train=True)
    train_b = pipeline(array_batch(images), rng(1), train=True)
    train_c = pipeline(array_batch(images), rng(2), train=True)
    np.testing.assert_array_equal(train_a, train_b)
    assert not np.array_equal(train_a, train_c)
    assert not np.array_equal(train_a, eval_a)


def test_flip_mirrors_and_eval_does_not():
    images = random_images(3, 8, 8)
    data = DataSpec(source="synthetic", image_size=8)
    flipped = Pipeline([FlipOp(p=1.0)], data)(array_batch(images), rng(), train=True)
    np.testing.assert_allclose(flipped, images[:, :, ::-1].transpose(0, 3, 1, 2) / 255.0, atol=1e-6)
    kept = Pipeline([FlipOp(p=1.0)], data)(array_batch(images), rng(), train=False)
    np.testing.assert_allclose(kept, images.transpose(0, 3, 1, 2) / 255.0, atol=1e-6)


def test_random_crop_pads_with_zeros_and_eval_center_crops():
    images = np.full((64, 4, 4, 1), 255, np.uint8)
    data = DataSpec(source="synthetic", image_size=4, channels=1)
    train = Pipeline([RandomCropOp(padding=2)], data)(array_batch(images), rng(), train=True)
    assert train.min() == 0.0 and train.max() == 1.0  # some crops include the zero border
    assert len({arr.tobytes() for arr in train}) > 1  # offsets differ per sample
    evaluated = Pipeline([RandomCropOp(padding=2)], data)(array_batch(images), rng(), train=False)
    assert evaluated.min() == 1.0


def test_center_crop_takes_the_middle():
    images = np.zeros((1, 6, 6, 1), np.uint8)
    images[0, 1:5, 1:5] = 200
    out = Pipeline([CenterCropOp()], DataSpec(source="synthetic", image_size=4, channels=1))(
        array_batch(images), rng(), train=False
    )
    np.testing.assert_allclose(out, 200 / 255.0, atol=1e-6)


def test_decode_resize_jpeg_and_png_of_various_sizes():
    blobs = [encode(random_images(1, 40, 30)[0]), encode(random_images(1, 20, 50, seed=1)[0], "PNG")]
    out = Pipeline([DecodeOp(), ResizeOp(), FlipOp()], RGB32)(file_batch(blobs), rng(), train=True)
    assert out.shape == (2, 3, 32, 32) and 0.0 <= out.min() and out.max() <= 1.0


def test_vectorised_resize_matches_pil():
    images = random_images(4, 24, 20)
    for size in ((12, 10), (32, 30), (7, 23)):
        vectorised = resize_batch(images.transpose(0, 3, 1, 2), size).transpose(0, 2, 3, 1)
        with_pil = np.stack([np.asarray(Image.fromarray(i).resize(size[::-1], Image.BILINEAR)) for i in images])
        assert np.abs(vectorised - with_pil).max() <= 2.0, size
    np.testing.assert_allclose(resample_matrix(10, 4).sum(axis=1), 1.0, rtol=1e-6)


def test_array_and_file_paths_agree():
    images = random_images(3, 20, 20)
    blobs = [encode(i, "PNG") for i in images]  # lossless: the same pixels
    ops = [DecodeOp(), ResizeOp(size=16), CenterCropOp(size=12)]
    data = DataSpec(source="synthetic", image_size=12)
    from_arrays = Pipeline(ops, data)(array_batch(images), rng(), train=False)
    from_files = Pipeline(ops, data)(file_batch(blobs), rng(), train=False)
    np.testing.assert_allclose(from_arrays, from_files, atol=1e-6)


def test_channel_conversion():
    grey = random_images(2, 8, 8, c=1)
    rgb_out = Pipeline([], DataSpec(source="synthetic", image_size=8, channels=3))(array_batch(grey), rng(), False)
    assert rgb_out.shape == (2, 3, 8, 8)
    np.testing.assert_array_equal(rgb_out[:, 0], rgb_out[:, 2])
    colour = random_images(2, 8, 8)
    grey_data = DataSpec(source="synthetic", image_size=8, channels=1)
    from_array = Pipeline([], grey_data)(array_batch(colour), rng(), False)
    from_file = Pipeline([DecodeOp()], grey_data)(file_batch([encode(c, "PNG") for c in colour]), rng(), False)
    assert from_array.shape == from_file.shape == (2, 1, 8, 8)
    np.testing.assert_allclose(from_array, from_file, atol=1.5 / 255)


def test_preallocated_output_and_empty_batch():
    pipeline = Pipeline(AUGMENT, RGB32)
    buffer = np.zeros((4, 3, 32, 32), np.float32)
    result = pipeline(array_batch(random_images(4, 32, 32)), rng(), True, out=buffer)
    assert result is buffer and buffer.any()
    empty = pipeline(array_batch(np.zeros((0, 32, 32, 3), np.uint8)), rng(), True)
    assert empty.shape == (0, 3, 32, 32)


def test_quickstart_pipeline_from_a_spec():
    doc = {
        "name": "q",
        "data": {"source": "synthetic", "image_size": 16},
        "preprocess": ["decode", {"resize": {"size": 18}}, {"random_crop": {"size": 16}}, "flip", "normalize"],
        "models": [{"family": "mlp"}],
    }
    spec = parse_spec(doc, check_paths=False)
    images = random_images(3, 20, 20)
    for train in (True, False):
        assert Pipeline(spec.preprocess, spec.data)(array_batch(images), rng(), train).shape == (3, 3, 16, 16)


# ----------------------------------------------------------------------------- errors


def test_wrong_final_size_names_the_item():
    blob = encode(random_images(1, 200, 300)[0])
    with pytest.raises(UserError) as exc:
        Pipeline([DecodeOp()], RGB32)(file_batch([blob]), rng(), train=False)
    message = str(exc.value)
    assert message == "/d/c/0.jpg: image is 200x300 after preprocessing, expected 32x32 (add a resize op)"


def test_corrupt_jpeg_names_the_file():
    good = encode(random_images(1, 32, 32)[0])
    for bad in (good[: len(good) // 2], b"not an image at all"):
        with pytest.raises(UserError) as exc:
            Pipeline([DecodeOp()], RGB32)(file_batch([good, bad]), rng(), train=False)
        message = str(exc.value)
        assert message.startswith("/d/c/1.jpg: cannot decode image") and "\n" not in message


def test_encoded_items_need_a_decode_op():
    with pytest.raises(UserError, match="the first op must be decode"):
        Pipeline([ResizeOp()], RGB32)(file_batch([encode(random_images(1, 8, 8)[0])]), rng(), train=False)


def test_crops_larger_than_the_image():
    images = random_images(2, 8, 8)
    data = DataSpec(source="synthetic", image_size=10)
    with pytest.raises(UserError, match=r"a\[0\]: image is 8x8, smaller than the center_crop size 10x10"):
        Pipeline([CenterCropOp()], data)(array_batch(images), rng(), train=False)
    with pytest.raises(UserError, match="smaller than the random_crop size 10x10"):
        Pipeline([RandomCropOp()], data)(array_batch(images), rng(), train=True)
    padded = Pipeline([RandomCropOp(padding=1)], data)
    assert padded(array_batch(images), rng(), train=True).shape == (2, 3, 10, 10)
    assert padded(array_batch(images), rng(), train=False).shape == (2, 3, 10, 10)


def test_jpeg_draft_decodes_at_a_reduced_scale_but_not_below_the_target():

    blob = encode(random_images(1, 256, 200)[0])
    drafted = decode_image(blob, "big.jpg", 3, draft=(32, 32))
    assert drafted.shape == (32, 25, 3) or (32 <= drafted.shape[0] < 256 and 32 <= drafted.shape[1] < 200)
    assert decode_image(blob, "big.jpg", 3, draft=None).shape == (256, 200, 3)
