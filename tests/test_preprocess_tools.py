"""Data-set tools: the synthetic maker, image folder -> HDF5 conversion, partitioning, safe output."""

import io
import json

import h5py
import numpy as np
import pytest
from PIL import Image

from fleet.errors import UserError
from fleet.spec.sections import DataSpec
from preprocess.check import CheckProgress, check_samples, decode_only
from preprocess.convert import convert_folder
from preprocess.generator import SyntheticRecipe, draw_sample
from preprocess.info import describe, open_any
from preprocess.make import make_synthetic
from preprocess.partition import assign_parts, partition_dataset
from preprocess.readers import open_reader
from preprocess.readers.hdf5 import HDF5Reader, shard_files
from preprocess.readers.imagefolder import ImageFolderReader


@pytest.fixture(scope="module")
def folder(tmp_path_factory):
    out = tmp_path_factory.mktemp("folder") / "jpeg"
    return make_synthetic(out, "jpeg", classes=3, samples=24, image_size=(20, 16), progress=False)


def test_make_jpeg_folder_layout(folder):
    classes = sorted(p.name for p in folder.iterdir())
    assert classes == ["000.class0", "001.class1", "002.class2"]
    files = sorted((folder / "001.class1").iterdir())
    assert len(files) == 8 and files[0].name == "000001.jpg"
    with Image.open(files[0]) as image:
        assert image.size == (16, 20) and image.mode == "RGB" and image.format == "JPEG"
        decoded = np.asarray(image).astype(int)
    recipe = SyntheticRecipe(3, (20, 16), 3, 0)
    same = np.corrcoef(decoded.ravel(), draw_sample(recipe, 1).ravel())[0, 1]
    other = np.corrcoef(decoded.ravel(), draw_sample(recipe, 4).ravel())[0, 1]
    assert same > 0.8 and same > other  # the same image, up to JPEG loss


def test_make_hdf5_matches_the_synthetic_source(tmp_path):
    out = make_synthetic(
        tmp_path / "one.h5", "hdf5", classes=4, samples=20, image_size=8, channels=1, seed=9, progress=False
    )
    assert out.is_file()
    stored = HDF5Reader(shard_files(out))
    source = open_reader(DataSpec(source="synthetic", samples=20, classes=4, image_size=8, channels=1), seed=9)
    np.testing.assert_array_equal(stored.read(np.arange(20)).items, source.read(np.arange(20)).items)
    np.testing.assert_array_equal(stored.labels, source.labels)
    assert stored.class_names[2] == "002.class2"


def test_make_refuses_a_non_empty_out_unless_forced(tmp_path):
    out = tmp_path / "set"
    out.mkdir()
    (out / "keep.txt").write_text("user data")
    with pytest.raises(UserError) as exc:
        make_synthetic(out, "hdf5", samples=20, progress=False)
    assert str(exc.value) == f"{out}: already exists and is not empty (pass --force to replace it)"
    assert (out / "keep.txt").exists()
    make_synthetic(out, "hdf5", samples=20, shards=2, progress=False, force=True)
    assert sorted(p.name for p in out.iterdir()) == ["shard-000.h5", "shard-001.h5"]
    assert [p.name for p in tmp_path.iterdir()] == ["set"]  # no staging left behind


@pytest.mark.parametrize(
    "kwargs, problem",
    [
        ({"fmt": "png"}, "--format: expected one of jpeg, hdf5"),
        ({"classes": 1}, "--classes: expected at least 2"),
        ({"samples": 3}, "--samples: 3 samples cannot cover 10 classes"),
        ({"shards": 0, "fmt": "hdf5"}, "--shards: 0 shards for 2000 samples"),
        ({"shards": 2}, "--shards: applies to --format hdf5 only"),
        ({"channels": 2}, "--channels: expected 1 or 3"),
    ],
)
def test_make_argument_errors(tmp_path, kwargs, problem):
    args = {"fmt": "jpeg", **kwargs}
    with pytest.raises(UserError, match=problem.replace("(", r"\(")):
        make_synthetic(tmp_path / "x", progress=False, **args)
    assert not (tmp_path / "x").exists()


