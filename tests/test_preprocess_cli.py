"""`fleet data ...` as a user runs it: exit code 0 on success, 2 with one stderr line on bad input."""

import json

import pytest
from preprocess.make import make_synthetic


def assert_user_error(result, *fragments):
    assert result.returncode == 2, result.stderr
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1, result.stderr
    assert lines[0].startswith("fleet data"), lines[0]
    for fragment in fragments:
        assert fragment in lines[0], lines[0]


@pytest.fixture(scope="module")
def made(tmp_path_factory):
    from conftest import run_fleet

    root = tmp_path_factory.mktemp("cli")
    jpeg = run_fleet(
        "data", "make", "synthetic", "--format", "jpeg", "--out", str(root / "jpeg"),
        "--classes", "3", "--samples", "30", "--image-size", "12",
    )
    assert jpeg.returncode == 0, jpeg.stderr
    assert "wrote 30 synthetic images" in jpeg.stdout
    return root


def test_make_convert_partition_info(made, fleet_cli):
    root = made
    converted = fleet_cli("data", "convert", "--in", str(root / "jpeg"), "--out", str(root / "h5"),
                          "--image-size", "8", "--shards", "2")
    assert converted.returncode == 0, converted.stderr
    parts = fleet_cli("data", "partition", "--in", str(root / "h5"), "--parts", "3", "--out", str(root / "parts"),
                      "--seed", "1")
    assert parts.returncode == 0, parts.stderr
    assert "samples per part: 10, 10, 10" in parts.stdout
    info = fleet_cli("data", "info", str(root / "parts"))
    assert info.returncode == 0, info.stderr
    assert "source:       hdf5 (partitioned)" in info.stdout and "8x8x3" in info.stdout
    info = fleet_cli("data", "info", str(root / "jpeg"))
    assert info.returncode == 0 and "    2  002.class2  10" in info.stdout


def test_make_grouped_hdf5_and_info_lists_its_groups(tmp_path, fleet_cli):
    made = fleet_cli("data", "make", "synthetic", "--format", "hdf5", "--out", str(tmp_path / "g"), "--shards", "2",
                     "--samples", "300", "--classes", "3", "--image-size", "6", "--groups", "5", "--group-skew", "1")
    assert made.returncode == 0 and "5 groups (skew 1)" in made.stdout, made.stderr
    info = fleet_cli("data", "info", str(tmp_path / "g"))
    assert info.returncode == 0, info.stderr
    # Zipf 1 over 5 groups of 300 samples (1 each, then 295 in proportion to 1, 1/2, ... 1/5)
    lines = info.stdout.splitlines()
    at = lines.index("group  samples")
    assert lines[at - 1] == "groups:       5 (dataset 'groups'; largest 130, smallest 27 samples)"
    assert lines[at + 1:] == ["g000   130", "g001   66", "g002   44", "g003   33", "g004   27"]
    # another dataset read as group keys (integers), and one that is not there: one line, exit 2
    by_label = fleet_cli("data", "info", str(tmp_path / "g"), "--group-by", "labels")
    assert by_label.stdout.splitlines()[-3:] == ["0      100", "1      100", "2      100"]
    assert_user_error(fleet_cli("data", "info", str(tmp_path / "g"), "--group-by", "site"),
                      "no dataset 'site' of group keys", "groups, images, labels")
    plain = fleet_cli("data", "make", "synthetic", "--format", "hdf5", "--out", str(tmp_path / "p.h5"), "--samples", "20")
    assert plain.returncode == 0 and "groups:" not in fleet_cli("data", "info", str(tmp_path / "p.h5")).stdout


def test_make_hdf5_grey_non_square(tmp_path, fleet_cli):
    result = fleet_cli("data", "make", "synthetic", "--format", "hdf5", "--out", str(tmp_path / "g.h5"),
                       "--samples", "20", "--image-size", "6x10", "--channels", "1", "--seed", "3")
    assert result.returncode == 0, result.stderr
    info = fleet_cli("data", "info", str(tmp_path / "g.h5"))
    assert "6x10x1" in info.stdout


