"""Readers: each source on a tiny generated data set, `open_reader`, and every error path."""

import os
import pickle

import h5py
import numpy as np
import pytest
from PIL import Image

from fleet.errors import UserError
from fleet.spec.sections import DataSpec
from preprocess.generator import SyntheticRecipe, draw_sample
from preprocess.make import make_synthetic
from preprocess.partition import partition_dataset
from preprocess.readers import class_notices, open_reader, partition_count
from preprocess.readers.hdf5 import HDF5Reader


def one_line(exc: pytest.ExceptionInfo) -> str:
    message = str(exc.value)
    assert "\n" not in message
    return message


@pytest.fixture(scope="module")
def jpeg_dir(tmp_path_factory):
    out = tmp_path_factory.mktemp("jpeg") / "set"
    return make_synthetic(out, "jpeg", classes=3, samples=30, image_size=12, progress=False)


@pytest.fixture(scope="module")
def h5_dir(tmp_path_factory):
    out = tmp_path_factory.mktemp("h5") / "set"
    return make_synthetic(out, "hdf5", classes=4, samples=40, image_size=(8, 6), shards=3, progress=False)


def write_h5(path, images, labels, **attrs):
    with h5py.File(path, "w") as f:
        if images is not None:
            f["images"] = images
        if labels is not None:
            f["labels"] = labels
        f.attrs.update(attrs)
    return path


def good_images(n=6):
    return np.zeros((n, 4, 4, 3), np.uint8)


# ----------------------------------------------------------------------------- imagefolder


def test_imagefolder_reads_encoded_bytes_sorted_by_folder(jpeg_dir):
    reader = open_reader(DataSpec(source="imagefolder", path=str(jpeg_dir)))
    assert reader.encoded and reader.source == "imagefolder"
    assert len(reader) == 30 and reader.num_classes == 3
    assert reader.class_names == ["000.class0", "001.class1", "002.class2"]
    assert reader.labels.dtype == np.int64 and np.bincount(reader.labels).tolist() == [10, 10, 10]
    batch = reader.read(np.array([29, 0, 29]))
    assert isinstance(batch.items[0], bytes) and batch.items[0][:2] == b"\xff\xd8"
    assert batch.items[0] == batch.items[2]
    assert batch.labels.tolist() == [2, 0, 2]
    assert batch.names[1].endswith("000.class0/000000.jpg")


def test_imagefolder_missing_dir(tmp_path):
    with pytest.raises(UserError) as exc:
        open_reader(DataSpec(source="imagefolder", path=str(tmp_path / "nope")))
    assert one_line(exc) == f"{tmp_path / 'nope'}: no such directory"


def test_imagefolder_empty_class_folder(tmp_path):
    for name in ("a", "b"):
        (tmp_path / name).mkdir()
    Image.new("RGB", (4, 4)).save(tmp_path / "a" / "x.png")
    (tmp_path / "b" / "notes.txt").write_text("not an image")
    with pytest.raises(UserError) as exc:
        open_reader(DataSpec(source="imagefolder", path=str(tmp_path)))
    assert one_line(exc).startswith(f"{tmp_path / 'b'}: empty class folder")


def test_imagefolder_needs_two_classes(tmp_path):
    (tmp_path / "only").mkdir()
    Image.new("RGB", (4, 4)).save(tmp_path / "only" / "x.jpg")
    with pytest.raises(UserError) as exc:
        open_reader(DataSpec(source="imagefolder", path=str(tmp_path)))
    assert "holds 1 class folders; a classifier needs at least 2" in one_line(exc)


def test_imagefolder_declared_classes_must_match(jpeg_dir):
    with pytest.raises(UserError) as exc:
        open_reader(DataSpec(source="imagefolder", path=str(jpeg_dir), classes=5))
    assert one_line(exc) == f"data.classes: 5 declared, but {jpeg_dir} holds 3 class folders"


# ----------------------------------------------------------------------------- hdf5