def test_convert_round_trip(folder, tmp_path):
    out = convert_folder(folder, tmp_path / "conv", image_size=(20, 16), shards=2, progress=False)
    stored = open_reader(DataSpec(source="hdf5", path=str(out)))
    files = open_reader(DataSpec(source="imagefolder", path=str(folder)))
    assert len(stored.paths) == 2 and stored.image_shape == (20, 16, 3)
    np.testing.assert_array_equal(stored.labels, files.labels)
    assert stored.class_names == files.class_names
    for index in (0, 13, 23):
        with Image.open(files.read(np.array([index])).names[0]) as image:
            np.testing.assert_array_equal(stored.read(np.array([index])).items[0], np.asarray(image))


def test_convert_resizes_and_greys(folder, tmp_path):
    out = convert_folder(folder, tmp_path / "small.h5", image_size=8, channels=1, progress=False)
    reader = open_reader(DataSpec(source="hdf5", path=str(out)))
    assert out.is_file() and reader.image_shape == (8, 8, 1) and len(reader) == 24


def test_convert_corrupt_file_leaves_no_output(folder, tmp_path):
    broken = tmp_path / "broken"
    for name in ("a", "b"):
        (broken / name).mkdir(parents=True)
        Image.new("RGB", (9, 9), "red").save(broken / name / "ok.jpg")
    (broken / "b" / "bad.jpg").write_bytes(b"\xff\xd8\xff\xe0 truncated")
    with pytest.raises(UserError) as exc:
        convert_folder(broken, tmp_path / "out", image_size=8, progress=False)
    assert str(exc.value).startswith(f"{broken / 'b' / 'bad.jpg'}: cannot decode image")
    assert not (tmp_path / "out").exists()
    assert sorted(p.name for p in tmp_path.iterdir()) == ["broken"]


def test_convert_will_not_write_into_its_input(folder):
    with pytest.raises(UserError, match="the output would land inside the input"):
        convert_folder(folder, folder / "inside", image_size=8, progress=False)
    with pytest.raises(UserError, match="the output would replace the input"):
        convert_folder(folder, folder.parent, image_size=8, progress=False, force=True)
    assert (folder / "000.class0").is_dir() and not (folder / "inside").exists()


def test_assign_parts_covers_everything_once_and_balances_classes():
    labels = np.repeat(np.arange(5), [37, 20, 3, 11, 29])
    parts = assign_parts(labels, 4, seed=2)
    every = np.sort(np.concatenate(parts))
    np.testing.assert_array_equal(every, np.arange(len(labels)))
    sizes = [len(p) for p in parts]
    assert max(sizes) - min(sizes) <= 1
    counts = np.array([np.bincount(labels[p], minlength=5) for p in parts])
    assert (counts.max(axis=0) - counts.min(axis=0) <= 1).all()
    assert all((np.diff(p) > 0).all() for p in parts)  # sorted: sequential reads
    again = assign_parts(labels, 4, seed=2)
    assert all(np.array_equal(a, b) for a, b in zip(parts, again))
    assert not all(np.array_equal(a, b) for a, b in zip(parts, assign_parts(labels, 4, seed=3)))


def test_partition_dataset_writes_parts_and_manifest(tmp_path):
    src = make_synthetic(tmp_path / "src", "hdf5", classes=3, samples=31, image_size=6, shards=2, progress=False)
    manifest = partition_dataset(src, 4, tmp_path / "parts", seed=7, progress=False)
    written = json.loads((tmp_path / "parts" / "partitions.json").read_text())
    assert written["count"] == 4 and written["sizes"] == manifest.sizes and sum(manifest.sizes) == 31
    assert written["seed"] == 7 and written["classes"] == 3 and written["image_shape"] == [6, 6, 3]
    assert np.array(written["class_counts"]).sum(axis=0).tolist() == [11, 10, 10]
    source = HDF5Reader(shard_files(src))
    seen = []
    for k in range(4):
        with h5py.File(tmp_path / "parts" / f"part-{k:03d}.h5") as f:
            assert f.attrs["partition"] == k and f.attrs["classes"] == 3
            seen += [(img.tobytes(), int(lab)) for img, lab in zip(f["images"][()], f["labels"][()])]
    original = [(img.tobytes(), int(lab)) for img, lab in zip(source.read(np.arange(31)).items, source.labels)]
    assert sorted(seen) == sorted(original)