@pytest.mark.parametrize(
    "args, fragments",
    [
        (["make", "synthetic", "--format", "jpeg", "--out", "{root}/x", "--classes", "ten"],
         ["invalid int value: 'ten'"]),
        (["make", "synthetic", "--format", "gif", "--out", "{root}/x"], ["--format", "invalid choice"]),
        (["make", "synthetic", "--out", "{root}/x"], ["required", "--format"]),
        (["make", "synthetic", "--format", "jpeg", "--out", "{root}/jpeg"], ["already exists and is not empty"]),
        (["make", "synthetic", "--format", "hdf5", "--out", "{root}/x", "--samples", "4", "--classes", "2",
          "--shards", "5"], ["--shards: 5 shards for 4 samples"]),
        (["convert", "--in", "{root}/missing", "--out", "{root}/x", "--image-size", "8"],
         ["missing: no such directory"]),
        (["convert", "--in", "{root}/jpeg", "--out", "{root}/x", "--image-size", "big"], ["--image-size"]),
        (["partition", "--in", "{root}/jpeg", "--parts", "2", "--out", "{root}/x"], ["no HDF5 shards"]),
        (["partition", "--in", "{root}/jpeg", "--parts", "x", "--out", "{root}/x"], ["--parts", "invalid int"]),
        (["info", "{root}/missing"], ["no such file or directory"]),
        (["info", "{root}/bad.yaml"], ["bad.yaml"]),
        (["make", "synthetic", "--format", "jpeg", "--out", "{root}/x", "--groups", "3"], ["--groups", "hdf5 only"]),
        (["make", "synthetic", "--format", "hdf5", "--out", "{root}/x.h5", "--groups", "0"], ["--groups", "at least 1"]),
        (["make", "synthetic", "--format", "hdf5", "--out", "{root}/x.h5", "--samples", "20", "--groups", "30"],
         ["--groups: 30 groups need at least 30 samples"]),
        (["make", "synthetic", "--format", "hdf5", "--out", "{root}/x.h5", "--groups", "3", "--group-skew", "-1"],
         ["--group-skew", ">= 0"]),
        (["info", "{root}/jpeg", "--group-by", "groups"], ["--group-by groups", "HDF5"]),
        (["nonsense"], ["invalid choice"]),
        ([], ["choose a sub-command"]),
    ],
)
def test_bad_input_is_one_line_and_exit_2(made, fleet_cli, args, fragments):
    (made / "bad.yaml").write_text("name: [unclosed\n")
    result = fleet_cli("data", *[a.format(root=made) for a in args])
    assert_user_error(result, *fragments)


def test_corrupt_file_and_parts(made, fleet_cli, tmp_path):
    for name in ("a", "b"):
        (tmp_path / "in" / name).mkdir(parents=True)
        (tmp_path / "in" / name / "x.jpg").write_bytes(b"\xff\xd8\xff garbage")
    result = fleet_cli(
        "data", "convert", "--in", str(tmp_path / "in"), "--out", str(tmp_path / "o"), "--image-size", "8"
    )
    assert_user_error(result, "a/x.jpg: cannot decode image")
    h5 = made / "small.h5"
    fleet_cli("data", "make", "synthetic", "--format", "hdf5", "--out", str(h5), "--samples", "4", "--classes", "2")
    for parts in ("0", "5"):
        result = fleet_cli("data", "partition", "--in", str(h5), "--parts", parts, "--out", str(tmp_path / "p"))
        assert_user_error(result, f"--parts: {parts} parts for 4 samples")


def test_force_replaces(made, fleet_cli):
    result = fleet_cli("data", "make", "synthetic", "--format", "jpeg", "--out", str(made / "jpeg"), "--force",
                       "--classes", "3", "--samples", "30", "--image-size", "12")
    assert result.returncode == 0, result.stderr
    assert result.stderr == ""  # no progress bar when stderr is not a terminal


# ----------------------------------------------------------------------------- classes inferred


def sparse_h5(path):
    """Labels 0..9 and 1000, no `classes` attribute: 1001 classes inferred, 11 with samples."""
    import h5py
    import numpy as np

    labels = np.array([i % 10 for i in range(199)] + [1000])
    with h5py.File(path, "w") as f:
        f["images"] = np.zeros((len(labels), 8, 8, 1), np.uint8)
        f["labels"] = labels
    return path