def test_hdf5_shards_read_in_any_order(h5_dir):
    reader = open_reader(DataSpec(source="hdf5", path=str(h5_dir)))
    assert len(reader.paths) == 3 and len(reader) == 40 and reader.num_classes == 4
    assert reader.image_shape == (8, 6, 3) and not reader.encoded
    indices = np.array([39, 0, 14, 14, 27, 1])
    batch = reader.read(indices)
    assert batch.items.dtype == np.uint8 and batch.items.shape == (6, 8, 6, 3)
    assert batch.labels.tolist() == (indices % 4).tolist()
    recipe = SyntheticRecipe(4, (8, 6), 3, 0)
    for row, index in enumerate(indices):
        np.testing.assert_array_equal(batch.items[row], draw_sample(recipe, int(index)))
    assert batch.names[0].endswith("shard-002.h5[12]")


def test_hdf5_sparse_read_matches_dense(tmp_path):
    images = np.arange(200 * 2 * 2 * 1, dtype=np.uint32).reshape(200, 2, 2, 1).astype(np.uint8)
    path = write_h5(tmp_path / "d.h5", images, np.arange(200) % 2)
    reader = HDF5Reader([path])
    for indices in (np.array([3, 190, 7]), np.arange(50, 60)[::-1]):
        np.testing.assert_array_equal(reader.read(indices).items, images[indices])


def test_hdf5_reader_pickles_and_reopens(h5_dir):
    reader = open_reader(DataSpec(source="hdf5", path=str(h5_dir)))
    first = reader.read(np.array([5])).items
    clone = pickle.loads(pickle.dumps(reader))
    np.testing.assert_array_equal(clone.read(np.array([5])).items, first)
    reader.close()
    reader.close()
    np.testing.assert_array_equal(reader.read(np.array([5])).items, first)  # reopens


@pytest.mark.skipif(not hasattr(os, "fork"), reason="needs fork")
def test_hdf5_reader_reopens_after_fork(h5_dir):
    reader = open_reader(DataSpec(source="hdf5", path=str(h5_dir)))
    expected = reader.read(np.arange(40)).items.sum()
    read_fd, write_fd = os.pipe()
    pid = os.fork()
    if pid == 0:  # child: must not use the parent's handles
        try:
            ok = reader.read(np.arange(40)).items.sum() == expected
        except BaseException:
            ok = False
        os.write(write_fd, b"1" if ok else b"0")
        os._exit(0)
    os.waitpid(pid, 0)
    assert os.read(read_fd, 1) == b"1"
    assert reader.read(np.arange(40)).items.sum() == expected


@pytest.mark.parametrize(
    "images, labels, problem",
    [
        (good_images().astype(np.float32), np.zeros(6, np.int64), "dataset 'images' has dtype float32, expected uint8"),
        (np.zeros((6, 4, 4), np.uint8), np.zeros(6, np.int64), "dataset 'images' has shape (6, 4, 4), expected N x H"),
        (np.zeros((6, 4, 4, 2), np.uint8), np.zeros(6, np.int64), "dataset 'images' has shape (6, 4, 4, 2)"),
        (good_images(), np.zeros(6, np.float64), "dataset 'labels' has dtype float64, expected int64"),
        (good_images(), np.zeros(5, np.int64), "dataset 'labels' has shape (5,), expected (6,)"),
        (None, np.zeros(6, np.int64), "missing dataset 'images'"),
        (good_images(), None, "missing dataset 'labels'"),
    ],
)
def test_hdf5_layout_errors_name_the_file(tmp_path, images, labels, problem):
    path = write_h5(tmp_path / "bad.h5", images, labels)
    with pytest.raises(UserError) as exc:
        open_reader(DataSpec(source="hdf5", path=str(path)))
    assert one_line(exc).startswith(f"{path}: {problem}")


def test_hdf5_labels_out_of_range(tmp_path):
    path = write_h5(tmp_path / "l.h5", good_images(), np.array([0, 1, 2, 1, 5, 0]), classes=3)
    with pytest.raises(UserError) as exc:
        open_reader(DataSpec(source="hdf5", path=str(path)))
    assert one_line(exc) == f"{path}: label 5 at index 4 is out of range (classes 0..2)"
    negative = write_h5(tmp_path / "n.h5", good_images(), np.array([0, 1, -1, 1, 0, 0]))
    with pytest.raises(UserError, match="label -1 at index 2 is out of range"):
        open_reader(DataSpec(source="hdf5", path=str(negative)))