def test_partition_errors(tmp_path):
    src = make_synthetic(tmp_path / "src.h5", "hdf5", classes=2, samples=4, image_size=4, progress=False)
    for parts in (0, 5):
        with pytest.raises(UserError, match=f"--parts: {parts} parts for 4 samples"):
            partition_dataset(src, parts, tmp_path / "p", progress=False)
    with pytest.raises(UserError, match="no such file or directory"):
        partition_dataset(tmp_path / "missing", 2, tmp_path / "p", progress=False)
    assert not (tmp_path / "p").exists()


def test_info_describes_every_kind(folder, tmp_path):
    h5 = make_synthetic(tmp_path / "h5", "hdf5", classes=3, samples=12, image_size=4, progress=False)
    partition_dataset(h5, 2, tmp_path / "parts", progress=False)
    spec = tmp_path / "spec.yaml"
    spec.write_text("name: s\ndata: {source: digits}\nmodels: [{family: mlp}]\n")
    expected = {
        str(folder): ("imagefolder", "varies (encoded files; the first is 20x16 RGB"),
        str(h5): ("hdf5", "4x4x3 (HxWxC, uint8)"),
        str(tmp_path / "parts"): ("hdf5 (partitioned)", "partitions:   2 (samples per part: 6, 6; seed 0)"),
        str(spec): ("digits", "    9  9      180"),
    }
    for path, (source, line) in expected.items():
        reader, manifest = open_any(path)
        text = describe(reader, path, manifest)
        assert text.startswith(f"source:       {source}\n") and line in text, text


def test_force_never_replaces_the_working_directory(tmp_path, monkeypatch):
    work = tmp_path / "work"
    work.mkdir()
    (work / "precious.txt").write_text("keep me")
    monkeypatch.chdir(work)
    for out in (".", str(tmp_path)):
        with pytest.raises(UserError, match="refusing to replace a directory that holds"):
            make_synthetic(out, "hdf5", samples=20, progress=False, force=True)
    assert (work / "precious.txt").read_text() == "keep me"


def test_check_samples_reads_in_blocks_and_names_each_bad_sample(tmp_path):
    root = make_synthetic(tmp_path / "set", "jpeg", classes=2, samples=20, image_size=8, progress=False)
    bad = [root / "000.class0" / "000002.jpg", root / "001.class1" / "000013.jpg"]
    for path in bad:
        path.write_bytes(b"\xff\xd8\xff not a jpeg")
    seen = []
    with ImageFolderReader(root) as reader:
        result = check_samples(reader, decode_only, lambda done, n_bad: seen.append((done, n_bad)), block=8)
    assert result.checked == 20 and [line.split(": ")[0] for line in result.bad] == [str(p) for p in bad]
    assert seen == [(8, 1), (16, 1), (20, 2)]  # the file order: class 0's ten files, then class 1's


def test_check_progress_writes_a_line_now_and_then_where_there_is_no_terminal():
    out = io.StringIO()
    progress = CheckProgress(1000, out, every_s=0.0)
    progress(256, 0)
    progress(512, 3)
    progress.close()
    assert out.getvalue().splitlines() == ["fleet: checked 256 of 1000 samples (0 bad)",
                                           "fleet: checked 512 of 1000 samples (3 bad)"]
    quiet = io.StringIO()
    CheckProgress(1000, quiet)(256, 0)  # within the first few seconds: nothing
    assert quiet.getvalue() == ""