def test_inferred_classes_are_said_by_data_info_and_validate(tmp_path, fleet_cli):
    h5 = sparse_h5(tmp_path / "x.h5")
    note = f"fleet: note: {h5}: 1001 classes inferred from the labels (0..1000); set data.classes to say so"
    warning = f"fleet: warning: {h5}: only 11 of 1001 classes have samples"
    info = fleet_cli("data", "info", str(h5))
    assert info.returncode == 0, info.stderr
    assert info.stdout.count(note) == 1 and info.stdout.count(warning) == 1, info.stdout[-500:]
    spec = tmp_path / "s.yaml"
    spec.write_text(f"name: s\ndata: {{source: hdf5, path: {h5}, image_size: 8, channels: 1}}\n"
                    "models: [{family: mlp}]\n")
    validate = fleet_cli("validate", str(spec))
    assert validate.returncode == 0, validate.stderr
    assert validate.stdout.count(note) == 1 and validate.stdout.count(warning) == 1, validate.stdout
    as_json = fleet_cli("validate", str(spec), "--json")
    assert json.loads(as_json.stdout)["num_classes"] == 1001 and note in as_json.stderr
    spec.write_text(spec.read_text().replace("channels: 1", "channels: 1, classes: 11"))  # a count that disagrees
    assert_user_error(fleet_cli("data", "info", str(spec)), f"data.classes: 11 declared, but {h5} holds 1001 classes")


# ----------------------------------------------------------------------------- info --check


def broken_folder(root):
    """Good JPEGs, one cut in half, and a text file named .jpg."""

    make_synthetic(root, "jpeg", classes=2, samples=10, image_size=12, progress=False)
    truncated = root / "000.class0" / "000004.jpg"
    truncated.write_bytes(truncated.read_bytes()[: truncated.stat().st_size // 2])
    text = root / "001.class1" / "notes.jpg"
    text.write_text("not an image\n")
    return truncated, text


def test_info_check_names_every_bad_file_and_exits_2(tmp_path, fleet_cli):
    truncated, text = broken_folder(tmp_path / "set")
    plain = fleet_cli("data", "info", str(tmp_path / "set"))
    assert plain.returncode == 0 and "cannot" not in plain.stdout  # without --check: as before
    checked = fleet_cli("data", "info", str(tmp_path / "set"), "--check")
    assert checked.returncode == 2, checked.stderr
    bad = [line for line in checked.stdout.splitlines() if "cannot decode image" in line]
    assert bad == [f"{truncated}: cannot decode image (Truncated File Read)",
                   f"{text}: cannot decode image (not a JPEG or PNG file)"], checked.stdout
    assert checked.stdout.splitlines()[-1] == "fleet: check: 2 of 11 samples cannot be used (listed above)"
    assert checked.stderr == ""  # no progress bar when stderr is not a terminal, nor a line this fast
    spec = tmp_path / "s.yaml"  # through a spec's own pipeline: the same two
    spec.write_text(f"name: s\ndata: {{source: imagefolder, path: {tmp_path / 'set'}, image_size: 8}}\n"
                    "preprocess: [decode, {resize: {size: 8}}]\nmodels: [{family: mlp}]\n")
    through_spec = fleet_cli("data", "info", str(spec), "--check")
    assert through_spec.returncode == 2 and through_spec.stdout.count("cannot decode image") == 2, through_spec.stdout


def test_info_check_of_good_data_exits_0(made, fleet_cli):
    checked = fleet_cli("data", "info", str(made / "jpeg"), "--check")
    assert checked.returncode == 0, checked.stdout + checked.stderr
    assert checked.stdout.splitlines()[-1] == "fleet: check: all 30 samples read and decode"


def test_info_check_names_unreadable_hdf5_items(tmp_path, fleet_cli):
    import h5py
    import numpy as np

    path = tmp_path / "z.h5"
    with h5py.File(path, "w") as f:
        images = f.create_dataset("images", data=np.zeros((40, 8, 8, 3), np.uint8), chunks=(1, 8, 8, 3),
                                  compression="gzip")
        f["labels"] = np.arange(40) % 4
        f.attrs["classes"] = 4
        spans = [(images.id.get_chunk_info(i).byte_offset, images.id.get_chunk_info(i).size) for i in (7, 23)]
    raw = bytearray(path.read_bytes())
    for offset, size in spans:
        raw[offset : offset + size] = b"\xff" * size
    path.write_bytes(bytes(raw))
    checked = fleet_cli("data", "info", str(path), "--check")
    assert checked.returncode == 2, checked.stderr
    bad = [line.split(":")[0] for line in checked.stdout.splitlines() if "cannot read images" in line]
    assert bad == [f"{path}[7]", f"{path}[23]"], checked.stdout