def test_hdf5_declared_classes(tmp_path):
    path = write_h5(tmp_path / "c.h5", good_images(), np.array([0, 1, 2, 1, 2, 0]))
    assert open_reader(DataSpec(source="hdf5", path=str(path), classes=3)).num_classes == 3
    with pytest.raises(UserError) as exc:
        open_reader(DataSpec(source="hdf5", path=str(path), classes=10))
    assert one_line(exc) == f"data.classes: 10 declared, but {path} holds 3 classes"


def test_hdf5_classes_inferred_from_the_labels_are_said_and_a_sparse_set_warned(tmp_path):
    """Labels 0..9 and 1000 without a `classes` attribute: 1001 classes, said, and warned."""
    path = write_h5(tmp_path / "x.h5", good_images(11), np.array([*range(10), 1000]))
    note = f"note: {path}: 1001 classes inferred from the labels (0..1000); set data.classes to say so"
    warning = (f"warning: {path}: only 11 of 1001 classes have samples; every model gets 1001 outputs "
               "(are the labels numbered 0..10?)")
    inferred = open_reader(DataSpec(source="hdf5", path=str(path)))
    assert inferred.num_classes == 1001 and inferred.classes_inferred
    assert class_notices(inferred) == [note, warning]
    declared = open_reader(DataSpec(source="hdf5", path=str(path), classes=1001))
    assert not declared.classes_inferred and class_notices(declared) == [warning]
    attribute = write_h5(tmp_path / "a.h5", good_images(11), np.array([*range(10), 1000]), classes=1001)
    assert [n.split(":")[0] for n in class_notices(open_reader(DataSpec(source="hdf5", path=str(attribute))))] == [
        "warning"]
    with pytest.raises(UserError) as exc:  # a declared count that disagrees stays an error
        open_reader(DataSpec(source="hdf5", path=str(path), classes=11))
    assert one_line(exc) == f"data.classes: 11 declared, but {path} holds 1001 classes"
    dense = write_h5(tmp_path / "d.h5", good_images(), np.array([0, 1, 2, 1, 2, 0]))
    assert class_notices(open_reader(DataSpec(source="hdf5", path=str(dense)))) == [
        f"note: {dense}: 3 classes inferred from the labels (0..2); set data.classes to say so"]


def test_readers_that_know_their_classes_say_nothing(jpeg_dir, h5_dir):
    for data in (DataSpec(source="imagefolder", path=str(jpeg_dir)), DataSpec(source="hdf5", path=str(h5_dir)),
                 DataSpec(source="digits"), DataSpec(source="synthetic", classes=5, samples=20)):
        assert class_notices(open_reader(data)) == [], data.source


def test_hdf5_truncated_and_foreign_files(tmp_path, h5_dir):
    whole = (h5_dir / "shard-000.h5").read_bytes()
    truncated = tmp_path / "truncated.h5"
    truncated.write_bytes(whole[: len(whole) // 2])
    with pytest.raises(UserError) as exc:
        open_reader(DataSpec(source="hdf5", path=str(truncated)))
    assert one_line(exc).startswith(f"{truncated}: not a readable HDF5 file")
    text = tmp_path / "text.h5"
    text.write_text("hello")
    with pytest.raises(UserError, match=r"text\.h5: not a readable HDF5 file"):
        open_reader(DataSpec(source="hdf5", path=str(text)))


def test_hdf5_missing_path_and_empty_dir(tmp_path):
    with pytest.raises(UserError) as exc:
        open_reader(DataSpec(source="hdf5", path=str(tmp_path / "gone.h5")))
    assert one_line(exc) == f"{tmp_path / 'gone.h5'}: no such file or directory"
    with pytest.raises(UserError, match="no HDF5 shards"):
        open_reader(DataSpec(source="hdf5", path=str(tmp_path)))


def test_hdf5_shards_must_share_a_shape(tmp_path):
    write_h5(tmp_path / "a.h5", good_images(), np.array([0, 1] * 3))
    write_h5(tmp_path / "b.h5", np.zeros((2, 5, 5, 3), np.uint8), np.array([0, 1]))
    with pytest.raises(UserError, match=r"b\.h5: images are 5x5x3 but .*a\.h5 holds 4x4x3"):
        open_reader(DataSpec(source="hdf5", path=str(tmp_path)))


# ----------------------------------------------------------------------------- digits and synthetic


def test_digits_reader():
    reader = open_reader(DataSpec(source="digits"))
    assert len(reader) == 1797 and reader.num_classes == 10 and reader.image_shape == (8, 8, 1)
    batch = reader.read(np.arange(100))
    assert batch.items.dtype == np.uint8 and batch.items.shape == (100, 8, 8, 1)
    assert batch.items.max() == 255 and batch.items.min() == 0
    with pytest.raises(UserError, match="data.classes: 5 declared, but digits holds 10"):
        open_reader(DataSpec(source="digits", classes=5))


def test_synthetic_reader_is_deterministic_per_index():
    data = DataSpec(source="synthetic", samples=50, classes=5, image_size=10)
    reader = open_reader(data, seed=3)
    assert len(reader) == 50 and reader.num_classes == 5 and reader.image_shape == (10, 10, 3)
    one = reader.read(np.array([7, 8, 9])).items
    again = open_reader(data, seed=3).read(np.array([9, 7])).items
    np.testing.assert_array_equal(one[[2, 0]], again)
    other_seed = open_reader(data, seed=4).read(np.array([7])).items
    assert not np.array_equal(one[0], other_seed[0])
    assert reader.labels.tolist()[:6] == [0, 1, 2, 3, 4, 0]


def test_synthetic_grey_and_too_few_samples():
    grey = open_reader(DataSpec(source="synthetic", samples=20, channels=1, image_size=(6, 9)))
    assert grey.read(np.arange(3)).items.shape == (3, 6, 9, 1)
    with pytest.raises(UserError, match="data.samples: 5 samples cannot cover 10 classes"):
        open_reader(DataSpec(source="synthetic", samples=5))


def test_read_rejects_bad_indices():
    reader = open_reader(DataSpec(source="synthetic", samples=20))
    with pytest.raises(IndexError):
        reader.read(np.array([20]))


# ----------------------------------------------------------------------------- partitions


def test_partitioned_reader(tmp_path, h5_dir):
    parts = tmp_path / "parts"
    partition_dataset(h5_dir, 3, parts, seed=1, progress=False)
    data = DataSpec(source="hdf5", path=str(parts), partitioned=True)
    assert partition_count(data) == 3
    assert partition_count(DataSpec(source="hdf5", path=str(h5_dir))) == 1
    sizes = []
    for k in range(3):
        with open_reader(data, partition=k) as reader:
            assert reader.num_classes == 4
            sizes.append(len(reader))
            assert reader.read(np.arange(len(reader))).items.shape[1:] == (8, 6, 3)
    assert sum(sizes) == 40 and max(sizes) - min(sizes) <= 1
    assert len(open_reader(data)) == 40
    with pytest.raises(IndexError):
        open_reader(data, partition=3)


def test_partitioned_needs_manifest_and_hdf5(tmp_path, h5_dir):
    with pytest.raises(UserError) as exc:
        partition_count(DataSpec(source="hdf5", path=str(h5_dir), partitioned=True))
    assert one_line(exc).startswith(f"{h5_dir / 'partitions.json'}: no such file")
    with pytest.raises(UserError, match="data.partitioned: source 'digits' cannot be partitioned"):
        open_reader(DataSpec(source="digits", partitioned=True))


def test_hdf5_without_samples(tmp_path):
    path = write_h5(tmp_path / "empty.h5", np.zeros((0, 4, 4, 3), np.uint8), np.zeros(0, np.int64))
    with pytest.raises(UserError) as exc:
        open_reader(DataSpec(source="hdf5", path=str(path)))
    assert one_line(exc) == f"{path}: holds no samples"
